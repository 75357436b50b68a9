"""The paper's Table 2 on the configured data: ``erg experiment``, written to ``benchmarks/results/table2.{json,md}``.

Runs the experiment (or reads a finished one by its MLflow run id) and writes

- ``table2.json``: ``{"rows": [{"style", "captioner", "variant", "bleu1", "bleu3", "meteor", "cider", "cls",
  "cls_independent", "ppl", "train_pairs", ...}], "leakage": {...}, "not_measured": {STYLE: REASON},
  "command": "...", "seeds": [...], "ci95": [...], "fig5_size": {...}, "ablations": {...}, "why_null": {KEY:
  REASON}, ...}`` (Table 2's cells only: variant original / augmented; every cell, Table 5's and Fig. 5's too, is in
  ``cells``). ``ci95`` holds what the markdown prints over the seeds, per style and captioner: each delta's 95%
  t-interval and each variant's mean and sd per metric (:func:`models.experiment_report.table2_seed_stats`);
  ``seeds``, ``ci95``, ``fig5_size`` and ``ablations`` are null where the experiment has none, with the reason in
  ``why_null``;
- ``table2.md``: the experiment's report (Table 2 layout with delta C % and delta cls., Table 5, Fig. 5's size and
  eps curves), and the plots next to it.

On the real corpora, after ERG has run on them (the generator trained):

    ERG_HOME=.erg-real python benchmarks/table2.py --conf conf/shared_data.yaml
    ERG_HOME=.erg-real python benchmarks/table2.py --conf conf/shared_data.yaml --run-id <experiment run id>

On the sample (the embedded local default; ERG runs first when no generator exists):

    ERG_HOME=.erg-exp python benchmarks/table2.py --conf local --out /tmp/table2
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROW_KEYS = ("style", "captioner", "variant", "bleu1", "bleu3", "meteor", "cider", "cls", "cls_independent", "ppl",
            "train_pairs", "train_pairs_original", "train_pairs_augmented", "test_images", "epochs")


def optional_sections(result: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """``fig5_size`` (Fig. 5's size curve: captioner, styles, points) and ``ablations`` (kinds, captioner, pairs,
    deltas with their 95% intervals) as ``table2.json`` carries them, each None where the experiment has none, with
    the reason (second value)."""
    fig5, ablations = result.get("fig5") or {}, result.get("ablations") or {}
    sections: dict[str, Any] = {"fig5_size": None, "ablations": None}
    reasons = {}
    if fig5.get("points"):
        sections["fig5_size"] = {k: fig5.get(k) for k in ("captioner", "styles", "points")}
    else:
        reasons["fig5_size"] = ("Fig. 5 was planned but no size cell was scored" if fig5 else
                                "Fig. 5 was not planned: experiment.fig5.enabled was false or none of its style set's "
                                "styles was measured")
    if ablations:
        sections["ablations"] = {k: v for k, v in ablations.items() if k != "markdown"}
    else:
        reasons["ablations"] = ("no ablation was measured: experiment.ablations.kinds was empty, none of its styles "
                                "was measured, or no ablation pair was found")
    return sections, reasons


def write_results(result: dict[str, Any], out_dir: str | Path) -> dict[str, str]:
    """``table2.json`` and ``table2.md`` (plus the report's PNGs) from an experiment's result into ``out_dir``."""
    from models.experiment_report import render_report, table2_rows, table2_seed_stats, table2_summary

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    report_dir = result.get("report_dir")
    captions = Path(report_dir) / "hypotheses.parquet" if report_dir else None
    if not result.get("modes") and captions is not None and captions.is_file():  # a run from before "modes"
        import pandas as pd

        from models.experiment_report import caption_modes

        result = {**result, "modes": caption_modes(pd.read_parquet(captions))}
    stats = table2_seed_stats(result)
    why_null = stats.pop("why_null")
    sections, reasons = optional_sections(result)
    table2 = [{k: row.get(k) for k in (*ROW_KEYS, "delta_cider_percent", "delta_cls", "delta_cls_independent")
               if k in row} for row in table2_rows(result["rows"])]
    data = {"rows": table2, "leakage": result["leakage"], "not_measured": result["not_measured"],
            "command": result["command"], "features": result.get("features"),
            "augmented_source": result.get("augmented_source"), "test_source": result.get("test_source"),
            "training": result.get("training"), "cls_source": result.get("cls_source"),
            "ppl_source": result.get("ppl_source"), "generator_version": result.get("generator_version"),
            "experiment_run_id": result.get("run_id"), "seconds": result.get("seconds"),
            "stage_seconds": result.get("stage_seconds"), "summary": table2_summary(result["rows"]),
            **stats, "interval": result.get("interval"), **sections,
            "why_null": {**why_null, **reasons},
            "rendered_by": result.get("rendered_by"),
            "cells": [{k: row.get(k) for k in ROW_KEYS} for row in result["rows"]],
            "table5": {k: v for k, v in (result.get("table5") or {}).items() if k != "markdown"},
            "fig5": {k: v for k, v in (result.get("fig5") or {}).items() if k not in ("markdown", "eps_markdown")},
            "modes": result.get("modes") or [], "tuning": result.get("tuning")}
    json_path = out / "table2.json"
    json_path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    md_path = out / "table2.md"
    md_path.write_text(render_report(result))
    for name in ("table2.png", "fig5_size.png", "fig5_eps.png"):
        source = Path(report_dir) / name if report_dir else None
        if source is not None and source.is_file():
            shutil.copyfile(source, out / name)
    return {"json": str(json_path), "md": str(md_path)}


def load_result(cfg, run_id: str) -> dict[str, Any]:
    """The result a finished experiment logged (``report/experiment.json`` of its MLflow run)."""
    import mlflow

    from jobs.platform.tracking import configure_mlflow

    configure_mlflow(cfg)
    local = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="report")
    result = json.loads((Path(local) / "experiment.json").read_text())
    result["report_dir"] = local
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conf", default="conf/shared_data.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="conf override, e.g. --set experiment.max_augmented_pairs=2000 (repeatable)")
    parser.add_argument("--run-id", help="read this finished experiment run instead of running one")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()

    from jobs.platform.config import load_config

    cfg = load_config(args.conf, args.overrides)
    if args.run_id:
        result = load_result(cfg, args.run_id)
        # the run's own command stays in "command"; this one only rendered its logged result again
        result["rendered_by"] = " ".join(shlex.quote(a) for a in ["python", "benchmarks/table2.py", *sys.argv[1:]])
    else:
        import jobs
        from jobs.platform.spark import get_spark

        command = " ".join(shlex.quote(a) for a in ["python", "benchmarks/table2.py", *sys.argv[1:]])
        home = os.environ.get("ERG_HOME")
        result = jobs.experiment(get_spark(cfg), cfg, command=(f"ERG_HOME={home} " if home else "") + command)
    paths = write_results(result, args.out)
    print(json.dumps({**paths, "not_measured": result["not_measured"], "leakage": result["leakage"]}, indent=2))


if __name__ == "__main__":
    main()
