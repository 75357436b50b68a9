"""Stylized image captioners: NIC and a transformer decoder, both conditioned on a style token.

Step 4 of ERG trains captioners on the original stylized pairs plus the augmented pairs and compares them. A
caption is fed to the decoder as ``<style:s> <bos> w_1 .. w_T <eos>``: the style token embedding is prepended, so
one model writes every style and the style token alone decides which one.

- :class:`NICCaptioner` (Show and Tell): the image feature vector goes through a linear layer and is the LSTM's
  first input, which sets its state before the style token and the words follow. Region features are mean-pooled.
- :class:`TransformerCaptioner` (SAN-like): an ``nn.TransformerDecoder`` whose cross-attention reads the projected
  image features, a sequence ``[n_regions, d]`` (region or CLIP features; a single vector is one region).
- :class:`UpDownCaptioner` (Anderson et al. 2018): a top-down attention LSTM over the region vectors (Faster R-CNN
  regions, or the region-like vectors of the textual visual context) feeding a language LSTM.

Features are ``[batch, d]`` or ``[batch, n_regions, d]``; ``region_padding_mask`` (``[batch, n_regions]``, True
where a region is padding) marks missing regions when images have different numbers of them.
"""
from __future__ import annotations

import inspect
import json
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from models.text import caption_words

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
CAPTIONER_KINDS = ("nic", "transformer", "updown")
PREFIX_LENGTH = 2  # <style:s> <bos>

_CONFIG_FILE = "captioner.json"
_VOCAB_FILE = "vocab.json"
_WEIGHTS_FILE = "model.safetensors"


def style_token(style: str) -> str:
    """The vocabulary token of a style, e.g. ``<style:humor>``."""
    return f"<style:{style}>"


class CaptionVocab:
    """Words of the training captions (those seen ``min_count`` times), the special tokens and one token per style.

    Token ids: ``<pad>`` 0, ``<bos>`` 1, ``<eos>`` 2, ``<unk>`` 3, then the style tokens in the given order, then the
    words by descending count (ties alphabetical), so the same captions always give the same ids on every worker.
    """

    def __init__(self, words: Sequence[str], styles: Sequence[str]) -> None:
        styles = [_check_style(s) for s in styles]
        if not styles:
            raise ValueError("a CaptionVocab needs at least one style, e.g. ['humor', 'romantic']")
        if len(set(styles)) != len(styles):
            raise ValueError(f"styles must be unique, got {styles}")
        words = list(words)
        clashes = sorted(set(words) & (set(SPECIAL_TOKENS) | {style_token(s) for s in styles}))
        if clashes or len(set(words)) != len(words):
            raise ValueError(f"words must be unique and must not be special or style tokens, got clashes {clashes}")
        self.styles: tuple[str, ...] = tuple(styles)
        self.itos: tuple[str, ...] = (*SPECIAL_TOKENS, *(style_token(s) for s in styles), *words)
        self.stoi: dict[str, int] = {token: i for i, token in enumerate(self.itos)}
        self.pad_id, self.bos_id, self.eos_id, self.unk_id = (self.stoi[t] for t in SPECIAL_TOKENS)
        self.style_ids: tuple[int, ...] = tuple(self.stoi[style_token(s)] for s in styles)

    @classmethod
    def build(cls, captions: Iterable[str], styles: Iterable[str], min_count: int = 1) -> CaptionVocab:
        """Vocabulary of ``captions`` (words seen at least ``min_count`` times) with a token for each of ``styles``."""
        if not isinstance(min_count, int) or min_count < 1:
            raise ValueError(f"min_count must be an integer >= 1, got {min_count!r}")
        counts = Counter(word for caption in captions for word in caption_words(caption))
        reserved = set(SPECIAL_TOKENS)
        kept = sorted((w for w, n in counts.items() if n >= min_count and w not in reserved),
                      key=lambda w: (-counts[w], w))
        return cls(kept, list(dict.fromkeys(styles)))

    def __len__(self) -> int:
        return len(self.itos)

    @property
    def words(self) -> tuple[str, ...]:
        """The regular words, without special and style tokens."""
        return self.itos[len(SPECIAL_TOKENS) + len(self.styles):]

    def style_id(self, style: str) -> int:
        """Token id of ``style``; ValueError naming the known styles if it has none."""
        token = style_token(style)
        if token not in self.stoi:
            raise ValueError(f"unknown style {style!r}: this vocabulary knows {list(self.styles)}")
        return self.stoi[token]

    def encode(self, caption: str, style: str, max_words: int | None = None) -> list[int]:
        """``<style:s> <bos> w_1 .. w_T <eos>`` as ids; unknown words become ``<unk>``, at most ``max_words`` words."""
        words = caption_words(caption)
        if max_words is not None:
            if max_words < 1:
                raise ValueError(f"max_words must be >= 1 or None, got {max_words}")
            words = words[:max_words]
        return [self.style_id(style), self.bos_id, *(self.stoi.get(w, self.unk_id) for w in words), self.eos_id]

    def encode_batch(self, captions: Sequence[str], styles: Sequence[str],
                     max_words: int | None = None) -> torch.Tensor:
        """Encoded captions right-padded with ``<pad>`` into a ``[batch, T]`` long tensor."""
        if len(captions) != len(styles):
            raise ValueError(f"captions and styles differ in length: {len(captions)} vs {len(styles)}")
        return _right_padded([self.encode(c, s, max_words) for c, s in zip(captions, styles)], self.pad_id,
                             torch.long)

    def inserted_word_weights(self, captions: Sequence[str], sources: Sequence[str | None], weight: float,
                              max_words: int | None = None) -> torch.Tensor:
        """Loss weights aligned with :meth:`encode_batch` of ``captions``: ``weight`` on each caption word that its
        source lacks (a multiset difference: the words the generator inserted into the factual caption, i.e. the
        augmented pair's style phrase), 1 on every other position. A row whose source is None or empty (an
        original pair) is all 1."""
        if len(captions) != len(sources):
            raise ValueError(f"captions and sources differ in length: {len(captions)} vs {len(sources)}")
        if not math.isfinite(weight) or weight <= 0:
            raise ValueError(f"the inserted-word weight must be a finite number > 0, got {weight!r}")
        rows = []
        for caption, source in zip(captions, sources):
            words = caption_words(caption)[:max_words]
            left = Counter(caption_words(source or ""))
            row = [1.0] * PREFIX_LENGTH
            for word in words:
                if not source or left[word] > 0:
                    left[word] -= 1
                    row.append(1.0)
                else:
                    row.append(float(weight))
            rows.append(row + [1.0])
        return _right_padded(rows, 1.0, torch.float32)

    def decode(self, ids: Iterable[int]) -> str:
        """Words of a token sequence up to the first ``<eos>``; pad, bos and style tokens are skipped."""
        skipped = {self.pad_id, self.bos_id, *self.style_ids}
        words: list[str] = []
        for i in ids:
            if i == self.eos_id:
                break
            if not 0 <= i < len(self.itos):
                raise ValueError(f"token id {i} is outside the vocabulary (size {len(self.itos)})")
            if i not in skipped:
                words.append(self.itos[i])
        return " ".join(words)

    def to_dict(self) -> dict[str, list[str]]:
        """JSON-serialisable form: ``{"styles": [...], "words": [...]}``."""
        return {"styles": list(self.styles), "words": list(self.words)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CaptionVocab:
        """Inverse of :meth:`to_dict`."""
        if not isinstance(data, dict) or set(data) != {"styles", "words"}:
            raise ValueError("a CaptionVocab dict has exactly the keys 'styles' and 'words'")
        return cls(data["words"], data["styles"])

    def save(self, path: str | Path) -> None:
        """Write the vocabulary as JSON."""
        Path(path).write_text(json.dumps(self.to_dict(), ensure_ascii=False), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> CaptionVocab:
        """Read a vocabulary written by :meth:`save`."""
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))


def _check_style(style: str) -> str:
    if not isinstance(style, str) or not style.strip() or any(ch.isspace() or ch in "<>" for ch in style):
        raise ValueError(f"a style name is a non-empty string without spaces or '<>', got {style!r}")
    return style


def _as_regions(features: torch.Tensor, feature_dim: int) -> torch.Tensor:
    """``[B, d]`` -> ``[B, 1, d]``; ``[B, R, d]`` unchanged; anything else is a ValueError."""
    if features.dim() == 2:
        features = features.unsqueeze(1)
    if features.dim() != 3 or features.shape[-1] != feature_dim:
        raise ValueError(f"features must be [batch, {feature_dim}] or [batch, n_regions, {feature_dim}], "
                         f"got shape {tuple(features.shape)}")
    return features


class Captioner(nn.Module):
    """A style-conditioned captioner: ``forward(features, tokens)`` gives next-token logits ``[B, T, vocab]``.

    ``tokens`` is the decoder input (starting ``<style:s> <bos>``); logit ``t`` predicts token ``t + 1``.
    """

    kind: str = ""

    def __init__(self, feature_dim: int, vocab: CaptionVocab, hparams: dict[str, Any]) -> None:
        super().__init__()
        self.feature_dim = feature_dim
        self.vocab = vocab
        self.hparams = dict(hparams)


class NICCaptioner(Captioner):
    """Show and Tell: the projected image vector is the LSTM's first input, then the style token and the words.

    ``image_norm=1`` layer-normalises the projected image, so that it enters the LSTM at the scale of a word
    embedding: without it, the projection of unit-norm sentence vectors (visual context) has entries of std
    0.05-0.1 against ~1 for a word, and on the real corpora NIC wrote one caption for all 490 positive test images
    (benchmarks/results/table2.md, "Most frequent captions"). Captioners saved before it load with ``image_norm=0``.
    """

    kind = "nic"

    def __init__(self, feature_dim: int, vocab: CaptionVocab, embed_dim: int = 256, hidden_dim: int = 512,
                 num_layers: int = 1, dropout: float = 0.1, image_norm: int = 1) -> None:
        super().__init__(feature_dim, vocab, {"embed_dim": embed_dim, "hidden_dim": hidden_dim,
                                              "num_layers": num_layers, "dropout": dropout,
                                              "image_norm": int(image_norm)})
        self.image_proj = nn.Linear(feature_dim, embed_dim)
        self.image_norm = nn.LayerNorm(embed_dim) if image_norm else nn.Identity()
        self.embed = nn.Embedding(len(vocab), embed_dim, padding_idx=vocab.pad_id)
        self.lstm = nn.LSTM(embed_dim, hidden_dim, num_layers, batch_first=True,
                            dropout=dropout if num_layers > 1 else 0.0)
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(hidden_dim, len(vocab))

    def forward(self, features: torch.Tensor, tokens: torch.Tensor,
                region_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        regions = _as_regions(features, self.feature_dim)
        if region_padding_mask is None:
            pooled = regions.mean(dim=1)
        else:
            keep = (~region_padding_mask).unsqueeze(-1).to(regions.dtype)
            pooled = (regions * keep).sum(dim=1) / keep.sum(dim=1).clamp(min=1.0)
        image = self.image_norm(self.image_proj(pooled)).unsqueeze(1)
        hidden, _ = self.lstm(self.dropout(torch.cat([image, self.embed(tokens)], dim=1)))
        return self.out(self.dropout(hidden[:, 1:]))


class TransformerCaptioner(Captioner):
    """Transformer decoder over projected region features (cross-attention), causal self-attention over tokens."""

    kind = "transformer"

    def __init__(self, feature_dim: int, vocab: CaptionVocab, d_model: int = 256, nhead: int = 4, num_layers: int = 2,
                 dim_feedforward: int = 1024, dropout: float = 0.1, max_len: int = 64) -> None:
        if d_model % nhead:
            raise ValueError(f"d_model ({d_model}) must be divisible by nhead ({nhead})")
        if max_len <= PREFIX_LENGTH:
            raise ValueError(f"max_len must exceed the {PREFIX_LENGTH}-token style prefix, got {max_len}")
        super().__init__(feature_dim, vocab, {"d_model": d_model, "nhead": nhead, "num_layers": num_layers,
                                              "dim_feedforward": dim_feedforward, "dropout": dropout,
                                              "max_len": max_len})
        self.feature_proj = nn.Sequential(nn.Linear(feature_dim, d_model), nn.ReLU(), nn.Dropout(dropout),
                                          nn.LayerNorm(d_model))
        self.embed = nn.Embedding(len(vocab), d_model, padding_idx=vocab.pad_id)
        self.position = nn.Embedding(max_len, d_model)
        layer = nn.TransformerDecoderLayer(d_model, nhead, dim_feedforward, dropout, batch_first=True, norm_first=True)
        self.decoder = nn.TransformerDecoder(layer, num_layers, norm=nn.LayerNorm(d_model))
        self.out = nn.Linear(d_model, len(vocab))
        self.scale = math.sqrt(d_model)

    def forward(self, features: torch.Tensor, tokens: torch.Tensor,
                region_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        memory = self.feature_proj(_as_regions(features, self.feature_dim))
        length = tokens.shape[1]
        if length > self.hparams["max_len"]:
            raise ValueError(f"token sequence of length {length} exceeds this model's max_len "
                             f"{self.hparams['max_len']}")
        positions = torch.arange(length, device=tokens.device)
        x = self.embed(tokens) * self.scale + self.position(positions)
        causal = torch.triu(torch.ones(length, length, dtype=torch.bool, device=tokens.device), diagonal=1)
        hidden = self.decoder(x, memory, tgt_mask=causal, tgt_is_causal=True,
                              tgt_key_padding_mask=tokens == self.vocab.pad_id,
                              memory_key_padding_mask=region_padding_mask)
        return self.out(hidden)


class UpDownCaptioner(Captioner):
    """Bottom-up and top-down attention: at every step an attention LSTM (input: the language LSTM's last state, the
    mean region vector and the word) sets the query of a soft attention over the regions; the attended vector and
    that state feed the language LSTM, whose state predicts the next word. Padded regions get no attention."""

    kind = "updown"

    def __init__(self, feature_dim: int, vocab: CaptionVocab, embed_dim: int = 256, hidden_dim: int = 512,
                 att_dim: int = 256, dropout: float = 0.1) -> None:
        super().__init__(feature_dim, vocab, {"embed_dim": embed_dim, "hidden_dim": hidden_dim, "att_dim": att_dim,
                                              "dropout": dropout})
        self.region_proj = nn.Sequential(nn.Linear(feature_dim, hidden_dim), nn.ReLU(), nn.Dropout(dropout))
        self.embed = nn.Embedding(len(vocab), embed_dim, padding_idx=vocab.pad_id)
        self.att_lstm = nn.LSTMCell(2 * hidden_dim + embed_dim, hidden_dim)
        self.lang_lstm = nn.LSTMCell(2 * hidden_dim, hidden_dim)
        self.att_regions = nn.Linear(hidden_dim, att_dim)
        self.att_query = nn.Linear(hidden_dim, att_dim)
        self.att_score = nn.Linear(att_dim, 1)
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(hidden_dim, len(vocab))

    def forward(self, features: torch.Tensor, tokens: torch.Tensor,
                region_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        regions = self.region_proj(_as_regions(features, self.feature_dim))  # [B, R, H]
        if region_padding_mask is None:
            keep = torch.ones(regions.shape[:2], dtype=regions.dtype, device=regions.device)
        else:
            keep = (~region_padding_mask).to(regions.dtype)
        mean = (regions * keep.unsqueeze(-1)).sum(1) / keep.sum(1, keepdim=True).clamp(min=1.0)
        keys = self.att_regions(regions)
        batch, hidden = regions.shape[0], self.hparams["hidden_dim"]
        h1 = c1 = h2 = c2 = regions.new_zeros(batch, hidden)
        words = self.embed(tokens)
        outputs = []
        for t in range(tokens.shape[1]):
            h1, c1 = self.att_lstm(torch.cat([h2, mean, words[:, t]], dim=-1), (h1, c1))
            scores = self.att_score(torch.tanh(keys + self.att_query(h1).unsqueeze(1))).squeeze(-1)
            scores = scores.masked_fill(keep == 0, float("-inf"))
            attended = (torch.softmax(scores, dim=-1).unsqueeze(-1) * regions).sum(1)
            h2, c2 = self.lang_lstm(torch.cat([attended, h1], dim=-1), (h2, c2))
            outputs.append(h2)
        return self.out(self.dropout(torch.stack(outputs, dim=1)))


_CAPTIONERS: dict[str, type[Captioner]] = {"nic": NICCaptioner, "transformer": TransformerCaptioner,
                                           "updown": UpDownCaptioner}


def captioner_hparams(kind: str) -> dict[str, Any]:
    """The hyper-parameters a captioner kind takes, with their defaults."""
    if kind not in _CAPTIONERS:
        raise ValueError(f"captioner kind must be one of {list(CAPTIONER_KINDS)}, got {kind!r}")
    params = inspect.signature(_CAPTIONERS[kind].__init__).parameters
    return {name: p.default for name, p in params.items() if name not in ("self", "feature_dim", "vocab")}


def build_captioner(kind: str, feature_dim: int, vocab: CaptionVocab, **hparams: Any) -> Captioner:
    """A new captioner of ``kind`` ("nic", "transformer" or "updown") over ``feature_dim``-dimensional image features."""
    allowed = captioner_hparams(kind)
    unknown = sorted(set(hparams) - set(allowed))
    if unknown:
        raise ValueError(f"unknown hyper-parameters {unknown} for captioner {kind!r}; allowed: {sorted(allowed)}")
    if not isinstance(feature_dim, int) or feature_dim < 1:
        raise ValueError(f"feature_dim must be a positive integer, got {feature_dim!r}")
    for name, value in hparams.items():
        if name == "dropout":
            if not 0.0 <= float(value) < 1.0:
                raise ValueError(f"dropout must be in [0, 1), got {value!r}")
        elif name == "image_norm":
            if value not in (0, 1):
                raise ValueError(f"image_norm must be 0 or 1, got {value!r}")
        elif not isinstance(value, int) or value < 1:
            raise ValueError(f"hyper-parameter {name} must be a positive integer, got {value!r}")
    return _CAPTIONERS[kind](feature_dim, vocab, **hparams)


def _right_padded(rows: list[list], fill: float, dtype: torch.dtype) -> torch.Tensor:
    """``rows`` of different lengths as one ``[len(rows), longest]`` tensor, right-padded with ``fill``."""
    out = torch.full((len(rows), max((len(r) for r in rows), default=PREFIX_LENGTH + 1)), fill, dtype=dtype)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=dtype)
    return out


def teacher_forcing_loss(model: nn.Module, features: torch.Tensor, tokens: torch.Tensor, pad_id: int,
                         region_padding_mask: torch.Tensor | None = None, weights: torch.Tensor | None = None
                         ) -> torch.Tensor:
    """Mean cross-entropy of the caption words and ``<eos>`` given the image, style and previous words.

    ``model`` may be a captioner or its DDP wrapper (so the call goes through the wrapper's forward);
    ``tokens`` are full encoded captions from :meth:`CaptionVocab.encode_batch`; ``weights`` (same shape, e.g.
    :meth:`CaptionVocab.inserted_word_weights`) make it a weighted mean over the predicted positions.
    """
    logits = model(features, tokens[:, :-1], region_padding_mask)
    return caption_loss(logits, tokens, pad_id, weights)


def caption_loss(logits: torch.Tensor, tokens: torch.Tensor, pad_id: int, weights: torch.Tensor | None = None
                 ) -> torch.Tensor:
    """Cross-entropy of ``logits`` (predictions for ``tokens[:, 1:]``) against the caption words and ``<eos>``
    (``<bos>`` after the style token is given, not predicted; padding is ignored): the mean, or the ``weights``-
    weighted mean (``weights`` shaped like ``tokens``)."""
    targets = tokens[:, 1:].clone()
    targets[:, 0] = pad_id
    flat_logits, flat_targets = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
    if weights is None:
        return nn.functional.cross_entropy(flat_logits, flat_targets, ignore_index=pad_id)
    each = nn.functional.cross_entropy(flat_logits, flat_targets, ignore_index=pad_id, reduction="none")
    w = weights[:, 1:].reshape(-1).to(each.dtype) * (flat_targets != pad_id).to(each.dtype)
    return (each * w).sum() / w.sum().clamp_min(1e-12)


def _never_emitted(vocab: CaptionVocab, device: torch.device) -> torch.Tensor:
    """Token ids decoding never writes: ``<pad>``, ``<bos>``, the style tokens, and ``<unk>`` (rare words are
    ``<unk>`` in training; a caption that writes one says nothing a reader or a metric can use)."""
    return torch.tensor([vocab.pad_id, vocab.bos_id, vocab.unk_id, *vocab.style_ids], device=device)


def _repeated_ngram_bans(tokens: torch.Tensor, n: int) -> list[tuple[int, int]]:
    """``(row, token)`` pairs that would repeat an ``n``-gram already in the row's caption words (the tokens after
    the ``<style> <bos>`` prefix): the token after every earlier occurrence of the row's last ``n - 1`` words.
    ``n`` 0 bans nothing."""
    if n < 1 or tokens.shape[1] - PREFIX_LENGTH < n - 1:
        return []
    bans = []
    for row, ids in enumerate(tokens[:, PREFIX_LENGTH:].tolist()):  # every row has the same length
        tail = tuple(ids[len(ids) - n + 1:])
        for start in range(len(ids) - n + 1):
            if tuple(ids[start:start + n - 1]) == tail:
                bans.append((row, ids[start + n - 1]))
    return bans


def _ban(logits: torch.Tensor, bans: list[tuple[int, int]]) -> None:
    if bans:
        rows, cols = zip(*bans)
        logits[list(rows), list(cols)] = float("-inf")


def greedy_decode(model: Captioner, features: torch.Tensor, style: str | Sequence[str], *, max_len: int,
                  no_repeat_ngram_size: int, region_padding_mask: torch.Tensor | None = None) -> list[str]:
    """Greedy captions for a batch of images in ``style`` (one style for all, or one per image).

    At most ``max_len`` tokens are generated per image (``<eos>`` included); ``<pad>``, ``<bos>`` and style tokens
    and ``<unk>`` are never emitted (a caption is scored and read as words); with ``no_repeat_ngram_size`` n > 0,
    no n-gram of words is written twice in a caption ("a man in a man in a man" stops at its second "a man in").
    The model's train/eval mode is restored afterwards.
    """
    vocab = model.vocab
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    if isinstance(model, TransformerCaptioner) and PREFIX_LENGTH + max_len - 1 > model.hparams["max_len"]:
        raise ValueError(f"max_len {max_len} needs {PREFIX_LENGTH + max_len - 1} positions; this transformer has "
                         f"{model.hparams['max_len']} (max_len <= {model.hparams['max_len'] - PREFIX_LENGTH + 1})")
    device = next(model.parameters()).device
    features = _as_regions(torch.as_tensor(features, dtype=torch.float32), model.feature_dim).to(device)
    batch = features.shape[0]
    styles = [style] * batch if isinstance(style, str) else list(style)
    if len(styles) != batch:
        raise ValueError(f"got {len(styles)} styles for {batch} images: give one style or one per image")
    tokens = torch.tensor([[vocab.style_id(s), vocab.bos_id] for s in styles], dtype=torch.long, device=device)
    if region_padding_mask is not None:
        region_padding_mask = region_padding_mask.to(device)
    banned = _never_emitted(vocab, device)
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for _ in range(max_len):
                logits = model(features, tokens, region_padding_mask)[:, -1]
                logits[:, banned] = float("-inf")
                _ban(logits, _repeated_ngram_bans(tokens, no_repeat_ngram_size))
                next_ids = logits.argmax(dim=-1).masked_fill(finished, vocab.pad_id)
                tokens = torch.cat([tokens, next_ids.unsqueeze(1)], dim=1)
                finished |= next_ids == vocab.eos_id
                if bool(finished.all()):
                    break
    finally:
        model.train(was_training)
    return [vocab.decode(row) for row in tokens.tolist()]


def beam_decode(model: Captioner, features: torch.Tensor, style: str | Sequence[str], *, max_len: int,
                no_repeat_ngram_size: int, beam_size: int = 5, length_penalty: float = 1.0,
                region_padding_mask: torch.Tensor | None = None) -> list[list[tuple[str, float]]]:
    """Beam search: for each image, up to ``beam_size`` distinct captions in ``style`` with their scores, best first.

    A caption's score is its summed token log-probability (``<eos>`` included when it ended) divided by
    ``length ** length_penalty`` (0: the plain sum). A beam stops when it writes ``<eos>`` among the ``beam_size``
    best continuations; an image is done when ``beam_size`` captions have ended and no open beam can beat them (or
    after ``max_len`` tokens, when the open beams are kept as they stand).
    ``<pad>``, ``<bos>``, style tokens and ``<unk>`` are never emitted; ``no_repeat_ngram_size`` as in
    :func:`greedy_decode`; with ``beam_size`` 1 the first caption is the greedy one.
    """
    vocab = model.vocab
    if isinstance(beam_size, bool) or not isinstance(beam_size, int) or beam_size < 1:
        raise ValueError(f"beam_size must be an integer >= 1, got {beam_size!r}")
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    if isinstance(model, TransformerCaptioner) and PREFIX_LENGTH + max_len - 1 > model.hparams["max_len"]:
        raise ValueError(f"max_len {max_len} needs {PREFIX_LENGTH + max_len - 1} positions; this transformer has "
                         f"{model.hparams['max_len']} (max_len <= {model.hparams['max_len'] - PREFIX_LENGTH + 1})")
    device = next(model.parameters()).device
    features = _as_regions(torch.as_tensor(features, dtype=torch.float32), model.feature_dim).to(device)
    batch, k = features.shape[0], beam_size
    styles = [style] * batch if isinstance(style, str) else list(style)
    if len(styles) != batch:
        raise ValueError(f"got {len(styles)} styles for {batch} images: give one style or one per image")
    feats = features.repeat_interleave(k, dim=0)
    mask = region_padding_mask.to(device).repeat_interleave(k, dim=0) if region_padding_mask is not None else None
    tokens = torch.tensor([[vocab.style_id(s), vocab.bos_id] for s in styles for _ in range(k)], dtype=torch.long,
                          device=device)
    scores = torch.full((batch, k), float("-inf"), device=device)
    scores[:, 0] = 0.0  # one live beam per image at the start: the others would repeat it
    banned = _never_emitted(vocab, device)
    ended: list[list[tuple[list[int], float, int]]] = [[] for _ in range(batch)]
    done = [False] * batch

    def norm(logp: float, length: int) -> float:
        return logp / (max(length, 1) ** length_penalty) if length_penalty else logp

    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for step in range(max_len):
                logits = model(feats, tokens, mask)[:, -1]
                logits[:, banned] = float("-inf")
                _ban(logits, _repeated_ngram_bans(tokens, no_repeat_ngram_size))
                logp = torch.log_softmax(logits.float(), dim=-1).view(batch, k, -1)
                total = (scores.unsqueeze(-1) + logp).view(batch, -1)
                top_scores, top_ids = total.topk(min(2 * k, total.shape[1]), dim=-1)
                width = logp.shape[-1]
                next_tokens, next_scores = tokens.view(batch, k, -1).clone(), torch.full_like(scores, float("-inf"))
                chosen = torch.zeros(batch, k, dtype=torch.long, device=device)
                for b in range(batch):
                    alive = 0
                    for rank, (score, flat) in enumerate(zip(top_scores[b].tolist(), top_ids[b].tolist())):
                        if done[b] or alive == k or score == float("-inf"):
                            break
                        beam, token = divmod(flat, width)
                        if token == vocab.eos_id:
                            if rank < k:  # an ending counts only among the k best continuations
                                ended[b].append((tokens[b * k + beam, PREFIX_LENGTH:].tolist(), score, step + 1))
                            continue
                        next_tokens[b, alive] = tokens[b * k + beam]
                        chosen[b, alive] = token
                        next_scores[b, alive] = score
                        alive += 1
                    if not done[b] and len(ended[b]) >= k:
                        # done when no open beam can still beat the k-th best ending (exact for length_penalty 0,
                        # where scores only fall; the usual heuristic otherwise)
                        worst = sorted((norm(lp, n) for _, lp, n in ended[b]), reverse=True)[k - 1]
                        best_open = float(next_scores[b].max())
                        done[b] = best_open == float("-inf") or norm(best_open, step + 1) <= worst
                tokens = torch.cat([next_tokens.view(batch * k, -1), chosen.view(-1, 1)], dim=1)
                scores = next_scores
                if all(done):
                    break
    finally:
        model.train(was_training)
    out = []
    for b in range(batch):
        pool = list(ended[b])
        if not done[b]:  # open beams after max_len tokens count as they stand
            for j in range(k):
                if scores[b, j] > float("-inf"):
                    pool.append((tokens[b * k + j, PREFIX_LENGTH:].tolist(), float(scores[b, j]),
                                 tokens.shape[1] - PREFIX_LENGTH))
        best: dict[str, float] = {}
        for ids, logp, length in pool:
            caption = vocab.decode(ids)
            value = norm(logp, length)
            if caption not in best or value > best[caption]:
                best[caption] = value
        out.append(sorted(best.items(), key=lambda item: -item[1])[:k])
    return out


def save_captioner(model: Captioner, directory: str | Path) -> Path:
    """Write ``captioner.json`` (kind, feature_dim, hparams), ``vocab.json`` and ``model.safetensors``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = {"kind": model.kind, "feature_dim": model.feature_dim, "hparams": model.hparams}
    (directory / _CONFIG_FILE).write_text(json.dumps(config, indent=2), encoding="utf-8")
    model.vocab.save(directory / _VOCAB_FILE)
    save_file({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}, str(directory / _WEIGHTS_FILE))
    return directory


def load_captioner(directory: str | Path, device: str | torch.device = "cpu") -> Captioner:
    """A captioner saved by :func:`save_captioner` (or by training), in eval mode on ``device``."""
    directory = Path(directory)
    missing = [name for name in (_CONFIG_FILE, _VOCAB_FILE, _WEIGHTS_FILE) if not (directory / name).is_file()]
    if missing:
        raise ValueError(f"{directory} is not a saved captioner: missing {missing}")
    config = json.loads((directory / _CONFIG_FILE).read_text(encoding="utf-8"))
    hparams = dict(config["hparams"])
    if config["kind"] == "nic":
        hparams.setdefault("image_norm", 0)  # saved before NIC normalised its image input
    model = build_captioner(config["kind"], config["feature_dim"], CaptionVocab.load(directory / _VOCAB_FILE),
                            **hparams)
    model.load_state_dict(load_file(str(directory / _WEIGHTS_FILE)))
    return model.to(device).eval()
