"""Visual relatedness of a caption to its image's textual visual context (Sabir et al.: the textual visual context
dataset for COCO and its pre-trained visual re-ranker).

An image's visual context is the top labels of an object classifier (ResNet-152 ImageNet classes in the seed's
data: ``visual-context_label.txt``) and the classifier's confidence in them (``visual-context.txt``: the mean of
the top-3 labels' softmax probabilities, so at most 1/3). The seed scores a caption w against that context c as

    P(w | c) = sim(w, c) ** P(c)

with sim the cosine of a pre-trained sentence encoder (SBERT in the seed; the project's MiniLM here) between the
caption and the label text, and P(c) the classifier's confidence. A confident classifier leaves the cosine as it
is; an unsure one lifts every score towards 1, so weak visual evidence separates candidates less. The score
re-ranks caption candidates (highest first). Here it is clipped into [0, 1]: a negative cosine counts as 0 (the
seed's formula gives a complex number there, of which it keeps the real part).

:func:`relatedness_from_similarity` is that formula on plain arrays. :class:`VisualRelatednessScorer` embeds
captions and labels with a :class:`models.encoders.SentenceEncoder` (or any encoder with ``encode_texts``) and
combines them in one of two modes:

- ``joint`` (default, the seed's ``pre-trained/model.py``): the top ``top_labels`` labels joined into one text,
  one cosine, raised to the mean confidence of those labels;
- ``per_label``: one cosine per label (top ``top_labels`` by confidence), each raised to its own confidence, and
  the scores averaged. It needs the labels as a list; a label string such as "standard poodle shopping cart
  footwear" (how the seed's files and the ``images.tags`` column hold them) cannot be split into labels, so it is
  one label there and both modes agree.

Labels come as a list of strings or one text; confidences as one number (the mean over the labels, as ingested
into ``images.tags_confidence``), one number per label, or None (unknown: exponent 1, i.e. the clipped cosine).
An image without labels gets NaN: no visual context, nothing to score against.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import numpy as np

LABEL_MODES = ("joint", "per_label")
DEFAULT_TOP_LABELS = 3


class TextEncoder(Protocol):
    def encode_texts(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray: ...


def relatedness_from_similarity(similarity, confidence) -> np.ndarray:
    """``clip(similarity, 0, 1) ** clip(confidence, 0, 1)`` elementwise (the seed's ``sim ** P(c)``), NaN kept.

    ``confidence`` NaN means unknown and counts as 1 (the plain clipped cosine)."""
    sim = np.clip(np.asarray(similarity, dtype=np.float64), 0.0, 1.0)
    conf = np.asarray(confidence, dtype=np.float64)
    conf = np.where(np.isnan(conf), 1.0, np.clip(conf, 0.0, 1.0))
    with np.errstate(invalid="ignore"):
        return np.power(sim, conf)


def _labels_of(labels: object) -> list[str]:
    """A row's labels as a list of non-empty, whitespace-normalised strings ([] when there are none)."""
    if labels is None or (isinstance(labels, float) and math.isnan(labels)):
        return []
    if isinstance(labels, str):
        text = " ".join(labels.split())
        return [text] if text else []
    out = []
    for label in labels:
        if label is None or (isinstance(label, float) and math.isnan(label)):
            continue
        text = " ".join(str(label).split())
        if text:
            out.append(text)
    return out


def _check_confidence(value: float, row: int) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise ValueError(f"confidences[{row}] must be a number in [0, 1] (or None), got {value!r}")
    value = float(value)
    if math.isnan(value):
        return value
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"confidences[{row}] must be in [0, 1], got {value}")
    return value


def _confidences_of(confidence: object, n_labels: int, row: int) -> list[float]:
    """One confidence per label (NaN = unknown); a single number applies to every label."""
    if confidence is None:
        return [math.nan] * n_labels
    if isinstance(confidence, (int, float, np.floating, np.integer)) and not isinstance(confidence, bool):
        return [_check_confidence(confidence, row)] * n_labels
    values = [math.nan if c is None else _check_confidence(c, row) for c in confidence]
    if len(values) != n_labels:
        raise ValueError(f"row {row} has {n_labels} labels but {len(values)} confidences: give one per label, "
                         "one number for all, or None")
    return values


def top_labels(labels: object, confidence: object, k: int = DEFAULT_TOP_LABELS,
               row: int = 0) -> tuple[list[str], list[float]]:
    """The (at most ``k``) most confident labels of a row and their confidences; label order breaks ties and
    orders labels of unknown (or one shared) confidence."""
    names = _labels_of(labels)
    confs = _confidences_of(confidence, len(names), row)
    order = sorted(range(len(names)), key=lambda i: (-(confs[i] if not math.isnan(confs[i]) else -1.0), i))[:k]
    return [names[i] for i in order], [confs[i] for i in order]


class VisualRelatednessScorer:
    """Scores captions against their images' visual context with a sentence encoder (see the module doc)."""

    def __init__(self, encoder: TextEncoder, label_mode: str = "joint", top_labels: int = DEFAULT_TOP_LABELS,
                 batch_size: int = 64) -> None:
        if label_mode not in LABEL_MODES:
            raise ValueError(f"label_mode must be one of {LABEL_MODES}, got {label_mode!r}")
        if isinstance(top_labels, bool) or not isinstance(top_labels, int) or top_labels < 1:
            raise ValueError(f"top_labels must be an integer >= 1, got {top_labels!r}")
        self.encoder = encoder
        self.label_mode = label_mode
        self.top_labels = top_labels
        self.batch_size = batch_size
        self._cache: dict[str, np.ndarray] = {}

    def _vectors(self, texts: Sequence[str]) -> dict[str, np.ndarray]:
        """Unit vectors of the distinct texts (labels repeat across rows: each is embedded once per scorer)."""
        todo = sorted({t for t in texts if t not in self._cache})
        if todo:
            vectors = np.asarray(self.encoder.encode_texts(todo, batch_size=self.batch_size), dtype=np.float64)
            vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
            if len(self._cache) > 100_000:
                self._cache.clear()
            self._cache.update(zip(todo, vectors))
        return {t: self._cache[t] for t in texts}

    def score(self, captions: Sequence[str | None], labels: Sequence[object],
              confidences: Sequence[object] | None = None) -> np.ndarray:
        """Relatedness in [0, 1] of each caption to its row's labels; NaN where the row has no labels.

        An empty or missing caption scores 0 against labels (it names nothing); ``confidences`` None means
        unknown for every row."""
        n = len(captions)
        if len(labels) != n or (confidences is not None and len(confidences) != n):
            raise ValueError(f"captions, labels and confidences must have one entry per row: got {n}, {len(labels)}"
                             f" and {None if confidences is None else len(confidences)}")
        rows = [top_labels(labels[i], None if confidences is None else confidences[i], self.top_labels, i)
                for i in range(n)]
        out = np.full(n, np.nan)
        texts: list[str] = []
        pairs: list[tuple[int, str, list[str], list[float]]] = []
        for i, ((names, confs), caption) in enumerate(zip(rows, captions)):
            if not names:
                continue
            caption = " ".join(str(caption).split()) if isinstance(caption, str) else ""
            if not caption:
                out[i] = 0.0
                continue
            if self.label_mode == "joint":
                known = [c for c in confs if not math.isnan(c)]
                names, confs = [" ".join(names)], [float(np.mean(known)) if known else math.nan]
            pairs.append((i, caption, names, confs))
            texts.append(caption)
            texts.extend(names)
        if not pairs:
            return out
        vectors = self._vectors(texts)
        for i, caption, names, confs in pairs:
            sims = [float(vectors[caption] @ vectors[name]) for name in names]
            out[i] = float(np.mean(relatedness_from_similarity(sims, confs)))
        return out
