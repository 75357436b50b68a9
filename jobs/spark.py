"""The Spark session: local[*] with Delta Lake and a warehouse on disk, or the cluster's own session.

Locally, Delta's jars are resolved once through Maven (:mod:`jobs.spark_jars`) and put on ``spark.jars``; the
session catalog is in memory, and :func:`jobs.tables.register_tables` maps every ``erg.<table>`` name onto its
Delta folder, so tables are addressable by name in every new process with no metastore service to run.
On Databricks (``platform: databricks``) the running session is reused and names are Unity Catalog names.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from jobs.config import ErgConfig
from jobs.spark_jars import resolve_delta_jars


def on_databricks() -> bool:
    return "DATABRICKS_RUNTIME_VERSION" in os.environ


def get_spark(cfg: ErgConfig):
    """The session for ``cfg``: existing on Databricks, else a local Delta-enabled one (created once)."""
    from pyspark.sql import SparkSession

    if cfg.platform == "databricks":
        return _prepared(SparkSession.getActiveSession() or SparkSession.builder.getOrCreate(), cfg)
    active = SparkSession.getActiveSession()
    if active is not None:
        return _prepared(active, cfg)
    jars = resolve_delta_jars(cfg.spark.jars_dir)
    # Executors (python workers) must run the interpreter that has torch/transformers installed.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # local[*] runs one Python worker per core: one torch thread each (see udfs.runtime.limit_threads)
    os.environ.setdefault("ERG_TORCH_THREADS", "1")
    home = Path(cfg.home)
    home.mkdir(parents=True, exist_ok=True)
    builder = (
        SparkSession.builder.master(cfg.spark.master)
        .appName(cfg.spark.app_name)
        .config("spark.jars", ",".join(jars))
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .config("spark.sql.warehouse.dir", str(Path(cfg.tables.location or home / "warehouse")))
        .config("spark.driver.memory", cfg.spark.driver_memory)
        .config("spark.driver.extraJavaOptions", f"-Dderby.system.home={home}")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", str(cfg.spark.show_progress).lower())
        .config("spark.databricks.delta.schema.autoMerge.enabled", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.python.worker.reuse", "true")
    )
    for key, value in cfg.spark.extra.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return _prepared(spark, cfg)


_REGISTERED: set[tuple[str, str, str | None]] = set()


def _prepared(spark, cfg: ErgConfig):
    """Apply the conf's runtime settings and make sure its schema and tables exist (once per session)."""
    from jobs.tables import register_tables

    if cfg.spark.shuffle_partitions is not None:
        spark.conf.set("spark.sql.shuffle.partitions", str(cfg.spark.shuffle_partitions))
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(cfg.spark.arrow_max_records_per_batch))
    key = (spark.sparkContext.applicationId, f"{cfg.tables.catalog}.{cfg.tables.schema_name}", cfg.tables.location)
    if key not in _REGISTERED:
        register_tables(spark, cfg)
        _REGISTERED.add(key)
    return spark
