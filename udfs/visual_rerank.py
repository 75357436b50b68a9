"""Re-ranking a captioner's beam by visual relatedness (the textual visual context seed's use of its score), as an
iterator pandas UDF (mapInPandas) beside evaluation's greedy captioning (:mod:`udfs.captioning`).

Input frames carry ``image_id``, ``style``, ``features`` (as :mod:`udfs.captioning` takes them, with an optional
``n_regions`` column) and the image's visual context ``tags`` / ``tags_confidence``. For every captioner variant
the row's image gets a beam search (:func:`models.captioners.beam_decode`) in the row's style; every candidate is
scored by :mod:`models.visual_relatedness`; two rows come out per variant, in :data:`RERANK_DDL`:

- ``ranking = "beam"``: the beam's best caption by the model's own (length-normalised) log-probability;
- ``ranking = "visual"``: the candidate with the highest visual relatedness (the beam's order breaks ties),

each with its relatedness, its rank in the beam, the number of candidates, and the target style's evaluation
classifier probability and trigram perplexity (:func:`models.caption_scoring.score_captions`, as for the greedy
captions), so the report can show what re-ranking buys in caption metrics and what it costs in style.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import numpy as np
import pandas as pd

from udfs.runtime import cached_caption_scoring, cached_model, limit_threads, rebatch, task_device

RANKINGS = ("beam", "visual")
RERANK_DDL = ("variant string, ranking string, image_id string, style string, hypothesis string, "
              "relatedness double, beam_rank int, candidates int, predicted_style string, style_probability double, "
              "perplexity double")
RERANK_COLUMNS = ["variant", "ranking", "image_id", "style", "hypothesis", "relatedness", "beam_rank", "candidates",
                  "predicted_style", "style_probability", "perplexity"]


def _regions(features, frame: pd.DataFrame, feature_dim: int):
    """Features laid out for the captioner: :func:`udfs.captioning.region_layout` where it exists (region features
    with ``n_regions``), else the stacked vectors as they are."""
    import udfs.captioning as captioning

    layout = getattr(captioning, "region_layout", None)
    return layout(features, frame, feature_dim) if layout is not None else (features, None)


def pick_visual(relatedness: np.ndarray) -> int:
    """The index of the most related candidate; the earliest (best by the beam) on ties; 0 when none is scored."""
    values = np.where(np.isnan(relatedness), -np.inf, relatedness)
    return int(np.argmax(values)) if len(values) else 0


def rerank_batch(frame: pd.DataFrame, captioners: Mapping[str, object], scorer, classifiers, lms, beam_size: int,
                 max_len: int, length_penalty: float, no_repeat_ngram_size: int = 0) -> pd.DataFrame:
    """Beam candidates of ``frame``'s images by every captioner, the beam's pick and the visual pick per image."""
    import torch

    from models.caption_scoring import score_captions
    from models.captioners import beam_decode
    from udfs.captioning import stack_features
    from udfs.visual_relatedness import context_of

    features = torch.from_numpy(stack_features(frame["features"]))
    styles = frame["style"].tolist()
    tags, conf = context_of(frame)
    rows = []
    for variant, model in captioners.items():
        regions, mask = _regions(features, frame, model.feature_dim)
        beams = beam_decode(model, regions, styles, beam_size=beam_size, max_len=max_len,
                            length_penalty=length_penalty, region_padding_mask=mask,
                            no_repeat_ngram_size=no_repeat_ngram_size)
        flat = [(i, rank, caption) for i, candidates in enumerate(beams) for rank, (caption, _) in enumerate(candidates)]
        scores = scorer.score([c for _, _, c in flat], [tags[i] for i, _, _ in flat], [conf[i] for i, _, _ in flat])
        start = 0
        for i, candidates in enumerate(beams):
            related = scores[start:start + len(candidates)]
            start += len(candidates)
            visual = pick_visual(related)
            for ranking, rank in (("beam", 0), ("visual", visual)):
                rows.append({"variant": variant, "ranking": ranking, "image_id": frame["image_id"].iloc[i],
                             "style": styles[i], "hypothesis": candidates[rank][0] if candidates else "",
                             "relatedness": float(related[rank]) if len(related) else float("nan"),
                             "beam_rank": rank, "candidates": len(candidates)})
    out = pd.DataFrame(rows, columns=RERANK_COLUMNS[:8])
    scored = score_captions(out["hypothesis"].tolist(), out["style"].tolist(), classifiers, lms,
                            batch_size=max(1, len(out)))
    return pd.concat([out, scored.reset_index(drop=True)], axis=1)[RERANK_COLUMNS]


def make_beam_reranker(captioner_paths: Mapping[str, str], classifiers_path: str, lm_path: str | None, visual: dict,
                       beam_size: int, max_len: int, length_penalty: float, batch_size: int,
                       device: str, no_repeat_ngram_size: int
                       ) -> Callable[[Iterator[pd.DataFrame]], Iterator[pd.DataFrame]]:
    """mapInPandas function: ``image_id, style, features, tags, tags_confidence`` -> :data:`RERANK_DDL` rows.

    ``visual`` is :func:`udfs.visual_relatedness.visual_options`; the other arguments as for
    :func:`udfs.captioning.make_captioner_evaluator`."""
    if not captioner_paths:
        raise ValueError("no captioners given: captioner_paths maps a variant (original/augmented) to a model folder")
    paths = dict(captioner_paths)

    def rerank_batches(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        from models.captioners import load_captioner
        from udfs.visual_relatedness import cached_relatedness_scorer

        limit_threads()
        dev = task_device(device)
        captioners = {variant: cached_model(("captioner", path, dev), lambda p=path: load_captioner(p, device=dev))
                      for variant, path in paths.items()}
        classifiers, lms = cached_caption_scoring(classifiers_path, lm_path, dev)
        scorer = cached_relatedness_scorer(visual, dev)
        for frame in rebatch(frames, batch_size):
            if not frame.empty:
                yield rerank_batch(frame, captioners, scorer, classifiers, lms, beam_size, max_len, length_penalty,
                                   no_repeat_ngram_size)

    return rerank_batches
