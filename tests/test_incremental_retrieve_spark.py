"""Incremental retrieval: new queries meet the full index, new scenes an index of their own merged into the kept
top-k, and the result equals a full exact search over everything (no stale or duplicate rank rows).

Tables are written by hand (random unit vectors under the configured encoder's version), so retrieval runs without
embedding anything.
"""
from __future__ import annotations

import datetime as dt

import numpy as np
import pytest

from jobs.platform.spark import get_spark
from jobs.platform.tables import conform, merge_rows, table_name
from jobs.retrieve import retrieve

pytestmark = pytest.mark.spark

NOW = dt.datetime(2026, 1, 1)
DIM = 8
SCENES, QUERIES = 40, 60  # scenes on 20 train images (2 each), factual captions on 30 images (2 each)


def _cfg(fresh_cfg, schema: str):
    cfg = fresh_cfg.model_copy(deep=True)
    cfg.tables.schema_name = schema
    cfg.retrieve.types = ["t2t", "i2t"]
    cfg.retrieve.top_k = 3
    cfg.retrieve.min_similarity = -1.0  # every scene can be a hit: ranks are all that decide
    cfg.retrieve.examples_to_log = 0
    return cfg


def _corpus():
    rng = np.random.default_rng(7)

    def unit(n):
        x = rng.standard_normal((n, DIM)).astype(np.float32)
        return (x / np.linalg.norm(x, axis=1, keepdims=True)).tolist()

    scene_vectors, scene_images = unit(SCENES), unit(SCENES // 2)
    query_vectors, query_images = unit(QUERIES), unit(QUERIES // 2)
    scenes = [dict(scene_id=f"s{i:02d}", image_id=f"img:s{i // 2}", caption=f"stylized {i}", style="humor",
                   split="train", source="t", ingest_time=NOW, run_id="r0") for i in range(SCENES)]
    # new scenes that show an old query's image: never that query's hits
    scenes[-1]["image_id"], scenes[-2]["image_id"] = "img:q1", "img:q24"
    queries = [dict(caption_id=f"q{i:02d}", image_id=f"img:q{i // 2}", caption=f"factual {i}", source="t",
                    split="train", ingest_time=NOW) for i in range(QUERIES)]
    vectors = {("scene", s["scene_id"]): scene_vectors[i] for i, s in enumerate(scenes)}
    vectors.update({("image", f"img:s{i}"): v for i, v in enumerate(scene_images)})
    vectors.update({("factual", q["caption_id"]): query_vectors[i] for i, q in enumerate(queries)})
    vectors.update({("image", f"img:q{i}"): v for i, v in enumerate(query_images)})
    return scenes, queries, vectors


def _plant(spark, cfg, scenes, queries, vectors):
    from jobs.vocabulary import encoder_spec
    from udfs.embedding import encoder_identity

    version = encoder_identity(encoder_spec(cfg)).version
    images = {s["image_id"] for s in scenes} | {q["image_id"] for q in queries}
    wanted = ({("scene", s["scene_id"]) for s in scenes} | {("factual", q["caption_id"]) for q in queries}
              | {("image", i) for i in images})
    rows = [dict(item_id=item, item_kind=kind, modality="image" if kind == "image" else "text", vector=vector,
                 encoder="sentence", encoder_version=version, run_id="r0", created_at=NOW)
            for (kind, item), vector in vectors.items() if (kind, item) in wanted]
    for table, data in (("stylized_captions", scenes), ("factual_captions", queries), ("embeddings", rows)):
        merge_rows(spark, cfg, table, conform(spark.createDataFrame(data), table))


def _hits(spark, cfg):
    rows = spark.table(table_name(cfg, "retrievals")).collect()
    return sorted((r.query_id, r.retrieval_type, r.rank, r.scene_id, round(r.similarity, 4)) for r in rows)


def _expected_hits(scenes, queries, vectors, top_k: int, exclude_same_image: bool = True):
    """The rows a full exact retrieval over everything gives (t2t: caption vs caption, i2t: image vs caption), no
    scene of the query's own image."""
    ids = [s["scene_id"] for s in scenes]
    targets = np.array([vectors[("scene", i)] for i in ids])
    rows = []
    for q in queries:
        others = [j for j, s in enumerate(scenes) if s["image_id"] != q["image_id"] or not exclude_same_image]
        for kind, vector in (("t2t", vectors[("factual", q["caption_id"])]), ("i2t", vectors[("image", q["image_id"])])):
            similarity = targets @ np.asarray(vector, dtype=np.float32)
            order = [j for j in np.argsort(-similarity, kind="stable") if j in others]
            for rank, j in enumerate(order[:top_k], start=1):
                rows.append((q["caption_id"], kind, rank, ids[j], round(float(similarity[j]), 4)))
    return sorted(rows)


def test_incremental_retrieval_equals_a_full_one_and_searches_only_what_is_new(spark, fresh_cfg):
    scenes, queries, vectors = _corpus()
    base = fresh_cfg.tables.schema_name
    inc = _cfg(fresh_cfg, base + "_inc")

    get_spark(inc)
    _plant(spark, inc, scenes[:36], queries[:54], vectors)
    first = retrieve(spark, inc, incremental=True)  # no watermark yet: a full retrieval
    assert "incremental.new_queries" not in first and first["queries"] == 54
    _plant(spark, inc, scenes, queries, vectors)  # 4 new scenes (2 new images), 6 new queries (3 new images)
    second = retrieve(spark, inc, incremental=True)
    assert second["incremental.new_scenes"] == 4 and second["incremental.new_queries"] == 6
    assert second["queries"] == 6  # only the new queries met the full index
    assert second["index.new_scenes.text.size"] == 4
    # some old queries found a new scene among their top 3: re-ranked, and the hits pushed out deleted
    assert second["retrievals.inserted_by_new_scenes"] > 0
    assert second["retrievals.deleted_by_new_scenes"] == second["retrievals.inserted_by_new_scenes"]
    # the new scenes' MERGE marked the rows it re-ranked or pushed out (deletion vectors) instead of rewriting files
    merge = (spark.sql(f"DESCRIBE HISTORY {table_name(inc, 'retrievals')}").where("operation = 'MERGE'")
             .orderBy("version", ascending=False).first())
    assert int(merge.operationMetrics["numTargetDeletionVectorsAdded"]) > 0
    assert int(merge.operationMetrics.get("numTargetFilesRemoved", 0)) == 0

    incremental_hits = _hits(spark, inc)
    assert incremental_hits == _expected_hits(scenes, queries, vectors, top_k=3)  # a full exact search's rows
    # new scenes of old queries' images would be among their hits (image and text types): they were left out
    unexcluded = {(q, t, s) for q, t, _, s, _ in _expected_hits(scenes, queries, vectors, 3, False)}
    assert {("q02", "i2t", "s39"), ("q48", "t2t", "s38")} <= unexcluded
    assert len(incremental_hits) == QUERIES * 2 * 3
    keys = [(q, t, rank) for q, t, rank, _, _ in incremental_hits]
    assert len(keys) == len(set(keys))  # one row per (query, type, rank): no stale rank left

    assert retrieve(spark, inc, incremental=True)["skipped"]  # nothing new since


def test_only_new_scene_hits_that_reach_the_kept_top_k_are_merged(spark):
    from jobs.retrieve import entering_hits

    columns = ["query_id", "retrieval_type", "encoder_version", "scene_id", "similarity"]
    kept = spark.createDataFrame([("q1", "t2t", "v", "s1", 0.9), ("q1", "t2t", "v", "s2", 0.8),
                                  ("q1", "t2t", "v", "s3", 0.7), ("q2", "t2t", "v", "s1", 0.9),
                                  ("q1", "i2t", "v", "s1", 0.2)], columns)
    found = spark.createDataFrame([
        ("q1", "t2t", "v", "new1", 0.75),  # beats the 3rd kept hit (0.7): enters
        ("q1", "t2t", "v", "new2", 0.5),   # below a full group's floor: changes nothing
        ("q1", "t2t", "v", "new3", 0.7),   # ties the floor: merged (the scene id decides its rank)
        ("q2", "t2t", "v", "new4", 0.1),   # q2's group holds 1 of 3: any hit enters
        ("q3", "t2t", "v", "new5", 0.1),   # no kept group at all
        ("q1", "i2t", "v", "new6", 0.1),   # another type's group (1 of 3) of the same query
        ("q1", "t2t", "w", "new7", 0.1),   # another encoder version: its own (empty) group
    ], columns)
    entering = {r.scene_id for r in entering_hits(kept, found, top_k=3).collect()}
    assert entering == {"new1", "new3", "new4", "new5", "new6", "new7"}
