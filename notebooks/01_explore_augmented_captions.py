# Databricks notebook source
# MAGIC %md
# MAGIC # Explore the augmented captions (D_a)
# MAGIC Every generated caption of `erg generate` is kept in `augmented_captions` with its three filter verdicts
# MAGIC (classifier assigns the target style; trigram perplexity below `generate.filters.ppl_max`; retrieval
# MAGIC similarity above `generate.filters.min_similarity`). This notebook counts them per style and retrieval type,
# MAGIC shows the pass rate of each filter, samples captions, and plots the similarity and perplexity distributions.

# COMMAND ----------

# MAGIC %run ./00_setup

# COMMAND ----------

# MAGIC %md
# MAGIC ## Candidates and kept captions per style and retrieval type

# COMMAND ----------

# MAGIC %sql
# MAGIC SELECT style, retrieval_type, count(*) AS candidates, sum(CAST(passed AS INT)) AS kept,
# MAGIC        round(avg(CAST(passed AS DOUBLE)), 3) AS pass_rate
# MAGIC FROM augmented_captions
# MAGIC GROUP BY style, retrieval_type
# MAGIC ORDER BY style, retrieval_type

# COMMAND ----------

# MAGIC %md
# MAGIC ## Pass rate of each filter, per style
# MAGIC A caption is kept only if it passes all three; `reject_reason` names the first it failed.

# COMMAND ----------

# MAGIC %sql
# MAGIC SELECT style, count(*) AS candidates,
# MAGIC        round(avg(CAST(passed_style AS DOUBLE)), 3) AS pass_rate_style,
# MAGIC        round(avg(CAST(passed_perplexity AS DOUBLE)), 3) AS pass_rate_perplexity,
# MAGIC        round(avg(CAST(passed_similarity AS DOUBLE)), 3) AS pass_rate_similarity,
# MAGIC        round(avg(CAST(passed AS DOUBLE)), 3) AS pass_rate
# MAGIC FROM augmented_captions
# MAGIC GROUP BY style
# MAGIC ORDER BY style

# COMMAND ----------

# MAGIC %sql
# MAGIC SELECT style, reject_reason, count(*) AS captions
# MAGIC FROM augmented_captions
# MAGIC WHERE NOT passed
# MAGIC GROUP BY style, reject_reason
# MAGIC ORDER BY style, captions DESC

# COMMAND ----------

# MAGIC %md
# MAGIC ## Sample captions: the most similar kept captions of each style
# MAGIC The factual caption, the retrieved style phrase grafted onto it, and the generated stylized caption.

# COMMAND ----------

# MAGIC %sql
# MAGIC SELECT style, retrieval_type, factual_caption, style_phrase, generated_caption,
# MAGIC        round(similarity, 3) AS similarity, round(perplexity, 1) AS perplexity, predicted_style
# MAGIC FROM (
# MAGIC   SELECT *, row_number() OVER (PARTITION BY style ORDER BY similarity DESC, query_id) AS rank_in_style
# MAGIC   FROM augmented_captions
# MAGIC   WHERE passed
# MAGIC )
# MAGIC WHERE rank_in_style <= 5
# MAGIC ORDER BY style, similarity DESC

# COMMAND ----------

# MAGIC %md
# MAGIC ## Similarity and perplexity, per style
# MAGIC Dashed lines: the filter thresholds of the `databricks` conf.

# COMMAND ----------

import matplotlib.pyplot as plt

scores = spark.sql("SELECT style, similarity, perplexity, passed FROM augmented_captions").toPandas()
filters = cfg.generate.filters
fig, (ax_sim, ax_ppl) = plt.subplots(1, 2, figsize=(13, 4))
for style, group in scores.groupby("style"):
    ax_sim.hist(group["similarity"], bins=40, alpha=0.5, label=style)
    ax_ppl.hist(group["perplexity"].dropna().clip(upper=4 * filters.ppl_max), bins=40, alpha=0.5, label=style)
ax_sim.axvline(filters.min_similarity, color="black", linestyle="--")
ax_ppl.axvline(filters.ppl_max, color="black", linestyle="--")
ax_sim.set(title="retrieval similarity", xlabel="cosine similarity", ylabel="captions")
ax_ppl.set(title=f"trigram perplexity (clipped at {4 * filters.ppl_max:g})", xlabel="perplexity")
ax_sim.legend()
fig.tight_layout()
display(fig)

# COMMAND ----------

# MAGIC %md
# MAGIC ## What the captioners train on
# MAGIC `training_set`: the original stylized pairs plus the kept augmented pairs (never of a val/test image).

# COMMAND ----------

# MAGIC %sql
# MAGIC SELECT style, origin, count(*) AS pairs
# MAGIC FROM training_set
# MAGIC WHERE split = 'train'
# MAGIC GROUP BY style, origin
# MAGIC ORDER BY style, origin

# COMMAND ----------

# MAGIC %md
# MAGIC ## Generator versions and runs
# MAGIC Each `generate` run writes its MLflow run id on its rows; `generator_version` is the run that trained the
# MAGIC generator (see `02_compare_runs` to put runs side by side).

# COMMAND ----------

# MAGIC %sql
# MAGIC SELECT generator_version, run_id, count(*) AS candidates, round(avg(CAST(passed AS DOUBLE)), 3) AS pass_rate,
# MAGIC        min(created_at) AS first_row, max(created_at) AS last_row
# MAGIC FROM augmented_captions
# MAGIC GROUP BY generator_version, run_id
# MAGIC ORDER BY first_row DESC
