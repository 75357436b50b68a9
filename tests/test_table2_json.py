"""``table2.json`` carries what ``table2.md`` prints over the seeds (issue #33), without Spark: the seeds, each delta's
95% t-interval and each variant's mean ± sd, plus Fig. 5's size curve and the ablations or the reason they are null."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from benchmarks.table2 import write_results
from jobs.experiment import seed_summary
from models.experiment_report import render_fig5, size_curve

# style -> per seed (cider original, cider augmented, cls original, cls augmented)
SEEDED = {"humor": [(0.20, 0.24, 0.40, 0.52), (0.22, 0.25, 0.42, 0.55), (0.18, 0.23, 0.38, 0.50)],
          "romantic": [(0.30, 0.33, 0.60, 0.58), (0.31, 0.30, 0.62, 0.66), (0.29, 0.33, 0.61, 0.63)]}


def cell(style: str, variant: str, seed: int, cider: float, cls: float) -> dict:
    return {"style": style, "captioner": "nic", "variant": variant, "seed": seed, "run_id": f"{variant}{seed}",
            "bleu1": 0.5, "bleu3": 0.2, "meteor": 0.1, "cider": cider, "cls": cls, "cls_independent": cls / 2,
            "ppl": 40.0 + seed, "train_pairs": 100 if variant == "original" else 150}


def result_of(seed_rows: list[dict], **more) -> dict:
    """The result as ``erg experiment`` hands it to the writer (:func:`jobs.experiment.seed_summary`)."""
    rows, deltas = seed_summary(seed_rows)
    return {"command": "erg experiment --conf test", "run_id": "r1", "rows": rows, "deltas": deltas,
            "seed_rows": seed_rows, "seeds": sorted({r["seed"] for r in seed_rows}),
            "interval": "95% t-interval over the seeds of the paired (same seed) deltas", "leakage": {},
            "not_measured": {}, **more}


def md_row(md: str, style: str, variant: str) -> list[str]:
    (line,) = [line for line in md.splitlines() if line.startswith(f"| {style} | nic | {variant} |")]
    return [c.strip() for c in line.strip("|").split("|")]


def test_table2_json_has_the_seeds_and_the_intervals_the_markdown_prints(tmp_path: Path) -> None:
    seed_rows = [cell(style, variant, seed, cider, cls)
                 for style, values in SEEDED.items() for seed, (c0, c1, k0, k1) in zip([23, 24, 25], values)
                 for variant, cider, cls in (("original", c0, k0), ("augmented", c1, k1))]
    write_results(result_of(seed_rows), tmp_path)
    data = json.loads((tmp_path / "table2.json").read_text())
    md = (tmp_path / "table2.md").read_text()

    assert data["seeds"] == [23, 24, 25]
    assert [(e["style"], e["captioner"], e["seeds"]) for e in data["ci95"]] == [
        ("humor", "nic", [23, 24, 25]), ("romantic", "nic", [23, 24, 25])]
    # humor's paired delta cls. per seed: 12, 13, 12 points; mean 12.333, sd 0.57735, t(2) = 4.303
    cls = data["ci95"][0]["deltas"]["delta_cls"]
    assert cls["per_seed"] == pytest.approx([12.0, 13.0, 12.0])
    half = 4.303 * math.sqrt(1 / 3) / math.sqrt(3)
    assert (cls["mean"], cls["low"], cls["high"]) == pytest.approx((37 / 3, 37 / 3 - half, 37 / 3 + half))
    assert cls["n"] == 3 and cls["excludes_zero"] is True
    assert data["interval"].startswith("95% t-interval")

    # every interval in the json is the one the markdown prints, to its 0.1
    columns = {"delta_cider_percent": -3, "delta_cls": -2, "delta_cls_independent": -1}
    for entry in data["ci95"]:
        printed = md_row(md, entry["style"], "augmented")
        for key, column in columns.items():
            i = entry["deltas"][key]
            assert printed[column] == (f"{i['mean']:+.1f} [{i['low']:+.1f}, {i['high']:+.1f}]"
                                       + ("*" if i["excludes_zero"] else ""))
        # and each variant's mean ± sd (C and cls. x 100, ppl. as is)
        for variant, metrics in entry["metrics"].items():
            assert metrics["seeds"] == [23, 24, 25]
            printed = md_row(md, entry["style"], variant)
            assert printed[6] == f"{metrics['cider']['mean'] * 100:.1f} ± {metrics['cider']['sd'] * 100:.1f}"
            assert printed[7] == f"{metrics['cls']['mean'] * 100:.1f} ± {metrics['cls']['sd'] * 100:.1f}"
            assert printed[9] == f"{metrics['ppl']['mean']:.1f} ± {metrics['ppl']['sd']:.1f}"
    humor = data["ci95"][0]["metrics"]["augmented"]["cider"]
    assert humor["per_seed"] == [0.24, 0.25, 0.23] and humor["sd"] == pytest.approx(0.01)
    assert md_row(md, "humor", "augmented")[6] == "24.0 ± 1.0"
    assert re.search(r"\| \+12\.3 \[\+10\.9, \+13\.8\]\* \|", md)
    # romantic's delta cls. (-2, +4, +2) straddles 0: no star in the markdown, excludes_zero false in the json
    assert data["ci95"][1]["deltas"]["delta_cls"]["excludes_zero"] is False

    # the parts of the report this experiment did not measure are null with their reason, never absent
    assert data["fig5_size"] is None and data["ablations"] is None
    assert set(data["why_null"]) == {"fig5_size", "ablations"}
    assert all(data["why_null"].values())


def test_one_seed_gives_null_intervals_with_a_reason_and_fig5_is_carried(tmp_path: Path) -> None:
    seed_rows = [cell("humor", "original", 23, 0.20, 0.40), cell("humor", "augmented", 23, 0.25, 0.55),
                 {**cell("humor", "augmented@0.5", 23, 0.22, 0.50), "train_pairs": 125}]
    rows, _ = seed_summary(seed_rows)
    points = size_curve(rows, "nic", ["humor"])
    result = result_of(seed_rows, fig5={"captioner": "nic", "styles": ["humor"], "points": points,
                                        "markdown": render_fig5(points)})
    write_results(result, tmp_path)
    data = json.loads((tmp_path / "table2.json").read_text())
    md = (tmp_path / "table2.md").read_text()

    assert data["seeds"] == [23]
    assert data["ci95"] is None and "without an interval" in data["why_null"]["ci95"]
    assert md_row(md, "humor", "augmented")[-2] == "+15.0"  # the delta of the means, no interval
    assert data["fig5_size"] == {"captioner": "nic", "styles": ["humor"], "points": points}
    assert [p["share"] for p in data["fig5_size"]["points"]] == [0.0, 0.5, 1.0]
    assert "fig5_size" not in data["why_null"] and data["ablations"] is None and data["why_null"]["ablations"]
