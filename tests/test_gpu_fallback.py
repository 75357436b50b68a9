"""Nothing silent on GPU, without Spark or a GPU: ``use_gpu`` where Faiss cannot search on one is recorded by the scene
index and counted by the retrieve job (``index.faiss_gpu_fallback``), or raised with ``gpu_fallback: error``; a task
that Spark gave a GPU on a worker whose torch sees none fails instead of running on CPU, and an error in the task
context is not swallowed. Here faiss-cpu is installed (``faiss.get_num_gpus() == 0``); a GPU Faiss is faked where a
test needs one.
"""
from __future__ import annotations

import sys

import faiss
import numpy as np
import pytest

from jobs.platform.config import ConfigError, IndexConf, load_config
from models.scene_index import (
    FaissGpuUnavailableError,
    SceneIndex,
    build_scene_index,
    faiss_gpu_fallback_reason,
)
from udfs.retrieval import RetrievalPlan, ScenePayload
from udfs.runtime import task_device


def unit_vectors(n: int, dim: int = 8, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


IDS = [f"s{i}" for i in range(40)]


@pytest.fixture
def fake_gpu_faiss(monkeypatch):
    """A Faiss that claims GPU support and one GPU; 'moving' an index to it clones it."""
    monkeypatch.setattr(faiss, "StandardGpuResources", object, raising=False)
    monkeypatch.setattr(faiss, "get_num_gpus", lambda: 1)
    monkeypatch.setattr(faiss, "index_cpu_to_all_gpus", lambda index: faiss.clone_index(index))


# ------------------------------------------------------------------------------------------- the scene index
@pytest.mark.skipif(hasattr(faiss, "StandardGpuResources"), reason="a GPU Faiss is installed here")
def test_use_gpu_without_gpu_faiss_falls_back_to_cpu_recorded():
    index = build_scene_index(unit_vectors(40), IDS, use_gpu=True)
    assert not index.on_gpu
    assert "faiss-cpu" in index.gpu_fallback_reason and "faiss-gpu" in index.gpu_fallback_reason
    assert build_scene_index(unit_vectors(40), IDS).gpu_fallback_reason is None  # no GPU asked for: no fallback
    rebuilt = SceneIndex.from_bytes(index.to_bytes(), use_gpu=True)
    assert rebuilt.gpu_fallback_reason == index.gpu_fallback_reason
    hits = rebuilt.search(unit_vectors(3, seed=1), top_k=2, min_similarity=-1.0)
    assert len(hits) == 6  # it still searches, on CPU


@pytest.mark.skipif(hasattr(faiss, "StandardGpuResources"), reason="a GPU Faiss is installed here")
def test_use_gpu_without_gpu_faiss_raises_when_fallback_is_an_error():
    with pytest.raises(FaissGpuUnavailableError, match=r"faiss-cpu.*retrieve\.index\.gpu_fallback"):
        build_scene_index(unit_vectors(40), IDS, use_gpu=True, gpu_fallback="error")
    blob = build_scene_index(unit_vectors(40), IDS).to_bytes()
    with pytest.raises(FaissGpuUnavailableError):
        ScenePayload({"text": blob}).indexes(use_gpu=True, gpu_fallback="error")
    assert ScenePayload({"text": blob}).indexes(use_gpu=True, gpu_fallback="cpu")["text"].gpu_fallback_reason  # recorded
    with pytest.raises(ValueError, match="gpu_fallback must be one of"):
        build_scene_index(unit_vectors(40), IDS, gpu_fallback="silent")
    with pytest.raises(ValueError, match="gpu_fallback must be one of"):
        RetrievalPlan(("t2t",), 3, 0.6, use_gpu=True, gpu_fallback="silent")


def test_with_a_gpu_faiss_flat_goes_to_gpu_and_hnsw_is_a_recorded_fallback(fake_gpu_faiss):
    flat = build_scene_index(unit_vectors(40), IDS, use_gpu=True, gpu_fallback="error")
    assert flat.on_gpu and flat.gpu_fallback_reason is None
    assert faiss_gpu_fallback_reason("ivf") is None
    hnsw = build_scene_index(unit_vectors(40), IDS, index_type="hnsw", use_gpu=True)
    assert not hnsw.on_gpu and "no GPU HNSW" in hnsw.gpu_fallback_reason
    with pytest.raises(FaissGpuUnavailableError, match="no GPU HNSW"):
        build_scene_index(unit_vectors(40), IDS, index_type="hnsw", use_gpu=True, gpu_fallback="error")


def test_gpu_faiss_without_a_device_is_named(monkeypatch):
    monkeypatch.setattr(faiss, "StandardGpuResources", object, raising=False)
    monkeypatch.setattr(faiss, "get_num_gpus", lambda: 0)
    assert "sees no GPU" in faiss_gpu_fallback_reason("flat")


# ------------------------------------------------------------------------------------------ the retrieve job
@pytest.mark.skipif(hasattr(faiss, "StandardGpuResources"), reason="a GPU Faiss is installed here")
def test_retrieve_counts_the_faiss_gpu_fallback_or_fails_naming_the_fix():
    from jobs.platform.errors import UserError
    from jobs.retrieve import faiss_gpu_fallbacks

    types_ = {"text": "flat", "image": "ivf"}
    assert faiss_gpu_fallbacks(types_, IndexConf()) == {}  # use_gpu false: nothing to fall back from
    fallbacks = faiss_gpu_fallbacks(types_, IndexConf(use_gpu=True))
    assert set(fallbacks) == {"text", "image"} and all("faiss-cpu" in r for r in fallbacks.values())
    with pytest.raises(UserError) as raised:
        faiss_gpu_fallbacks(types_, IndexConf(use_gpu=True, gpu_fallback="error"))
    problem, fix = raised.value.lines()
    assert "retrieve.index.use_gpu is true" in problem and "faiss-cpu" in problem
    assert "retrieve.index.use_gpu=false" in fix and "retrieve.index.gpu_fallback=cpu" in fix


def test_gpu_fallback_is_a_validated_conf_key():
    cfg = load_config("test")
    assert cfg.retrieve.index.gpu_fallback == "cpu"
    assert load_config("test", ["retrieve.index.gpu_fallback=error"]).retrieve.index.gpu_fallback == "error"
    with pytest.raises(ConfigError, match="gpu_fallback"):
        load_config("test", ["retrieve.index.gpu_fallback=silent"])
    assert "faiss_gpu_fallback" in IndexConf.model_fields["gpu_fallback"].description


# ----------------------------------------------------------------------------------- the device of a UDF task
class _Resource:
    def __init__(self, *addresses: str) -> None:
        self.addresses = list(addresses)


class _Context:
    def __init__(self, resources=None, error: Exception | None = None) -> None:
        self._resources, self._error = resources or {}, error

    def resources(self):
        if self._error is not None:
            raise self._error
        return self._resources


def _in_task(monkeypatch, context) -> None:
    import pyspark

    monkeypatch.setattr(pyspark.TaskContext, "get", classmethod(lambda cls: context))


def test_task_device_outside_a_spark_task_is_the_preferred_device(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _in_task(monkeypatch, None)
    assert task_device("auto") == "cpu"
    _in_task(monkeypatch, _Context({}))  # a task that claims no GPU
    assert task_device("auto") == "cpu"
    monkeypatch.setitem(sys.modules, "pyspark", None)  # no pyspark at all
    assert task_device("auto") == "cpu"


def test_task_given_a_gpu_that_torch_cannot_see_fails_naming_the_fix(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _in_task(monkeypatch, _Context({"gpu": _Resource("1")}))
    with pytest.raises(RuntimeError, match=r"Spark assigned GPU 1 to this task.*sees no CUDA.*device to cpu"):
        task_device("auto")
    assert task_device("cpu") == "cpu"  # the CPU asked for explicitly


def test_task_device_takes_the_gpu_spark_assigned(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    _in_task(monkeypatch, _Context({"gpu": _Resource("3")}))
    assert task_device("auto") == "cuda:1"


def test_an_error_in_the_task_context_is_not_swallowed(monkeypatch):
    _in_task(monkeypatch, _Context(error=KeyError("resources broke")))
    with pytest.raises(KeyError, match="resources broke"):
        task_device("auto")
