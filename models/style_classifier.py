"""The style classifier of the Extract step: p(label | caption) over [factual, style_1, ..., style_n].

Any BERT-family checkpoint (a Hugging Face name, a local folder, or the embedded ``all-MiniLM-L6-v2``) is loaded
through :func:`models.backbones.resolve_model_path` and ``AutoModelForSequenceClassification``; a backbone without
a classification head gets a new one sized to the labels. Attention is forced to the ``eager`` implementation so that
``output_attentions=True`` returns the softmax attention maps the attention scorer (paper Eq. 1) reads.

Labels: with ``with_factual=True`` (the default) ``labels[0]`` is the factual (unstylized) class and ``labels[1:]``
are the styles, e.g. ``["factual", "humor", "romantic"]``; with ``with_factual=False`` every label is a style, as for
the extractor's per-style-set classifier (``["humor", "romantic"]``, paper Sect. 3.1). The choice is saved in the
model config (``erg_with_factual``), so a saved classifier loads back the same way. Captions are classified as their word sequence
(:func:`models.text.caption_words`, fed with ``is_split_into_words=True``), the same segmentation that the
attention scorer and the phrase extraction use, so a caption with words removed is classified exactly as the
extractor sees it. Words past ``max_length`` word pieces are truncated.

Fine-tuning follows the paper's recipe (AdamW, batch 32/64, lr 1e-5/2e-5, 3 epochs) with a linear warmup/decay
schedule; only parameters with ``requires_grad`` are trained, so a caller may freeze parts of the network.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import torch
from transformers import (AutoConfig, AutoModelForSequenceClassification, AutoTokenizer, BatchEncoding,
                          PreTrainedModel, PreTrainedTokenizerBase, get_linear_schedule_with_warmup)

from models.backbones import pick_device, resolve_model_path
from models.text import caption_words

StepCallback = Callable[[int, dict], None]


def validate_labels(labels: Sequence[str], with_factual: bool = True) -> list[str]:
    """Check classifier labels, all distinct non-empty strings: factual first, then at least one style
    (``with_factual``), or at least two styles."""
    if isinstance(labels, str) or not isinstance(labels, Sequence):
        raise ValueError(f"labels must be a list like ['factual', 'humor', 'romantic'], got {labels!r}")
    labels = list(labels)
    if len(labels) < 2:
        raise ValueError(f"labels need the factual class first and at least one style, got {labels!r}" if with_factual
                         else f"labels of a classifier without a factual class need at least two styles, got {labels!r}")
    bad = [label for label in labels if not isinstance(label, str) or not label.strip()]
    if bad:
        raise ValueError(f"labels must be non-empty strings, got {bad!r} in {labels!r}")
    duplicates = sorted({label for label in labels if labels.count(label) > 1})
    if duplicates:
        raise ValueError(f"labels must be distinct, {duplicates} repeat in {labels!r}")
    return labels


def _is_default_label(label: str, index: int) -> bool:
    return label == f"LABEL_{index}"


def _checkpoint_labels(config) -> Optional[list[str]]:
    """Labels a saved style classifier carries in its config, or None for a backbone without a trained head."""
    architectures = getattr(config, "architectures", None) or []
    if not any(arch.endswith("ForSequenceClassification") for arch in architectures):
        return None
    id2label = {int(key): value for key, value in (config.id2label or {}).items()}
    labels = [id2label[index] for index in sorted(id2label)]
    if all(_is_default_label(label, index) for index, label in enumerate(labels)):
        return None
    return labels


class StyleClassifier:
    """A sequence classifier over [factual, styles...] with its tokenizer, labels and device.

    ``labels[0]`` is the factual class and ``styles`` the rest. ``num_layers`` and ``num_heads`` give the shape of
    the attention maps that the attention scorer (:mod:`models.style_phrases`) reads.
    """

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, labels: Sequence[str],
                 device: torch.device, max_length: int = 64, with_factual: bool = True) -> None:
        self.labels = validate_labels(labels, with_factual)
        self.with_factual = bool(with_factual)
        if model.config.num_labels != len(self.labels):
            raise ValueError(f"model has {model.config.num_labels} outputs but {len(self.labels)} labels were given")
        if not getattr(tokenizer, "is_fast", False):
            raise ValueError("the style classifier needs a fast tokenizer (word_ids maps word pieces to words)")
        if max_length < 8:
            raise ValueError(f"max_length must be at least 8 word pieces, got {max_length}")
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self.device = device
        self.max_length = int(max_length)

    @property
    def factual_label(self) -> Optional[str]:
        """The unstylized class (``labels[0]``), or None for a classifier over styles only."""
        return self.labels[0] if self.with_factual else None

    @property
    def styles(self) -> list[str]:
        """The style labels (all but the factual class)."""
        return self.labels[1:] if self.with_factual else list(self.labels)

    @property
    def num_layers(self) -> int:
        """Transformer layers L of the backbone."""
        return int(self.model.config.num_hidden_layers)

    @property
    def num_heads(self) -> int:
        """Attention heads H per layer."""
        return int(self.model.config.num_attention_heads)

    def label_index(self, label: str) -> int:
        """Column of ``label`` in :meth:`predict_proba`; ValueError for an unknown label."""
        try:
            return self.labels.index(label)
        except ValueError:
            raise ValueError(f"unknown label {label!r}: allowed are {self.labels}") from None

    def encode_words(self, word_lists: Sequence[Sequence[str]]) -> BatchEncoding:
        """Tokenize pre-split captions (padded, truncated to ``max_length``) onto the classifier's device."""
        encoding = self.tokenizer([list(words) for words in word_lists], is_split_into_words=True, padding=True,
                                  truncation=True, max_length=self.max_length, return_tensors="pt")
        return encoding.to(self.device)

    def log_proba_words(self, word_lists: Sequence[Sequence[str]], batch_size: int = 64) -> np.ndarray:
        """log p(label | words) for pre-split captions, float64 [n, n_labels]; batches are length-sorted."""
        check_batch_size(batch_size)
        out = np.zeros((len(word_lists), len(self.labels)), dtype=np.float64)
        order = sorted(range(len(word_lists)), key=lambda index: len(word_lists[index]))
        self.model.eval()
        with torch.inference_mode():
            for start in range(0, len(order), batch_size):
                chunk = order[start:start + batch_size]
                logits = self.model(**self.encode_words([word_lists[index] for index in chunk])).logits
                out[chunk] = torch.log_softmax(logits.double(), dim=-1).cpu().numpy()
        return out

    def predict_proba(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        """p(label | caption) for raw captions: array [n, n_labels], columns in ``labels`` order, rows sum to 1."""
        return np.exp(self.log_proba_words([caption_words(text) for text in _check_texts(texts)], batch_size))

    def predict(self, texts: Sequence[str], batch_size: int = 64) -> list[str]:
        """The most probable label of each caption."""
        proba = self.predict_proba(texts, batch_size)
        return [self.labels[index] for index in proba.argmax(axis=1)]

    def evaluate(self, texts: Sequence[str], labels: Sequence[str], batch_size: int = 64) -> dict[str, float]:
        """Held-out accuracy: ``accuracy``, ``accuracy/<label>`` and ``n/<label>`` for labels present, and ``n``."""
        targets = self._label_indices(texts, labels)
        predicted = self.predict_proba(texts, batch_size).argmax(axis=1)
        metrics: dict[str, float] = {"accuracy": float((predicted == targets).mean()), "n": int(len(targets))}
        for index, label in enumerate(self.labels):
            rows = targets == index
            if rows.any():
                metrics[f"accuracy/{label}"] = float((predicted[rows] == index).mean())
                metrics[f"n/{label}"] = int(rows.sum())
        return metrics

    def save(self, path: str | Path) -> Path:
        """Write model (labels in its config) and tokenizer with ``save_pretrained``; returns the folder."""
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        self.model.config.erg_with_factual = self.with_factual
        self.model.save_pretrained(folder)
        self.tokenizer.save_pretrained(folder)
        return folder

    @classmethod
    def load(cls, path: str | Path, device: str = "auto", max_length: int = 64) -> "StyleClassifier":
        """Load a classifier written by :meth:`save` (its labels come from the saved config)."""
        return load_style_classifier(str(path), labels=None, device=device, max_length=max_length)

    def _label_indices(self, texts: Sequence[str], labels: Sequence[str]) -> np.ndarray:
        _check_texts(texts)
        if len(texts) != len(labels):
            raise ValueError(f"texts and labels differ in length: {len(texts)} captions, {len(labels)} labels")
        if not texts:
            raise ValueError("no captions given: texts is empty")
        unknown = sorted({label for label in labels if label not in self.labels})
        if unknown:
            raise ValueError(f"unknown labels {unknown}: allowed are {self.labels}")
        return np.array([self.labels.index(label) for label in labels], dtype=np.int64)


def _check_texts(texts: Sequence[str]) -> Sequence[str]:
    if isinstance(texts, str):
        raise ValueError("texts must be a list of captions, not a single string")
    bad = [text for text in texts if not isinstance(text, str)]
    if bad:
        raise ValueError(f"captions must be strings, got {bad[:3]!r}")
    return texts


def check_batch_size(batch_size: int) -> None:
    """ValueError unless ``batch_size`` is a positive integer."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")


def load_style_classifier(name_or_path: str, labels: Optional[Sequence[str]] = None, device: str = "auto",
                          max_length: int = 64, with_factual: Optional[bool] = None) -> StyleClassifier:
    """Load a BERT-family checkpoint as a style classifier.

    ``labels=None`` reads the labels of a saved style classifier from its config (ValueError for a bare backbone).
    Given labels put a new head on a backbone; a saved style classifier must carry the same labels.
    ``with_factual=None`` takes what a saved classifier recorded (else True: ``labels[0]`` is the factual class).
    """
    path = resolve_model_path(name_or_path)
    config = AutoConfig.from_pretrained(path)
    saved = _checkpoint_labels(config)
    saved_with_factual = getattr(config, "erg_with_factual", None) if saved is not None else None
    if with_factual is None:
        with_factual = True if saved_with_factual is None else bool(saved_with_factual)
    elif saved_with_factual is not None and bool(saved_with_factual) != with_factual:
        raise ValueError(f"{name_or_path!r} was saved with with_factual={saved_with_factual}, not {with_factual}")
    if labels is None:
        if saved is None:
            raise ValueError(f"{name_or_path!r} has no trained style head: pass labels, e.g. "
                             "['factual', 'humor', 'romantic']")
        labels = saved
    labels = validate_labels(labels, with_factual)
    if saved is not None and saved != labels:
        raise ValueError(f"{name_or_path!r} was trained for labels {saved}, not {labels}: pass labels=None or "
                         "those labels, or fine-tune from the backbone")
    model = AutoModelForSequenceClassification.from_pretrained(
        path, num_labels=len(labels), id2label=dict(enumerate(labels)),
        label2id={label: index for index, label in enumerate(labels)}, attn_implementation="eager")
    tokenizer = AutoTokenizer.from_pretrained(path)
    return StyleClassifier(model, tokenizer, labels, pick_device(device), max_length, with_factual)


def _parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Trainable parameters, with no weight decay on biases and LayerNorm weights (the BERT recipe)."""
    decay, no_decay = [], []
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        (no_decay if name.endswith("bias") or "LayerNorm" in name or "layernorm" in name else decay).append(parameter)
    if not decay and not no_decay:
        raise ValueError("the model has no trainable parameters (all have requires_grad=False)")
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


BATCH_ORDERS = ("length_buckets", "random")
PRECISIONS = ("fp32", "bf16")
BUCKET_BATCHES = 50  # batches per length bucket: the captions of a bucket are drawn at random, then sorted by length


def training_batches(lengths: Sequence[int], batch_size: int, generator: torch.Generator,
                     batch_order: str = "length_buckets") -> list[torch.Tensor]:
    """One epoch's batches of caption indices, every caption once, ``ceil(n / batch_size)`` batches.

    ``random``: a random permutation cut into batches. ``length_buckets``: a random permutation cut into buckets of
    :data:`BUCKET_BATCHES` batches, each bucket sorted by length (word pieces) and cut into batches, the batches in
    random order: a batch is padded to its longest caption, so similar lengths waste less compute, while every batch
    still mixes captions from a random bucket.
    """
    if batch_order not in BATCH_ORDERS:
        raise ValueError(f"batch_order must be one of {BATCH_ORDERS}, got {batch_order!r}")
    permutation = torch.randperm(len(lengths), generator=generator)
    if batch_order == "random":
        return list(permutation.split(batch_size))
    length_of = torch.as_tensor(list(lengths), dtype=torch.int64)
    batches: list[torch.Tensor] = []
    for bucket in permutation.split(batch_size * BUCKET_BATCHES):
        batches.extend(bucket[torch.argsort(length_of[bucket], stable=True)].split(batch_size))
    return [batches[index] for index in torch.randperm(len(batches), generator=generator).tolist()]


def fine_tune(clf: StyleClassifier, texts: Sequence[str], labels: Sequence[str], epochs: int = 3,
              batch_size: int = 32, lr: float = 2e-5, weight_decay: float = 0.01, warmup_ratio: float = 0.1,
              seed: int = 13, max_grad_norm: float = 1.0, on_step: Optional[StepCallback] = None,
              batch_order: str = "length_buckets", precision: str = "fp32") -> dict[str, float]:
    """Fine-tune ``clf`` in place with AdamW and a linear warmup/decay schedule (cross-entropy over labels).

    ``batch_order``: see :func:`training_batches`. ``precision``: ``bf16`` runs forward and loss under bf16
    autocast (weights and optimizer stay fp32). AdamW is the fused kernel on CPU and CUDA (the same update, one
    kernel over all parameters instead of a loop of small ones).
    ``on_step(step, {"loss", "lr", "epoch"})`` is called after every optimizer step (step counts from 1).
    Returns ``{"loss": mean loss of the last epoch, "steps": optimizer steps, "epochs": epochs}``.
    """
    targets = clf._label_indices(texts, labels)
    if not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be a positive integer, got {epochs!r}")
    check_batch_size(batch_size)
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr!r}")
    if weight_decay < 0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay!r}")
    if not 0 <= warmup_ratio < 1:
        raise ValueError(f"warmup_ratio must be in [0, 1), got {warmup_ratio!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    word_lists = [caption_words(text) for text in texts]
    lengths = [len(ids) for ids in clf.tokenizer(word_lists, is_split_into_words=True, truncation=True,
                                                 max_length=clf.max_length)["input_ids"]]
    steps_per_epoch = math.ceil(len(word_lists) / batch_size)
    total_steps = steps_per_epoch * epochs
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(_parameter_groups(clf.model, weight_decay), lr=lr,
                                  fused=clf.device.type in ("cpu", "cuda"))
    schedule = get_linear_schedule_with_warmup(optimizer, int(round(warmup_ratio * total_steps)), total_steps)
    trainable = [parameter for group in optimizer.param_groups for parameter in group["params"]]
    target_tensor = torch.from_numpy(targets)
    step, epoch_loss = 0, float("nan")
    clf.model.train()
    try:
        for epoch in range(epochs):
            losses = []
            for batch in training_batches(lengths, batch_size, generator, batch_order):
                encoding = clf.encode_words([word_lists[index] for index in batch.tolist()])
                with torch.autocast(clf.device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
                    loss = clf.model(**encoding, labels=target_tensor[batch].to(clf.device)).loss
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(trainable, max_grad_norm)
                optimizer.step()
                schedule.step()
                step += 1
                losses.append(float(loss.detach()))
                if on_step is not None:
                    on_step(step, {"loss": losses[-1], "lr": schedule.get_last_lr()[0], "epoch": epoch + 1})
            epoch_loss = float(np.mean(losses))
    finally:
        clf.model.eval()
    return {"loss": epoch_loss, "steps": step, "epochs": epochs}
