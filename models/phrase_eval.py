"""How well extracted style phrases find the words a stylized caption adds to the facts.

Gold. FlickrStyle10K and SentiCap give a stylized caption and, for the same image, factual captions. The gold
"added words" of a stylized caption are its words (:func:`models.text.caption_words`) that occur in none of the
factual captions of its image: exact, lower-cased word match, no stemming ("dogs" is not "dog"). Stopwords are
kept: style phrases such as "in love" or "with full joy" are partly function words, and gold and prediction then
live on the same tokens, none excluded from either side. Punctuation tokens are never gold (they are not words),
but a predicted punctuation token counts against precision like any wrong word.

Scores are micro-averaged over word positions of all captions: precision = TP / predicted words,
recall = TP / gold words, F1 their harmonic mean (each 0 when its denominator is 0).

Baselines with the same phrase size k per caption as the extractor (:func:`models.style_phrases.phrase_size`):
random k words (seeded), and the k words a style lexicon scores highest for the caption's style. The lexicon is
fitted on class corpora (factual and each style) and scores a word w for style s in one of two ways:

- ``"salience"`` (the style-marker lexicon of Delete-Retrieve-Generate, Li et al. 2018):
  (count(w, s) + lambda) / (count(w, other classes) + lambda), other classes being the factual corpus and the other
  styles, lambda = ``smoothing`` (default 1). Words frequent in style s and rare elsewhere rank first.
- ``"ctfidf"`` (class-based TF-IDF, Grootendorst 2022, one "document" per class corpus):
  tf(w, s) * log(1 + A / f(w)), tf the relative frequency of w in style s, f(w) its count over all classes, A the
  mean number of words per class. With only a handful of classes the class TF dominates, so inside a caption it
  tends to rank frequent function words first: a weak baseline, reported for reference.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

from models.style_phrases import phrase_size, top_k_masks
from models.text import caption_words, is_punctuation


def gold_added_mask(tokens: Sequence[str], factual_captions: Sequence[str]) -> list[bool]:
    """Per word of a stylized caption: True when no factual caption of the same image has that word."""
    if isinstance(factual_captions, str):
        raise ValueError("factual_captions must be a list of captions of the image, not a single string")
    if not factual_captions:
        raise ValueError("gold added words need at least one factual caption of the same image")
    factual_vocabulary = {word for caption in factual_captions for word in caption_words(caption)}
    return [not is_punctuation(word) and word not in factual_vocabulary for word in tokens]


@dataclass(frozen=True)
class PhraseScores:
    """Micro precision / recall / F1 of predicted phrase words against gold added words."""

    precision: float
    recall: float
    f1: float
    true_positives: int
    n_predicted: int
    n_gold: int
    n_captions: int

    def to_dict(self) -> dict:
        """Plain fields, for JSON or MLflow metrics."""
        return asdict(self)


def score_phrase_masks(predicted: Sequence[Sequence[bool]], gold: Sequence[Sequence[bool]]) -> PhraseScores:
    """Micro-averaged scores of per-caption predicted word masks against gold masks of the same lengths."""
    if len(predicted) != len(gold):
        raise ValueError(f"predicted and gold differ in captions: {len(predicted)} vs {len(gold)}")
    tp = n_predicted = n_gold = 0
    for index, (pred_mask, gold_mask) in enumerate(zip(predicted, gold)):
        if len(pred_mask) != len(gold_mask):
            raise ValueError(f"caption {index}: predicted mask has {len(pred_mask)} words, gold has {len(gold_mask)}")
        pred_array, gold_array = np.asarray(pred_mask, dtype=bool), np.asarray(gold_mask, dtype=bool)
        tp += int((pred_array & gold_array).sum())
        n_predicted += int(pred_array.sum())
        n_gold += int(gold_array.sum())
    precision = tp / n_predicted if n_predicted else 0.0
    recall = tp / n_gold if n_gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return PhraseScores(precision=precision, recall=recall, f1=f1, true_positives=tp, n_predicted=n_predicted,
                        n_gold=n_gold, n_captions=len(predicted))


def random_phrase_masks(token_lists: Sequence[Sequence[str]], eps: float, seed: int = 0) -> list[list[bool]]:
    """Baseline: k = phrase_size(T, eps) words per caption drawn uniformly at random (seeded)."""
    rng = np.random.default_rng(seed)
    return [top_k_masks(rng.random(len(tokens)), phrase_size(len(tokens), eps)).tolist() for tokens in token_lists]


LEXICON_SCORINGS = ("salience", "ctfidf")


class StyleLexicon:
    """Word scores per style from stylized and factual corpora (salience or c-TF-IDF, see the module docstring)."""

    def __init__(self, scores: dict[str, dict[str, float]], scoring: str) -> None:
        self.scores = scores
        self.scoring = scoring

    @property
    def styles(self) -> list[str]:
        """Styles the lexicon was fitted on."""
        return list(self.scores)

    @classmethod
    def fit(cls, stylized_captions: Sequence[str], styles: Sequence[str], factual_captions: Sequence[str],
            scoring: str = "salience", smoothing: float = 1.0) -> "StyleLexicon":
        """Count words per class (factual + each style) and score every word of every style."""
        if scoring not in LEXICON_SCORINGS:
            raise ValueError(f"scoring must be one of {LEXICON_SCORINGS}, got {scoring!r}")
        if not smoothing > 0:
            raise ValueError(f"smoothing must be > 0, got {smoothing!r}")
        if len(stylized_captions) != len(styles):
            raise ValueError(f"stylized captions and styles differ in length: {len(stylized_captions)} vs "
                             f"{len(styles)}")
        if not stylized_captions or not factual_captions:
            raise ValueError("the style lexicon needs stylized captions and factual captions; one set is empty")
        counts: dict[str, Counter] = {}
        for caption, style in zip(stylized_captions, styles):
            counts.setdefault(style, Counter()).update(caption_words(caption))
        factual = Counter(word for caption in factual_captions for word in caption_words(caption))
        overall = sum([*counts.values(), factual], Counter())
        mean_words = sum(overall.values()) / (len(counts) + 1)
        scores: dict[str, dict[str, float]] = {}
        for style, counter in counts.items():
            total = sum(counter.values())
            scores[style] = {word: ((count + smoothing) / (overall[word] - count + smoothing) if scoring == "salience"
                                    else count / total * math.log(1 + mean_words / overall[word]))
                             for word, count in counter.items()}
        return cls(scores, scoring)

    def score(self, word: str, style: str) -> float:
        """Score of ``word`` for ``style``; 0 (below every seen word) for a word never seen in that style."""
        if style not in self.scores:
            raise ValueError(f"style {style!r} is not in the lexicon: fitted styles are {self.styles}")
        return self.scores[style].get(word, 0.0)

    def phrase_masks(self, token_lists: Sequence[Sequence[str]], styles: Sequence[str],
                     eps: float) -> list[list[bool]]:
        """Baseline: per caption the k = phrase_size(T, eps) words scoring highest for its style."""
        if len(token_lists) != len(styles):
            raise ValueError(f"captions and styles differ in length: {len(token_lists)} vs {len(styles)}")
        return [top_k_masks(np.array([self.score(word, style) for word in tokens]),
                            phrase_size(len(tokens), eps)).tolist()
                for tokens, style in zip(token_lists, styles)]
