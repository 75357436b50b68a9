"""``erg run``: ingest -> extract -> embed -> retrieve -> generate (+ filter), one parent MLflow run with a
child run per stage. ``incremental`` reuses the current classifier and generator and processes only new rows."""
from __future__ import annotations

import time
from typing import Any, Callable

from pyspark.sql import SparkSession

from jobs.embed import embed
from jobs.extract import extract
from jobs.generate import generate_augmented
from jobs.ingest import ingest
from jobs.platform.config import ErgConfig
from jobs.platform.console import stage as progress
from jobs.platform.runner import parent_run
from jobs.platform.state import SCHEMA_TAG, schema_key
from jobs.platform.tracking import log_counts, recording
from jobs.retrieve import retrieve

STAGES = ("ingest", "extract", "embed", "retrieve", "generate")

#: each stage's job through its public function: (spark, cfg, incremental) -> the job's result
STAGE_JOBS: dict[str, Callable[[SparkSession, ErgConfig, bool], dict]] = {
    "ingest": lambda spark, cfg, incremental: ingest(spark, cfg),
    "extract": lambda spark, cfg, incremental: extract(spark, cfg, incremental=incremental),
    "embed": lambda spark, cfg, incremental: embed(spark, cfg),
    # incremental: only what embeddings gained since the last retrieval is searched (jobs.retrieve)
    "retrieve": lambda spark, cfg, incremental: retrieve(spark, cfg, incremental=incremental),
    "generate": lambda spark, cfg, incremental: generate_augmented(spark, cfg, incremental=incremental),
}


def run_stage(spark: SparkSession, cfg: ErgConfig, number: int, stage: str, incremental: bool) -> dict:
    """One stage's job (a child run of the active parent) under one progress line ("n/N stage", then its time);
    its seconds as ``stage_seconds.<stage>`` at step ``number``."""
    started = time.time()
    with progress(stage, number, len(STAGES)) as line:
        line.result = result = STAGE_JOBS[stage](spark, cfg, incremental)
    log_counts({f"stage_seconds.{stage}": time.time() - started}, step=number)
    return result


def run_pipeline(spark: SparkSession, cfg: ErgConfig, *, incremental: bool = False) -> dict[str, Any]:
    results: dict[str, Any] = {}
    # nested under an active run (e.g. ``erg experiment``'s, which reruns ERG at each Fig. 5 eps)
    with parent_run(cfg, "erg run", tags={"erg.job": "run", "erg.conf": cfg.name, SCHEMA_TAG: schema_key(cfg),
                                          "erg.incremental": str(incremental).lower()}) as parent, \
            recording(cfg, parent.info.run_id):  # the state after the whole run: what `erg restore` brings back
        for number, stage in enumerate(STAGES, start=1):
            results[stage] = run_stage(spark, cfg, number, stage, incremental)
        results["parent_run_id"] = parent.info.run_id
    return results
