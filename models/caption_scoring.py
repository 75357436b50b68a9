"""One scoring of captions for generation (filter 1, filter 2) and evaluation (cls., ppl.): paper Sect. 3.3 and 4.4.

The evaluation classifiers are one binary classifier per style, that style against factual captions (paper Sect.
4.4: "we train a classifier for each style ... to distinguish stylized from factual captions"). Two kinds:

- ``linear_probe``: a logistic head per style over frozen, mean-pooled, L2-normalised sentence embeddings
  (:class:`models.encoders.SentenceEncoder`, MiniLM by default). One encoder pass serves every style, so a batch
  with mixed target styles costs one forward pass; training is one embedding pass plus an L-BFGS fit per style.
- ``finetune``: a BERT-family classifier per style over [factual, style] (:mod:`models.style_classifier`),
  fine-tuned with AdamW.

:func:`score_captions` turns captions and their target styles into the three columns both generate and evaluate
use: ``style_probability`` (p(target style | caption) from that style's classifier), ``predicted_style`` (the target
style if that probability is > 0.5, else the factual label) and ``perplexity`` (the target style's trigram LM,
:class:`models.trigram_lm.StyleLanguageModels`; NaN where that style has no LM or no LMs are given). An empty
caption scores probability 0.

A saved set of evaluation classifiers is a folder with ``evaluation_classifiers.json`` (kind, styles, factual label,
backbone, max_length), plus ``heads.npz`` (linear_probe) or one model folder per style (finetune).
"""
from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd
import torch

MANIFEST = "evaluation_classifiers.json"
FORMAT = "erg-evaluation-classifiers/1"
KINDS = ("linear_probe", "finetune")


class EvaluationClassifiers(ABC):
    """p(style | caption) against factual captions, one binary classifier per style."""

    kind: str

    def __init__(self, styles: Sequence[str], factual_label: str, name_or_path: str, max_length: int) -> None:
        if not styles:
            raise ValueError("evaluation classifiers need at least one style")
        self.styles = list(styles)
        self.factual_label = factual_label
        self.name_or_path = name_or_path
        self.max_length = int(max_length)

    def _check_styles(self, target_styles: Sequence[str]) -> None:
        unknown = sorted({s for s in target_styles if s not in self.styles})
        if unknown:
            raise ValueError(f"no evaluation classifier for styles {unknown}: trained styles are {self.styles}")

    def style_probability(self, texts: Sequence[str], target_styles: Sequence[str],
                          batch_size: int = 64) -> np.ndarray:
        """p(target style | caption) per caption (float64 [n]); an empty caption gets 0."""
        if isinstance(texts, str):
            raise ValueError("texts must be a list of captions, not a single string")
        if len(texts) != len(target_styles):
            raise ValueError(f"texts and target_styles differ in length: {len(texts)} vs {len(target_styles)}")
        self._check_styles(target_styles)
        out = np.zeros(len(texts), dtype=np.float64)
        rows = [i for i, text in enumerate(texts) if isinstance(text, str) and text.strip()]
        if rows:
            out[rows] = self._probability([texts[i] for i in rows], [target_styles[i] for i in rows], batch_size)
        return out

    def accuracy(self, style: str, style_texts: Sequence[str], factual_texts: Sequence[str],
                 batch_size: int = 64) -> dict[str, float]:
        """Accuracy of ``style``'s classifier on its captions (label 1) and factual captions (label 0)."""
        p_style = self.style_probability(list(style_texts), [style] * len(style_texts), batch_size)
        p_fact = self.style_probability(list(factual_texts), [style] * len(factual_texts), batch_size)
        correct = int((p_style > 0.5).sum() + (p_fact <= 0.5).sum())
        return {"accuracy": correct / max(1, len(p_style) + len(p_fact)),
                "accuracy_style": float((p_style > 0.5).mean()) if len(p_style) else float("nan"),
                "accuracy_factual": float((p_fact <= 0.5).mean()) if len(p_fact) else float("nan"),
                "n_style": len(p_style), "n_factual": len(p_fact)}

    def save(self, path: str | Path) -> str:
        """Write the classifiers to folder ``path``; returns it."""
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        self._save_weights(folder)
        (folder / MANIFEST).write_text(json.dumps({
            "format": FORMAT, "kind": self.kind, "styles": self.styles, "factual_label": self.factual_label,
            "name_or_path": self.name_or_path, "max_length": self.max_length}, indent=2))
        return str(folder)

    @abstractmethod
    def _probability(self, texts: list[str], target_styles: list[str], batch_size: int) -> np.ndarray:
        """p(target | caption) for non-empty captions."""

    @abstractmethod
    def _save_weights(self, folder: Path) -> None:
        """Write what :func:`load_evaluation_classifiers` reads back."""


class LinearProbeClassifiers(EvaluationClassifiers):
    """A logistic head per style over one frozen sentence encoder: p = sigmoid(w_s . e(y) + b_s)."""

    kind = "linear_probe"

    def __init__(self, encoder, weights: Mapping[str, np.ndarray], biases: Mapping[str, float], factual_label: str,
                 name_or_path: str) -> None:
        super().__init__(list(weights), factual_label, name_or_path, encoder.max_length)
        self.encoder = encoder
        self.weights = {s: np.asarray(w, dtype=np.float32) for s, w in weights.items()}
        self.biases = {s: float(b) for s, b in biases.items()}
        for style, w in self.weights.items():
            if w.shape != (encoder.dim,):
                raise ValueError(f"head of {style!r} has shape {w.shape}, the encoder gives {encoder.dim}-d vectors")

    def _probability(self, texts: list[str], target_styles: list[str], batch_size: int) -> np.ndarray:
        vectors = self.encoder.encode_texts(texts, batch_size=batch_size)
        w = np.stack([self.weights[s] for s in target_styles])
        b = np.array([self.biases[s] for s in target_styles])
        logits = (vectors.astype(np.float64) * w).sum(axis=1) + b
        return 1.0 / (1.0 + np.exp(-logits))

    def _save_weights(self, folder: Path) -> None:
        np.savez(folder / "heads.npz", styles=np.array(self.styles),
                 weights=np.stack([self.weights[s] for s in self.styles]),
                 biases=np.array([self.biases[s] for s in self.styles]))


class FinetunedClassifiers(EvaluationClassifiers):
    """A fine-tuned [factual, style] sequence classifier per style."""

    kind = "finetune"

    def __init__(self, models: Mapping[str, object], factual_label: str, name_or_path: str, max_length: int) -> None:
        super().__init__(list(models), factual_label, name_or_path, max_length)
        self.models = dict(models)
        for style, clf in self.models.items():
            if clf.labels != [factual_label, style]:
                raise ValueError(f"the classifier of {style!r} has labels {clf.labels}, "
                                 f"expected {[factual_label, style]}")

    def _probability(self, texts: list[str], target_styles: list[str], batch_size: int) -> np.ndarray:
        out = np.zeros(len(texts), dtype=np.float64)
        styles = np.array(target_styles)
        for style in sorted(set(target_styles)):
            rows = np.flatnonzero(styles == style)
            out[rows] = self.models[style].predict_proba([texts[i] for i in rows], batch_size)[:, 1]
        return out

    def _save_weights(self, folder: Path) -> None:
        for style, clf in self.models.items():
            clf.save(folder / style)


def fit_logistic(features: np.ndarray, targets: np.ndarray, l2: float = 1e-3,
                 max_iter: int = 200) -> tuple[np.ndarray, float]:
    """Binary logistic regression (mean log loss + l2 * |w|^2) by full-batch L-BFGS; returns (w, b)."""
    x = torch.from_numpy(np.asarray(features, dtype=np.float64))
    y = torch.from_numpy(np.asarray(targets, dtype=np.float64))
    if x.ndim != 2 or len(x) != len(y) or len(x) == 0:
        raise ValueError(f"need features [n, d] and n targets, got {tuple(x.shape)} and {tuple(y.shape)}")
    if not set(np.unique(targets).tolist()) <= {0, 1}:
        raise ValueError("targets must be 0 (factual) or 1 (style)")
    w = torch.zeros(x.shape[1], dtype=torch.float64, requires_grad=True)
    b = torch.zeros((), dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([w, b], lr=1.0, max_iter=max_iter, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(x @ w + b, y) + l2 * (w * w).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    return w.detach().numpy().astype(np.float32), float(b.detach())


def balanced_pairs(positives: Sequence[str], factual: Sequence[str], cap: Optional[int],
                   seed: int) -> tuple[list[str], list[int]]:
    """Training captions of one style (label 1, at most ``cap``) and as many factual ones (label 0), seeded."""
    rng = np.random.default_rng(seed)
    positives = list(positives)
    if cap is not None and len(positives) > cap:
        positives = [positives[i] for i in sorted(rng.choice(len(positives), size=cap, replace=False))]
    n_neg = min(len(positives), len(factual))
    negatives = [factual[i] for i in sorted(rng.choice(len(factual), size=n_neg, replace=False))]
    return positives + negatives, [1] * len(positives) + [0] * len(negatives)


def train_evaluation_classifiers(kind: str, positives: Mapping[str, Sequence[str]], factual: Sequence[str], *,
                                 name_or_path: str, max_length: int, factual_label: str = "factual",
                                 device: str = "auto", l2: float = 1e-3, epochs: int = 1,
                                 batch_size: int = 32, lr: float = 2e-5, max_train_captions: Optional[int] = None,
                                 seed: int = 29,
                                 on_step: Optional[Callable[[str, int, dict], None]] = None,
                                 batch_order: str = "length_buckets", precision: str = "fp32") -> EvaluationClassifiers:
    """Train one style-vs-factual classifier per style of ``positives`` (style -> its training captions).

    Each style's classifier sees its captions (at most ``max_train_captions``) and as many factual captions drawn
    from ``factual``. ``on_step(style, step, metrics)`` reports fine-tuning steps (finetune only);
    ``batch_order`` and ``precision`` are :func:`models.style_classifier.fine_tune`'s.
    """
    if kind not in KINDS:
        raise ValueError(f"evaluation classifier kind must be one of {KINDS}, got {kind!r}")
    empty = [style for style, texts in positives.items() if not texts]
    if empty or not positives:
        raise ValueError(f"every style needs training captions; none for {empty or 'any style'}")
    if not factual:
        raise ValueError("evaluation classifiers need factual captions to train against; none were given")
    data = {style: balanced_pairs(texts, factual, max_train_captions, seed + i)
            for i, (style, texts) in enumerate(positives.items())}
    if kind == "linear_probe":
        from models.encoders import SentenceEncoder

        encoder = SentenceEncoder(name_or_path, device=device, max_length=max_length)
        unique = sorted({text for texts, _ in data.values() for text in texts})
        vectors = dict(zip(unique, encoder.encode_texts(unique, batch_size=64)))
        weights, biases = {}, {}
        for style, (texts, labels) in data.items():
            weights[style], biases[style] = fit_logistic(np.stack([vectors[t] for t in texts]), np.array(labels), l2)
        return LinearProbeClassifiers(encoder, weights, biases, factual_label, name_or_path)

    from models.style_classifier import fine_tune, load_style_classifier

    models = {}
    for style, (texts, labels) in data.items():
        torch.manual_seed(seed)
        clf = load_style_classifier(name_or_path, [factual_label, style], device=device, max_length=max_length,
                                    with_factual=True)
        fine_tune(clf, texts, [style if label else factual_label for label in labels], epochs=epochs,
                  batch_size=batch_size, lr=lr, seed=seed, batch_order=batch_order, precision=precision,
                  on_step=None if on_step is None else (lambda step, m, s=style: on_step(s, step, m)))
        models[style] = clf
    return FinetunedClassifiers(models, factual_label, name_or_path, max_length)


def load_evaluation_classifiers(path: str | Path, device: str = "auto") -> EvaluationClassifiers:
    """Load classifiers written by :meth:`EvaluationClassifiers.save`."""
    folder = Path(path)
    manifest_path = folder / MANIFEST
    if not manifest_path.is_file():
        raise ValueError(f"{folder} holds no {MANIFEST}: not a folder of evaluation classifiers (run `erg extract`)")
    manifest = json.loads(manifest_path.read_text())
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{manifest_path} has format {manifest.get('format')!r}, expected {FORMAT!r}")
    if manifest["kind"] == "linear_probe":
        from models.encoders import SentenceEncoder

        heads = np.load(folder / "heads.npz")
        styles = [str(s) for s in heads["styles"]]
        encoder = SentenceEncoder(manifest["name_or_path"], device=device, max_length=manifest["max_length"])
        return LinearProbeClassifiers(encoder, dict(zip(styles, heads["weights"])),
                                      dict(zip(styles, heads["biases"])), manifest["factual_label"],
                                      manifest["name_or_path"])
    if manifest["kind"] == "finetune":
        from models.style_classifier import load_style_classifier

        models = {style: load_style_classifier(str(folder / style), None, device=device,
                                               max_length=manifest["max_length"]) for style in manifest["styles"]}
        return FinetunedClassifiers(models, manifest["factual_label"], manifest["name_or_path"],
                                    manifest["max_length"])
    raise ValueError(f"{manifest_path}: unknown kind {manifest['kind']!r}; known kinds are {KINDS}")


SCORE_COLUMNS = ["style_probability", "predicted_style", "perplexity"]


def score_captions(texts: Sequence[str], target_styles: Sequence[str], classifiers: EvaluationClassifiers,
                   lms=None, batch_size: int = 64, folds: Sequence[int | None] | None = None) -> pd.DataFrame:
    """Score captions against their target styles: one row per caption, columns :data:`SCORE_COLUMNS`.

    ``style_probability``: p(target style | caption) from the target style's evaluation classifier;
    ``predicted_style``: the target style if that probability is > 0.5, else ``classifiers.factual_label``;
    ``perplexity``: under the target style's trigram LM of ``lms`` (NaN where ``lms`` is None or lacks the style);
    ``folds``: each caption's background fold, for LMs with a folded factual background (see models.trigram_lm).
    """
    texts = ["" if text is None or (isinstance(text, float) and np.isnan(text)) else text for text in texts]
    target_styles = list(target_styles)
    probability = classifiers.style_probability(texts, target_styles, batch_size)
    perplexity = np.full(len(texts), np.nan)
    if lms is not None:
        rows = [i for i, style in enumerate(target_styles) if style in lms.styles]
        if rows:
            perplexity[rows] = lms.perplexities([texts[i] for i in rows], [target_styles[i] for i in rows],
                                                None if folds is None else [folds[i] for i in rows])
    return pd.DataFrame({
        "style_probability": probability,
        "predicted_style": [style if p > 0.5 else classifiers.factual_label
                            for style, p in zip(target_styles, probability)],
        "perplexity": perplexity,
    }, columns=SCORE_COLUMNS)
