"""Visual relatedness (:mod:`models.visual_relatedness`) inside the iterator pandas UDFs: one scorer per executor
process (its sentence encoder shared, through :func:`udfs.runtime.cached_model`, with whatever else uses that encoder
on the same device), and the columns that generation's visual filter and evaluation's re-ranking read.

An image's textual visual context travels on the rows as ``tags`` (its object labels, one text, as in
``images.tags``) and ``tags_confidence`` (the label classifier's mean confidence, ``images.tags_confidence``; null
when unknown, which scores the plain clipped cosine). A row without tags has no visual context and scores NaN.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from udfs.runtime import cached_model

CONTEXT_COLUMNS = ("tags", "tags_confidence")


def visual_options(encoder: str, label_mode: str, top_labels: int, batch_size: int = 64) -> dict:
    """The scorer's settings as a plain dict (what a UDF closure carries to the executors)."""
    return {"encoder": encoder, "label_mode": label_mode, "top_labels": int(top_labels), "batch_size": int(batch_size)}


def cached_relatedness_scorer(options: dict, device: str):
    """The :class:`models.visual_relatedness.VisualRelatednessScorer` for ``options`` on ``device``, once per process."""
    from models.encoders import SentenceEncoder
    from models.visual_relatedness import VisualRelatednessScorer

    name = options["encoder"]
    encoder = cached_model(("sentence_encoder", name, device), lambda: SentenceEncoder(name, device))
    return cached_model(("visual_relatedness", name, device, options["label_mode"], options["top_labels"]),
                        lambda: VisualRelatednessScorer(encoder, options["label_mode"], options["top_labels"],
                                                        batch_size=options.get("batch_size", 64)))


def context_of(frame: pd.DataFrame) -> tuple[list, list]:
    """The rows' labels and confidences (None where the frame or the row has none)."""
    n = len(frame)
    tags = frame["tags"].tolist() if "tags" in frame.columns else [None] * n
    conf = frame["tags_confidence"].tolist() if "tags_confidence" in frame.columns else [None] * n
    conf = [None if c is None or (isinstance(c, float) and np.isnan(c)) else float(c) for c in conf]
    return [t if isinstance(t, str) and t.strip() else None for t in tags], conf


def relatedness(scorer, frame: pd.DataFrame, captions: Sequence[str | None]) -> np.ndarray:
    """Each caption's relatedness to its row's visual context (NaN where the row has none)."""
    tags, conf = context_of(frame)
    if not any(t is not None for t in tags):
        return np.full(len(frame), np.nan)
    return scorer.score(list(captions), tags, conf)
