"""Caption metrics through the real pycocoevalcap 1.2 (Java PTBTokenizer and METEOR 1.5): BLEU against a hand
count and an independent corpus-BLEU formula, perfect matches, CIDEr reruns, bad input, and no leaked Java process;
and the paper's Table 2 built from per-style metrics (rows style x run, delta = augmented - original).
"""
from __future__ import annotations

import math
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from models.caption_metrics import ALL_METRICS, CAPTION_METRICS, CaptionScorer, corpus_scores
from models.paper_table import TABLE2_METRICS, build_table2, render_html, render_markdown

BLEU = ("BLEU-1", "BLEU-3")
CORPUS_REFS = {
    "img1": ["a dog runs on grass", "the dog is running"],
    "img2": ["a man rides a red bike"],
    "img3": ["two cats sleep", "cats sleeping on a sofa"],
    "img4": ["a bowl of fruit on a table", "fruit in a white bowl"],
}
CORPUS_HYPS = {"img1": "a dog runs on the grass", "img2": "a man rides a bike", "img3": "two cats sleep on a sofa",
               "img4": "a white bowl of apples"}


def independent_bleu(references: dict[str, list[str]], hypotheses: dict[str, str], n: int) -> float:
    """Corpus BLEU-n (Papineni et al.): clipped n-gram precision summed over the corpus, geometric mean, brevity
    penalty against the closest reference length (the shorter one on ties), as the COCO evaluation computes it."""
    matched, total = [0] * n, [0] * n
    hyp_len = ref_len = 0
    for key, hyp in hypotheses.items():
        words, refs = hyp.split(), [r.split() for r in references[key]]
        hyp_len += len(words)
        ref_len += min((abs(len(r) - len(words)), len(r)) for r in refs)[1]
        for k in range(1, n + 1):
            grams = Counter(tuple(words[i:i + k]) for i in range(len(words) - k + 1))
            best: Counter = Counter()
            for ref in refs:
                best |= Counter(tuple(ref[i:i + k]) for i in range(len(ref) - k + 1))
            matched[k - 1] += sum(min(c, best[g]) for g, c in grams.items())
            total[k - 1] += sum(grams.values())
    precision = math.exp(sum(math.log(m / t) for m, t in zip(matched, total)) / n)
    return precision * (1.0 if hyp_len >= ref_len else math.exp(1 - ref_len / hyp_len))


def java_children() -> list[int]:
    """Java processes whose parent is this test process, other than a Spark gateway JVM other tests started."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat, cmdline = (entry / "stat").read_text(), (entry / "cmdline").read_bytes()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == os.getpid() and b"java" in cmdline and b"SparkSubmit" not in cmdline:
            found.append(int(entry.name))
    return found


def test_bleu_of_one_caption_equals_the_hand_count() -> None:
    scores = corpus_scores({1: ["a dog runs on grass"]}, {1: "a dog runs on the grass"}, metrics=BLEU)
    # unigrams 5/6 match, bigrams 3/5, trigrams 2/4; the hypothesis is longer, so no brevity penalty
    assert scores["BLEU-1"] == pytest.approx(5 / 6, rel=1e-6)
    assert scores["BLEU-3"] == pytest.approx((5 / 6 * 3 / 5 * 2 / 4) ** (1 / 3), rel=1e-6)


def test_corpus_bleu_equals_an_independent_formula() -> None:
    scores = corpus_scores(CORPUS_REFS, CORPUS_HYPS, metrics=BLEU)
    assert scores["BLEU-1"] == pytest.approx(independent_bleu(CORPUS_REFS, CORPUS_HYPS, 1), rel=1e-6)
    assert scores["BLEU-3"] == pytest.approx(independent_bleu(CORPUS_REFS, CORPUS_HYPS, 3), rel=1e-6)
    assert 0.5 < scores["BLEU-3"] < scores["BLEU-1"] < 0.99


def test_bleu_2_and_4_on_request_equal_the_independent_formula() -> None:
    scores = corpus_scores(CORPUS_REFS, CORPUS_HYPS, metrics=("BLEU-4", "BLEU-2"))
    assert list(scores) == ["BLEU-4", "BLEU-2"]
    for n in (2, 4):
        assert scores[f"BLEU-{n}"] == pytest.approx(independent_bleu(CORPUS_REFS, CORPUS_HYPS, n), rel=1e-6)
    assert 0.3 < scores["BLEU-4"] < scores["BLEU-2"] < 0.99
    assert set(ALL_METRICS) > set(CAPTION_METRICS)


def test_perfect_matches_score_bleu_one_and_meteor_closes_its_java_process() -> None:
    perfect = {k: refs[0] for k, refs in CORPUS_REFS.items()}
    assert java_children() == []
    with CaptionScorer() as scorer:
        scores = scorer.score(CORPUS_REFS, perfect)
        assert len(java_children()) == 1  # one METEOR process, reused for the next corpus
        imperfect = scorer.score(CORPUS_REFS, CORPUS_HYPS)
    assert java_children() == []
    assert list(scores) == list(CAPTION_METRICS)
    assert scores["BLEU-1"] == pytest.approx(1.0, abs=1e-6)
    assert scores["BLEU-3"] == pytest.approx(1.0, abs=1e-6)
    assert 0.0 < imperfect["METEOR"] < scores["METEOR"] <= 1.0
    assert 1.0 < imperfect["CIDEr"] < scores["CIDEr"]
    cider_only = corpus_scores(CORPUS_REFS, CORPUS_HYPS, metrics=("CIDEr",))
    assert cider_only == {"CIDEr": imperfect["CIDEr"]}  # reruns agree
    assert java_children() == []


def test_punctuation_case_and_stray_line_breaks_do_not_shift_captions() -> None:
    messy = {"img1": "A dog runs\ron the grass.", "img2": "a man rides\u2028a BIKE!",
             "img3": "two cats sleep on a sofa",
             "img4": "a white bowl of apples"}
    assert corpus_scores(CORPUS_REFS, messy, metrics=BLEU) == corpus_scores(CORPUS_REFS, CORPUS_HYPS, metrics=BLEU)


def test_an_empty_hypothesis_scores_zero_for_its_image() -> None:
    with_empty = {**CORPUS_HYPS, "img4": ""}
    scores = corpus_scores(CORPUS_REFS, with_empty, metrics=BLEU)
    without = {k: v for k, v in CORPUS_HYPS.items() if k != "img4"}
    refs_without = {k: v for k, v in CORPUS_REFS.items() if k != "img4"}
    # the empty caption adds no n-grams, only reference length (brevity penalty)
    assert scores["BLEU-1"] == pytest.approx(independent_bleu(CORPUS_REFS, with_empty, 1), rel=1e-6)
    assert scores["BLEU-1"] < corpus_scores(refs_without, without, metrics=BLEU)["BLEU-1"]


def test_bad_input_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="no hypotheses"):
        corpus_scores(CORPUS_REFS, {})
    with pytest.raises(ValueError, match="same ids: 1 hypothesis ids have no references.*'img9'.*3 reference ids"):
        corpus_scores(CORPUS_REFS, {"img1": "a dog", "img9": "a cat"})
    with pytest.raises(ValueError, match="id 'img1' has no non-empty reference"):
        corpus_scores({"img1": ["", "  "]}, {"img1": "a dog"})
    with pytest.raises(ValueError, match="must be a list of caption strings"):
        corpus_scores({"img1": "a dog"}, {"img1": "a dog"})
    with pytest.raises(ValueError, match="must be one caption string"):
        corpus_scores({"img1": ["a dog"]}, {"img1": ["a dog"]})
    with pytest.raises(ValueError, match="subset of"):
        corpus_scores({"img1": ["a dog"]}, {"img1": "a dog"}, metrics=("SPICE",))
    assert java_children() == []

ORIGINAL = {
    "humor": {"BLEU-1": 0.210, "BLEU-3": 0.040, "METEOR": 0.070, "CIDEr": 0.230, "cls.": 0.560, "ppl.": 28.4},
    "romantic": {"BLEU-1": 0.200, "BLEU-3": 0.038, "METEOR": 0.071, "CIDEr": 0.210, "cls.": 0.610, "ppl.": 25.0},
}
AUGMENTED = {
    "humor": {"BLEU-1": 0.235, "BLEU-3": 0.052, "METEOR": 0.078, "CIDEr": 0.281, "cls.": 0.702, "ppl.": 22.1},
    "romantic": {"BLEU-1": 0.190, "BLEU-3": 0.041, "METEOR": 0.075, "CIDEr": 0.250, "cls.": 0.655, "ppl.": 26.5},
}


def test_table2_rows_columns_and_deltas() -> None:
    table = build_table2(ORIGINAL, AUGMENTED)
    assert list(table.columns) == list(TABLE2_METRICS)
    assert list(table.index) == [("humor", "original"), ("humor", "augmented"), ("humor", "delta"),
                                 ("romantic", "original"), ("romantic", "augmented"), ("romantic", "delta")]
    for style in ORIGINAL:
        for metric in TABLE2_METRICS:
            assert table.loc[(style, "original"), metric] == ORIGINAL[style][metric]
            assert table.loc[(style, "augmented"), metric] == AUGMENTED[style][metric]
            assert table.loc[(style, "delta"), metric] == pytest.approx(
                AUGMENTED[style][metric] - ORIGINAL[style][metric])
    assert table.loc[("romantic", "delta"), "BLEU-1"] == pytest.approx(-0.010)
    assert table.loc[("humor", "delta"), "ppl."] == pytest.approx(-6.3)


def test_table2_a_subset_of_metrics_keeps_the_paper_order_and_nan_propagates() -> None:
    original = {"positive": {"CIDEr": np.float32(0.5), "BLEU-1": 0.4, "cls.": float("nan")}}
    augmented = {"positive": {"cls.": 0.9, "BLEU-1": 0.45, "CIDEr": 0.62}}
    table = build_table2(original, augmented)
    assert list(table.columns) == ["BLEU-1", "CIDEr", "cls."]
    assert math.isnan(table.loc[("positive", "delta"), "cls."])
    assert table.loc[("positive", "delta"), "CIDEr"] == pytest.approx(0.12)


def test_table2_markdown_and_html_rendering() -> None:
    table = build_table2(ORIGINAL, AUGMENTED)
    markdown = render_markdown(table)
    lines = markdown.strip().split("\n")
    assert lines[0] == "| style | run | BLEU-1 | BLEU-3 | METEOR | CIDEr | cls. | ppl. |"
    assert len(lines) == 2 + 6
    assert lines[2] == "| humor | original | 21.0 | 4.0 | 7.0 | 23.0 | 56.0 | 28.4 |"
    assert lines[4] == "| humor | delta | +2.5 | +1.2 | +0.8 | +5.1 | +14.2 | -6.3 |"
    assert "| romantic | delta | -1.0 |" in markdown
    raw = render_markdown(table, percent=False, digits=3)
    assert "| humor | original | 0.210 | 0.040 | 0.070 | 0.230 | 0.560 | 28.400 |" in raw
    html = render_html(table)
    assert html.startswith("<table") and html.count("<td>") == 6 * len(TABLE2_METRICS)
    assert "<td>+14.2</td>" in html and '<th rowspan="3" valign="top">romantic</th>' in html


def test_table2_mismatched_runs_are_refused() -> None:
    with pytest.raises(ValueError, match="different styles"):
        build_table2(ORIGINAL, {"humor": AUGMENTED["humor"]})
    with pytest.raises(ValueError, match="style 'humor': original has metrics"):
        build_table2({"humor": {"BLEU-1": 0.2}}, {"humor": {"BLEU-1": 0.2, "CIDEr": 0.3}})
    with pytest.raises(ValueError, match=r"unknown metrics \['ROUGE-L'\]"):
        build_table2({"humor": {"ROUGE-L": 0.2}}, {"humor": {"ROUGE-L": 0.3}})
    with pytest.raises(ValueError, match="must be a finite number"):
        build_table2({"humor": {"BLEU-1": "0.2"}}, {"humor": {"BLEU-1": 0.3}})
    with pytest.raises(ValueError, match="no styles"):
        build_table2({}, {})
