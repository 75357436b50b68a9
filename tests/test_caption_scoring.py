"""The one scoring module of generation and evaluation: per-style evaluation classifiers (style vs factual) and
``score_captions`` (style_probability, predicted_style, perplexity)."""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pandas as pd
import pytest
import torch

from models.caption_scoring import (SCORE_COLUMNS, balanced_pairs, fit_logistic, load_evaluation_classifiers,
                                    score_captions, train_evaluation_classifiers)
from models.trigram_lm import StyleLanguageModels

torch.set_num_threads(1)

SUBJECTS = ["a dog", "a man", "two kids", "a woman", "a cat", "a girl", "three people", "a boy"]
PLACES = ["on the beach", "in the park", "near a lake", "on a street", "in the snow", "by a tree"]
PHRASES = {"factual": ["is standing", "is walking", "sits", "is looking around"],
           "humor": ["is hilarious and silly like a clown", "makes a silly joke to look funny"],
           "positive": ["is happy and beautiful", "has a great and lovely time"]}


def corpus(label: str, n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [f"{rng.choice(SUBJECTS)} {rng.choice(PHRASES[label])} {rng.choice(PLACES)}" for _ in range(n)]


def test_fit_logistic_separates_and_balanced_pairs_are_seeded():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(1, 0.3, (30, 4)), rng.normal(-1, 0.3, (30, 4))])
    y = np.array([1] * 30 + [0] * 30)
    w, b = fit_logistic(x, y, l2=1e-3)
    assert ((x @ w + b > 0) == (y == 1)).all()
    texts, labels = balanced_pairs([f"s{i}" for i in range(10)], [f"f{i}" for i in range(50)], cap=6, seed=1)
    assert labels == [1] * 6 + [0] * 6 and len(set(texts)) == 12
    assert balanced_pairs([f"s{i}" for i in range(10)], [f"f{i}" for i in range(50)], cap=6, seed=1)[0] == texts
    with pytest.raises(ValueError, match="0 \\(factual\\) or 1"):
        fit_logistic(x, y + 1)


@pytest.fixture(scope="module")
def probes():
    positives = {"humor": corpus("humor", 24, 1), "positive": corpus("positive", 24, 2)}
    return train_evaluation_classifiers("linear_probe", positives, corpus("factual", 48, 3), device="cpu",
                                        max_length=32, l2=1e-4, name_or_path="all-MiniLM-L6-v2")


def test_linear_probe_per_style_gets_obvious_cases_right(probes, tmp_path):
    assert probes.styles == ["humor", "positive"] and probes.kind == "linear_probe"
    for style in ("humor", "positive"):
        scores = probes.accuracy(style, corpus(style, 10, 11), corpus("factual", 10, 12))
        assert scores["accuracy_style"] == 1.0 and scores["accuracy_factual"] == 1.0
    again = load_evaluation_classifiers(probes.save(tmp_path / "eval"), device="cpu")
    texts = corpus("humor", 3, 14) + corpus("factual", 3, 15)
    np.testing.assert_allclose(again.style_probability(texts, ["humor"] * 6),
                               probes.style_probability(texts, ["humor"] * 6), atol=1e-6)


def test_score_captions_columns_and_values(probes):
    humor, factual = corpus("humor", 2, 21), corpus("factual", 2, 22)
    lms = StyleLanguageModels.train(corpus("humor", 40, 23), ["humor"] * 40)
    texts = [humor[0], factual[0], "", None, corpus("positive", 1, 24)[0]]
    styles = ["humor", "humor", "humor", "positive", "positive"]
    scored = score_captions(texts, styles, probes, lms)
    assert list(scored.columns) == SCORE_COLUMNS and len(scored) == 5
    assert scored["predicted_style"].tolist() == ["humor", "factual", "factual", "factual", "positive"]
    assert scored["style_probability"].iloc[0] > 0.5 > scored["style_probability"].iloc[1]
    assert scored["style_probability"].iloc[2] == 0.0 == scored["style_probability"].iloc[3]
    ppl = scored["perplexity"].to_numpy()
    assert np.isfinite(ppl[:3]).all() and np.isnan(ppl[3:]).all()  # no LM for positive
    assert ppl[0] < ppl[1]  # the humor LM prefers the humorous caption
    assert score_captions(texts, styles, probes)["perplexity"].isna().all()  # no LMs at all
    with pytest.raises(ValueError, match="no evaluation classifier for styles \\['romantic'\\]"):
        score_captions(["a dog"], ["romantic"], probes)
    assert isinstance(score_captions([], [], probes), pd.DataFrame)


def test_finetune_kind_round_trips(tmp_path):
    from transformers import AutoTokenizer, BertConfig, BertModel

    from models.backbones import minilm_path

    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    BertModel(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=64)).save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    clfs = train_evaluation_classifiers("finetune", {"humor": corpus("humor", 8, 31)}, corpus("factual", 8, 32),
                                        name_or_path=str(tmp_path / "tiny"), device="cpu", max_length=24,
                                        batch_size=8, lr=1e-3)
    assert clfs.models["humor"].labels == ["factual", "humor"]
    again = load_evaluation_classifiers(clfs.save(tmp_path / "eval"), device="cpu")
    texts = corpus("humor", 2, 33)
    np.testing.assert_allclose(again.style_probability(texts, ["humor"] * 2),
                               clfs.style_probability(texts, ["humor"] * 2), atol=1e-6)
    with pytest.raises(ValueError, match="kind must be one of"):
        train_evaluation_classifiers("svm", {"humor": ["a"]}, ["b"], name_or_path="all-MiniLM-L6-v2", max_length=40)
