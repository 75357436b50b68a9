"""Tests of the style classifier: loading by path, labels, save/load round trip, fine-tuning and evaluation.

A tiny BERT (built from a BertConfig, MiniLM's tokenizer) is saved to tmp_path and loaded back through the
production loader; MiniLM itself is fine-tuned for a few steps on a small separable corpus.
"""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported: no model hub here

import math

import numpy as np
import pytest
import torch
from models.style_classifier import StyleClassifier, fine_tune, load_style_classifier, validate_labels
from tiny_models import save_tiny_bert

# One intra-op thread: on a shared 2-core machine two OpenMP threads contend and run ~8x slower.
torch.set_num_threads(1)

LABELS = ["factual", "humor", "romantic"]
SUBJECTS = ["a dog", "a man", "two kids", "a woman", "a cat", "an old man", "a girl", "three people"]
PLACES = ["on the beach", "in the park", "near a lake", "on a street", "in the snow", "by a tree"]
STYLE_WORDS = {"factual": ["is standing", "is walking", "sits", "is looking around"],
               "humor": ["is hilarious and silly", "acts funny like a clown", "makes a silly joke"],
               "romantic": ["is in love", "dreams of romance", "feels romantic and lovely"]}


def separable_corpus(n_per_label: int, seed: int) -> tuple[list[str], list[str]]:
    """Captions whose style is given away by their verb phrase."""
    rng = np.random.default_rng(seed)
    texts, labels = [], []
    for label in LABELS:
        for _ in range(n_per_label):
            texts.append(f"{rng.choice(SUBJECTS)} {rng.choice(STYLE_WORDS[label])} {rng.choice(PLACES)} .")
            labels.append(label)
    return texts, labels


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory) -> str:
    """A tiny BERT backbone (no classification head) with MiniLM's tokenizer, saved like a hub checkpoint."""
    return save_tiny_bert(tmp_path_factory.mktemp("tiny_bert"))


def test_tiny_bert_loads_with_a_new_head_and_round_trips(tiny_path, tmp_path):
    clf = load_style_classifier(tiny_path, LABELS, device="cpu", max_length=16)
    assert (clf.labels, clf.factual_label, clf.styles) == (LABELS, "factual", ["humor", "romantic"])
    assert (clf.num_layers, clf.num_heads, clf.max_length) == (2, 2, 16)
    assert clf.model.config._attn_implementation == "eager"
    texts = ["a dog runs on the beach", "", "a very long caption " * 20]
    proba = clf.predict_proba(texts, batch_size=2)
    assert proba.shape == (3, 3) and proba.dtype == np.float64
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, atol=1e-9)
    assert len(clf.predict(texts)) == 3 and set(clf.predict(texts)) <= set(LABELS)
    saved = clf.save(tmp_path / "clf")
    again = StyleClassifier.load(saved, device="cpu", max_length=16)
    assert again.labels == LABELS
    np.testing.assert_allclose(again.predict_proba(texts), proba, atol=1e-6)
    with pytest.raises(ValueError, match="was trained for labels"):
        load_style_classifier(str(saved), ["factual", "positive", "negative"], device="cpu")


def test_label_and_input_validation(tiny_path):
    with pytest.raises(ValueError, match="no trained style head"):
        load_style_classifier(tiny_path, None, device="cpu")
    for bad in (["factual"], ["factual", "humor", "humor"], "factual,humor", ["factual", ""]):
        with pytest.raises(ValueError, match="labels"):
            validate_labels(bad)
    clf = load_style_classifier(tiny_path, LABELS, device="cpu")
    with pytest.raises(ValueError, match="unknown labels \\['sarcastic'\\]"):
        clf.evaluate(["a dog"], ["sarcastic"])
    with pytest.raises(ValueError, match="differ in length"):
        fine_tune(clf, ["a dog", "a cat"], ["factual"])
    with pytest.raises(ValueError, match="single string"):
        clf.predict_proba("a dog")
    with pytest.raises(ValueError, match="unknown label"):
        clf.label_index("sarcastic")
    for kwargs, word in (({"epochs": 0}, "epochs"), ({"lr": 0.0}, "lr"), ({"warmup_ratio": 1.0}, "warmup_ratio"),
                         ({"batch_size": 0}, "batch_size")):
        with pytest.raises(ValueError, match=word):
            fine_tune(clf, ["a dog"], ["factual"], **kwargs)


def test_fine_tune_trains_only_unfrozen_parameters(tiny_path):
    clf = load_style_classifier(tiny_path, LABELS, device="cpu", max_length=16)
    for parameter in clf.model.bert.embeddings.parameters():
        parameter.requires_grad = False
    frozen = clf.model.bert.embeddings.word_embeddings.weight.clone()
    head = clf.model.classifier.weight.clone()
    texts, labels = separable_corpus(8, seed=0)
    steps = []
    result = fine_tune(clf, texts, labels, epochs=2, batch_size=8, lr=1e-3, seed=0,
                       on_step=lambda step, metrics: steps.append((step, metrics)))
    assert result["steps"] == 6 and result["epochs"] == 2 and math.isfinite(result["loss"])
    assert [step for step, _ in steps] == [1, 2, 3, 4, 5, 6]
    assert all(set(metrics) == {"loss", "lr", "epoch"} and metrics["loss"] > 0 for _, metrics in steps)
    assert [metrics["epoch"] for _, metrics in steps] == [1, 1, 1, 2, 2, 2]
    assert torch.equal(clf.model.bert.embeddings.word_embeddings.weight, frozen)
    assert not torch.equal(clf.model.classifier.weight, head)
    assert not clf.model.training


def test_minilm_fine_tune_beats_chance():
    torch.manual_seed(0)  # the new head's initialisation
    clf = load_style_classifier("all-MiniLM-L6-v2", LABELS, device="cpu", max_length=32)
    train_texts, train_labels = separable_corpus(16, seed=1)
    test_texts, test_labels = separable_corpus(10, seed=2)
    losses = []
    before = clf.evaluate(test_texts, test_labels)["accuracy"]
    fine_tune(clf, train_texts, train_labels, epochs=2, batch_size=16, lr=2e-4, warmup_ratio=0.1, seed=0,
              on_step=lambda step, metrics: losses.append(metrics["loss"]))
    metrics = clf.evaluate(test_texts, test_labels)
    assert len(losses) == 6 and np.mean(losses[-2:]) < np.mean(losses[:2])
    assert metrics["n"] == 30 and metrics["accuracy"] >= 0.7 and metrics["accuracy"] > before  # chance is 1/3
    for label in LABELS:
        assert 0.0 <= metrics[f"accuracy/{label}"] <= 1.0 and metrics[f"n/{label}"] == 10
