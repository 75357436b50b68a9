"""Style phrase extraction (paper Sec. 3.1, Eq. 1-2): attention scoring, head selection, phrase and content.

Eq. 1, word importance. For layer l and head h of the fine-tuned style classifier, the importance of word w_t of a
caption is the [CLS] query's softmax attention on it. Word pieces are merged back to the caption's words
(:func:`models.text.caption_words`, mapped with the fast tokenizer's ``word_ids``) by summing the attention of a
word's pieces; [CLS], [SEP] and padding are excluded, so per (l, h) a caption's word scores sum to at most 1.
Words truncated away (beyond ``max_length`` word pieces) score 0. Layers and heads are numbered from 0.

Phrase size. With extraction proportion eps in (0, 1) and T words, a style phrase has
``k = min(ceil(eps * T), T - 1)`` words for T >= 2 (at least one word, and the content is never empty) and
``k = 0`` for T <= 1 (a one-word caption is all content; an empty caption has empty phrase and content).
The top-k words are taken by importance, ties going to the earlier word; the phrase keeps caption order.

Eq. 2, head selection. For every (l, h), the top-k words under (l, h) are removed from each stylized caption y of
style s and the classifier's confidence c(h, l, y) = p(s | y minus words) / sum_{s' != s} p(s' | y minus words)
is measured, s' running over S', the other styles of s's style set (the factual class is never in the sum, so at
least two styles are needed). With the extractor's per-set classifier (labels = the set's styles) S' is simply the
classifier's other styles; ``comparison_styles`` gives S' explicitly for a classifier spanning several sets. The mean over the selection set gives a confidence matrix [L, H]; (l_s, h_s) is its argmin (the head
whose top words carry the style). Captions with k = 0 cannot move the confidence and are left out of the set.
Per batch this costs one forward pass with attentions and one batched forward pass of the reduced captions; the
L*H reduced variants of a caption are deduplicated (heads often agree on the top words) before classification.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Mapping, Optional, Sequence

import numpy as np
import torch

from models.style_classifier import StyleClassifier, check_batch_size
from models.text import caption_words

DEFAULT_EPS = 0.25
# eps * T is rounded up; a float product such as 0.7 * 10 = 7.000000000000001 must still give 7.
_CEIL_TOLERANCE = 1e-9


def validate_eps(eps: float) -> float:
    """The extraction proportion eps as a float in the open interval (0, 1); ValueError otherwise."""
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or not 0 < eps < 1:
        raise ValueError(f"extraction proportion eps must be a number in (0, 1), e.g. 0.25; got {eps!r}")
    return float(eps)


def phrase_size(n_words: int, eps: float) -> int:
    """Words k in the style phrase of a T-word caption: min(ceil(eps*T), T-1) for T >= 2, else 0."""
    eps = validate_eps(eps)
    if n_words < 0:
        raise ValueError(f"a caption has a non-negative number of words, got {n_words}")
    if n_words <= 1:
        return 0
    return min(math.ceil(eps * n_words - _CEIL_TOLERANCE), n_words - 1)


def top_k_masks(scores: np.ndarray, k: int) -> np.ndarray:
    """Boolean masks of the k highest scores along the last axis (ties go to the earlier word)."""
    scores = np.asarray(scores)
    n_words = scores.shape[-1]
    if not 0 <= k <= n_words:
        raise ValueError(f"k must be in [0, {n_words}] for {n_words} words, got {k}")
    order = np.argsort(-scores, axis=-1, kind="stable")[..., :k]
    masks = np.zeros(scores.shape, dtype=bool)
    np.put_along_axis(masks, order, True, axis=-1)
    return masks


@dataclass(frozen=True)
class StylePhrase:
    """One stylized caption split into its style phrase e^s and content (one row of ``style_phrases``)."""

    tokens: list[str]
    importance: list[float]
    phrase_mask: list[bool]
    phrase_words: list[str]
    style_phrase: str
    content: str
    layer: int
    head: int
    eps: float

    @property
    def content_words(self) -> list[str]:
        """The content's words in caption order."""
        return [word for word, in_phrase in zip(self.tokens, self.phrase_mask) if not in_phrase]

    def reassemble(self) -> list[str]:
        """Merge phrase words and content words back into the caption's words through ``phrase_mask``."""
        phrase, content = iter(self.phrase_words), iter(self.content.split())
        return [next(phrase) if in_phrase else next(content) for in_phrase in self.phrase_mask]

    def to_dict(self) -> dict:
        """Plain fields, for a pandas row."""
        return asdict(self)


def split_caption(tokens: Sequence[str], scores: np.ndarray, eps: float, layer: int, head: int) -> StylePhrase:
    """Take the top-k words of ``tokens`` under ``scores`` (one importance per word) as the style phrase."""
    scores = np.asarray(scores, dtype=np.float64)
    if scores.shape != (len(tokens),):
        raise ValueError(f"need one importance score per word: {len(tokens)} words, scores of shape {scores.shape}")
    mask = top_k_masks(scores, phrase_size(len(tokens), eps))
    phrase = [word for word, in_phrase in zip(tokens, mask) if in_phrase]
    content = [word for word, in_phrase in zip(tokens, mask) if not in_phrase]
    return StylePhrase(tokens=list(tokens), importance=scores.tolist(), phrase_mask=mask.tolist(),
                       phrase_words=phrase, style_phrase=" ".join(phrase), content=" ".join(content),
                       layer=int(layer), head=int(head), eps=float(eps))


def _batch_importance(clf: StyleClassifier, word_lists: Sequence[Sequence[str]]) -> list[np.ndarray]:
    """Eq. 1 for one batch: a float32 array [L, H, T_i] per caption from a single forward pass."""
    encoding = clf.encode_words(word_lists)
    with torch.inference_mode():
        attentions = clf.model(**encoding, output_attentions=True).attentions
    if attentions is None or len(attentions) == 0 or attentions[0] is None:
        raise ValueError("the classifier returned no attention maps: load it with attn_implementation='eager'")
    cls_attention = torch.stack([layer[:, :, 0, :] for layer in attentions], dim=1).float()  # [B, L, H, S]
    max_words = max((len(words) for words in word_lists), default=0)
    if max_words == 0:
        return [np.zeros((clf.num_layers, clf.num_heads, 0), dtype=np.float32) for _ in word_lists]
    word_ids = torch.tensor([[-1 if wid is None else wid for wid in encoding.word_ids(row)]
                             for row in range(len(word_lists))], device=cls_attention.device)  # [B, S]
    piece_to_word = torch.nn.functional.one_hot(word_ids.clamp(min=0), max_words).float()
    piece_to_word *= (word_ids >= 0).unsqueeze(-1).float()  # special tokens and padding map to no word
    importance = torch.einsum("blhs,bst->blht", cls_attention, piece_to_word).cpu().numpy()
    return [importance[row, :, :, :len(words)] for row, words in enumerate(word_lists)]


def _importance_of_words(clf: StyleClassifier, word_lists: Sequence[Sequence[str]],
                         batch_size: int) -> list[np.ndarray]:
    check_batch_size(batch_size)
    out: list[np.ndarray] = []
    for start in range(0, len(word_lists), batch_size):
        out.extend(_batch_importance(clf, word_lists[start:start + batch_size]))
    return out


def word_importance(clf: StyleClassifier, captions: Sequence[str], batch_size: int = 32) -> list[np.ndarray]:
    """Eq. 1: per caption an array [L, H, T] of [CLS]-attention importance of each of its T words."""
    return _importance_of_words(clf, [caption_words(caption) for caption in captions], batch_size)


@dataclass(frozen=True)
class HeadSelection:
    """The chosen style head (l_s, h_s) with the mean confidence matrix it minimises (Eq. 2)."""

    layer: int
    head: int
    confidence: np.ndarray  # [L, H] mean c(h, l, y) over the selection set
    eps: float
    n_captions: int

    def to_dict(self) -> dict:
        """JSON-ready fields (confidence as nested lists)."""
        return {"layer": self.layer, "head": self.head, "confidence": self.confidence.tolist(), "eps": self.eps,
                "n_captions": self.n_captions}


def eq2_confidence(log_proba: np.ndarray, own: int, others: Sequence[int]) -> np.ndarray:
    """Eq. 2 from log-probabilities ``[..., n_labels]``: p(own) / sum of p(others), computed in log space."""
    log_proba = np.asarray(log_proba, dtype=np.float64)
    others = list(others)
    if not others:
        raise ValueError("Eq. 2 needs at least one other style s' to compare against")
    if own in others:
        raise ValueError(f"the style's own column {own} cannot also be among the other styles {others}")
    return np.exp(log_proba[..., own] - np.logaddexp.reduce(log_proba[..., others], axis=-1))


def comparison_columns(clf: StyleClassifier,
                       comparison_styles: Optional[Mapping[str, Sequence[str]]] = None) -> dict[str, list[int]]:
    """Per style of the classifier, the label columns of S' (its other styles, or ``comparison_styles[style]``)."""
    out = {}
    for style in clf.styles:
        others = [s for s in clf.styles if s != style] if comparison_styles is None else \
            list(comparison_styles.get(style, []))
        bad = [s for s in others if s not in clf.styles or s == style]
        if bad:
            raise ValueError(f"S' of {style!r} must be other styles of the classifier {clf.styles}, got {bad}")
        out[style] = [clf.label_index(s) for s in others]
    return out


def head_confidence(clf: StyleClassifier, captions: Sequence[str], styles: Sequence[str], eps: float = DEFAULT_EPS,
                    batch_size: int = 32,
                    comparison_styles: Optional[Mapping[str, Sequence[str]]] = None) -> np.ndarray:
    """Eq. 2 per caption: c(h, l, y) after removing the top-k words under each (l, h) -> array [n, L, H].

    Every caption needs k >= 1 (at least two words); see :func:`select_style_head` for the selection set.
    ``comparison_styles`` maps a style to S' (default: the classifier's other styles).
    """
    eps = validate_eps(eps)
    check_batch_size(batch_size)
    if len(captions) != len(styles):
        raise ValueError(f"captions and styles differ in length: {len(captions)} captions, {len(styles)} styles")
    if len(clf.styles) < 2:
        raise ValueError(f"Eq. 2 compares a style against the other styles: the classifier has only {clf.styles}")
    unknown = sorted({style for style in styles if style not in clf.styles})
    if unknown:
        raise ValueError(f"styles {unknown} are not stylized labels of the classifier: allowed are {clf.styles}")
    word_lists = [caption_words(caption) for caption in captions]
    columns = comparison_columns(clf, comparison_styles)
    empty = sorted({style for style in styles if not columns[style]})
    if empty:
        raise ValueError(f"Eq. 2 compares a style against the other styles of its set: {empty} have none")
    short = [caption for caption, words in zip(captions, word_lists) if phrase_size(len(words), eps) == 0]
    if short:
        raise ValueError(f"captions need at least two words for head selection, got {short[:3]!r}")
    n_layers, n_heads = clf.num_layers, clf.num_heads
    out = np.zeros((len(captions), n_layers, n_heads), dtype=np.float64)
    for start in range(0, len(word_lists), batch_size):
        batch_words = word_lists[start:start + batch_size]
        variants: dict[tuple, int] = {}
        variant_of = np.zeros((len(batch_words), n_layers, n_heads), dtype=np.int64)
        for row, (words, importance) in enumerate(zip(batch_words, _batch_importance(clf, batch_words))):
            masks = top_k_masks(importance, phrase_size(len(words), eps))  # [L, H, T]
            for layer in range(n_layers):
                for head in range(n_heads):
                    reduced = tuple(word for word, removed in zip(words, masks[layer, head]) if not removed)
                    variant_of[row, layer, head] = variants.setdefault(reduced, len(variants))
        log_proba = clf.log_proba_words(list(variants), batch_size=batch_size)  # dict keeps insertion order
        for row, style in enumerate(styles[start:start + batch_size]):
            out[start + row] = eq2_confidence(log_proba[variant_of[row]], clf.label_index(style), columns[style])
    return out


def select_style_head(clf: StyleClassifier, captions: Sequence[str], styles: Sequence[str],
                      eps: float = DEFAULT_EPS, batch_size: int = 32, max_captions: Optional[int] = None,
                      seed: int = 0, comparison_styles: Optional[Mapping[str, Sequence[str]]] = None) -> HeadSelection:
    """Eq. 2: choose (l_s, h_s) minimising the mean confidence over stylized captions with their styles.

    Captions with fewer than two words are left out; ``max_captions`` samples that many of the rest (seeded).
    """
    eps = validate_eps(eps)
    if len(captions) != len(styles):
        raise ValueError(f"captions and styles differ in length: {len(captions)} captions, {len(styles)} styles")
    usable = [index for index, caption in enumerate(captions) if phrase_size(len(caption_words(caption)), eps) > 0]
    if not usable:
        raise ValueError("head selection needs stylized captions of at least two words; none were given")
    if max_captions is not None:
        if not isinstance(max_captions, int) or max_captions < 1:
            raise ValueError(f"max_captions must be a positive integer or None, got {max_captions!r}")
        if max_captions < len(usable):
            chosen = np.random.default_rng(seed).choice(len(usable), size=max_captions, replace=False)
            usable = [usable[index] for index in sorted(chosen)]
    confidence = head_confidence(clf, [captions[index] for index in usable], [styles[index] for index in usable],
                                 eps, batch_size, comparison_styles).mean(axis=0)
    layer, head = np.unravel_index(int(np.argmin(confidence)), confidence.shape)
    return HeadSelection(layer=int(layer), head=int(head), confidence=confidence, eps=eps, n_captions=len(usable))


def extract_style_phrases(clf: StyleClassifier, captions: Sequence[str], layer: int, head: int,
                          eps: float = DEFAULT_EPS, batch_size: int = 32) -> list[StylePhrase]:
    """Split each caption into style phrase (top-k words under head (layer, head)) and content."""
    eps = validate_eps(eps)
    if not 0 <= layer < clf.num_layers or not 0 <= head < clf.num_heads:
        raise ValueError(f"(layer, head) = ({layer}, {head}) is out of range: layers 0..{clf.num_layers - 1}, "
                         f"heads 0..{clf.num_heads - 1}")
    word_lists = [caption_words(caption) for caption in captions]
    return [split_caption(words, importance[layer, head], eps, layer, head)
            for words, importance in zip(word_lists, _importance_of_words(clf, word_lists, batch_size))]
