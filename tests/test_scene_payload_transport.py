"""The scene index shipped as a file (Spark Connect has no broadcast variables): same hits as the broadcast, one
load per worker, and a worker keeps only the latest retrieval's indexes."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from models.scene_index import build_scene_index
from udfs import runtime
from udfs.retrieval import QUERY_COLUMNS, RetrievalPlan, ScenePayload, ScenePayloadFile, retrieval_partitions


def unit_vectors(n: int, dim: int = 8, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


class Broadcast:
    """What a Spark broadcast gives the UDF: ``.value``."""

    def __init__(self, value):
        self.value = value


@pytest.fixture
def payload() -> ScenePayload:
    ids = [f"s{i}" for i in range(50)]
    index = build_scene_index(unit_vectors(50), ids)
    return ScenePayload.of({"text": index}, {sid: f"img{i % 10}" for i, sid in enumerate(ids)})


def queries(n: int = 12) -> pd.DataFrame:
    vectors = unit_vectors(n, seed=3)
    frame = pd.DataFrame({"query_id": [f"q{i}" for i in range(n)], "query_image_id": [f"img{i}" for i in range(n)],
                          "text_vector": list(vectors), "image_vector": [None] * n})
    return frame[list(QUERY_COLUMNS)]


def test_the_file_gives_the_broadcasts_hits(payload, tmp_path):
    plan = RetrievalPlan(("t2t",), 3, 0.0, True, 2)
    shipped = payload.save(tmp_path / "indexes" / "run.pkl")
    assert isinstance(shipped, ScenePayloadFile) and not list(tmp_path.rglob("*.partial"))
    via_file = pd.concat(retrieval_partitions(shipped, plan)(iter([queries()])))
    via_broadcast = pd.concat(retrieval_partitions(Broadcast(payload), plan)(iter([queries()])))
    assert len(via_file) > 0
    pd.testing.assert_frame_equal(via_file.reset_index(drop=True), via_broadcast.reset_index(drop=True))
    assert shipped.value.scene_images == payload.scene_images and shipped.value.blobs == payload.blobs


def test_a_worker_reads_the_file_once_and_keeps_only_the_latest_indexes(payload, tmp_path, monkeypatch):
    monkeypatch.setattr(runtime, "_MODELS", {})
    reads = []

    class CountingFile(ScenePayloadFile):
        @property
        def value(self):
            reads.append(self.path)
            return super().value

    plan = RetrievalPlan(("t2t",), 3, 0.0, True, 2)
    first = retrieval_partitions(CountingFile(str(payload.save(tmp_path / "a.pkl").path)), plan)
    for _ in range(3):  # three tasks of one retrieval in the same Python worker
        list(first(iter([queries()])))
    assert len(reads) == 1
    second = retrieval_partitions(CountingFile(str(payload.save(tmp_path / "b.pkl").path)), plan)
    list(second(iter([queries()])))
    kinds = [key[0] for key in runtime._MODELS]
    assert sorted(kinds) == ["scene_indexes", "scene_payload"]  # the first retrieval's entries were dropped
    assert len(reads) == 2
