"""Benchmark of the Retrieve step on Spark: broadcast Faiss index vs crossJoin + cosine UDF; index build/search scaling.

Part 1, the same t2t retrieval of N factual queries over M stylized scenes two ways, on random unit vectors
(``dim`` wide, clustered so that hits above the threshold exist):

- **broadcast index** (what ``erg retrieve`` does): the scene index built on the driver, serialized, broadcast,
  searched in ``mapInPandas`` by :func:`udfs.retrieval.retrieval_partitions`;
- **crossJoin**: every (query, scene) pair through a cosine-similarity pandas UDF, the threshold as a filter, and a
  window ``row_number()`` for the top-k.

Both must give the same top-1 scene for every query (checked; ties by equal similarity count as equal); the time
ratio crossJoin / broadcast is printed. No assertion on time.

Part 2, the model layer alone (no Spark): Faiss build and search time of the flat, IVF and HNSW scene indexes for
growing corpus sizes, printed as ratios to the smallest size.

    python benchmarks/retrieval_broadcast_vs_crossjoin.py --queries 200 --scenes 2000 --sizes 2000 8000 32000
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from models.scene_index import build_scene_index, default_nlist  # noqa: E402
from udfs.retrieval import HIT_SCHEMA, RetrievalPlan, ScenePayload, retrieval_partitions  # noqa: E402


def clustered_unit_vectors(rng: np.random.Generator, count: int, dim: int, centres: np.ndarray,
                           spread: float = 0.7) -> np.ndarray:
    """Unit vectors around unit ``centres`` (noise of norm ~``spread``): two members of one cluster have a cosine
    of about 1 / (1 + spread^2), so similarities on both sides of 0.6 occur, as for real captions."""
    units = centres / np.linalg.norm(centres, axis=1, keepdims=True)
    picked = units[rng.integers(0, len(units), count)]
    vectors = picked + spread / np.sqrt(dim) * rng.standard_normal((count, dim))
    return (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)


def spark_session(master: str, home: str):
    from jobs.platform.config import load_config
    from jobs.platform.spark import get_spark

    os.environ.setdefault("ERG_HOME", home)
    cfg = load_config("local", [f"spark.master={master}", "spark.show_progress=false", "spark.driver_memory=3g",
                                "spark.shuffle_partitions=4", "tables.schema=bench_retrieval"])
    return get_spark(cfg)


def broadcast_index_run(spark, queries: pd.DataFrame, scene_ids: list[str], scenes: np.ndarray, top_k: int,
                        threshold: float) -> tuple[pd.DataFrame, float]:
    """erg retrieve's path: driver-built index, one broadcast, mapInPandas search. Returns (top-1 hits, seconds)."""
    started = time.perf_counter()
    index = build_scene_index(scenes, scene_ids, "flat")
    payload = ScenePayload.of({"text": index}, {s: f"image-of-{s}" for s in scene_ids})
    broadcast = spark.sparkContext.broadcast(payload)
    plan = RetrievalPlan(("t2t",), top_k, threshold, exclude_same_image=False)
    frame = spark.createDataFrame(queries.assign(image_vector=None),
                                  "query_id string, query_image_id string, text_vector array<float>, "
                                  "image_vector array<float>")
    hits = frame.mapInPandas(retrieval_partitions(broadcast, plan), HIT_SCHEMA)
    top1 = hits.where("rank = 1").select("query_id", "scene_id", "similarity").toPandas()
    seconds = time.perf_counter() - started
    broadcast.destroy()
    return top1, seconds


def cross_join_run(spark, queries: pd.DataFrame, scene_ids: list[str], scenes: np.ndarray, top_k: int,
                   threshold: float) -> tuple[pd.DataFrame, float]:
    """The naive path: all pairs, a cosine pandas UDF, filter, window top-k. Returns (top-1 hits, seconds)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    from pyspark.sql.functions import pandas_udf

    @pandas_udf("double")
    def cosine(left: pd.Series, right: pd.Series) -> pd.Series:
        a = np.stack(left.to_numpy())
        b = np.stack(right.to_numpy())
        return pd.Series(np.einsum("ij,ij->i", a, b) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)))

    started = time.perf_counter()
    query_frame = spark.createDataFrame(queries[["query_id", "text_vector"]],
                                        "query_id string, text_vector array<float>")
    scene_frame = spark.createDataFrame(pd.DataFrame({"scene_id": scene_ids, "scene_vector": list(scenes)}),
                                        "scene_id string, scene_vector array<float>")
    pairs = query_frame.crossJoin(scene_frame).select("query_id", "scene_id",
                                                      cosine("text_vector", "scene_vector").alias("similarity"))
    ranked = pairs.where(F.col("similarity") > threshold).withColumn(
        "rank", F.row_number().over(Window.partitionBy("query_id").orderBy(F.desc("similarity"), "scene_id")))
    top1 = ranked.where(F.col("rank") <= top_k).where("rank = 1").select("query_id", "scene_id", "similarity").toPandas()
    return top1, time.perf_counter() - started


def same_top1(a: pd.DataFrame, b: pd.DataFrame) -> tuple[int, int]:
    """(queries whose top-1 agree, queries compared): agreeing on the scene, or on the similarity within 1e-5 (a tie)."""
    merged = a.merge(b, on="query_id", how="outer", suffixes=("_index", "_cross"))
    agree = (merged.scene_id_index == merged.scene_id_cross) | (
        (merged.similarity_index - merged.similarity_cross).abs() < 1e-5)
    return int(agree.sum()), len(merged)


def index_scaling(rng: np.random.Generator, sizes: list[int], dim: int, queries: int, top_k: int) -> pd.DataFrame:
    """Build and search seconds of each index type per corpus size, and their ratios to the smallest size."""
    centres = rng.standard_normal((64, dim)).astype(np.float32)
    query_vectors = clustered_unit_vectors(rng, queries, dim, centres)
    rows = []
    for size in sizes:
        vectors = clustered_unit_vectors(rng, size, dim, centres)
        ids = [f"s{i}" for i in range(size)]
        for index_type, options in (("flat", {}), ("ivf", {"nlist": default_nlist(size), "nprobe": 16}),
                                    ("hnsw", {"hnsw_m": 32, "ef_search": 128})):
            started = time.perf_counter()
            index = build_scene_index(vectors, ids, index_type, **options)
            built = time.perf_counter() - started
            started = time.perf_counter()
            index.search(query_vectors, top_k=top_k, min_similarity=-1.0)
            rows.append({"index": index_type, "scenes": size, "build_s": built, "search_s": time.perf_counter() - started})
    table = pd.DataFrame(rows)
    smallest = table[table.scenes == min(sizes)].set_index("index")
    table["build_ratio"] = table.build_s / table["index"].map(smallest.build_s)
    table["search_ratio"] = table.search_s / table["index"].map(smallest.search_s)
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--queries", type=int, default=200, help="factual queries N")
    parser.add_argument("--scenes", type=int, default=2000, help="stylized scenes M")
    parser.add_argument("--dim", type=int, default=384, help="vector size (384 = MiniLM)")
    parser.add_argument("--top-k", type=int, default=5)
    parser.add_argument("--threshold", type=float, default=0.6)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--sizes", type=int, nargs="+", default=[2000, 8000, 32000], help="corpus sizes for part 2")
    parser.add_argument("--search-queries", type=int, default=1000, help="queries per search in part 2")
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args()

    rng = np.random.default_rng(args.seed)
    centres = rng.standard_normal((32, args.dim)).astype(np.float32)
    scenes = clustered_unit_vectors(rng, args.scenes, args.dim, centres)
    scene_ids = [f"scene{i}" for i in range(args.scenes)]
    query_vectors = clustered_unit_vectors(rng, args.queries, args.dim, centres)
    queries = pd.DataFrame({"query_id": [f"q{i}" for i in range(args.queries)],
                            "query_image_id": [f"qimg{i}" for i in range(args.queries)],
                            "text_vector": list(query_vectors)})

    with tempfile.TemporaryDirectory(prefix="erg-bench-") as home:
        spark = spark_session(args.master, home)
        broadcast_index_run(spark, queries.head(8), scene_ids, scenes, args.top_k, args.threshold)  # warm workers
        index_top1, index_s = broadcast_index_run(spark, queries, scene_ids, scenes, args.top_k, args.threshold)
        cross_top1, cross_s = cross_join_run(spark, queries, scene_ids, scenes, args.top_k, args.threshold)
        spark.stop()
    agree, compared = same_top1(index_top1, cross_top1)
    pairs = args.queries * args.scenes
    print(f"\n== t2t retrieval, {args.queries} queries x {args.scenes} scenes ({pairs:,} pairs), dim {args.dim}, "
          f"top-{args.top_k}, similarity > {args.threshold}, {args.master}")
    print(f"broadcast index + mapInPandas : {index_s:8.2f} s")
    print(f"crossJoin + cosine UDF + window: {cross_s:8.2f} s")
    print(f"ratio crossJoin / broadcast    : {cross_s / index_s:8.1f}x")
    print(f"top-1 agreement                : {agree}/{compared} queries with a hit "
          f"({len(index_top1)} by the index, {len(cross_top1)} by the crossJoin)")

    table = index_scaling(rng, args.sizes, args.dim, args.search_queries, args.top_k)
    print(f"\n== Faiss scene index, {args.search_queries} queries top-{args.top_k}, dim {args.dim}; "
          f"ratios to {min(args.sizes)} scenes")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    if agree != compared:
        raise SystemExit(f"top-1 disagreement on {compared - agree} queries")


if __name__ == "__main__":
    main()
