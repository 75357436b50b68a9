"""The Spark session: local[*] with Delta Lake and a warehouse on disk, or the cluster's own session.

Locally, Delta's jars are resolved once through Maven (:mod:`jobs.platform.spark_jars`) and put on ``spark.jars``; the
session catalog is in memory, and :func:`jobs.platform.tables.register_tables` maps every ``erg.<table>`` name onto its
Delta folder, so tables are addressable by name in every new process with no metastore service to run.
On Databricks (``platform: databricks``) the running session is reused and names are Unity Catalog names.
With ``spark.remote`` (``sc://host:port``) the jobs run against a Spark Connect server instead, as on Databricks
serverless and standard-access clusters: there is no SparkContext there, so nothing here may need one
(:func:`has_spark_context`, :func:`default_parallelism`); :mod:`jobs.platform.connect_server` starts a local server.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from jobs.platform.config import ErgConfig
from jobs.platform.spark_jars import resolve_delta_jars


def on_databricks() -> bool:
    return "DATABRICKS_RUNTIME_VERSION" in os.environ


def get_spark(cfg: ErgConfig, *, register: bool = True):
    """The session for ``cfg``: existing on Databricks, else a local Delta-enabled one (created once).
    ``register`` False: the schema's tables are not made or registered yet (the CLI takes the schema's run lock,
    :mod:`jobs.platform.lock`, before a writing job creates them)."""
    from pyspark.sql import SparkSession

    if cfg.platform == "databricks":
        return _prepared(SparkSession.getActiveSession() or SparkSession.builder.getOrCreate(), cfg, register)
    if cfg.spark.remote:
        # the server holds Delta's jars and extensions (jobs.platform.connect_server); this process only speaks gRPC
        return _prepared(SparkSession.builder.remote(cfg.spark.remote).getOrCreate(), cfg, register)
    active = SparkSession.getActiveSession()
    if active is not None:
        return _prepared(active, cfg, register)
    from jobs.platform.console import jvm_output, quiet

    builder = SparkSession.builder.master(cfg.spark.master)
    settings = session_settings(cfg)
    if quiet():  # under the CLI: the JVM's output goes to the command's log file; its own progress lines show
        settings["spark.ui.showConsoleProgress"] = "false"
    for key, value in settings.items():
        builder = builder.config(key, value)
    with jvm_output():
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN" if quiet() else "ERROR")
    return _prepared(spark, cfg, register)


def session_settings(cfg: ErgConfig) -> dict[str, str]:
    """The settings of a local session (or of a local Spark Connect server, :mod:`jobs.platform.connect_server`):
    Delta's jars (resolved through Maven once) and extensions, the warehouse under ``home``, and ``spark.extra``. Sets
    the environment its Python workers inherit (the interpreter that has torch/transformers, one torch thread each)."""
    jars = resolve_delta_jars(cfg.spark.jars_dir)
    # Executors (python workers) must run the interpreter that has torch/transformers installed.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # local[*] runs one Python worker per core: one torch thread each (see udfs.runtime.limit_threads)
    os.environ.setdefault("ERG_TORCH_THREADS", "1")
    home = Path(cfg.home)
    home.mkdir(parents=True, exist_ok=True)
    settings = {
        "spark.app.name": cfg.spark.app_name,
        "spark.jars": ",".join(jars),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.warehouse.dir": str(Path(cfg.tables.location or home / "warehouse")),
        "spark.driver.memory": cfg.spark.driver_memory,
        "spark.driver.extraJavaOptions": f"-Dderby.system.home={home}",
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": str(cfg.spark.show_progress).lower(),
        "spark.databricks.delta.schema.autoMerge.enabled": "false",
        # Delta rebuilds a table's log state (snapshot, file listing) in 50 tasks by default: on a few local cores
        # that was most of a small job's time. Our tables are few files (auto compaction), so their log state is
        # small.
        "spark.databricks.delta.snapshotPartitions": "2",
        # auto compaction rewrites files under this size (default: half its 128 MB target). At half, a 6M-row
        # retrievals file of 38 MB was rewritten after every small incremental append
        "spark.databricks.delta.autoCompact.minFileSize": str(16 * 1024 * 1024),
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.python.worker.reuse": "true",
        # a standalone cluster's executors do not inherit this process's environment
        "spark.executorEnv.ERG_TORCH_THREADS": os.environ["ERG_TORCH_THREADS"],
    }
    settings.update(cfg.spark.extra)
    return settings


def is_connect(spark) -> bool:
    """Whether ``spark`` is a Spark Connect session (a gRPC client: no SparkContext, no broadcast variables)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def has_spark_context(spark) -> bool:
    """Whether ``spark.sparkContext`` exists (a classic session, not Spark Connect)."""
    return not is_connect(spark)


def default_parallelism(spark) -> int:
    """The task slots to size a job's partitions by: the SparkContext's default parallelism, or on Spark Connect
    ``spark.default.parallelism`` where the server sets it, else its ``spark.sql.shuffle.partitions``."""
    if has_spark_context(spark):
        return int(spark.sparkContext.defaultParallelism)
    for key in ("spark.default.parallelism", "spark.sql.shuffle.partitions"):
        value = spark.conf.get(key, None)
        if value:
            return max(1, int(value))
    return 1


def spread_tasks(slots: int, items: int, min_items: int, per_slot: int = 1) -> int:
    """Tasks a model UDF's ``items`` are spread over: ``per_slot`` per task slot, but no task with fewer than
    ``min_items`` (each task loads its model once per Python worker, so tiny tasks cost more); at least one."""
    return max(1, min(slots * per_slot, items // min_items + 1))


def session_key(spark) -> str:
    """An id of the session's application (classic) or Connect session."""
    return spark.session_id if is_connect(spark) else spark.sparkContext.applicationId


_REGISTERED: set[tuple[str, str, str | None]] = set()


def _prepared(spark, cfg: ErgConfig, register: bool = True):
    """Apply the conf's runtime settings and make sure its schema and tables exist (once per session; not with
    ``register`` False)."""
    from jobs.platform.tables import register_tables

    if cfg.spark.shuffle_partitions is not None:
        spark.conf.set("spark.sql.shuffle.partitions", str(cfg.spark.shuffle_partitions))
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(cfg.spark.arrow_max_records_per_batch))
    key = (session_key(spark), f"{cfg.tables.catalog}.{cfg.tables.schema_name}", cfg.tables.location)
    if register and key not in _REGISTERED:
        register_tables(spark, cfg)
        _REGISTERED.add(key)
    return spark
