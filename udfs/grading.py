"""Grading captions with a second set of style-vs-factual classifiers, as an iterator pandas UDF (mapInPandas).

``erg experiment`` reports cls. twice: by the evaluation classifiers that also filter the augmented captions, and
by classifiers trained on another half of the train split that never filter anything (so no filter grades its own
output). Input rows carry ``row``, ``style`` and ``hypothesis``; each gives ``row`` and the probability of its style.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator

import pandas as pd

from udfs.runtime import cached_evaluation_classifiers, limit_threads, rebatch, task_device

GRADE_DDL = "row long, probability double"


def make_grader(classifiers_path: str, batch_size: int, device: str
                ) -> Callable[[Iterator[pd.DataFrame]], Iterator[pd.DataFrame]]:
    """mapInPandas function: ``row, style, hypothesis`` -> ``row, probability`` (p of the row's style)."""

    def grade_batches(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        limit_threads()
        classifiers = cached_evaluation_classifiers(classifiers_path, task_device(device))
        for frame in rebatch(frames, batch_size):
            texts = ["" if t is None else str(t) for t in frame["hypothesis"]]
            probability = classifiers.style_probability(texts, frame["style"].tolist(), batch_size)
            yield pd.DataFrame({"row": frame["row"].to_numpy(), "probability": probability})

    return grade_batches
