"""benchmarks/scale.py's retrieval_real part at a tiny size: scenes and queries built from real-shaped vectors,
exact search, the product's auto choice and the ladder sweep."""
from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

pytest.importorskip("faiss")

from benchmarks.scale import jittered, retrieval_real  # noqa: E402


def unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def test_jittered_copies_keep_the_sources_and_report_their_cosine() -> None:
    rng = np.random.default_rng(0)
    sources = unit(rng.standard_normal((50, 64)))
    scenes, cosine = jittered(rng, sources, 120, 0.02, keep_sources=True)
    assert scenes.shape == (120, 64) and np.array_equal(scenes[:50], sources)
    np.testing.assert_allclose(np.linalg.norm(scenes, axis=1), 1.0, atol=1e-5)
    copies = (scenes[50:] * sources[np.arange(50, 120) % 50]).sum(1)
    assert cosine == pytest.approx(float(copies.mean()), abs=1e-6) and 0.9 < cosine < 1.0
    queries, query_cosine = jittered(rng, sources, 100, 0.02, keep_sources=False)
    assert not np.array_equal(queries[:50], sources) and 0.9 < query_cosine < 1.0


def test_retrieval_real_reports_the_auto_choice_against_exact_search(tmp_path) -> None:
    rng = np.random.default_rng(1)
    centres = rng.standard_normal((40, 48))
    scenes = unit(centres[rng.integers(0, 40, 1500)] + 1.2 * rng.standard_normal((1500, 48)))
    queries = unit(centres[rng.integers(0, 40, 600)] + 1.2 * rng.standard_normal((600, 48)))
    real = {"scenes": scenes, "queries": queries, "encoder_version": "v1", "reader": "test",
            "stylized_captions": 1000, "scene_descriptions": 500, "factual_captions": 600}
    args = argparse.Namespace(real_scenes=3000, real_queries=6000, scene_jitter=0.02, jitter=0.02,
                              recall_queries=1000, exact_queries=3000, exact_max_items=1000, min_speedup=0.0,
                              sweep_time_queries=2000, sweep_stop_recall=0.99, seed=0, home=tmp_path)
    result = retrieval_real(args, real)

    assert (result["scenes"], result["queries"], result["recall_queries"]) == (3000, 6000, 1000)
    assert result["exact"]["scaled_linearly"] and result["exact"]["timed_queries"] == 3000
    assert 0.95 < result["mean_cosine_to_source"] < 1.0 and result["jitter_sigma"] == 0.02
    auto = result["auto"]
    assert auto["reason"] == "target_met" and auto["index_type"] == "hnsw" and not auto["fallback"]
    assert auto["sample_recall_at_10"] >= 0.95 and auto["tune_s"] > 0 and auto["speedup_vs_exact"] > 0
    # the recall on held queries the tuning never saw meets the target too, and is what the top level reports
    assert result["recall_at_10"] == auto["recall_at_10"] >= 0.95
    assert result["chosen"] == f"hnsw{auto['params']['hnsw_m']}/efc{auto['params']['ef_construction']}/" \
                               f"ef{auto['params']['ef_search']}"
    sweep = result["sweep"]["settings"]
    assert {e["kind"] for e in sweep.values()} == {"hnsw", "hnsw_sq8", "ivf"}
    assert all(0.0 <= e["recall_at_10"] <= 1.0 and e["speedup_vs_exact"] > 0 for e in sweep.values())
    assert result["sweep"]["fastest_meeting_target"] in sweep
    # exact and chosen timed in turn on one subset: two turns each, and the speedup is the ratio of their sums
    turns = result["interleaved"]
    assert len(turns["exact_s"]) == len(turns["chosen_s"]) == 2 and turns["queries"] > 0
    assert turns["speedup_vs_exact"] == pytest.approx(sum(turns["exact_s"]) / sum(turns["chosen_s"]))
    json.dumps(result)  # what scale.json stores
