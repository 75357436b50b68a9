"""Rewrite a results folder's ``table2.json`` / ``table2.md`` / ``table2.png`` from its experiment's saved result,
without Spark, MLflow or training.

``erg experiment`` keeps its whole result (every seed's cell scores, the aggregated rows with their 95% intervals)
as ``report/experiment.json`` under its model folder ``$ERG_HOME/models/<schema>/experiment/<run id>``, next to the
``table2.png`` it plotted. This script reads the run id from the folder's ``table2.json`` (``experiment_run_id``),
or takes ``--experiment-json``, and writes the three files again with :func:`benchmarks.table2.write_results`. The
experiment's own command stays in ``command`` (and in the markdown); this script's command line goes in
``rendered_by``.

    ERG_HOME=/work/real/.erg-real python benchmarks/rerender_table2.py benchmarks/results/table2_volume_nic
    python benchmarks/rerender_table2.py OUT --experiment-json PATH/report/experiment.json
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def experiment_json(out: Path, conf: str, overrides: list[str]) -> Path:
    """The saved result of the experiment that ``out/table2.json`` names."""
    from jobs.platform.config import load_config
    from jobs.platform.model_store import model_dir

    run_id = json.loads((out / "table2.json").read_text()).get("experiment_run_id")
    if not run_id:
        raise SystemExit(f"{out / 'table2.json'} names no experiment_run_id: pass --experiment-json")
    path = model_dir(load_config(conf, overrides), "experiment", run_id) / "report" / "experiment.json"
    if not path.is_file():
        raise SystemExit(f"{path} is missing (is ERG_HOME the experiment's home?): pass --experiment-json, or "
                         f"render from MLflow with benchmarks/table2.py --run-id {run_id}")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="the results folder to rewrite (its table2.json names the experiment run)")
    parser.add_argument("--experiment-json", help="the experiment's report/experiment.json (default: found by the "
                        "run id under ERG_HOME)")
    parser.add_argument("--conf", default="conf/shared_data.yaml", help="the conf whose home holds the experiment")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()

    from benchmarks.table2 import write_results

    out = Path(args.out)
    path = Path(args.experiment_json) if args.experiment_json else experiment_json(out, args.conf, args.overrides)
    result = json.loads(path.read_text())
    result["report_dir"] = str(path.parent)  # table2.png (and Fig. 5's plots) as the experiment drew them
    home = os.environ.get("ERG_HOME")
    command = " ".join(shlex.quote(a) for a in ["python", "benchmarks/rerender_table2.py", *sys.argv[1:]])
    result["rendered_by"] = (f"ERG_HOME={home} " if home and not args.experiment_json else "") + command
    paths = write_results(result, out)
    print(json.dumps({**paths, "experiment_json": str(path), "rendered_by": result["rendered_by"]}, indent=2))


if __name__ == "__main__":
    main()
