"""Evaluation's visual re-ranking of captioner beams (udfs.visual_rerank, jobs.visual_rerank) on a tiny fitted
captioner: the visual pick is the beam candidate the relatedness scorer prefers, the beam pick the model's best; the
report scores both against the same references."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from models.captioners import CaptionVocab, beam_decode
from tests.test_captioners import CAPTIONS, STYLES, fitted
from udfs.visual_rerank import RERANK_COLUMNS, pick_visual, rerank_batch


class ShortestIsMostRelated:
    """Relatedness 1 / words of the caption; NaN where the row has no labels."""

    def score(self, captions, labels, confidences=None):
        return np.array([np.nan if lab is None else 1.0 / max(1, len(c.split())) for c, lab in zip(captions, labels)])


class HumorFromCaptionLength:
    factual_label = "factual"

    def style_probability(self, texts, styles, batch_size):
        return np.array([0.9 if len(t.split()) > 3 else 0.1 for t in texts])


def test_pick_visual_prefers_the_most_related_then_the_beam_order():
    assert pick_visual(np.array([0.2, 0.7, 0.7])) == 1
    assert pick_visual(np.array([np.nan, 0.1])) == 1
    assert pick_visual(np.array([np.nan, np.nan])) == 0


def test_rerank_batch_beam_pick_and_visual_pick():
    vocab = CaptionVocab.build(CAPTIONS, STYLES, min_count=1)
    model, features = fitted("nic", vocab)
    frame = pd.DataFrame({"image_id": ["i0", "i1", "i2", "i3"], "style": ["humor"] * 4,
                          "features": [row.tolist() for row in features],
                          "tags": ["dog grass", "dog", None, "kids"], "tags_confidence": [0.3, None, None, 0.2]})
    out = rerank_batch(frame, {"original": model}, ShortestIsMostRelated(), HumorFromCaptionLength(), None,
                       beam_size=3, max_len=10, length_penalty=1.0)
    assert list(out.columns) == RERANK_COLUMNS and len(out) == 8
    beams = beam_decode(model, features, "humor", beam_size=3, max_len=10, length_penalty=1.0, no_repeat_ngram_size=0)
    for i, candidates in enumerate(beams):
        rows = out[out["image_id"] == f"i{i}"].set_index("ranking")
        assert rows.loc["beam", "hypothesis"] == candidates[0][0] == CAPTIONS[i].lower().rstrip(".").replace(" .", "")
        assert rows.loc["beam", "beam_rank"] == 0 and rows.loc["beam", "candidates"] == len(candidates)
        if i == 2:  # no visual context: NaN relatedness, the visual pick falls back to the beam's
            assert math.isnan(rows.loc["visual", "relatedness"]) and rows.loc["visual", "beam_rank"] == 0
            continue
        lengths = [len(c.split()) for c, _ in candidates]
        expect = lengths.index(min(lengths))
        assert rows.loc["visual", "beam_rank"] == expect
        assert rows.loc["visual", "hypothesis"] == candidates[expect][0]
        assert rows.loc["visual", "relatedness"] == pytest.approx(1 / min(lengths))
        assert rows.loc["visual", "relatedness"] >= rows.loc["beam", "relatedness"]
    assert set(out["predicted_style"]) <= {"humor", "factual"} and out["perplexity"].isna().all()


class ExactMatch:
    """A caption scorer stand-in: BLEU-1 = share of hypotheses equal to one of their references."""

    def score(self, references, hypotheses):
        return {"BLEU-1": float(np.mean([hypotheses[k] in references[k] for k in hypotheses]))}


def test_rerank_table_scores_both_rankings_on_the_same_images():
    from jobs.visual_rerank import rerank_table

    rows = pd.DataFrame([
        ("original", "beam", "a", "humor", "a dog runs", 0.5, 0, 3, "humor", 0.9, 10.0),
        ("original", "visual", "a", "humor", "a dog", 0.9, 2, 3, "factual", 0.2, 30.0),
        ("original", "beam", "b", "humor", "a cat", 0.4, 0, 3, "humor", 0.8, 20.0),
        ("original", "visual", "b", "humor", "a cat", 0.4, 0, 3, "humor", 0.8, 20.0),
    ], columns=RERANK_COLUMNS)
    references = {("a", "humor"): ["a dog"], ("b", "humor"): ["a bird"]}
    table = rerank_table(rows, references, ExactMatch()).set_index("ranking")
    assert table.loc["beam", "BLEU-1"] == 0.0 and table.loc["visual", "BLEU-1"] == 0.5
    assert table.loc["beam", "relatedness"] == pytest.approx(0.45) and table.loc["visual", "relatedness"] == 0.65
    assert table.loc["beam", "cls."] == 1.0 and table.loc["visual", "cls."] == 0.5
    assert table.loc["visual", "ppl."] == 25.0 and (table["changed"] == 0.5).all() and (table["images"] == 2).all()


def test_rerank_with_the_real_scorer_prefers_the_caption_naming_the_labels():
    """MiniLM relatedness picks, among planted candidates, the one that names the image's labels."""
    from models.encoders import SentenceEncoder
    from models.visual_relatedness import VisualRelatednessScorer

    scorer = VisualRelatednessScorer(SentenceEncoder("all-MiniLM-L6-v2", "cpu"))
    candidates = ["a man standing in a room", "a man wearing glasses and a bow tie", "a person in a room"]
    related = scorer.score(candidates, ["bow tie windsor glasses"] * 3, [0.20234838] * 3)
    assert pick_visual(related) == 1 and related[1] > related[0] + 0.1
