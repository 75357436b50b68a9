"""Generation and its quality filters as iterator pandas UDFs (mapInPandas), models loaded once per executor.

``make_generator`` turns candidate rows (retrieved style phrase + factual caption) into generated captions;
``make_candidate_scorer`` adds the classifier's verdict, the trigram perplexity under the target style's LM and the
three filter verdicts (:func:`models.augment_filters.apply_filters`).
"""
from __future__ import annotations

from typing import Callable, Iterator

import pandas as pd

from udfs.runtime import (cached_model, cached_style_classifier, cached_style_lms, limit_threads,
                          task_device)


def make_generator(model_path: str, kind: str, decoding: dict, device: str, max_source_len: int,
                   max_target_len: int) -> Callable[[Iterator[pd.DataFrame]], Iterator[pd.DataFrame]]:
    """mapInPandas: frames with ``style_phrase`` and ``factual_caption`` -> the same plus ``generated_caption``."""

    def generate_batches(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        from models.generator import generate, load_generator

        limit_threads()
        dev = task_device(device)
        gen = cached_model(("generator", model_path, dev),
                           lambda: load_generator(kind, model_path, device=dev, max_source_len=max_source_len,
                                                  max_target_len=max_target_len))
        for frame in frames:
            if frame.empty:
                continue
            out = frame.copy()
            out["generated_caption"] = generate(gen, frame["style_phrase"].tolist(), frame["factual_caption"].tolist(),
                                                **decoding)
            yield out

    return generate_batches


def score_candidates(frame: pd.DataFrame, clf, lms, ppl_max: float, min_similarity: float,
                     batch_size: int) -> pd.DataFrame:
    """Classifier verdict, perplexity and filter verdicts for generated captions (pure pandas + models)."""
    from models.augment_filters import apply_filters

    texts = frame["generated_caption"].fillna("").tolist()
    proba = clf.predict_proba(texts, batch_size=batch_size)
    out = frame.copy()
    out["predicted_style"] = [clf.labels[i] for i in proba.argmax(axis=1)]
    out["style_probability"] = [float(proba[row, clf.label_index(style)]) for row, style in enumerate(frame["style"])]
    known = frame["style"].isin(lms.styles)
    ppl = pd.Series(float("nan"), index=frame.index)
    if known.any():
        ppl[known] = lms.perplexities([texts[i] for i in range(len(texts)) if known.iloc[i]],
                                      frame.loc[known, "style"].tolist())
    out["perplexity"] = ppl.to_numpy()
    verdicts = apply_filters(out.rename(columns={"style": "target_style"}), ppl_max=ppl_max,
                             min_similarity=min_similarity)
    return verdicts.rename(columns={"target_style": "style"})


def make_candidate_scorer(classifier_path: str, classifier_max_length: int, lm_path: str, ppl_max: float,
                          min_similarity: float, batch_size: int,
                          device: str) -> Callable[[Iterator[pd.DataFrame]], Iterator[pd.DataFrame]]:
    def score_batches(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        limit_threads()
        clf = cached_style_classifier(classifier_path, task_device(device), classifier_max_length)
        lms = cached_style_lms(lm_path)
        for frame in frames:
            if not frame.empty:
                yield score_candidates(frame, clf, lms, ppl_max, min_similarity, batch_size)

    return score_batches
