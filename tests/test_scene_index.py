"""Tests of the Faiss scene index (models/scene_index.py): exactness, thresholds, recall, serialization, guards."""
from __future__ import annotations

import faiss
import numpy as np
import pandas as pd
import pytest

from models.scene_index import (
    EF_SEARCH_LADDER,
    HIT_COLUMNS,
    PAPER_SIMILARITY_THRESHOLD,
    RETRIEVAL_TYPES,
    SceneIndex,
    build_scene_index,
    default_nlist,
    recall_per_query,
    retrieval_modalities,
    tune_scene_index,
)


def unit_rows(array: np.ndarray) -> np.ndarray:
    return (array / np.linalg.norm(array, axis=1, keepdims=True)).astype(np.float32)


def uniform_sphere(rng: np.random.Generator, count: int, dim: int) -> np.ndarray:
    return unit_rows(rng.standard_normal((count, dim)))


def clustered(rng: np.random.Generator, centres: np.ndarray, count: int, spread: float = 0.5) -> np.ndarray:
    picks = centres[rng.integers(0, len(centres), count)]
    return unit_rows(picks + spread * rng.standard_normal(picks.shape))


def scene_ids(count: int) -> list[str]:
    return [f"scene-{i:05d}" for i in range(count)]


def hits_by_query(frame: pd.DataFrame, queries: int) -> list[list[str]]:
    return [frame.loc[frame.query_row == q].sort_values("rank").scene_id.tolist() for q in range(queries)]


def recall_at(approx: pd.DataFrame, exact: pd.DataFrame, queries: int, k: int) -> float:
    found = hits_by_query(approx, queries)
    truth = hits_by_query(exact, queries)
    return float(np.mean([len(set(f) & set(t)) / k for f, t in zip(found, truth)]))


def test_flat_search_equals_numpy_brute_force() -> None:
    rng = np.random.default_rng(0)
    vectors, queries = uniform_sphere(rng, 500, 24), uniform_sphere(rng, 20, 24)
    ids = scene_ids(500)
    frame = build_scene_index(vectors, ids).search(queries, top_k=10, min_similarity=-1.0)

    assert list(frame.columns) == list(HIT_COLUMNS)
    assert len(frame) == 200
    similarity = queries @ vectors.T
    for q in range(20):
        order = np.argsort(-similarity[q])[:10]
        rows = frame.loc[frame.query_row == q]
        assert rows.scene_id.tolist() == [ids[i] for i in order]
        assert rows["rank"].tolist() == list(range(1, 11))
        np.testing.assert_allclose(rows.similarity.to_numpy(), similarity[q, order], atol=1e-5)


def test_threshold_is_strict_and_top_k_is_honoured() -> None:
    rng = np.random.default_rng(1)
    centres = rng.standard_normal((5, 16))
    vectors, queries = clustered(rng, centres, 300, spread=0.3), clustered(rng, centres, 8, spread=0.3)
    index = build_scene_index(vectors, scene_ids(300))
    every = index.search(queries, top_k=5, min_similarity=-1.0)
    assert every.groupby("query_row").size().tolist() == [5] * 8

    # the threshold equal to a hit's own similarity removes that hit and keeps the strictly greater ones
    third = every.loc[(every.query_row == 0) & (every["rank"] == 3)].similarity.item()
    cut = index.search(queries[:1], top_k=5, min_similarity=float(third))
    assert cut.scene_id.tolist() == every.loc[every.query_row == 0].scene_id.tolist()[:2]
    assert (cut.similarity > third).all()

    default = index.search(queries, top_k=100)
    assert (default.similarity > PAPER_SIMILARITY_THRESHOLD).all()
    assert default.groupby("query_row").size().max() < 100
    assert len(index.search(queries, top_k=100, min_similarity=-1.0)) == 800
    # ranks run from 1 without gaps inside each query
    for _, rows in default.groupby("query_row"):
        assert rows["rank"].tolist() == list(range(1, len(rows) + 1))

    # asking for more neighbours than scenes returns every scene once
    small = build_scene_index(vectors[:4], scene_ids(4)).search(queries[:2], top_k=10, min_similarity=-1.0)
    assert small.groupby("query_row").size().tolist() == [4, 4]


def test_query_with_no_hit_above_threshold_has_no_row() -> None:
    vectors = np.eye(3, dtype=np.float32)
    queries = np.array([[1.0, 0.0, 0.0], [-1.0, 0.0, 0.0]], dtype=np.float32)
    frame = build_scene_index(vectors, ["a", "b", "c"]).search(queries, top_k=3, min_similarity=0.5)
    assert frame.to_dict("records") == [{"query_row": 0, "scene_id": "a", "similarity": pytest.approx(1.0), "rank": 1}]
    empty = build_scene_index(vectors, ["a", "b", "c"]).search(np.zeros((0, 3), np.float32), top_k=3)
    assert list(empty.columns) == list(HIT_COLUMNS) and len(empty) == 0


@pytest.mark.parametrize(
    ("index_type", "options"),
    [("ivf", {"nlist": 16, "nprobe": 12}), ("hnsw", {}), ("hnsw_sq8", {})],
)
def test_approximate_indexes_recall_on_uniform_random_vectors(index_type: str, options: dict) -> None:
    rng = np.random.default_rng(2)
    vectors, queries = uniform_sphere(rng, 2000, 32), uniform_sphere(rng, 100, 32)
    ids = scene_ids(2000)
    exact = build_scene_index(vectors, ids).search(queries, top_k=10, min_similarity=-1.0)
    approx_index = build_scene_index(vectors, ids, index_type=index_type, **options)
    approx = approx_index.search(queries, top_k=10, min_similarity=-1.0)
    assert recall_at(approx, exact, 100, 10) >= 0.9


@pytest.mark.parametrize("index_type", ["ivf", "hnsw", "hnsw_sq8"])
def test_approximate_indexes_with_defaults_recall_on_clustered_vectors(index_type: str) -> None:
    rng = np.random.default_rng(3)
    centres = rng.standard_normal((40, 32))
    vectors, queries = clustered(rng, centres, 3000), clustered(rng, centres, 100)
    ids = scene_ids(3000)
    exact = build_scene_index(vectors, ids).search(queries, top_k=10, min_similarity=-1.0)
    approx_index = build_scene_index(vectors, ids, index_type=index_type)
    assert recall_at(approx_index.search(queries, top_k=10, min_similarity=-1.0), exact, 100, 10) >= 0.9
    if index_type == "ivf":
        assert approx_index.params == {"nlist": default_nlist(3000), "nprobe": 16}
        assert default_nlist(3000) == 76


def test_with_search_params_searches_a_copy_and_leaves_the_index_as_it_was() -> None:
    rng = np.random.default_rng(5)
    vectors, queries = uniform_sphere(rng, 2000, 32), uniform_sphere(rng, 100, 32)
    ids = scene_ids(2000)
    exact = build_scene_index(vectors, ids).search(queries, top_k=10, min_similarity=-1.0)
    narrow = build_scene_index(vectors, ids, index_type="ivf", nlist=16, nprobe=1)
    before = narrow.search(queries, top_k=10, min_similarity=-1.0)
    every_list = narrow.with_search_params(nprobe=16)

    assert every_list.params == {"nlist": 16, "nprobe": 16} and narrow.params == {"nlist": 16, "nprobe": 1}
    assert recall_at(every_list.search(queries, top_k=10, min_similarity=-1.0), exact, 100, 10) == 1.0
    assert recall_at(before, exact, 100, 10) < 0.6
    pd.testing.assert_frame_equal(narrow.search(queries, top_k=10, min_similarity=-1.0), before)
    graph = build_scene_index(vectors, ids, index_type="hnsw", ef_search=16)
    assert graph.with_search_params(ef_search=64).params["ef_search"] == 64 and graph.params["ef_search"] == 16
    with pytest.raises(ValueError, match="no search parameter nlist"):
        narrow.with_search_params(nlist=32)
    with pytest.raises(ValueError, match="nprobe"):
        narrow.with_search_params(nprobe=0)


@pytest.mark.parametrize("index_type", ["flat", "ivf", "hnsw", "hnsw_sq8"])
def test_serialization_round_trip_gives_identical_results(index_type: str) -> None:
    rng = np.random.default_rng(4)
    vectors, queries = uniform_sphere(rng, 800, 16), uniform_sphere(rng, 30, 16)
    index = build_scene_index(vectors, scene_ids(800), index_type=index_type, nlist=8, nprobe=3, ef_search=20)
    blob = index.to_bytes()
    assert isinstance(blob, bytes)
    restored = SceneIndex.from_bytes(blob)

    assert (restored.index_type, restored.dim, len(restored), restored.params) == (index_type, 16, 800, index.params)
    assert restored.scene_ids.tolist() == index.scene_ids.tolist()
    pd.testing.assert_frame_equal(
        restored.search(queries, top_k=7, min_similarity=0.1), index.search(queries, top_k=7, min_similarity=0.1)
    )
    with pytest.raises(ValueError, match="not a SceneIndex blob"):
        SceneIndex.from_bytes(b"garbage" + blob)


def test_retrieval_types_map_to_query_and_target_modalities() -> None:
    assert RETRIEVAL_TYPES == {
        "i2i": ("image", "image"),
        "i2t": ("image", "text"),
        "t2i": ("text", "image"),
        "t2t": ("text", "text"),
    }
    pair = retrieval_modalities("i2t")
    assert (pair.query, pair.target) == ("image", "text")
    assert retrieval_modalities("t2i") == ("text", "image")
    with pytest.raises(ValueError, match="allowed are"):
        retrieval_modalities("x2y")


def test_bad_input_is_a_clear_value_error() -> None:
    rng = np.random.default_rng(5)
    vectors = uniform_sphere(rng, 50, 8)
    index = build_scene_index(vectors, scene_ids(50))
    with pytest.raises(ValueError, match="dimension 6"):
        index.search(uniform_sphere(rng, 2, 6))
    with pytest.raises(ValueError, match="top_k"):
        index.search(vectors[:2], top_k=0)
    with pytest.raises(ValueError, match=r"\[-1, 1\]"):
        index.search(vectors[:2], min_similarity=1.5)
    with pytest.raises(ValueError, match=r"\[-1, 1\]"):
        index.search(vectors[:2], min_similarity=-1.01)
    with pytest.raises(ValueError, match="2-D"):
        index.search(vectors[0])
    with pytest.raises(ValueError, match="L2-normalised"):
        index.search(vectors[:2] * 3)
    with pytest.raises(ValueError, match="0 vectors"):
        build_scene_index(np.zeros((0, 8), np.float32), [])
    with pytest.raises(ValueError, match="one scene id per row"):
        build_scene_index(vectors, scene_ids(49))
    with pytest.raises(ValueError, match="occurs 2 times"):
        build_scene_index(vectors[:2], ["same", "same"])
    with pytest.raises(ValueError, match="non-empty strings"):
        build_scene_index(vectors[:2], ["a", 7])
    with pytest.raises(ValueError, match="allowed are"):
        build_scene_index(vectors, scene_ids(50), index_type="lsh")
    with pytest.raises(ValueError, match="nlist=60 exceeds"):
        build_scene_index(vectors, scene_ids(50), index_type="ivf", nlist=60)
    with pytest.raises(ValueError, match="NaN"):
        build_scene_index(np.full((2, 8), np.nan, np.float32), ["a", "b"])


def test_use_gpu_moves_the_index_only_where_faiss_sees_a_gpu() -> None:
    rng = np.random.default_rng(6)
    vectors, queries = uniform_sphere(rng, 300, 16), uniform_sphere(rng, 10, 16)
    cpu = build_scene_index(vectors, scene_ids(300))
    maybe_gpu = SceneIndex.from_bytes(cpu.to_bytes(), use_gpu=True)
    assert maybe_gpu.on_gpu == (faiss.get_num_gpus() > 0)
    expected = cpu.search(queries, top_k=5, min_similarity=-1.0)
    got = maybe_gpu.search(queries, top_k=5, min_similarity=-1.0)
    assert got.scene_id.tolist() == expected.scene_id.tolist()
    np.testing.assert_allclose(got.similarity, expected.similarity, atol=1e-5)
    assert not build_scene_index(vectors, scene_ids(300), index_type="hnsw", use_gpu=True).on_gpu


def test_hnsw_is_built_with_the_configured_ef_construction() -> None:
    rng = np.random.default_rng(6)
    vectors = uniform_sphere(rng, 300, 16)
    graph = build_scene_index(vectors, scene_ids(300), index_type="hnsw", ef_construction=17, ef_search=8)
    assert graph.params == {"hnsw_m": 32, "ef_search": 8, "ef_construction": 17}
    assert graph._cpu_index.hnsw.efConstruction == 17 and graph._cpu_index.hnsw.efSearch == 8
    assert SceneIndex.from_bytes(graph.to_bytes()).params["ef_construction"] == 17
    assert build_scene_index(vectors, scene_ids(300), index_type="hnsw").params["ef_construction"] == 200
    with pytest.raises(ValueError, match="ef_construction"):
        build_scene_index(vectors, scene_ids(300), index_type="hnsw", ef_construction=0)


def test_hnsw_sq8_returns_exact_cosines_and_takes_ef_search_through_its_refine() -> None:
    """The graph walks 8-bit codes, but its candidates are re-ranked by the exact inner product: a hit's similarity
    is the float cosine, as flat search gives it."""
    rng = np.random.default_rng(6)
    vectors, queries = uniform_sphere(rng, 1500, 32), uniform_sphere(rng, 40, 32)
    index = build_scene_index(vectors, scene_ids(1500), index_type="hnsw_sq8", ef_search=64)
    hits = index.search(queries, top_k=5, min_similarity=-1.0)
    rows = hits.scene_id.str.split("-").str[1].astype(int).to_numpy()
    cosines = (queries[hits.query_row.to_numpy()] * vectors[rows]).sum(axis=1)
    np.testing.assert_allclose(hits.similarity.to_numpy(), cosines, rtol=0, atol=1e-5)
    narrow = index.with_search_params(ef_search=8)
    assert narrow.params["ef_search"] == 8 and index.params["ef_search"] == 64
    from models.scene_index import _graph

    assert _graph(narrow._cpu_index).hnsw.efSearch == 8 and _graph(index._cpu_index).hnsw.efSearch == 64
    with pytest.raises(ValueError, match="no search parameter nprobe"):
        index.with_search_params(nprobe=4)


# ------------------------------------------------------------------------------------------------ auto (tuning)
AUTO = {"nlist": 1024, "hnsw_m": 16, "ef_construction": 40, "gpu_search": False}


def exact_rows(vectors: np.ndarray, queries: np.ndarray, k: int = 10) -> np.ndarray:
    return np.argsort(-(queries @ vectors.T), axis=1, kind="stable")[:, :k]


def test_auto_keeps_exact_search_on_a_small_scene_set_without_drawing_a_sample() -> None:
    rng = np.random.default_rng(7)
    vectors = uniform_sphere(rng, 400, 16)

    def no_sample() -> np.ndarray:
        raise AssertionError("a scene set within exact_max_items must not draw the query sample")

    index, tuning = tune_scene_index(vectors, scene_ids(400), no_sample, target_recall=0.95, exact_max_items=400,
                                     min_speedup=2.0, **AUTO)
    assert (index.index_type, tuning.index_type, tuning.reason, tuning.fallback) == ("flat", "flat", "small", False)
    assert (tuning.recall_at_k, tuning.search_param, tuning.sample_queries, tuning.scenes) == (1.0, "none", 0, 400)
    assert len(index) == 400


def test_auto_picks_an_approximate_setting_that_meets_the_target_on_held_out_queries() -> None:
    rng = np.random.default_rng(8)
    centres = rng.standard_normal((50, 32))
    vectors = clustered(rng, centres, 4000, spread=1.5)
    sample, held = clustered(rng, centres, 400, spread=1.5), clustered(rng, centres, 400, spread=1.5)
    index, tuning = tune_scene_index(vectors, scene_ids(4000), sample, target_recall=0.95, exact_max_items=1000,
                                     min_speedup=0, **AUTO)

    assert tuning.reason == "target_met" and not tuning.fallback
    assert index.index_type == tuning.index_type == "hnsw"  # min_speedup 0: the first candidate meeting it
    assert index.params == {"hnsw_m": 16, "ef_construction": 40, "ef_search": tuning.params["ef_search"]}
    assert tuning.search_param == f"ef_search={index.params['ef_search']}"
    assert tuning.recall_at_k >= 0.95 and tuning.sample_queries == 400
    # the ladder was walked from its cheapest rung up to the first whose lower bound met the target
    hnsw = [t for t in tuning.trials if t.index_type == "hnsw"]
    assert [t.params["ef_search"] for t in hnsw] == list(EF_SEARCH_LADDER[:len(hnsw)])
    assert hnsw[-1].recall_lower_bound >= 0.95 and all(t.recall_lower_bound < 0.95 for t in hnsw[:-1])
    # the IVF ladder ends at nlist (every list scanned), so IVF too met the target, at its own nprobe
    ivf = [t for t in tuning.trials if t.index_type == "ivf"]
    assert ivf and ivf[-1].recall_lower_bound >= 0.95 and ivf[-1].params["nlist"] == 4000 // 39
    # the recall holds on queries the tuning never saw, through the index the job ships
    restored = SceneIndex.from_bytes(index.to_bytes())
    hits = restored.search(held, top_k=10, min_similarity=-1.0)
    approx = np.array([[int(s.split("-")[1]) for s in row] for row in hits_by_query(hits, 400)])
    assert recall_per_query(exact_rows(vectors, held), approx).mean() >= 0.95
    # a lower target is met no later on the ladder
    _, loose = tune_scene_index(vectors, scene_ids(4000), sample, target_recall=0.5, exact_max_items=1000,
                                min_speedup=0, **AUTO)
    assert loose.params["ef_search"] <= tuning.params["ef_search"]


def test_auto_for_a_gpu_search_tries_ivf_alone_and_without_a_sample_falls_back_to_exact() -> None:
    rng = np.random.default_rng(9)
    centres = rng.standard_normal((30, 16))
    vectors, sample = clustered(rng, centres, 2000), clustered(rng, centres, 200)
    index, tuning = tune_scene_index(vectors, scene_ids(2000), sample, target_recall=0.9, exact_max_items=100,
                                     min_speedup=2.0, **{**AUTO, "gpu_search": True})
    assert tuning.index_type == index.index_type == "ivf" and {t.index_type for t in tuning.trials} == {"ivf"}
    assert tuning.speedup_vs_exact is None  # CPU timings say nothing of a GPU search: none decided
    assert not index.on_gpu  # built on the driver's CPU; SceneIndex.from_bytes(use_gpu=True) moves it

    index, tuning = tune_scene_index(vectors, scene_ids(2000), np.empty((0, 0), np.float32), target_recall=0.9,
                                     exact_max_items=100, min_speedup=2.0, **AUTO)
    assert (index.index_type, tuning.reason, tuning.fallback) == ("flat", "no_sample", True)
    with pytest.raises(ValueError, match="dimension 8"):
        tune_scene_index(vectors, scene_ids(2000), uniform_sphere(rng, 5, 8), target_recall=0.9,
                         exact_max_items=100, min_speedup=2.0, **AUTO)
    with pytest.raises(ValueError, match="target_recall"):
        tune_scene_index(vectors, scene_ids(2000), sample, target_recall=1.5, exact_max_items=100, min_speedup=2.0,
                         **AUTO)


def test_recall_per_query_counts_shared_rows_and_ignores_missing() -> None:
    exact = np.array([[1, 2, 3], [4, 5, -1]])
    approx = np.array([[3, 9, 1], [5, 4, 7]])
    np.testing.assert_allclose(recall_per_query(exact, approx), [2 / 3, 1.0])
