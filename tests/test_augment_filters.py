"""Tests of the Generate step's three filters (style, perplexity, similarity) and their pass rates."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest

from models.augment_filters import PAPER_MIN_SIMILARITY, PAPER_PPL_MAX, apply_filters, pass_rates

#: the paper's three filters only (apply_filters takes the beyond-the-paper ones explicitly; generate passes its conf's)
PAPER_ONLY = dict(min_content_similarity=None, well_formed=False, max_relatedness_drop=None)


def every_combination() -> pd.DataFrame:
    """One row per (style ok, perplexity ok, similarity ok) combination, for both target styles."""
    rows = []
    for target in ("humor", "romantic"):
        other = "romantic" if target == "humor" else "humor"
        for style_ok, ppl_ok, sim_ok in itertools.product([True, False], repeat=3):
            rows.append({
                "target_style": target,
                "predicted_style": target if style_ok else other,
                "perplexity": 42.0 if ppl_ok else 80.0,  # 80 itself fails: ppl must be < ppl_max
                "similarity": 0.61 if sim_ok else 0.6,  # 0.6 itself fails: similarity must be > min_similarity
                "expect": (style_ok, ppl_ok, sim_ok),
            })
    return pd.DataFrame(rows)


def test_every_combination_of_pass_and_fail():
    out = apply_filters(every_combination(), ppl_max=PAPER_PPL_MAX, min_similarity=PAPER_MIN_SIMILARITY, **PAPER_ONLY)
    assert len(out) == 16
    for _, row in out.iterrows():
        style_ok, ppl_ok, sim_ok = row["expect"]
        assert (row["passed_style"], row["passed_perplexity"], row["passed_similarity"]) == (style_ok, ppl_ok, sim_ok)
        assert row["passed"] == (style_ok and ppl_ok and sim_ok)
        failed = [name for name, ok in zip(("style", "perplexity", "similarity"), row["expect"]) if not ok]
        assert row["reject_reason"] == (",".join(failed) if failed else None)
    assert out["passed"].sum() == 2
    assert set(out["reject_reason"].dropna()) >= {"style,perplexity,similarity", "style,perplexity", "similarity"}
    assert all(out[c].dtype == bool for c in ("passed_style", "passed_perplexity", "passed_similarity", "passed"))


def test_missing_values_fail_with_a_reason():
    df = pd.DataFrame({
        "target_style": ["humor", "humor", "humor", None],
        "predicted_style": ["humor", None, "humor", "humor"],
        "perplexity": [np.nan, 10.0, 10.0, 10.0],
        "similarity": [0.9, 0.9, None, 0.9],
    })
    out = apply_filters(df, ppl_max=80, min_similarity=0.6, **PAPER_ONLY)
    assert out["reject_reason"].tolist() == ["perplexity", "style", "similarity", "style"]
    assert not out["passed"].any()


def test_input_frame_is_not_modified_and_index_is_kept():
    df = every_combination().set_index(pd.Index(range(100, 116)))
    before = df.copy()
    out = apply_filters(df, ppl_max=50, min_similarity=0.5, **PAPER_ONLY)
    pd.testing.assert_frame_equal(df, before)
    assert out.index.tolist() == list(range(100, 116))
    # Looser similarity, tighter perplexity: 0.6 now passes, 42 still passes, 80 still fails.
    assert out["passed_similarity"].all() and out["passed"].sum() == 4


def test_thresholds_are_applied_as_passed_in():
    df = pd.DataFrame({"target_style": ["humor"] * 3, "predicted_style": ["humor"] * 3,
                       "perplexity": [30.0, 60.0, 90.0], "similarity": [0.7] * 3})
    assert apply_filters(df, ppl_max=50, min_similarity=0.6, **PAPER_ONLY)["passed"].tolist() == [True, False, False]
    assert apply_filters(df, ppl_max=100, min_similarity=0.6, **PAPER_ONLY)["passed"].tolist() == [True, True, True]
    assert apply_filters(df, ppl_max=100, min_similarity=0.7, **PAPER_ONLY)["passed"].tolist() == [False, False, False]


def test_pass_rates_per_style_and_overall():
    df = every_combination()
    df.loc[df["target_style"] == "romantic", "perplexity"] = 1.0  # every romantic row passes perplexity
    out = apply_filters(df, ppl_max=80, min_similarity=0.6, **PAPER_ONLY)
    rates = pass_rates(out)
    assert rates["target_style"].tolist() == ["humor", "romantic"]
    assert rates["n"].tolist() == [8, 8]
    assert rates["pass_rate_style"].tolist() == [0.5, 0.5]
    assert rates["pass_rate_perplexity"].tolist() == [0.5, 1.0]
    assert rates["pass_rate_similarity"].tolist() == [0.5, 0.5]
    assert rates["pass_rate"].tolist() == [0.125, 0.25]
    overall = pass_rates(out, by=None)
    assert len(overall) == 1 and overall.loc[0, "n"] == 16
    assert overall.loc[0, "pass_rate"] == pytest.approx(3 / 16)
    assert overall.loc[0, "pass_rate_perplexity"] == pytest.approx(0.75)


def test_empty_frame():
    df = every_combination().iloc[:0]
    out = apply_filters(df, ppl_max=80, min_similarity=0.6, **PAPER_ONLY)
    assert len(out) == 0 and "reject_reason" in out.columns
    assert len(pass_rates(out)) == 0


def test_bad_input_is_rejected():
    df = every_combination()
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['similarity'\]"):
        apply_filters(df.drop(columns="similarity"), ppl_max=80, min_similarity=0.6, **PAPER_ONLY)
    with pytest.raises(ValueError, match="ppl_max must be a finite number"):
        apply_filters(df, ppl_max=math.inf, min_similarity=0.6, **PAPER_ONLY)
    with pytest.raises(ValueError, match="min_similarity must be a finite number"):
        apply_filters(df, ppl_max=80, min_similarity="0.6", **PAPER_ONLY)
    with pytest.raises(ValueError, match="'perplexity' must be numeric"):
        apply_filters(df.assign(perplexity="low"), ppl_max=80, min_similarity=0.6, **PAPER_ONLY)
    with pytest.raises(ValueError, match="run apply_filters first"):
        pass_rates(df)
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['scene'\]"):
        pass_rates(apply_filters(df, ppl_max=80, min_similarity=0.6, **PAPER_ONLY), by=["scene"])


def test_visual_filter_margin_and_rows_without_visual_context():
    df = pd.DataFrame({
        "target_style": ["humor"] * 5, "predicted_style": ["humor"] * 5, "perplexity": [10.0] * 5,
        "similarity": [0.9] * 5,
        "factual_relatedness": [0.80, 0.80, 0.80, np.nan, 0.70],
        "generated_relatedness": [0.66, 0.64, 0.95, 0.10, np.nan],
    })
    out = apply_filters(df, ppl_max=80, min_similarity=0.6, max_relatedness_drop=0.15, min_content_similarity=None,
                        well_formed=False)
    # 0.14 below: passes; 0.16 below: drift; higher: passes; no visual context: passes; no generated score: fails
    assert out["passed_visual"].tolist() == [True, False, True, True, False]
    assert out["reject_reason"].tolist() == [None, "visual", None, None, "visual"]
    off = apply_filters(df, ppl_max=80, min_similarity=0.6, **PAPER_ONLY)
    assert off["passed_visual"].all() and off["passed"].all()
    rates = pass_rates(out, by=None)
    assert rates["pass_rate_visual"].iloc[0] == pytest.approx(0.6)
    with pytest.raises(ValueError, match="the visual filter needs them"):
        apply_filters(df.drop(columns="generated_relatedness"), ppl_max=80, min_similarity=0.6,
                      max_relatedness_drop=0.1, min_content_similarity=None, well_formed=False)
    with pytest.raises(ValueError, match="max_relatedness_drop must be a finite number"):
        apply_filters(df, ppl_max=80, min_similarity=0.6, max_relatedness_drop=float("nan"),
                      min_content_similarity=None, well_formed=False)


def test_fluency_filter_keeps_captions_at_or_above_the_threshold():
    frame = pd.DataFrame({"target_style": ["humor"] * 4, "predicted_style": ["humor"] * 4,
                          "perplexity": [10.0] * 4, "similarity": [0.9] * 4, "fluency": [0.9, 0.5, 0.49, np.nan]})
    out = apply_filters(frame, ppl_max=80, min_similarity=0.6, min_fluency=0.5, **PAPER_ONLY)
    assert out["passed_fluent"].tolist() == [True, True, False, False]  # a missing score fails
    assert out["reject_reason"].tolist() == [None, None, "fluent", "fluent"]
    assert apply_filters(frame, ppl_max=80, min_similarity=0.6, **PAPER_ONLY)["passed"].all()  # off: every row passes
    with pytest.raises(ValueError, match="fluency filter needs it"):
        apply_filters(frame.drop(columns=["fluency"]), ppl_max=80, min_similarity=0.6, min_fluency=0.5, **PAPER_ONLY)
