# Databricks notebook source
# MAGIC %md
# MAGIC # Quarantine and lineage
# MAGIC Bad input is never dropped silently: `erg ingest` keeps every rejected row in `quarantine` with its raw text
# MAGIC and reason. Every job writes its MLflow run id on the rows it produced; this notebook counts rows per table and
# MAGIC run and joins them with the MLflow runs (job, conf, status, parent `erg run`).

# COMMAND ----------

# MAGIC %run ./00_setup

# COMMAND ----------

# MAGIC %md
# MAGIC ## Quarantined rows by source and reason

# COMMAND ----------

# MAGIC %sql
# MAGIC SELECT source, reason, count(*) AS rows, min(quarantined_at) AS first_seen, max(quarantined_at) AS last_seen
# MAGIC FROM quarantine
# MAGIC GROUP BY source, reason
# MAGIC ORDER BY rows DESC, source, reason

# COMMAND ----------

# MAGIC %sql
# MAGIC SELECT source, source_file, line_no, reason, left(raw, 200) AS raw, run_id
# MAGIC FROM quarantine
# MAGIC ORDER BY quarantined_at DESC, source, line_no
# MAGIC LIMIT 100

# COMMAND ----------

# MAGIC %md
# MAGIC ## Share of each source's rows that were quarantined

# COMMAND ----------

# MAGIC %sql
# MAGIC SELECT q.source, q.quarantined, coalesce(s.stylized, 0) + coalesce(f.factual, 0) AS ingested,
# MAGIC        round(q.quarantined / (q.quarantined + coalesce(s.stylized, 0) + coalesce(f.factual, 0)), 4)
# MAGIC          AS quarantined_share
# MAGIC FROM (SELECT source, count(*) AS quarantined FROM quarantine GROUP BY source) q
# MAGIC LEFT JOIN (SELECT source, count(*) AS stylized FROM stylized_captions GROUP BY source) s ON s.source = q.source
# MAGIC LEFT JOIN (SELECT source, count(*) AS factual FROM factual_captions GROUP BY source) f ON f.source = q.source
# MAGIC ORDER BY quarantined_share DESC

# COMMAND ----------

# MAGIC %md
# MAGIC ## Rows per table and run, with the MLflow run that wrote them

# COMMAND ----------

import mlflow

rows_by_run = spark.sql("""
    SELECT 'stylized_captions' AS table_name, run_id, count(*) AS rows FROM stylized_captions GROUP BY run_id
    UNION ALL SELECT 'factual_captions', run_id, count(*) FROM factual_captions GROUP BY run_id
    UNION ALL SELECT 'images', run_id, count(*) FROM images GROUP BY run_id
    UNION ALL SELECT 'quarantine', run_id, count(*) FROM quarantine GROUP BY run_id
    UNION ALL SELECT 'style_phrases', run_id, count(*) FROM style_phrases GROUP BY run_id
    UNION ALL SELECT 'embeddings', run_id, count(*) FROM embeddings GROUP BY run_id
    UNION ALL SELECT 'retrievals', run_id, count(*) FROM retrievals GROUP BY run_id
    UNION ALL SELECT 'augmented_captions', run_id, count(*) FROM augmented_captions GROUP BY run_id
""").toPandas()

mlflow.set_tracking_uri(cfg.mlflow.tracking_uri)
runs = mlflow.search_runs(experiment_names=[cfg.mlflow.experiment])
run_columns = {"run_id": "run_id", "tags.erg.job": "job", "tags.erg.conf": "conf", "status": "status",
               "start_time": "started", "tags.mlflow.parentRunId": "parent_run_id"}
runs = runs.reindex(columns=list(run_columns)).rename(columns=run_columns)
lineage = rows_by_run.merge(runs, on="run_id", how="left").sort_values(["started", "table_name"], ascending=[False, True])
display(lineage)

# COMMAND ----------

# MAGIC %md
# MAGIC Rows whose run id is not in the experiment (a deleted run, or rows written under another experiment):

# COMMAND ----------

display(lineage[lineage["job"].isna()])

# COMMAND ----------

# MAGIC %md
# MAGIC ## Model versions behind the derived tables
# MAGIC `classifier_version`, `encoder_version` and `generator_version` name the model each row was computed with
# MAGIC (the classifier and generator versions are the MLflow runs that trained them).

# COMMAND ----------

# MAGIC %sql
# MAGIC SELECT 'style_phrases' AS table_name, classifier_version AS model_version, count(*) AS rows,
# MAGIC        count(DISTINCT run_id) AS runs
# MAGIC FROM style_phrases GROUP BY classifier_version
# MAGIC UNION ALL
# MAGIC SELECT 'embeddings', encoder_version, count(*), count(DISTINCT run_id) FROM embeddings GROUP BY encoder_version
# MAGIC UNION ALL
# MAGIC SELECT 'retrievals', encoder_version, count(*), count(DISTINCT run_id) FROM retrievals GROUP BY encoder_version
# MAGIC UNION ALL
# MAGIC SELECT 'augmented_captions', generator_version, count(*), count(DISTINCT run_id)
# MAGIC FROM augmented_captions GROUP BY generator_version
# MAGIC ORDER BY table_name, model_version
