"""``erg run``: ingest -> extract -> embed -> retrieve -> generate (+ filter), one parent MLflow run with a
child run per stage. ``incremental`` reuses the current classifier and generator and processes only new rows."""
from __future__ import annotations

import time

from pyspark.sql import SparkSession

from jobs.config import ErgConfig
from jobs.tracking import configure_mlflow, log_counts

STAGES = ("ingest", "extract", "embed", "retrieve", "generate")


def run_pipeline(spark: SparkSession, cfg: ErgConfig, *, incremental: bool = False) -> dict:
    import mlflow

    from jobs.console import stage as progress
    from jobs.embed import embed
    from jobs.extract import extract
    from jobs.generate import generate_augmented
    from jobs.ingest import ingest
    from jobs.retrieve import retrieve

    stage_fns = {
        "ingest": lambda: ingest(spark, cfg),
        "extract": lambda: extract(spark, cfg, incremental=incremental),
        "embed": lambda: embed(spark, cfg),
        # incremental: only what embeddings gained since the last retrieval is searched (jobs.retrieve)
        "retrieve": lambda: retrieve(spark, cfg, incremental=incremental),
        "generate": lambda: generate_augmented(spark, cfg, incremental=incremental),
    }
    experiment_id = configure_mlflow(cfg)
    results: dict[str, dict] = {}
    # nested under an active run (e.g. ``erg experiment``'s, which reruns ERG at each Fig. 5 eps)
    with mlflow.start_run(run_name="erg run", experiment_id=experiment_id, nested=mlflow.active_run() is not None,
                          tags={"erg.job": "run", "erg.conf": cfg.name,
                                "erg.incremental": str(incremental).lower()}) as parent:
        for number, stage in enumerate(STAGES, start=1):
            started = time.time()
            with progress(stage, number, len(STAGES)) as line:  # one line per stage: "n/N stage", then its time
                line.result = results[stage] = stage_fns[stage]()
            seconds = time.time() - started
            log_counts({f"stage_seconds.{stage}": seconds}, step=number)
        results["parent_run_id"] = parent.info.run_id
    return results
