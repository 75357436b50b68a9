"""Delta-version watermarks: what each incremental consumer has already seen of its input tables; and the source
files the ingest has already written into its tables (:func:`ingested_sources`).

A consumer (e.g. ``retrieve``) records the versions of the tables it read when it finished; on an incremental
run it asks :func:`new_rows_since` how many rows were inserted since then, read from the tables' Change Data Feed
(every table is created with ``delta.enableChangeDataFeed``). Nothing inserted means the stage can be skipped
without doing any work. The watermark is written only after the consumer succeeded, so a crash means a redo.
"""
from __future__ import annotations

import json
from pathlib import Path

from pyspark.sql import SparkSession

from jobs.platform.config import ErgConfig
from jobs.platform.tables import table_name


def watermarks_path(cfg: ErgConfig) -> Path:
    """The file of every consumer's watermarks (one per schema)."""
    return Path(cfg.home) / "state" / f"watermarks.{cfg.tables.catalog or 'local'}.{cfg.tables.schema_name}.json"


def _read(cfg: ErgConfig) -> dict:
    path = watermarks_path(cfg)
    return json.loads(path.read_text()) if path.exists() else {}


def table_version(spark: SparkSession, cfg: ErgConfig, table: str) -> int:
    return int(spark.sql(f"DESCRIBE HISTORY {table_name(cfg, table)} LIMIT 1").collect()[0]["version"])


def new_rows_since(spark: SparkSession, cfg: ErgConfig, consumer: str, tables: list[str]) -> dict[str, int] | None:
    """Rows inserted into each of ``tables`` since ``consumer``'s watermark (None: no watermark yet)."""
    marks = _read(cfg).get(consumer)
    if marks is None:
        return None
    out = {}
    for table in tables:
        seen = marks.get(table)
        current = table_version(spark, cfg, table)
        if seen is None:
            return None
        if current <= seen:
            out[table] = 0
            continue
        changes = (spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", seen + 1)
                   .table(table_name(cfg, table)))
        out[table] = changes.filter("_change_type IN ('insert', 'update_postimage')").count()
    return out


def record(spark: SparkSession, cfg: ErgConfig, consumer: str, tables: list[str]) -> dict[str, int]:
    """Set ``consumer``'s watermark to the tables' current versions."""
    versions = {table: table_version(spark, cfg, table) for table in tables}
    marks = _read(cfg)
    marks[consumer] = versions
    _write(cfg, marks)
    return versions


def _write(cfg: ErgConfig, marks: dict, path: Path | None = None) -> None:
    """Write ``marks`` to ``path`` (default: the watermarks file) whole or not at all (a rename)."""
    path = path or watermarks_path(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(marks, indent=2))
    tmp.replace(path)


def write_watermarks(cfg: ErgConfig, marks: dict) -> None:
    """Replace every consumer's watermarks by ``marks`` (consumer -> table -> version), e.g. those of a restored
    state (:mod:`jobs.platform.history`)."""
    _write(cfg, marks)


def watermark_version(cfg: ErgConfig, consumer: str, table: str) -> int | None:
    """The version of ``table`` that ``consumer`` had read when it last finished (None: never)."""
    seen = _read(cfg).get(consumer, {}).get(table)
    return None if seen is None else int(seen)


def record_version(cfg: ErgConfig, consumer: str, versions: dict[str, int]) -> None:
    """Set ``consumer``'s watermark to the given table versions (those it read when it started, so rows that
    arrived while it ran are new to its next run)."""
    marks = _read(cfg)
    marks[consumer] = {**marks.get(consumer, {}), **versions}
    _write(cfg, marks)


# ---------------------------------------------------------------------------------------- ingested source files
def ingested_sources_path(cfg: ErgConfig) -> Path:
    """The file of the source files the ingest has written into its tables (one per schema)."""
    return Path(cfg.home) / "state" / f"ingested_sources.{cfg.tables.catalog or 'local'}.{cfg.tables.schema_name}.json"


def table_id(spark: SparkSession, cfg: ErgConfig, table: str) -> str | None:
    """The Delta table's id (a new one when the table is dropped and made again); None when it does not exist."""
    name = table_name(cfg, table)
    if not spark.catalog.tableExists(name):
        return None
    return str(spark.sql(f"DESCRIBE DETAIL {name}").collect()[0]["id"])


def _sources_in(cfg: ErgConfig, ids: dict[str, str | None]) -> dict[str, str]:
    """The recorded sources, if they were written into the tables of these ids; else empty."""
    path = ingested_sources_path(cfg)
    if not path.exists():
        return {}
    marks = json.loads(path.read_text())
    if any(marks.get("tables", {}).get(t) != table for t, table in ids.items()):
        return {}
    return dict(marks.get("sources", {}))


def ingested_sources(spark: SparkSession, cfg: ErgConfig, tables: tuple[str, ...]) -> dict[str, str]:
    """Source key -> content fingerprint of every source the last successful ingest wrote into ``tables``; empty when
    there was none, or when any of the tables is not the one it wrote (dropped, made again, or missing)."""
    return _sources_in(cfg, {t: table_id(spark, cfg, t) for t in tables})


def record_ingested_sources(spark: SparkSession, cfg: ErgConfig, tables: tuple[str, ...],
                            sources: dict[str, str | None]) -> None:
    """After a successful ingest: the tables' ids and the fingerprints of the sources now in them (added to those
    recorded before, when the tables are the same). A source without a fingerprint is not recorded."""
    ids = {t: table_id(spark, cfg, t) for t in tables}
    kept = _sources_in(cfg, ids)
    _write(cfg, {"tables": ids, "sources": {**kept, **{k: v for k, v in sources.items() if v is not None}}},
           ingested_sources_path(cfg))


def write_ingested_sources(cfg: ErgConfig, record: dict | None) -> None:
    """Replace the record of the ingested sources by ``record`` (as :func:`ingested_sources_path` holds it, e.g. that
    of a restored state); None removes it (no source ingested)."""
    if record is None:
        ingested_sources_path(cfg).unlink(missing_ok=True)
    else:
        _write(cfg, record, ingested_sources_path(cfg))
