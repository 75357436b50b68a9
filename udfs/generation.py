"""Generation and its quality filters as iterator pandas UDFs (mapInPandas), models loaded once per executor.

``make_generator`` turns candidate rows (retrieved style phrase + factual caption) into generated captions;
``make_candidate_scorer`` adds, through the scoring module that evaluation uses too
(:func:`models.caption_scoring.score_captions`), the target style's evaluation-classifier probability and the
trigram perplexity under the target style's LM, then the content fidelity (sentence-encoder cosine between the
generated and the factual caption), the well-formedness check, and every filter verdict
(:func:`models.augment_filters.apply_filters`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pandas as pd

from udfs.runtime import cached_caption_scoring, cached_model, limit_threads, rebatch, task_device

SCORED_COLUMNS = ["predicted_style", "style_probability", "perplexity", "content_similarity", "passed_style",
                  "passed_perplexity", "passed_similarity", "passed_content", "passed_well_formed", "passed",
                  "reject_reason", "factual_relatedness", "generated_relatedness", "passed_visual", "fluency",
                  "passed_fluent"]


def transfer_phrases(frame: pd.DataFrame, propensity_path: str | None) -> tuple[list[str], list[bool]]:
    """The phrase each candidate asks the generator to place (:mod:`models.phrase_transfer`), from the retrieved
    scene's ``phrase_tokens`` / ``phrase_mask``, the factual caption and the target style, and whether it is a
    whole clause (written at the caption's end); the whole ``style_phrase`` without a propensity file (the paper's e^s)."""
    if not propensity_path:
        return frame["style_phrase"].tolist(), [False] * len(frame)
    from models.phrase_transfer import load_propensity, transfer_split

    propensity, p_min, clause_words = cached_model(("phrase_propensity", propensity_path),
                                                   lambda: load_propensity(propensity_path))
    splits = [transfer_split(list(t), list(m), propensity, p_min, f, clause_words.get(s, 0))
              for t, m, f, s in zip(frame["phrase_tokens"], frame["phrase_mask"], frame["factual_caption"],
                                    frame["style"])]
    return [phrase for phrase, _ in splits], [is_clause for _, is_clause in splits]


def make_generator(model_path: str, kind: str, decoding: dict, device: str, max_source_len: int,
                   max_target_len: int,
                   propensity_path: str | None = None) -> Callable[[Iterator[pd.DataFrame]], Iterator[pd.DataFrame]]:
    """mapInPandas: candidate frames -> the same (less the phrase tokens / mask) plus ``transfer_phrase`` and
    ``generated_caption`` ("" where the transfer phrase is empty: no style word to place, nothing generated).

    ``decoding`` holds :func:`models.generator.generate`'s options (strategy, beams, no-repeat n-grams,
    repetition penalty, constraint, batch size, seed, ...)."""

    def generate_batches(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        from models.generator import generate, load_generator

        limit_threads()
        dev = task_device(device)
        gen = cached_model(("generator", model_path, dev),
                           lambda: load_generator(kind, model_path, device=dev, max_source_len=max_source_len,
                                                  max_target_len=max_target_len))
        for frame in rebatch(frames, max(1, int(decoding.get("batch_size", 32))) * 4):
            if frame.empty:
                continue
            out = frame.drop(columns=[c for c in ("phrase_tokens", "phrase_mask") if c in frame.columns])
            phrases, clauses = transfer_phrases(frame, propensity_path)
            out["transfer_phrase"] = phrases
            out["generated_caption"] = ""
            todo = (out["transfer_phrase"] != "").to_numpy()
            if todo.any():
                contiguous = [c for c, t in zip(clauses, todo) if t] if any(clauses) else None
                out.loc[todo, "generated_caption"] = generate(
                    gen, out.loc[todo, "transfer_phrase"].tolist(), out.loc[todo, "factual_caption"].tolist(),
                    **decoding, contiguous=contiguous)
            yield out

    return generate_batches


def make_grafter(propensity_path: str | None) -> Callable[[Iterator[pd.DataFrame]], Iterator[pd.DataFrame]]:
    """mapInPandas like :func:`make_generator`, without a model: ``generated_caption`` is the transfer phrase
    appended to the factual caption (:func:`models.generator.graft`; "" where the phrase is empty), the graft
    ablation of ``erg experiment``."""

    def graft_batches(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        from models.generator import graft

        for frame in frames:
            if frame.empty:
                continue
            out = frame.drop(columns=[c for c in ("phrase_tokens", "phrase_mask") if c in frame.columns])
            phrases, _ = transfer_phrases(frame, propensity_path)
            out["transfer_phrase"] = phrases
            grafted = graft(phrases, out["factual_caption"].tolist())
            out["generated_caption"] = [g if p else "" for g, p in zip(grafted, phrases)]
            yield out

    return graft_batches


def load_vocabulary(path: str | None) -> frozenset[str]:
    """The known words (one per line) that the well-formedness check accepts; empty when ``path`` is None."""
    if not path:
        return frozenset()
    return frozenset(w for w in Path(path).read_text(encoding="utf-8").split("\n") if w)


def content_similarity(encoder, generated: list[str], factual: list[str], batch_size: int) -> np.ndarray:
    """Cosine between each generated caption and its factual caption under the (L2-normalised) sentence encoder;
    NaN where nothing was generated (an empty caption: the content filter fails it)."""
    out = np.full(len(generated), np.nan)
    rows = [i for i, g in enumerate(generated) if isinstance(g, str) and g.strip()]
    if rows:
        a = encoder.encode_texts([generated[i] for i in rows], batch_size=batch_size)
        b = encoder.encode_texts([factual[i] for i in rows], batch_size=batch_size)
        out[rows] = (np.asarray(a, dtype=np.float64) * np.asarray(b, dtype=np.float64)).sum(axis=1)
    return out


def score_candidates(frame: pd.DataFrame, classifiers, lms, encoder, vocabulary: frozenset[str], filters: dict,
                     batch_size: int, relatedness_scorer=None, fluency_model=None) -> pd.DataFrame:
    """Scores and every filter verdict for generated captions (pure pandas + models).

    ``filters``: ``ppl_max``, ``min_similarity``, ``min_content_similarity`` and ``well_formed`` (bool), as in
    ``generate.filters``. A word of the generated caption is known if it is in ``vocabulary`` or in the candidate's
    own factual caption or style phrase. The perplexity of a caption is taken with the background folds that do not
    hold its factual caption's image. A candidate whose transfer phrase is empty fails with reason
    ``no_style_words``. With a ``relatedness_scorer`` (:mod:`udfs.visual_relatedness`), the factual and the generated
    caption's visual relatedness to the image's ``tags`` (NaN without them) are kept, and ``filters``'s
    ``max_relatedness_drop`` (None: off) judges them. With a ``fluency_model`` (:mod:`models.fluency`) each caption's
    p(fluent) is ``fluency`` and ``filters``'s ``min_fluency`` judges it (NaN and the filter off without one)."""
    from models.augment_filters import apply_filters
    from models.caption_quality import well_formedness
    from models.caption_scoring import score_captions
    from models.text import caption_words

    texts = frame["generated_caption"].fillna("").tolist()
    out = frame.copy()
    folds = None
    if lms is not None and getattr(lms, "backgrounds", None) and "image_id" in frame.columns:
        from models.trigram_lm import fold_of

        folds = [fold_of(i, len(lms.backgrounds)) for i in frame["image_id"]]
    scores = score_captions(texts, frame["style"].tolist(), classifiers, lms, batch_size=batch_size, folds=folds)
    for column in scores.columns:
        out[column] = scores[column].to_numpy()
    out["content_similarity"] = content_similarity(encoder, texts, frame["factual_caption"].tolist(), batch_size)
    out["factual_relatedness"] = out["generated_relatedness"] = np.nan
    if relatedness_scorer is not None:
        from udfs.visual_relatedness import relatedness

        out["factual_relatedness"] = relatedness(relatedness_scorer, frame, frame["factual_caption"].tolist())
        out["generated_relatedness"] = relatedness(relatedness_scorer, frame, texts)
    out["fluency"] = np.nan
    if fluency_model is not None:
        from models.fluency import fluency_probability

        rows = [i for i, t in enumerate(texts) if t.strip()]
        values = np.full(len(texts), np.nan)
        values[rows] = fluency_probability(fluency_model, [texts[i] for i in rows], batch_size)
        out["fluency"] = values
    out["well_formed_reason"] = [
        well_formedness(text, vocabulary, caption_words(fact) + caption_words(phrase))
        for text, fact, phrase in zip(texts, frame["factual_caption"], frame["style_phrase"])]
    verdicts = apply_filters(out.rename(columns={"style": "target_style"}), ppl_max=filters["ppl_max"],
                             min_similarity=filters["min_similarity"],
                             min_content_similarity=filters["min_content_similarity"],
                             well_formed=bool(filters["well_formed"]),
                             max_relatedness_drop=filters.get("max_relatedness_drop"),
                             min_fluency=filters.get("min_fluency") if fluency_model is not None else None)
    if "transfer_phrase" in verdicts.columns:
        empty = (verdicts["transfer_phrase"].fillna("") == "").to_numpy()
        verdicts.loc[empty, "passed"] = False
        verdicts.loc[empty, "reject_reason"] = "no_style_words"
    return verdicts.rename(columns={"target_style": "style"}).drop(columns=["well_formed_reason"])


def make_candidate_scorer(classifiers_path: str, lm_path: str, vocabulary_path: str | None, encoder_name: str,
                          filters: dict, batch_size: int, device: str, visual: dict | None = None,
                          fluency_path: str | None = None) -> Callable[[Iterator[pd.DataFrame]], Iterator[pd.DataFrame]]:
    """mapInPandas: generated candidates -> the same plus :data:`SCORED_COLUMNS`; ``visual``
    (:func:`udfs.visual_relatedness.visual_options`) scores visual relatedness where the rows carry ``tags``;
    ``fluency_path`` (a saved fluency discriminator) scores fluency for ``filters["min_fluency"]``."""

    def score_batches(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        from models.encoders import SentenceEncoder

        limit_threads()
        dev = task_device(device)
        classifiers, lms = cached_caption_scoring(classifiers_path, lm_path, dev)
        encoder = cached_model(("sentence_encoder", encoder_name, dev), lambda: SentenceEncoder(encoder_name, dev))
        vocabulary = cached_model(("vocabulary", vocabulary_path), lambda: load_vocabulary(vocabulary_path))
        scorer = None
        if visual is not None:
            from udfs.visual_relatedness import cached_relatedness_scorer

            scorer = cached_relatedness_scorer(visual, dev)
        fluency = None
        if fluency_path:
            from models.style_classifier import load_style_classifier

            fluency = cached_model(("fluency", fluency_path, dev),
                                   lambda: load_style_classifier(fluency_path, device=dev,
                                                                 max_length=int(filters.get("fluency_max_length", 40))))
        for frame in frames:
            if not frame.empty:
                yield score_candidates(frame, classifiers, lms, encoder, vocabulary, filters, batch_size, scorer,
                                       fluency)

    return score_batches
