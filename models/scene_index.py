"""The Faiss index of stylized scenes (ERG step 2, Retrieve).

Every stylized scene of D_s is embedded once per modality (its image, its stylized caption) by a
``models.encoders.SceneEncoder``; the vectors of one target modality go into a ``SceneIndex`` that is
built once on the driver, serialized with :meth:`SceneIndex.to_bytes` into one blob for a Spark
broadcast, and rebuilt on each executor with :meth:`SceneIndex.from_bytes`.

Vectors are L2-normalised, so the inner product Faiss computes is the cosine similarity of the paper.
Four index types:

- ``flat``: exact search (``IndexFlatIP``); the reference, and fast enough for the tens of thousands of
  stylized scenes the public corpora hold.
- ``ivf``: ``IVF<nlist>,Flat`` with inner product, trained on the scene vectors; ``nprobe`` lists are
  scanned per query.
- ``hnsw``: ``IndexHNSWFlat`` with ``METRIC_INNER_PRODUCT``, ``hnsw_m`` links per node, built with
  ``ef_construction`` candidates per insertion, ``ef_search`` candidates per query.
- ``hnsw_sq8``: the same graph over the vectors quantized to 8 bits a component (``IndexHNSWSQ``, ``QT_8bit``: a
  quarter of the bytes to fetch per visited node), its top ``REFINE_K_FACTOR * k`` re-ranked by the exact inner
  product (``IndexRefineFlat``), so the scores it returns are exact cosines.

:func:`tune_scene_index` chooses among them from a target recall (the ``auto`` index type): exact ``flat`` up to
``exact_max_items`` scenes; beyond, each candidate index is built once and searched with a sample of the real
queries at rising ``ef_search`` / ``nprobe``, and the fastest setting whose recall@k against exact search on that
sample meets the target (its one-sided 95% lower bound, so that it holds on other queries too) is kept, unless
it searches the sample less than ``min_speedup`` times faster than exact search (then exact search, which is as
fast). Where no setting meets the target, exact search is kept and :attr:`IndexTuning.fallback` says so.

Rows map to scene ids through an id array stored next to the Faiss index (scene ids are strings, which
``IndexIDMap``'s int64 ids cannot carry).

``use_gpu`` never falls back silently: where the index cannot go to a GPU (a Faiss build without GPU support, no
device, or an HNSW index, which Faiss has only on CPU) :func:`faiss_gpu_fallback_reason` says why; the index then
either searches on CPU and records the reason in :attr:`SceneIndex.gpu_fallback_reason` (``gpu_fallback="cpu"``,
with a WARNING; the retrieve job counts it as a metric) or raises :class:`FaissGpuUnavailableError`
(``gpu_fallback="error"``).

The four retrieval types of the paper (i2i, i2t, t2i, t2t) name the query modality, taken from the
factual pair, and the target modality, taken from the stylized set: :data:`RETRIEVAL_TYPES`.
"""
from __future__ import annotations

import json
import logging
import math
import struct
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Callable, NamedTuple, Sequence

import numpy as np
import pandas as pd

try:
    import faiss
except ImportError as err:  # not a base requirement of the wheel: the CPU or the GPU build is chosen per cluster
    raise ImportError(f"Faiss is not installed ({err}): pip install 'erg-on-spark[cpu]' (faiss-cpu), or "
                      "'erg-on-spark[gpu]' (faiss-gpu-cu12) on a CUDA 12 GPU cluster") from err

logger = logging.getLogger(__name__)

MODALITIES: tuple[str, ...] = ("image", "text")
RETRIEVAL_TYPES: dict[str, tuple[str, str]] = {
    "i2i": ("image", "image"),
    "i2t": ("image", "text"),
    "t2i": ("text", "image"),
    "t2t": ("text", "text"),
}
"""Retrieval type -> (query modality of the factual pair, target modality in the stylized set)."""

INDEX_TYPES: tuple[str, ...] = ("flat", "ivf", "hnsw", "hnsw_sq8")
HNSW_TYPES: tuple[str, ...] = ("hnsw", "hnsw_sq8")
"""The graph indexes: built with ``hnsw_m`` / ``ef_construction``, searched with ``ef_search``; CPU only."""
SEARCH_PARAMS: dict[str, str] = {"ivf": "nprobe", "hnsw": "ef_search", "hnsw_sq8": "ef_search"}
"""Each approximate index type's search parameter (flat has none)."""
REFINE_K_FACTOR = 2
"""``hnsw_sq8`` re-ranks this many times k quantized candidates by the exact inner product."""
GPU_FALLBACKS: tuple[str, ...] = ("cpu", "error")
"""What ``use_gpu`` does where the index cannot go to a GPU: search on CPU (recorded), or raise."""
PAPER_SIMILARITY_THRESHOLD = 0.6
"""The paper keeps a retrieved scene only if its cosine similarity is > 0.6."""

HIT_COLUMNS: tuple[str, ...] = ("query_row", "scene_id", "similarity", "rank")
_BLOB_MAGIC = b"ERGSIDX1"
_NORM_TOLERANCE = 1e-3


class FaissGpuUnavailableError(RuntimeError):
    """``use_gpu`` was asked for with ``gpu_fallback="error"``, and the scene index cannot search on a GPU here."""


def faiss_gpu_fallback_reason(index_type: str) -> str | None:
    """Why a ``use_gpu`` scene index of ``index_type`` would search on CPU on this machine; None when it goes to
    the GPU(s)."""
    if not hasattr(faiss, "StandardGpuResources"):
        return ("this Faiss build has no GPU support (faiss-cpu is installed): install faiss-gpu "
                "(the wheel's [gpu] extra, faiss-gpu-cu12) on the GPU machines")
    if faiss.get_num_gpus() == 0:
        return "Faiss (with GPU support) sees no GPU on this machine (no CUDA device, or CUDA_VISIBLE_DEVICES is empty)"
    if index_type in HNSW_TYPES:
        return "Faiss has no GPU HNSW index: use index type flat or ivf for a GPU search"
    return None


def _gpu_fallback_policy(value: str) -> str:
    if value not in GPU_FALLBACKS:
        raise ValueError(f"gpu_fallback must be one of {list(GPU_FALLBACKS)}, got {value!r}")
    return value


class ModalityPair(NamedTuple):
    """Which embedding to query with (factual side) and which to index (stylized side)."""

    query: str
    target: str


def retrieval_modalities(retrieval_type: str) -> ModalityPair:
    """The (query, target) modalities of a retrieval type: ``"i2t"`` -> ``("image", "text")``.

    The query embedding comes from the factual pair (its image or its caption); the index holds the
    stylized scenes' embeddings of the target modality.
    """
    if retrieval_type not in RETRIEVAL_TYPES:
        raise ValueError(f"unknown retrieval type {retrieval_type!r}: allowed are {sorted(RETRIEVAL_TYPES)}")
    return ModalityPair(*RETRIEVAL_TYPES[retrieval_type])


def _unit_vectors(vectors: np.ndarray, what: str, dim: int | None = None) -> np.ndarray:
    """``vectors`` as a C-contiguous float32 [n, d] array of finite unit vectors, or a ValueError."""
    array = np.asarray(vectors)
    if array.ndim != 2:
        raise ValueError(
            f"{what} must be a 2-D array [n, dim], got shape {array.shape} (use .reshape(1, -1) for one vector)"
        )
    if not np.issubdtype(array.dtype, np.floating):
        raise ValueError(f"{what} must hold floats, got dtype {array.dtype}")
    array = np.ascontiguousarray(array, dtype=np.float32)
    if dim is not None and array.shape[1] != dim:
        raise ValueError(f"{what} have dimension {array.shape[1]} but the scene index holds dimension {dim}")
    if array.size and not np.isfinite(array).all():
        raise ValueError(f"{what} contain NaN or infinite values")
    if array.shape[0]:
        norms = np.linalg.norm(array, axis=1)
        bad = np.flatnonzero(np.abs(norms - 1.0) > _NORM_TOLERANCE)
        if bad.size:
            raise ValueError(
                f"{what} must be L2-normalised (inner product = cosine similarity); row {int(bad[0])} has norm "
                f"{norms[bad[0]]:.4f} ({bad.size} rows off); the encoders return unit vectors"
            )
    return array


def _scene_id_array(scene_ids: Sequence[str] | np.ndarray, count: int) -> np.ndarray:
    """Scene ids as an object array of distinct, non-empty strings, one per vector row."""
    ids = list(np.asarray(scene_ids, dtype=object).ravel()) if isinstance(scene_ids, np.ndarray) else list(scene_ids)
    if len(ids) != count:
        raise ValueError(f"got {len(ids)} scene ids for {count} vectors: give exactly one scene id per row")
    for row, scene_id in enumerate(ids):
        if not isinstance(scene_id, str) or not scene_id:
            raise ValueError(f"scene_ids[{row}] is {scene_id!r}: scene ids must be non-empty strings")
    if len(set(ids)) != len(ids):
        duplicate, times = Counter(ids).most_common(1)[0]
        raise ValueError(f"scene id {duplicate!r} occurs {times} times: each scene goes into the index once")
    return np.array([str(s) for s in ids], dtype=object)


def _positive_int(value: int, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def default_nlist(count: int) -> int:
    """IVF list count for ``count`` scenes: about 4*sqrt(n), with at least 39 training points per list."""
    return max(1, min(int(round(4 * math.sqrt(count))), count // 39))


def _apply_search_params(index: faiss.Index, index_type: str, params: dict[str, int]) -> None:
    if index_type == "ivf":
        faiss.extract_index_ivf(index).nprobe = params["nprobe"]
    elif index_type in HNSW_TYPES:
        _graph(index).hnsw.efSearch = params["ef_search"]


def _graph(index: faiss.Index) -> faiss.IndexHNSW:
    """The HNSW index of an ``hnsw`` (itself) or ``hnsw_sq8`` (the base of its refine) index."""
    return faiss.downcast_index(index.base_index) if isinstance(index, faiss.IndexRefine) else index


def _hnsw_index(index_type: str, dim: int, hnsw_m: int, ef_construction: int, array: np.ndarray) -> faiss.Index:
    """An ``hnsw`` or ``hnsw_sq8`` index of ``array`` (trained, filled)."""
    if index_type == "hnsw":
        index = faiss.IndexHNSWFlat(dim, hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = ef_construction
        index.add(array)
        return index
    graph = faiss.IndexHNSWSQ(dim, faiss.ScalarQuantizer.QT_8bit, hnsw_m, faiss.METRIC_INNER_PRODUCT)
    graph.hnsw.efConstruction = ef_construction
    index = faiss.IndexRefineFlat(graph)
    index.k_factor = REFINE_K_FACTOR
    index.train(array)
    index.add(array)
    return index


class SceneIndex:
    """A Faiss inner-product index over unit vectors of stylized scenes, with their scene ids.

    Build it with :func:`build_scene_index`; query it with :meth:`search`; ship it to executors with
    :meth:`to_bytes` / :meth:`from_bytes`. ``use_gpu`` moves a flat or IVF index to every GPU Faiss sees; where it
    cannot (:func:`faiss_gpu_fallback_reason`), ``gpu_fallback="cpu"`` searches on CPU and records why in
    :attr:`gpu_fallback_reason`, ``gpu_fallback="error"`` raises :class:`FaissGpuUnavailableError`.
    """

    gpu_fallback_reason: str | None
    """Why this index searches on CPU although ``use_gpu`` was asked for; None when it was not, or it is on GPU."""

    def __init__(
        self,
        index: faiss.Index,
        scene_ids: np.ndarray,
        index_type: str,
        params: dict[str, int],
        use_gpu: bool = False,
        gpu_fallback: str = "cpu",
    ) -> None:
        if index.ntotal != len(scene_ids):
            raise ValueError(f"the Faiss index holds {index.ntotal} vectors but {len(scene_ids)} scene ids were given")
        self._cpu_index = index
        self.scene_ids = scene_ids
        self.index_type = index_type
        self.params = dict(params)
        _gpu_fallback_policy(gpu_fallback)
        _apply_search_params(index, index_type, self.params)
        self.gpu_fallback_reason = None
        self._use_gpu = use_gpu
        self._gpu_fallback = gpu_fallback
        self._search_index = self._to_gpu(index, gpu_fallback) if use_gpu else index

    def with_search_params(self, **changes: int) -> "SceneIndex":
        """This index searched with other search parameters: ``nprobe`` for ``ivf``, ``ef_search`` for ``hnsw``.

        The result holds a copy of the Faiss index (trained lists or built graph included, nothing is rebuilt), so
        this index keeps searching with its own parameters. Build parameters (``nlist``, ``hnsw_m``,
        ``ef_construction``) cannot change.
        """
        allowed = {SEARCH_PARAMS[self.index_type]} if self.index_type in SEARCH_PARAMS else set()
        unknown = sorted(set(changes) - allowed)
        if unknown:
            raise ValueError(
                f"a {self.index_type} scene index has no search parameter {', '.join(unknown)}; it has "
                f"{', '.join(sorted(allowed)) or 'none'} (build parameters need build_scene_index)"
            )
        params = {**self.params, **{name: _positive_int(value, name) for name, value in changes.items()}}
        return SceneIndex(faiss.clone_index(self._cpu_index), self.scene_ids, self.index_type, params,
                          use_gpu=self._use_gpu, gpu_fallback=self._gpu_fallback)

    def _to_gpu(self, index: faiss.Index, gpu_fallback: str) -> faiss.Index:
        reason = faiss_gpu_fallback_reason(self.index_type)
        if reason is not None:
            if gpu_fallback == "error":
                raise FaissGpuUnavailableError(
                    f"use_gpu was asked for the {self.index_type} scene index, but {reason}; or search on CPU: "
                    f"use_gpu=False, or gpu_fallback='cpu' (erg conf: retrieve.index.use_gpu / "
                    f"retrieve.index.gpu_fallback)"
                )
            self.gpu_fallback_reason = reason
            logger.warning("use_gpu asked for, but the %s scene index searches on CPU: %s", self.index_type, reason)
            return index
        gpus = faiss.get_num_gpus()
        logger.info("moving the %s scene index to %d GPU(s)", self.index_type, gpus)
        return faiss.index_cpu_to_all_gpus(index)

    @property
    def dim(self) -> int:
        """Dimension of the scene vectors."""
        return int(self._cpu_index.d)

    @property
    def faiss_index(self) -> faiss.Index:
        """The Faiss index searches run on (a GPU copy where :attr:`on_gpu`), for callers that want raw rows."""
        return self._search_index

    @property
    def on_gpu(self) -> bool:
        """Whether searches run on a GPU copy of the index."""
        return self._search_index is not self._cpu_index

    def __len__(self) -> int:
        return int(self._cpu_index.ntotal)

    def search(
        self,
        queries: np.ndarray,
        top_k: int = 10,
        min_similarity: float = PAPER_SIMILARITY_THRESHOLD,
    ) -> pd.DataFrame:
        """The top-k scenes of each query whose cosine similarity is strictly greater than ``min_similarity``.

        ``queries`` is a float32 [n_queries, dim] array of unit vectors. Returns one row per hit with the
        columns ``query_row`` (row of ``queries``), ``scene_id``, ``similarity`` (cosine, clipped to
        [-1, 1]) and ``rank`` (1 = most similar, counted over the hits kept), ordered by query row, then
        rank. A query with no hit above the threshold has no row. ``min_similarity`` defaults to the
        paper's 0.6; pass -1.0 to keep every top-k neighbour but exact opposites.
        """
        top_k = _positive_int(top_k, "top_k")
        if isinstance(min_similarity, bool) or not isinstance(min_similarity, (int, float, np.floating)):
            raise ValueError(f"min_similarity must be a number in [-1, 1], got {min_similarity!r}")
        if not -1.0 <= float(min_similarity) <= 1.0:
            raise ValueError(f"min_similarity must lie in [-1, 1] (cosine similarity), got {min_similarity}")
        query_array = _unit_vectors(queries, "queries", dim=self.dim)
        k = min(top_k, len(self))
        if query_array.shape[0] == 0:
            empty = np.empty(0, np.int64)
            return _hit_frame(empty, np.empty(0, object), np.empty(0, np.float32), empty)
        similarities, rows = self._search_index.search(query_array, k)
        keep = (rows >= 0) & (similarities > float(min_similarity))
        ranks = np.cumsum(keep, axis=1)
        query_rows = np.broadcast_to(np.arange(query_array.shape[0])[:, None], rows.shape)
        return _hit_frame(
            query_rows[keep].astype(np.int64),
            self.scene_ids[rows[keep]],
            np.clip(similarities[keep], -1.0, 1.0).astype(np.float32),
            ranks[keep].astype(np.int64),
        )

    def to_bytes(self) -> bytes:
        """One self-describing blob (header, scene ids, ``faiss.serialize_index``) for a Spark broadcast."""
        header = json.dumps(
            {"index_type": self.index_type, "dim": self.dim, "params": self.params, "scene_ids": list(self.scene_ids)}
        ).encode("utf-8")
        faiss_bytes = faiss.serialize_index(self._cpu_index).tobytes()
        return _BLOB_MAGIC + struct.pack("<Q", len(header)) + header + faiss_bytes

    @classmethod
    def from_bytes(cls, blob: bytes, use_gpu: bool = False, gpu_fallback: str = "cpu") -> "SceneIndex":
        """Rebuild a :class:`SceneIndex` from :meth:`to_bytes`; ``use_gpu`` and ``gpu_fallback`` as in
        :func:`build_scene_index`."""
        view = memoryview(blob)
        start = len(_BLOB_MAGIC) + 8
        if len(view) < start or bytes(view[: len(_BLOB_MAGIC)]) != _BLOB_MAGIC:
            raise ValueError(
                "not a SceneIndex blob: it does not start with the ERGSIDX1 header (made by SceneIndex.to_bytes)"
            )
        (header_length,) = struct.unpack("<Q", view[len(_BLOB_MAGIC) : start])
        header = json.loads(bytes(view[start : start + header_length]).decode("utf-8"))
        index = faiss.deserialize_index(np.frombuffer(view[start + header_length :], dtype=np.uint8))
        scene_ids = np.array(header["scene_ids"], dtype=object)
        return cls(index, scene_ids, header["index_type"], header["params"], use_gpu=use_gpu,
                   gpu_fallback=gpu_fallback)


def _hit_frame(
    query_rows: np.ndarray, scene_ids: np.ndarray, similarities: np.ndarray, ranks: np.ndarray
) -> pd.DataFrame:
    return pd.DataFrame(
        {"query_row": query_rows, "scene_id": scene_ids, "similarity": similarities, "rank": ranks},
        columns=list(HIT_COLUMNS),
    )


def build_scene_index(
    vectors: np.ndarray,
    scene_ids: Sequence[str] | np.ndarray,
    index_type: str = "flat",
    nlist: int | None = None,
    nprobe: int = 16,
    hnsw_m: int = 32,
    ef_search: int = 128,
    ef_construction: int = 200,
    use_gpu: bool = False,
    gpu_fallback: str = "cpu",
) -> SceneIndex:
    """Index the unit vectors of the stylized scenes of one target modality under their scene ids.

    ``vectors``: float32 [n, d] L2-normalised (as every ``SceneEncoder`` returns them); ``scene_ids``:
    n distinct strings, row i naming the scene of ``vectors[i]``. ``index_type``: ``flat`` (exact),
    ``ivf`` (``nlist`` lists, default :func:`default_nlist`, ``nprobe`` scanned per query, capped at
    ``nlist``), ``hnsw`` (``hnsw_m`` links per node, ``ef_construction`` candidates per insertion while it is
    built: Faiss's default is 40, a larger one builds a better graph at the same search cost; ``ef_search``
    candidates per query) or ``hnsw_sq8`` (the same over 8-bit quantized vectors, re-ranked exactly).
    ``use_gpu`` moves the flat or IVF index to every GPU with ``faiss.index_cpu_to_all_gpus`` when
    faiss-gpu sees one (``faiss.get_num_gpus() > 0``); otherwise (or for ``hnsw`` / ``hnsw_sq8``) ``gpu_fallback="cpu"``
    searches on CPU and records why in :attr:`SceneIndex.gpu_fallback_reason`, and ``gpu_fallback="error"``
    raises :class:`FaissGpuUnavailableError`.
    """
    if index_type not in INDEX_TYPES:
        raise ValueError(f"unknown index_type {index_type!r}: allowed are {list(INDEX_TYPES)}")
    _gpu_fallback_policy(gpu_fallback)
    array = _unit_vectors(vectors, "scene vectors")
    count, dim = array.shape
    if count == 0:
        raise ValueError("cannot build a scene index from 0 vectors: embed the stylized scenes first")
    if dim == 0:
        raise ValueError("scene vectors have dimension 0")
    ids = _scene_id_array(scene_ids, count)
    params: dict[str, int] = {}
    if index_type == "flat":
        index = faiss.IndexFlatIP(dim)
        index.add(array)
    elif index_type == "ivf":
        lists = default_nlist(count) if nlist is None else _positive_int(nlist, "nlist")
        if lists > count:
            raise ValueError(
                f"nlist={lists} exceeds the {count} scene vectors: IVF training needs at least nlist vectors"
            )
        params = {"nlist": lists, "nprobe": min(_positive_int(nprobe, "nprobe"), lists)}
        index = faiss.index_factory(dim, f"IVF{lists},Flat", faiss.METRIC_INNER_PRODUCT)
        index.train(array)
        index.add(array)
    else:
        params = {
            "hnsw_m": _positive_int(hnsw_m, "hnsw_m", minimum=2),
            "ef_search": _positive_int(ef_search, "ef_search"),
            "ef_construction": _positive_int(ef_construction, "ef_construction"),
        }
        index = _hnsw_index(index_type, dim, params["hnsw_m"], params["ef_construction"], array)
    return SceneIndex(index, ids, index_type, params, use_gpu=use_gpu, gpu_fallback=gpu_fallback)


# ------------------------------------------------------------------------------------------------------ auto
AUTO_CANDIDATES_CPU: tuple[str, ...] = ("hnsw", "hnsw_sq8", "ivf")
AUTO_CANDIDATES_GPU: tuple[str, ...] = ("ivf",)
"""The approximate indexes ``auto`` tries: on CPU HNSW (over float and 8-bit vectors) and IVF; for a GPU search IVF
only (Faiss has no GPU HNSW)."""
EF_SEARCH_LADDER: tuple[int, ...] = (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
NPROBE_LADDER: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
"""The search settings ``auto`` walks, cheapest first, until one meets the target recall."""
TUNING_K = 10
"""``auto`` measures recall@10 against exact search, as the issue's bar and the benchmarks do."""
AUTO_REASONS: tuple[str, ...] = ("small", "target_met", "exact_as_fast", "target_not_met", "no_sample")
"""Why ``auto`` chose what it chose (:attr:`IndexTuning.reason`): ``small`` = at most ``exact_max_items`` scenes
(exact, nothing measured); ``target_met`` = an approximate setting met the target and searched the sample at least
``min_speedup`` times faster than exact; ``exact_as_fast`` = one met it, but not that much faster (exact kept);
``target_not_met`` = none met it (exact kept: a fallback); ``no_sample`` = no query to measure with (exact kept: a
fallback)."""
_Z_95 = 1.6448536269514722  # one-sided 95% normal quantile


@dataclass(frozen=True)
class IndexTrial:
    """One search setting ``auto`` measured on the query sample."""

    index_type: str
    params: dict[str, int]
    recall_at_k: float
    recall_lower_bound: float
    """One-sided 95% lower bound of the recall (mean minus 1.645 standard errors over the sample's queries)."""
    search_seconds: float
    """Seconds to search the whole sample (the best of the repeats taken)."""


@dataclass(frozen=True)
class IndexTuning:
    """What ``auto`` chose for one scene set, and what it measured on the way (:func:`tune_scene_index`)."""

    index_type: str
    params: dict[str, int]
    reason: str
    recall_at_k: float
    """Recall@k of the chosen setting on the sample against exact search (1.0 for exact search)."""
    k: int
    target_recall: float
    scenes: int
    sample_queries: int
    speedup_vs_exact: float | None = None
    """Exact search's seconds on the sample over those of the fastest setting that met the target (with
    ``exact_as_fast``: the one not fast enough); None where nothing was compared."""
    trials: tuple[IndexTrial, ...] = field(default_factory=tuple)
    build_seconds: dict[str, float] = field(default_factory=dict)
    """Seconds to build each candidate index that was tried (``flat``: the exact reference)."""

    @property
    def fallback(self) -> bool:
        """Exact search because no approximate setting could be shown to meet the target (counted by the job)."""
        return self.reason in ("target_not_met", "no_sample")

    @property
    def search_param(self) -> str:
        """The chosen search parameter as ``name=value`` (``ef_search=48``, ``nprobe=16``); ``none`` for exact."""
        name = SEARCH_PARAMS.get(self.index_type)
        return f"{name}={self.params[name]}" if name else "none"

    def as_dict(self) -> dict:
        return {**asdict(self), "fallback": self.fallback, "search_param": self.search_param}


def recall_per_query(exact: np.ndarray, approx: np.ndarray) -> np.ndarray:
    """Per query, the share of its exact top-k rows (``-1`` = none) that the approximate top-k also holds."""
    if exact.shape != approx.shape:
        raise ValueError(f"exact {exact.shape} and approximate {approx.shape} neighbour arrays differ in shape")
    valid = exact >= 0
    hit = (exact[:, :, None] == approx[:, None, :]).any(axis=2) & valid
    return hit.sum(axis=1) / np.maximum(valid.sum(axis=1), 1)


def _timed_rows(index: faiss.Index, queries: np.ndarray, k: int, repeats: int) -> tuple[np.ndarray, float]:
    best, rows = float("inf"), None
    for _ in range(repeats):
        started = time.perf_counter()
        _, rows = index.search(queries, k)
        best = min(best, time.perf_counter() - started)
    return rows, best


def _candidate(kind: str, array: np.ndarray, nlist: int, hnsw_m: int, ef_construction: int
               ) -> tuple[faiss.Index, dict[str, int], str, tuple[int, ...]]:
    """A built candidate index of ``kind``, its build parameters, its search parameter's name and ladder."""
    count, dim = array.shape
    if kind in HNSW_TYPES:
        index = _hnsw_index(kind, dim, hnsw_m, ef_construction, array)
        return index, {"hnsw_m": hnsw_m, "ef_construction": ef_construction}, SEARCH_PARAMS[kind], EF_SEARCH_LADDER
    if kind == "ivf":
        lists = max(1, min(nlist, count // 39))  # at least 39 training points per list, as default_nlist
        index = faiss.index_factory(dim, f"IVF{lists},Flat", faiss.METRIC_INNER_PRODUCT)
        index.train(array)
        index.add(array)
        return index, {"nlist": lists}, SEARCH_PARAMS[kind], tuple(p for p in NPROBE_LADDER if p < lists) + (lists,)
    raise ValueError(f"auto cannot try index type {kind!r}: candidates are {sorted(set(AUTO_CANDIDATES_CPU))}")


def tune_scene_index(
    vectors: np.ndarray,
    scene_ids: Sequence[str] | np.ndarray,
    sample_queries: np.ndarray | Callable[[], np.ndarray],
    *,
    target_recall: float,
    exact_max_items: int,
    min_speedup: float,
    nlist: int,
    hnsw_m: int,
    ef_construction: int,
    gpu_search: bool,
    k: int = TUNING_K,
) -> tuple[SceneIndex, IndexTuning]:
    """The scene index ``auto`` chooses for ``vectors`` from a target recall, and what it measured (see the module).

    ``sample_queries``: unit query vectors like those the index will serve (a sample of the real factual queries),
    or a function returning them, called only where the scene count exceeds ``exact_max_items``. Each candidate
    (HNSW and IVF on CPU, IVF alone where ``gpu_search``: the index will be searched on a GPU, where Faiss
    has no HNSW) is built once with ``hnsw_m`` / ``ef_construction`` /
    ``nlist`` (capped so that every list has 39 training points) and searched with the sample at each rung of
    :data:`EF_SEARCH_LADDER` / :data:`NPROBE_LADDER` until the one-sided 95% lower bound of its recall@``k``
    against exact search reaches ``target_recall``. Of the candidates' qualifying settings the one that searches
    the sample fastest is kept where it is at least ``min_speedup`` times faster than exact search (on CPU; where
    ``gpu_search`` the CPU timings say nothing of the GPU's, so the qualifying IVF setting is kept); else exact
    search. The index is returned on CPU, as :func:`build_scene_index` builds it; :meth:`SceneIndex.from_bytes`
    moves it to a GPU where it is searched.
    With ``min_speedup`` 0 no time decides: the first setting that meets the target (HNSW before IVF) is kept.
    """
    if not 0.0 < float(target_recall) <= 1.0:
        raise ValueError(f"target_recall must lie in (0, 1], got {target_recall!r}")
    if not float(min_speedup) >= 0.0:
        raise ValueError(f"min_speedup must be >= 0 (exact search is kept where no setting is that much faster; "
                         f"0 keeps the setting that meets the target without timing it), got {min_speedup!r}")
    _positive_int(exact_max_items, "exact_max_items")
    k = _positive_int(k, "k")
    array = _unit_vectors(vectors, "scene vectors")
    count = array.shape[0]

    def exact(reason: str, **measured) -> tuple[SceneIndex, IndexTuning]:
        index = build_scene_index(array, scene_ids, "flat")
        tuning = IndexTuning("flat", {}, reason, measured.pop("recall_at_k", 1.0), k, float(target_recall), count,
                             **measured)
        log = logger.warning if tuning.fallback else logger.info
        log("auto scene index over %d scenes: exact search (%s)", count, reason)
        return index, tuning

    if count <= exact_max_items:
        return exact("small", sample_queries=0)
    drawn = np.asarray(sample_queries() if callable(sample_queries) else sample_queries)
    if drawn.ndim != 2 or drawn.shape[0] == 0:
        if drawn.size == 0:
            return exact("no_sample", sample_queries=0)
    queries = _unit_vectors(drawn, "sample queries", dim=array.shape[1])
    depth = min(k, count)
    started = time.perf_counter()
    flat = faiss.IndexFlatIP(array.shape[1])
    flat.add(array)
    built = {"flat": time.perf_counter() - started}
    truth, exact_seconds = _timed_rows(flat, queries, depth, repeats=2)
    trials: list[IndexTrial] = []
    qualifying: list[tuple[float, faiss.Index, IndexTrial]] = []
    for kind in (AUTO_CANDIDATES_GPU if gpu_search else AUTO_CANDIDATES_CPU):
        started = time.perf_counter()
        index, build, name, ladder = _candidate(kind, array, nlist, hnsw_m, ef_construction)
        built[kind] = time.perf_counter() - started
        for value in ladder:
            params = {**build, name: value}
            _apply_search_params(index, kind, params)
            rows, seconds = _timed_rows(index, queries, depth, repeats=1)
            per_query = recall_per_query(truth, rows)
            mean = float(per_query.mean())
            bound = mean - _Z_95 * float(per_query.std(ddof=1) if len(per_query) > 1 else 0.0) / math.sqrt(len(
                per_query))
            trial = IndexTrial(kind, params, mean, bound, seconds)
            if bound >= target_recall:
                _, seconds = _timed_rows(index, queries, depth, repeats=2)  # a steadier time for the comparison
                trial = IndexTrial(kind, params, mean, bound, min(seconds, trial.search_seconds))
                trials.append(trial)
                qualifying.append((trial.search_seconds, index, trial))
                break
            trials.append(trial)
    measured = {"sample_queries": int(queries.shape[0]), "trials": tuple(trials), "build_seconds": built}
    if not qualifying:
        return exact("target_not_met", **measured)
    seconds, index, best = min(qualifying, key=lambda entry: entry[0]) if min_speedup > 0 else qualifying[0]
    speedup = exact_seconds / max(seconds, 1e-9)
    if not gpu_search and min_speedup > 0 and speedup < min_speedup:
        return exact("exact_as_fast", speedup_vs_exact=speedup, **measured)
    tuning = IndexTuning(best.index_type, dict(best.params), "target_met", best.recall_at_k, k, float(target_recall),
                         count, speedup_vs_exact=None if gpu_search else speedup, **measured)
    logger.info("auto scene index over %d scenes: %s %s, recall@%d %.4f on %d sample queries (target %.3f)",
                count, best.index_type, tuning.search_param, k, best.recall_at_k, queries.shape[0], target_recall)
    return SceneIndex(index, _scene_id_array(scene_ids, count), best.index_type, best.params), tuning
