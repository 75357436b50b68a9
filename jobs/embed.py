"""``erg embed``: stylized scenes, factual captions and their images -> ``embeddings`` (ERG step 2, Retrieve).

Items (see :mod:`udfs.embedding`): each stylized caption (``scene``, text), each factual caption (``factual``,
text) and every image either set uses (``image``, image; embedded from what the encoder kind needs: tags, pixels
or region features). Only items with no vector under the encoder's exact version are embedded (a left-anti join
on item id, modality and version), so a rerun with nothing new does no model work. Images that lack the
encoder's input are not embedded: they are counted (``skipped.image.no_input``) and logged; so are items the
encoder rejects on the executor (an unreadable image file: ``skipped.<kind>.failed``), which a later run retries.
The vectors are MERGEd into ``embeddings`` on its key, stamped with the MLflow run id.
"""
from __future__ import annotations

import logging

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.config import ErgConfig
from jobs.spark import default_parallelism, spread_tasks
from jobs.tables import merge_rows, query_captions, read_table
from jobs.tracking import job_run, log_counts, step_seconds
from udfs.embedding import (
    EMBEDDED_SCHEMA,
    INPUT_COLUMNS,
    ITEM_MODALITIES,
    EncoderSpec,
    embed_partitions,
    encoder_identity,
    has_image_input,
)

logger = logging.getLogger(__name__)

SKIP_EXAMPLES = 20
"""Skipped items (id and reason) written to the run's ``embed_skipped.json``."""
EMBED_TASK_MIN_ITEMS = 256
"""The fewest items an embed task gets when ``embed.partitions`` is unset (:func:`embed_tasks`)."""


def encoder_spec(cfg: ErgConfig) -> EncoderSpec:
    """The scene encoder of ``cfg.embed.encoder`` (also what ``erg retrieve`` reads the vectors of)."""
    conf = cfg.embed.encoder
    return EncoderSpec.of(conf.kind, conf.name_or_path, conf.device, conf.batch_size, conf.options)


def embed_items(spark: SparkSession, cfg: ErgConfig, kind: str) -> DataFrame:
    """Every item to embed, in :data:`udfs.embedding.INPUT_COLUMNS` plus ``has_input``.

    ``has_input`` is false for an image that lacks what a ``kind`` encoder needs (or has no ``images`` row).
    """
    stylized = read_table(spark, cfg, "stylized_captions")
    factual = query_captions(spark, cfg)
    none_text, none_bytes = F.lit(None).cast("string"), F.lit(None).cast("binary")

    def captions(frame: DataFrame, id_column: str, item_kind: str) -> DataFrame:
        return frame.select(
            F.col(id_column).alias("item_id"), F.lit(item_kind).alias("item_kind"),
            F.lit(ITEM_MODALITIES[item_kind]).alias("modality"), F.col("caption").alias("text"),
            none_text.alias("tags"), none_text.alias("uri"), none_bytes.alias("region_features"),
            F.lit(True).alias("has_input"),
        )

    used = stylized.select("image_id").union(factual.select("image_id")).distinct()
    images = used.join(read_table(spark, cfg, "images"), "image_id", "left").select(
        F.col("image_id").alias("item_id"), F.lit("image").alias("item_kind"),
        F.lit(ITEM_MODALITIES["image"]).alias("modality"), none_text.alias("text"), "tags", "uri", "region_features",
        F.coalesce(has_image_input(kind), F.lit(False)).alias("has_input"),
    )
    return captions(stylized, "scene_id", "scene").unionByName(captions(factual, "caption_id", "factual")).unionByName(images)


def embed_tasks(cfg: ErgConfig, slots: int, items: int) -> int:
    """Tasks the items to embed are spread over: ``embed.partitions``, else two per task slot, at most one per
    ``EMBED_TASK_MIN_ITEMS`` items (a task loads the encoder once per Python worker, so tiny tasks cost more)."""
    if cfg.embed.partitions:
        return cfg.embed.partitions
    return spread_tasks(slots, items, EMBED_TASK_MIN_ITEMS, per_slot=2)


def embed(spark: SparkSession, cfg: ErgConfig) -> dict:
    """Embed every item not yet embedded by ``cfg.embed.encoder``'s version; returns the counts it logged.

    Counts per item kind: ``items.<kind>``, ``already_embedded.<kind>``, ``to_embed.<kind>``, ``embedded.<kind>``
    (rows inserted), ``skipped.<kind>.no_input`` and ``skipped.<kind>.failed``; ``encoded`` is the number of items
    the UDF ran the model on (0 on a rerun with nothing new); ``seconds.plan`` / ``.encode`` / ``.merge``
    (:func:`jobs.tracking.step_seconds`). Also ``encoder_version``, ``dim`` and ``run_id``.
    """
    import mlflow

    spec = encoder_spec(cfg)
    identity = encoder_identity(spec)
    params = {"encoder_version": identity.version, "encoder_name": identity.name, "dim": identity.dim}
    with job_run(cfg, "embed", sections=("embed",), params=params) as run:
        existing = (
            read_table(spark, cfg, "embeddings")
            .where(F.col("encoder_version") == identity.version)
            .select("item_id", "modality", F.lit(True).alias("embedded"))
        )
        flagged = embed_items(spark, cfg, spec.kind).join(existing, ["item_id", "modality"], "left")
        done = F.col("embedded").isNotNull()
        counts: dict[str, float] = {}
        for kind in ITEM_MODALITIES:
            for key in ("items", "already_embedded", "to_embed", "embedded"):
                counts[f"{key}.{kind}"] = 0
            counts[f"skipped.{kind}.no_input"] = counts[f"skipped.{kind}.failed"] = 0
        with step_seconds(counts, "plan"):
            planned = flagged.groupBy("item_kind", "has_input", done.alias("done")).count().collect()
        for row in planned:
            counts[f"items.{row.item_kind}"] += row["count"]
            if row.done:
                counts[f"already_embedded.{row.item_kind}"] += row["count"]
            elif row.has_input:
                counts[f"to_embed.{row.item_kind}"] += row["count"]
            else:
                counts[f"skipped.{row.item_kind}.no_input"] += row["count"]
        if counts["skipped.image.no_input"]:
            logger.warning("%d images have no %s (or no images row): the %s encoder embeds an image from it; "
                           "they are not embedded", counts["skipped.image.no_input"], spec.image_input, spec.kind)
        counts["embeddings.inserted"] = 0
        counts["encoded"] = sum(counts[f"to_embed.{kind}"] for kind in ITEM_MODALITIES)
        skipped_examples: list[dict] = []
        if counts["encoded"]:
            todo = flagged.where(F.col("has_input") & ~done).select(*INPUT_COLUMNS)
            # AQE coalesces the anti-join's output by bytes: a million short captions were one task, one core
            todo = todo.repartition(embed_tasks(cfg, default_parallelism(spark), int(counts["encoded"])))
            out = todo.mapInPandas(embed_partitions(spec), EMBEDDED_SCHEMA).persist(StorageLevel.MEMORY_AND_DISK)
            try:
                failed = F.col("skip_reason").isNotNull()
                with step_seconds(counts, "encode"):
                    encoded = out.groupBy("item_kind", failed.alias("failed")).count().collect()
                for row in encoded:
                    counts[f"skipped.{row.item_kind}.failed" if row.failed else f"embedded.{row.item_kind}"] = row["count"]
                if any(counts[f"skipped.{kind}.failed"] for kind in ITEM_MODALITIES):
                    skipped_examples = [r.asDict() for r in out.where(failed)
                                        .select("item_id", "item_kind", "skip_reason").limit(SKIP_EXAMPLES).collect()]
                vectors = out.where(~failed).select(
                    "item_id", "item_kind", "modality", "vector", F.lit(identity.name).alias("encoder"),
                    F.lit(identity.version).alias("encoder_version"), F.lit(run.info.run_id).alias("run_id"),
                    F.current_timestamp().alias("created_at"),
                )
                with step_seconds(counts, "merge"):
                    counts["embeddings.inserted"] = merge_rows(spark, cfg, "embeddings", vectors)["inserted"]
            finally:
                out.unpersist()
        log_counts(counts)
        mlflow.log_dict({"image_input": spec.image_input, "no_input": counts["skipped.image.no_input"],
                         "failed_examples": skipped_examples}, "embed_skipped.json")
        return {**counts, "encoder_version": identity.version, "dim": identity.dim, "run_id": run.info.run_id}
