"""The state of the schema after a writing job, recorded on its MLflow run (what ``erg restore`` brings back,
:mod:`jobs.platform.history`).

At the end of every writing job (each stage's MLflow run and ``erg run``'s parent,
:func:`jobs.platform.tracking.recording`) :func:`record_state` writes onto its MLflow run the state of the schema
right after it:

- tag ``erg.versions``: the Delta version of every table (JSON ``{table: version}``), tag ``erg.written``: those whose
  version the job moved, tag ``erg.schema`` (set when the run starts, :func:`jobs.platform.tracking.job_run`);
- artifact ``erg_state.json``: the same versions and the tables' Delta ids, the watermarks and ingested-source
  record (:mod:`jobs.platform.watermarks`) and the version each of the schema's registered models had as ``current``
  (:mod:`jobs.platform.model_store`).

A job that failed records nothing.
"""
from __future__ import annotations

import json
from typing import Any

from jobs.platform.config import ErgConfig

STATE_ARTIFACT = "erg_state.json"
SCHEMA_TAG, VERSIONS_TAG, WRITTEN_TAG = "erg.schema", "erg.versions", "erg.written"


def schema_key(cfg: ErgConfig) -> str:
    return f"{cfg.tables.catalog}.{cfg.tables.schema_name}" if cfg.tables.catalog else cfg.tables.schema_name


def table_versions(spark, cfg: ErgConfig) -> dict[str, int]:
    """The latest Delta version of every table of the schema that exists."""
    from jobs.platform.tables import TABLES, table_name
    from jobs.platform.watermarks import table_version

    return {t: table_version(spark, cfg, t) for t in TABLES if spark.catalog.tableExists(table_name(cfg, t))}


def snapshot(spark, cfg: ErgConfig) -> dict[str, Any]:
    """The schema's state now: table versions and ids, watermarks, ingested sources, ``current`` aliases."""
    from jobs.platform.model_store import current_aliases
    from jobs.platform.watermarks import ingested_sources_path, table_id, watermarks_path

    versions = table_versions(spark, cfg)
    files = {}
    for key, path in (("watermarks", watermarks_path(cfg)), ("ingested_sources", ingested_sources_path(cfg))):
        files[key] = json.loads(path.read_text()) if path.exists() else None
    return {"schema": schema_key(cfg), "tables": versions,
            "table_ids": {t: table_id(spark, cfg, t) for t in versions}, **files, "models": current_aliases(cfg)}


def record_state(spark, cfg: ErgConfig, run_id: str, before: dict[str, int] | None) -> dict[str, Any]:
    """Write the schema's state after a job onto its MLflow run (tags and ``erg_state.json``); ``before``: the table
    versions when it started (what it wrote is what moved)."""
    from mlflow import MlflowClient

    state = snapshot(spark, cfg)
    state["written"] = {t: v for t, v in state["tables"].items() if (before or {}).get(t) != v}
    client = MlflowClient()
    client.log_dict(run_id, state, STATE_ARTIFACT)
    client.set_tag(run_id, VERSIONS_TAG, json.dumps(state["tables"], separators=(",", ":")))
    client.set_tag(run_id, WRITTEN_TAG, json.dumps(state["written"], separators=(",", ":")))
    return state
