"""The retrieval UDF (ERG step 2, Retrieve): factual queries searched against the broadcast scene indexes.

The stylized set D_s (its train split only: :mod:`jobs.retrieve` never indexes a val/test scene) is indexed twice
on the driver (:class:`models.scene_index.SceneIndex`): a ``text`` index of
the stylized captions' vectors and an ``image`` index of each scene's image vector, both under scene ids, so that
every hit is a scene. :class:`ScenePayload` carries both serialized indexes and the scene -> image map in one Spark
broadcast; :func:`retrieval_partitions` is the ``mapInPandas`` function that rebuilds the indexes once per Python
worker (cached by broadcast id) and runs :func:`search_queries` on every batch of factual queries.

The four retrieval types take the query from the factual pair and the target from the stylized set
(:data:`models.scene_index.RETRIEVAL_TYPES`): i2i = factual image vs scene images, i2t = factual image vs scene
captions, t2i = factual caption vs scene images, t2t = factual caption vs scene captions. A query is a factual
caption; for i2* types all captions of one factual image share its image's hits (each image is searched once per
batch). Hits keep cosine similarity > ``min_similarity`` and the ``top_k`` best; with ``exclude_same_image`` a hit
on a scene of the query's own image is dropped and the rest re-ranked from 1 (the search asks for ``top_k +
margin`` neighbours, the margin being the most scenes any one image has, so that ``top_k`` survive when they exist).

:func:`table5` and :func:`retrieval_examples` turn aggregated hits into the paper's Table 5 view (counts per type)
and Fig. 3 view (factual caption -> retrieved stylized caption).
"""
from __future__ import annotations

import os
import pickle
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import pandas as pd

from models.scene_index import GPU_FALLBACKS, MODALITIES, RETRIEVAL_TYPES, SceneIndex, retrieval_modalities
from udfs.runtime import cached_model

QUERY_COLUMNS: tuple[str, ...] = ("query_id", "query_image_id", "text_vector", "image_vector")
"""Columns of the factual query frame: caption id, its image id, the caption's and the image's vectors (nullable)."""

HIT_COLUMNS: tuple[str, ...] = ("query_id", "query_image_id", "scene_id", "retrieval_type", "rank", "similarity")
HIT_SCHEMA = (
    "query_id string, query_image_id string, scene_id string, retrieval_type string, rank int, similarity double"
)
"""What :func:`retrieval_partitions` emits: one row per (factual caption, retrieved scene, type)."""

def target_modalities(retrieval_types: Sequence[str]) -> list[str]:
    """The stylized-side modalities the given retrieval types search (the indexes to build), in a fixed order."""
    targets = {retrieval_modalities(t).target for t in retrieval_types}
    return [m for m in MODALITIES if m in targets]


def query_modalities(retrieval_types: Sequence[str]) -> list[str]:
    """The factual-side modalities the given retrieval types query with, in a fixed order."""
    queries = {retrieval_modalities(t).query for t in retrieval_types}
    return [m for m in MODALITIES if m in queries]


def exclusion_margin(scene_images: Mapping[str, str]) -> int:
    """The most scenes any one image has: how many extra neighbours same-image exclusion may drop per query."""
    if not scene_images:
        return 0
    return int(pd.Series(list(scene_images.values())).value_counts().max())


def stack_vectors(vectors: Sequence[Any] | pd.Series, what: str) -> np.ndarray:
    """A column of vectors (arrays or lists, as Arrow hands ``array<float>`` to pandas) as float32 ``[n, dim]``."""
    values = list(vectors)
    if not values:
        return np.empty((0, 0), dtype=np.float32)
    missing = [row for row, value in enumerate(values) if value is None]
    if missing:
        raise ValueError(f"{what}: row {missing[0]} has no vector ({len(missing)} rows without one)")
    lengths = {len(value) for value in values}
    if len(lengths) != 1:
        raise ValueError(f"{what}: vectors of different dimensions {sorted(lengths)}: were they made by one encoder?")
    return np.ascontiguousarray(np.stack([np.asarray(value, dtype=np.float32) for value in values]))


@dataclass(frozen=True)
class RetrievalPlan:
    """What to retrieve: types, top-k, the strict similarity threshold, same-image exclusion, GPU search (and what
    to do where Faiss cannot search on a GPU: ``gpu_fallback``, see :class:`models.scene_index.SceneIndex`)."""

    types: tuple[str, ...]
    top_k: int
    min_similarity: float
    exclude_same_image: bool = True
    margin: int = 0
    use_gpu: bool = False
    gpu_fallback: str = "cpu"

    def __post_init__(self) -> None:
        if not self.types:
            raise ValueError("no retrieval types given: choose from ['i2i', 'i2t', 't2i', 't2t']")
        for retrieval_type in self.types:
            retrieval_modalities(retrieval_type)
        if len(set(self.types)) != len(self.types):
            raise ValueError(f"retrieval types {list(self.types)} repeat a type")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 1:
            raise ValueError(f"top_k must be an integer >= 1, got {self.top_k!r}")
        if not -1.0 <= float(self.min_similarity) <= 1.0:
            raise ValueError(f"min_similarity must lie in [-1, 1] (cosine similarity), got {self.min_similarity}")
        if isinstance(self.margin, bool) or not isinstance(self.margin, int) or self.margin < 0:
            raise ValueError(f"margin must be an integer >= 0, got {self.margin!r}")
        if self.gpu_fallback not in GPU_FALLBACKS:
            raise ValueError(f"gpu_fallback must be one of {list(GPU_FALLBACKS)}, got {self.gpu_fallback!r}")

    @property
    def search_k(self) -> int:
        """Neighbours to ask the index for: ``top_k``, plus the margin when same-image hits are dropped after."""
        return self.top_k + (self.margin if self.exclude_same_image else 0)


@dataclass
class ScenePayload:
    """The broadcast: the serialized scene index of each target modality, and each scene's image id."""

    blobs: dict[str, bytes]
    scene_images: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, indexes: Mapping[str, SceneIndex], scene_images: Mapping[str, str]) -> "ScenePayload":
        """Serialize ``indexes`` (modality -> index) for a broadcast."""
        unknown = sorted(set(indexes) - set(MODALITIES))
        if unknown:
            raise ValueError(f"index modalities {unknown} are not among {list(MODALITIES)}")
        return cls({modality: index.to_bytes() for modality, index in indexes.items()}, dict(scene_images))

    def indexes(self, *, use_gpu: bool, gpu_fallback: str) -> dict[str, SceneIndex]:
        """The indexes rebuilt from their blobs (on every GPU Faiss sees when ``use_gpu``; where it sees none,
        ``gpu_fallback`` as in :class:`models.scene_index.SceneIndex`)."""
        return {modality: SceneIndex.from_bytes(blob, use_gpu=use_gpu, gpu_fallback=gpu_fallback)
                for modality, blob in self.blobs.items()}

    @property
    def size_bytes(self) -> int:
        """Bytes of the serialized indexes."""
        return sum(len(blob) for blob in self.blobs.values())

    def save(self, path: str | Path) -> "ScenePayloadFile":
        """Write the payload to ``path`` (a folder every executor reads: the table storage or a Volume), for a
        session with no broadcast variables (Spark Connect); returns the handle the UDF is given instead."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        with open(partial, "wb") as out:
            pickle.dump({"blobs": self.blobs, "scene_images": self.scene_images}, out,
                        protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(partial, path)  # a reader never sees half a file
        return ScenePayloadFile(str(path))


@dataclass(frozen=True)
class ScenePayloadFile:
    """A :class:`ScenePayload` written by :meth:`ScenePayload.save`: ``.value`` reads it, as a broadcast's does."""

    path: str

    @property
    def value(self) -> ScenePayload:
        with open(self.path, "rb") as source:
            data = pickle.load(source)
        return ScenePayload(data["blobs"], data["scene_images"])


def drop_same_image_hits(hits: pd.DataFrame, scene_images: Mapping[str, str], top_k: int) -> pd.DataFrame:
    """Drop hits whose scene shows the query's own image, re-rank each query's hits from 1, keep ``top_k``.

    ``hits`` has ``query_image_id``, ``scene_id``, ``rank`` and a query key column ``query_row``; rows stay ordered
    by query, then rank.
    """
    if hits.empty:
        return hits
    hit_images = hits["scene_id"].map(scene_images)
    kept = hits[hit_images.to_numpy() != hits["query_image_id"].to_numpy()].copy()
    kept = kept.sort_values(["query_row", "rank"], kind="stable")
    kept["rank"] = kept.groupby("query_row", sort=False).cumcount().astype(np.int64) + 1
    return kept[kept["rank"] <= top_k].reset_index(drop=True)


def _search_type(
    queries: pd.DataFrame, retrieval_type: str, index: SceneIndex, scene_images: Mapping[str, str], plan: RetrievalPlan
) -> pd.DataFrame:
    """Hits of one retrieval type for the queries that have a vector of its query modality."""
    query_modality = retrieval_modalities(retrieval_type).query
    column = f"{query_modality}_vector"
    present = queries[queries[column].notna()]
    # i2*: one search per factual image; its captions share the hits
    searched = present.drop_duplicates("query_image_id") if query_modality == "image" else present
    searched = searched.reset_index(drop=True)
    if searched.empty:
        return pd.DataFrame(columns=list(HIT_COLUMNS))
    hits = index.search(stack_vectors(searched[column], f"{column} of the factual queries"),
                        top_k=plan.search_k, min_similarity=plan.min_similarity)
    hits["query_image_id"] = searched["query_image_id"].to_numpy()[hits["query_row"].to_numpy()]
    if plan.exclude_same_image:
        hits = drop_same_image_hits(hits, scene_images, plan.top_k)
    else:
        hits = hits[hits["rank"] <= plan.top_k]
    if query_modality == "image":
        hits = present[["query_id", "query_image_id"]].merge(
            hits.drop(columns="query_row"), on="query_image_id", how="inner"
        )
    else:
        hits = hits.assign(query_id=searched["query_id"].to_numpy()[hits["query_row"].to_numpy()])
    hits["retrieval_type"] = retrieval_type
    return hits[list(HIT_COLUMNS)]


def search_queries(
    queries: pd.DataFrame, indexes: Mapping[str, SceneIndex], scene_images: Mapping[str, str], plan: RetrievalPlan
) -> pd.DataFrame:
    """Every retrieval type of ``plan`` for a frame of :data:`QUERY_COLUMNS` rows -> :data:`HIT_COLUMNS` rows.

    A query without a vector of a type's query modality simply has no hit of that type.
    """
    missing = [c for c in QUERY_COLUMNS if c not in queries.columns]
    if missing:
        raise ValueError(f"the query frame lacks the columns {missing}: it needs {list(QUERY_COLUMNS)}")
    frames = []
    for retrieval_type in plan.types:
        target = retrieval_modalities(retrieval_type).target
        if target not in indexes:
            raise ValueError(f"retrieval type {retrieval_type} needs the {target} scene index, which was not built")
        frames.append(_search_type(queries, retrieval_type, indexes[target], scene_images, plan))
    out = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(HIT_COLUMNS))
    return out.astype({"rank": "int32", "similarity": "float64"})


def retrieval_partitions(payload: Any, plan: RetrievalPlan) -> Callable[[Iterator[pd.DataFrame]], Iterator[pd.DataFrame]]:
    """The ``mapInPandas`` function: :data:`QUERY_COLUMNS` batches -> :data:`HIT_SCHEMA` rows.

    ``payload`` is the Spark broadcast of a :class:`ScenePayload`, or a :class:`ScenePayloadFile` where the session
    has no broadcast variables (Spark Connect); the payload is read and its indexes deserialized once per Python
    worker and payload (cached under a key drawn here on the driver, one per use), not once per task or batch; a
    worker keeps only the latest payload's indexes.
    """
    key = ("scene_indexes", uuid.uuid4().hex, plan.use_gpu, plan.gpu_fallback)

    def run(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        value: ScenePayload = cached_model(("scene_payload", *key[1:]), lambda: payload.value, latest_only=True)
        indexes = cached_model(key, lambda: value.indexes(use_gpu=plan.use_gpu, gpu_fallback=plan.gpu_fallback),
                               latest_only=True)
        for frame in frames:
            yield search_queries(frame, indexes, value.scene_images, plan)

    return run


# ------------------------------------------------------------------------------------------- reporting views
TABLE5_COLUMNS: tuple[str, ...] = ("retrieval_type", "queries", "queries_with_hit", "hits", "mean_similarity")


def table5(
    per_type: pd.DataFrame, per_type_style: pd.DataFrame, queries_per_type: Mapping[str, int], styles: Sequence[str],
    types: Sequence[str] = tuple(RETRIEVAL_TYPES),
) -> pd.DataFrame:
    """The Table 5 view: per retrieval type, queries, queries with >= 1 hit, hits (also per style), mean similarity.

    ``per_type``: ``retrieval_type``, ``hits``, ``queries_with_hit``, ``mean_similarity`` (one row per type with
    hits); ``per_type_style``: ``retrieval_type``, ``style``, ``hits``; ``queries_per_type``: queries that had a
    vector of the type's query modality. Types without hits get zeros (and no mean similarity).
    """
    rows = []
    by_type = per_type.set_index("retrieval_type") if not per_type.empty else None
    for retrieval_type in types:
        retrieval_modalities(retrieval_type)
        found = by_type is not None and retrieval_type in by_type.index
        row: dict[str, Any] = {
            "retrieval_type": retrieval_type,
            "queries": int(queries_per_type.get(retrieval_type, 0)),
            "queries_with_hit": int(by_type.at[retrieval_type, "queries_with_hit"]) if found else 0,
            "hits": int(by_type.at[retrieval_type, "hits"]) if found else 0,
            "mean_similarity": float(by_type.at[retrieval_type, "mean_similarity"]) if found else None,
        }
        for style in styles:
            match = per_type_style[(per_type_style["retrieval_type"] == retrieval_type)
                                   & (per_type_style["style"] == style)]
            row[f"hits.{style}"] = int(match["hits"].sum())
        rows.append(row)
    return pd.DataFrame(rows, columns=[*TABLE5_COLUMNS, *(f"hits.{s}" for s in styles)])


def table5_metrics(table: pd.DataFrame) -> dict[str, float]:
    """The Table 5 view as MLflow metrics ``<type>.<column>`` (a type without hits logs no mean similarity)."""
    metrics: dict[str, float] = {}
    for row in table.to_dict("records"):
        for column, value in row.items():
            if column != "retrieval_type" and value is not None and not pd.isna(value):
                metrics[f"{row['retrieval_type']}.{column}"] = float(value)
    return metrics


def markdown_table(frame: pd.DataFrame, float_format: str = "{:.3f}") -> str:
    """A pandas frame as a GitHub markdown table (floats formatted, missing values as '-')."""

    def cell(value: Any) -> str:
        if value is None or (isinstance(value, float) and np.isnan(value)):
            return "-"
        if isinstance(value, (float, np.floating)):
            return float_format.format(value)
        return str(value).replace("|", "\\|")

    lines = ["| " + " | ".join(map(str, frame.columns)) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines) + "\n"


EXAMPLE_COLUMNS: tuple[str, ...] = (
    "query_id", "factual_caption", "retrieval_type", "rank", "similarity", "scene_id", "style", "stylized_caption"
)


def retrieval_examples(hits: pd.DataFrame) -> list[dict[str, Any]]:
    """The Fig. 3 view: per factual query, its caption and, per retrieval type, the retrieved stylized captions.

    ``hits`` has :data:`EXAMPLE_COLUMNS`; returns one dict per query (in first-seen order) with ``query_id``,
    ``factual_caption`` and ``retrieved``: a list of {type, rank, similarity, scene_id, style, stylized_caption}
    ordered by type, then rank.
    """
    missing = [c for c in EXAMPLE_COLUMNS if c not in hits.columns]
    if missing:
        raise ValueError(f"the example hits lack the columns {missing}: they need {list(EXAMPLE_COLUMNS)}")
    examples = []
    ordered = hits.sort_values(["retrieval_type", "rank"], kind="stable")
    for query_id in pd.unique(hits["query_id"]):
        rows = ordered[ordered["query_id"] == query_id]
        examples.append({
            "query_id": str(query_id),
            "factual_caption": str(rows["factual_caption"].iloc[0]),
            "retrieved": [
                {"type": r.retrieval_type, "rank": int(r.rank), "similarity": round(float(r.similarity), 4),
                 "scene_id": r.scene_id, "style": r.style, "stylized_caption": r.stylized_caption}
                for r in rows.itertuples(index=False)
            ],
        })
    return examples


def examples_markdown(examples: Sequence[Mapping[str, Any]]) -> str:
    """The Fig. 3 view as markdown: each factual caption followed by its retrieved stylized captions."""
    parts = []
    for example in examples:
        parts.append(f"**{example['factual_caption']}** (`{example['query_id']}`)\n")
        frame = pd.DataFrame(example["retrieved"], columns=["type", "rank", "similarity", "style", "stylized_caption"])
        parts.append(markdown_table(frame))
    return "\n".join(parts)
