"""``erg extract``: per style set a style classifier and head (Eq. 2), the evaluation classifiers, ``style_phrases``.

Fit (on the driver, GPU where it has one; train split only, never val/test):

- per style set (``style_sets``, e.g. flickrstyle: humor/romantic, senticap: positive/negative) a classifier over
  that set's styles, fine-tuned with the set's settings (``extract.classifier`` + ``extract.classifier_overrides``),
  scored on the set's val split, logged and registered as ``erg_style_classifier_<set>``; its style head (l_s, h_s)
  minimises Eq. 2 with S' = the set's other styles over the set's train captions (``head_selection_captions``
  sampled, or all); recorded as the current ``style_classifier/<set>``;
- the evaluation classifiers (paper Sect. 4.4), one per style, that style vs factual captions
  (:mod:`models.caption_scoring`), recorded as the current ``evaluation_classifiers``: filter 1 of ``erg generate``
  and cls. of ``erg evaluate``.

Apply: an iterator pandas UDF splits every stylized caption into style phrase and content with its set's classifier
and head. Report: Table 4 (words shaded by importance) and phrase quality against baselines. With ``incremental``
the current models are reused and only scenes without a phrase of the current classifier are extracted.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Optional

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs import reports
from jobs.platform.config import ClassifierConf, ErgConfig
from jobs.platform.model_store import get_current, log_transformers_model, model_dir, set_current
from jobs.platform.runner import JobContext, Step, run_job
from jobs.platform.spark import default_parallelism, spread_tasks
from jobs.platform.tables import merge_rows, read_table, scene_descriptions
from jobs.platform.tracking import StepLogger
from jobs.vocabulary import (EVALUATION_CLASSIFIERS, EvaluationClassifiersRecord, ExtractorRecord, classifier_kind,
                             record_versions)
from readers.corpora import stable_id
from udfs.extraction import STYLE_PHRASE_DDL, make_extractor

logger = logging.getLogger(__name__)

def current_extractors(cfg: ErgConfig) -> dict[str, Optional[dict]]:
    """The current extractor record of every style set (None where the set has none)."""
    return {name: get_current(cfg, classifier_kind(name)) for name in cfg.style_sets}


# ------------------------------------------------------------------------------------------------------- data
def read_stylized(spark: SparkSession, cfg: ErgConfig) -> pd.DataFrame:
    """``scene_id, image_id, caption, style, split`` of the configured styles."""
    frame = (read_table(spark, cfg, "stylized_captions").filter(F.col("style").isin(cfg.styles))
             .select("scene_id", "image_id", "caption", "style", "split").toPandas())
    if frame.empty:
        raise RuntimeError("stylized_captions is empty: run `erg ingest` first")
    # a fixed row order (not the Delta files' order): seeded sampling and shuffling then give the same classifiers
    # in every process, e.g. in a rerun after a crash
    return frame.sort_values("scene_id", kind="stable").reset_index(drop=True)


def _balanced_cap(frame: pd.DataFrame, cap: Optional[int], seed: int) -> pd.DataFrame:
    if not cap or len(frame) <= cap:
        return frame
    per = max(1, cap // frame["label"].nunique())
    return pd.concat([group.sample(n=min(per, len(group)), random_state=seed)
                      for _, group in frame.groupby("label", sort=True)])


def set_classifier_data(stylized: pd.DataFrame, styles: list[str], c: ClassifierConf) -> dict[str, pd.DataFrame]:
    """Training (split ``train``) and validation (split ``val``) captions of one style set: columns text, label.

    Test captions are never used; ``max_train_captions`` caps training, balanced over the set's styles.
    """
    rows = stylized[stylized["style"].isin(styles)].rename(columns={"caption": "text", "style": "label"})
    frames = {"train": _balanced_cap(rows[rows["split"] == "train"][["text", "label"]], c.max_train_captions, c.seed),
              "val": rows[rows["split"] == "val"][["text", "label"]]}
    return {k: v.sample(frac=1.0, random_state=c.seed).reset_index(drop=True) for k, v in frames.items()}


def factual_pool(stylized: pd.DataFrame, factual: pd.DataFrame, heldout_fraction: float) -> dict[str, list[str]]:
    """Factual captions for the evaluation classifiers: none of a val/test stylized image; the images hashed below
    ``heldout_fraction`` are held out (accuracy), the rest train. ``factual`` has columns image_id, caption."""
    held_images = set(stylized.loc[stylized["split"].isin(["val", "test"]), "image_id"])
    pool = factual[~factual["image_id"].isin(held_images)].drop_duplicates("caption")
    u = pool["image_id"].map(lambda i: int(stable_id("holdout", i, length=8), 16) / 16 ** 8)
    return {"train": pool.loc[u >= heldout_fraction, "caption"].tolist(),
            "heldout": pool.loc[u < heldout_fraction, "caption"].tolist()}


def read_factual_for_classifiers(spark: SparkSession, cfg: ErgConfig) -> pd.DataFrame:
    """``image_id, caption``: the factual corpus P plus the scene descriptions of stylized images (e.g. FlickrStyle's
    Flickr30K captions), so that "factual" is not learnable as "another image source".

    Bounded whatever the size of P: every factual caption of a stylized image (phrase quality scores against those),
    and of the others at most ``extract.evaluation.max_factual_captions``, the same ones in every run (the lowest
    hash of image and caption), chosen by Spark. ``factual_captions_sampled`` in the frame's ``attrs`` says whether
    the cap cut P.
    """
    parts = [read_table(spark, cfg, "factual_captions").select("image_id", "caption")]
    if "descriptions" in read_table(spark, cfg, "images").columns:
        parts.append(scene_descriptions(spark, cfg).select("image_id", "caption"))
    frame = parts[0]
    for part in parts[1:]:
        frame = frame.unionByName(part)
    stylized_images = read_table(spark, cfg, "stylized_captions").select("image_id").distinct()
    own = frame.join(stylized_images, "image_id", "left_semi").withColumn("_hash", F.lit(None).cast("long"))
    cap = cfg.extract.evaluation.max_factual_captions
    rest = (frame.join(stylized_images, "image_id", "left_anti").withColumn("_hash", F.xxhash64("image_id", "caption"))
            .orderBy("_hash", "image_id", "caption").limit(cap + 1))
    rows = own.unionByName(rest).toPandas()
    others = rows[rows["_hash"].notna()].sort_values(["_hash", "image_id", "caption"], kind="stable")
    sampled = len(others) > cap
    if sampled:  # one more than the cap was read to know that P was cut: drop it (the highest hash)
        rows = rows.drop(index=others.index[-1])
    out = rows.drop(columns="_hash").sort_values(["image_id", "caption"], kind="stable").reset_index(drop=True)
    out.attrs["factual_captions_sampled"] = sampled
    return out


# ------------------------------------------------------------------------------------------------------- fit
def fit_set_classifier(cfg: ErgConfig, style_set: str, data: dict[str, pd.DataFrame], out_dir: Path):
    """Fine-tune one style set's classifier over its styles; returns (classifier, metrics named ``classifier.<set>.*``)."""
    from models.style_classifier import fine_tune, load_style_classifier

    c = cfg.extract.classifier_for(style_set)
    styles = cfg.style_sets[style_set]
    if len(styles) < 2:
        raise ValueError(f"style set {style_set!r} has one style {styles}: Eq. 2 compares a style against the other "
                         "styles of its set, so a set needs at least two (see style_sets in the conf)")
    train = data["train"]
    missing = sorted(set(styles) - set(train["label"]))
    if missing:
        raise RuntimeError(f"style set {style_set!r}: no train-split captions of {missing}")
    import torch

    torch.manual_seed(c.seed)  # the new head's initial weights: the same classifier in every process (and rerun)
    clf = load_style_classifier(c.name_or_path, styles, device=cfg.extract.device, max_length=c.max_length,
                                with_factual=False)
    steps = c.epochs * -(-len(train) // c.batch_size)
    tick = time.perf_counter()
    with StepLogger(f"classifier.{style_set}", total=steps, every=5, show=cfg.spark.show_progress) as on_step:
        fit = fine_tune(clf, train["text"].tolist(), train["label"].tolist(), epochs=c.epochs, batch_size=c.batch_size,
                        lr=c.lr, weight_decay=c.weight_decay, warmup_ratio=c.warmup_ratio, seed=c.seed, on_step=on_step,
                        batch_order=c.batch_order, precision=c.precision)
    seconds = time.perf_counter() - tick
    val = data["val"]
    metrics = clf.evaluate(val["text"].tolist(), val["label"].tolist()) if len(val) else {}
    clf.save(out_dir)
    prefix = f"classifier.{style_set}"
    return clf, {**{f"{prefix}.val_{k}": v for k, v in metrics.items()}, f"{prefix}.train_loss": fit["loss"],
                 f"{prefix}.train_captions": len(train), f"{prefix}.val_captions": len(val),
                 f"{prefix}.fit_seconds": seconds}


def fit_style_head(cfg: ErgConfig, clf, style_set: str, train: pd.DataFrame):
    """Eq. 2 over the set's train captions (``head_selection_captions`` of them, seeded; null = all)."""
    from models.style_phrases import select_style_head

    e = cfg.extract
    return select_style_head(clf, train["text"].tolist(), train["label"].tolist(), eps=e.eps, batch_size=e.batch_size,
                             max_captions=e.head_selection_captions, seed=cfg.extract.classifier_for(style_set).seed)


def fit_extractor(cfg: ErgConfig, style_set: str, stylized: pd.DataFrame, run_id: str
                  ) -> tuple[ExtractorRecord, dict]:
    """Classifier + head of one style set, logged, registered and recorded as current; returns (record, metrics)."""
    c = cfg.extract.classifier_for(style_set)
    data = set_classifier_data(stylized, cfg.style_sets[style_set], c)
    out_dir = model_dir(cfg, classifier_kind(style_set), run_id)
    clf, metrics = fit_set_classifier(cfg, style_set, data, out_dir)
    tick = time.perf_counter()
    selection = fit_style_head(cfg, clf, style_set, data["train"])
    metrics.update({f"head.{style_set}.layer": selection.layer, f"head.{style_set}.head": selection.head,
                    f"head.{style_set}.min_confidence": float(selection.confidence.min()),
                    f"head.{style_set}.selection_captions": selection.n_captions,
                    f"head.{style_set}.seconds": time.perf_counter() - tick})
    reports.log_head_selection(style_set, selection)
    registered = None  # the logged classifier is registered as erg_style_classifier_<set>: that version is aliased
    if cfg.mlflow.register_models:
        registered = log_transformers_model(cfg, clf.model, clf.tokenizer, name=f"style_classifier_{style_set}",
                                            task="text-classification")
    record: ExtractorRecord = {"path": str(out_dir), "version": run_id, "style_set": style_set, "styles": clf.labels,
              "layer": selection.layer, "head": selection.head, "eps": cfg.extract.eps, "max_length": c.max_length,
              "val_accuracy": metrics.get(f"classifier.{style_set}.val_accuracy")}
    set_current(cfg, classifier_kind(style_set), record, registered_version=registered)
    return record, metrics


def fit_evaluation_classifiers(cfg: ErgConfig, stylized: pd.DataFrame, factual: pd.DataFrame,
                               run_id: str) -> tuple[EvaluationClassifiersRecord, dict]:
    """One style-vs-factual classifier per style (train split), scored on val captions vs held-out factual ones,
    logged and recorded as the current ``evaluation_classifiers``; returns (record, metrics)."""
    import mlflow

    from models.caption_scoring import train_evaluation_classifiers

    v = cfg.extract.evaluation
    pool = factual_pool(stylized, factual, v.heldout_fraction)
    train = stylized[stylized["split"] == "train"]
    positives = {s: train.loc[train["style"] == s, "caption"].tolist() for s in cfg.styles}
    tick = time.perf_counter()
    classifiers = train_evaluation_classifiers(
        v.kind, positives, pool["train"], factual_label=cfg.factual_label, name_or_path=v.name_or_path,
        max_length=v.max_length, device=cfg.extract.device, l2=v.l2, epochs=v.epochs, batch_size=v.batch_size,
        lr=v.lr, max_train_captions=v.max_train_captions, seed=v.seed, batch_order=v.batch_order, precision=v.precision)
    metrics: dict[str, Any] = {"evaluation_classifier.fit_seconds": time.perf_counter() - tick}
    val = stylized[stylized["split"] == "val"]
    accuracy = {}
    for i, style in enumerate(cfg.styles):
        own = val.loc[val["style"] == style, "caption"].tolist()
        if not own or not pool["heldout"]:
            continue
        negatives = pd.Series(pool["heldout"]).sample(n=min(len(own), len(pool["heldout"])), random_state=v.seed + i)
        scores = classifiers.accuracy(style, own, negatives.tolist())
        accuracy[style] = scores["accuracy"]
        metrics.update({f"evaluation_classifier.{style}.val_{k}": value for k, value in scores.items()})
    out_dir = model_dir(cfg, EVALUATION_CLASSIFIERS, run_id)
    classifiers.save(out_dir)
    if v.kind == "finetune" and cfg.mlflow.register_models:
        for style, clf in classifiers.models.items():
            log_transformers_model(cfg, clf.model, clf.tokenizer, name=f"evaluation_classifier_{style}",
                                   task="text-classification")
    else:
        mlflow.log_artifacts(str(out_dir), EVALUATION_CLASSIFIERS)
    record = EvaluationClassifiersRecord(path=str(out_dir), version=run_id, kind=v.kind, styles=classifiers.styles,
                                         factual_label=cfg.factual_label, val_accuracy=accuracy)
    set_current(cfg, EVALUATION_CLASSIFIERS, record)
    return record, metrics


# ------------------------------------------------------------------------------------------------------ apply
def scenes_to_extract(spark: SparkSession, cfg: ErgConfig, extractors: dict[str, dict], incremental: bool) -> DataFrame:
    """``scene_id, style, caption`` of the stylized captions to split (incremental: those without a phrase of their
    set's current classifier)."""
    todo = read_table(spark, cfg, "stylized_captions").filter(F.col("style").isin(cfg.styles)) \
        .select("scene_id", "style", "caption")
    if incremental:
        versions = spark.createDataFrame([(style, record["version"]) for record in extractors.values()
                                          for style in record["styles"]], "style string, classifier_version string")
        done = read_table(spark, cfg, "style_phrases").join(versions, ["style", "classifier_version"])
        todo = todo.join(done.select("scene_id"), "scene_id", "left_anti")
    return todo


def apply_extractors(spark: SparkSession, cfg: ErgConfig, todo: DataFrame, n_todo: int, extractors: dict[str, dict],
                     run_id: str) -> dict[str, float]:
    """Split ``todo``'s captions with their set's classifier and head (iterator UDF); MERGE into style_phrases."""
    partitions = spread_tasks(default_parallelism(spark), n_todo, 128, per_slot=2)
    extractor = make_extractor(extractors, cfg.extract.batch_size, cfg.extract.device)
    rows = (todo.repartition(partitions, "scene_id").mapInPandas(extractor, STYLE_PHRASE_DDL)
            .withColumn("run_id", F.lit(run_id)).withColumn("created_at", F.current_timestamp()))
    stats = merge_rows(spark, cfg, "style_phrases", rows, update_existing=True)
    return {"style_phrases.inserted": stats["inserted"], "style_phrases.updated": stats["updated"]}


# ----------------------------------------------------------------------------------------------------- report
def phrase_quality(phrases: pd.DataFrame, factual: pd.DataFrame, stylized_all: pd.DataFrame, eps: float,
                   seed: int, min_heldout: int = 20) -> dict[str, dict]:
    """Precision/recall of extracted phrases against the words a stylized caption adds over its image's factual
    captions, next to three baselines with the same k per caption: random words, and the top words of a style
    lexicon (salience, Li et al. 2018, and c-TF-IDF) fitted on the train split.

    Scored on the captions outside the train split that have factual captions of their image, or on all such
    captions when fewer than ``min_heldout`` are held out (``evaluated_on`` says which).
    """
    from models.phrase_eval import StyleLexicon, gold_added_mask, random_phrase_masks, score_phrase_masks

    by_image = factual.groupby("image_id")["caption"].apply(list).to_dict()
    rows = phrases.merge(stylized_all[["scene_id", "image_id", "split"]], on="scene_id")
    rows = rows[rows["image_id"].isin(by_image.keys())]
    held = rows[rows["split"] != "train"]
    evaluated_on = "heldout" if len(held) >= min_heldout else "all"
    rows = held if evaluated_on == "heldout" else rows
    if rows.empty:
        return {}
    tokens = [list(t) for t in rows["tokens"]]
    gold = [gold_added_mask(t, by_image[i]) for t, i in zip(tokens, rows["image_id"])]
    train = stylized_all[stylized_all["split"] == "train"]
    train = train if len(train) else stylized_all
    styles = rows["style"].tolist()
    scores = {
        "attention": score_phrase_masks([list(m) for m in rows["phrase_mask"]], gold),
        "random": score_phrase_masks(random_phrase_masks(tokens, eps, seed), gold),
    }
    for scoring in ("salience", "ctfidf"):
        lexicon = StyleLexicon.fit(train["caption"].tolist(), train["style"].tolist(), factual["caption"].tolist(),
                                   scoring=scoring)
        scores[f"lexicon_{scoring}"] = score_phrase_masks(lexicon.phrase_masks(tokens, styles, eps), gold)
    return {**{name: s.to_dict() for name, s in scores.items()}, "evaluated_on": evaluated_on}


def report_phrases(spark: SparkSession, cfg: ErgConfig, run_id: str, stylized: pd.DataFrame,
                   factual: pd.DataFrame) -> dict[str, float]:
    """Table 4 artifacts and phrase quality of the rows this run wrote; returns metrics."""
    from models.style_phrases import StylePhrase

    e = cfg.extract
    written = read_table(spark, cfg, "style_phrases").filter(F.col("run_id") == run_id).toPandas()
    if written.empty:
        return {}
    records = [StylePhrase(tokens=list(r.tokens), importance=list(r.importance), phrase_mask=list(r.phrase_mask),
                           phrase_words=list(r.phrase_words), style_phrase=r.style_phrase, content=r.content,
                           layer=r.layer, head=r.head, eps=r.eps) for r in written.itertuples()]
    reports.log_table4(records, written["style"].tolist(), e.table4_samples_per_style)
    counts: dict[str, float] = {}
    quality = phrase_quality(written, factual, stylized, e.eps, e.classifier.seed)
    if quality:
        reports.log_phrase_quality(quality)
        for method, scores in quality.items():
            if isinstance(scores, dict):
                counts.update({f"phrase.{method}.{k}": scores[k] for k in ("precision", "recall", "f1")})
        counts["phrase.evaluated_captions"] = quality["attention"]["n_captions"]
    return counts


# -------------------------------------------------------------------------------------------------------- job
def fit_step(ctx: JobContext) -> dict[str, ExtractorRecord]:
    """The current extractors and evaluation classifiers (``incremental``); those missing are fitted now (their
    metrics into the counts). The frames read for fitting are kept for the report."""
    spark, cfg, run_id = ctx.spark, ctx.cfg, ctx.run_id
    extractors = current_extractors(cfg) if ctx.incremental else {name: None for name in cfg.style_sets}
    evaluation = get_current(cfg, EVALUATION_CLASSIFIERS) if ctx.incremental else None
    ctx.out["stylized"] = ctx.out["factual"] = None
    if evaluation is None or any(record is None for record in extractors.values()):
        ctx.out["stylized"] = read_stylized(spark, cfg)
    for style_set, record in extractors.items():
        if record is None:
            extractors[style_set], metrics = fit_extractor(cfg, style_set, ctx["stylized"], run_id)
            ctx.counts.update(metrics)
    if evaluation is None:
        ctx.out["factual"] = factual = read_factual_for_classifiers(spark, cfg)
        ctx.counts["evaluation_classifier.factual_captions_sampled"] = float(factual.attrs["factual_captions_sampled"])
        evaluation, metrics = fit_evaluation_classifiers(cfg, ctx["stylized"], factual, run_id)
        ctx.counts.update(metrics)
    ctx.out["evaluation"] = evaluation
    ctx.summary.update({"classifier_versions": record_versions(extractors),
                        "evaluation_classifiers_version": evaluation["version"]})
    return extractors


def tag_step(ctx: JobContext) -> None:
    extractors = ctx["fit"]
    ctx.tag({**{f"erg.classifier_version.{name}": r["version"] for name, r in extractors.items()},
             **{f"erg.style_head.{name}": f"{r['layer']},{r['head']}" for name, r in extractors.items()},
             "erg.evaluation_classifiers_version": ctx["evaluation"]["version"]})


def apply_step(ctx: JobContext) -> int:
    """Split the scenes to extract into style phrase and content; MERGE into style_phrases. Returns their number."""
    todo = scenes_to_extract(ctx.spark, ctx.cfg, ctx["fit"], ctx.incremental)
    n_todo = todo.count()
    ctx.counts["scenes_to_extract"] = n_todo
    if n_todo:
        ctx.counts.update(apply_extractors(ctx.spark, ctx.cfg, todo, n_todo, ctx["fit"], ctx.run_id))
    return n_todo


def report_step(ctx: JobContext) -> None:
    stylized = read_stylized(ctx.spark, ctx.cfg) if ctx["stylized"] is None else ctx["stylized"]
    factual = read_factual_for_classifiers(ctx.spark, ctx.cfg) if ctx["factual"] is None else ctx["factual"]
    ctx.counts.update(report_phrases(ctx.spark, ctx.cfg, ctx.run_id, stylized, factual))


EXTRACT_STEPS = (Step("fit", fit_step), Step("tag", tag_step), Step("apply", apply_step),
                 Step("report", report_step, when=lambda ctx: bool(ctx["apply"])))


def extract(spark: SparkSession, cfg: ErgConfig, *, incremental: bool = False) -> dict:
    """Fit what is missing (everything unless ``incremental``), apply the extractors, report."""
    return run_job(spark, cfg, "extract", EXTRACT_STEPS, sections=("extract", "style_sets"),
                   params={"incremental": incremental}, incremental=incremental)
