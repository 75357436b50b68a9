"""The filters beyond the paper on planted broken captions: well-formedness (non-words, loops) and content fidelity.

The planted captions are the garbled outputs the issue quotes from the earlier generator, which passed the paper's
three filters."""
from __future__ import annotations

import pandas as pd
import numpy as np
import pytest

from models.augment_filters import apply_filters, pass_rates
from models.caption_quality import (content_recall, content_words, nonwords, phrase_uptake, repeated_trigram,
                                    well_formedness)

VOCAB = frozenset("a an as up stupid computer dog dogs running next to one and sliced on pan the grass in love "
                  "man riding horse beach happily".split())
BROKEN = {
    "a keyain as a keyain up a stupid computer": "nonword:keyain",
    "ug dog running next to running next to running next": "nonword:ug",
    "one wed and sliced on a pan on a pan": "nonword:wed",
    "a dog running next to running next to the grass": "repeated_trigram",
    "": "empty",
}


def test_well_formedness_names_what_is_broken():
    for caption, reason in BROKEN.items():
        assert well_formedness(caption, VOCAB) == reason, caption
    assert well_formedness("a dog in love running on the grass", VOCAB) is None
    # words of the candidate's own input are known even when the corpus vocabulary lacks them
    assert well_formedness("a zebra in love", VOCAB, also_known=["zebra"]) is None
    assert nonwords("a zebra , in love !", VOCAB) == ["zebra"]  # punctuation is not a word
    assert repeated_trigram("on a pan on a pan") and not repeated_trigram("on a pan in a pan")


def test_content_recall_and_phrase_uptake():
    factual = "a man riding a horse on the beach"
    assert content_words(factual) == ["man", "riding", "horse", "beach"]
    assert content_recall(factual, "a man happily riding a horse on the beach") == 1.0
    assert content_recall(factual, "a man on the beach") == 0.5
    assert phrase_uptake("happily in love", "a man happily riding a horse") == 0.5
    assert phrase_uptake("in the", "anything") is None  # no content word to take up


def test_planted_broken_captions_fail_the_new_filters_that_the_paper_filters_pass():
    rows = pd.DataFrame({
        "generated_caption": list(BROKEN)[:3] + ["a dog in love running on the grass", "a stupid computer"],
        "target_style": "romantic", "predicted_style": "romantic", "perplexity": 20.0, "similarity": 0.8,
        "content_similarity": [0.7, 0.7, 0.7, 0.9, 0.2],
    })
    rows["well_formed_reason"] = [well_formedness(c, VOCAB) for c in rows["generated_caption"]]
    paper_only = apply_filters(rows, ppl_max=80, min_similarity=0.6, min_content_similarity=None, well_formed=False,
                               max_relatedness_drop=None)
    assert paper_only["passed"].all()  # the paper's three filters let every planted caption through
    out = apply_filters(rows, ppl_max=80, min_similarity=0.6, min_content_similarity=0.6, well_formed=True,
                        max_relatedness_drop=None)
    assert out["passed"].tolist() == [False, False, False, True, False]
    assert out["reject_reason"].tolist()[:3] == ["well_formed:nonword:keyain", "well_formed:nonword:ug",
                                                 "well_formed:nonword:wed"]
    assert out["reject_reason"].iloc[4] == "content"
    rates = pass_rates(out, by=None).iloc[0]
    assert rates["pass_rate_well_formed"] == pytest.approx(0.4) and rates["pass_rate_content"] == pytest.approx(0.8)
    with pytest.raises(ValueError, match="content filter needs it"):
        apply_filters(rows.drop(columns="content_similarity"), 80, 0.6, min_content_similarity=0.6, well_formed=False,
                      max_relatedness_drop=None)


def test_content_similarity_separates_a_merge_from_an_unrelated_caption():
    from models.encoders import SentenceEncoder
    from udfs.generation import content_similarity

    encoder = SentenceEncoder("all-MiniLM-L6-v2", "cpu")
    factual = ["a man riding a horse on the beach"] * 2
    sims = content_similarity(encoder, ["a man in love riding a horse on the beach", "a stupid computer on a desk"],
                              factual, batch_size=8)
    assert sims[0] > 0.8 > 0.6 > sims[1]
    # nothing generated (no style word to place): NaN, which the content filter fails; the others are still scored
    again = content_similarity(encoder, ["", "a man in love riding a horse on the beach"], factual, batch_size=8)
    assert np.isnan(again[0]) and again[1] == pytest.approx(sims[0], abs=1e-5)
