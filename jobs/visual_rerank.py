"""``erg evaluate``'s visual re-ranking (``evaluate.visual_rerank``): the test pairs whose image has textual visual
context (``images.tags``, with ``images.tags_confidence``) are beam-decoded by every captioner, each beam is re-ranked
by visual relatedness (:mod:`udfs.visual_rerank`), and both rankings are scored against the same references as
Table 2.

Logged beside Table 2: ``rerank.<variant>.<style>.<beam|visual>.<metric>`` for BLEU-1, BLEU-3, METEOR, CIDEr,
``relatedness`` (mean visual relatedness of the picked captions), ``cls.`` (share the target style's evaluation
classifier accepts) and ``ppl.`` (median trigram perplexity); ``rerank.<variant>.<style>.changed`` (share of images
whose visual pick is not the beam's first) and ``rerank.<variant>.<style>.images``; the table as
``visual_rerank.md`` / ``visual_rerank.json`` and the changed picks as ``visual_rerank_samples.json``.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.platform.config import ErgConfig
from jobs.platform.tables import read_table
from udfs.visual_relatedness import visual_options
from udfs.visual_rerank import RANKINGS, RERANK_DDL, make_beam_reranker


def rerank_beams(spark: SparkSession, cfg: ErgConfig, pairs: DataFrame, captioners: dict[str, dict[str, Any]],
                 classifiers_path: str, lm_path: str | None, partitions: int) -> pd.DataFrame:
    """The beam's and the visual pick of every captioner for the ``pairs`` (``image_id, style, features``) whose image
    has visual context, as a pandas frame of :data:`udfs.visual_rerank.RERANK_DDL` rows (empty when none has)."""
    e, vr = cfg.evaluate, cfg.visual_relatedness
    context = (read_table(spark, cfg, "images").select("image_id", "tags", "tags_confidence")
               .where(F.col("tags").isNotNull() & (F.length(F.trim("tags")) > 0)))
    columns = ["image_id", "style", "features"] + (["n_regions"] if "n_regions" in pairs.columns else [])
    todo = pairs.select(*columns).join(context, "image_id")
    reranker = make_beam_reranker({v: info["path"] for v, info in captioners.items()}, classifiers_path, lm_path,
                                  visual_options(vr.encoder, vr.label_mode, vr.top_labels, e.batch_size),
                                  e.beam_size, e.max_len, e.length_penalty, e.batch_size, e.device,
                                  e.no_repeat_ngram_size)
    return todo.repartition(partitions, "image_id").mapInPandas(reranker, RERANK_DDL).toPandas()


def rerank_table(rows: pd.DataFrame, references: dict[tuple[str, str], list[str]], scorer) -> pd.DataFrame:
    """One row per (variant, style, ranking): images, caption metrics, relatedness, cls., ppl., and the share of
    images whose visual pick differs from the beam's (on both rankings' rows)."""
    out = []
    for (variant, style), group in rows.groupby(["variant", "style"], sort=True):
        beam, visual = (group[group["ranking"] == r].set_index("image_id") for r in RANKINGS)
        changed = float((visual["beam_rank"] != 0).mean()) if len(visual) else float("nan")
        for ranking, picked in zip(RANKINGS, (beam, visual)):
            if picked.empty:
                continue
            refs = {image: references[(image, style)] for image in picked.index}
            metrics = scorer.score(refs, dict(zip(picked.index, picked["hypothesis"])))
            ppl = picked["perplexity"].to_numpy(dtype=float)
            ppl = ppl[np.isfinite(ppl)]
            out.append({"variant": variant, "style": style, "ranking": ranking, "images": len(picked), **metrics,
                        "relatedness": float(picked["relatedness"].mean()),
                        "cls.": float((picked["predicted_style"] == style).mean()),
                        "ppl.": float(np.median(ppl)) if len(ppl) else float("nan"), "changed": changed})
    return pd.DataFrame(out)


def render_markdown(table: pd.DataFrame) -> str:
    """The re-ranking table as markdown (numbers to 3 decimals)."""
    def cell(v) -> str:
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def rerank_report(rows: pd.DataFrame, references: dict[tuple[str, str], list[str]], scorer,
                  samples: int = 5) -> dict[str, float]:
    """Score both rankings (:func:`rerank_table`), log the table and samples to the active MLflow run, and return the
    flat metrics ``rerank.<variant>.<style>.<ranking>.<metric>`` (+ ``.changed``, ``.images``)."""
    import mlflow

    if rows.empty:
        return {"rerank.images": 0}
    table = rerank_table(rows, references, scorer)
    flat: dict[str, float] = {"rerank.images": int(rows.drop_duplicates(["image_id", "style"]).shape[0])}
    skip = {"variant", "style", "ranking", "images", "changed"}
    for r in table.to_dict("records"):
        prefix = f"rerank.{r['variant']}.{r['style']}"
        flat.update({f"{prefix}.{r['ranking']}.{k}": float(v) for k, v in r.items()
                     if k not in skip and not pd.isna(v)})
        flat[f"{prefix}.changed"], flat[f"{prefix}.images"] = float(r["changed"]), int(r["images"])
    mlflow.log_text(render_markdown(table), "visual_rerank.md")
    mlflow.log_table(table, "visual_rerank.json")
    pivot = rows.pivot_table(index=["variant", "image_id", "style"], columns="ranking", values="hypothesis",
                             aggfunc="first").reset_index()
    changed = pivot[pivot["beam"] != pivot["visual"]].head(samples)
    if len(changed):
        mlflow.log_table(changed.assign(references=[references[(i, s)] for i, s in
                                                    zip(changed["image_id"], changed["style"])]),
                         "visual_rerank_samples.json")
    return flat
