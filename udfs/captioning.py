"""Captioning of test images as an iterator pandas UDF (mapInPandas): every trained captioner, loaded once per
executor process, writes a greedy caption for each (image, style) row, and the target style's evaluation classifier
and trigram LM score it in the same pass, through :func:`models.caption_scoring.score_captions` (the scoring that
generation's filters use).

Input frames carry ``image_id``, ``style`` and ``features`` (the image vector, ``array<float>``; with an
``n_regions`` column, ``regions * d`` values of which the first ``n_regions`` regions are real); each input row
gives one output row per captioner variant (``original`` / ``augmented``) in :data:`HYPOTHESIS_DDL`:
the hypothesis, the predicted label (the target style if its evaluation classifier gives it p > 0.5, else the
factual label), that probability, and the perplexity under the target style's LM (NaN where that style has no LM).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import numpy as np
import pandas as pd

from udfs.runtime import cached_caption_scoring, cached_model, limit_threads, rebatch, task_device

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


def region_layout(features, frame: pd.DataFrame, feature_dim: int):
    """``[rows, regions * d]`` features -> ``([rows, regions, d]``, padding mask or None``)``: the mask marks the
    regions past each row's ``n_regions`` (a frame without that column has one real region per ``d`` values)."""
    import torch

    if features.shape[1] % feature_dim:
        raise ValueError(f"feature vectors of {features.shape[1]} values do not split into regions of {feature_dim}")
    regions = features.view(features.shape[0], -1, feature_dim)
    if "n_regions" not in frame.columns or frame["n_regions"].isna().all():
        return regions, None
    counts = torch.as_tensor(frame["n_regions"].fillna(regions.shape[1]).to_numpy(dtype="int64"))
    return regions, torch.arange(regions.shape[1])[None, :] >= counts[:, None]


def caption_batch(frame: pd.DataFrame, captioners: Mapping[str, object], classifiers, lms,
                  max_len: int, no_repeat_ngram_size: int = 0) -> pd.DataFrame:
    """Greedy captions of ``frame``'s images by every captioner in its row's style, scored; one row per variant."""
    import torch

    from models.caption_scoring import score_captions
    from models.captioners import greedy_decode

    features = torch.from_numpy(stack_features(frame["features"]))
    styles = frame["style"].tolist()
    parts = []
    for variant, model in captioners.items():
        regions, mask = region_layout(features, frame, model.feature_dim)
        hypotheses = greedy_decode(model, regions, styles, max_len=max_len, region_padding_mask=mask,
                                   no_repeat_ngram_size=no_repeat_ngram_size)
        scored = score_captions(hypotheses, styles, classifiers, lms, batch_size=max(1, len(hypotheses)))
        parts.append(pd.concat([pd.DataFrame({"variant": variant, "image_id": frame["image_id"].to_numpy(),
                                              "style": styles, "hypothesis": hypotheses}), scored], axis=1))
    return pd.concat(parts, ignore_index=True)[HYPOTHESIS_COLUMNS]


def make_captioner_evaluator(captioner_paths: Mapping[str, str], classifiers_path: str, lm_path: str, max_len: int,
                             batch_size: int, device: str, no_repeat_ngram_size: int
                             ) -> Callable[[Iterator[pd.DataFrame]], Iterator[pd.DataFrame]]:
    """mapInPandas function: ``image_id, style, features`` -> :data:`HYPOTHESIS_DDL` rows, one per variant.

    ``captioner_paths`` maps a variant name to a folder written by :func:`models.captioners.save_captioner`;
    ``classifiers_path`` is the current ``evaluation_classifiers`` folder, ``lm_path`` the trigram LMs' file.
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
        classifiers, lms = cached_caption_scoring(classifiers_path, lm_path, dev)
        for frame in rebatch(frames, batch_size):
            yield caption_batch(frame, captioners, classifiers, lms, max_len, no_repeat_ngram_size)

    return evaluate_batches
