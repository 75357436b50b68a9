"""``erg evaluate``: score the trained captioners per style as in the paper's Table 2 (ERG step 4).

The test set is every (image, style) of ``stylized_captions`` in ``evaluate.split`` (at most ``max_images`` per
style, chosen by a hash of the image id so reruns pick the same); the references of a pair are the stylized
captions of that image and style in that split. Each current captioner (``original`` and ``augmented``, whichever
exist) writes one greedy caption per pair, conditioned on the style, inside an iterator pandas UDF
(:mod:`udfs.captioning`) that also scores it with the target style's evaluation classifier (paper Sect. 4.4: that style
vs factual captions, trained by ``erg extract``) and trigram LM, through :func:`models.caption_scoring.score_captions`
as generation's filters do. On the driver,
one :class:`models.caption_metrics.CaptionScorer` (one METEOR process) gives BLEU-1, BLEU-3, METEOR and CIDEr per
variant and style; ``cls.`` is the share of captions whose target style's classifier gives p > 0.5 and ``ppl.`` the
median (``evaluate.ppl_statistic``: or mean) perplexity under the target style's LM.

Everything lands in one MLflow run: metrics ``<variant>.<style>.<metric>`` (e.g. ``original.humor.BLEU-1``, and
``delta.humor.CIDEr``), Table 2 as ``table2.md`` / ``table2.html`` / ``table2.json`` when both variants exist, caption
samples, and the tags ``erg.captioner_run.<variant>`` naming the training runs compared.
"""
from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from jobs.config import ErgConfig
from jobs.model_store import get_current, require_current
from jobs.extract import EVALUATION_CLASSIFIERS
from jobs.spark import default_parallelism, spread_tasks
from jobs.tables import read_table
from jobs.tracking import job_run, log_counts
from jobs.train import VARIANTS, captioner_kind
from udfs.captioning import HYPOTHESIS_DDL, make_captioner_evaluator
from jobs.visual_rerank import rerank_beams, rerank_report

logger = logging.getLogger(__name__)


def trained_captioners(cfg: ErgConfig) -> dict[str, dict[str, Any]]:
    """The current captioner of each variant that has one; ValueError if none, or if they used different image
    encoders (their scores would not be comparable)."""
    found = {v: info for v in VARIANTS if (info := get_current(cfg, captioner_kind(v))) is not None}
    if not found:
        raise ValueError(f"no trained captioner under {cfg.home}/models: run `erg train` with "
                         "train.use_augmented=false (original) and/or true (augmented) first")
    encoders = {v: info["encoder_version"] for v, info in found.items()}
    if len(set(encoders.values())) > 1:
        raise ValueError(f"the captioners were trained on different image encoders {encoders}: retrain them on "
                         "the same embeddings so their scores are comparable")
    return found


def evaluation_pairs(spark: SparkSession, cfg: ErgConfig, styles: list[str]) -> DataFrame:
    """``image_id, style, references`` (array of captions) of ``evaluate.split``, capped per style."""
    stylized = read_table(spark, cfg, "stylized_captions").filter(
        (F.col("split") == cfg.evaluate.split) & F.col("style").isin(styles))
    pairs = stylized.groupBy("image_id", "style").agg(F.collect_list("caption").alias("references"))
    if cfg.evaluate.max_images:
        order = Window.partitionBy("style").orderBy(F.xxhash64("image_id"), "image_id")
        pairs = (pairs.withColumn("_n", F.row_number().over(order))
                 .filter(F.col("_n") <= cfg.evaluate.max_images).drop("_n"))
    return pairs


def style_scores(group: pd.DataFrame, references: dict[str, list[str]], scorer, statistic: str) -> dict[str, float]:
    """Table 2's metrics of one variant and style: caption metrics, ``cls.`` and ``ppl.`` (median or mean).

    ``group`` holds that variant's hypotheses of one style (columns of :data:`udfs.captioning.HYPOTHESIS_DDL`);
    ``references`` maps each of its image ids to the reference captions; ``scorer`` is a ``CaptionScorer``.
    """
    if statistic not in ("median", "mean"):
        raise ValueError(f"ppl statistic must be 'median' or 'mean', got {statistic!r}")
    scores = scorer.score(references, dict(zip(group["image_id"], group["hypothesis"])))
    perplexity = group["perplexity"].to_numpy(dtype=float)
    perplexity = perplexity[np.isfinite(perplexity)]  # counted by nonfinite_perplexities, logged by the callers
    scores["cls."] = float((group["predicted_style"] == group["style"]).mean())
    scores["ppl."] = float(np.median(perplexity) if statistic == "median" else perplexity.mean()) \
        if len(perplexity) else float("nan")
    return scores


def nonfinite_perplexities(group: pd.DataFrame) -> int:
    """Hypotheses whose trigram perplexity is NaN or infinite: left out of ``ppl.``, so counted and logged."""
    return int((~np.isfinite(group["perplexity"].to_numpy(dtype=float))).sum())


def evaluate(spark: SparkSession, cfg: ErgConfig) -> dict[str, Any]:
    """Caption the test images with every trained captioner, score them per style, log Table 2; returns the
    metrics (variant -> style -> metric), the counts, the markdown table (None with one variant) and the run id."""
    import mlflow

    from models.caption_metrics import CaptionScorer
    from models.paper_table import build_table2, render_html, render_markdown

    e = cfg.evaluate
    captioners = trained_captioners(cfg)
    classifier = require_current(cfg, EVALUATION_CLASSIFIERS, "extract")
    lm_path = require_current(cfg, "generator", "generate")["lm_path"]
    encoder_version = next(iter(captioners.values()))["encoder_version"]
    styles = [s for s in cfg.styles if all(s in info["styles"] for info in captioners.values())]
    untrained = [s for s in cfg.styles if s not in styles]
    if not styles:
        raise ValueError(f"no style of {cfg.styles} was trained by every captioner "
                         f"({ {v: info['styles'] for v, info in captioners.items()} })")
    with job_run(cfg, "evaluate", sections=("evaluate",), record_state=False,
                 params={"variants": ",".join(captioners), "encoder_version": encoder_version}) as run:
        mlflow.set_tags({**{f"erg.captioner_run.{v}": info["version"] for v, info in captioners.items()},
                         "erg.evaluation_classifiers_version": classifier["version"],
                         "erg.encoder_version": encoder_version})
        if untrained:
            logger.warning("styles %s are not evaluated: not every captioner was trained on them", untrained)
            mlflow.set_tag("erg.styles_not_trained", ",".join(untrained))
        from jobs.scene_features import scene_features

        features = scene_features(spark, cfg, evaluation_pairs(spark, cfg, styles).withColumn(
            "pair_id", F.concat_ws("|", "image_id", "style")))
        if features.version != encoder_version:
            raise ValueError(f"the captioners were trained on features {encoder_version} but train.features gives "
                             f"{features.version} now: evaluate with the conf they were trained with, or retrain")
        pairs = features.frame.cache()
        counts: dict[str, float] = {}
        for row in pairs.groupBy("style", F.col("features").isNull().alias("missing")).count().collect():
            counts[f"{'pairs_without_vector' if row.missing else 'pairs'}.{row.style}"] = row["count"]
        todo = pairs.filter(F.col("features").isNotNull())
        n_todo = int(sum(v for k, v in counts.items() if k.startswith("pairs.")))
        if n_todo == 0:
            pairs.unpersist()
            raise ValueError(f"no (image, style) pair of split {e.split!r} for styles {styles} has an image vector "
                             f"of encoder {encoder_version}: check evaluate.split and run `erg embed`")
        references = {(r.image_id, r.style): list(r.references) for r in todo.select("image_id", "style",
                                                                                       "references").collect()}
        partitions = spread_tasks(default_parallelism(spark), n_todo, e.batch_size)
        evaluator = make_captioner_evaluator({v: info["path"] for v, info in captioners.items()},
                                             classifier["path"], lm_path, e.max_len, e.batch_size, e.device,
                                             e.no_repeat_ngram_size)
        hypotheses = (todo.select("image_id", "style", "features", "n_regions").repartition(partitions, "image_id")
                      .mapInPandas(evaluator, HYPOTHESIS_DDL).toPandas())
        reranked = (rerank_beams(spark, cfg, todo, captioners, classifier["path"], lm_path, partitions)
                    if e.visual_rerank else None)
        pairs.unpersist()

        metrics: dict[str, dict[str, dict[str, float]]] = {v: {} for v in captioners}
        with CaptionScorer() as scorer:
            for (variant, style), group in hypotheses.groupby(["variant", "style"], sort=False):
                refs = {image: references[(image, style)] for image in group["image_id"]}
                metrics[variant][style] = style_scores(group, refs, scorer, e.ppl_statistic)
                counts[f"ppl_nonfinite.{variant}.{style}"] = nonfinite_perplexities(group)
            rerank = rerank_report(reranked, references, scorer, e.samples_to_log) if reranked is not None else {}
        metrics = {v: {s: metrics[v][s] for s in styles if s in metrics[v]} for v in captioners}
        flat = {f"{v}.{s}.{m}": value for v, by_style in metrics.items() for s, scores in by_style.items()
                for m, value in scores.items() if not math.isnan(value)}
        table_md = None
        if len(captioners) == len(VARIANTS):
            table = build_table2(metrics["original"], metrics["augmented"])
            table_md = render_markdown(table)
            mlflow.log_text(table_md, "table2.md")
            mlflow.log_text(render_html(table), "table2.html")
            mlflow.log_table(table.reset_index(), "table2.json")
            flat.update({f"delta.{s}.{m}": float(table.loc[(s, "delta"), m]) for s in table.index.levels[0]
                         for m in table.columns if not pd.isna(table.loc[(s, "delta"), m])})
        samples = hypotheses.groupby(["variant", "style"], sort=False).head(e.samples_to_log)
        if len(samples):
            mlflow.log_table(samples.assign(references=[references[(i, s)] for i, s in
                                                        zip(samples["image_id"], samples["style"])]),
                             "caption_samples.json")
        log_counts({**counts, **flat, **rerank})
        return {"run_id": run.info.run_id, "metrics": metrics, "counts": counts, "table2": table_md,
                "captioner_runs": {v: info["version"] for v, info in captioners.items()},
                "styles_not_trained": untrained, "visual_rerank": rerank}
