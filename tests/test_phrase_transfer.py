"""The transfer phrase: which words of a retrieved style phrase the generator is asked to place."""
from __future__ import annotations

import pytest

from models.phrase_transfer import (load_propensity, phrase_propensity, save_propensity, transfer_mask,
                                    transfer_phrase)

# Train captions as the extractor left them: tokens and the phrase mask (True = a style phrase word).
TRAIN = [
    ("a nice man rides a bike".split(), [True, True, False, False, False, False]),
    ("a nice dog in a nice park".split(), [True, True, False, False, True, True, False]),
    ("the dirty building stands tall".split(), [False, True, True, False, False]),
    ("a girl happily in love with the sea".split(), [False, False, True, True, True, False, False, False]),
    ("a building near the girl".split(), [False, False, False, False, False]),
]


@pytest.fixture(scope="module")
def propensity() -> dict[str, float]:
    return phrase_propensity([t for t, _ in TRAIN], [m for _, m in TRAIN])


def test_propensity_is_the_smoothed_share_of_phrase_occurrences(propensity):
    assert propensity["nice"] == pytest.approx((3 + 0.5) / (3 + 1))
    assert propensity["building"] == pytest.approx((1 + 0.5) / (2 + 1))  # once in a phrase, once in content
    assert propensity["girl"] == pytest.approx(0.5 / 3)


def test_articles_scene_nouns_and_factual_words_are_not_transferred(propensity):
    tokens = "a a nice girl".split()
    mask = [True, True, True, True]
    assert transfer_phrase(tokens, mask, propensity, 0.5) == "nice"  # "a a" and the noun "girl" stay behind
    assert transfer_phrase(tokens, mask, propensity, 0.5, factual_caption="a nice view") == ""  # already there
    assert transfer_phrase("the dirty building".split(), [True, True, True], propensity, 0.5) == "dirty building"
    assert transfer_phrase("the dirty building".split(), [True, True, True], propensity, 0.6) == "dirty"


def test_function_words_inside_a_kept_span_stay(propensity):
    tokens = "a girl happily in love with the sea".split()
    mask = [False, False, True, True, True, False, False, False]
    assert transfer_mask(tokens, mask, propensity, 0.5) == [False, False, True, True, True, False, False, False]
    # two spans: each keeps its own style words, nothing in between the spans
    tokens, mask = "nice dog in a nice park".split(), [True, False, False, False, True, False]
    assert transfer_phrase(tokens, mask, propensity, 0.5) == "nice nice"


def test_round_trip_and_bad_input(propensity, tmp_path):
    path = save_propensity(propensity, 0.5, tmp_path / "p.json")
    again, p_min = load_propensity(path)
    assert again == pytest.approx(propensity) and p_min == 0.5
    with pytest.raises(ValueError, match="differ in length"):
        transfer_mask(["a", "b"], [True], propensity, 0.5)
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="not a phrase propensity file"):
        load_propensity(tmp_path / "bad.json")
