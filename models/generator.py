"""The Generate step (paper Eq. 5): rebuild a stylized caption from "[style phrase] [SEP] [content]".

Training feeds a stylized caption's own style phrase and content and teaches the model to rebuild the caption; at
inference the input is "[retrieved phrase] [SEP] [factual caption]" and the output is a new stylized caption.

Two kinds of generator, both loaded by Hugging Face name or local path through ``from_pretrained``:

- ``causal``: any ``AutoModelForCausalLM`` (GPT-2 family by default). The prompt is
  ``phrase + sep + content + sep`` and the target ``caption + eos``; the loss is on the caption tokens only
  (labels are -100 on the prompt and on padding). Batched generation pads on the left; a missing pad token is set
  to eos.
- ``seq2seq``: any ``AutoModelForSeq2SeqLM`` (T5 family by default), an ``EncoderDecoderModel`` (BERT2BERT)
  included. The source is ``phrase + sep + content`` and the target the caption.

Where no model hub is reachable (this machine), a generator comes from one of two builders, each writing a
checkpoint folder that then loads by path through ``load_generator`` like any other:

- ``create_generator_from_config`` (``init: config``): a tokenizer trained on the captions with the ``tokenizers``
  library and a randomly initialised GPT-2 or T5 of a given size.
- ``create_bert2bert_from_minilm``: an ``EncoderDecoderModel`` warm-started on both sides from the packaged
  pretrained all-MiniLM-L6-v2 (only the decoder's cross-attention starts from random).
- ``create_word_level_generator`` (``init: word_level``): a GPT-2 over whole caption words whose word embeddings
  start from MiniLM's (each word's WordPiece embeddings averaged, projected to the model width by PCA).

Decoding (``generate``) is greedy, beam or sampling, with optional no-repeat n-grams and a repetition penalty, and
an optional *source-words constraint*: every generated token must come from the input's bag of tokens (the
retrieved phrase and the factual caption), each used at most as often as it occurs there. Training rebuilds a
caption from its own phrase and content, whose words are exactly the caption's words, so the constraint asks of the
model at inference only what it learned: to order the given words. With a word-level vocabulary it also rules out
non-words and most loops.
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    EncoderDecoderModel,
    GenerationConfig,
    GPT2Config,
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    T5Config,
)
from transformers.utils import logging as hf_logging

from models.backbones import minilm_path, pick_device, resolve_model_path
from models.text import normalize_caption
from models.tokenizers_offline import WORD_UNK, train_gpt2_tokenizer, train_t5_tokenizer, train_word_tokenizer

GENERATOR_KINDS = ("causal", "seq2seq")
DEFAULT_MODELS = {"causal": "gpt2", "seq2seq": "t5-small"}
STRATEGIES = ("greedy", "beam", "sample")
CONSTRAINTS = ("none", "source_words", "merge", "merge_skip")
DEFAULT_SEP = " [SEP] "
SETTINGS_FILE = "erg_generator.json"
IGNORE_INDEX = -100

#: Sizes of the generators that ``create_generator_from_config`` builds unless overridden (a small GPT-2 / T5).
DEFAULT_CONFIGS: dict[str, dict[str, Any]] = {
    "causal": {"n_positions": 256, "n_embd": 256, "n_layer": 4, "n_head": 4},
    "seq2seq": {"d_model": 256, "d_ff": 1024, "d_kv": 64, "num_layers": 4, "num_decoder_layers": 4, "num_heads": 4},
}

StepCallback = Callable[[int, dict[str, float]], None]


@dataclass
class StyleGenerator:
    """A loaded generator: the model, its tokenizer and how inputs are framed.

    ``sep`` joins the style phrase and the content (and, for ``causal``, ends the prompt). ``max_source_len`` caps
    the tokens of the phrase-and-content input, ``max_target_len`` those of the caption (its eos included). A causal
    prompt is further cut (at the end of its content) so that it and the caption, or ``max_new_tokens``, fit the
    model's positions.
    """

    kind: str
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    device: torch.device
    sep: str = DEFAULT_SEP
    max_source_len: int = 128
    max_target_len: int = 64
    word_level: bool = False

    def source_text(self, style_phrase: str, content: str) -> str:
        """The model input for one example: "[style phrase] [SEP] [content]" (paper Eq. 5)."""
        return f"{style_phrase.strip()}{self.sep}{content.strip()}".strip()

    @property
    def eos_token_id(self) -> int:
        """The token that ends a generated caption."""
        if self.kind == "seq2seq" and self.model.config.eos_token_id is not None:
            return int(self.model.config.eos_token_id)
        return int(self.tokenizer.eos_token_id)

    def save(self, path: str | Path) -> str:
        """Write model, tokenizer and framing (kind, sep) with ``save_pretrained``; ``load_generator`` reads it."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)
        (path / SETTINGS_FILE).write_text(json.dumps({"kind": self.kind, "sep": self.sep, "word_level": self.word_level}))
        return str(path)


@dataclass
class FineTuneResult:
    """What ``fine_tune`` did: the loss of every optimizer step, in order."""

    losses: list[float] = field(default_factory=list)

    @property
    def steps(self) -> int:
        """Number of optimizer steps taken."""
        return len(self.losses)

    @property
    def first_loss(self) -> float:
        """Loss of the first step (NaN when no step ran)."""
        return self.losses[0] if self.losses else math.nan

    @property
    def final_loss(self) -> float:
        """Loss of the last step (NaN when no step ran)."""
        return self.losses[-1] if self.losses else math.nan


def _check_kind(kind: str) -> None:
    if kind not in GENERATOR_KINDS:
        raise ValueError(f"generator kind must be one of {GENERATOR_KINDS}, got {kind!r}")


def _read_settings(path: str) -> dict[str, Any]:
    settings = Path(path) / SETTINGS_FILE
    return json.loads(settings.read_text()) if settings.is_file() else {}


def load_generator(
    kind: str,
    name_or_path: str | None = None,
    device: str = "auto",
    sep: str | None = None,
    *,
    max_source_len: int,
    max_target_len: int,
) -> StyleGenerator:
    """Load a generator by Hugging Face name or local path (``None``: ``gpt2`` for causal, ``t5-small`` for seq2seq).

    ``sep`` defaults to the separator the checkpoint was saved with, else " [SEP] ". The model is put in eval mode on
    ``pick_device(device)``.
    """
    _check_kind(kind)
    if max_source_len < 4 or max_target_len < 2:
        raise ValueError(f"max_source_len must be >= 4 and max_target_len >= 2, got {max_source_len}, {max_target_len}")
    path = resolve_model_path(name_or_path or DEFAULT_MODELS[kind])
    settings = _read_settings(path)
    if settings.get("kind", kind) != kind:
        raise ValueError(f"checkpoint {path!r} holds a {settings['kind']!r} generator, but kind {kind!r} was asked for")
    auto_cls = AutoModelForCausalLM if kind == "causal" else AutoModelForSeq2SeqLM
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = auto_cls.from_pretrained(path)
    except OSError as err:
        raise OSError(
            f"could not load the {kind} generator {path!r}: {err}. Where no model hub is reachable, build a checkpoint "
            "with create_generator_from_config or create_bert2bert_from_minilm and load it by path"
        ) from err
    if tokenizer.eos_token_id is None and kind == "causal":
        raise ValueError(f"the tokenizer of causal generator {path!r} has no eos token to end a caption with")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if kind == "seq2seq" and model.config.decoder_start_token_id is None:
        raise ValueError(f"seq2seq generator {path!r} has no decoder_start_token_id in its config")
    dev = pick_device(device)
    model.to(dev).eval()
    return StyleGenerator(kind, model, tokenizer, dev, settings.get("sep", DEFAULT_SEP) if sep is None else sep,
                          max_source_len, max_target_len, bool(settings.get("word_level", False)))


def _positions(gen: StyleGenerator) -> int | None:
    """How many absolute token positions a causal model has (None for seq2seq or no such limit)."""
    if gen.kind != "causal":
        return None
    config = gen.model.config
    return getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", None)


def _check_texts(**columns: Sequence[str]) -> int:
    lengths = {name: len(values) for name, values in columns.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"inputs must have the same length, got {lengths}")
    for name, values in columns.items():
        bad = [i for i, v in enumerate(values) if not isinstance(v, str)]
        if bad:
            raise ValueError(f"{name} must hold strings; row {bad[0]} is {type(values[bad[0]]).__name__}")
    return next(iter(lengths.values()))


def _source_ids(
    gen: StyleGenerator, style_phrases: Sequence[str], contents: Sequence[str], reserve: int
) -> list[list[int]]:
    """Token ids of the model input: the causal prompt (ending in sep) or the seq2seq source, cut to
    ``max_source_len``. A causal prompt is also cut so that it plus ``reserve`` output tokens fit the model's
    positions."""
    texts = [gen.source_text(p, c) for p, c in zip(style_phrases, contents)]
    tok = gen.tokenizer
    if gen.kind == "seq2seq":
        return tok(texts, truncation=True, max_length=gen.max_source_len).input_ids
    sep_ids = tok(gen.sep.rstrip(), add_special_tokens=False).input_ids
    positions = _positions(gen)
    limit = gen.max_source_len if positions is None else min(gen.max_source_len, positions - reserve)
    if limit <= len(sep_ids):
        raise ValueError(f"{reserve} output tokens leave no room for a prompt in the generator's {positions} "
                         "positions; lower max_new_tokens or max_target_len")
    return [ids[: limit - len(sep_ids)] + sep_ids for ids in tok(texts, add_special_tokens=False).input_ids]


def _target_ids(gen: StyleGenerator, captions: Sequence[str]) -> list[list[int]]:
    """Token ids of the caption the model learns to produce, ending in eos."""
    tok = gen.tokenizer
    if gen.kind == "causal":
        ids = tok([" " + c.strip() for c in captions], add_special_tokens=False).input_ids
        return [t[: gen.max_target_len - 1] + [gen.eos_token_id] for t in ids]
    start = gen.model.config.decoder_start_token_id
    out = []
    for t in tok(text_target=[c.strip() for c in captions], truncation=True, max_length=gen.max_target_len).input_ids:
        t = t[1:] if t and t[0] == start else t  # BERT2BERT: [CLS] is the decoder start, not a target
        out.append(t if t and t[-1] == gen.eos_token_id else t[: gen.max_target_len - 1] + [gen.eos_token_id])
    return out


def _pad(seqs: Sequence[Sequence[int]], value: int, left: bool = False) -> torch.Tensor:
    width = max(len(s) for s in seqs)
    rows = [[value] * (width - len(s)) + list(s) if left else list(s) + [value] * (width - len(s)) for s in seqs]
    return torch.tensor(rows, dtype=torch.long)


def _mask(seqs: Sequence[Sequence[int]], left: bool = False) -> torch.Tensor:
    return _pad([[1] * len(s) for s in seqs], 0, left)


def _training_batch(
    gen: StyleGenerator, sources: Sequence[list[int]], targets: Sequence[list[int]]
) -> dict[str, torch.Tensor]:
    """Right-padded tensors with labels = -100 everywhere but on the caption tokens."""
    pad = gen.tokenizer.pad_token_id
    if gen.kind == "causal":
        seqs = [s + t for s, t in zip(sources, targets)]
        labels = [[IGNORE_INDEX] * len(s) + t for s, t in zip(sources, targets)]
        batch = {"input_ids": _pad(seqs, pad), "attention_mask": _mask(seqs), "labels": _pad(labels, IGNORE_INDEX)}
    else:
        batch = {"input_ids": _pad(sources, pad), "attention_mask": _mask(sources),
                 "labels": _pad(targets, IGNORE_INDEX)}
    return {k: v.to(gen.device) for k, v in batch.items()}


def encode_training_batch(
    gen: StyleGenerator, style_phrases: Sequence[str], contents: Sequence[str], captions: Sequence[str]
) -> dict[str, torch.Tensor]:
    """The tensors one training step feeds the model (input_ids, attention_mask, labels), on the model's device."""
    _check_texts(style_phrases=style_phrases, contents=contents, captions=captions)
    sources = _source_ids(gen, style_phrases, contents, gen.max_target_len)
    return _training_batch(gen, sources, _target_ids(gen, captions))


def _loss_and_hits(gen: StyleGenerator, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int, int]:
    """Mean loss of a batch, and (correct, total) teacher-forced argmax predictions on its caption tokens."""
    out = gen.model(**batch)
    logits, labels = out.logits, batch["labels"]
    if gen.kind == "causal":
        logits, labels = logits[:, :-1], labels[:, 1:]
    mask = labels != IGNORE_INDEX
    hits = int(((logits.argmax(-1) == labels) & mask).sum())
    return out.loss, hits, int(mask.sum())


def _training_loss(gen: StyleGenerator, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean cross-entropy on the caption tokens. For a causal model the output projection runs on the caption
    positions only (the prompt half of every sequence needs no vocabulary logits): same loss, about half the cost."""
    model = gen.model
    head = model.get_output_embeddings() if gen.kind == "causal" else None
    if head is None or model.base_model is model:
        return model(**batch).loss
    hidden = model.base_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    labels = batch["labels"][:, 1:]
    keep = labels != IGNORE_INDEX
    logits = head(hidden[:, :-1][keep])
    return torch.nn.functional.cross_entropy(logits.float(), labels[keep])


def fine_tune(
    gen: StyleGenerator,
    style_phrases: Sequence[str],
    contents: Sequence[str],
    captions: Sequence[str],
    *,
    epochs: int = 1,
    batch_size: int,
    lr: float = 5e-5,
    weight_decay: float = 0.0,
    max_grad_norm: float = 1.0,
    seed: int,
    on_step: StepCallback | None = None,
) -> FineTuneResult:
    """Fine-tune ``gen`` in place to rebuild each caption from its style phrase and content.

    The paper fine-tunes with AdamW at lr 5e-5 for 1 epoch (the defaults; a generator built from a config, trained
    from scratch, needs more: about 1e-3 and several epochs).

    Examples are shuffled each epoch from ``seed``; ``on_step(step, {"loss", "epoch", "lr"})`` is called after every
    optimizer step (step counts from 1). The model is left in eval mode.
    """
    n = _check_texts(style_phrases=style_phrases, contents=contents, captions=captions)
    if n == 0:
        raise ValueError("fine_tune needs at least one (style phrase, content, caption) example")
    if epochs < 1 or batch_size < 1 or not lr > 0:
        raise ValueError(f"epochs and batch_size must be >= 1 and lr > 0, got {epochs}, {batch_size}, {lr}")
    sources, targets = _source_ids(gen, style_phrases, contents, gen.max_target_len), _target_ids(gen, captions)
    torch.manual_seed(seed)
    order_rng = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(gen.model.parameters(), lr=lr, weight_decay=weight_decay)
    result = FineTuneResult()
    gen.model.train()
    try:
        for epoch in range(epochs):
            order = torch.randperm(n, generator=order_rng).tolist()
            for start in range(0, n, batch_size):
                idx = order[start : start + batch_size]
                batch = _training_batch(gen, [sources[i] for i in idx], [targets[i] for i in idx])
                loss = _training_loss(gen, batch)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(gen.model.parameters(), max_grad_norm)
                optimizer.step()
                result.losses.append(float(loss.detach()))
                if on_step is not None:
                    on_step(result.steps, {"loss": result.losses[-1], "epoch": float(epoch), "lr": lr})
    finally:
        gen.model.eval()
    return result


@torch.no_grad()
def teacher_forced_metrics(
    gen: StyleGenerator,
    style_phrases: Sequence[str],
    contents: Sequence[str],
    captions: Sequence[str],
    batch_size: int = 32,
) -> dict[str, float]:
    """Reconstruction quality with the true caption fed in: mean token ``loss`` and ``token_accuracy`` (argmax hits)."""
    n = _check_texts(style_phrases=style_phrases, contents=contents, captions=captions)
    if n == 0:
        raise ValueError("teacher_forced_metrics needs at least one example")
    sources, targets = _source_ids(gen, style_phrases, contents, gen.max_target_len), _target_ids(gen, captions)
    loss_sum, hits, total = 0.0, 0, 0
    for start in range(0, n, batch_size):
        batch = _training_batch(gen, sources[start : start + batch_size], targets[start : start + batch_size])
        loss, h, t = _loss_and_hits(gen, batch)
        loss_sum, hits, total = loss_sum + float(loss) * t, hits + h, total + t
    return {"loss": loss_sum / total, "token_accuracy": hits / total}


def exact_match(generated: Sequence[str], references: Sequence[str]) -> float:
    """Share of generated captions equal to their reference after ``normalize_caption``."""
    _check_texts(generated=generated, references=references)
    if not generated:
        raise ValueError("exact_match needs at least one caption")
    return sum(normalize_caption(g) == normalize_caption(r) for g, r in zip(generated, references)) / len(generated)


def _generation_config(
    gen: StyleGenerator, strategy: str, num_beams: int, top_p: float, temperature: float, max_new_tokens: int
) -> GenerationConfig:
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    ids: dict[str, Any] = {"pad_token_id": gen.tokenizer.pad_token_id, "eos_token_id": gen.eos_token_id}
    if gen.kind == "seq2seq":
        ids["decoder_start_token_id"] = gen.model.config.decoder_start_token_id
    common = {"max_new_tokens": max_new_tokens, "use_cache": True, **ids}
    if strategy == "greedy":
        return GenerationConfig(do_sample=False, num_beams=1, **common)
    if strategy == "beam":
        if num_beams < 2:
            raise ValueError(f"beam search needs num_beams >= 2, got {num_beams}")
        return GenerationConfig(do_sample=False, num_beams=num_beams, early_stopping=True, **common)
    if not (0 < top_p <= 1) or not temperature > 0:
        raise ValueError(f"sampling needs 0 < top_p <= 1 and temperature > 0, got {top_p=}, {temperature=}")
    return GenerationConfig(do_sample=True, top_p=top_p, top_k=0, temperature=temperature, **common)


class SourceWordsConstraint(LogitsProcessor):
    """Allow only tokens of each input's bag (and eos): a token may be generated as often as it occurs in the input.

    ``bags`` is a (batch, vocab) tensor of token counts of each input; rows of the scores are ``batch * beams``
    (beam ``r`` belongs to input ``r // beams``); ``offset`` is where generated tokens start in ``input_ids``.
    ``always`` lists token ids allowed everywhere (eos).
    """

    def __init__(self, bags: torch.Tensor, offset: int, beams: int, always: Sequence[int]) -> None:
        self.bags, self.offset, self.beams = bags, offset, beams
        self.always = torch.tensor(sorted(set(always)), dtype=torch.long, device=bags.device)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        rows = torch.arange(input_ids.shape[0], device=input_ids.device) // self.beams
        left = self.bags[rows].clone()
        generated = input_ids[:, self.offset :]
        if generated.shape[1]:
            left.scatter_add_(1, generated, -torch.ones_like(generated, dtype=left.dtype))
        allowed = left > 0
        allowed[:, self.always] = True
        return scores.masked_fill(~allowed, float("-inf"))


class MergeConstraint(LogitsProcessor):
    """Generate an interleaving of the content and the style phrase: every content token in its order (none left
    out), phrase tokens in their order, eos only once both are used up. With ``skip_phrase`` the model may also
    leave phrase tokens out (jump to a later one, or end once the content is used up).

    This is the shape of every training target: an extracted style phrase and its content are the caption's words
    split in two, each kept in order, so the caption is a merge of the two. ``contents`` / ``phrases`` hold each
    input's token ids; rows of the scores are ``batch * beams``; ``offset`` is where generated tokens start.
    ``contiguous[i]``: input i's phrase is a trailing clause (see models.phrase_transfer), written as one block
    after the whole content, where FlickrStyle writes its style ("a dog runs on the beach searching for bones"). A
    block the model placed mid-caption read as broken ("a man holding a boy upside down on top of dreams of olympic
    greatness park") and the filters passed it.
    """

    def __init__(self, contents: Sequence[Sequence[int]], phrases: Sequence[Sequence[int]], offset: int, beams: int,
                 eos: int, skip_phrase: bool = False, contiguous: Sequence[bool] | None = None,
                 incremental: bool = False) -> None:
        self.contents, self.phrases = [list(c) for c in contents], [list(p) for p in phrases]
        self.offset, self.beams, self.eos, self.skip_phrase = offset, beams, eos, skip_phrase
        self.contiguous = list(contiguous) if contiguous is not None else [False] * len(self.phrases)
        if len(self.contiguous) != len(self.phrases):
            raise ValueError(f"contiguous has {len(self.contiguous)} flags for {len(self.phrases)} inputs")
        # incremental: each beam's (content, phrase) position is kept per (input, prefix) and advanced by the one
        # token a step adds, instead of being recomputed from the whole prefix (same allowed sets)
        self.incremental = incremental
        self._states: dict[tuple, tuple[int, int, bool]] = {}

    def _advance(self, row: int, state: tuple[int, int, bool], t: int) -> tuple[int, int, bool]:
        """The position after token ``t``, as :meth:`allowed`'s scan moves it."""
        ci, pi, ended = state
        if ended or t == self.eos:
            return ci, pi, True
        content, phrase = self.contents[row], self.phrases[row]
        if ci < len(content) and t == content[ci]:
            return ci + 1, pi, False
        for j in range(pi, len(phrase)):
            if phrase[j] == t:
                return ci, j + 1, False
        return ci, pi, False

    def _allowed_at(self, row: int, state: tuple[int, int, bool], written: int) -> list[int]:
        ci, pi, ended = state
        if ended:
            return [self.eos]
        content, phrase = self.contents[row], self.phrases[row]
        if self.contiguous[row]:  # the content, then the clause: the next token is fixed by how many were written
            whole_len = len(content) + len(phrase)
            return [(content + phrase)[written]] if written < whole_len else [self.eos]
        nxt = [content[ci]] if ci < len(content) else []
        if self.skip_phrase:
            return (nxt or [self.eos]) + phrase[pi:]
        nxt += phrase[pi : pi + 1]
        return nxt or [self.eos]

    def allowed(self, row: int, generated: Sequence[int]) -> list[int]:
        """The tokens input ``row`` may write after ``generated``: its position scanned from the whole prefix."""
        return self._allowed_at(row, self._scan(row, generated), len(generated))

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        mask = torch.ones_like(scores, dtype=torch.bool)
        generated = input_ids[:, self.offset :].tolist()
        if not self.incremental:
            for r, gen_ids in enumerate(generated):
                mask[r, self.allowed(r // self.beams, gen_ids)] = False
            return scores.masked_fill(mask, float("-inf"))
        rows, tokens = [], []
        states: dict[tuple, tuple[int, int, bool]] = {}
        for r, gen_ids in enumerate(generated):
            row = r // self.beams
            key = (row, *gen_ids)
            state = states.get(key) or self._states.get(key)
            if state is None and not gen_ids:
                state = (0, 0, False)
            elif state is None:
                parent = self._states.get(key[:-1])
                state = (self._advance(row, parent, gen_ids[-1]) if parent is not None
                         else self._scan(row, gen_ids))
            states[key] = state
            allowed = self._allowed_at(row, state, len(gen_ids))
            rows += [r] * len(allowed)
            tokens += allowed
        self._states = states
        mask[torch.tensor(rows, dtype=torch.long), torch.tensor(tokens, dtype=torch.long)] = False
        return scores.masked_fill(mask, float("-inf"))

    def _scan(self, row: int, generated: Sequence[int]) -> tuple[int, int, bool]:
        state = (0, 0, False)
        for t in generated:
            state = self._advance(row, state, t)
        return state


def _bags(gen: StyleGenerator, sources: Sequence[Sequence[int]]) -> torch.Tensor:
    """(n, vocab) counts of the word tokens of each source (special tokens but [UNK] left out)."""
    vocab = gen.model.get_output_embeddings().weight.shape[0] if gen.model.get_output_embeddings() is not None \
        else len(gen.tokenizer)
    special = set(gen.tokenizer.all_special_ids) - {gen.tokenizer.unk_token_id}
    bags = torch.zeros((len(sources), vocab), dtype=torch.int16)
    for row, ids in enumerate(sources):
        for t in ids:
            if t not in special and t < vocab:
                bags[row, t] += 1
    return bags


def _word_ids(gen: StyleGenerator, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each text as the generator writes it (a leading space, no special tokens)."""
    return gen.tokenizer([" " + t.strip() for t in texts], add_special_tokens=False).input_ids


def _decode_words(gen: StyleGenerator, ids: Sequence[int], source_text: str) -> str:
    """Word-level decoding: specials dropped, each [UNK] replaced by the next out-of-vocabulary source word."""
    tok = gen.tokenizer
    unk = tok.unk_token_id
    oov = [w for w in source_text.replace(gen.sep.strip(), " ").split() if tok.convert_tokens_to_ids(w) == unk]
    special = set(tok.all_special_ids)
    words = []
    for t in ids:
        if t == unk:
            if oov:
                words.append(oov.pop(0))
        elif t not in special:
            words.append(tok.convert_ids_to_tokens(int(t)))
    return " ".join(agree_articles(words))


def clause_after_sentence(clause: str, factual_caption: str) -> tuple[str, str]:
    """(clause, factual caption) with the caption's closing punctuation moved after the clause, so that a trailing
    clause continues the sentence ("a dog in a room. hoping for a treat" -> "a dog in a room hoping for a treat .")."""
    body = factual_caption.rstrip()
    end = len(body)
    while end and body[end - 1] in ".!?":
        end -= 1
    if end == len(body) or not body[:end].strip():
        return clause, factual_caption
    return f"{clause.rstrip()} {body[end:]}", body[:end].rstrip()


def graft(style_phrases: Sequence[str], factual_captions: Sequence[str]) -> list[str]:
    """The graft baseline, no model: each phrase appended to its factual caption, before the caption's closing
    punctuation (:func:`clause_after_sentence`), articles agreeing as decoding makes them."""
    out = []
    for phrase, caption in zip(style_phrases, factual_captions):
        phrase, caption = clause_after_sentence(phrase.strip(), caption.strip())
        out.append(" ".join(agree_articles(f"{caption} {phrase}".split())))
    return out


_AN_EXCEPTIONS = ("uni", "use", "usu", "one", "eu")  # vowel letter, consonant sound: "a university", "a one-way"


def agree_articles(words: Sequence[str]) -> list[str]:
    """"a" / "an" agreeing with the next word's first sound (by spelling, with the common exceptions): a placed
    phrase word often lands after the factual caption's article ("a excellent hydrant" -> "an excellent hydrant")."""
    out = list(words)
    for i in range(len(out) - 1):
        if out[i].lower() not in ("a", "an") or not out[i + 1][:1].isalpha():
            continue
        nxt = out[i + 1].lower()
        vowel = nxt[0] in "aeiou" and not nxt.startswith(_AN_EXCEPTIONS)
        article = "an" if vowel or nxt.startswith(("hour", "honest", "honor")) else "a"
        out[i] = article.capitalize() if out[i][0].isupper() else article
    return out


@torch.no_grad()
def generate(
    gen: StyleGenerator,
    style_phrases: Sequence[str],
    factual_captions: Sequence[str],
    *,
    strategy: str,
    num_beams: int = 4,
    top_p: float = 0.9,
    temperature: float = 1.0,
    max_new_tokens: int = 40,
    batch_size: int,
    seed: int,
    no_repeat_ngram_size: int,
    repetition_penalty: float,
    constraint: str = "none",
    contiguous: Sequence[bool] | None = None,
    fast: bool,
) -> list[str]:
    """Generate one stylized caption per "[retrieved phrase] [SEP] [factual caption]", in input order.

    ``strategy``: ``greedy``, ``beam`` (``num_beams``) or ``sample`` (nucleus ``top_p``, ``temperature``; the global
    RNG is left untouched and ``seed`` makes a call repeatable). Runs in batches of ``batch_size`` with the KV cache.
    ``no_repeat_ngram_size`` (0 = off) and ``repetition_penalty`` (1 = off) are Hugging Face's decoding options;
    ``constraint="source_words"`` lets only the input's own tokens be generated (see ``SourceWordsConstraint``);
    ``"merge"`` / ``"merge_skip"`` write the factual caption with the phrase's tokens placed into it by the model
    (see ``MergeConstraint``; meant for word-level generators, where a token is a word); ``contiguous`` (one flag
    per input, merge only) writes those inputs' phrases as one trailing block.

    ``fast`` (greedy and beam; the same captions): under a merge constraint without no-repeat n-grams an input whose
    phrase is a trailing block has one allowed token at every step, so its caption is written without the model;
    the other inputs are decoded in batches of similar source length (less padding), and the merge constraint
    advances each beam's position by its last token instead of scanning the whole prefix.
    """
    n = _check_texts(style_phrases=style_phrases, factual_captions=factual_captions)
    if contiguous is not None and len(contiguous) != n:
        raise ValueError(f"contiguous needs one flag per input: {len(contiguous)} for {n}")
    if contiguous is not None and constraint in ("merge", "merge_skip"):
        moved = [clause_after_sentence(p, f) if block else (p, f)
                 for p, f, block in zip(style_phrases, factual_captions, contiguous)]
        style_phrases, factual_captions = [p for p, _ in moved], [f for _, f in moved]
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if constraint not in CONSTRAINTS:
        raise ValueError(f"constraint must be one of {CONSTRAINTS}, got {constraint!r}")
    if no_repeat_ngram_size < 0 or not repetition_penalty > 0:
        raise ValueError(f"no_repeat_ngram_size must be >= 0 and repetition_penalty > 0, got "
                         f"{no_repeat_ngram_size}, {repetition_penalty}")
    config = _generation_config(gen, strategy, num_beams, top_p, temperature, max_new_tokens)
    if no_repeat_ngram_size:
        config.no_repeat_ngram_size = no_repeat_ngram_size
    if repetition_penalty != 1.0:
        config.repetition_penalty = repetition_penalty
    sources = _source_ids(gen, style_phrases, factual_captions, max_new_tokens)
    texts = [gen.source_text(p, c) for p, c in zip(style_phrases, factual_captions)]
    left = gen.kind == "causal"
    beams = num_beams if strategy == "beam" else 1
    merge = constraint in ("merge", "merge_skip")
    fast = fast and strategy != "sample"  # sampling draws per batch: its batches keep their order
    outputs: list[str | None] = [None] * n
    todo = list(range(n))
    if fast and merge and contiguous is not None and not no_repeat_ngram_size:
        blocks = [i for i in todo if contiguous[i]]
        if blocks:
            whole = [c + p for c, p in zip(_word_ids(gen, [factual_captions[i] for i in blocks]),
                                           _word_ids(gen, [style_phrases[i] for i in blocks]))]
            for i, ids in zip(blocks, whole):
                outputs[i] = _decode_output(gen, ids[:max_new_tokens], texts[i])
            todo = [i for i in todo if not contiguous[i]]
    if fast:
        todo.sort(key=lambda i: len(sources[i]))
    devices = [gen.device] if gen.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        for start in range(0, len(todo), batch_size):
            rows = todo[start : start + batch_size]
            chunk = [sources[i] for i in rows]
            input_ids = _pad(chunk, gen.tokenizer.pad_token_id, left=left).to(gen.device)
            attention_mask = _mask(chunk, left=left).to(gen.device)
            processors = LogitsProcessorList()
            offset = input_ids.shape[1] if left else 1  # where generated tokens start in what generate() passes
            if constraint == "source_words":
                processors.append(SourceWordsConstraint(_bags(gen, chunk).to(gen.device), offset, beams,
                                                        [gen.eos_token_id]))
            elif merge:
                processors.append(MergeConstraint(
                    _word_ids(gen, [factual_captions[i] for i in rows]), _word_ids(gen, [style_phrases[i] for i in rows]),
                    offset, beams, gen.eos_token_id, skip_phrase=constraint == "merge_skip",
                    contiguous=[contiguous[i] for i in rows] if contiguous is not None else None, incremental=fast))
            out = gen.model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config,
                                     logits_processor=processors)
            new_tokens = out[:, input_ids.shape[1] :] if left else out
            for i, ids in zip(rows, new_tokens):
                outputs[i] = _decode_output(gen, ids.tolist(), texts[i])
    return [str(o) for o in outputs]


def _decode_output(gen: StyleGenerator, ids: Sequence[int], source_text: str) -> str:
    """A generated caption from its new token ids (word-level: :func:`_decode_words`; else the tokenizer's)."""
    if gen.word_level:
        return _decode_words(gen, ids, source_text).strip()
    return gen.tokenizer.decode(ids, skip_special_tokens=True).strip()


def _config_with(defaults: dict[str, Any], overrides: dict[str, Any], base: Any, kind: str) -> dict[str, Any]:
    allowed = set(base().to_dict())
    unknown = sorted(set(overrides) - allowed)
    if unknown:
        raise ValueError(f"unknown {type(base()).__name__} keys for a {kind} generator: {unknown}")
    return {**defaults, **overrides}


def create_generator_from_config(
    kind: str,
    tokenizer_corpus: Sequence[str],
    save_dir: str | Path,
    *,
    vocab_size: int,
    config_overrides: dict[str, Any] | None,
    sep: str = DEFAULT_SEP,
    seed: int,
) -> str:
    """Build an untrained generator (``init: config``) and save it; returns the folder ``load_generator`` takes.

    ``causal``: a byte-level BPE tokenizer trained on ``tokenizer_corpus`` and a ``GPT2Config`` model;
    ``seq2seq``: a Unigram tokenizer and a ``T5Config`` model. Sizes are ``DEFAULT_CONFIGS[kind]`` updated with
    ``config_overrides`` (keys of the config class; special-token ids and vocab size come from the tokenizer).
    """
    _check_kind(kind)
    overrides = dict(config_overrides or {})
    if kind == "causal":
        tok = train_gpt2_tokenizer(tokenizer_corpus, vocab_size)
        eos = tok.eos_token_id
        params = _config_with(DEFAULT_CONFIGS[kind], overrides, GPT2Config, kind)
        config = GPT2Config(vocab_size=len(tok), bos_token_id=eos, eos_token_id=eos, pad_token_id=eos, **params)
    else:
        tok = train_t5_tokenizer(tokenizer_corpus, vocab_size)
        params = _config_with(DEFAULT_CONFIGS[kind], overrides, T5Config, kind)
        config = T5Config(vocab_size=len(tok), pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                          decoder_start_token_id=tok.pad_token_id, **params)
    torch.manual_seed(seed)
    auto_cls = AutoModelForCausalLM if kind == "causal" else AutoModelForSeq2SeqLM
    model = auto_cls.from_config(config)
    return StyleGenerator(kind, model, tok, torch.device("cpu"), sep).save(save_dir)


def create_bert2bert_from_minilm(save_dir: str | Path, encoder_path: str | None = None, *, seed: int) -> str:
    """Build a seq2seq ``EncoderDecoderModel`` warm-started from MiniLM on both sides and save it; returns the folder.

    ``encoder_path`` defaults to the packaged all-MiniLM-L6-v2. The decoder reuses its BERT weights with causal
    self-attention; its cross-attention starts from random. [CLS] starts decoding, [SEP] ends it, and the separator
    is BERT's own [SEP]. MiniLM ships no masked-LM head, so the decoder's output transform starts from random too
    (its output projection is tied to the pretrained word embeddings).
    """
    path = resolve_model_path(encoder_path or minilm_path())
    tok = AutoTokenizer.from_pretrained(path)
    torch.manual_seed(seed)
    previous = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the missing cross-attention and LM-head transform weights are expected
    try:
        model = EncoderDecoderModel.from_encoder_decoder_pretrained(path, path)
    finally:
        hf_logging.set_verbosity(previous)
    for cfg in (model.config, model.generation_config):
        cfg.decoder_start_token_id = tok.cls_token_id
        cfg.eos_token_id = tok.sep_token_id
        cfg.pad_token_id = tok.pad_token_id
    model.config.vocab_size = model.config.decoder.vocab_size
    return StyleGenerator("seq2seq", model, tok, torch.device("cpu"), DEFAULT_SEP).save(save_dir)


def _minilm_word_embeddings(words: Sequence[str], width: int, encoder_path: str | None = None,
                            std: float = 0.02) -> torch.Tensor:
    """(len(words), width) embeddings: MiniLM's WordPiece embeddings of each word averaged, PCA-projected to
    ``width`` (zero-padded if wider than MiniLM) and scaled to GPT-2's initial std."""
    path = resolve_model_path(encoder_path or minilm_path())
    tok = AutoTokenizer.from_pretrained(path)
    table = AutoModel.from_pretrained(path).get_input_embeddings().weight.detach()
    pieces = tok(list(words), add_special_tokens=False).input_ids
    vectors = torch.stack([table[ids].mean(0) if ids else table[tok.unk_token_id] for ids in pieces])
    vectors = vectors - vectors.mean(0, keepdim=True)
    k = min(width, vectors.shape[1], vectors.shape[0])
    _, _, v = torch.linalg.svd(vectors, full_matrices=False)
    projected = vectors @ v[:k].T
    if k < width:
        projected = torch.cat([projected, torch.zeros(len(words), width - k)], dim=1)
    return projected * (std / projected.std().clamp_min(1e-8))


def create_word_level_generator(
    tokenizer_corpus: Sequence[str],
    save_dir: str | Path,
    config_overrides: dict[str, Any] | None,
    min_frequency: int = 1,
    max_vocab: int | None = None,
    embeddings: str = "minilm",
    sep: str = DEFAULT_SEP,
    *,
    seed: int,
) -> str:
    """Build an untrained GPT-2 over whole words (``init: word_level``) and save it; returns its folder.

    The vocabulary is the words of ``tokenizer_corpus`` (normalised captions: the stylized train captions and the
    factual corpus); ``embeddings="minilm"`` starts each word's (tied input/output) embedding from MiniLM's
    pretrained WordPiece embeddings, ``"random"`` from GPT-2's random init.
    """
    if embeddings not in ("minilm", "random"):
        raise ValueError(f"embeddings must be 'minilm' or 'random', got {embeddings!r}")
    tok = train_word_tokenizer(tokenizer_corpus, min_frequency=min_frequency, max_vocab=max_vocab)
    eos = tok.eos_token_id
    params = _config_with(DEFAULT_CONFIGS["causal"], dict(config_overrides or {}), GPT2Config, "causal")
    config = GPT2Config(vocab_size=len(tok), bos_token_id=eos, eos_token_id=eos, pad_token_id=eos, **params)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    if embeddings == "minilm":
        vocab = tok.convert_ids_to_tokens(list(range(len(tok))))
        special = set(tok.all_special_tokens)
        words = [w for w in vocab if w not in special]
        ids = tok.convert_tokens_to_ids(words)
        with torch.no_grad():
            model.get_input_embeddings().weight[ids] = _minilm_word_embeddings(words, config.n_embd)
    return StyleGenerator("causal", model, tok, torch.device("cpu"), sep, word_level=True).save(save_dir)
