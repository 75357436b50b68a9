"""``erg ingest``: the corpora's files -> stylized_captions, factual_captions, images, quarantine (Delta MERGE).

Parsing is :mod:`jobs.readers` (pure pandas); this job only turns its rows into DataFrames, stamps the MLflow
run id and ingest time, and MERGEs on the natural keys, so re-ingesting the same files adds nothing.
"""
from __future__ import annotations

import datetime as dt

import pandas as pd
from pyspark.sql import SparkSession

from jobs.config import ErgConfig, IngestSource
from jobs.readers import ReadResult, Reader, stable_id
from jobs.sample import sample_exists, sample_sources, write_sample
from jobs.tables import TABLES, merge_rows
from jobs.tracking import job_run, log_counts

TIME_COLUMN = {"quarantine": "quarantined_at"}


def read_sources(cfg: ErgConfig, sources: list[IngestSource]) -> tuple[ReadResult, dict[str, dict]]:
    reader = Reader(cfg.styles, cfg.factual_label)
    total, per_source = ReadResult(), {}
    for source in sources:
        options = source.model_dump(exclude={"format", "path"})
        result = reader.read(source.format, source.path, **options)
        per_source[f"{source.name or source.format}:{source.path.rsplit('/', 1)[-1]}"] = result.counts()
        total.extend(result)
    return total, per_source


def assign_splits(frame: pd.DataFrame, fractions: dict[str, float]) -> pd.DataFrame:
    """Rows without a split get train/val/test by a hash of their image id: one image, one split everywhere."""
    if "split" not in frame.columns or frame.empty or frame["split"].notna().all():
        return frame
    bounds = (fractions["train"], fractions["train"] + fractions["val"])

    def split_of(image_id: str) -> str:
        u = int(stable_id("split", image_id, length=8), 16) / 16 ** 8
        return "train" if u < bounds[0] else "val" if u < bounds[1] else "test"

    frame = frame.copy()
    missing = frame["split"].isna()
    frame.loc[missing, "split"] = frame.loc[missing, "image_id"].map(split_of)
    return frame


def _to_spark(spark: SparkSession, frame: pd.DataFrame, table: str, run_id: str, now: dt.datetime):
    spec = TABLES[table]
    frame = frame.copy()
    frame[TIME_COLUMN.get(table, "ingest_time")] = now
    frame["run_id"] = run_id
    for f in spec.schema.fields:
        if f.name not in frame.columns:
            frame[f.name] = None
    frame = frame[[f.name for f in spec.schema.fields]].astype(object).where(frame.notna(), None)
    return spark.createDataFrame(frame, schema=spec.schema)


def ingest(spark: SparkSession, cfg: ErgConfig, sources: list[IngestSource] | None = None) -> dict[str, int]:
    """Ingest ``sources`` (default: ``cfg.ingest.sources``, or the generated sample when that is empty)."""
    if sources is None:
        sources = list(cfg.ingest.sources)
    if not sources:
        if not sample_exists(cfg):
            write_sample(cfg)
        sources = sample_sources(cfg)
    with job_run(cfg, "ingest", params={"sources": [s.path for s in sources]}) as run:
        result, per_source = read_sources(cfg, sources)
        now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
        counts: dict[str, int] = {}
        for table, frame in result.frames().items():
            frame = assign_splits(frame, cfg.ingest.split_fractions)
            df = _to_spark(spark, frame, table, run.info.run_id, now)
            stats = merge_rows(spark, cfg, table, df,
                               fill_nulls=("uri", "tags", "width", "height") if table == "images" else ())
            counts[f"{table}.read"] = len(frame)
            counts[f"{table}.inserted"] = stats["inserted"]
        for name, c in per_source.items():
            counts.update({f"source.{name}.{k}": v for k, v in c.items() if v})
        log_counts(counts)
        import mlflow

        mlflow.log_dict(per_source, "ingest_sources.json")
        reasons = pd.Series([q["reason"] for q in result.quarantine], dtype=object).value_counts().to_dict()
        mlflow.log_dict({str(k): int(v) for k, v in reasons.items()}, "quarantine_reasons.json")
        counts["run_id"] = run.info.run_id
        return counts
