"""Helpers of the Spark test modules that plant rows and models instead of running the earlier jobs (the ingest,
embed, extract and generate jobs are tested in their own modules and would cost minutes here)."""
from __future__ import annotations

from pathlib import Path


def append_rows(spark, cfg, table: str, frame) -> None:
    """Append pandas rows (missing nullable columns NULL) to an (empty) table of the schema."""
    from jobs.platform.tables import TABLES, conform, table_name

    fields = TABLES[table].schema.fields
    frame = frame.assign(**{f.name: None for f in fields if f.name not in frame.columns})[[f.name for f in fields]]
    rows = frame.astype(object).where(frame.notna(), None)
    conform(spark.createDataFrame(rows, schema=TABLES[table].schema), table).write.format("delta") \
        .mode("append").saveAsTable(table_name(cfg, table))


def set_current_scoring(cfg, stylized, factual, styles: list[str], generator_version: str) -> None:
    """Evaluation classifiers (style vs factual, linear probes over MiniLM) and per-style trigram LMs (train split),
    recorded as the current ones (what ``erg extract`` / ``erg generate`` leave)."""
    from jobs.platform.model_store import model_dir, set_current
    from jobs.vocabulary import EVALUATION_CLASSIFIERS
    from models.caption_scoring import train_evaluation_classifiers
    from models.trigram_lm import StyleLanguageModels

    train = stylized[stylized["split"] == "train"]
    classifiers = train_evaluation_classifiers(
        "linear_probe", {s: train.loc[train["style"] == s, "caption"].tolist() for s in styles},
        factual["caption"].tolist(), device="cpu", max_length=32, name_or_path="all-MiniLM-L6-v2")
    folder = classifiers.save(model_dir(cfg, EVALUATION_CLASSIFIERS, "fixture"))
    set_current(cfg, EVALUATION_CLASSIFIERS, {"path": folder, "version": "fixture", "kind": "linear_probe",
                                              "styles": styles, "factual_label": "factual"})
    lm_path = StyleLanguageModels.train(train["caption"].tolist(), train["style"].tolist()).save(
        Path(cfg.home) / "lms.json")
    set_current(cfg, "generator", {"lm_path": lm_path, "version": generator_version})
