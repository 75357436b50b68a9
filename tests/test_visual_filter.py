"""The visual relatedness filter on generated captions, through generation's scoring (udfs.generation
.score_candidates) with the real MiniLM: a caption that keeps the factual scene passes, one that drifts away from the
image's labels fails with reason "visual", an image without visual context passes; both scores are kept."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest


class EveryCaptionInStyle:
    """Evaluation classifiers that give every caption its target style (so only the visual filter can reject)."""

    factual_label = "factual"

    def style_probability(self, texts, styles, batch_size):
        return np.full(len(texts), 0.9)


@pytest.fixture(scope="module")
def minilm():
    from models.encoders import SentenceEncoder
    from models.visual_relatedness import VisualRelatednessScorer

    encoder = SentenceEncoder("all-MiniLM-L6-v2", "cpu")
    return encoder, VisualRelatednessScorer(encoder)


def candidates() -> pd.DataFrame:
    factual = "a poodle sitting in a shopping cart"
    return pd.DataFrame({
        "query_id": ["q1", "q2", "q3"], "image_id": ["coco:42", "coco:42", "flickr30k:1"],
        "factual_caption": [factual, factual, "a man riding a horse on the beach"],
        "style": ["humor"] * 3, "style_phrase": ["funny", "funny", "lovely"], "similarity": [0.7] * 3,
        "generated_caption": ["a funny poodle sitting in a shopping cart", "a funny plate of pasta on a table",
                              "a man riding a lovely horse on the beach"],
        # coco:42's labels and confidence in the seed's data; the Flickr30K image has no visual context
        "tags": ["standard poodle shopping cart footwear", "standard poodle shopping cart footwear", None],
        "tags_confidence": [0.1427611233, 0.1427611233, None],
    })


def test_drift_from_the_visual_context_is_rejected_and_both_scores_kept(minilm):
    from udfs.generation import SCORED_COLUMNS, score_candidates

    encoder, scorer = minilm
    filters = {"ppl_max": 80.0, "min_similarity": 0.6, "min_content_similarity": None, "well_formed": False,
               "max_relatedness_drop": 0.15}
    out = score_candidates(candidates(), EveryCaptionInStyle(), None, encoder, frozenset(), filters, 8, scorer)
    assert set(SCORED_COLUMNS) <= set(out.columns)
    fact, gen = out["factual_relatedness"].to_numpy(), out["generated_relatedness"].to_numpy()
    assert fact[0] == pytest.approx(fact[1]) and 0.8 < fact[0] < 1.0
    assert abs(gen[0] - fact[0]) < 0.05  # a style word added: relatedness kept
    assert fact[0] - gen[1] > 0.15  # another scene: relatedness lost
    assert math.isnan(fact[2]) and math.isnan(gen[2])
    assert out["passed_visual"].tolist() == [True, False, True]
    # no LMs here: perplexity is NaN and fails every row; the visual verdict stands beside it
    assert out["reject_reason"].tolist() == ["perplexity", "perplexity,visual", "perplexity"]
    off = score_candidates(candidates(), EveryCaptionInStyle(), None, encoder, frozenset(),
                           {**filters, "max_relatedness_drop": None}, 8, scorer)
    assert off["passed_visual"].all() and off["generated_relatedness"].iloc[1] == pytest.approx(gen[1])
    no_scorer = score_candidates(candidates(), EveryCaptionInStyle(), None, encoder, frozenset(), filters, 8)
    assert no_scorer["factual_relatedness"].isna().all() and no_scorer["passed_visual"].all()
