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
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from jobs import reports
from jobs.platform.config import ErgConfig
from jobs.platform.model_store import get_current, require_current
from jobs.platform.runner import JobContext, Step, run_job
from jobs.platform.spark import default_parallelism, spread_tasks
from jobs.platform.tables import read_table
from jobs.scene_features import scene_features
from jobs.visual_rerank import rerank_beams, rerank_report
from jobs.vocabulary import EVALUATION_CLASSIFIERS, GENERATOR, VARIANTS, captioner_kind
from udfs.captioning import HYPOTHESIS_DDL, make_captioner_evaluator

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


@dataclass
class EvaluationPlan:
    """What an evaluation compares: the current captioners by variant, the evaluation classifiers' record, the
    trigram LMs, the image encoder (features) they were trained on, the styles every captioner was trained on and
    the configured styles some captioner was not."""

    captioners: dict[str, dict[str, Any]]
    classifier: dict[str, Any]
    lm_path: str
    encoder_version: str
    styles: list[str]
    untrained: list[str]


def plan_evaluation(cfg: ErgConfig) -> EvaluationPlan:
    """The current models to evaluate; ValueError when no configured style was trained by every captioner."""
    captioners = trained_captioners(cfg)
    classifier = require_current(cfg, EVALUATION_CLASSIFIERS, "extract")
    lm_path = require_current(cfg, GENERATOR, "generate")["lm_path"]
    styles = [s for s in cfg.styles if all(s in info["styles"] for info in captioners.values())]
    if not styles:
        raise ValueError(f"no style of {cfg.styles} was trained by every captioner "
                         f"({ {v: info['styles'] for v, info in captioners.items()} })")
    return EvaluationPlan(captioners, classifier, lm_path, next(iter(captioners.values()))["encoder_version"],
                          styles, [s for s in cfg.styles if s not in styles])


def tag_step(ctx: JobContext) -> None:
    plan: EvaluationPlan = ctx["plan"]
    ctx.tag({**{f"erg.captioner_run.{v}": info["version"] for v, info in plan.captioners.items()},
             "erg.evaluation_classifiers_version": plan.classifier["version"],
             "erg.encoder_version": plan.encoder_version})
    if plan.untrained:
        logger.warning("styles %s are not evaluated: not every captioner was trained on them", plan.untrained)
        ctx.tag({"erg.styles_not_trained": ",".join(plan.untrained)})


def pairs_step(ctx: JobContext) -> DataFrame:
    """The test pairs with the scene features the captioners were trained on (cached until the job ends), counted
    per style; those with features, or ValueError when none has."""
    plan: EvaluationPlan = ctx["plan"]
    features = scene_features(ctx.spark, ctx.cfg, evaluation_pairs(ctx.spark, ctx.cfg, plan.styles).withColumn(
        "pair_id", F.concat_ws("|", "image_id", "style")))
    if features.version != plan.encoder_version:
        raise ValueError(f"the captioners were trained on features {plan.encoder_version} but train.features gives "
                         f"{features.version} now: evaluate with the conf they were trained with, or retrain")
    pairs = features.frame.cache()
    ctx.on_exit(pairs.unpersist)
    for row in pairs.groupBy("style", F.col("features").isNull().alias("missing")).count().collect():
        ctx.counts[f"{'pairs_without_vector' if row.missing else 'pairs'}.{row.style}"] = row["count"]
    if not sum(v for k, v in ctx.counts.items() if k.startswith("pairs.")):
        raise ValueError(f"no (image, style) pair of split {ctx.cfg.evaluate.split!r} for styles {plan.styles} has "
                         f"an image vector of encoder {plan.encoder_version}: check evaluate.split and run `erg embed`")
    return pairs.filter(F.col("features").isNotNull())


def caption_step(ctx: JobContext) -> tuple[pd.DataFrame, Any]:
    """Every captioner's caption of every test pair, scored (cls., ppl.) in the UDF; the visual re-ranking's beams
    (None when off). The references of each pair are ``ctx["references"]`` for the scores and the samples."""
    plan: EvaluationPlan = ctx["plan"]
    e, todo = ctx.cfg.evaluate, ctx["pairs"]
    n_todo = int(sum(v for k, v in ctx.counts.items() if k.startswith("pairs.")))
    ctx.out["references"] = {(r.image_id, r.style): list(r.references)
                             for r in todo.select("image_id", "style", "references").collect()}
    partitions = spread_tasks(default_parallelism(ctx.spark), n_todo, e.batch_size)
    evaluator = make_captioner_evaluator({v: info["path"] for v, info in plan.captioners.items()},
                                         plan.classifier["path"], plan.lm_path, e.max_len, e.batch_size, e.device,
                                         e.no_repeat_ngram_size)
    hypotheses = (todo.select("image_id", "style", "features", "n_regions").repartition(partitions, "image_id")
                  .mapInPandas(evaluator, HYPOTHESIS_DDL).toPandas())
    reranked = (rerank_beams(ctx.spark, ctx.cfg, todo, plan.captioners, plan.classifier["path"], plan.lm_path,
                             partitions) if e.visual_rerank else None)
    return hypotheses, reranked


def score_step(ctx: JobContext) -> dict[str, dict[str, dict[str, float]]]:
    """Table 2's metrics per variant and style (one CaptionScorer), and the visual re-ranking's report."""
    from models.caption_metrics import CaptionScorer

    plan: EvaluationPlan = ctx["plan"]
    hypotheses, reranked = ctx["caption"]
    references, e = ctx["references"], ctx.cfg.evaluate
    metrics: dict[str, dict[str, dict[str, float]]] = {v: {} for v in plan.captioners}
    with CaptionScorer() as scorer:
        for (variant, style), group in hypotheses.groupby(["variant", "style"], sort=False):
            refs = {image: references[(image, style)] for image in group["image_id"]}
            metrics[variant][style] = style_scores(group, refs, scorer, e.ppl_statistic)
            ctx.counts[f"ppl_nonfinite.{variant}.{style}"] = nonfinite_perplexities(group)
        ctx.summary["visual_rerank"] = (rerank_report(reranked, references, scorer, e.samples_to_log)
                                        if reranked is not None else {})
    return {v: {s: metrics[v][s] for s in plan.styles if s in metrics[v]} for v in plan.captioners}


def report_step(ctx: JobContext) -> None:
    """The metrics (``<variant>.<style>.<metric>``, ``delta.<style>.<metric>``), Table 2 when both variants exist,
    and caption samples."""
    from models.paper_table import build_table2

    metrics, (hypotheses, _), references = ctx["score"], ctx["caption"], ctx["references"]
    flat = {f"{v}.{s}.{m}": value for v, by_style in metrics.items() for s, scores in by_style.items()
            for m, value in scores.items() if not math.isnan(value)}
    ctx.summary["table2"] = None
    if len(metrics) == len(VARIANTS):
        table = build_table2(metrics["original"], metrics["augmented"])
        ctx.summary["table2"] = reports.log_table2(table)
        flat.update({f"delta.{s}.{m}": float(table.loc[(s, "delta"), m]) for s in table.index.levels[0]
                     for m in table.columns if not pd.isna(table.loc[(s, "delta"), m])})
    samples = hypotheses.groupby(["variant", "style"], sort=False).head(ctx.cfg.evaluate.samples_to_log)
    if len(samples):
        reports.log_caption_samples(samples.assign(references=[references[(i, s)] for i, s in
                                                               zip(samples["image_id"], samples["style"])]))
    ctx.metrics.update({**flat, **ctx.summary["visual_rerank"]})


EVALUATE_STEPS = (Step("tag", tag_step), Step("pairs", pairs_step), Step("caption", caption_step),
                  Step("score", score_step), Step("report", report_step))


def evaluation_result(ctx: JobContext) -> dict[str, Any]:
    plan: EvaluationPlan = ctx["plan"]
    return {"run_id": ctx.run_id, "metrics": ctx["score"], "counts": ctx.counts, "table2": ctx.summary["table2"],
            "captioner_runs": {v: info["version"] for v, info in plan.captioners.items()},
            "styles_not_trained": plan.untrained, "visual_rerank": ctx.summary["visual_rerank"]}


def evaluate(spark: SparkSession, cfg: ErgConfig) -> dict[str, Any]:
    """Caption the test images with every trained captioner, score them per style, log Table 2; returns the
    metrics (variant -> style -> metric), the counts, the markdown table (None with one variant) and the run id."""
    plan = plan_evaluation(cfg)
    return run_job(spark, cfg, "evaluate", EVALUATE_STEPS, sections=("evaluate",),
                   params={"variants": ",".join(plan.captioners), "encoder_version": plan.encoder_version},
                   inputs={"plan": plan}, result=evaluation_result, record_state=False)
