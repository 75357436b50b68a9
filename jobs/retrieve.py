"""``erg retrieve``: factual captions and images -> similar stylized scenes, into ``retrievals`` (ERG step 2).

On the driver: the vectors of the stylized scenes of the train split (val/test scenes are never retrieval targets;
how many were left out is logged as ``scenes.non_train_excluded``) under the encoder's version (from ``embeddings``,
written by ``erg embed``) are collected into two Faiss indexes (:mod:`models.scene_index`): a ``text`` index of the
stylized captions and an ``image`` index of each scene's image, both under scene ids (only those the configured types
search). The index type comes from ``retrieve.index`` (``auto``: exact flat inner product up to ``exact_max_items``
scenes, IVF beyond). Both are serialized and broadcast once (on Spark Connect, which has no broadcast variables,
written once as a file under ``retrieve.index_dir`` instead: ``retrieve.index_transport``); the factual queries (each
factual caption with its caption vector and its image's vector) are partitioned by image and searched in
``mapInPandas`` (:func:`udfs.retrieval.retrieval_partitions`) for every type of ``retrieve.types`` (i2i, i2t, t2i,
t2t), keeping the ``top_k`` hits with similarity > ``min_similarity`` and, with ``exclude_same_image``, none that
shows the query's own image. The hits are MERGEd into ``retrievals`` on its key (a rerun adds nothing).

Logged to MLflow: the leakage counts of :func:`jobs.leakage.leakage_counts` (all 0 on a clean pipeline); the
index type, size and build time per modality; ``index.faiss_gpu_fallback`` (1 when ``retrieve.index.use_gpu`` asked
for a GPU search that Faiss cannot do here, so the indexes search on CPU; with ``retrieve.index.gpu_fallback:
error`` the job fails instead, before any search); per type the queries, queries with >= 1 hit,
hits (also per style) and mean similarity as metrics and as ``table5_counts.json``/``.md`` (the paper's Table 5
view); and ``retrieval_examples.json``/``.md``: factual caption -> retrieved stylized captions (the Fig. 3 view).
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import pandas as pd
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.config import ErgConfig, IndexConf
from jobs.embed import encoder_spec
from jobs.errors import UserError
from jobs.leakage import leakage_counts
from jobs.spark import has_spark_context
from jobs.tables import merge_rows, read_table
from jobs.tracking import job_run, log_counts
from models.scene_index import SceneIndex, build_scene_index, faiss_gpu_fallback_reason, retrieval_modalities
from udfs.embedding import encoder_identity
from udfs.retrieval import (
    HIT_SCHEMA,
    QUERY_COLUMNS,
    RetrievalPlan,
    ScenePayload,
    choose_index_type,
    examples_markdown,
    exclusion_margin,
    markdown_table,
    query_modalities,
    retrieval_examples,
    retrieval_partitions,
    stack_vectors,
    table5,
    table5_metrics,
    target_modalities,
)

logger = logging.getLogger(__name__)


def scene_vectors(stylized: DataFrame, vectors: DataFrame, modalities: list[str]) -> DataFrame:
    """Every scene (scene_id, image_id) with ``<modality>_vector`` for each of ``modalities`` (null when absent):
    its caption's vector (``text``), its image's vector (``image``)."""
    scenes = stylized.select("scene_id", "image_id")
    if "text" in modalities:
        captions = vectors.where((F.col("item_kind") == "scene") & (F.col("modality") == "text"))
        scenes = scenes.join(captions.select(F.col("item_id").alias("scene_id"), F.col("vector").alias("text_vector")),
                             "scene_id", "left")
    if "image" in modalities:
        images = vectors.where((F.col("item_kind") == "image") & (F.col("modality") == "image"))
        scenes = scenes.join(images.select(F.col("item_id").alias("image_id"), F.col("vector").alias("image_vector")),
                             "image_id", "left")
    return scenes


def build_index(scene_ids: list[str], vectors: pd.Series, conf: IndexConf) -> SceneIndex:
    """The scene index of one modality from collected scene ids and vectors, with the type ``conf`` asks for."""
    index_type = choose_index_type(conf.type, len(scene_ids), conf.exact_max_items)
    return build_scene_index(
        stack_vectors(vectors, "scene vectors"), scene_ids, index_type,
        nlist=conf.nlist, nprobe=conf.nprobe, hnsw_m=conf.hnsw_m, ef_search=conf.ef_search,
    )


def faiss_gpu_fallbacks(index_types: dict[str, str], conf: IndexConf) -> dict[str, str]:
    """Modality -> why its index will search on CPU although ``conf.use_gpu`` asks for a GPU (empty when it does
    not, or every index goes to a GPU); a :class:`jobs.errors.UserError` instead with ``gpu_fallback: error``.

    Checked on the driver, whose Faiss the GPU job cluster's executors share (one node type, one library set); an
    executor that still cannot search on a GPU falls back (with a WARNING in its log) or fails the same way.
    """
    if not conf.use_gpu:
        return {}
    reasons = {modality: faiss_gpu_fallback_reason(index_type) for modality, index_type in index_types.items()}
    fallbacks = {modality: reason for modality, reason in reasons.items() if reason is not None}
    if fallbacks and conf.gpu_fallback == "error":
        modality, reason = next(iter(fallbacks.items()))
        raise UserError(f"retrieve.index.use_gpu is true, but the {index_types[modality]} {modality} scene index "
                        f"cannot search on a GPU: {reason}",
                        "install faiss-gpu there, or set retrieve.index.use_gpu=false, or "
                        "retrieve.index.gpu_fallback=cpu to search on CPU (counted as index.faiss_gpu_fallback)")
    for modality, reason in fallbacks.items():
        logger.warning("retrieve.index.use_gpu is true, but the %s scene index searches on CPU "
                       "(metric index.faiss_gpu_fallback = 1): %s", modality, reason)
    return fallbacks


def index_transport(spark: SparkSession, conf) -> str:
    """``broadcast`` or ``file``: how the scene indexes reach the executors (``retrieve.index_transport``; ``auto``
    broadcasts where the session has a SparkContext and writes a file on Spark Connect, which has none)."""
    if conf.index_transport == "broadcast" and not has_spark_context(spark):
        raise UserError("retrieve.index_transport is broadcast, but this session (Spark Connect) has no SparkContext "
                        "and so no broadcast variables",
                        "set retrieve.index_transport=file (or auto), with retrieve.index_dir on storage every "
                        "executor reads, e.g. a Volume")
    if conf.index_transport == "auto":
        return "broadcast" if has_spark_context(spark) else "file"
    return conf.index_transport


def factual_queries(
    spark: SparkSession, cfg: ErgConfig, vectors: DataFrame, modalities: list[str], query_filter: DataFrame | None
) -> DataFrame:
    """The factual captions as :data:`udfs.retrieval.QUERY_COLUMNS` rows, with at least one needed vector.

    ``query_filter``: a DataFrame with a ``caption_id`` column restricting the queries (default: all).
    """
    queries = read_table(spark, cfg, "factual_captions").select(
        F.col("caption_id").alias("query_id"), F.col("image_id").alias("query_image_id")
    )
    if query_filter is not None:
        if "caption_id" not in query_filter.columns:
            raise ValueError(f"query_filter must have a caption_id column (factual caption ids), "
                             f"got columns {query_filter.columns}")
        queries = queries.join(query_filter.select(F.col("caption_id").alias("query_id")).distinct(), "query_id",
                               "left_semi")
    if "text" in modalities:
        text = vectors.where((F.col("item_kind") == "factual") & (F.col("modality") == "text"))
        queries = queries.join(text.select(F.col("item_id").alias("query_id"), F.col("vector").alias("text_vector")),
                               "query_id", "left")
    else:
        queries = queries.withColumn("text_vector", F.lit(None).cast("array<float>"))
    if "image" in modalities:
        image = vectors.where((F.col("item_kind") == "image") & (F.col("modality") == "image"))
        queries = queries.join(
            image.select(F.col("item_id").alias("query_image_id"), F.col("vector").alias("image_vector")),
            "query_image_id", "left",
        )
    else:
        queries = queries.withColumn("image_vector", F.lit(None).cast("array<float>"))
    return queries.where(F.col("text_vector").isNotNull() | F.col("image_vector").isNotNull()).select(*QUERY_COLUMNS)


def _table5_inputs(hits: DataFrame, stylized: DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per type (hits, queries with a hit, mean similarity) and per type x style (hits), in one Spark job."""
    rolled = (
        hits.join(F.broadcast(stylized.select("scene_id", "style")), "scene_id")
        .rollup("retrieval_type", "style")
        .agg(F.count(F.lit(1)).alias("hits"), F.countDistinct("query_id").alias("queries_with_hit"),
             F.avg("similarity").alias("mean_similarity"))
        .where(F.col("retrieval_type").isNotNull())
        .toPandas()
    )
    per_type = rolled[rolled["style"].isna()].drop(columns="style")
    return per_type, rolled[rolled["style"].notna()]


def _examples(hits: DataFrame, spark: SparkSession, cfg: ErgConfig, count: int) -> list[dict]:
    """Up to ``count`` factual queries (a stable pseudo-random choice) with all their hits and captions."""
    chosen = hits.select("query_id").distinct().orderBy(F.xxhash64("query_id"), "query_id").limit(count)
    factual = read_table(spark, cfg, "factual_captions").select(
        F.col("caption_id").alias("query_id"), F.col("caption").alias("factual_caption")
    )
    stylized = read_table(spark, cfg, "stylized_captions").select(
        "scene_id", "style", F.col("caption").alias("stylized_caption")
    )
    rows = (
        hits.join(chosen, "query_id", "left_semi").join(factual, "query_id").join(stylized, "scene_id")
        .orderBy(F.xxhash64("query_id"), "query_id", "retrieval_type", "rank")
        .toPandas()
    )
    return retrieval_examples(rows)


def retrieve(spark: SparkSession, cfg: ErgConfig, query_filter: DataFrame | None = None) -> dict:
    """Search the factual queries against the stylized scenes for every configured type; returns the logged counts.

    ``query_filter`` (a DataFrame with ``caption_id``) limits the factual captions searched; by default all are.
    Counts: ``queries``, ``queries.<modality>`` (with a vector of it), ``scenes`` (train split),
    ``scenes.non_train_excluded``, ``leakage.*`` (:func:`jobs.leakage.leakage_counts`), ``index.<modality>.size``,
    per type ``<type>.queries``, ``<type>.queries_with_hit``, ``<type>.hits``, ``<type>.hits.<style>``,
    ``<type>.mean_similarity``; ``retrievals.inserted``; ``index.faiss_gpu_fallback`` (:func:`faiss_gpu_fallbacks`);
    ``encoder_version``, ``index_types`` and ``run_id``.
    """
    import mlflow

    conf = cfg.retrieve
    identity = encoder_identity(encoder_spec(cfg))
    with job_run(cfg, "retrieve", sections=("retrieve",),
                 params={"encoder_version": identity.version, "embed.encoder.kind": cfg.embed.encoder.kind}) as run:
        vectors = read_table(spark, cfg, "embeddings").where(F.col("encoder_version") == identity.version)
        all_scenes = read_table(spark, cfg, "stylized_captions")
        stylized = all_scenes.where(F.col("split") == "train").select("scene_id", "image_id", "style")
        targets = target_modalities(conf.types)
        scenes = scene_vectors(stylized, vectors, targets).toPandas()
        scene_image_map = dict(zip(scenes["scene_id"], scenes["image_id"]))
        counts: dict[str, float] = {"scenes": len(scenes),
                                    "scenes.non_train_excluded": all_scenes.count() - len(scenes)}
        indexes: dict[str, SceneIndex] = {}
        for modality in targets:
            present = scenes[scenes[f"{modality}_vector"].notna()]
            if present.empty:
                raise ValueError(
                    f"no {modality} vectors of the stylized scenes under encoder version {identity.version}: "
                    f"run `erg embed` first with the same embed.encoder"
                )
            started = time.perf_counter()
            indexes[modality] = build_index(present["scene_id"].tolist(), present[f"{modality}_vector"], conf.index)
            counts[f"index.{modality}.build_seconds"] = time.perf_counter() - started
            counts[f"index.{modality}.size"] = len(indexes[modality])
            counts[f"scenes_without_vector.{modality}"] = len(scenes) - len(present)
        index_types = {m: index.index_type for m, index in indexes.items()}
        mlflow.log_params({f"index.{m}.type": t for m, t in index_types.items()})
        counts["index.faiss_gpu_fallback"] = float(bool(faiss_gpu_fallbacks(index_types, conf.index)))
        payload = ScenePayload.of(indexes, scene_image_map)
        counts["index.broadcast_bytes"] = payload.size_bytes
        plan = RetrievalPlan(tuple(conf.types), conf.top_k, conf.min_similarity, conf.exclude_same_image,
                             exclusion_margin(scene_image_map), conf.index.use_gpu, conf.index.gpu_fallback)
        transport = index_transport(spark, conf)
        counts["index.transport_file"] = float(transport == "file")
        if transport == "broadcast":
            shipped = spark.sparkContext.broadcast(payload)
        else:
            shipped = payload.save(Path(conf.index_dir or Path(cfg.home) / "scene_indexes") / f"{run.info.run_id}.pkl")

        modalities = query_modalities(conf.types)
        queries = factual_queries(spark, cfg, vectors, modalities, query_filter)
        have = queries.agg(F.count(F.lit(1)).alias("queries"), F.count("text_vector").alias("text"),
                           F.count("image_vector").alias("image")).collect()[0]
        counts["queries"] = have["queries"]
        counts.update({f"queries.{m}": have[m] for m in modalities})
        queries_per_type = {t: have[retrieval_modalities(t).query] for t in conf.types}

        partitioned = (queries.repartition(conf.partitions, "query_image_id") if conf.partitions
                       else queries.repartition("query_image_id"))
        hits = (partitioned.sortWithinPartitions("query_image_id")
                .mapInPandas(retrieval_partitions(shipped, plan), HIT_SCHEMA)
                .persist(StorageLevel.MEMORY_AND_DISK))
        try:
            per_type, per_type_style = _table5_inputs(hits, stylized)
            table = table5(per_type, per_type_style, queries_per_type, cfg.styles, conf.types)
            rows = hits.select(
                "query_id", "query_image_id", "scene_id", "retrieval_type", "rank", "similarity",
                F.lit(identity.version).alias("encoder_version"), F.lit(run.info.run_id).alias("run_id"),
                F.current_timestamp().alias("created_at"),
            )
            counts["retrievals.inserted"] = merge_rows(spark, cfg, "retrievals", rows)["inserted"]
            examples = _examples(hits, spark, cfg, conf.examples_to_log) if conf.examples_to_log else []
        finally:
            hits.unpersist()
            if transport == "broadcast":
                shipped.destroy()
            else:
                Path(shipped.path).unlink(missing_ok=True)
        counts.update(table5_metrics(table))
        counts.update(leakage_counts(spark, cfg))
        log_counts(counts)
        mlflow.log_dict({"encoder_version": identity.version, "index_types": index_types,
                         "rows": table.replace({np.nan: None}).to_dict("records")}, "table5_counts.json")
        mlflow.log_text(markdown_table(table), "table5_counts.md")
        mlflow.log_dict({"examples": examples}, "retrieval_examples.json")
        mlflow.log_text(examples_markdown(examples), "retrieval_examples.md")
        logger.info("retrieval counts per type:\n%s", markdown_table(table))
        return {**counts, "encoder_version": identity.version, "index_types": index_types, "run_id": run.info.run_id}
