"""``erg extract``: fine-tune the style classifier, choose the style head (Eq. 2), write ``style_phrases``.

The classifier is fine-tuned on the driver (GPU where the driver has one) over {factual, styles}, evaluated on
the held-out split, logged and registered in MLflow; head selection runs on a sample of stylized captions; then
an iterator pandas UDF splits every stylized caption into style phrase and content on the executors. With
``incremental`` the current classifier and head are reused and only scenes without a phrase are extracted.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import pandas as pd
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from jobs.config import ErgConfig
from jobs.model_store import get_current, log_transformers_model, model_dir, set_current
from jobs.readers import stable_id
from jobs.tables import merge_rows, read_table
from jobs.tracking import StepLogger, job_run, log_counts
from udfs.extraction import STYLE_PHRASE_DDL, make_extractor


def classifier_splits(stylized: pd.DataFrame, factual: pd.DataFrame, cfg: ErgConfig) -> dict[str, pd.DataFrame]:
    """Training and held-out sets for the style classifier (columns text, label).

    Stylized captions of the train split train it, val/test captions are held out; factual captions (label
    ``factual``) are sampled to about the mean size of a style and held out by a hash of their image.
    ``max_train_captions`` caps the training set, balanced over labels.
    """
    c = cfg.extract.classifier
    train = stylized[stylized["split"] == "train"][["caption", "style"]]
    held = stylized[stylized["split"] != "train"][["caption", "style"]]
    per_label = max(1, int(train["style"].value_counts().mean())) if len(train) else 1
    fact = factual[["caption", "image_id"]].copy()
    fact["u"] = fact["image_id"].map(lambda i: int(stable_id("holdout", i, length=8), 16) / 16 ** 8)
    fact_held = fact[fact["u"] < c.holdout_fraction]
    fact_train = fact[fact["u"] >= c.holdout_fraction]
    fact_train = fact_train.sample(n=min(per_label, len(fact_train)), random_state=c.seed)
    fact_held = fact_held.sample(n=min(max(1, len(held) // max(1, len(cfg.styles))), len(fact_held)),
                                 random_state=c.seed)
    frames = {
        "train": pd.concat([train.rename(columns={"caption": "text", "style": "label"}),
                            fact_train.assign(label=cfg.factual_label)[["caption", "label"]].rename(columns={"caption": "text"})]),
        "heldout": pd.concat([held.rename(columns={"caption": "text", "style": "label"}),
                              fact_held.assign(label=cfg.factual_label)[["caption", "label"]].rename(columns={"caption": "text"})]),
    }
    if c.max_train_captions and len(frames["train"]) > c.max_train_captions:
        per = max(1, c.max_train_captions // frames["train"]["label"].nunique())
        frames["train"] = (frames["train"].groupby("label", group_keys=False)
                           .apply(lambda g: g.sample(n=min(per, len(g)), random_state=c.seed)))
    return {k: v.sample(frac=1.0, random_state=c.seed).reset_index(drop=True) for k, v in frames.items()}


def train_classifier(cfg: ErgConfig, splits: dict[str, pd.DataFrame], out_dir: Path):
    """Fine-tune and evaluate; returns (classifier, held-out metrics)."""
    from models.style_classifier import fine_tune, load_style_classifier

    c = cfg.extract.classifier
    clf = load_style_classifier(c.name_or_path, cfg.labels, device=cfg.extract.device, max_length=c.max_length)
    train = splits["train"]
    steps = c.epochs * -(-len(train) // c.batch_size)
    with StepLogger("classifier", total=steps, every=5, show=cfg.spark.show_progress) as on_step:
        fit = fine_tune(clf, train["text"].tolist(), train["label"].tolist(), epochs=c.epochs, batch_size=c.batch_size,
                        lr=c.lr, weight_decay=c.weight_decay, warmup_ratio=c.warmup_ratio, seed=c.seed, on_step=on_step)
    held = splits["heldout"]
    metrics = clf.evaluate(held["text"].tolist(), held["label"].tolist()) if len(held) else {}
    clf.save(out_dir)
    return clf, {**{f"classifier.{k}": v for k, v in metrics.items()}, "classifier.train_loss": fit["loss"],
                 "classifier.train_captions": len(train), "classifier.heldout_captions": len(held)}


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


def extract(spark: SparkSession, cfg: ErgConfig, *, incremental: bool = False) -> dict:
    from models.style_phrases import StylePhrase, select_style_head
    from models.importance_render import confidence_heatmap_png, importance_html, importance_png

    import mlflow

    e = cfg.extract
    stylized_df = read_table(spark, cfg, "stylized_captions").filter(F.col("style").isin(cfg.styles))
    with job_run(cfg, "extract", sections=("extract",), params={"incremental": incremental}) as run:
        run_id = run.info.run_id
        counts: dict[str, float] = {}
        current = get_current(cfg, "style_classifier") if incremental else None
        if current is None:
            stylized = stylized_df.select("scene_id", "image_id", "caption", "style", "split").toPandas()
            factual = read_table(spark, cfg, "factual_captions").select("image_id", "caption").toPandas()
            if stylized.empty:
                raise RuntimeError("stylized_captions is empty: run `erg ingest` first")
            splits = classifier_splits(stylized, factual, cfg)
            out_dir = model_dir(cfg, "style_classifier", run_id)
            clf, metrics = train_classifier(cfg, splits, out_dir)
            counts.update(metrics)
            selection_set = stylized.sample(n=min(e.head_selection_captions, len(stylized)), random_state=e.classifier.seed)
            selection = select_style_head(clf, selection_set["caption"].tolist(), selection_set["style"].tolist(),
                                          eps=e.eps, batch_size=e.batch_size)
            counts.update({"head.layer": selection.layer, "head.head": selection.head,
                           "head.min_confidence": float(selection.confidence.min()),
                           "head.selection_captions": selection.n_captions})
            with tempfile.TemporaryDirectory() as tmp:
                heatmap = confidence_heatmap_png(selection.confidence, (selection.layer, selection.head),
                                                 Path(tmp) / "head_confidence.png")
                mlflow.log_artifact(str(heatmap))
            mlflow.log_dict(selection.to_dict(), "head_selection.json")
            if cfg.mlflow.register_models:
                log_transformers_model(cfg, clf.model, clf.tokenizer, name="style_classifier",
                                       task="text-classification")
            current = {"path": str(out_dir), "version": run_id, "layer": selection.layer, "head": selection.head,
                       "eps": e.eps, "labels": clf.labels, "max_length": e.classifier.max_length,
                       "accuracy": metrics.get("classifier.accuracy")}
            set_current(cfg, "style_classifier", current)
        mlflow.set_tags({"erg.classifier_version": current["version"], "erg.style_head": f"{current['layer']},{current['head']}"})

        todo = stylized_df.select("scene_id", "style", "caption")
        if incremental:
            done = read_table(spark, cfg, "style_phrases").filter(F.col("classifier_version") == current["version"])
            todo = todo.join(done.select("scene_id"), "scene_id", "left_anti")
        n_todo = todo.count()
        counts["scenes_to_extract"] = n_todo
        if n_todo:
            partitions = max(1, min(spark.sparkContext.defaultParallelism * 2, n_todo // 128 + 1))
            extractor = make_extractor(current["path"], current["layer"], current["head"], current["eps"],
                                       e.batch_size, e.device, current["max_length"])
            rows = (todo.repartition(partitions, "scene_id").mapInPandas(extractor, STYLE_PHRASE_DDL)
                    .withColumn("classifier_version", F.lit(current["version"]))
                    .withColumn("run_id", F.lit(run_id)).withColumn("created_at", F.current_timestamp()))
            stats = merge_rows(spark, cfg, "style_phrases", rows, update_existing=True)
            counts["style_phrases.inserted"] = stats["inserted"]
            counts["style_phrases.updated"] = stats["updated"]

            written = read_table(spark, cfg, "style_phrases").filter(F.col("run_id") == run_id).toPandas()
            records = [StylePhrase(tokens=list(r.tokens), importance=list(r.importance),
                                   phrase_mask=list(r.phrase_mask),
                                   phrase_words=list(r.phrase_words), style_phrase=r.style_phrase, content=r.content,
                                   layer=r.layer, head=r.head, eps=r.eps)
                       for r in written.itertuples()]
            if records:
                styles = written["style"].tolist()
                mlflow.log_text(importance_html(records, styles, e.table4_samples_per_style), "table4_importance.html")
                with tempfile.TemporaryDirectory() as tmp:
                    mlflow.log_artifact(str(importance_png(records, styles, Path(tmp) / "table4_importance.png",
                                                           e.table4_samples_per_style)))
                stylized_all = stylized_df.select("scene_id", "image_id", "caption", "style", "split").toPandas()
                factual = read_table(spark, cfg, "factual_captions").select("image_id", "caption").toPandas()
                quality = phrase_quality(written, factual, stylized_all, current["eps"], e.classifier.seed)
                if quality:
                    mlflow.log_dict(quality, "phrase_quality.json")
                    for method, scores in quality.items():
                        if isinstance(scores, dict):
                            counts.update({f"phrase.{method}.{k}": scores[k] for k in ("precision", "recall", "f1")})
                    counts["phrase.evaluated_captions"] = quality["attention"]["n_captions"]
        log_counts(counts)
        return {**counts, "run_id": run_id, "classifier_version": current["version"]}
