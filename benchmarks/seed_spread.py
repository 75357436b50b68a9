"""Where a Table 2 interval's width comes from: per cell, each variant's spread over the seeds, and the sign of each
seed's paired delta, for cls. (the extractor's classifier), the independent grader's cls. and CIDEr. No Spark.

A 95% t-interval over three seeds spans 0 when one seed's delta differs from the others; this says whether that
seed's original or its augmented captioner moved, and whether the independent grader (a classifier fit on half the
train images, never on ERG's phrases) agrees in sign seed by seed. Reads a ``table2.json`` rendered with seeds
(``ci95`` entries: ``benchmarks/table2.py`` on a conf with ``experiment.seeds``); writes ``seed_spread.json`` and
``seed_spread.md`` beside it::

    python benchmarks/seed_spread.py benchmarks/results/table2_volume_nic/table2.json
"""
from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from pathlib import Path
from typing import Any

METRICS = ("cls", "cls_independent", "cider")


def cell_spread(entry: dict[str, Any]) -> dict[str, Any]:
    """One ``ci95`` entry of table2.json (a style and captioner over seeds): per metric, each variant's mean, sd and
    per-seed values, the share of the delta's variance the original variant's spread makes (var_o / (var_o +
    var_a)), the seeds where augmented beats original, and the one-sided sign-test p of that count."""
    original, augmented = entry["metrics"]["original"], entry["metrics"]["augmented"]
    seeds = list(entry.get("seeds") or original.get("seeds") or [])
    out: dict[str, Any] = {"style": entry["style"], "captioner": entry["captioner"], "seeds": seeds, "metrics": {}}
    for metric in METRICS:
        if metric not in original or metric not in augmented:
            continue
        o, a = original[metric]["per_seed"], augmented[metric]["per_seed"]
        n = min(len(o), len(a))
        var_o, var_a = _var(o[:n]), _var(a[:n])
        up = sum(1 for i in range(n) if a[i] > o[i])
        out["metrics"][metric] = {
            "original": {"mean": _mean(o[:n]), "sd": math.sqrt(var_o), "per_seed": o[:n]},
            "augmented": {"mean": _mean(a[:n]), "sd": math.sqrt(var_a), "per_seed": a[:n]},
            "delta_per_seed": [a[i] - o[i] for i in range(n)],
            "original_share_of_variance": var_o / (var_o + var_a) if var_o + var_a > 0 else None,
            "seeds_augmented_higher": up, "seeds": n,
            "sign_test_p_one_sided": sum(math.comb(n, k) for k in range(up, n + 1)) / 2 ** n if n else None,
        }
    return out


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def _var(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    mean = _mean(values)
    return sum((v - mean) ** 2 for v in values) / (len(values) - 1)


def render(cells: list[dict[str, Any]], command: str) -> str:
    lines = [f"<!-- written by `{command}` -->", "",
             "| style | captioner | metric | original per seed (sd) | augmented per seed (sd) | aug. higher | "
             "sign p | original's share of var. |", "| --- | --- | --- | --- | --- | ---: | ---: | ---: |"]
    for cell in cells:
        for metric, m in cell["metrics"].items():
            share = m["original_share_of_variance"]
            lines.append(
                f"| {cell['style']} | {cell['captioner']} | {metric} | "
                f"{' / '.join(f'{v:.3f}' for v in m['original']['per_seed'])} ({m['original']['sd']:.3f}) | "
                f"{' / '.join(f'{v:.3f}' for v in m['augmented']['per_seed'])} ({m['augmented']['sd']:.3f}) | "
                f"{m['seeds_augmented_higher']} of {m['seeds']} | {m['sign_test_p_one_sided']:.3f} | "
                + ("n/a" if share is None else f"{share:.2f}") + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("table2", type=Path, help="a table2.json rendered with seeds (ci95 entries)")
    args = parser.parse_args(argv)
    data = json.loads(args.table2.read_text())
    entries = [e for e in data.get("ci95") or [] if {"original", "augmented"} <= set(e.get("metrics", {}))]
    if not entries:
        raise SystemExit(f"{args.table2} has no per-seed original/augmented cells (ci95): render it with seeds")
    command = "python benchmarks/seed_spread.py " + shlex.quote(str(args.table2))
    cells = [cell_spread(e) for e in entries]
    out = args.table2.parent
    (out / "seed_spread.json").write_text(json.dumps({"command": command, "source": str(args.table2),
                                                      "cells": cells}, indent=2) + "\n")
    (out / "seed_spread.md").write_text(render(cells, command))
    print(render(cells, command), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
