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
from models.style_classifier import (BUCKET_BATCHES, StyleClassifier, fine_tune, load_style_classifier, training_batches,
                                     validate_labels)
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


def test_length_buckets_cover_every_caption_once_with_less_padding():
    rng = np.random.default_rng(0)
    lengths = rng.integers(4, 40, size=BUCKET_BATCHES * 8 * 3 + 5).tolist()  # three buckets and a partial one
    plans = {order: training_batches(lengths, 8, torch.Generator().manual_seed(3), order)
             for order in ("random", "length_buckets")}
    for batches in plans.values():
        assert sorted(torch.cat(batches).tolist()) == list(range(len(lengths)))
        assert len(batches) == math.ceil(len(lengths) / 8) and sum(len(b) < 8 for b in batches) == 1
    # random is the plain shuffle the old path drew; buckets pad far less (a batch costs its longest caption)
    assert [b.tolist() for b in plans["random"]] == [
        b.tolist() for b in torch.randperm(len(lengths), generator=torch.Generator().manual_seed(3)).split(8)]
    padded = {order: sum(len(b) * max(lengths[i] for i in b.tolist()) for b in batches)
              for order, batches in plans.items()}
    assert padded["length_buckets"] < 0.75 * padded["random"]
    # batches are not in length order: the order of buckets and of batches is drawn from the generator
    first = [max(lengths[i] for i in b.tolist()) for b in plans["length_buckets"]]
    assert first != sorted(first)
    again = training_batches(lengths, 8, torch.Generator().manual_seed(3), "length_buckets")
    assert [b.tolist() for b in again] == [b.tolist() for b in plans["length_buckets"]]
    with pytest.raises(ValueError, match="batch_order must be one of"):
        training_batches(lengths, 8, torch.Generator(), "sorted")


def test_bf16_fine_tuning_keeps_fp32_weights_and_learns(tiny_path):
    torch.manual_seed(0)
    clf = load_style_classifier(tiny_path, LABELS, device="cpu", max_length=16)
    texts, labels = separable_corpus(12, seed=0)
    losses = []
    fine_tune(clf, texts, labels, epochs=4, batch_size=12, lr=3e-3, seed=0, precision="bf16",
              on_step=lambda step, metrics: losses.append(metrics["loss"]))
    assert all(p.dtype == torch.float32 for p in clf.model.parameters())
    assert np.mean(losses[-3:]) < np.mean(losses[:3])
    with pytest.raises(ValueError, match="precision must be one of"):
        fine_tune(clf, texts, labels, precision="fp16")
