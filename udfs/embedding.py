"""The embedding UDF (ERG step 2, Retrieve): scenes, factual captions and images -> unit vectors on the executors.

Three item kinds go into the ``embeddings`` table (:data:`ITEM_MODALITIES`):

- ``scene``: a stylized caption of D_s (item id = scene id), modality ``text``;
- ``factual``: a factual caption of P (item id = caption id), modality ``text``;
- ``image``: every image that either set uses (item id = image id), modality ``image``. What an encoder sees of an
  image depends on its kind (:data:`IMAGE_INPUT_COLUMN`): the sentence encoder its ``tags``, CLIP its pixels (the
  file at ``uri``, read on the executor), OSCAR its ``region_features`` (+ tags).

:func:`embed_partitions` is the ``mapInPandas`` function: the encoder is loaded once per Python worker
(:func:`udfs.runtime.cached_model`, keyed by kind, checkpoint, options and the device Spark assigned to the task),
Arrow batches are re-cut into windows of :data:`LENGTH_BUCKET_BATCHES` model batches, whose captions are sorted by
length before they are cut into model batches of ``batch_size`` (sorted within one batch only, most of the padding
stayed; the UDF's rate against the plain loop is in benchmarks/results/scale.json), and each input row gives one output row with its
vector, or with a ``skip_reason`` when that one item cannot be encoded (an unreadable image file, say): one bad
image never fails the job, it is counted and reported. :func:`embed_batch` is the same work on one pandas frame,
usable without Spark.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator
from urllib.parse import unquote, urlparse

import numpy as np
import pandas as pd

from models.encoders import ENCODER_KINDS, ImageInput, SceneEncoder, load_encoder
from udfs.runtime import cached_model, limit_threads, rebatch, task_device

if TYPE_CHECKING:  # the batch functions run without Spark (benchmarks/gpu_models.py on a machine with no pyspark)
    from pyspark.sql import Column

ITEM_MODALITIES: dict[str, str] = {"scene": "text", "factual": "text", "image": "image"}
"""Item kind -> the modality it is embedded in."""

IMAGE_INPUT_COLUMN: dict[str, str] = {"sentence": "tags", "clip": "uri", "oscar": "region_features"}
"""Encoder kind -> the ``images`` column it needs to embed an image (an image lacking it is not embedded)."""

INPUT_COLUMNS: tuple[str, ...] = ("item_id", "item_kind", "modality", "text", "tags", "uri", "region_features")
"""Columns of the frame fed to :func:`embed_partitions` (text for captions; tags, uri, region_features for images)."""

LENGTH_BUCKET_BATCHES = 16
"""Model batches per window that the embed UDF sorts by caption length (a window of 16 x 64 captions)."""

EMBEDDED_SCHEMA = "item_id string, item_kind string, modality string, vector array<float>, skip_reason string"
"""What :func:`embed_partitions` emits: one row per input row; ``vector`` is null exactly when ``skip_reason`` is set."""


@dataclass(frozen=True)
class EncoderSpec:
    """Which scene encoder to run, and how: shipped to the executors inside the UDF's closure.

    ``options`` are the encoder's own options (see :func:`models.encoders.load_encoder`), as sorted
    ``(name, value)`` pairs so that the spec is hashable and names one cached model.
    """

    kind: str
    name_or_path: str | None = None
    device: str = "auto"
    batch_size: int = 64
    options: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in ENCODER_KINDS:
            raise ValueError(f"unknown encoder kind {self.kind!r}: allowed are {sorted(ENCODER_KINDS)}")
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {self.batch_size!r}")

    @classmethod
    def of(cls, kind: str, name_or_path: str | None, device: str = "auto", batch_size: int = 64,
           options: dict[str, Any] | None = None) -> "EncoderSpec":
        """A spec from plain values; ``options`` as a dict."""
        return cls(kind, name_or_path, device, batch_size, tuple(sorted((options or {}).items())))

    @property
    def image_input(self) -> str:
        """The ``images`` column this encoder embeds an image from."""
        return IMAGE_INPUT_COLUMN[self.kind]

    def cache_key(self, device: str) -> tuple:
        """The key of this encoder on ``device`` in :func:`udfs.runtime.cached_model`."""
        return ("scene_encoder", self.kind, self.name_or_path, json.dumps(self.options, default=str), device)

    def load(self, device: str) -> SceneEncoder:
        """This encoder on ``device``, cached in the current process (driver or Python worker)."""
        return cached_model(
            self.cache_key(device), lambda: load_encoder(self.kind, self.name_or_path, device=device, **dict(self.options))
        )


@dataclass(frozen=True)
class EncoderIdentity:
    """What the driver records with the vectors: the encoder's name, exact version and vector dimension."""

    name: str
    version: str
    dim: int


def encoder_identity(spec: EncoderSpec) -> EncoderIdentity:
    """Load the encoder once on the driver (CPU) to read its name, ``version`` and ``dim``.

    The version hashes the weights, so it needs them; the driver keeps the model cached, and later jobs of the
    same process (``erg run``: embed, then retrieve) reuse it.
    """
    encoder = spec.load("cpu")
    return EncoderIdentity(encoder.name, encoder.version, encoder.dim)


def has_image_input(kind: str) -> Column:
    """A Spark condition on an ``images`` row: true when it carries what a ``kind`` encoder needs."""
    from pyspark.sql import functions as F

    if kind not in IMAGE_INPUT_COLUMN:
        raise ValueError(f"unknown encoder kind {kind!r}: allowed are {sorted(IMAGE_INPUT_COLUMN)}")
    column = F.col(IMAGE_INPUT_COLUMN[kind])
    if kind == "oscar":
        return column.isNotNull() & (F.length(column) > 0)
    return column.isNotNull() & (F.length(F.trim(column)) > 0)


def read_uri_bytes(uri: str) -> bytes:
    """The bytes of the file at ``uri``: a local or FUSE path (``/Volumes/...``), ``file:``, ``dbfs:/`` or any
    protocol fsspec serves (``s3://``, ``abfss://``, ``gs://`` with their fsspec packages installed)."""
    if uri.startswith("file:"):
        return Path(unquote(urlparse(uri).path)).read_bytes()
    if uri.startswith("dbfs:/"):
        return (Path("/dbfs") / uri.removeprefix("dbfs:/").lstrip("/")).read_bytes()
    if "://" not in uri:
        return Path(uri).expanduser().read_bytes()
    import fsspec

    with fsspec.open(uri, "rb") as handle:
        return handle.read()


def _image_input(row: Any, kind: str) -> ImageInput:
    """The :class:`ImageInput` a ``kind`` encoder needs from one image row (reads the file for ``clip``)."""
    if kind == "clip":
        return ImageInput(pixels=read_uri_bytes(str(row.uri)), tags=row.tags)
    region_features = row.region_features if kind == "oscar" else None
    return ImageInput(tags=row.tags, region_features=region_features)


def _encode_isolating(encode: Callable[[list], np.ndarray], items: list, dim: int) -> tuple[list, list]:
    """Encode ``items`` in one call; when that fails on bad input, one by one so that only the bad ones are skipped.

    Returns (vectors or None, skip reason or None) per item.
    """
    if not items:
        return [], []
    try:
        vectors = encode(items)
        return list(vectors), [None] * len(items)
    except ValueError:
        pass
    out_vectors: list = []
    reasons: list = []
    for item in items:
        try:
            out_vectors.append(encode([item]).reshape(dim))
            reasons.append(None)
        except ValueError as error:
            out_vectors.append(None)
            reasons.append(str(error).removeprefix("images[0] ").removeprefix("texts[0] "))
    return out_vectors, reasons


def embed_batch(encoder: SceneEncoder, frame: pd.DataFrame, batch_size: int) -> pd.DataFrame:
    """Embed one frame of :data:`INPUT_COLUMNS` rows; returns the :data:`EMBEDDED_SCHEMA` columns in input order.

    Text rows (``modality == "text"``) are encoded from ``text``; image rows from what the encoder's kind needs.
    An image whose file cannot be read, or an item the encoder rejects, gets ``vector`` None and a ``skip_reason``.
    """
    modalities = set(frame["modality"].unique())
    unknown = sorted(modalities - {"text", "image"})
    if unknown:
        raise ValueError(f"rows have modality {unknown}: allowed are ['image', 'text']")
    vectors: list = [None] * len(frame)
    reasons: list = [None] * len(frame)
    text_rows = np.flatnonzero((frame["modality"] == "text").to_numpy())
    texts = frame["text"].iloc[text_rows].tolist()
    text_vectors, text_reasons = _encode_isolating(
        lambda items: encoder.encode_texts(items, batch_size=batch_size), texts, encoder.dim
    )
    for position, vector, reason in zip(text_rows, text_vectors, text_reasons):
        vectors[position], reasons[position] = vector, reason

    image_rows: list[int] = []
    inputs: list[ImageInput] = []
    for position in np.flatnonzero((frame["modality"] == "image").to_numpy()):
        try:
            inputs.append(_image_input(frame.iloc[position], encoder.kind))
            image_rows.append(int(position))
        except OSError as error:
            reasons[position] = f"cannot read the image file ({type(error).__name__}: {error})"
    image_vectors, image_reasons = _encode_isolating(
        lambda items: encoder.encode_images(items, batch_size=batch_size), inputs, encoder.dim
    )
    for position, vector, reason in zip(image_rows, image_vectors, image_reasons):
        vectors[position], reasons[position] = vector, reason
    return pd.DataFrame({
        "item_id": frame["item_id"].to_numpy(),
        "item_kind": frame["item_kind"].to_numpy(),
        "modality": frame["modality"].to_numpy(),
        "vector": vectors,
        "skip_reason": reasons,
    })


def embed_partitions(spec: EncoderSpec) -> Callable[[Iterator[pd.DataFrame]], Iterator[pd.DataFrame]]:
    """The ``mapInPandas`` function embedding :data:`INPUT_COLUMNS` rows into :data:`EMBEDDED_SCHEMA` rows, in
    windows of :data:`LENGTH_BUCKET_BATCHES` model batches sorted by length (:meth:`SceneEncoder.encode_texts`).

    The encoder is loaded on the first batch of a task (an empty partition loads nothing), on the GPU Spark assigned
    to the task when there is one, and kept for later tasks of the same Python worker.
    """

    def run(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        encoder: SceneEncoder | None = None
        for batch in rebatch(frames, spec.batch_size * LENGTH_BUCKET_BATCHES):
            if encoder is None:
                limit_threads()
                encoder = spec.load(task_device(spec.device))
            yield embed_batch(encoder, batch, spec.batch_size)

    return run

