"""Word trigram language models with interpolated Kneser-Ney smoothing, one per style.

The Generate step keeps a generated caption only if its perplexity under a trigram LM of the target style is below
a threshold (paper: 80). The LM is trained on that style's stylized captions.

Model (Chen & Goodman's interpolated Kneser-Ney, one absolute discount D_n per order):

- every sentence is ``<s> <s> w_1 .. w_T </s>``; words are ``models.text.caption_words``; words seen fewer than
  ``min_count`` times in training, and any unseen word at scoring time, are ``<unk>``;
- ``P3(w|u,v) = max(c(uvw) - D3, 0) / c(uv.) + D3 N1+(uv.) / c(uv.) * P2(w|v)`` with raw counts ``c``;
- ``P2(w|v) = max(N1+(.vw) - D2, 0) / N1+(.v.) + D2 N1+(v.)' / N1+(.v.) * P1(w)`` with continuation counts
  ``N1+(.vw)`` (distinct u before ``vw``) and ``N1+(v.)'`` (distinct w with ``N1+(.vw) > 0``);
- ``P1(w) = max(N1+(.w) - D1, 0) / N1+(..) + D1 N1+(w)' / N1+(..) / |V|`` interpolated with the uniform
  distribution over the predictable vocabulary V (every word, ``<unk>`` and ``</s>``; not ``<s>``), so that
  ``<unk>`` has probability mass;
- an unseen context falls back to the next lower order. Each conditional distribution sums to 1 over V.

``D_n = n1 / (n1 + 2 n2)`` from the count-of-counts of that order (Ney et al.), or 0.75 where n1 or n2 is 0.
Perplexity is ``exp(-mean log P)`` over the T words and ``</s>``. Counts live in sorted int64 key arrays, so scoring
is vectorised with ``numpy.searchsorted``. With ``oov="skip"`` a word that the model has never seen is counted, not
scored (as SRILM's ``ngram -ppl`` does with a closed vocabulary): the perplexity then measures how the known words
follow each other, and a rare but real content word does not decide the verdict (non-words are the
well-formedness filter's job).

``StyleLanguageModels`` scores a caption under its target style. Each style's LM can be interpolated (weights fitted
by EM on held-out captions of that style) with the LMs of the other styles and with a *background* LM of factual
captions, which a style corpus of a few thousand captions needs: alone it rejects a third of genuine held-out
captions at the paper's threshold. The background comes in ``k`` folds (a factual caption's fold is
:func:`fold_of` its image); a sentence of fold ``f`` is scored with the folds other than ``f``, so a generated caption
never meets a background that was trained on its own factual caption.
"""
from __future__ import annotations

import json
import math
import zlib
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from models.text import caption_words

BOS, EOS, UNK = "<s>", "</s>", "<unk>"
SPECIALS = (BOS, EOS, UNK)
FORMAT = "erg-kn-trigram/1"
STYLE_FORMAT = "erg-style-lms/2"
FALLBACK_DISCOUNT = 0.75
OOV_MODES = ("score", "skip")


def fold_of(key: str, folds: int) -> int:
    """The background fold of a factual caption, from its image id (stable across processes: CRC-32)."""
    if folds < 1:
        raise ValueError(f"folds must be >= 1, got {folds}")
    return zlib.crc32(str(key).encode("utf-8")) % folds


def sentence_trigrams(sentence: str) -> list[tuple[str, str, str]]:
    """The word trigrams a trigram LM counts for one sentence: ``<s> <s> w_1 .. w_T </s>``."""
    words = [BOS, BOS] + caption_words(sentence) + [EOS]
    return [(words[i - 2], words[i - 1], words[i]) for i in range(2, len(words))]


def _discount(counts: np.ndarray) -> float:
    n1, n2 = int((counts == 1).sum()), int((counts == 2).sum())
    return n1 / (n1 + 2 * n2) if n1 > 0 and n2 > 0 else FALLBACK_DISCOUNT


def _to_ids(word_ids: Mapping[str, int], words: Sequence[str]) -> list[int]:
    """Word ids; unknown words, and words spelled like a special token, are <unk> (id 2)."""
    return [2 if w in SPECIALS else word_ids.get(w, 2) for w in words]


def _lookup(keys: np.ndarray, values: np.ndarray, query: np.ndarray) -> np.ndarray:
    """``values`` at ``query`` positions of sorted ``keys``; 0 where a query key is absent."""
    if len(keys) == 0:
        return np.zeros(len(query), dtype=np.float64)
    pos = np.minimum(np.searchsorted(keys, query), len(keys) - 1)
    return np.where(keys[pos] == query, values[pos], 0).astype(np.float64)


def _group(keys: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Unique sorted ``keys`` with the sum of ``weights`` and the number of rows for each."""
    uniq, inverse, types = np.unique(keys, return_inverse=True, return_counts=True)
    return uniq, np.bincount(inverse, weights=weights, minlength=len(uniq)), types.astype(np.float64)


class TrigramLM:
    """An interpolated Kneser-Ney trigram LM over caption words (build it with ``TrigramLM.train``)."""

    def __init__(
        self, vocab: Sequence[str], trigrams: np.ndarray, counts: np.ndarray, discounts: Sequence[float] | None = None
    ) -> None:
        """``vocab``: words by id, starting with ``<s>``, ``</s>``, ``<unk>``; ``trigrams``: (n, 3) ids, unique rows;
        ``counts``: their raw counts; ``discounts``: (D1, D2, D3), estimated from the counts when None."""
        if tuple(vocab[:3]) != SPECIALS:
            raise ValueError(f"vocab must start with {SPECIALS}, got {tuple(vocab[:3])}")
        self.vocab = list(vocab)
        self.word_ids = {w: i for i, w in enumerate(self.vocab)}
        size = self.size = len(self.vocab)
        tri = np.asarray(trigrams, dtype=np.int64).reshape(-1, 3)
        self.counts = np.asarray(counts, dtype=np.float64)
        if len(tri) != len(self.counts) or len(tri) == 0 or (self.counts < 1).any():
            raise ValueError("trigrams and counts must be non-empty, of equal length, with counts >= 1")
        if tri.min() < 0 or tri.max() >= size:
            raise ValueError(f"trigram ids must lie in [0, {size})")
        keys = (tri[:, 0] * size + tri[:, 1]) * size + tri[:, 2]
        order = np.argsort(keys)
        self.tri_keys, self.counts, self.trigrams = keys[order], self.counts[order], tri[order]
        if (np.diff(self.tri_keys) == 0).any():
            raise ValueError("trigrams must be unique rows")
        # Highest order: raw counts by context (u, v).
        self.ctx3_keys, self.ctx3_total, self.ctx3_types = _group(self.tri_keys // size, self.counts)
        # Middle order: continuation counts N1+(. v w), by context v.
        self.bi_keys, _, self.bi_cont = _group(self.tri_keys % (size * size), np.ones(len(keys)))
        bi_ctx = self.bi_keys // size
        self.ctx2_total = np.bincount(bi_ctx, weights=self.bi_cont, minlength=size)
        self.ctx2_types = np.bincount(bi_ctx, minlength=size).astype(np.float64)
        # Lowest order: N1+(. w), the number of bigram types ending in w.
        uni_cont = np.bincount(self.bi_keys % size, minlength=size).astype(np.float64)
        if discounts is None:
            discounts = (_discount(uni_cont[uni_cont > 0]), _discount(self.bi_cont), _discount(self.counts))
        self.discounts = tuple(float(d) for d in discounts)
        if len(self.discounts) != 3 or not all(0 < d <= 1 for d in self.discounts):
            raise ValueError(f"discounts must be three values in (0, 1], got {self.discounts}")
        d1 = self.discounts[0]
        total, seen = uni_cont.sum(), float((uni_cont > 0).sum())
        self.p1 = np.maximum(uni_cont - d1, 0) / total + d1 * seen / total / (size - 1)
        self.p1[0] = 0.0  # <s> is never predicted

    @classmethod
    def train(cls, sentences: Sequence[str], min_count: int = 1, discounts: Sequence[float] | None = None) -> TrigramLM:
        """Count trigrams of ``sentences`` (captions of one style); words seen < ``min_count`` times become <unk>."""
        if min_count < 1:
            raise ValueError(f"min_count must be >= 1, got {min_count}")
        tokenized = [caption_words(s) for s in sentences if isinstance(s, str)]
        if len(tokenized) != len(sentences) or not any(tokenized):
            raise ValueError("a trigram LM needs a non-empty list of strings with at least one word")
        freq = Counter(w for words in tokenized for w in words)
        vocab = list(SPECIALS) + sorted(w for w, c in freq.items() if c >= min_count and w not in SPECIALS)
        word_ids = {w: i for i, w in enumerate(vocab)}
        rows = []
        for words in tokenized:
            ids = [0, 0] + _to_ids(word_ids, words) + [1]
            rows += [(ids[i - 2], ids[i - 1], ids[i]) for i in range(2, len(ids))]
        uniq, counts = np.unique(np.asarray(rows, dtype=np.int64), axis=0, return_counts=True)
        return cls(vocab, uniq, counts, discounts)

    @classmethod
    def from_counts(cls, trigrams: Sequence[tuple[str, str, str]], counts: Sequence[int], min_count: int = 1,
                    discounts: Sequence[float] | None = None) -> TrigramLM:
        """An LM from word trigram counts (as :func:`sentence_trigrams` yields them, summed elsewhere, e.g. by a
        Spark aggregation over a corpus too large to collect). A word's count is the count of the trigrams that end
        in it (every word of a sentence ends exactly one); words seen fewer than ``min_count`` times become
        ``<unk>``, as :meth:`train` does."""
        if len(trigrams) != len(counts) or len(trigrams) == 0:
            raise ValueError("trigrams and counts must be non-empty and of equal length")
        if min_count < 1:
            raise ValueError(f"min_count must be >= 1, got {min_count}")
        freq: Counter = Counter()
        for tri, c in zip(trigrams, counts):
            freq[tri[2]] += int(c)
        words = sorted(w for w, c in freq.items() if c >= min_count and w not in SPECIALS)
        vocab = list(SPECIALS) + words
        word_ids = {w: i for i, w in enumerate(vocab)}
        ids = np.asarray([[0 if w == BOS else 1 if w == EOS else word_ids.get(w, 2) for w in tri] for tri in trigrams],
                         dtype=np.int64)
        uniq, inverse = np.unique(ids, axis=0, return_inverse=True)  # rare words merged into <unk>: sum their counts
        summed = np.bincount(inverse.reshape(-1), weights=np.asarray(counts, dtype=np.float64), minlength=len(uniq))
        return cls(vocab, uniq, summed, discounts)

    def _prob(self, u: np.ndarray, v: np.ndarray, w: np.ndarray) -> np.ndarray:
        """P(w | u, v) for aligned id arrays."""
        size, (_, d2, d3) = self.size, self.discounts
        total2, types2 = self.ctx2_total[v], self.ctx2_types[v]
        cont = _lookup(self.bi_keys, self.bi_cont, v * size + w)
        with np.errstate(divide="ignore", invalid="ignore"):
            p2 = np.where(total2 > 0, (np.maximum(cont - d2, 0) + d2 * types2 * self.p1[w]) / total2, self.p1[w])
            ctx = u * size + v
            total3 = _lookup(self.ctx3_keys, self.ctx3_total, ctx)
            types3 = _lookup(self.ctx3_keys, self.ctx3_types, ctx)
            count = _lookup(self.tri_keys, self.counts, ctx * size + w)
            return np.where(total3 > 0, (np.maximum(count - d3, 0) + d3 * types3 * p2) / total3, p2)

    def _context_ids(self, context: tuple[str, str]) -> tuple[int, int]:
        if len(context) != 2:
            raise ValueError(f"a trigram context is two words, got {context!r}")
        u, v = (0 if c == BOS else _to_ids(self.word_ids, [c])[0] for c in context)
        return u, v

    def prob(self, word: str, context: tuple[str, str]) -> float:
        """P(word | context), context = the two previous words (``<s>`` at sentence start); ``</s>`` may be the word."""
        u, v = self._context_ids(context)
        w = 1 if word == EOS else _to_ids(self.word_ids, [word])[0]
        return float(self._prob(np.array([u]), np.array([v]), np.array([w]))[0])

    def next_word_distribution(self, context: tuple[str, str]) -> dict[str, float]:
        """P(w | context) for every predictable word w (all but ``<s>``); the values sum to 1."""
        u, v = self._context_ids(context)
        w = np.arange(1, self.size, dtype=np.int64)
        p = self._prob(np.full_like(w, u), np.full_like(w, v), w)
        return dict(zip(self.vocab[1:], p.tolist()))

    def token_log_probs(self, sentences: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(log P of every scored token, whether that token is out of vocabulary, tokens per sentence): the tokens of
        all sentences concatenated, each sentence's words and ``</s>``."""
        bad = [i for i, s in enumerate(sentences) if not isinstance(s, str)]
        if bad:
            raise ValueError(f"sentences must be strings; row {bad[0]} is {type(sentences[bad[0]]).__name__}")
        if len(sentences) == 0:
            return np.zeros(0), np.zeros(0, dtype=bool), np.zeros(0, dtype=np.int64)
        seqs = [[0, 0] + _to_ids(self.word_ids, caption_words(s)) + [1] for s in sentences]
        lengths = np.array([len(s) - 2 for s in seqs], dtype=np.int64)
        u = np.concatenate([s[:-2] for s in seqs]).astype(np.int64)
        v = np.concatenate([s[1:-1] for s in seqs]).astype(np.int64)
        w = np.concatenate([s[2:] for s in seqs]).astype(np.int64)
        return np.log(self._prob(u, v, w)), w == 2, lengths

    def perplexities(self, sentences: Sequence[str], oov: str = "score") -> np.ndarray:
        """Per-sentence perplexity, exp(-mean log P) over its words and ``</s>``, for a batch of sentences;
        ``oov="skip"`` leaves unseen words out of the mean (see the module doc)."""
        logp, is_oov, lengths = self.token_log_probs(sentences)
        return _sentence_perplexities(logp, is_oov, lengths, oov)

    def perplexity(self, sentence: str) -> float:
        """Perplexity of one sentence."""
        return float(self.perplexities([sentence])[0])

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable form (vocabulary, trigram counts, discounts); ``from_dict`` rebuilds the same model."""
        return {
            "format": FORMAT,
            "vocab": self.vocab,
            "trigrams": self.trigrams.tolist(),
            "counts": self.counts.astype(np.int64).tolist(),
            "discounts": list(self.discounts),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrigramLM:
        """Rebuild a model written by ``to_dict``."""
        if data.get("format") != FORMAT:
            raise ValueError(f"not a trigram LM dict: format is {data.get('format')!r}, expected {FORMAT!r}")
        trigrams = np.asarray(data["trigrams"], dtype=np.int64)
        return cls(data["vocab"], trigrams, np.asarray(data["counts"]), data["discounts"])


def _check_oov(oov: str) -> None:
    if oov not in OOV_MODES:
        raise ValueError(f"oov must be one of {OOV_MODES}, got {oov!r}")


def _sentence_perplexities(logp: np.ndarray, is_oov: np.ndarray, lengths: np.ndarray, oov: str) -> np.ndarray:
    """exp(-mean log P) per sentence over its tokens; with ``oov="skip"`` over its in-vocabulary tokens (``</s>`` is
    always one, so no sentence is left without a token)."""
    _check_oov(oov)
    if len(lengths) == 0:
        return np.zeros(0)
    keep = ~is_oov if oov == "skip" else np.ones(len(logp), dtype=bool)
    rows = np.repeat(np.arange(len(lengths)), lengths)
    sums = np.bincount(rows, weights=np.where(keep, logp, 0.0), minlength=len(lengths))
    counts = np.bincount(rows, weights=keep.astype(np.float64), minlength=len(lengths))
    return np.exp(-sums / counts)


def fit_mixture_weights(log_probs: np.ndarray, iters: int = 50) -> np.ndarray:
    """Interpolation weights of ``C`` LMs that maximise the likelihood of held-out tokens, by EM.

    ``log_probs``: (C, N) log P of N held-out tokens under each LM. Returns C weights summing to 1."""
    log_probs = np.asarray(log_probs, dtype=np.float64)
    if log_probs.ndim != 2 or log_probs.shape[1] == 0:
        raise ValueError(f"log_probs must be (components, tokens) with tokens > 0, got shape {log_probs.shape}")
    weights = np.full(log_probs.shape[0], 1.0 / log_probs.shape[0])
    for _ in range(iters):
        joint = np.log(weights)[:, None] + log_probs
        posterior = np.exp(joint - np.logaddexp.reduce(joint, axis=0))
        weights = np.maximum(posterior.mean(axis=1), 1e-6)
        weights /= weights.sum()
    return weights


class StyleLanguageModels:
    """One ``TrigramLM`` per style; each caption is scored under the LM of its target style, alone or interpolated
    with the other styles' LMs and a folded factual background (see the module doc)."""

    def __init__(self, models: Mapping[str, TrigramLM], backgrounds: Sequence[TrigramLM] = (),
                 weights: Mapping[str, Sequence[float]] | None = None, oov: str = "score") -> None:
        """``models``: style name -> its trained trigram LM; ``backgrounds``: the factual LM's folds (none, or at
        least two); ``weights``: style -> interpolation weights over (own LM, the other styles' LMs in sorted order,
        background), summing to 1; a style without weights uses its own LM alone; ``oov``: ``score`` or ``skip``."""
        if not models:
            raise ValueError("StyleLanguageModels needs at least one style")
        if len(backgrounds) == 1:
            raise ValueError("a folded background needs at least two folds (one fold would score its own captions)")
        _check_oov(oov)
        self.models, self.backgrounds, self.oov = dict(models), list(backgrounds), oov
        # In a mixture every part predicts the union vocabulary: a part spreads its <unk> mass over the union's words
        # it does not know (else a small-vocabulary part would give every unseen word a large share).
        union = set().union(*(lm.vocab for lm in [*self.models.values(), *self.backgrounds]))
        self._unk_share = {id(lm): math.log(len(union - set(lm.vocab)) + 1)
                           for lm in [*self.models.values(), *self.backgrounds]}
        self.weights: dict[str, np.ndarray] = {}
        for style, w in (weights or {}).items():
            w = np.asarray(w, dtype=np.float64)
            if style not in self.models:
                raise ValueError(f"weights for {style!r}, which has no LM; styles: {self.styles}")
            if len(w) != len(self.components(style)) or (w < 0).any() or not np.isclose(w.sum(), 1.0):
                raise ValueError(f"weights of {style!r} must be {len(self.components(style))} non-negative values "
                                 f"summing to 1 (own, {self.others(style)}, background), got {w.tolist()}")
            self.weights[style] = w

    @classmethod
    def train(cls, captions: Sequence[str], styles: Sequence[str], min_count: int = 1,
              backgrounds: Sequence[TrigramLM] = (), held_out: Mapping[str, Sequence[str]] | None = None,
              oov: str = "score") -> StyleLanguageModels:
        """Train one LM per distinct style on the captions of that style. With ``held_out`` (style -> captions of
        that style that are not in training), fit each such style's interpolation weights on them by EM."""
        if len(captions) != len(styles):
            raise ValueError(f"captions and styles must have the same length, got {len(captions)} and {len(styles)}")
        by_style: dict[str, list[str]] = {}
        for caption, style in zip(captions, styles):
            if not isinstance(style, str) or not style:
                raise ValueError(f"every style must be a non-empty string, got {style!r}")
            by_style.setdefault(style, []).append(caption)
        lms = cls({s: TrigramLM.train(c, min_count=min_count) for s, c in sorted(by_style.items())},
                  backgrounds, oov=oov)
        for style, sentences in (held_out or {}).items():
            if style in lms.models and len(sentences):
                lms.weights[style] = lms.fit_weights(style, sentences)
        return lms

    @property
    def styles(self) -> list[str]:
        """The styles that have an LM, sorted."""
        return sorted(self.models)

    def others(self, style: str) -> list[str]:
        return [s for s in self.styles if s != style]

    def components(self, style: str) -> list[str]:
        """Names of the interpolated parts for ``style``: itself, the other styles, ``background`` if any."""
        return [style] + self.others(style) + (["background"] if self.backgrounds else [])

    def __getitem__(self, style: str) -> TrigramLM:
        if style not in self.models:
            raise ValueError(f"no trigram LM for style {style!r}; styles with one: {self.styles}")
        return self.models[style]

    def _component_log_probs(self, style: str, sentences: Sequence[str], folds: Sequence[int | None] | None):
        """(C, N) log P of every token under each component of ``style``, the tokens' all-OOV mask, lengths."""
        parts, oov_masks = [], []
        lengths = None
        def log_probs(lm: TrigramLM):
            logp, is_oov, n = lm.token_log_probs(sentences)
            return np.where(is_oov, logp - self._unk_share[id(lm)], logp), is_oov, n

        for name in self.components(style)[: len(self.components(style)) - bool(self.backgrounds)]:
            logp, is_oov, lengths = log_probs(self.models[name])
            parts.append(logp)
            oov_masks.append(is_oov)
        if self.backgrounds:
            per_fold = [log_probs(lm) for lm in self.backgrounds]
            probs = np.exp(np.stack([p[0] for p in per_fold]))  # (K, N)
            k = len(self.backgrounds)
            token_fold = np.repeat(np.asarray([-1 if f is None else int(f) for f in (folds or [None] * len(sentences))]),
                                   lengths)
            if ((token_fold < -1) | (token_fold >= k)).any():
                raise ValueError(f"folds must lie in [0, {k}) or be None")
            use = np.ones_like(probs, dtype=bool)
            for f in range(k):
                use[f, token_fold == f] = False  # never the fold the sentence's factual caption is in
            parts.append(np.log((probs * use).sum(axis=0) / use.sum(axis=0)))
            oov_masks.append(np.all(np.stack([p[1] for p in per_fold]), axis=0))
        return np.stack(parts), np.all(np.stack(oov_masks), axis=0), lengths

    def fit_weights(self, style: str, sentences: Sequence[str]) -> np.ndarray:
        """EM interpolation weights of ``style``'s components on held-out ``sentences`` of that style."""
        log_probs, all_oov, _ = self._component_log_probs(style, sentences, None)
        keep = ~all_oov if self.oov == "skip" else np.ones(log_probs.shape[1], dtype=bool)
        return fit_mixture_weights(log_probs[:, keep])

    def perplexities(self, sentences: Sequence[str], styles: Sequence[str],
                     folds: Sequence[int | None] | None = None) -> np.ndarray:
        """Perplexity of each sentence under the model of its style (aligned lists). ``folds``: the background fold
        of each sentence's factual caption (:func:`fold_of` its image), None where it has none (then every fold)."""
        if len(sentences) != len(styles) or (folds is not None and len(folds) != len(sentences)):
            raise ValueError(f"sentences, styles (and folds) must have the same length, got {len(sentences)}, "
                             f"{len(styles)}" + (f", {len(folds)}" if folds is not None else ""))
        out = np.empty(len(sentences))
        style_arr = np.asarray(styles, dtype=object)
        for style in set(styles):
            rows = np.flatnonzero(style_arr == style)
            texts = [sentences[i] for i in rows]
            if style not in self.weights:
                out[rows] = self[style].perplexities(texts, self.oov)
                continue
            log_probs, all_oov, lengths = self._component_log_probs(
                style, texts, None if folds is None else [folds[i] for i in rows])
            mixed = np.logaddexp.reduce(np.log(self.weights[style])[:, None] + log_probs, axis=0)
            out[rows] = _sentence_perplexities(mixed, all_oov, lengths, self.oov)
        return out

    def unscored_share(self, sentences: Sequence[str], styles: Sequence[str]) -> float:
        """The share of tokens that ``oov="skip"`` leaves out of the perplexity (unknown to every component of their
        style's mixture): what the verdict does not look at."""
        skipped = total = 0
        style_arr = np.asarray(styles, dtype=object)
        for style in set(styles):
            texts = [sentences[i] for i in np.flatnonzero(style_arr == style)]
            if style in self.weights:
                _, all_oov, _ = self._component_log_probs(style, texts, None)
            else:
                _, all_oov, _ = self[style].token_log_probs(texts)
            skipped, total = skipped + int(all_oov.sum()), total + len(all_oov)
        return skipped / total if total else 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable form of the style LMs, background folds, weights and OOV mode."""
        return {"format": STYLE_FORMAT, "oov": self.oov,
                "styles": {style: lm.to_dict() for style, lm in sorted(self.models.items())},
                "backgrounds": [lm.to_dict() for lm in self.backgrounds],
                "weights": {style: w.tolist() for style, w in sorted(self.weights.items())}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StyleLanguageModels:
        """Rebuild models written by ``to_dict`` (or the first format: style -> ``TrigramLM.to_dict()``)."""
        if data.get("format") != STYLE_FORMAT:
            return cls({style: TrigramLM.from_dict(d) for style, d in data.items()})
        return cls({style: TrigramLM.from_dict(d) for style, d in data["styles"].items()},
                   [TrigramLM.from_dict(d) for d in data["backgrounds"]], data["weights"], data["oov"])

    def save(self, path: str | Path) -> str:
        """Write the models as one JSON file."""
        Path(path).write_text(json.dumps(self.to_dict()))
        return str(path)

    @classmethod
    def load(cls, path: str | Path) -> StyleLanguageModels:
        """Read models written by ``save``."""
        return cls.from_dict(json.loads(Path(path).read_text()))
