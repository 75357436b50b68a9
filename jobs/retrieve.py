"""``erg retrieve``: factual captions and images -> similar stylized scenes, into ``retrievals`` (ERG step 2).

On the driver: the vectors of the stylized scenes of the train split (val/test scenes are never retrieval targets;
how many were left out is logged as ``scenes.non_train_excluded``) under the encoder's version (from ``embeddings``,
written by ``erg embed``) are collected into two Faiss indexes (:mod:`models.scene_index`): a ``text`` index of the
stylized captions and an ``image`` index of each scene's image, both under scene ids (only those the configured types
search). The index type comes from ``retrieve.index`` (``auto``: exact flat inner product up to ``exact_max_items``
scenes; beyond, :func:`models.scene_index.tune_scene_index` measures HNSW and IVF (IVF alone where ``use_gpu``) on
``tune_queries`` factual queries (:func:`tuning_sample`) and keeps the setting that meets ``target_recall`` against
exact search, or exact search). Both are serialized and broadcast once (on Spark Connect, which has no
broadcast variables, written once as a file under ``retrieve.index_dir`` instead: ``retrieve.index_transport``); the
factual queries (each factual caption with its caption vector and its image's vector) are partitioned by image and
searched in ``mapInPandas`` (:func:`udfs.retrieval.retrieval_partitions`) for every type of ``retrieve.types`` (i2i,
i2t, t2i, t2t), keeping the ``top_k`` hits with similarity > ``min_similarity`` and, with ``exclude_same_image``,
none that shows the query's own image. The hits replace the searched queries' rows of ``retrievals`` in one MERGE on
its key (new hits inserted, moved ones re-ranked, those no longer hits deleted: a rerun changes nothing; queries that
hold no row yet are appended instead). Incremental
(``erg retrieve --incremental``, ``erg run --incremental``): only what ``embeddings`` gained since the last retrieval
is searched; new factual queries against the full index, every other query against an index of the new scenes alone,
whose hits are merged into the kept top-k (:func:`merged_top_k`).

Logged to MLflow: the leakage counts of :func:`jobs.leakage.leakage_counts` (all 0 on a clean pipeline; an
incremental run counts ``leakage.retrievals_non_train_scene`` over the rows it wrote, :func:`retrievals_leakage`); the
index type, size and build time per modality; with ``auto`` the params ``index.<modality>.kind_chosen``,
``.search_param`` (``ef_search=48``, ``nprobe=16``, ``none``) and ``.auto_reason``
(:data:`models.scene_index.AUTO_REASONS`), the metrics ``index.<modality>.auto_recall_at_10`` (on the sample;
1 for exact search), ``.auto_sample_queries`` and ``.auto_speedup_vs_exact``, ``index.auto_fallback`` (the indexes
that kept exact search because no setting met the target) and every measured setting in ``index_tuning.json``;
``index.faiss_gpu_fallback`` (1 when ``retrieve.index.use_gpu`` asked
for a GPU search that Faiss cannot do here, so the indexes search on CPU; with ``retrieve.index.gpu_fallback:
error`` the job fails instead, before any search); per type the queries, queries with >= 1 hit,
hits (also per style) and mean similarity as metrics and as ``table5_counts.json``/``.md`` (the paper's Table 5
view); and ``retrieval_examples.json``/``.md``: factual caption -> retrieved stylized captions (the Fig. 3 view).
"""
from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import Window
from pyspark.sql import functions as F

from jobs import reports
from jobs.leakage import count_leakage
from jobs.platform.config import ErgConfig, IndexConf
from jobs.platform.errors import UserError
from jobs.platform.runner import JobContext, Step, advance_watermark, run_job, watermark
from jobs.platform.spark import has_spark_context
from jobs.platform.tables import append_rows, apply_changes, query_captions, read_table, table_name
from jobs.platform.tracking import step_seconds
from jobs.platform.watermarks import table_version
from jobs.vocabulary import encoder_spec
from models.scene_index import (
    IndexTuning,
    SceneIndex,
    build_scene_index,
    faiss_gpu_fallback_reason,
    retrieval_modalities,
    tune_scene_index,
)
from udfs.embedding import encoder_identity
from udfs.retrieval import (
    HIT_COLUMNS,
    HIT_SCHEMA,
    QUERY_COLUMNS,
    RetrievalPlan,
    ScenePayload,
    exclusion_margin,
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


def build_index(scene_ids: list[str], vectors: pd.Series, conf: IndexConf,
                sample: Callable[[], np.ndarray] | None = None) -> tuple[SceneIndex, IndexTuning | None]:
    """The scene index of one modality from collected scene ids and vectors, with the type ``conf`` asks for; with
    ``auto`` also what :func:`models.scene_index.tune_scene_index` measured, drawing the query sample from
    ``sample`` (called only beyond ``exact_max_items`` scenes), else None."""
    array = stack_vectors(vectors, "scene vectors")
    if conf.type == "auto":
        if sample is None:
            raise ValueError("retrieve.index.type auto needs a sample of the factual queries to tune on")
        return tune_scene_index(
            array, scene_ids, sample, target_recall=conf.target_recall, exact_max_items=conf.exact_max_items,
            min_speedup=conf.min_speedup, nlist=conf.nlist, hnsw_m=conf.hnsw_m, ef_construction=conf.ef_construction,
            gpu_search=conf.use_gpu)
    return build_scene_index(
        array, scene_ids, conf.type,
        nlist=conf.nlist, nprobe=conf.nprobe, hnsw_m=conf.hnsw_m, ef_search=conf.ef_search,
        ef_construction=conf.ef_construction,
    ), None


def tuning_sample(spark: SparkSession, cfg: ErgConfig, vectors: DataFrame, modality: str) -> np.ndarray:
    """The query vectors ``auto`` tunes the ``modality`` index on: the first ``retrieve.index.tune_queries`` factual
    queries by a hash of their id (the same ones on a rerun), each with the vector of every query modality of the
    configured types that search that index (t2t: its caption's; i2t: its image's, once per image)."""
    types = [t for t in cfg.retrieve.types if retrieval_modalities(t).target == modality]
    modalities = query_modalities(types)
    picked = (factual_queries(spark, cfg, vectors, modalities, None)
              .orderBy(F.xxhash64("query_id"), "query_id").limit(cfg.retrieve.index.tune_queries).toPandas())
    parts = []
    for query_modality in modalities:
        rows = picked.drop_duplicates("query_image_id") if query_modality == "image" else picked
        present = rows[f"{query_modality}_vector"].dropna()
        if len(present):
            parts.append(stack_vectors(present, f"{query_modality} vectors of the tuning queries"))
    return np.concatenate(parts) if parts else np.empty((0, 0), dtype=np.float32)


def faiss_gpu_fallbacks(index_types: dict[str, str], conf: IndexConf) -> dict[str, str]:
    """Modality -> why its index will search on CPU although ``conf.use_gpu`` asks for a GPU (empty when it does
    not, or every index goes to a GPU); a :class:`jobs.platform.errors.UserError` instead with ``gpu_fallback: error``.

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

    ``query_filter``: a DataFrame with a ``caption_id`` column restricting the queries (default: all). It is a few
    ids (an incremental run's new captions), so the vectors are cut to its queries' before they are joined (a
    broadcast semi join): the join then moves those few, not every vector of the table.
    """
    queries = query_captions(spark, cfg).select(
        F.col("caption_id").alias("query_id"), F.col("image_id").alias("query_image_id")
    )
    text = vectors.where((F.col("item_kind") == "factual") & (F.col("modality") == "text"))
    image = vectors.where((F.col("item_kind") == "image") & (F.col("modality") == "image"))
    if query_filter is not None:
        if "caption_id" not in query_filter.columns:
            raise ValueError(f"query_filter must have a caption_id column (factual caption ids), "
                             f"got columns {query_filter.columns}")
        queries = queries.join(F.broadcast(query_filter.select(F.col("caption_id").alias("query_id")).distinct()),
                               "query_id", "left_semi")
        text = text.join(F.broadcast(queries.select(F.col("query_id").alias("item_id"))), "item_id", "left_semi")
        image = image.join(F.broadcast(queries.select(F.col("query_image_id").alias("item_id")).distinct()),
                           "item_id", "left_semi")
    if "text" in modalities:
        queries = queries.join(text.select(F.col("item_id").alias("query_id"), F.col("vector").alias("text_vector")),
                               "query_id", "left")
    else:
        queries = queries.withColumn("text_vector", F.lit(None).cast("array<float>"))
    if "image" in modalities:
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
    factual = query_captions(spark, cfg).select(
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


@contextmanager
def shipped_scene_indexes(spark: SparkSession, cfg: ErgConfig, payload: ScenePayload, name: str, transport: str):
    """The payload as the executors get it, by ``transport`` (:func:`index_transport`): a broadcast, or a file
    under ``retrieve.index_dir``; destroyed or removed when the block ends."""
    conf = cfg.retrieve
    if transport == "broadcast":
        shipped = spark.sparkContext.broadcast(payload)
        try:
            yield shipped
        finally:
            shipped.destroy()
    else:
        shipped = payload.save(Path(conf.index_dir or Path(cfg.home) / "scene_indexes") / f"{name}.pkl")
        try:
            yield shipped
        finally:
            Path(shipped.path).unlink(missing_ok=True)


def scene_indexes(scenes: pd.DataFrame, targets: list[str], conf: IndexConf, counts: dict, prefix: str = "index",
                  sample: Callable[[str], np.ndarray] | None = None,
                  tunings: dict[str, IndexTuning] | None = None) -> dict[str, SceneIndex]:
    """The index of each target modality over the scenes that have its vector (counted under ``prefix``).

    With ``retrieve.index.type: auto``, ``sample(modality)`` gives the query vectors to tune on
    (:func:`tuning_sample`); what was chosen is counted (``<prefix>.<modality>.auto_*``, ``<prefix>.auto_fallback``)
    and put into ``tunings`` (modality -> :class:`models.scene_index.IndexTuning`)."""
    indexes: dict[str, SceneIndex] = {}
    if conf.type == "auto":
        counts[f"{prefix}.auto_fallback"] = 0
    for modality in targets:
        present = scenes[scenes[f"{modality}_vector"].notna()]
        counts[f"{prefix}.{modality}.without_vector"] = len(scenes) - len(present)
        if present.empty:
            continue
        started = time.perf_counter()
        indexes[modality], tuning = build_index(
            present["scene_id"].tolist(), present[f"{modality}_vector"], conf,
            None if sample is None else (lambda m=modality: sample(m)))
        counts[f"{prefix}.{modality}.build_seconds"] = time.perf_counter() - started
        counts[f"{prefix}.{modality}.size"] = len(indexes[modality])
        if tuning is not None:
            counts[f"{prefix}.{modality}.auto_recall_at_10"] = tuning.recall_at_k
            counts[f"{prefix}.{modality}.auto_sample_queries"] = tuning.sample_queries
            if tuning.speedup_vs_exact is not None:
                counts[f"{prefix}.{modality}.auto_speedup_vs_exact"] = tuning.speedup_vs_exact
            counts[f"{prefix}.auto_fallback"] += int(tuning.fallback)
            if tunings is not None:
                tunings[modality] = tuning
    return indexes


def search_hits(spark: SparkSession, cfg: ErgConfig, queries: DataFrame, shipped, plan: RetrievalPlan) -> DataFrame:
    """The hits of ``queries`` against the shipped indexes (lazy; :data:`udfs.retrieval.HIT_SCHEMA`)."""
    conf = cfg.retrieve
    partitioned = (queries.repartition(conf.partitions, "query_image_id") if conf.partitions
                   else queries.repartition("query_image_id"))
    return (partitioned.sortWithinPartitions("query_image_id")
            .mapInPandas(retrieval_partitions(shipped, plan), HIT_SCHEMA))


def new_since(spark: SparkSession, cfg: ErgConfig, version: int, encoder_version: str) -> dict[str, DataFrame]:
    """What ``embeddings`` gained after ``version`` under the encoder (its Change Data Feed): the ids of new factual
    caption vectors (``factual``), scene caption vectors (``scene``) and image vectors (``image``)."""
    changes = (spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", version + 1)
               .table(table_name(cfg, "embeddings"))
               .where(F.col("_change_type").isin("insert", "update_postimage"))
               .where(F.col("encoder_version") == encoder_version))
    return {kind: changes.where(F.col("item_kind") == kind).select(F.col("item_id").alias("id")).distinct()
            for kind in ("factual", "scene", "image")}


def split_new(stylized: DataFrame, factual: DataFrame, new: dict[str, DataFrame]) -> tuple[DataFrame, DataFrame]:
    """(new train scenes, new factual queries): a scene or query is new when its caption's vector or its image's
    vector arrived since the watermark. Both have one column, ``scene_id`` / ``caption_id``."""
    scenes = (stylized.join(new["scene"].withColumnRenamed("id", "scene_id"), "scene_id", "left_semi").select("scene_id")
              .unionByName(stylized.join(new["image"].withColumnRenamed("id", "image_id"), "image_id", "left_semi")
                           .select("scene_id")).distinct())
    queries = (factual.join(new["factual"].withColumnRenamed("id", "caption_id"), "caption_id", "left_semi")
               .select("caption_id")
               .unionByName(factual.join(new["image"].withColumnRenamed("id", "image_id"), "image_id", "left_semi")
                            .select("caption_id")).distinct())
    return scenes, queries


#: at most this many (query, type) groups with new-scene hits are broadcast to pick their kept rows out of
#: ``retrievals`` (a scan, no shuffle of the table); more are joined by a shuffle
BROADCAST_GROUPS_MAX = 1_000_000


def _groups(found: DataFrame, broadcast: bool) -> DataFrame:
    groups = found.select("query_id", "retrieval_type", "encoder_version").distinct()
    return F.broadcast(groups) if broadcast else groups


def entering_hits(kept: DataFrame, found: DataFrame, top_k: int, broadcast: bool = False) -> DataFrame:
    """The rows of ``found`` (new scenes' hits for old queries) that can enter their (query, type) group's kept
    top-k: the group holds fewer than ``top_k`` rows, or the hit's similarity reaches the group's lowest kept one.
    A hit below that floor changes no row, so only these groups need :func:`merged_top_k` and a MERGE.
    ``broadcast``: the groups are few enough to broadcast (:data:`BROADCAST_GROUPS_MAX`)."""
    group = ["query_id", "retrieval_type", "encoder_version"]
    floors = (kept.join(_groups(found, broadcast), group, "left_semi")
              .groupBy(*group).agg(F.count(F.lit(1)).alias("_kept"), F.min("similarity").alias("_floor")))
    return (found.join(floors, group, "left")
            .where(F.col("_kept").isNull() | (F.col("_kept") < top_k) | (F.col("similarity") >= F.col("_floor")))
            .drop("_kept", "_floor"))


def merged_top_k(kept: DataFrame, found: DataFrame, top_k: int, broadcast: bool = False) -> DataFrame:
    """Rows to apply to ``retrievals`` where new scenes were found for old queries: for every (query, type) with a
    new hit, the top ``top_k`` of its kept hits and the new ones by similarity, ranks rewritten from 1
    (``_action`` = upsert), and its kept hits that fell out (``_action`` = delete). Columns of ``kept``.
    ``broadcast`` as in :func:`entering_hits`."""
    old = kept.join(_groups(found, broadcast), ["query_id", "retrieval_type", "encoder_version"], "left_semi")
    both = old.unionByName(found.select(*kept.columns)).dropDuplicates(
        ["query_id", "scene_id", "retrieval_type", "encoder_version"])
    order = Window.partitionBy("query_id", "retrieval_type", "encoder_version").orderBy(
        F.desc("similarity"), "scene_id")
    ranked = both.withColumn("rank", F.row_number().over(order).cast("int"))
    return ranked.withColumn("_action", F.when(F.col("rank") <= top_k, F.lit("upsert")).otherwise(F.lit("delete")))


def replace_hits(spark: SparkSession, cfg: ErgConfig, hits: DataFrame, searched: DataFrame,
                 encoder_version: str, few: bool = False) -> dict:
    """Make ``hits`` the rows of the queries in ``searched`` (``query_id``) for the configured types: new hits
    inserted, moved ones re-ranked, and their rows that are no longer hits deleted (a stale rank never stays);
    one MERGE, so a rerun changes nothing. Where no searched query holds a row yet (a first retrieval; with
    ``few``, searched queries held in memory, new captions) the hits are appended instead: the MERGE would join the
    whole table to find nothing. A rerun after a crash finds the appended rows and MERGEs."""
    stored = (read_table(spark, cfg, "retrievals").where(F.col("encoder_version") == encoder_version)
              .where(F.col("retrieval_type").isin(list(cfg.retrieve.types))))
    kept = stored.join(searched.select("query_id"), "query_id", "left_semi")
    if not stored.limit(1).count() or (few and not kept.limit(1).count()):
        return append_rows(spark, cfg, "retrievals", hits)
    key = ["query_id", "scene_id", "retrieval_type", "encoder_version"]
    gone = kept.join(hits.select(*key), key, "left_anti").withColumn("_action", F.lit("delete"))
    changes = hits.withColumn("_action", F.lit("upsert")).unionByName(gone.select(*hits.columns, "_action"))
    return apply_changes(spark, cfg, "retrievals", changes, compare=("rank", "similarity"))


def merge_new_scenes(spark: SparkSession, cfg: ErgConfig, scenes: pd.DataFrame, new_scene_ids: list[str],
                     new_queries: DataFrame, vectors: DataFrame, plan: RetrievalPlan,
                     encoder_version: str, run_id: str, as_rows, transport: str,
                     sample: Callable[[str], np.ndarray] | None = None) -> dict[str, float]:
    """Search every old query (not in ``new_queries``, which met the full index) against an index of the new
    scenes alone (:func:`old_query_hits`) and merge the hits into the kept top-k (:func:`merged_top_k`, one
    MERGE)."""
    counts: dict[str, float] = {}
    new = scenes[scenes["scene_id"].isin(set(new_scene_ids))]
    indexes = scene_indexes(new, target_modalities(plan.types), cfg.retrieve.index, counts, prefix="index.new_scenes",
                            sample=sample)
    types = tuple(t for t in plan.types if retrieval_modalities(t).target in indexes)
    if not types:
        return counts
    small_plan = replace(plan, types=types)
    payload = ScenePayload.of(indexes, dict(zip(scenes["scene_id"], scenes["image_id"])))
    new_scene_images = spark.createDataFrame(new[["scene_id", "image_id"]].rename(columns={"image_id": "_scene_image"}))
    kept = read_table(spark, cfg, "retrievals").where(F.col("encoder_version") == encoder_version)
    with shipped_scene_indexes(spark, cfg, payload, f"{run_id}-new-scenes", transport) as shipped:
        hits = old_query_hits(spark, cfg, vectors, new_queries, shipped, small_plan, new_scene_images)
        found = as_rows(hits).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            with step_seconds(counts, "new_scenes.search"):
                counts["incremental.new_scene_hits"] = found.count()
            with step_seconds(counts, "new_scenes.merge"):
                # computed once: merged_top_k reads it twice (its groups and its rows)
                few = counts["incremental.new_scene_hits"] <= BROADCAST_GROUPS_MAX
                entering = entering_hits(kept, found, plan.top_k, broadcast=few).localCheckpoint(eager=True)
                counts["incremental.new_scene_hits_entering"] = entering.count()
                changes = merged_top_k(kept, entering, plan.top_k, broadcast=few)
                stats = apply_changes(spark, cfg, "retrievals", changes, compare=("rank", "similarity"))
        finally:
            found.unpersist()
    counts.update({f"retrievals.{k}_by_new_scenes": float(v) for k, v in stats.items()})
    return counts


def old_query_hits(spark: SparkSession, cfg: ErgConfig, vectors: DataFrame, new_queries: DataFrame, shipped,
                   plan: RetrievalPlan, new_scene_images: DataFrame) -> DataFrame:
    """The hits of every old factual query (not in ``new_queries``) against the shipped index of the new scenes
    (:data:`udfs.retrieval.HIT_SCHEMA`; the ranks are rewritten by :func:`merged_top_k`).

    Every factual caption is a query here, so no vector is joined to its caption or moved across the cluster:
    the text types search the caption vectors where ``embeddings`` holds them (:func:`old_caption_hits`), the image
    types each factual image's vector once (:func:`old_image_hits`). ``new_scene_images``: ``scene_id``,
    ``_scene_image`` of the new scenes.
    """
    factual = query_captions(spark, cfg).select(
        F.col("caption_id").alias("query_id"), F.col("image_id").alias("query_image_id"))
    old = factual.join(F.broadcast(new_queries.select(F.col("caption_id").alias("query_id"))), "query_id",
                       "left_anti")
    found = []
    text_types = tuple(t for t in plan.types if retrieval_modalities(t).query == "text")
    if text_types:
        found.append(old_caption_hits(vectors, old, shipped, replace(plan, types=text_types), new_scene_images))
    image_types = tuple(t for t in plan.types if retrieval_modalities(t).query == "image")
    if image_types:
        found.append(old_image_hits(vectors, factual, old, shipped, replace(plan, types=image_types)))
    return found[0] if len(found) == 1 else found[0].unionByName(found[1])


def old_caption_hits(vectors: DataFrame, old: DataFrame, shipped, plan: RetrievalPlan,
                     new_scene_images: DataFrame) -> DataFrame:
    """The hits of the old queries (``old``: ``query_id, query_image_id``) for the text types of ``plan``: the
    caption vectors are searched where ``embeddings`` holds them (no shuffle), without the query's image, for
    ``top_k`` plus the same-image margin; the hits (few) then get their caption's image and lose those that show it,
    which leaves the top ``top_k`` that the search with the image would give."""
    captions = (vectors.where((F.col("item_kind") == "factual") & (F.col("modality") == "text"))
                .select(F.col("item_id").alias("query_id"), F.lit(None).cast("string").alias("query_image_id"),
                        F.col("vector").alias("text_vector"), F.lit(None).cast("array<float>").alias("image_vector")))
    wide = replace(plan, top_k=plan.search_k, exclude_same_image=False)
    hits = (captions.mapInPandas(retrieval_partitions(shipped, wide), HIT_SCHEMA).drop("query_image_id")
            .join(old, "query_id"))
    if plan.exclude_same_image:
        hits = (hits.join(F.broadcast(new_scene_images), "scene_id", "left")
                .where(F.col("_scene_image").isNull() | (F.col("_scene_image") != F.col("query_image_id")))
                .drop("_scene_image"))
    return hits.select(*HIT_COLUMNS)


def old_image_hits(vectors: DataFrame, factual: DataFrame, old: DataFrame, shipped, plan: RetrievalPlan) -> DataFrame:
    """The hits of the old queries (``old``) for the image types of ``plan``: each factual image's vector (``factual``:
    ``query_id, query_image_id`` of every factual caption) is searched once, and its hits become those of its
    captions."""
    images = (vectors.where((F.col("item_kind") == "image") & (F.col("modality") == "image"))
              .join(factual.select(F.col("query_image_id").alias("item_id")).distinct(), "item_id", "left_semi")
              .select(F.col("item_id").alias("query_id"), F.col("item_id").alias("query_image_id"),
                      F.lit(None).cast("array<float>").alias("text_vector"), F.col("vector").alias("image_vector")))
    hits = (images.mapInPandas(retrieval_partitions(shipped, plan), HIT_SCHEMA)
            .drop("query_id").join(old, "query_image_id"))
    return hits.select(*HIT_COLUMNS)


# ------------------------------------------------------------------------------------------------------ steps
@dataclass(frozen=True)
class Increment:
    """Where an incremental retrieval starts: the version of ``embeddings`` it reads (its next watermark) and what
    the table gained under the encoder since the watermark (:func:`new_since`; None: nothing new)."""

    version: int
    new: dict[str, DataFrame] | None


def increment_since_watermark(spark: SparkSession, cfg: ErgConfig, encoder_version: str,
                              query_filter: DataFrame | None) -> Increment | None:
    """What ``embeddings`` gained since the last retrieval finished; None where none did (a full retrieval)."""
    since = watermark(cfg, "retrieve", "embeddings")
    if since is None:
        return None
    if query_filter is not None:
        raise ValueError("retrieve(incremental=True) searches what is new since its watermark: give no query_filter")
    version = table_version(spark, cfg, "embeddings")
    new = new_since(spark, cfg, since, encoder_version) if version > since else None
    if new is not None and not any(frame.limit(1).count() for frame in new.values()):
        new = None  # nothing inserted (a compaction commit changes no row): nothing to search
    return Increment(version, new)


@dataclass(frozen=True)
class Corpus:
    """What a retrieval reads when its run starts: the version of ``embeddings`` (its next watermark), the vectors
    of the encoder's version, the stylized scenes (all of them, and the train split's ``scene_id, image_id,
    style``) and the modalities that the configured types search."""

    embeddings_version: int
    vectors: DataFrame
    all_scenes: DataFrame
    stylized: DataFrame
    targets: list[str]

    def tuning_sample(self, spark: SparkSession, cfg: ErgConfig) -> Callable[[str], np.ndarray]:
        """modality -> the query vectors ``auto`` tunes that index on (:func:`tuning_sample`)."""
        return lambda modality: tuning_sample(spark, cfg, self.vectors, modality)


@dataclass(frozen=True)
class Indexes:
    """The train scenes with their vectors, the scene index of each target modality and (``auto``) what the tuning
    chose for each."""

    scenes: pd.DataFrame
    by_modality: dict[str, SceneIndex]
    tunings: dict[str, IndexTuning]


@dataclass(frozen=True)
class Shipping:
    """How the search runs: the payload the executors get (the indexes and each scene's image), its transport
    (:func:`index_transport`) and the :class:`udfs.retrieval.RetrievalPlan`."""

    payload: ScenePayload
    transport: str
    plan: RetrievalPlan


@dataclass(frozen=True)
class Queries:
    """The factual queries searched (persisted when ``query_filter`` restricts them), that filter (incremental:
    the new queries), the new train scenes (incremental) and how many queries each type has."""

    frame: DataFrame
    query_filter: DataFrame | None
    new_scene_ids: list[str]
    per_type: dict[str, int]


def retrieval_rows(hits: DataFrame, encoder_version: str, run_id: str) -> DataFrame:
    """Hits as rows of ``retrievals``, stamped with the encoder's version and the run id."""
    return hits.select(
        "query_id", "query_image_id", "scene_id", "retrieval_type", "rank", "similarity",
        F.lit(encoder_version).alias("encoder_version"), F.lit(run_id).alias("run_id"),
        F.current_timestamp().alias("created_at"))


def _as_rows(ctx: JobContext) -> Callable[[DataFrame], DataFrame]:
    return lambda hits: retrieval_rows(hits, ctx["identity"].version, ctx.run_id)


def read_step(ctx: JobContext) -> Corpus:
    """The version of ``embeddings`` read now (the watermark the run records), and the frames it searches."""
    increment, encoder_version = ctx["increment"], ctx["identity"].version
    ctx.summary["encoder_version"] = encoder_version
    embeddings_version = (increment.version if increment is not None
                          else table_version(ctx.spark, ctx.cfg, "embeddings"))
    vectors = read_table(ctx.spark, ctx.cfg, "embeddings").where(F.col("encoder_version") == encoder_version)
    all_scenes = read_table(ctx.spark, ctx.cfg, "stylized_captions")
    stylized = all_scenes.where(F.col("split") == "train").select("scene_id", "image_id", "style")
    return Corpus(embeddings_version, vectors, all_scenes, stylized, target_modalities(ctx.cfg.retrieve.types))


def scene_indexes_step(ctx: JobContext) -> Indexes:
    """The train scenes' vectors collected and indexed per target modality (``auto``: tuned on a query sample)."""
    corpus: Corpus = ctx["read"]
    scenes = scene_vectors(corpus.stylized, corpus.vectors, corpus.targets).toPandas()
    ctx.counts.update({"scenes": len(scenes), "scenes.non_train_excluded": corpus.all_scenes.count() - len(scenes)})
    tunings: dict[str, IndexTuning] = {}
    indexes = scene_indexes(scenes, corpus.targets, ctx.cfg.retrieve.index, ctx.counts,
                            sample=corpus.tuning_sample(ctx.spark, ctx.cfg), tunings=tunings)
    return Indexes(scenes, indexes, tunings)


def plan_step(ctx: JobContext) -> Shipping:
    """Every target modality has its index (else ValueError); the index types and tuning logged; the GPU fallback
    checked; the payload and its transport chosen."""
    conf, indexes = ctx.cfg.retrieve, ctx["scene_indexes"]
    scene_image_map = dict(zip(indexes.scenes["scene_id"], indexes.scenes["image_id"]))
    for modality in ctx["read"].targets:
        if modality not in indexes.by_modality:
            raise ValueError(
                f"no {modality} vectors of the stylized scenes under encoder version {ctx['identity'].version}: "
                f"run `erg embed` first with the same embed.encoder"
            )
    index_types = ctx.summary["index_types"] = {m: index.index_type for m, index in indexes.by_modality.items()}
    reports.log_scene_indexes(index_types, indexes.tunings)
    ctx.counts["index.faiss_gpu_fallback"] = float(bool(faiss_gpu_fallbacks(index_types, conf.index)))
    payload = ScenePayload.of(indexes.by_modality, scene_image_map)
    transport = index_transport(ctx.spark, conf)
    ctx.counts["index.payload_bytes"] = payload.size_bytes
    ctx.counts["index.transport_file"] = float(transport == "file")
    return Shipping(payload, transport, RetrievalPlan(
        tuple(conf.types), conf.top_k, conf.min_similarity, conf.exclude_same_image, exclusion_margin(scene_image_map),
        conf.index.use_gpu, conf.index.gpu_fallback))


def queries_step(ctx: JobContext) -> Queries:
    """The factual queries to search (incremental: the new ones, and the new train scenes), counted per modality."""
    conf, corpus, increment = ctx.cfg.retrieve, ctx["read"], ctx["increment"]
    query_filter, new_scene_ids = ctx["query_filter"], []
    if increment is not None:
        factual = query_captions(ctx.spark, ctx.cfg).select("caption_id", "image_id")
        new_scenes, query_filter = split_new(corpus.stylized, factual, increment.new)
        new_scene_ids = [r.scene_id for r in new_scenes.collect()]  # bounded by the stylized corpus
        ctx.counts["incremental.new_scenes"] = len(new_scene_ids)
    modalities = query_modalities(conf.types)
    queries = factual_queries(ctx.spark, ctx.cfg, corpus.vectors, modalities, query_filter)
    if query_filter is not None:  # a few queries, read by the search, the counts and the MERGE: read once
        queries = queries.persist(StorageLevel.MEMORY_AND_DISK)
    have = queries.agg(F.count(F.lit(1)).alias("queries"), F.count("text_vector").alias("text"),
                       F.count("image_vector").alias("image")).collect()[0]
    ctx.counts["queries"] = have["queries"]
    if increment is not None:
        ctx.counts["incremental.new_queries"] = have["queries"]
    ctx.counts.update({f"queries.{m}": have[m] for m in modalities})
    return Queries(queries, query_filter, new_scene_ids,
                   {t: have[retrieval_modalities(t).query] for t in conf.types})


def search_step(ctx: JobContext) -> tuple[pd.DataFrame, list[dict]]:
    """While the indexes are shipped: the search (its Table 5 view, whose metrics are counted), the hits MERGEd into
    ``retrievals`` and the examples; the hits and the queries are unpersisted and the indexes destroyed at its end."""
    shipping, queries = ctx["plan"], ctx["queries"]
    with shipped_scene_indexes(ctx.spark, ctx.cfg, shipping.payload, ctx.run_id, shipping.transport) as shipped:
        hits = search_hits(ctx.spark, ctx.cfg, queries.frame, shipped, shipping.plan).persist(
            StorageLevel.MEMORY_AND_DISK)
        try:
            table, examples = write_hits(ctx, hits, queries)
        finally:
            hits.unpersist()
            queries.frame.unpersist()  # a no-op where it was not persisted
    ctx.counts.update(table5_metrics(table))
    return table, examples


def write_hits(ctx: JobContext, hits: DataFrame, queries: Queries) -> tuple[pd.DataFrame, list[dict]]:
    """The Table 5 view of ``hits``, the hits replacing the searched queries' rows, and the examples (each timed:
    ``seconds.search``, ``.merge``, ``.examples``)."""
    conf = ctx.cfg.retrieve
    with step_seconds(ctx.counts, "search"):
        per_type, per_type_style = _table5_inputs(hits, ctx["read"].stylized)
        table = table5(per_type, per_type_style, queries.per_type, ctx.cfg.styles, conf.types)
    with step_seconds(ctx.counts, "merge"):
        stats = replace_hits(ctx.spark, ctx.cfg, _as_rows(ctx)(hits), queries.frame, ctx["identity"].version,
                             few=queries.query_filter is not None)
    ctx.counts.update({f"retrievals.{k}": float(v) for k, v in stats.items()})
    with step_seconds(ctx.counts, "examples"):
        examples = _examples(hits, ctx.spark, ctx.cfg, conf.examples_to_log) if conf.examples_to_log else []
    return table, examples


def new_scenes_step(ctx: JobContext) -> None:
    """Incremental: the old queries against the new scenes (the new queries met the full index), merged into the
    kept top-k."""
    queries, corpus, shipping = ctx["queries"], ctx["read"], ctx["plan"]
    ctx.counts.update(merge_new_scenes(
        ctx.spark, ctx.cfg, ctx["scene_indexes"].scenes, queries.new_scene_ids, queries.query_filter, corpus.vectors,
        shipping.plan, ctx["identity"].version, ctx.run_id, _as_rows(ctx), shipping.transport,
        corpus.tuning_sample(ctx.spark, ctx.cfg)))


def leakage_step(ctx: JobContext) -> None:
    """The leakage counts (incremental: of the rows this run wrote; the rest was checked before)."""
    count_leakage(ctx, written_only=ctx.incremental)


def report_step(ctx: JobContext) -> None:
    table, examples = ctx["search"]
    table_md = reports.log_table5(ctx["identity"].version, ctx.summary["index_types"], table)
    reports.log_retrieval_examples(examples)
    logger.info("retrieval counts per type:\n%s", table_md)


def watermark_step(ctx: JobContext) -> None:
    """After the retrieval succeeded: the version of ``embeddings`` it read is its watermark."""
    advance_watermark(ctx.cfg, "retrieve", {"embeddings": ctx["read"].embeddings_version})


def _has_new_scenes(ctx: JobContext) -> bool:
    return bool(ctx["queries"].new_scene_ids)


RETRIEVE_STEPS = (Step("read", read_step), Step("scene_indexes", scene_indexes_step, timed=True),
                  Step("plan", plan_step), Step("queries", queries_step, timed=True), Step("search", search_step),
                  Step("new_scenes", new_scenes_step, when=_has_new_scenes), Step("leakage", leakage_step, timed=True),
                  Step("report", report_step), Step("watermark", watermark_step))


def retrieve(spark: SparkSession, cfg: ErgConfig, query_filter: DataFrame | None = None, *,
             incremental: bool = False) -> dict:
    """Search the factual queries against the stylized scenes for every configured type; returns the logged counts.

    ``query_filter`` (a DataFrame with ``caption_id``) limits the factual captions searched; by default all are.
    ``incremental`` (with a watermark of a finished retrieval; else the full search): only what ``embeddings``
    gained since then is searched. New factual queries are searched against the full indexes; new train scenes are
    indexed on their own, every other query is searched against that small index and its hits merged into the
    kept top-k (ranks rewritten, hits pushed out deleted, in one MERGE); an unchanged (query, scene) pair is never
    searched again. Nothing new: nothing is searched (``skipped`` says why). The steps (:data:`RETRIEVE_STEPS`, run
    by :func:`jobs.platform.runner.run_job`): read -> scene_indexes -> plan -> queries -> search -> new_scenes
    (incremental) -> leakage -> report -> watermark.

    Counts: ``queries``, ``queries.<modality>`` (with a vector of it), ``scenes`` (train split),
    ``scenes.non_train_excluded``, ``leakage.*`` (:func:`jobs.leakage.leakage_counts`), ``index.<modality>.size``,
    per type ``<type>.queries``, ``<type>.queries_with_hit``, ``<type>.hits``, ``<type>.hits.<style>``,
    ``<type>.mean_similarity``; ``retrievals.inserted`` / ``.updated`` / ``.deleted``;
    ``index.faiss_gpu_fallback`` (:func:`faiss_gpu_fallbacks`); ``index.transport_file``, ``index.payload_bytes``,
    ``index.<modality>.without_vector``; incremental: ``incremental.new_queries``, ``incremental.new_scenes``,
    ``incremental.new_scene_hits`` (and ``_entering``: those that reach their group's kept top-k),
    ``retrievals.<inserted|updated|deleted>_by_new_scenes``; ``encoder_version``,
    ``index_types`` and ``run_id``; ``seconds.<step>`` (:func:`jobs.platform.tracking.step_seconds`): ``scene_indexes``,
    ``queries``, ``search``, ``merge``, ``examples``, ``leakage``, ``new_scenes.search``, ``new_scenes.merge``.
    """
    identity = encoder_identity(encoder_spec(cfg))
    increment = increment_since_watermark(spark, cfg, identity.version, query_filter) if incremental else None
    if increment is not None and increment.new is None:
        advance_watermark(cfg, "retrieve", {"embeddings": increment.version})
        return {"skipped": "no new embeddings since the last retrieval", "encoder_version": identity.version}
    return run_job(spark, cfg, "retrieve", RETRIEVE_STEPS, sections=("retrieve",),
                   params={"encoder_version": identity.version, "embed.encoder.kind": cfg.embed.encoder.kind,
                           "incremental": increment is not None}, incremental=increment is not None,
                   inputs={"identity": identity, "increment": increment, "query_filter": query_filter})
