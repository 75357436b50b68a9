"""``erg experiment`` without Spark: which cells are trained (each once) and the report's tables and deltas."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from jobs.experiment import Cell, plan_cells
from models.experiment_report import (aggregate_seeds, caption_modes, cider_gain_percent, eps_curve, plot_fig5,
                                      plot_table2, render_fig5, render_fig5_eps, render_modes, render_report,
                                      render_table2, render_table5, seed_deltas, size_curve, t_interval, table2_rows)


def row(style: str, captioner: str, variant: str, cider: float, cls: float, pairs: int) -> dict:
    return {"style": style, "captioner": captioner, "variant": variant, "bleu1": 0.5, "bleu3": 0.2, "meteor": 0.1,
            "cider": cider, "cls": cls, "cls_independent": cls / 2, "ppl": 40.0, "train_pairs": pairs}


def test_cells_cover_table2_table5_fig5_and_are_trained_once() -> None:
    cells = plan_cells(["humor", "positive"], ["nic", "transformer"], ("nic", ["humor"], ["i2t", "t2t"]),
                       ("nic", ["humor"], [0.0, 0.25, 1.0]))
    names = [c.name for c in cells]
    assert len(names) == len(set(names)) == 8 + 2 + 1
    assert names[:4] == ["humor/nic/original", "humor/nic/augmented", "humor/transformer/original",
                         "humor/transformer/augmented"]
    assert names[-3:] == ["humor/nic/augmented:i2t", "humor/nic/augmented:t2t", "humor/nic/augmented@0.25"]
    assert Cell("humor", "nic", "augmented@0.25", None, 0.25).fraction == 0.25
    # a single retrieval type alone would be "all types" again: no extra cell
    assert len(plan_cells(["humor"], ["nic"], ("nic", ["humor"], ["t2t"]), None)) == 2


def test_every_cell_is_planned_once_per_seed() -> None:
    cells = plan_cells(["humor"], ["nic"], None, ("nic", ["humor"], [0.0, 0.5, 1.0]), [23, 24, 25])
    assert len(cells) == 3 * 3 and len({c.key for c in cells}) == 9
    assert {c.seed for c in cells if c.name == "humor/nic/augmented@0.5"} == {23, 24, 25}
    assert cells[0].label == "humor/nic/original#seed=23"
    mixed = plan_cells(["humor"], ["nic", "updown"], None, None, [23, 24, 25], {"updown": 1})
    assert [(c.captioner, c.seed) for c in mixed if c.variant == "augmented"] == [
        ("nic", 23), ("nic", 24), ("nic", 25), ("updown", 23)]


def test_seeds_give_mean_sd_and_a_paired_t_interval_per_delta() -> None:
    seeded = []
    for seed, (c0, c1, k0, k1) in zip([23, 24, 25], [(0.20, 0.24, 0.40, 0.52), (0.22, 0.25, 0.42, 0.55),
                                                    (0.18, 0.23, 0.38, 0.50)]):
        seeded += [{**row("humor", "nic", "original", c0, k0, 100), "seed": seed, "run_id": f"o{seed}"},
                   {**row("humor", "nic", "augmented", c1, k1, 150), "seed": seed, "run_id": f"a{seed}"}]
    rows = aggregate_seeds(seeded)
    assert [r["variant"] for r in rows] == ["original", "augmented"]
    assert rows[1]["cider"] == pytest.approx(0.24) and rows[1]["seeds"] == [23, 24, 25]
    assert rows[1]["per_seed"]["cls"] == [0.52, 0.55, 0.50] and rows[1]["run_ids"] == ["a23", "a24", "a25"]
    assert rows[1]["sd"]["cls"] == pytest.approx(0.025166, abs=1e-5)
    (delta,) = seed_deltas(seeded)
    assert delta["per_seed"]["delta_cls"] == pytest.approx([12.0, 13.0, 12.0])
    cls = delta["ci95"]["delta_cls"]
    # mean 12.333, sd 0.57735, t(2) = 4.303: half width 1.434
    assert cls["mean"] == pytest.approx(12.3333, abs=1e-3) and cls["high"] - cls["mean"] == pytest.approx(1.4343,
                                                                                                          abs=1e-3)
    assert cls["excludes_zero"] and cls["n"] == 3
    assert t_interval([1.0]) is None and not t_interval([-1.0, 1.0, 0.5])["excludes_zero"]
    rows[1]["ci95"] = delta["ci95"]
    text = render_table2(rows)
    assert "| 24.0 ± 1.0 |" in text and "+12.3 [+10.9, +13.8]*" in text and "Seeds per cell: nic 3" in text


def test_table2_deltas_are_relative_cider_and_cls_points() -> None:
    rows = [row("humor", "nic", "original", 0.20, 0.40, 100), row("humor", "nic", "augmented", 0.25, 0.55, 150),
            row("humor", "nic", "augmented@0.5", 0.22, 0.50, 125)]
    table = table2_rows(rows)
    assert [r["variant"] for r in table] == ["original", "augmented"]
    assert table[1]["delta_cider_percent"] == pytest.approx(25.0)
    assert table[1]["delta_cls"] == pytest.approx(15.0) and table[1]["delta_cls_independent"] == pytest.approx(7.5)
    assert math.isnan(cider_gain_percent(0.0, 0.3))
    text = render_table2(rows)
    assert "| humor | nic | augmented | 50.0 | 20.0 | 10.0 | 25.0 | 55.0 | 27.5 | 40.0 | 150 | +25.0 | +15.0 | +7.5 |" in text
    points = size_curve(rows, "nic", ["humor"])
    assert [(p["share"], p["train_pairs"]) for p in points] == [(0.0, 100), (0.5, 125), (1.0, 150)]
    assert "| humor | 50% | 125 | 22.0 | 50.0 | 25.0 |" in render_fig5(points)
    assert "| humor | none (original) |" in render_table5(rows, "nic", ["humor"])


def test_eps_curve_takes_the_main_augmented_cell_at_extract_eps_and_each_sweep_cell(tmp_path: Path) -> None:
    rows = [row("humor", "nic", "original", 0.20, 0.40, 100), row("humor", "nic", "augmented", 0.25, 0.55, 150),
            row("humor", "nic", "augmented@0.5", 0.22, 0.50, 125),
            {**row("humor", "nic", "augmented@eps=0.5", 0.23, 0.60, 140), "eps": 0.5, "train_pairs_augmented": 40},
            {**row("humor", "nic", "augmented@eps=0.05", 0.21, 0.45, 130), "eps": 0.05, "train_pairs_augmented": 30}]
    rows[1]["train_pairs_augmented"] = 50
    points = eps_curve(rows, "nic", ["humor"], 0.25)
    assert [(p["eps"], p["augmented_pairs"], p["cls"]) for p in points] == [(0.05, 30, 0.45), (0.25, 50, 0.55),
                                                                            (0.5, 40, 0.60)]
    assert all(p["original_cls"] == 0.40 for p in points)
    assert "| humor | 0.05 | 30 | 21.0 | 45.0 | 22.5 | 20.0 | 40.0 |" in render_fig5_eps(points)
    # the sweep's cells are not points of the size curve, nor Table 2 cells
    assert [p["share"] for p in size_curve(rows, "nic", ["humor"])] == [0.0, 0.5, 1.0]
    assert [r["variant"] for r in table2_rows(rows)] == ["original", "augmented"]
    assert plot_fig5(points, tmp_path / "eps.png", x="eps").read_bytes()[:4] == b"\x89PNG"
    assert Cell("humor", "nic", "augmented@eps=0.5", None, 1.0, 0.5).key != Cell("humor", "nic", "augmented",
                                                                                None, 1.0).key


def test_report_and_plots_are_written(tmp_path: Path) -> None:
    rows = [row("humor", "nic", "original", 0.2, 0.4, 10), row("humor", "nic", "augmented", 0.3, 0.5, 20)]
    report = render_report({"rows": rows, "leakage": {"test_images_in_training": 0},
                            "not_measured": {"positive": "no scene features"}, "command": "erg experiment"})
    assert report.startswith("# ERG experiment") and "- positive: no scene features" in report
    assert plot_table2(rows, tmp_path / "t2.png").read_bytes()[:4] == b"\x89PNG"
    assert plot_fig5(size_curve(rows, "nic", ["humor"]), tmp_path / "f5.png").stat().st_size > 1000


def test_caption_modes_count_repeated_captions_and_whether_they_carry_the_style() -> None:
    import pandas as pd

    hypotheses = pd.DataFrame({
        "variant": ["romantic/nic/augmented"] * 5 + ["romantic/nic/original"] * 2,
        "hypothesis": ["a dog runs to catch a frisbee"] * 3 + ["a man rides to show his courage"] * 2
        + ["a man on a bike , enjoying nature", "two dogs in the grass"],
        "style_probability": [0.1, 0.2, 0.1, 0.9, 0.95, 0.96, 0.3]})
    modes = {m["variant"]: m for m in caption_modes(hypotheses, top=1)}
    augmented = modes["augmented"]
    assert (augmented["style"], augmented["captioner"], augmented["captions"], augmented["distinct"]) == (
        "romantic", "nic", 5, 2)
    assert augmented["top"] == [{"caption": "a dog runs to catch a frisbee", "count": 3, "styled": False}]
    assert modes["original"]["distinct"] == 2 and len(modes["original"]["top"]) == 1
    table = render_modes(list(modes.values()))
    assert "| romantic | nic | augmented | 2 / 5 | a dog runs to catch a frisbee (3, factual) |" in table
    report = render_report({"rows": [], "modes": list(modes.values())})
    assert "## Most frequent captions" in report


def test_measurable_styles_names_why_a_style_is_left_out() -> None:
    from jobs.experiment import measurable_styles, plan_experiment
    from jobs.platform.config import load_config

    cfg = load_config("test", ["experiment.max_augmented_pairs=50", "experiment.min_test_images=10",
                               "experiment.captioners=[nic]", "experiment.table5.enabled=true",
                               "experiment.table5.style_set=flickrstyle", "experiment.fig5.enabled=false"])
    available = {("humor", "original"): 100, ("humor", "augmented"): 80, ("romantic", "original"): 100,
                 ("romantic", "augmented"): 20, ("positive", "original"): 100, ("negative", "augmented"): 5}
    counts = {"pairs.negative.original.without_features": 40.0, "test.negative.with_features": 30.0}
    tests = {"humor": 30, "romantic": 30, "positive": 30, "negative": 30}
    measured, not_measured, pool = measurable_styles(cfg, ["humor", "romantic", "positive", "negative"], counts,
                                                     available, tests, "g1")
    assert measured == ["humor", "romantic"] and pool == {"humor": 50, "romantic": 20}
    assert "0 of 40 train pairs and 30 of 30 test images" in not_measured["negative"]
    assert "no passing augmented pair of generator g1" in not_measured["positive"]
    cells, t5, f5 = plan_experiment(cfg, measured, ["i2t", "t2t"])
    assert f5 is None and t5 == ("nic", ["humor", "romantic"], ["i2t", "t2t"])
    assert [c.name for c in cells] == ([f"{s}/nic/{v}" for s in ("humor", "romantic") for v in ("original", "augmented")]
                                       + [f"{s}/nic/augmented:{t}" for s in ("humor", "romantic") for t in ("i2t", "t2t")])
    with pytest.raises(RuntimeError, match="no style can be measured"):
        measurable_styles(cfg, ["humor"], {}, {}, {"humor": 3}, "g1")


def test_perplexities_left_out_of_ppl_are_counted() -> None:
    import pandas as pd

    from jobs.evaluate import nonfinite_perplexities

    group = pd.DataFrame({"perplexity": [12.0, float("nan"), float("inf"), 30.0, None]})
    assert nonfinite_perplexities(group) == 3
    assert nonfinite_perplexities(group.iloc[[0, 3]]) == 0


def test_cell_epochs_follow_the_style_set_override() -> None:
    from jobs.cells import cell_epochs, with_captioner
    from jobs.platform.config import ConfigError, load_config

    cfg = load_config("test", ["train.epochs=3", "experiment.epochs={senticap: 7}"])
    assert [cell_epochs(cfg, s) for s in ("humor", "romantic", "positive", "negative")] == [3, 3, 7, 7]
    assert with_captioner(cfg, "nic", "positive").train.epochs == 7
    assert with_captioner(cfg, "nic").train.epochs == 3 and cfg.train.epochs == 3  # the conf itself is unchanged
    with pytest.raises(ConfigError, match="experiment.epochs names \\['senti'\\].*sets are"):
        load_config("test", ["experiment.epochs={senti: 7}"])
    with pytest.raises(ConfigError, match="experiment.epochs"):
        load_config("test", ["experiment.epochs={senticap: 0}"])


def test_table2_summary_counts_the_cells_that_moved() -> None:
    from models.experiment_report import render_summary, table2_summary

    rows = [row("humor", "nic", "original", 0.30, 0.80, 100), row("humor", "nic", "augmented", 0.33, 0.85, 120),
            row("humor", "transformer", "original", 0.40, 0.50, 100),
            row("humor", "transformer", "augmented", 0.38, 0.5004, 120),
            row("positive", "nic", "original", 0.10, 1.0, 50), row("positive", "nic", "augmented", 0.20, 0.99, 70)]
    summary = table2_summary(rows)
    assert summary == {"cells": 3, "cider_up": 2, "cls_up": 1, "cls_equal": 1, "cls_down": 1,
                       "cls_up_by_style": {"humor": ["nic"], "positive": []},
                       "cls_up_every_captioner": {"humor": False, "positive": False},
                       "cls_by_style": {"humor": {"original": pytest.approx(0.65), "augmented": pytest.approx(0.6752),
                                                  "delta": 2.5},
                                        "positive": {"original": pytest.approx(1.0), "augmented": pytest.approx(0.99),
                                                     "delta": -1.0}}}
    assert "CIDEr up in 2; cls. up in 1, equal in 1, down in 1" in render_summary(summary)
    assert "humor (nic), positive (none)" in render_summary(summary)
    assert "cls. by style (mean over its captioners): humor 65.0 -> 67.5 (+2.5); positive 100.0 -> 99.0 (-1.0)." \
        in render_summary(summary)


def _value(delta_cls: float, delta_cider: float, delta_indep: float = 0.0, eligible: bool = True) -> dict:
    return {"eligible": eligible, "delta_cls": delta_cls, "delta_cider_percent": delta_cider,
            "delta_cls_independent": delta_indep}


def test_tuning_chooses_by_the_declared_val_criterion_with_the_cider_guard() -> None:
    from jobs.tuning import choose_value

    # the highest mean val Δcls. among the values within the CIDEr guard (5%)
    assert choose_value([_value(2.0, -1.0), _value(8.0, -3.0)], "delta_cls", 5.0)[0] == 1
    # a value that buys its cls. with more than 5% of CIDEr is passed over while another value keeps it
    index, why = choose_value([_value(2.0, -1.0), _value(8.0, -12.0)], "delta_cls", 5.0)
    assert index == 0 and "at least -5%" in why
    # no value within the guard: the one that loses the least CIDEr
    index, why = choose_value([_value(9.0, -8.0), _value(2.0, -6.0), _value(5.0, -30.0)], "delta_cls", 5.0)
    assert index == 1 and "loses the least CIDEr" in why
    # a value not measured on every tuning style is never chosen; none measured: the conf's value is kept
    assert choose_value([_value(1.0, 0.0), _value(20.0, 5.0, eligible=False)], "delta_cls", 5.0)[0] == 0
    assert choose_value([_value(1.0, 0.0, eligible=False)], "delta_cls", 5.0) == (
        None, "no value was measured on every tuning style: the conf's value is kept")
    # ties: the higher ΔC %, then the value listed first
    assert choose_value([_value(4.0, 1.0), _value(4.0, 2.0)], "delta_cls", 5.0)[0] == 1
    assert choose_value([_value(4.0, 2.0), _value(4.0, 2.0)], "delta_cls", 5.0)[0] == 0
    # the independent grader's delta where the conf declares it
    assert choose_value([_value(8.0, 0.0, 1.0), _value(2.0, 0.0, 6.0)], "delta_cls_independent", 5.0)[0] == 1
    # NaN deltas (a style without cls. indep.) never win
    assert choose_value([_value(math.nan, 0.0), _value(1.0, 0.0)], "delta_cls", 5.0)[0] == 1


def test_tuning_deltas_and_report_section() -> None:
    from jobs.tuning import settings_id, style_deltas, value_summary
    from models.experiment_report import render_tuning

    humor = style_deltas({"cider": 0.40, "cls": 0.50, "cls_independent": 0.40},
                         {"cider": 0.38, "cls": 0.62, "cls_independent": 0.45})
    assert humor == pytest.approx({"delta_cls": 12.0, "delta_cls_independent": 5.0, "delta_cider_percent": -5.0})
    positive = style_deltas({"cider": 0.20, "cls": 0.90, "cls_independent": None},
                            {"cider": 0.25, "cls": 0.88, "cls_independent": None})
    means = value_summary({"humor": humor, "positive": positive})
    assert means["delta_cls"] == pytest.approx(5.0) and means["delta_cider_percent"] == pytest.approx(10.0)
    assert means["delta_cls_independent"] == pytest.approx(5.0)  # the style without it is left out of its mean
    assert settings_id({}) == "conf" and settings_id({"train.inserted_word_weight": 1}) == settings_id(
        {"train.inserted_word_weight": 1}) != settings_id({"train.inserted_word_weight": 4})
    styles = {"humor": {"original": {"cider": 0.40, "cls": 0.50}, "augmented": {"cider": 0.38, "cls": 0.62}, **humor}}
    tuning = {"split": "val", "captioner": "nic", "seed": 23, "styles": ["humor"], "val_images": {"humor": 600},
              "criterion": {"text": "the highest mean val delta of cls."},
              "knobs": [{"key": "train.inserted_word_weight", "conf_value": 4.0, "chosen": 1,
                         "why": "highest mean val delta_cls (+12.0)",
                         "results": [{"value": 1, "styles": styles, "not_measured": {}, "chosen": True, **humor},
                                     {"value": 4, "styles": {}, "not_measured": {"humor": "no val image"},
                                      "chosen": False, "delta_cls": math.nan, "delta_cider_percent": math.nan,
                                      "delta_cls_independent": math.nan}]}]}
    text = render_tuning(tuning)
    assert "chosen on the **val** split before Table 2" in text and "no test image was captioned" in text
    assert "### train.inserted_word_weight: chosen 1 (conf: 4)" in text
    assert "| 1 | -5.0% | +12.0 | +5.0 | humor C 40.0 -> 38.0, cls. 50.0 -> 62.0 | yes |" in text
    assert "| 4 | - | - | - | not measured: humor |  |" in text
    report = render_report({"rows": [], "tuning": tuning, "tuning_only": True, "next": "erg experiment"})
    assert "## Tuning on the val split" in report and "## Table 2" not in report
