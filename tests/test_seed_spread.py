"""benchmarks/seed_spread.py: where a Table 2 interval's width comes from. No Spark."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks.seed_spread import cell_spread, main


def _entry() -> dict:
    def variant(cls, ind):
        return {"seeds": [1, 2, 3], "cls": {"per_seed": cls}, "cls_independent": {"per_seed": ind}}
    return {"style": "humor", "captioner": "nic", "seeds": [1, 2, 3],
            "metrics": {"original": variant([0.8, 0.9, 0.4], [0.6, 0.5, 0.4]),
                        "augmented": variant([0.95, 0.95, 0.95], [0.5, 0.55, 0.45])}}


def test_cell_spread_splits_the_delta_variance_and_counts_the_seeds_that_rise() -> None:
    cls = cell_spread(_entry())["metrics"]["cls"]
    # the augmented runs do not move: all of the delta's variance is the original's
    assert cls["original_share_of_variance"] == pytest.approx(1.0)
    assert cls["augmented"]["sd"] == pytest.approx(0, abs=1e-9)
    assert cls["original"]["sd"] == pytest.approx(math.sqrt(0.07))  # var of 0.8, 0.9, 0.4
    assert cls["seeds_augmented_higher"] == 3 and cls["sign_test_p_one_sided"] == 0.125
    assert cls["delta_per_seed"] == pytest.approx([0.15, 0.05, 0.55])
    ind = cell_spread(_entry())["metrics"]["cls_independent"]
    assert ind["seeds_augmented_higher"] == 2 and ind["sign_test_p_one_sided"] == 0.5
    assert "cider" not in cell_spread(_entry())["metrics"]


def test_main_writes_json_and_md_beside_the_table(tmp_path: Path) -> None:
    (tmp_path / "table2.json").write_text(json.dumps({"ci95": [_entry()]}))
    assert main([str(tmp_path / "table2.json")]) == 0
    written = json.loads((tmp_path / "seed_spread.json").read_text())
    assert written["cells"][0]["metrics"]["cls"]["seeds_augmented_higher"] == 3
    assert "| humor | nic | cls | 0.800 / 0.900 / 0.400" in (tmp_path / "seed_spread.md").read_text()
    (tmp_path / "empty.json").write_text(json.dumps({"rows": []}))
    with pytest.raises(SystemExit, match="no per-seed"):
        main([str(tmp_path / "empty.json")])
