"""The fluency discriminator's training data (corruptions of real captions) and its threshold (no Spark)."""
from __future__ import annotations

import random

import numpy as np
import pytest

from models.fluency import (BROKEN, CORRUPTIONS, FLUENT, choose_threshold, corrupt, fluency_examples,
                            fluency_probability, train_fluency_classifier)

CAPTIONS = ["a man is riding a horse on the beach", "two dogs are playing with a ball in the grass",
            "a woman in a red dress is walking down the street", "a child is jumping into a swimming pool",
            "a group of people are sitting at a table eating", "a surfer is riding a wave in the ocean",
            "a black dog is running through the snow", "a boy is trying to kick a soccer ball"]
PHRASES = ["searching for his lost owner", "in love", "happily", "dreaming of cake"]


def test_each_corruption_breaks_the_caption_its_own_way() -> None:
    rng = random.Random(0)
    words = "a boy is trying to kick a soccer ball".split()
    graft = [p.split() for p in PHRASES]
    mid = corrupt(words, "clause_mid", rng, graft)
    assert mid[0] == "a" and mid[-1] == "ball" and len(mid) > len(words)  # inside, never at an end
    assert len(corrupt(words, "word_dropped", rng, graft)) == len(words) - 1
    doubled = corrupt(words, "word_doubled", rng, graft)
    assert len(doubled) == len(words) + 1 and any(a == b for a, b in zip(doubled, doubled[1:]))
    verb = corrupt(words, "verb_form", rng, graft)
    assert verb != words and len(verb) == len(words)
    assert {verb[words.index("trying")], verb[words.index("kick")]} & {"try", "trys", "kicks", "kicking"}
    swapped = corrupt(words, "words_swapped", rng, graft)
    assert sorted(swapped) == sorted(words) and swapped != words
    assert corrupt("a dog".split(), "word_dropped", rng, graft) is None  # too short
    assert corrupt("a red car".split(), "verb_form", rng, graft) is None  # no verb to break
    with pytest.raises(ValueError, match="corruption kind"):
        corrupt(words, "typo", rng, graft)


def test_examples_pair_each_real_caption_with_a_corruption_of_every_kind_in_turn() -> None:
    texts, labels, made = fluency_examples(CAPTIONS * 3, PHRASES, seed=1, max_examples=None)
    assert labels.count(FLUENT) == 24 and labels.count(BROKEN) == sum(made.values()) >= 20
    assert set(made) == set(CORRUPTIONS) and min(made.values()) >= 1
    real = {c for c in CAPTIONS}
    assert not any(t in real for t, label in zip(texts, labels) if label == BROKEN)
    assert fluency_examples(CAPTIONS, PHRASES, seed=1, max_examples=None) == fluency_examples(CAPTIONS, PHRASES,
                                                                                              seed=1, max_examples=None)


def test_threshold_keeps_the_asked_share_of_real_captions() -> None:
    p = np.linspace(0.01, 1.0, 100)
    t = choose_threshold(p, 0.95)
    assert (p >= t).mean() == pytest.approx(0.95, abs=0.011)
    assert choose_threshold([0.3], 0.9) == 0.3


@pytest.mark.slow
def test_the_discriminator_learns_to_tell_corruptions_from_real_captions() -> None:
    clf, stats = train_fluency_classifier(CAPTIONS * 6, PHRASES, name_or_path="all-MiniLM-L6-v2", max_length=32,
                                          epochs=10, batch_size=16, lr=2e-4, seed=0, device="cpu", max_examples=None)
    assert stats["fluent"] == 48 and stats["broken"] >= 40
    real = fluency_probability(clf, CAPTIONS, 16)
    broken = fluency_probability(clf, ["a man is riding a horse on the beach expert happily",
                                       "two dogs are are playing with a ball in in the grass",
                                       "a boy is trying to kicks a soccer ball"], 16)
    assert real.mean() > broken.mean() + 0.2, (real, broken)
