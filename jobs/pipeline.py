"""``erg run``: ingest -> extract -> embed -> retrieve -> generate (+ filter), one parent MLflow run with a
child run per stage. ``incremental`` reuses the current classifier and generator and processes only new rows."""
from __future__ import annotations

import time

from pyspark.sql import SparkSession

from jobs.config import ErgConfig
from jobs.tracking import configure_mlflow, log_counts
from jobs.watermarks import new_rows_since, record

STAGES = ("ingest", "extract", "embed", "retrieve", "generate")
RETRIEVE_INPUTS = ["embeddings"]


def run_pipeline(spark: SparkSession, cfg: ErgConfig, *, incremental: bool = False) -> dict:
    import mlflow
    from rich.console import Console

    from jobs.embed import embed
    from jobs.extract import extract
    from jobs.generate import generate_augmented
    from jobs.ingest import ingest
    from jobs.retrieve import retrieve

    def retrieve_stage() -> dict:
        # the index is rebuilt and every query searched again only when embeddings changed since the last retrieval
        if incremental:
            new = new_rows_since(spark, cfg, "retrieve", RETRIEVE_INPUTS)
            if new is not None and not any(new.values()):
                return {"skipped": "no new embeddings since the last retrieval", "new_rows": new}
        result = retrieve(spark, cfg)
        record(spark, cfg, "retrieve", RETRIEVE_INPUTS)
        return result

    stage_fns = {
        "ingest": lambda: ingest(spark, cfg),
        "extract": lambda: extract(spark, cfg, incremental=incremental),
        "embed": lambda: embed(spark, cfg),
        "retrieve": retrieve_stage,
        "generate": lambda: generate_augmented(spark, cfg, incremental=incremental),
    }
    console = Console(stderr=True)
    experiment_id = configure_mlflow(cfg)
    results: dict[str, dict] = {}
    with mlflow.start_run(run_name="erg run", experiment_id=experiment_id,
                          tags={"erg.job": "run", "erg.conf": cfg.name,
                                "erg.incremental": str(incremental).lower()}) as parent:
        for number, stage in enumerate(STAGES, start=1):
            console.rule(f"[bold]{number}/{len(STAGES)} {stage}")
            started = time.time()
            results[stage] = stage_fns[stage]()
            seconds = time.time() - started
            log_counts({f"stage_seconds.{stage}": seconds}, step=number)
            console.print(f"{stage}: {seconds:.1f}s")
        results["parent_run_id"] = parent.info.run_id
    return results
