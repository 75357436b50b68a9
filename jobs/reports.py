"""What the jobs render for people, logged as artifacts of the active MLflow run: summaries, tables (markdown, HTML,
MLflow tables), plots and examples. The jobs compute the numbers and frames; this module only renders and logs
them, under the artifact names the tests and ``erg compare`` read.
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd


def _mlflow():
    import mlflow

    return mlflow


def _log_png(render, name: str) -> None:
    """``render(path)`` writes a PNG at ``path`` and returns it; the file is logged and removed."""
    with tempfile.TemporaryDirectory() as tmp:
        _mlflow().log_artifact(str(render(Path(tmp) / name)))


# ---------------------------------------------------------------------------------------------- ingest
def summary_lines(per_source: dict[str, dict[str, int]], accounting: tuple[str, ...]) -> list[str]:
    """A table of every source's read = kept + quarantined + duplicates (what ``erg ingest`` prints)."""
    rows = [(name, *(c[k] for k in accounting[:4])) for name, c in sorted(per_source.items())]
    rows.append(("total", *(sum(r[i] for r in rows) for i in range(1, 5))))
    width = max(len(r[0]) for r in [("source",), *rows])
    lines = [f"{'source':<{width}}  {'read':>8} = {'kept':>8} + {'quarantined':>11} + {'duplicates':>10}"]
    lines += [f"{n:<{width}}  {r:>8,} = {k:>8,} + {q:>11,} + {d:>10,}" for n, r, k, q, d in rows]
    return lines


def log_ingest(per_source: dict[str, dict[str, int]], quarantine_reasons: list[str], duplicates: Any,
               summary: list[str]) -> None:
    """``ingest_sources.json``, ``quarantine_reasons.json``, ``duplicates.json`` and ``ingest_summary.txt``."""
    mlflow = _mlflow()
    mlflow.log_dict(per_source, "ingest_sources.json")
    reasons = pd.Series(quarantine_reasons, dtype=object).value_counts().to_dict()
    mlflow.log_dict({str(k): int(v) for k, v in reasons.items()}, "quarantine_reasons.json")
    mlflow.log_dict(duplicates, "duplicates.json")
    mlflow.log_text("\n".join(summary) + "\n", "ingest_summary.txt")


# ----------------------------------------------------------------------------------------------- embed
def log_embed_skipped(image_input: str, no_input: float, failed_examples: list[dict]) -> None:
    """``embed_skipped.json``: the image input the encoder needs, the images without it, examples of failures."""
    _mlflow().log_dict({"image_input": image_input, "no_input": no_input, "failed_examples": failed_examples},
                       "embed_skipped.json")


# --------------------------------------------------------------------------------------------- extract
def log_head_selection(style_set: str, selection) -> None:
    """A style set's Eq. 2 confidence heatmap (``head_confidence_<set>.png``) and ``head_selection_<set>.json``."""
    from models.importance_render import confidence_heatmap_png

    _log_png(lambda path: confidence_heatmap_png(selection.confidence, (selection.layer, selection.head), path),
             f"head_confidence_{style_set}.png")
    _mlflow().log_dict(selection.to_dict(), f"head_selection_{style_set}.json")


def log_table4(records: list, styles: list[str], per_style: int) -> None:
    """Table 4: the words of sample captions shaded by importance (``table4_importance.html`` / ``.png``)."""
    from models.importance_render import importance_html, importance_png

    _mlflow().log_text(importance_html(records, styles, per_style), "table4_importance.html")
    _log_png(lambda path: importance_png(records, styles, path, per_style), "table4_importance.png")


def log_phrase_quality(quality: dict) -> None:
    _mlflow().log_dict(quality, "phrase_quality.json")


# -------------------------------------------------------------------------------------------- generate
def log_pass_rates(per_style: pd.DataFrame) -> None:
    """The pass rates per style and filter: ``pass_rates.txt`` and ``pass_rates.json``."""
    mlflow = _mlflow()
    mlflow.log_text(per_style.to_string(index=False), "pass_rates.txt")
    mlflow.log_table(per_style, "pass_rates.json")


def log_fig4_samples(samples: pd.DataFrame) -> None:
    _mlflow().log_table(samples, "fig4_samples.json")


# ----------------------------------------------------------------------------------------------- train
def log_loss_curve(run_id: str, summary: dict[str, Any]) -> None:
    """Every step's loss (mean over ranks) and every epoch's mean loss as MLflow metric histories of ``run_id``."""
    import time

    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    now = int(time.time() * 1000)
    metrics = [Metric("loss", float(v), now, step) for step, v in enumerate(summary["losses"], start=1)]
    metrics += [Metric("epoch_loss", float(v), now, epoch) for epoch, v in enumerate(summary["epoch_losses"])]
    client = MlflowClient()
    for start in range(0, len(metrics), 1000):  # log_batch takes at most 1000 metrics
        client.log_batch(run_id, metrics=metrics[start:start + 1000])


# -------------------------------------------------------------------------------------------- evaluate
def log_table2(table: pd.DataFrame) -> str:
    """The paper's Table 2 as ``table2.md`` / ``table2.html`` / ``table2.json``; returns the markdown."""
    from models.paper_table import render_html, render_markdown

    mlflow = _mlflow()
    table_md = render_markdown(table)
    mlflow.log_text(table_md, "table2.md")
    mlflow.log_text(render_html(table), "table2.html")
    mlflow.log_table(table.reset_index(), "table2.json")
    return table_md


def log_caption_samples(samples: pd.DataFrame) -> None:
    _mlflow().log_table(samples, "caption_samples.json")


# ---------------------------------------------------------------------------------------------- retrieve
def log_scene_indexes(index_types: dict[str, str], tunings: dict) -> None:
    """The params ``index.<modality>.type`` and, for each index ``auto`` tuned (``tunings``: modality ->
    :class:`models.scene_index.IndexTuning`), ``index.<modality>.kind_chosen`` / ``.search_param`` /
    ``.auto_reason``, with every measured setting in ``index_tuning.json``."""
    mlflow = _mlflow()
    mlflow.log_params({f"index.{m}.type": t for m, t in index_types.items()})
    for modality, tuning in tunings.items():
        mlflow.log_params({f"index.{modality}.kind_chosen": tuning.index_type,
                           f"index.{modality}.search_param": tuning.search_param,
                           f"index.{modality}.auto_reason": tuning.reason})
    if tunings:
        mlflow.log_dict({m: t.as_dict() for m, t in tunings.items()}, "index_tuning.json")


def log_table5(encoder_version: str, index_types: dict[str, str], table: pd.DataFrame) -> str:
    """The paper's Table 5 view (per retrieval type: queries, queries with a hit, hits per style, mean similarity) as
    ``table5_counts.json`` / ``table5_counts.md``; returns the markdown."""
    from udfs.retrieval import markdown_table

    mlflow = _mlflow()
    mlflow.log_dict({"encoder_version": encoder_version, "index_types": index_types,
                     "rows": table.replace({np.nan: None}).to_dict("records")}, "table5_counts.json")
    table_md = markdown_table(table)
    mlflow.log_text(table_md, "table5_counts.md")
    return table_md


def log_retrieval_examples(examples: list[dict]) -> None:
    """The Fig. 3 view (factual caption -> retrieved stylized captions): ``retrieval_examples.json`` / ``.md``."""
    from udfs.retrieval import examples_markdown

    mlflow = _mlflow()
    mlflow.log_dict({"examples": examples}, "retrieval_examples.json")
    mlflow.log_text(examples_markdown(examples), "retrieval_examples.md")
