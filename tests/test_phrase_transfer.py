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


def test_a_trailing_clause_is_transferred_whole():
    # FlickrStyle-like humor: the extractor marks "searching" and "bones"; alone they carry no joke
    propensity = {"searching": 0.9, "bones": 0.6, "amuse": 0.9, "love": 0.9, "joy": 0.9}
    tokens = "a dog walks on the sand near the water , searching for bones .".split()
    mask = [False] * 10 + [True, False, True, False]
    assert transfer_phrase(tokens, mask, propensity, 0.5) == "searching bones"
    assert transfer_phrase(tokens, mask, propensity, 0.5, clause_words=8) == "searching for bones"
    # the function words before the style word open the clause; its end is the caption's end
    tokens = "a little girl plays croquet next to a truck to amuse her dad".split()
    mask = [False] * 10 + [True, False, True]
    assert transfer_phrase(tokens, mask, propensity, 0.5, clause_words=8) == "to amuse her dad"
    assert transfer_phrase(tokens, mask, propensity, 0.5, clause_words=3) == "amuse"  # too long: the words alone
    # a style word mid-sentence: its clause runs to the end, 11 words, so the words alone
    tokens = "two dogs in love are playing together in the snow with full joy".split()
    mask = [False, False, False, True] + [False] * 8 + [True]
    assert transfer_phrase(tokens, mask, propensity, 0.5, clause_words=8) == "love joy"
    # a clause that would be the whole caption is not one
    tokens, mask = "searching for bones".split(), [True, False, True]
    assert transfer_phrase(tokens, mask, propensity, 0.5, clause_words=8) == "searching bones"


def test_round_trip_and_bad_input(propensity, tmp_path):
    path = save_propensity(propensity, 0.5, tmp_path / "p.json")
    again, p_min, clause_words = load_propensity(path)
    assert again == pytest.approx(propensity) and p_min == 0.5 and clause_words == {}
    path = save_propensity(propensity, 0.5, tmp_path / "c.json", {"humor": 6})
    assert load_propensity(path)[2] == {"humor": 6}
    with pytest.raises(ValueError, match="differ in length"):
        transfer_mask(["a", "b"], [True], propensity, 0.5)
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="not a phrase propensity file"):
        load_propensity(tmp_path / "bad.json")


def test_generator_pairs_are_resplit_with_the_clause_of_clause_styles():
    import pandas as pd

    from jobs.generate import resplit_pairs

    propensity = {"searching": 0.9, "bones": 0.6, "nice": 0.9}
    tokens = "a dog walks on the sand , searching for bones".split()
    mask = [False] * 7 + [True, False, True]
    frame = pd.DataFrame({"style": ["humor", "positive", "positive"],
                          "tokens": [tokens, tokens, "a nice dog".split()],
                          "phrase_mask": [mask, mask, [False, True, False]]})
    out = resplit_pairs(frame, propensity, 0.5, {"humor": 8})
    assert out["style_phrase"].tolist() == ["searching for bones", "searching bones", "nice"]
    assert out["content"].tolist() == ["a dog walks on the sand ,", "a dog walks on the sand , for", "a dog"]
    assert out["transfer_is_clause"].tolist() == [True, False, False]
