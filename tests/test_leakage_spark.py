"""No leakage (paper Sect. 4): val/test scenes are never retrieval targets, and leakage_counts finds planted leaks.

Tables are written by hand (tiny vectors under the configured encoder's version), so retrieval runs without
embedding anything: a test scene that would be the best hit of a factual query must not be retrieved.
"""
from __future__ import annotations

import datetime as dt

import numpy as np
import pytest

from jobs.leakage import LEAKAGE_METRICS, leakage_counts
from jobs.platform.spark import get_spark
from jobs.platform.tables import conform, create_training_set_view, merge_rows, table_name

pytestmark = pytest.mark.spark

NOW = dt.datetime(2026, 1, 1)
DIM = 8


def _unit(v):
    v = np.asarray(v, dtype=np.float32)
    return (v / np.linalg.norm(v)).tolist()


def _write(spark, cfg, table, rows):
    merge_rows(spark, cfg, table, conform(spark.createDataFrame(rows), table))


@pytest.fixture
def planted(spark, fresh_cfg):
    """Scenes on images A (train), B (test), C (val), D (train); a factual caption on image E whose vectors equal
    the test scene's (the best hit), the val scene's next, then A's."""
    from jobs.vocabulary import encoder_spec
    from udfs.embedding import encoder_identity

    cfg = fresh_cfg.model_copy(deep=True)
    cfg.retrieve.types = ["t2t", "i2i"]
    cfg.retrieve.min_similarity = 0.1
    get_spark(cfg)
    version = encoder_identity(encoder_spec(cfg)).version
    base = np.eye(DIM)
    scenes = {  # scene: (image, split, vector)
        "s_train_a": ("img:A", "train", base[0] + 0.9 * base[1]),
        "s_test_b": ("img:B", "test", base[0] + 0.05 * base[1]),
        "s_val_c": ("img:C", "val", base[0] + 0.3 * base[1]),
        "s_train_d": ("img:D", "train", base[5]),
    }
    _write(spark, cfg, "stylized_captions", [
        dict(scene_id=s, image_id=img, caption=f"caption of {s}", style="humor", split=split, source="t",
             ingest_time=NOW, run_id="r0") for s, (img, split, _) in scenes.items()])
    _write(spark, cfg, "factual_captions", [
        dict(caption_id="q1", image_id="img:E", caption="a dog", source="t", split="train", ingest_time=NOW)])
    embeddings = [dict(item_id=s, item_kind="scene", modality="text", vector=_unit(v)) for s, (_, _, v) in scenes.items()]
    embeddings += [dict(item_id=img, item_kind="image", modality="image", vector=_unit(v))
                   for _, (img, _, v) in scenes.items()]
    embeddings += [dict(item_id="q1", item_kind="factual", modality="text", vector=_unit(base[0])),
                   dict(item_id="img:E", item_kind="image", modality="image", vector=_unit(base[0]))]
    _write(spark, cfg, "embeddings", [dict(e, encoder="sentence", encoder_version=version, run_id="r0",
                                           created_at=NOW) for e in embeddings])
    return cfg


def test_val_test_scenes_are_never_retrieval_targets_and_a_clean_run_leaks_nothing(spark, planted):
    from jobs.retrieve import retrieve

    cfg = planted
    counts = retrieve(spark, cfg)
    hits = spark.table(table_name(cfg, "retrievals")).orderBy("retrieval_type", "rank").collect()
    assert {(h.retrieval_type, h.rank, h.scene_id) for h in hits} == {
        ("t2t", 1, "s_train_a"), ("i2i", 1, "s_train_a")}  # s_test_b and s_val_c were closer
    assert counts["scenes"] == 2 and counts["scenes.non_train_excluded"] == 2
    assert {k: counts[k] for k in LEAKAGE_METRICS} == {k: 0 for k in LEAKAGE_METRICS}
    import mlflow

    metrics = mlflow.get_run(counts["run_id"]).data.metrics
    assert all(metrics[k] == 0 for k in LEAKAGE_METRICS)


def test_leakage_counts_find_planted_leaks(spark, planted):
    cfg = planted
    assert leakage_counts(spark, cfg) == {k: 0 for k in LEAKAGE_METRICS}
    _write(spark, cfg, "retrievals", [dict(query_id="q1", query_image_id="img:E", scene_id="s_test_b",
                                           retrieval_type="t2t", rank=1, similarity=0.99, encoder_version="v",
                                           run_id="r1", created_at=NOW)])
    aug = dict(query_id="q1", image_id="img:E", factual_caption="a dog", retrieval_type="t2t", style="humor",
               style_phrase="p", generated_caption="a dog p", similarity=0.9, passed_style=True,
               passed_perplexity=True, passed_similarity=True, passed=True, generator_version="g", run_id="r1",
               created_at=NOW)
    _write(spark, cfg, "augmented_captions", [dict(aug, scene_id="s_test_b"), dict(aug, scene_id="s_train_a")])
    # a train caption of a test image, and a factual caption (P) of a stylized image
    _write(spark, cfg, "stylized_captions", [dict(scene_id="s_leak", image_id="img:B", caption="leak",
                                                  style="humor", split="train", source="t", ingest_time=NOW)])
    _write(spark, cfg, "factual_captions", [dict(caption_id="q2", image_id="img:A", caption="a cat", source="t",
                                                 ingest_time=NOW)])
    create_training_set_view(spark, cfg)
    counts = leakage_counts(spark, cfg)
    assert counts == {"leakage.retrievals_non_train_scene": 1, "leakage.augmented_non_train_phrase": 1,
                      "leakage.training_set_non_train_images": 1, "leakage.factual_stylized_overlap": 1,
                      "leakage.queries_non_train_image": 0, "leakage.augmented_non_train_image": 0}
    # a query of a test image (P here), and an augmented caption generated for one
    _write(spark, cfg, "factual_captions", [dict(caption_id="q3", image_id="img:B", caption="a bird", source="t",
                                                 ingest_time=NOW)])
    _write(spark, cfg, "augmented_captions", [dict(aug, query_id="q3", image_id="img:B", scene_id="s_train_a")])
    counts = leakage_counts(spark, cfg)
    assert counts["leakage.queries_non_train_image"] == 1 and counts["leakage.augmented_non_train_image"] == 1
    assert counts["leakage.factual_stylized_overlap"] == 2
    # the view itself keeps the augmented caption with the test scene's phrase out of training
    view = spark.table(table_name(cfg, "training_set")).where("origin = 'augmented'").collect()
    assert [r.scene_id for r in view] == ["s_train_a"]


def test_train_descriptions_are_queries_and_held_out_ones_never(spark, planted):
    """With retrieve.train_descriptions_as_queries the descriptions of train images join P as queries (ids that
    stay the same), a test or val image's never; off, the queries are P alone."""
    from jobs.platform.tables import DESCRIPTION_QUERY_SOURCE, query_captions

    cfg = planted.model_copy(deep=True)
    _write(spark, cfg, "images", [
        dict(image_id=img, source="t", ingest_time=NOW, descriptions=descriptions)
        for img, descriptions in [("img:A", ["a man on a dock", "a man on a dock", "a dock"]),
                                  ("img:B", ["a bird on a test image"]), ("img:C", ["a val scene"]),
                                  ("img:E", None)]])
    assert sorted(r.caption_id for r in query_captions(spark, cfg).collect()) == ["q1"]
    cfg.retrieve.train_descriptions_as_queries = True
    rows = query_captions(spark, cfg).collect()
    described = sorted((r.image_id, r.caption, r.split, r.source) for r in rows if r.caption_id != "q1")
    assert described == [("img:A", "a dock", "train", DESCRIPTION_QUERY_SOURCE),
                         ("img:A", "a man on a dock", "train", DESCRIPTION_QUERY_SOURCE)]  # a repeat counts once
    assert {r.caption_id for r in rows} == {r.caption_id for r in query_captions(spark, cfg).collect()}
    assert all(r.caption_id.startswith("desc-") for r in rows if r.caption_id != "q1")
    assert leakage_counts(spark, cfg)["leakage.queries_non_train_image"] == 0


def test_leakage_counts_are_zero_without_tables(spark, fresh_cfg):
    cfg = fresh_cfg.model_copy(deep=True)
    cfg.tables.schema_name = "t_no_such_schema"
    assert leakage_counts(spark, cfg) == {k: 0 for k in LEAKAGE_METRICS}
