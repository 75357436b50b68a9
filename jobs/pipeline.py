"""``erg run``: the whole pipeline under one parent MLflow run, each stage a child run."""
from __future__ import annotations

from pyspark.sql import SparkSession

from jobs.config import ErgConfig
from jobs.tracking import configure_mlflow


def run_pipeline(spark: SparkSession, cfg: ErgConfig, *, incremental: bool = False) -> dict:
    import mlflow

    from jobs.ingest import ingest

    experiment_id = configure_mlflow(cfg)
    results: dict[str, dict] = {}
    with mlflow.start_run(run_name="erg run", experiment_id=experiment_id,
                          tags={"erg.job": "run", "erg.conf": cfg.name}) as parent:
        results["ingest"] = ingest(spark, cfg)
        results["parent_run_id"] = parent.info.run_id
    return results
