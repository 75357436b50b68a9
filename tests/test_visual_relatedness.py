"""Tests of the visual relatedness scorer (models/visual_relatedness.py): the seed's sim ** P(c) on plain numbers,
a stub encoder with planted vectors for the modes and edge cases, and the real MiniLM on hand-made captions of the
seed's own Karpathy images (labels from visual-context_label.txt)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from models.visual_relatedness import VisualRelatednessScorer, relatedness_from_similarity, top_labels


class StubEncoder:
    """Unit vectors planted per text; counts what it embeds."""

    def __init__(self, vectors: dict[str, list[float]]) -> None:
        self.vectors = {k: np.asarray(v, dtype=np.float64) / np.linalg.norm(v) for k, v in vectors.items()}
        self.calls: list[list[str]] = []

    def encode_texts(self, texts, batch_size=64):
        self.calls.append(list(texts))
        return np.stack([self.vectors[t] for t in texts])


def test_formula_is_similarity_to_the_power_of_confidence():
    out = relatedness_from_similarity([0.5, 0.5, 0.5, -0.3, 1.2, 0.25], [1.0, 0.25, 0.0, 0.3, 0.3, np.nan])
    assert out[0] == pytest.approx(0.5)
    assert out[1] == pytest.approx(0.5 ** 0.25)  # 0.8409: an unsure classifier lifts the score towards 1
    assert out[2] == pytest.approx(1.0)  # no confidence at all: every caption is equally related
    assert out[3] == 0.0  # a negative cosine is clipped to 0
    assert out[4] == 1.0
    assert out[5] == pytest.approx(0.25)  # unknown confidence: the clipped cosine
    assert relatedness_from_similarity(0.4, 0.33) == pytest.approx(0.4 ** 0.33)


def test_top_labels_by_confidence():
    assert top_labels(["a", "b", "c", "d"], [0.1, 0.5, 0.3, 0.4]) == (["b", "d", "c"], [0.5, 0.4, 0.3])
    assert top_labels(["a", "b", "c", "d"], 0.2, k=2) == (["a", "b"], [0.2, 0.2])
    assert top_labels("  street sign  traffic light ", None) == (["street sign traffic light"], [pytest.approx(
        math.nan, nan_ok=True)])
    assert top_labels(None, 0.3) == ([], [])
    assert top_labels(["", None, "dog"], None)[0] == ["dog"]
    with pytest.raises(ValueError, match=r"confidences\[4\] must be in \[0, 1\]"):
        top_labels(["a"], 1.5, row=4)
    with pytest.raises(ValueError, match="2 labels but 3 confidences"):
        top_labels(["a", "b"], [0.1, 0.2, 0.3])


def planted() -> StubEncoder:
    # dog-ish direction e0, food e1, beach e2
    return StubEncoder({
        "a dog in a basket": [1, 0.2, 0], "a plate of food": [0, 1, 0.1], "a man on a surfboard": [0, 0, 1],
        "dog": [1, 0, 0], "basket": [0.8, 0.6, 0], "plate": [0, 1, 0], "dog basket": [0.9, 0.3, 0],
        "dog basket plate": [0.5, 0.5, 0],
    })


def test_joint_mode_one_cosine_to_the_joined_labels_and_mean_confidence():
    enc = planted()
    scorer = VisualRelatednessScorer(enc, "joint")
    out = scorer.score(["a dog in a basket", "a plate of food", "a man on a surfboard"],
                       [["dog", "basket"]] * 3, [[0.3, 0.1]] * 3)
    v = enc.vectors
    expect = [max(float(v[c] @ v["dog basket"]), 0) ** 0.2 for c in ("a dog in a basket", "a plate of food")]
    assert out[:2] == pytest.approx(expect)
    assert out[2] == 0.0  # orthogonal to the labels
    assert out[0] > out[1] > out[2]


def test_per_label_mode_averages_the_top_labels():
    enc = planted()
    scorer = VisualRelatednessScorer(enc, "per_label", top_labels=2)
    out = scorer.score(["a dog in a basket"], [["plate", "dog", "basket"]], [[0.05, 0.6, 0.3]])
    v = enc.vectors
    cap = v["a dog in a basket"]
    expect = ((cap @ v["dog"]) ** 0.6 + (cap @ v["basket"]) ** 0.3) / 2  # plate is the least confident: dropped
    assert out[0] == pytest.approx(expect)


def test_rows_without_context_are_nan_empty_captions_zero_and_labels_embedded_once():
    enc = planted()
    scorer = VisualRelatednessScorer(enc)
    out = scorer.score(["a dog in a basket", "a dog in a basket", "", None, "a plate of food"],
                       ["dog", None, "dog", "dog", []], [0.3, 0.3, 0.3, None, 0.3])
    assert out[0] == pytest.approx(float(enc.vectors["a dog in a basket"] @ enc.vectors["dog"]) ** 0.3)
    assert math.isnan(out[1]) and math.isnan(out[4])
    assert out[2] == 0.0 and out[3] == 0.0
    scorer.score(["a dog in a basket"], ["dog"], [0.2])  # cached: nothing new to embed
    assert enc.calls == [["a dog in a basket", "dog"]]


def test_bad_arguments_name_the_problem():
    with pytest.raises(ValueError, match="label_mode"):
        VisualRelatednessScorer(planted(), "mean")
    with pytest.raises(ValueError, match="top_labels"):
        VisualRelatednessScorer(planted(), top_labels=0)
    with pytest.raises(ValueError, match="one entry per row"):
        VisualRelatednessScorer(planted()).score(["a"], ["dog", "cat"])


@pytest.fixture(scope="module")
def minilm_scorer():
    from models.encoders import SentenceEncoder

    return VisualRelatednessScorer(SentenceEncoder("all-MiniLM-L6-v2", "cpu"))


# (labels of a Karpathy test image from the seed's visual-context_label.txt, its confidence from visual-context.txt,
#  a caption naming the labelled objects, one that does not)
HAND_MADE = [
    ("standard poodle shopping cart footwear", 0.1427611233, "a poodle sitting in a shopping cart",
     "a plate of pasta with broccoli"),
    ("street sign traffic light tower", 0.306412897, "a traffic light and a street sign at a corner",
     "a cat sleeping on a bed"),
    ("toilet seat", 0.3324953312, "a white toilet with its seat up", "two men playing frisbee in a park"),
    ("indian elephant", 0.332252, "people riding an elephant", "a kitchen with a stove and a refrigerator"),
    ("cheeseburger ice cream dessert", 0.3130263257, "a cheeseburger and ice cream on a plate",
     "a train at a station"),
]


def test_minilm_a_caption_naming_the_labelled_objects_outscores_one_that_does_not(minilm_scorer):
    labels = [h[0] for h in HAND_MADE] * 2
    conf = [h[1] for h in HAND_MADE] * 2
    captions = [h[2] for h in HAND_MADE] + [h[3] for h in HAND_MADE]
    out = minilm_scorer.score(captions, labels, conf)
    named, unrelated = out[:5], out[5:]
    assert ((named >= 0) & (named <= 1)).all() and ((unrelated >= 0) & (unrelated <= 1)).all()
    # measured: named 0.85-0.93, unrelated 0-0.73 (the highest where the classifier is least sure, P(c) = 0.14)
    assert (named > unrelated + 0.15).all(), (named, unrelated)
    assert named.min() > 0.8 and np.median(unrelated) < 0.4


def test_minilm_low_confidence_compresses_the_gap(minilm_scorer):
    labels, caption, other = "indian elephant", "people riding an elephant", "a kitchen with a stove"
    sure = minilm_scorer.score([caption, other], [labels] * 2, [1.0, 1.0])
    unsure = minilm_scorer.score([caption, other], [labels] * 2, [0.05, 0.05])
    assert sure[0] > sure[1] and unsure[0] >= unsure[1]
    assert sure[0] - sure[1] > unsure[0] - unsure[1]
