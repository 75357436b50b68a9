# Databricks notebook source
# MAGIC %md
# MAGIC # Compare MLflow runs
# MAGIC The notebook form of `erg compare`: the last runs of one job (tag `erg.job`), or the runs you name, side by
# MAGIC side: the params that differ, every count, pass rate and metric with its change, and the `erg.*` tags. Then
# MAGIC the training curves of the compared runs and their rows in `augmented_captions`.

# COMMAND ----------

# MAGIC %run ./00_setup

# COMMAND ----------

import jobs

dbutils.widgets.text("job", "generate", "job (tag erg.job)")
dbutils.widgets.text("last", "2", "last runs of the job")
dbutils.widgets.text("run_ids", "", "run ids, comma-separated (instead of job)")
run_ids = [run_id.strip() for run_id in dbutils.widgets.get("run_ids").split(",") if run_id.strip()]
job = None if run_ids else (dbutils.widgets.get("job").strip() or None)
comparison = jobs.compare(cfg, run_ids or None, job, int(dbutils.widgets.get("last")))
display(comparison.runs.reset_index())

# COMMAND ----------

# MAGIC %md
# MAGIC ## Params that differ
# MAGIC Params identical in every run are left out; a param only some runs logged counts as differing.

# COMMAND ----------

display(comparison.params.reset_index())

# COMMAND ----------

# MAGIC %md
# MAGIC ## Metrics, by section
# MAGIC counts, pass rates, classifier, generator, training, evaluation, timings; `delta` = last run - first run.

# COMMAND ----------

display(comparison.metrics.reset_index())

# COMMAND ----------

import matplotlib.pyplot as plt

rates = comparison.metrics[comparison.metrics["section"] == "pass rates"].drop(columns=["section", "delta"])
if rates.empty:
    print("the compared runs logged no pass rates (only generate runs do)")
else:
    ax = rates.plot.barh(figsize=(9, max(3, 0.35 * len(rates))))
    ax.set(xlabel="pass rate", ylabel="", title="pass rates per run")
    display(ax.figure)

# COMMAND ----------

# MAGIC %md
# MAGIC ## Training curves
# MAGIC The per-step losses the runs logged: `classifier.loss` (extract), `generator.loss` (generate), `loss` (train).

# COMMAND ----------

from mlflow.tracking import MlflowClient

client = MlflowClient(tracking_uri=cfg.mlflow.tracking_uri)
curves = [key for key in comparison.metrics.index if key == "loss" or key.endswith(".loss")]
if not curves:
    print("the compared runs logged no per-step losses")
else:
    fig, axes = plt.subplots(1, len(curves), figsize=(6 * len(curves), 4), squeeze=False)
    for ax, key in zip(axes[0], curves):
        for label, run_id in comparison.runs["run_id"].items():
            history = client.get_metric_history(run_id, key)
            ax.plot([m.step for m in history], [m.value for m in history], label=label)
        ax.set(title=key, xlabel="step")
        ax.legend()
    fig.tight_layout()
    display(fig)

# COMMAND ----------

# MAGIC %md
# MAGIC ## The compared runs' rows in augmented_captions

# COMMAND ----------

from pyspark.sql import functions as F

rows = (spark.table("augmented_captions")
        .where(F.col("run_id").isin(list(comparison.runs["run_id"])))
        .groupBy("run_id", "style")
        .agg(F.count(F.lit(1)).alias("candidates"), F.round(F.avg(F.col("passed").cast("double")), 3).alias("pass_rate"))
        .orderBy("run_id", "style"))
display(rows)

# COMMAND ----------

# MAGIC %md
# MAGIC ## Tags

# COMMAND ----------

display(comparison.tags.reset_index())
