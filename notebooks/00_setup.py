# Databricks notebook source
# MAGIC %md
# MAGIC # ERG notebooks: shared setup
# MAGIC `%run` by the other notebooks. It adds the widgets `catalog` and `schema` (defaults `main` / `erg`, the bundle's
# MAGIC variables), makes them the current catalog and schema so SQL names the erg tables bare
# MAGIC (`augmented_captions`, `quarantine`, ...), puts the project's code (deployed by the bundle beside this folder)
# MAGIC on `sys.path`, and loads `cfg`, the `databricks` conf the jobs run with.

# COMMAND ----------

import os
import sys

dbutils.widgets.text("catalog", "main", "catalog")
dbutils.widgets.text("schema", "erg", "schema")
catalog, schema = dbutils.widgets.get("catalog"), dbutils.widgets.get("schema")

# the jobs read their catalog and schema from these two variables (conf/databricks.yaml)
os.environ["ERG_CATALOG"], os.environ["ERG_SCHEMA"] = catalog, schema
project_root = os.path.dirname(os.getcwd())  # the bundle's files: jobs/, models/, conf/, notebooks/
if project_root not in sys.path:
    sys.path.insert(0, project_root)

from jobs.platform.config import load_config  # noqa: E402

cfg = load_config("databricks")
spark.catalog.setCurrentCatalog(catalog)
spark.catalog.setCurrentDatabase(schema)
print(f"tables: {catalog}.{schema}   MLflow experiment: {cfg.mlflow.experiment}")
