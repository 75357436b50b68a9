"""Benchmark: ``erg run`` on the real corpora from an empty home, each stage's seconds, at volume.

Runs ``erg run --conf <conf>`` (default ``conf/shared_data.yaml``: no candidate cap, the train descriptions as
queries) as a user would, in a home that must be empty (``--fresh`` empties it), and records each stage's seconds
and rows from the progress lines ``erg`` prints, writing the results file after every stage so that a run cut short
still leaves what it measured (``complete: false``). When the run ends, the stage jobs' own timings are read from
its MLflow runs: extract's fits (the extractor classifiers, their heads, the evaluation classifiers), generate's
generator fit and the candidates it generated.

    python benchmarks/real_run.py --home .erg-real --fresh

The real-data home it leaves is the one the other real-corpora benchmarks read (``ERG_HOME=.erg-real``).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAGE_LINE = re.compile(r"^(ingest|extract|embed|retrieve|generate): ([\d.]+)s(?:\s+([\d,]+) rows written)?")
CHILD_METRICS = re.compile(r"^(seconds\.\w+|classifier\.\w+\.fit_seconds|head\.\w+\.seconds|"
                           r"evaluation_classifier\.fit_seconds|classifier\.\w+\.val_accuracy|candidates|"
                           r"augmented_captions\.inserted)$")


def _write(out: Path, result: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")


def _stage_metrics(home: Path, conf: str) -> dict:
    """The stage child runs' timing and count metrics of the newest ``erg run`` in ``home``'s MLflow store."""
    os.environ["ERG_HOME"] = str(home)
    sys.path.insert(0, str(ROOT))
    import mlflow

    from jobs.platform.config import load_config

    cfg = load_config(conf)
    mlflow.set_tracking_uri(cfg.mlflow.tracking_uri)
    experiment = mlflow.get_experiment_by_name(cfg.mlflow.experiment)
    runs = mlflow.search_runs([experiment.experiment_id], filter_string="tags.`erg.job` = 'run'",
                              order_by=["attributes.start_time DESC"], max_results=1, output_format="list")
    if not runs:
        return {}
    children = mlflow.search_runs([experiment.experiment_id],
                                  filter_string=f"tags.mlflow.parentRunId = '{runs[0].info.run_id}'",
                                  output_format="list")
    out = {}
    for child in children:
        name = child.data.tags.get("erg.job", child.info.run_name)
        picked = {k: v for k, v in child.data.metrics.items() if CHILD_METRICS.match(k)}
        if picked:
            out[name] = dict(sorted(picked.items()))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conf", default="conf/shared_data.yaml")
    parser.add_argument("--home", default=str(ROOT / ".erg-real"))
    parser.add_argument("--fresh", action="store_true", help="empty the home first")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "real_run.json"))
    args = parser.parse_args(argv)
    home = Path(args.home).resolve()
    if home.exists() and any(home.iterdir()):
        if not args.fresh:
            parser.error(f"{home} is not empty: the measurement is from an empty home (pass --fresh to empty it)")
        shutil.rmtree(home)
    home.mkdir(parents=True)
    erg = Path(sys.executable).parent / "erg"
    command = [str(erg), "run", "--conf", args.conf]
    out = Path(args.out)
    result = {"command": "python benchmarks/real_run.py " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])),
        "erg_command": "erg run --conf " + args.conf, "commit": subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
        "cpus": os.cpu_count(), "complete": False, "stages": {}}
    _write(out, result)
    started = time.time()
    process = subprocess.Popen(command, cwd=ROOT, env={**os.environ, "ERG_HOME": str(home)}, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, bufsize=1)
    for line in process.stdout:
        print(line, end="", flush=True)
        match = STAGE_LINE.match(line.strip())
        if match:
            stage, seconds, rows = match.groups()
            result["stages"][stage] = {"seconds": float(seconds),
                                       "rows_written": int(rows.replace(",", "")) if rows else 0}
            result["wall_seconds_so_far"] = time.time() - started
            _write(out, result)
    result["returncode"] = process.wait()
    result["wall_seconds"] = time.time() - started
    result["complete"] = result["returncode"] == 0 and len(result["stages"]) == 5
    if result["complete"]:
        result["stage_metrics"] = _stage_metrics(home, args.conf)
        stages = result["stages"]
        total = sum(s["seconds"] for s in stages.values())
        result["summary"] = {"stage_seconds_total": total, "longer_than_an_hour": total > 3600,
                             "share": {k: v["seconds"] / total for k, v in stages.items()}}
    _write(out, result)
    print(json.dumps({k: v for k, v in result.items() if k != "stage_metrics"}, indent=1))
    return 0 if result["complete"] else 1


if __name__ == "__main__":
    sys.exit(main())
