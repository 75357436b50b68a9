"""Tests of the phrase evaluation: gold added words, micro precision/recall/F1 and the two baselines.

Every expected number here is computed by hand in the comments.
"""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported: no model hub here

import math

import pytest

from models.phrase_eval import (StyleLexicon, gold_added_mask, is_punctuation, random_phrase_masks,
                                score_phrase_masks)
from models.style_phrases import phrase_size
from models.text import caption_words

LOVE = "Two dogs in love are playing in the snow."
LOVE_FACTUAL = ["Two dogs play in the snow.", "A pair of dogs running in snow"]
FUNNY = "a funny cat , sleeping !"
FUNNY_FACTUAL = ["a cat sleeping on a bed"]


def test_gold_added_words_by_hand():
    assert caption_words(LOVE) == ["two", "dogs", "in", "love", "are", "playing", "in", "the", "snow"]
    # factual words: two dogs play in the snow a pair of running -> love, are, playing are added
    assert gold_added_mask(caption_words(LOVE), LOVE_FACTUAL) == [False] * 3 + [True] * 3 + [False] * 3
    # punctuation is never gold, even though no factual caption has "," or "!"
    assert gold_added_mask(caption_words(FUNNY), FUNNY_FACTUAL) == [False, True, False, False, False, False]
    assert is_punctuation(",") and is_punctuation("...") and not is_punctuation("don't")
    with pytest.raises(ValueError, match="at least one factual caption"):
        gold_added_mask(["a"], [])
    with pytest.raises(ValueError, match="not a single string"):
        gold_added_mask(["a"], "a cat")


def test_micro_precision_recall_by_hand():
    gold = [gold_added_mask(caption_words(LOVE), LOVE_FACTUAL), gold_added_mask(caption_words(FUNNY), FUNNY_FACTUAL)]
    predicted = [[False, False, False, True, False, True, False, False, True],  # love, playing, snow: 2 of 3 right
                 [False, True, False, True, False, False]]  # funny, ",": 1 of 2 right
    scores = score_phrase_masks(predicted, gold)
    # TP = 3, predicted = 5, gold = 3 + 1 = 4
    assert (scores.true_positives, scores.n_predicted, scores.n_gold, scores.n_captions) == (3, 5, 4, 2)
    assert scores.precision == pytest.approx(0.6) and scores.recall == pytest.approx(0.75)
    assert scores.f1 == pytest.approx(2 * 0.6 * 0.75 / 1.35)
    assert score_phrase_masks([], []).to_dict() == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "true_positives": 0,
                                                   "n_predicted": 0, "n_gold": 0, "n_captions": 0}
    with pytest.raises(ValueError, match="caption 0"):
        score_phrase_masks([[True]], [[True, False]])
    with pytest.raises(ValueError, match="differ in captions"):
        score_phrase_masks([[True]], [])


def test_random_baseline_uses_the_phrase_size_and_its_seed():
    token_lists = [caption_words(LOVE), caption_words(FUNNY), ["one"], [], ["w"] * 20]
    masks = random_phrase_masks(token_lists, eps=0.25, seed=3)
    assert [sum(mask) for mask in masks] == [phrase_size(len(t), 0.25) for t in token_lists] == [3, 2, 0, 0, 5]
    assert [len(mask) for mask in masks] == [9, 6, 1, 0, 20]
    assert random_phrase_masks(token_lists, 0.25, seed=3) == masks
    assert random_phrase_masks(token_lists, 0.25, seed=4) != masks
    with pytest.raises(ValueError, match="eps"):
        random_phrase_masks(token_lists, eps=0.0)


def test_style_lexicon_by_hand():
    stylized, styles, factual = ["love love dog", "funny dog"], ["romantic", "humor"], ["a dog", "a dog runs"]
    # word counts: romantic {love 2, dog 1} (3 words), humor {funny 1, dog 1} (2), factual {a 2, dog 2, runs 1} (5)
    ctfidf = StyleLexicon.fit(stylized, styles, factual, scoring="ctfidf")
    # A = 10/3 words per class; over all classes love 2, dog 4, funny 1
    assert sorted(ctfidf.styles) == ["humor", "romantic"] and ctfidf.scoring == "ctfidf"
    assert ctfidf.score("love", "romantic") == pytest.approx(2 / 3 * math.log(1 + (10 / 3) / 2))
    assert ctfidf.score("dog", "romantic") == pytest.approx(1 / 3 * math.log(1 + (10 / 3) / 4))
    assert ctfidf.score("funny", "humor") == pytest.approx(1 / 2 * math.log(1 + 10 / 3))
    assert ctfidf.score("love", "humor") == 0.0 and ctfidf.score("unseen", "romantic") == 0.0
    salience = StyleLexicon.fit(stylized, styles, factual)  # (count in style + 1) / (count elsewhere + 1)
    assert salience.scoring == "salience"
    assert salience.score("love", "romantic") == pytest.approx(3 / 1)
    assert salience.score("dog", "romantic") == pytest.approx(2 / 4)  # 1 in humor + 2 in factual elsewhere
    assert salience.score("funny", "humor") == pytest.approx(2 / 1)
    assert StyleLexicon.fit(stylized, styles, factual, smoothing=0.5).score("dog", "humor") == pytest.approx(1.5 / 3.5)
    for lexicon in (ctfidf, salience):
        masks = lexicon.phrase_masks([["the", "dog", "in", "love"], ["a", "funny", "dog", "runs", "fast"]],
                                     ["romantic", "humor"], eps=0.25)
        assert masks == [[False, False, False, True], [False, True, True, False, False]]  # k = 1 and k = 2
        with pytest.raises(ValueError, match="not in the lexicon"):
            lexicon.score("love", "positive")
    with pytest.raises(ValueError, match="one set is empty"):
        StyleLexicon.fit(["love"], ["romantic"], [])
    with pytest.raises(ValueError, match="scoring must be one of"):
        StyleLexicon.fit(stylized, styles, factual, scoring="tfidf")
    with pytest.raises(ValueError, match="smoothing"):
        StyleLexicon.fit(stylized, styles, factual, smoothing=0.0)
