"""The platform the jobs run on: nothing here knows a stage of ERG, and nothing here imports a module of ``jobs``
outside ``jobs.platform`` (``tests/test_job_shape.py`` checks it).

- the conf and its errors: :mod:`~jobs.platform.config`, :mod:`~jobs.platform.errors`, :mod:`~jobs.platform.console`
- Spark: the session (:mod:`~jobs.platform.spark`), Delta's jars (:mod:`~jobs.platform.spark_jars`, the ``jars/``
  folder), pyspark's launcher (:mod:`~jobs.platform.spark_launcher`), a local Spark Connect server
  (:mod:`~jobs.platform.connect_server`) and standalone cluster (:mod:`~jobs.platform.standalone_cluster`)
- the tables and what the jobs have seen of them: :mod:`~jobs.platform.tables`, :mod:`~jobs.platform.watermarks`
- MLflow: :mod:`~jobs.platform.mlflow_setup`, :mod:`~jobs.platform.tracking`, :mod:`~jobs.platform.model_store`
- one writer at a time and undo: :mod:`~jobs.platform.lock`, :mod:`~jobs.platform.state`,
  :mod:`~jobs.platform.history` (``erg history`` / ``erg restore``)
- the shape of a job: :mod:`~jobs.platform.runner` (named steps inside the job's MLflow run)
"""
