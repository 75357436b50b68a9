"""The sample's tables as a fingerprint: ``erg run`` on the embedded local default from an empty home, then per table
its row count and a content hash, so that a change of structure can show it left every table as it was.

The hash covers every deterministic column (run ids, timestamps and run-id-named model versions left out, as in
``benchmarks/chaos.py``), the home's path written as ``<home>``, rows sorted by the table's natural key, floats
rounded to 4 decimals (two correct runs agree to about 1e-6; a rounding edge would show as one differing table)::

    python benchmarks/sample_tables.py --home /tmp/sample --out /tmp/before.json
    python benchmarks/sample_tables.py --home /tmp/sample --out benchmarks/results/sample_tables.json \\
        --compare /tmp/before.json

Give both runs the same ``--home`` path (one after the other): a quarantined row's id hashes its source file's
absolute path, which lies under the home. To fingerprint an older commit, run this script from an export of it
(``git archive <commit> | tar -x -C DIR``).
``--compare`` writes ``identical`` and the tables that differ beside the fingerprint, and exits 1 when any does.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.chaos import COMPARE_KEYS, VOLATILE, DeltaFolders  # noqa: E402
from jobs.platform.tables import TABLES  # noqa: E402

DECIMALS = 4


def canonical(value: Any, home: str) -> Any:
    """A JSON-able value with floats rounded and the home's path replaced."""
    if value is None:
        return None
    if isinstance(value, (list, tuple, np.ndarray)):
        return [canonical(v, home) for v in value]
    if isinstance(value, dict):
        return {str(k): canonical(v, home) for k, v in sorted(value.items())}
    if isinstance(value, (float, np.floating)):
        return None if math.isnan(float(value)) else round(float(value), DECIMALS) + 0.0
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.bool_,)):
        return bool(value)
    if isinstance(value, bytes):
        return hashlib.sha256(value).hexdigest()
    if isinstance(value, str):
        return value.replace(home, "<home>")
    if hasattr(value, "asDict"):
        return canonical(value.asDict(recursive=True), home)
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


def fingerprint(table: str, frame: pd.DataFrame, home: str) -> dict[str, Any]:
    spec = TABLES[table]
    columns = [f.name for f in spec.schema.fields if f.name not in VOLATILE and f.name in frame.columns]
    rows = [json.dumps([canonical(v, home) for v in row], sort_keys=True, default=str)
            for row in frame[columns].itertuples(index=False, name=None)]
    rows.sort()
    digest = hashlib.sha256("\n".join(rows).encode()).hexdigest()
    keys = COMPARE_KEYS.get(table) or tuple(k for k in spec.keys if k not in VOLATILE)
    return {"rows": len(frame), "sha256": digest, "columns": columns, "keys": list(keys)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--home", type=Path, required=True, help="an empty (or absent) folder: the run's ERG_HOME")
    ap.add_argument("--conf", default="local")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--compare", type=Path, help="a fingerprint written before: exit 1 unless every table equals it")
    ap.add_argument("--reuse", action="store_true", help="fingerprint the home as it is, without running")
    args = ap.parse_args(argv)
    home = args.home.resolve()
    seconds = None
    if not args.reuse:
        if home.exists() and any(home.iterdir()):
            raise SystemExit(f"{home} is not empty: give an empty or absent folder (the run starts from nothing)")
        home.mkdir(parents=True, exist_ok=True)
        started = time.time()
        env = {**os.environ, "ERG_HOME": str(home), "PYTHONPATH": str(REPO)}
        log = home.parent / f"{home.name}.log"
        with open(log, "w") as out:
            rc = subprocess.call([sys.executable, "-m", "jobs.cli", "run", "--conf", args.conf], cwd=REPO, env=env,
                                 stdout=out, stderr=subprocess.STDOUT)
        if rc != 0:
            raise SystemExit(f"erg run failed (exit {rc}); see {log}")
        seconds = round(time.time() - started, 1)
    reader = DeltaFolders()
    load = reader.loader(home.parent / f"{home.name}-compare", home)
    tables = {table: fingerprint(table, load(table), str(home)) for table in TABLES}
    result: dict[str, Any] = {
        "command": "python benchmarks/sample_tables.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "conf": args.conf, "run_seconds": seconds, "tables": tables,
        "commit": subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
        or None,
    }
    if args.compare:
        before = json.loads(args.compare.read_text())
        differ = sorted(t for t in set(before["tables"]) | set(tables)
                        if (before["tables"].get(t) or {}).get("sha256") != (tables.get(t) or {}).get("sha256")
                        or (before["tables"].get(t) or {}).get("rows") != (tables.get(t) or {}).get("rows"))
        result["compared_with"] = {"commit": before.get("commit"), "tables": {
            t: {k: before["tables"][t][k] for k in ("rows", "sha256")} for t in before["tables"]}}
        result["identical"] = not differ
        result["tables_differing"] = differ
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for table, fp in tables.items():
        print(f"{table:24s} {fp['rows']:>7d}  {fp['sha256'][:16]}")
    if args.compare:
        print("identical" if result["identical"] else f"DIFFERENT: {', '.join(result['tables_differing'])}")
        return 0 if result["identical"] else 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
