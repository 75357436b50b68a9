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

from jobs import reports
from jobs.platform.config import ErgConfig
from jobs.platform.runner import JobContext, Step, run_job
from jobs.platform.spark import default_parallelism, spread_tasks
from jobs.platform.tables import merge_rows, query_captions, read_table
from jobs.vocabulary import encoder_spec
from udfs.embedding import (
    EMBEDDED_SCHEMA,
    INPUT_COLUMNS,
    ITEM_MODALITIES,
    embed_partitions,
    encoder_identity,
    has_image_input,
)

logger = logging.getLogger(__name__)

SKIP_EXAMPLES = 20
"""Skipped items (id and reason) written to the run's ``embed_skipped.json``."""
EMBED_TASK_MIN_ITEMS = 256
"""The fewest items an embed task gets when ``embed.partitions`` is unset (:func:`embed_tasks`)."""


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


def planned_counts(planned: list) -> dict[str, float]:
    """The plan's counts per item kind from rows of (item_kind, has_input, done, count): ``items``,
    ``already_embedded``, ``to_embed``, ``skipped.<kind>.no_input`` (every kind present, 0 where none); ``encoded``
    (items to run the model on) and ``embeddings.inserted`` (0 until the merge)."""
    counts: dict[str, float] = {}
    for kind in ITEM_MODALITIES:
        for key in ("items", "already_embedded", "to_embed", "embedded"):
            counts[f"{key}.{kind}"] = 0
        counts[f"skipped.{kind}.no_input"] = counts[f"skipped.{kind}.failed"] = 0
    for row in planned:
        counts[f"items.{row.item_kind}"] += row["count"]
        if row.done:
            counts[f"already_embedded.{row.item_kind}"] += row["count"]
        elif row.has_input:
            counts[f"to_embed.{row.item_kind}"] += row["count"]
        else:
            counts[f"skipped.{row.item_kind}.no_input"] += row["count"]
    counts["embeddings.inserted"] = 0
    counts["encoded"] = sum(counts[f"to_embed.{kind}"] for kind in ITEM_MODALITIES)
    return counts


def plan_step(ctx: JobContext) -> DataFrame:
    """Every item flagged ``done`` where the encoder's version has its vector; counted per kind."""
    spec, identity = ctx["spec"], ctx["identity"]
    existing = (
        read_table(ctx.spark, ctx.cfg, "embeddings")
        .where(F.col("encoder_version") == identity.version)
        .select("item_id", "modality", F.lit(True).alias("embedded"))
    )
    flagged = embed_items(ctx.spark, ctx.cfg, spec.kind).join(existing, ["item_id", "modality"], "left")
    planned = flagged.groupBy("item_kind", "has_input", F.col("embedded").isNotNull().alias("done")).count().collect()
    ctx.counts.update(planned_counts(planned))
    if ctx.counts["skipped.image.no_input"]:
        logger.warning("%d images have no %s (or no images row): the %s encoder embeds an image from it; "
                       "they are not embedded", ctx.counts["skipped.image.no_input"], spec.image_input, spec.kind)
    return flagged


def encode_step(ctx: JobContext) -> DataFrame:
    """The items to embed through the encoder UDF (persisted until the job ends); counted per kind and outcome."""
    todo = ctx["plan"].where(F.col("has_input") & F.col("embedded").isNull()).select(*INPUT_COLUMNS)
    # AQE coalesces the anti-join's output by bytes: a million short captions were one task, one core
    todo = todo.repartition(embed_tasks(ctx.cfg, default_parallelism(ctx.spark), int(ctx.counts["encoded"])))
    out = todo.mapInPandas(embed_partitions(ctx["spec"]), EMBEDDED_SCHEMA).persist(StorageLevel.MEMORY_AND_DISK)
    ctx.on_exit(out.unpersist)
    failed = F.col("skip_reason").isNotNull()
    for row in out.groupBy("item_kind", failed.alias("failed")).count().collect():
        ctx.counts[f"skipped.{row.item_kind}.failed" if row.failed else f"embedded.{row.item_kind}"] = row["count"]
    if any(ctx.counts[f"skipped.{kind}.failed"] for kind in ITEM_MODALITIES):
        ctx.summary["failed_examples"] = [r.asDict() for r in out.where(failed).select(
            "item_id", "item_kind", "skip_reason").limit(SKIP_EXAMPLES).collect()]
    return out


def merge_step(ctx: JobContext) -> None:
    """The vectors (not the failed items) MERGEd into ``embeddings``, stamped with the encoder and the run id."""
    identity = ctx["identity"]
    vectors = ctx["encode"].where(F.col("skip_reason").isNull()).select(
        "item_id", "item_kind", "modality", "vector", F.lit(identity.name).alias("encoder"),
        F.lit(identity.version).alias("encoder_version"), F.lit(ctx.run_id).alias("run_id"),
        F.current_timestamp().alias("created_at"),
    )
    ctx.counts["embeddings.inserted"] = merge_rows(ctx.spark, ctx.cfg, "embeddings", vectors)["inserted"]


def report_step(ctx: JobContext) -> None:
    reports.log_embed_skipped(ctx["spec"].image_input, ctx.counts["skipped.image.no_input"],
                              ctx.summary.get("failed_examples", []))


def _has_items_to_encode(ctx: JobContext) -> bool:
    return bool(ctx.counts["encoded"])


EMBED_STEPS = (Step("plan", plan_step, timed=True),
               Step("encode", encode_step, timed=True, when=_has_items_to_encode),
               Step("merge", merge_step, timed=True, when=_has_items_to_encode),
               Step("report", report_step))


def embed_result(ctx: JobContext) -> dict:
    identity = ctx["identity"]
    return {**ctx.counts, "encoder_version": identity.version, "dim": identity.dim, "run_id": ctx.run_id}


def embed(spark: SparkSession, cfg: ErgConfig) -> dict:
    """Embed every item not yet embedded by ``cfg.embed.encoder``'s version; returns the counts it logged.

    Counts per item kind: ``items.<kind>``, ``already_embedded.<kind>``, ``to_embed.<kind>``, ``embedded.<kind>``
    (rows inserted), ``skipped.<kind>.no_input`` and ``skipped.<kind>.failed``; ``encoded`` is the number of items
    the UDF ran the model on (0 on a rerun with nothing new); ``seconds.plan`` / ``.encode`` / ``.merge`` (the
    steps' times). Also ``encoder_version``, ``dim`` and ``run_id``.
    """
    spec = encoder_spec(cfg)
    identity = encoder_identity(spec)
    params = {"encoder_version": identity.version, "encoder_name": identity.name, "dim": identity.dim}
    return run_job(spark, cfg, "embed", EMBED_STEPS, sections=("embed",), params=params,
                   inputs={"spec": spec, "identity": identity}, result=embed_result)
