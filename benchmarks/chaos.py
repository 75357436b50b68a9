"""Kills at random points: ``erg run`` is SIGKILLed at N random moments across its stages, rerun each time, and every
table is compared with an uninterrupted run.

1. **Reference.** ``erg run --conf C`` runs uninterrupted in ``<work>/reference`` (its own ERG_HOME: tables, models,
   MLflow store, generated sample). The moments its stage banners (``1/5 ingest`` ... ``5/5 generate``) appear are
   the stage timings. A reference already complete in ``<work>`` (``reference.json``) is reused.
2. **Kills.** For kill k, in a fresh ``<work>/kill-<k>``: the target stage is drawn (every stage in turn, in a seeded
   order); ``erg run --conf C`` starts; once the target stage's banner appears, a moment drawn uniformly within that
   stage's reference duration passes, and the whole process group (driver, JVM, Python workers) gets SIGKILL. The
   stage hit is the last banner printed before the kill. A run that ends before its moment is not a kill: it is
   recorded and another moment is drawn.
3. **Rerun.** ``erg run --incremental --conf C`` (the documented recovery: reuse the models recorded as current, do
   only what is missing) runs in the same home to completion.
4. **Compare.** Every table of the killed-and-rerun home against the reference's (:func:`compare_tables`): the same
   natural keys, no duplicate key, the same values in every deterministic column (floats within a tolerance; run
   ids, timestamps and the run-id-named model versions are left out; the homes' paths are written as ``<home>``).
   Tables are read from their Delta folders by one Spark session in this process.

Writes ``--out`` (default ``benchmarks/results/chaos.json``)::

    {"kills": N, "stages_hit": [...], "identical": K, "differences": [...], "command": "...", "runs": [...], ...}

``identical`` counts the kills whose tables all equal the reference's; ``differences`` lists what differed (table,
kind, column, count, examples):

    python benchmarks/chaos.py --kills 10 --conf local --work .erg-chaos
    python benchmarks/chaos.py --kills 2 --conf test --work .erg-chaos-test --out /tmp/chaos.json   # a quick check

To run the code of one commit while the working tree changes, run it from an export
(``git archive HEAD | tar -x -C /tmp/src``) with ``--out`` pointing back into the repository.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import pandas as pd

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from jobs.pipeline import STAGES  # noqa: E402
from jobs.tables import TABLES  # noqa: E402

BANNER = re.compile(r"(\d+)/(\d+) (\w+)")
#: columns whose values differ between two correct runs: run ids, times, model versions named after a run id
VOLATILE = frozenset({"run_id", "created_at", "ingest_time", "quarantined_at", "classifier_version",
                      "generator_version"})
#: comparison keys where a natural key hashes a path under the home (quarantine_id hashes its source file's path)
COMPARE_KEYS = {"quarantine": ("source", "source_file", "line_no", "reason")}
RTOL, ATOL = 1e-4, 1e-5


# --------------------------------------------------------------------------------------------------- running
def erg_command(conf: str, overrides: Iterable[str] = (), incremental: bool = False,
                lock: str | None = None) -> list[str]:
    """``python -m jobs.cli run --conf <conf> [--incremental] [--set k=v ...]`` (run from the repository root);
    with ``lock``, under ``flock <lock>`` (one heavy job at a time on a shared machine)."""
    cmd = (["flock", lock] if lock else []) + [sys.executable, "-m", "jobs.cli", "run", "--conf", conf]
    if incremental:
        cmd.append("--incremental")
    for item in overrides:
        cmd += ["--set", item]
    return cmd


def banners(text: str) -> list[str]:
    """The stages whose banner (``n/N stage``) the run printed, in order."""
    return [m.group(3) for m in BANNER.finditer(text) if m.group(3) in STAGES]


def run_and_kill(cmd: list[str], env: dict, log: Path, *, stage: str | None = None, delay: float = 0.0,
                 timeout: float = 7200.0, cwd: Path = REPO) -> dict[str, Any]:
    """Run ``cmd`` (output to ``log``); with ``stage``, SIGKILL its process group ``delay`` seconds after that stage's
    banner appears. Returns ``{"killed", "stage_hit", "rc", "seconds", "banner_times"}`` (seconds from the start at
    which each banner appeared)."""
    started = time.monotonic()
    seen: dict[str, float] = {}
    kill_at = None
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=str(cwd),
                                start_new_session=True)
        try:
            while proc.poll() is None:
                now = time.monotonic() - started
                if now > timeout:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    raise TimeoutError(f"{' '.join(cmd)} ran past {timeout:.0f}s; log: {log}")
                for name in banners(log.read_text(errors="replace")):
                    seen.setdefault(name, now)
                if stage is not None and kill_at is None and stage in seen:
                    kill_at = seen[stage] + delay
                if kill_at is not None and now >= kill_at:
                    printed = banners(log.read_text(errors="replace"))
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    return {"killed": True, "stage_hit": printed[-1] if printed else "startup", "rc": proc.returncode,
                            "seconds": round(now, 1), "banner_times": seen}
                time.sleep(0.2)
        except BaseException:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            raise
    for name in banners(log.read_text(errors="replace")):
        seen.setdefault(name, time.monotonic() - started)
    return {"killed": False, "stage_hit": None, "rc": proc.returncode,
            "seconds": round(time.monotonic() - started, 1), "banner_times": seen}


def stage_windows(banner_times: dict[str, float], total: float) -> dict[str, float]:
    """Seconds each stage lasted: from its banner to the next one (the last stage: to the end of the run)."""
    order = [s for s in STAGES if s in banner_times]
    ends = [banner_times[s] for s in order[1:]] + [total]
    return {s: max(0.5, end - banner_times[s]) for s, end in zip(order, ends)}


def kill_plan(n: int, seed: int, windows: dict[str, float]) -> list[tuple[str, float]]:
    """``n`` (stage, seconds after its banner): every stage in turn (a seeded order per round), a uniform moment."""
    rng = random.Random(seed)
    plan: list[tuple[str, float]] = []
    while len(plan) < n:
        order = list(STAGES)
        rng.shuffle(order)
        plan += [(s, round(rng.uniform(0, windows[s]), 1)) for s in order]
    return plan[:n]


# ------------------------------------------------------------------------------------------------- comparing
def _normalise(value: Any, homes: tuple[str, ...]) -> Any:
    if isinstance(value, str):
        for home in homes:
            value = value.replace(home, "<home>")
    return value


def _is_float_like(value: Any) -> bool:
    return isinstance(value, (float, np.floating))


def _same(a: Any, b: Any) -> bool:
    """Equal, with floats (and arrays of floats) within RTOL/ATOL and NaN == NaN, None == None."""
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, (list, tuple, np.ndarray)) or isinstance(b, (list, tuple, np.ndarray)):
        if not isinstance(a, (list, tuple, np.ndarray)) or not isinstance(b, (list, tuple, np.ndarray)) \
                or len(a) != len(b):
            return False
        a, b = list(a), list(b)
        if a and all(_is_float_like(x) for x in a) and all(_is_float_like(x) for x in b):
            return bool(np.allclose(np.asarray(a, float), np.asarray(b, float), rtol=RTOL, atol=ATOL, equal_nan=True))
        return all(_same(x, y) for x, y in zip(a, b))
    if _is_float_like(a) or _is_float_like(b):
        try:
            fa, fb = float(a), float(b)
        except (TypeError, ValueError):
            return False
        return (math.isnan(fa) and math.isnan(fb)) or math.isclose(fa, fb, rel_tol=RTOL, abs_tol=ATOL)
    return a == b


def _key_tuples(frame: pd.DataFrame, keys: tuple[str, ...]) -> list[tuple]:
    return [tuple(r) for r in frame[list(keys)].itertuples(index=False, name=None)]


def compare_table(table: str, reference: pd.DataFrame, other: pd.DataFrame, homes: tuple[str, ...] = (),
                  examples: int = 3) -> list[dict[str, Any]]:
    """Differences of ``other`` from ``reference`` for one table: duplicate keys, keys missing or extra, and per
    deterministic column the rows whose values differ. Empty when they agree."""
    spec = TABLES[table]
    keys = COMPARE_KEYS.get(table) or tuple(k for k in spec.keys if k not in VOLATILE)
    columns = [f.name for f in spec.schema.fields if f.name not in VOLATILE and f.name not in keys
               and f.name not in spec.keys  # a natural key replaced in COMPARE_KEYS hashes a path: not compared
               and f.name in reference.columns and f.name in other.columns]
    out: list[dict[str, Any]] = []
    frames = {}
    for side, frame in (("reference", reference), ("rerun", other)):
        frame = frame.copy()
        for col in frame.columns:
            if frame[col].dtype == object:
                frame[col] = frame[col].map(lambda v: _normalise(v, homes))
        dup = frame.duplicated(list(keys), keep=False)
        if dup.any():
            out.append({"table": table, "kind": f"duplicate keys ({side})", "count": int(dup.sum()),
                        "examples": [list(map(str, k)) for k in _key_tuples(frame[dup], keys)[:examples]]})
        frames[side] = frame.drop_duplicates(list(keys)).set_index(list(keys), drop=False)
    ref, new = frames["reference"], frames["rerun"]
    ref_keys, new_keys = set(ref.index), set(new.index)
    for kind, missing in (("keys missing after the rerun", ref_keys - new_keys),
                          ("keys only after the rerun", new_keys - ref_keys)):
        if missing:
            out.append({"table": table, "kind": kind, "count": len(missing),
                        "examples": [list(map(str, k if isinstance(k, tuple) else (k,))) for k in sorted(
                            missing, key=str)[:examples]]})
    common = sorted(ref_keys & new_keys, key=str)
    for col in columns:
        a, b = ref.loc[common, col].tolist(), new.loc[common, col].tolist()
        bad = [i for i, (x, y) in enumerate(zip(a, b)) if not _same(x, y)]
        if bad:
            out.append({"table": table, "kind": "values differ", "column": col, "count": len(bad),
                        "examples": [{"key": list(map(str, common[i] if isinstance(common[i], tuple) else (common[i],))),
                                      "reference": str(a[i])[:200], "rerun": str(b[i])[:200]} for i in bad[:examples]]})
    return out


def compare_tables(load_reference: Callable[[str], pd.DataFrame], load_other: Callable[[str], pd.DataFrame],
                   tables: Iterable[str] = tuple(TABLES), homes: tuple[str, ...] = ()) -> dict[str, Any]:
    """Every table of two runs compared (:func:`compare_table`): ``{"identical", "rows", "differences"}``."""
    differences, rows = [], {}
    for table in tables:
        ref, new = load_reference(table), load_other(table)
        rows[table] = {"reference": len(ref), "rerun": len(new)}
        differences += compare_table(table, ref, new, homes)
    return {"identical": not differences, "rows": rows, "differences": differences}


class DeltaFolders:
    """Reads the tables of a local home from their Delta folders (``<home>/warehouse/<schema>/<table>``) with one
    Spark session, created on first use."""

    def __init__(self, schema: str = "erg") -> None:
        self.schema = schema
        self._spark = None

    def spark(self, work: Path):
        if self._spark is None:
            from jobs.config import load_config
            from jobs.spark import get_spark

            cfg = load_config("test", [f"home={work / 'compare'}", "spark.driver_memory=2g",
                                       "spark.show_progress=false", "tables.schema=chaos_compare"])
            self._spark = get_spark(cfg)
        return self._spark

    def loader(self, work: Path, home: Path) -> Callable[[str], pd.DataFrame]:
        def load(table: str) -> pd.DataFrame:
            path = home / "warehouse" / self.schema / table
            if not (path / "_delta_log").exists():
                return pd.DataFrame(columns=[f.name for f in TABLES[table].schema.fields])
            return self.spark(work).read.format("delta").load(str(path)).toPandas()
        return load


# ----------------------------------------------------------------------------------------------------- main
def _env(home: Path) -> dict:
    return {**os.environ, "ERG_HOME": str(home), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def _fresh(path: Path, work: Path) -> Path:
    path = path.resolve()
    if work.resolve() not in path.parents:
        raise ValueError(f"refusing to remove {path}: it is outside the chaos work folder {work}")
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def _prune(home: Path) -> None:
    """Drop a finished home's models and MLflow artifacts (the tables stay for a later look)."""
    for sub in ("models", "mlartifacts"):
        shutil.rmtree(home / sub, ignore_errors=True)


def reference_run(args, work: Path) -> dict[str, Any]:
    marker = work / "reference.json"
    if marker.exists() and not args.fresh_reference:
        ref = json.loads(marker.read_text())
        if ref.get("conf") == args.conf and ref.get("overrides") == args.set:
            print(f"reference: reusing {work / 'reference'} ({ref['seconds']}s)", file=sys.stderr)
            return ref
    home = _fresh(work / "reference", work)
    print(f"reference: erg run --conf {args.conf} in {home}", file=sys.stderr)
    result = run_and_kill(erg_command(args.conf, args.set, lock=args.lock), _env(home), work / "reference.log",
                          timeout=args.timeout)
    if result["rc"] != 0:
        raise SystemExit(f"the reference run failed (exit {result['rc']}); see {work / 'reference.log'}")
    first = min(result["banner_times"].values(), default=0.0)
    ref = {"conf": args.conf, "overrides": args.set, "seconds": round(result["seconds"] - first, 1),
           "banner_times": result["banner_times"],
           "windows": stage_windows(result["banner_times"], result["seconds"])}
    marker.write_text(json.dumps(ref, indent=2))
    return ref


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=10, help="kills (each in a fresh home, then a rerun)")
    parser.add_argument("--conf", default="local", help="conf of every run (local: the generated sample)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="conf overrides")
    parser.add_argument("--seed", type=int, default=2021, help="seed of the stages' order and the moments")
    parser.add_argument("--work", type=Path, default=REPO / ".erg-chaos", help="homes of the runs (removed and "
                        "recreated per kill; the reference is kept and reused)")
    parser.add_argument("--fresh-reference", action="store_true", help="rerun the reference even if one exists")
    parser.add_argument("--keep", action="store_true", help="keep each killed home's models and MLflow artifacts")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "chaos.json")
    parser.add_argument("--timeout", type=float, default=4 * 3600, help="seconds one erg run may take (waiting for "
                        "--lock included)")
    parser.add_argument("--lock", default=None, help="run every erg command under `flock LOCK` (a machine shared "
                        "with other heavy jobs); stage timings are measured from the stage banners, so waiting for the lock does not count")
    args = parser.parse_args(argv)
    if args.kills < 1:
        parser.error("--kills must be at least 1")
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    command = " ".join(["python", "benchmarks/chaos.py", "--kills", str(args.kills), "--conf", args.conf,
                        "--seed", str(args.seed), *[f"--set {s}" for s in args.set]])

    ref = reference_run(args, work)
    ref_home = work / "reference"
    plan = kill_plan(args.kills, args.seed, ref["windows"])
    folders = DeltaFolders()
    runs, differences = [], []
    rng = random.Random(args.seed + 1)
    k = 0
    attempts = 0
    while k < len(plan):
        stage, delay = plan[k]
        attempts += 1
        if attempts > 2 * len(plan) + 5:
            raise SystemExit("too many runs ended before their kill moment; see the logs under " + str(work))
        home = _fresh(work / f"kill-{k}", work)
        print(f"kill {k + 1}/{len(plan)}: {stage} + {delay}s in {home}", file=sys.stderr)
        killed = run_and_kill(erg_command(args.conf, args.set, lock=args.lock), _env(home), work / f"kill-{k}.log",
                              stage=stage, delay=delay, timeout=args.timeout)
        record: dict[str, Any] = {"kill": k, "target_stage": stage, "delay_s": delay, **{
            key: killed[key] for key in ("killed", "stage_hit", "seconds")}}
        if not killed["killed"]:
            record["note"] = f"the run ended (exit {killed['rc']}) before the kill moment; another moment is drawn"
            runs.append(record)
            plan[k] = (stage, round(rng.uniform(0, delay), 1))
            continue
        rerun = run_and_kill(erg_command(args.conf, args.set, incremental=True, lock=args.lock), _env(home),
                             work / f"kill-{k}.rerun.log", timeout=args.timeout)
        record.update({"rerun_rc": rerun["rc"], "rerun_seconds": rerun["seconds"]})
        if rerun["rc"] != 0:
            tail = (work / f"kill-{k}.rerun.log").read_text(errors="replace")[-1500:]
            record.update({"identical": False, "differences": [{"kind": "rerun failed", "rc": rerun["rc"],
                                                                "log_tail": tail}]})
        else:
            result = compare_tables(folders.loader(work, ref_home), folders.loader(work, home),
                                    homes=(str(ref_home), str(home)))
            record.update({"identical": result["identical"], "differences": result["differences"],
                           "rows": result["rows"]})
        for diff in record["differences"]:
            differences.append({"kill": k, "stage_hit": record["stage_hit"], **diff})
        print(f"  stage hit {record['stage_hit']} at {record['seconds']}s; rerun {record['rerun_seconds']}s; "
              f"identical: {record['identical']}", file=sys.stderr)
        runs.append(record)
        if not args.keep:
            _prune(home)
        k += 1
        _write(args.out, runs, differences, command, ref, args)
    _write(args.out, runs, differences, command, ref, args)
    done = [r for r in runs if r["killed"]]
    print(f"{len(done)} kills, {sum(r['identical'] for r in done)} identical; {args.out}", file=sys.stderr)
    return 0 if all(r["identical"] for r in done) else 1


def _write(out: Path, runs: list[dict], differences: list[dict], command: str, ref: dict, args) -> None:
    done = [r for r in runs if r["killed"]]
    summary = {
        "kills": len(done),
        "stages_hit": sorted({r["stage_hit"] for r in done}, key=lambda s: (STAGES + ("startup",)).index(s)
                             if s in STAGES + ("startup",) else 99),
        "identical": sum(1 for r in done if r.get("identical")),
        "differences": differences,
        "command": command,
        "conf": args.conf,
        "rerun": "erg run --incremental",
        "reference_seconds": ref["seconds"],
        "reference_stage_seconds": {s: round(v, 1) for s, v in ref["windows"].items()},
        "compared": {"tables": list(TABLES), "left_out_columns": sorted(VOLATILE),
                     "float_tolerance": {"rtol": RTOL, "atol": ATOL}},
        "runs": [{k: v for k, v in r.items() if k != "differences"} for r in runs],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2, default=str) + "\n")


if __name__ == "__main__":
    sys.exit(main())
