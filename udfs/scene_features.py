"""Scene features on the executors: precomputed region features decoded and padded (``train.features: regions``).

``images.region_features`` holds float32 ``[n_regions, d]`` as bytes; :func:`decode_regions` turns each into the
flat, zero-padded ``features`` array (``regions * d`` values) with ``n_regions`` real ones, as captioner training
and decoding read them. Text and image embedding for the other feature kinds is :mod:`udfs.embedding`'s UDF.
"""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame

FEATURE_DDL = "image_id string, features array<float>, n_regions int"


def pad_regions(blob: bytes, n_regions: int, regions: int, dim: int) -> tuple[np.ndarray, int]:
    """One image's region bytes -> (``regions * dim`` float32 values, real regions kept); ValueError on a bad size."""
    values = np.frombuffer(blob, dtype=np.float32)
    if n_regions < 1 or values.size != n_regions * dim:
        raise ValueError(f"region features of {values.size} floats do not hold {n_regions} regions of {dim}")
    kept = min(n_regions, regions)
    out = np.zeros((regions, dim), dtype=np.float32)
    out[:kept] = values.reshape(n_regions, dim)[:kept]
    return out.reshape(-1), kept


def decode_regions(images: DataFrame, regions: int, dim: int) -> DataFrame:
    """``image_id, region_features, n_regions`` -> :data:`FEATURE_DDL` rows (images whose bytes do not hold
    ``n_regions x dim`` floats are left out: they have no features, and are counted as such by the caller)."""

    def run(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for frame in frames:
            ids, features, counts = [], [], []
            for image_id, blob, n in zip(frame["image_id"], frame["region_features"], frame["n_regions"]):
                try:
                    flat, kept = pad_regions(bytes(blob), int(n), regions, dim)
                except ValueError:
                    continue
                ids.append(image_id)
                features.append(flat)
                counts.append(kept)
            yield pd.DataFrame({"image_id": ids, "features": features, "n_regions": counts},
                               columns=["image_id", "features", "n_regions"])

    return images.mapInPandas(run, FEATURE_DDL)
