"""Leakage metrics of the paper's protocol: nothing from a val/test scene or image reaches what ERG trains on.

:func:`leakage_counts` counts, as Spark aggregations over the tables (only the counts reach the driver; the first
alone over one run's rows: :func:`retrievals_leakage`):

- ``leakage.retrievals_non_train_scene``: ``retrievals`` rows whose target scene is not in the train split
  (val/test scenes are never retrieval targets);
- ``leakage.augmented_non_train_phrase``: ``augmented_captions`` rows whose phrase comes from such a scene;
- ``leakage.training_set_non_train_images``: rows of the ``training_set`` view in its train split (what ``erg
  train`` reads) that show a val/test image of the stylized set, or that carry a phrase of a non-train scene;
- ``leakage.factual_stylized_overlap``: ``factual_captions`` (P) rows whose image has stylized captions;
- ``leakage.queries_non_train_image``: queries (:func:`jobs.platform.tables.query_captions`: P, and with
  ``retrieve.train_descriptions_as_queries`` the train images' scene descriptions) that show a val/test image;
- ``leakage.augmented_non_train_image``: ``augmented_captions`` rows generated for a val/test image.

A scene or image counts as non-train when its split is anything but ``train`` (val, test, or missing). A table
that does not exist yet counts 0. Every count is 0 on a clean pipeline.
"""
from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.platform.config import ErgConfig
from jobs.platform.runner import JobContext
from jobs.platform.tables import query_captions, table_name

LEAKAGE_METRICS: tuple[str, ...] = (
    "leakage.retrievals_non_train_scene",
    "leakage.augmented_non_train_phrase",
    "leakage.training_set_non_train_images",
    "leakage.factual_stylized_overlap",
    "leakage.queries_non_train_image",
    "leakage.augmented_non_train_image",
)


def _table(spark: SparkSession, cfg: ErgConfig, table: str) -> DataFrame | None:
    name = table_name(cfg, table)
    return spark.table(name) if spark.catalog.tableExists(name) else None


def _non_train(stylized: DataFrame, column: str) -> DataFrame:
    """``column`` of the stylized rows outside the train split (val, test or no split)."""
    return stylized.where(F.coalesce(F.col("split"), F.lit("")) != "train").select(column)


def retrievals_leakage(spark: SparkSession, cfg: ErgConfig, run_id: str) -> dict[str, int]:
    """``leakage.retrievals_non_train_scene`` over the ``retrievals`` rows that run ``run_id`` wrote (inserted or
    re-ranked): what an incremental retrieve checks of its own output. Rows of earlier runs keep their count, since
    a scene keeps its split once ingested."""
    stylized, retrievals = _table(spark, cfg, "stylized_captions"), _table(spark, cfg, "retrievals")
    if stylized is None or retrievals is None:
        return {"leakage.retrievals_non_train_scene": 0}
    written = retrievals.where(F.col("run_id") == run_id)
    return {"leakage.retrievals_non_train_scene": int(
        written.join(_non_train(stylized, "scene_id"), "scene_id", "left_semi").count())}


def leakage_counts(spark: SparkSession, cfg: ErgConfig) -> dict[str, int]:
    """The leakage counts of the module docstring (0 where a table is missing or empty)."""
    counts = {name: 0 for name in LEAKAGE_METRICS}
    stylized = _table(spark, cfg, "stylized_captions")
    if stylized is None:
        return counts
    held_scenes = _non_train(stylized, "scene_id")
    held_images = _non_train(stylized, "image_id").distinct()

    retrievals = _table(spark, cfg, "retrievals")
    if retrievals is not None:
        counts["leakage.retrievals_non_train_scene"] = retrievals.join(held_scenes, "scene_id", "left_semi").count()
    augmented = _table(spark, cfg, "augmented_captions")
    if augmented is not None:
        counts["leakage.augmented_non_train_phrase"] = augmented.join(held_scenes, "scene_id", "left_semi").count()
        counts["leakage.augmented_non_train_image"] = augmented.join(held_images, "image_id", "left_semi").count()
    training = _table(spark, cfg, "training_set")
    if training is not None and augmented is not None:
        train_rows = training.where(F.col("split") == "train")
        by_image = train_rows.join(held_images, "image_id", "left_semi").select("pair_id", "origin")
        by_scene = (train_rows.join(held_scenes, "scene_id", "left_semi").select("pair_id", "origin")
                    if "scene_id" in training.columns else by_image.limit(0))
        counts["leakage.training_set_non_train_images"] = by_image.union(by_scene).distinct().count()
    factual = _table(spark, cfg, "factual_captions")
    if factual is not None:
        counts["leakage.factual_stylized_overlap"] = (
            factual.join(stylized.select("image_id").distinct(), "image_id", "left_semi").count())
        if not cfg.retrieve.train_descriptions_as_queries or _table(spark, cfg, "images") is not None:
            counts["leakage.queries_non_train_image"] = (
                query_captions(spark, cfg).join(held_images, "image_id", "left_semi").count())
    return {k: int(v) for k, v in counts.items()}


def count_leakage(ctx: JobContext, *, written_only: bool = False) -> None:
    """A step helper of the jobs: add the leakage counts to ``ctx.counts``, over every table
    (:func:`leakage_counts`), or (``written_only``) over the ``retrievals`` rows this run wrote
    (:func:`retrievals_leakage`)."""
    ctx.counts.update(retrievals_leakage(ctx.spark, ctx.cfg, ctx.run_id) if written_only
                      else leakage_counts(ctx.spark, ctx.cfg))
