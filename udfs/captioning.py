"""Captioning of test images as an iterator pandas UDF (mapInPandas): every trained captioner, loaded once per
executor process, writes a greedy caption for each (image, style) row, and the style classifier and the target
style's trigram LM score it, in the same pass.

Input frames carry ``image_id``, ``style`` and ``features`` (the image vector, ``array<float>``); each input row
gives one output row per captioner variant (``original`` / ``augmented``) in :data:`HYPOTHESIS_DDL`:
the hypothesis, the classifier's predicted label, its probability of the target style, and the perplexity under
the target style's LM (NaN where that style has no LM).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import numpy as np
import pandas as pd

from udfs.runtime import cached_model, cached_style_classifier, cached_style_lms, limit_threads, rebatch, task_device

HYPOTHESIS_DDL = ("variant string, image_id string, style string, hypothesis string, predicted_style string, "
                  "style_probability double, perplexity double")
HYPOTHESIS_COLUMNS = ["variant", "image_id", "style", "hypothesis", "predicted_style", "style_probability",
                      "perplexity"]


def stack_features(vectors: pd.Series) -> np.ndarray:
    """A column of equal-length vectors -> ``[rows, d]`` float32; ValueError naming the lengths otherwise."""
    lengths = {len(v) for v in vectors}
    if len(lengths) != 1:
        raise ValueError(f"image vectors must all have one length, got lengths {sorted(lengths)[:5]}")
    return np.stack([np.asarray(v, dtype=np.float32) for v in vectors])


def score_hypotheses(hypotheses: list[str], styles: list[str], clf, lms) -> pd.DataFrame:
    """The classifier's verdict and the target style's perplexity of each hypothesis (aligned with ``styles``)."""
    proba = clf.predict_proba(hypotheses)
    with_lm = np.array([s in lms.styles for s in styles], dtype=bool)
    perplexity = np.full(len(hypotheses), np.nan)
    if with_lm.any():
        rows = np.flatnonzero(with_lm)
        perplexity[rows] = lms.perplexities([hypotheses[i] for i in rows], [styles[i] for i in rows])
    return pd.DataFrame({
        "predicted_style": [clf.labels[i] for i in proba.argmax(axis=1)],
        "style_probability": [float(proba[row, clf.label_index(s)]) if s in clf.labels else float("nan")
                              for row, s in enumerate(styles)],
        "perplexity": perplexity,
    })


def caption_batch(frame: pd.DataFrame, captioners: Mapping[str, object], clf, lms, max_len: int) -> pd.DataFrame:
    """Greedy captions of ``frame``'s images by every captioner in its row's style, scored; one row per variant."""
    import torch

    from models.captioners import greedy_decode

    features = torch.from_numpy(stack_features(frame["features"]))
    styles = frame["style"].tolist()
    parts = []
    for variant, model in captioners.items():
        hypotheses = greedy_decode(model, features, styles, max_len=max_len)
        scored = score_hypotheses(hypotheses, styles, clf, lms)
        parts.append(pd.concat([pd.DataFrame({"variant": variant, "image_id": frame["image_id"].to_numpy(),
                                              "style": styles, "hypothesis": hypotheses}), scored], axis=1))
    return pd.concat(parts, ignore_index=True)[HYPOTHESIS_COLUMNS]


def make_captioner_evaluator(captioner_paths: Mapping[str, str], classifier_path: str, classifier_max_length: int,
                             lm_path: str, max_len: int, batch_size: int,
                             device: str) -> Callable[[Iterator[pd.DataFrame]], Iterator[pd.DataFrame]]:
    """mapInPandas function: ``image_id, style, features`` -> :data:`HYPOTHESIS_DDL` rows, one per variant.

    ``captioner_paths`` maps a variant name to a folder written by :func:`models.captioners.save_captioner`.
    """
    if not captioner_paths:
        raise ValueError("no captioners given: captioner_paths maps a variant (original/augmented) to a model folder")
    paths = dict(captioner_paths)

    def evaluate_batches(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        from models.captioners import load_captioner

        limit_threads()
        dev = task_device(device)
        captioners = {variant: cached_model(("captioner", path, dev), lambda p=path: load_captioner(p, device=dev))
                      for variant, path in paths.items()}
        clf = cached_style_classifier(classifier_path, dev, classifier_max_length)
        lms = cached_style_lms(lm_path)
        for frame in rebatch(frames, batch_size):
            yield caption_batch(frame, captioners, clf, lms, max_len)

    return evaluate_batches
