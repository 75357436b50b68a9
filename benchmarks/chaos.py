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
   only what is missing) runs in the same home to completion. Before it, the killed home's MLflow registry is checked:
   every ``current`` alias must name a record whose model folders are complete (:func:`registry_check`).
4. **Compare.** Every table of the killed-and-rerun home against the reference's (:func:`compare_tables`): the same
   natural keys, no duplicate key, the same values in every deterministic column (floats within a tolerance; run
   ids, timestamps and the run-id-named model versions are left out; the homes' paths are written as ``<home>``).
   Tables are read from their Delta folders by one Spark session in this process. Kills go on past ``--kills``
   until every stage was hit ``--min-per-stage`` times; a stage's window is the shortest seen in any run, so a kill
   aimed at a stage lands in it.
5. **Experiment.** ``--experiment-kills`` more homes run ``erg run``, then ``erg experiment`` killed at a moment
   drawn over a reference experiment's time (inside a cell or between cells), then ``erg experiment`` again: every
   per-seed cell must equal the reference experiment's (:func:`compare_experiments`), the registry intact.

Writes ``--out`` (default ``benchmarks/results/chaos.json``)::

    {"kills": N, "kills_per_stage": {...}, "identical": K, "registry_aliases_broken": 0, "differences": [...],
     "command": "...", "runs": [...], "experiment_runs": [...], ...}

``identical`` counts the kills whose tables (or experiment cells) all equal the reference's; ``differences`` lists
what differed:

    python benchmarks/chaos.py --kills 12 --experiment-kills 2 --conf local --work .erg-chaos
    python benchmarks/chaos.py --kills 2 --min-per-stage 0 --experiment-kills 1 --conf test --work .erg-chaos-test \
        --experiment-conf local --out /tmp/chaos.json   # a quick check

``--conf test``'s sample is too small for an experiment (one or two test images a style): ``--experiment-conf
local`` runs the experiment homes on the local default while the kills of ``erg run`` stay on ``test``.

A session's end or a crash stops the kills; the same command with ``--resume`` keeps the kills ``--out`` records
and goes on after them (the references are reused).

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
from jobs.platform.tables import TABLES  # noqa: E402

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
            from jobs.platform.config import load_config
            from jobs.platform.spark import get_spark

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


# ---------------------------------------------------------------------------------------- registry and experiment
def _paths_in(value: Any, home: str) -> list[str]:
    if isinstance(value, str):
        return [value] if value.startswith(home) else []
    if isinstance(value, dict):
        return [p for v in value.values() for p in _paths_in(v, home)]
    if isinstance(value, (list, tuple)):
        return [p for v in value for p in _paths_in(v, home)]
    return []


def _complete(path: Path) -> bool:
    """A file, or a non-empty folder; a transformers folder (``config.json``) with its weights."""
    if path.is_file():
        return True
    if not path.is_dir() or not any(path.iterdir()):
        return False
    if (path / "config.json").exists():
        return any(path.glob("*.safetensors")) or any(path.glob("*.bin"))
    return True


def registry_check(home: Path) -> dict[str, Any]:
    """Every ``current`` alias of the home's MLflow registry: its record (``erg.record``) is readable and every
    path under the home that the record names is complete (:func:`_complete`). ``{"aliases", "broken"}``."""
    from mlflow import MlflowClient

    from jobs.platform.model_store import CURRENT_ALIAS, RECORD_TAG

    uri = f"sqlite:///{home / 'mlflow.db'}"
    if not (home / "mlflow.db").exists():
        return {"aliases": 0, "broken": []}
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    checked, broken = 0, []
    for model in client.search_registered_models():
        if CURRENT_ALIAS not in (model.aliases or {}):
            continue
        checked += 1
        version = client.get_model_version_by_alias(model.name, CURRENT_ALIAS)
        record = version.tags.get(RECORD_TAG)
        if not record or not Path(record).is_file():
            broken.append({"model": model.name, "version": version.version, "problem": f"no record at {record}"})
            continue
        missing = [p for p in _paths_in(json.loads(Path(record).read_text()), str(home)) if not _complete(Path(p))]
        if missing:
            broken.append({"model": model.name, "version": version.version, "problem": "incomplete paths",
                           "paths": [p.replace(str(home), "<home>") for p in missing[:5]]})
    return {"aliases": checked, "broken": broken}


def experiment_command(conf: str, overrides: Iterable[str] = (), lock: str | None = None) -> list[str]:
    cmd = (["flock", lock] if lock else []) + [sys.executable, "-m", "jobs.cli", "experiment", "--conf", conf]
    for item in overrides:
        cmd += ["--set", item]
    return cmd


def experiment_result(home: Path, conf: str) -> dict[str, Any]:
    """The result the home's latest finished ``erg experiment`` logged (``report/experiment.json``)."""
    import mlflow

    uri = f"sqlite:///{home / 'mlflow.db'}"
    client = mlflow.MlflowClient(tracking_uri=uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              "tags.`erg.job` = 'experiment' and attributes.status = 'FINISHED'",
                              order_by=["attributes.start_time DESC"], max_results=1)
    if not runs:
        raise RuntimeError(f"no finished experiment run in {home}")
    local = mlflow.artifacts.download_artifacts(run_id=runs[0].info.run_id, artifact_path="report/experiment.json",
                                                tracking_uri=uri)
    return json.loads(Path(local).read_text())


def _cell_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    return result.get("seed_rows") or result.get("rows") or []


def compare_experiments(reference: dict[str, Any], other: dict[str, Any]) -> list[dict[str, Any]]:
    """Differences between two experiments' per-seed cells: the same cells (by their non-numeric fields and seed),
    every metric within the float tolerance. Run ids, paths and seconds are left out."""
    def volatile(key: str) -> bool:
        return "run_id" in key or key.endswith("seconds") or key in ("path", "reused", "fingerprint")

    def ident(row: dict[str, Any]) -> tuple:
        return tuple(sorted((k, str(v)) for k, v in row.items() if not volatile(k)
                            and (isinstance(v, str) or k == "seed")))

    ref = {ident(r): r for r in _cell_rows(reference)}
    new = {ident(r): r for r in _cell_rows(other)}
    out: list[dict[str, Any]] = []
    for kind, keys in (("cells missing after the rerun", ref.keys() - new.keys()),
                       ("cells only after the rerun", new.keys() - ref.keys())):
        if keys:
            out.append({"kind": kind, "count": len(keys), "examples": [dict(k) for k in list(keys)[:3]]})
    for key in ref.keys() & new.keys():
        a, b = ref[key], new[key]
        bad = [k for k in a if not volatile(k) and k in b and not _same(a[k], b[k])]
        if bad:
            out.append({"kind": "values differ", "cell": dict(key), "columns": bad,
                        "reference": {k: a[k] for k in bad}, "rerun": {k: b[k] for k in bad}})
    return out


# ----------------------------------------------------------------------------------------------------- main
def _env(home: Path) -> dict:
    # unbuffered: a stage banner reaches the log the moment it is printed (block-buffered output once put the
    # "extract" banner in the log minutes late, so kills aimed at extract landed in retrieve)
    return {**os.environ, "ERG_HOME": str(home), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1"}


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


def observed_windows(banner_times: dict[str, float]) -> dict[str, float]:
    """Seconds of each stage a run went through completely (its banner to the next one)."""
    order = [s for s in STAGES if s in banner_times]
    return {s: banner_times[n] - banner_times[s] for s, n in zip(order, order[1:])}


def _narrow(windows: dict[str, float], observed: dict[str, float]) -> None:
    """Each stage's kill window shrunk to the shortest duration seen (at least 0.5 s), so a kill lands in it."""
    for name, seconds in observed.items():
        windows[name] = max(0.5, min(windows[name], seconds))


def pipeline_kills(args, work: Path, ref: dict[str, Any], folders: "DeltaFolders",
                   done: list[dict[str, Any]] = ()) -> Iterable[list[dict[str, Any]]]:
    """``--kills`` kills of ``erg run`` and more until every stage was hit ``--min-per-stage`` times; each killed
    home's registry checked, rerun with ``erg run --incremental``, its tables compared with the reference's.
    ``done``: the records of an earlier invocation (``--resume``): their kills count, the plan goes on after them."""
    ref_home = work / "reference"
    windows = dict(ref["windows"])
    for record in done:
        _narrow(windows, record.get("observed_windows") or {})
    plan = kill_plan(args.kills, args.seed, dict(ref["windows"]))
    rng = random.Random(f"{args.seed + 1}:{len(done)}")  # a resumed invocation draws its own redraws
    hits = {s: sum(1 for r in done if r["killed"] and r["stage_hit"] == s) for s in STAGES}
    runs: list[dict[str, Any]] = list(done)
    k = sum(1 for r in done if r["killed"])
    attempts = len(done)
    while k < len(plan) or min(hits.values()) < args.min_per_stage:
        if k >= len(plan):  # the stage hit least so far, at a moment inside its shortest observed window
            stage = min(STAGES, key=lambda s: (hits[s], STAGES.index(s)))
            plan.append((stage, round(rng.uniform(0, windows[stage]), 1)))
        stage, delay = plan[k]
        attempts += 1
        if attempts > 3 * args.kills + 10:
            raise SystemExit("too many runs ended before their kill moment; see the logs under " + str(work))
        home = _fresh(work / f"kill-{k}", work)
        print(f"kill {k + 1}/{len(plan)}: {stage} + {delay}s in {home}", file=sys.stderr)
        killed = run_and_kill(erg_command(args.conf, args.set, lock=args.lock), _env(home), work / f"kill-{k}.log",
                              stage=stage, delay=delay, timeout=args.timeout)
        observed = observed_windows(killed["banner_times"])
        _narrow(windows, observed)
        record: dict[str, Any] = {"kill": k, "target_stage": stage, "delay_s": delay, **{
            key: killed[key] for key in ("killed", "stage_hit", "seconds")},
            "observed_windows": {name: round(seconds, 1) for name, seconds in observed.items()}}
        if not killed["killed"]:
            record["note"] = f"the run ended (exit {killed['rc']}) before the kill moment; another moment is drawn"
            runs.append(record)
            plan[k] = (stage, round(rng.uniform(0, windows[stage]), 1))
            continue
        if record["stage_hit"] in hits:
            hits[record["stage_hit"]] += 1
        record["registry_after_kill"] = registry_check(home)
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
            record["registry_after_rerun"] = registry_check(home)
        if record["registry_after_kill"]["broken"] or record.get("registry_after_rerun", {}).get("broken"):
            record["identical"] = False
            record["differences"].append({"kind": "registry alias names an incomplete model",
                                          "after_kill": record["registry_after_kill"]["broken"],
                                          "after_rerun": record.get("registry_after_rerun", {}).get("broken")})
        print(f"  stage hit {record['stage_hit']} at {record['seconds']}s; rerun {record['rerun_seconds']}s; "
              f"identical: {record['identical']}", file=sys.stderr)
        runs.append(record)
        if not args.keep:
            _prune(home)
        k += 1
        yield runs


SNAPSHOTS_TOOK = "experiment: snapshots took"
TRAINING_TOOK = "experiment: training took"
"""The experiment's log lines that open and close the cells' training (jobs.experiment's step timings)."""


def home_log(console: Path) -> Path | None:
    """The log file under the home that a command's console output names on its first line (``log: PATH``)."""
    first = console.read_text(errors="replace").splitlines()[:1] if console.exists() else []
    return Path(first[0][len("log: "):].strip()) if first and first[0].startswith("log: ") else None


def training_seconds(log: Path | None) -> float | None:
    """The cells' training time a finished experiment's log records (``experiment: training took 25.5s``)."""
    if log is None or not log.exists():
        return None
    found = re.findall(re.escape(TRAINING_TOOK) + r" ([0-9.]+)s", log.read_text(errors="replace"))
    return float(found[-1]) if found else None


def wait_for_log_line(console: Path, marker: str, proc: subprocess.Popen, timeout: float) -> bool:
    """Wait until the home's log (named on ``console``'s first line) holds ``marker``; False if ``proc`` ended or
    ``timeout`` passed first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        log = home_log(console)
        if log is not None and log.exists() and marker in log.read_text(errors="replace"):
            return True
        time.sleep(0.2)
    return False


def cells_snapshotted(console: Path) -> int:
    """Cells whose training snapshot the killed ``erg experiment`` wrote (``experiment cell ...: N original + M
    augmented pairs`` in the log file under the home, whose path the console's first line names)."""
    path = home_log(console)
    if path is None or not path.exists():
        return 0
    return sum(1 for line in path.read_text(errors="replace").splitlines()
               if "experiment cell " in line and "augmented pairs" in line)


def experiment_conf(args) -> tuple[str, list[str]]:
    """The conf and overrides of the experiment homes: ``--experiment-conf`` (default ``--conf``) with ``--set`` and
    then ``--experiment-set`` (an experiment needs test images with scene features: ``--conf test``'s tiny sample
    has one or two a style, so the kills of ``erg run`` can stay small while the experiment runs on ``local``)."""
    conf = args.experiment_conf or args.conf
    return conf, (list(args.set) if conf == args.conf else []) + list(args.experiment_set)


def experiment_kills(args, work: Path, done: list[dict[str, Any]] = ()) -> Iterable[list[dict[str, Any]]]:
    """``--experiment-kills`` kills of ``erg experiment``: a reference home runs ``erg run`` and ``erg experiment``
    uninterrupted; each kill home runs ``erg run``, then ``erg experiment`` killed at a moment drawn uniformly over
    the reference experiment's time (inside a cell or between cells), its registry checked, then ``erg experiment``
    again to the end: its cells must equal the reference's, the cells finished before the kill reused. Then
    ``--experiment-training-kills`` kills aimed inside the cells' training: the moment is drawn over the reference's
    training time and counted from the kill home's own ``snapshots took`` log line (so a slower or faster machine
    still lands inside it). ``done``: the records of an earlier invocation (``--resume``), which are kept; the
    kills go on after them."""
    runs: list[dict[str, Any]] = list(done)
    if len(runs) >= args.experiment_kills + args.experiment_training_kills:
        return
    conf, overrides = experiment_conf(args)
    ref_home = work / "exp-reference"
    marker = work / "exp-reference.json"
    fresh = args.fresh_reference or args.fresh_experiment
    ref = json.loads(marker.read_text()) if marker.exists() and not fresh else None
    if ref is None or ref.get("conf") != conf or ref.get("overrides") != overrides:
        ref_home = _fresh(ref_home, work)
        print(f"experiment reference: erg run + erg experiment in {ref_home}", file=sys.stderr)
        if run_and_kill(erg_command(conf, overrides, lock=args.lock), _env(ref_home), work / "exp-reference.run.log",
                        timeout=args.timeout)["rc"] != 0:
            raise SystemExit(f"the experiment reference's erg run failed; see {work / 'exp-reference.run.log'}")
        done = run_and_kill(experiment_command(conf, overrides, args.lock), _env(ref_home),
                            work / "exp-reference.log", timeout=args.timeout)
        if done["rc"] != 0:
            raise SystemExit(f"the reference experiment failed; see {work / 'exp-reference.log'}")
        ref = {"conf": conf, "overrides": overrides, "seconds": done["seconds"]}
        marker.write_text(json.dumps(ref, indent=2))
    reference = experiment_result(ref_home, conf)
    if "training_seconds" not in ref:
        ref["training_seconds"] = training_seconds(home_log(work / "exp-reference.log"))
        marker.write_text(json.dumps(ref, indent=2))
    anywhere = [r for r in runs if r.get("aim", "anywhere") == "anywhere"]
    in_training = [r for r in runs if r.get("aim") == "training"]
    rng, training_rng = random.Random(args.seed + 2), random.Random(args.seed + 3)
    for _ in anywhere:  # the moments the earlier invocation drew
        rng.uniform(0.05, 0.95)
    for _ in in_training:
        training_rng.uniform(0.1, 0.9)
    total = args.experiment_kills + args.experiment_training_kills
    plan = (["anywhere"] * (args.experiment_kills - len(anywhere))
            + ["training"] * (args.experiment_training_kills - len(in_training)))
    for aim in plan:
        j = len(runs)
        home = _fresh(work / f"exp-kill-{j}", work)
        if aim == "anywhere":
            delay, after = round(rng.uniform(0.05, 0.95) * ref["seconds"], 1), None
            where = f"killed at {delay}s"
        else:
            if not ref.get("training_seconds"):
                raise SystemExit(f"the reference experiment's log names no training time ({TRAINING_TOOK!r}): "
                                 "no kill can be aimed inside the cells' training")
            delay, after = round(training_rng.uniform(0.1, 0.9) * ref["training_seconds"], 1), SNAPSHOTS_TOOK
            where = f"killed {delay}s into the cells' training"
        print(f"experiment kill {j + 1}/{total}: erg run, then erg experiment {where}", file=sys.stderr)
        if run_and_kill(erg_command(conf, overrides, lock=args.lock), _env(home), work / f"exp-kill-{j}.run.log",
                        timeout=args.timeout)["rc"] != 0:
            raise SystemExit(f"erg run failed in {home}; see {work / f'exp-kill-{j}.run.log'}")
        cmd = experiment_command(conf, overrides, args.lock)
        console = work / f"exp-kill-{j}.log"
        started = time.monotonic()
        with console.open("w") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=_env(home), cwd=str(REPO),
                                    start_new_session=True)
            reached = wait_for_log_line(console, after, proc, timeout=args.timeout) if after else True
            try:
                proc.wait(timeout=delay if reached else 0.001)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        record: dict[str, Any] = {"experiment_kill": j, "aim": aim, "delay_s": delay, "killed": proc.returncode == -9,
                                  "seconds": round(time.monotonic() - started, 1),
                                  "cells_snapshotted_before_kill": cells_snapshotted(console)}
        if not record["killed"]:
            record["note"] = f"the experiment ended (exit {proc.returncode}) before the kill moment"
        record["registry_after_kill"] = registry_check(home)
        rerun = run_and_kill(cmd, _env(home), work / f"exp-kill-{j}.rerun.log", timeout=args.timeout)
        record.update({"rerun_rc": rerun["rc"], "rerun_seconds": rerun["seconds"]})
        if rerun["rc"] != 0:
            record.update({"identical": False, "differences": [{"kind": "rerun failed", "rc": rerun["rc"],
                           "log_tail": (work / f"exp-kill-{j}.rerun.log").read_text(errors="replace")[-1500:]}]})
        else:
            result = experiment_result(home, conf)
            record["differences"] = compare_experiments(reference, result)
            record["cell_counts"] = result.get("cell_counts")
            broken = registry_check(home)["broken"] + record["registry_after_kill"]["broken"]
            if broken:
                record["differences"].append({"kind": "registry alias names an incomplete model", "broken": broken})
            record["identical"] = not record["differences"]
        print(f"  killed: {record['killed']} at {record['seconds']}s; rerun {record['rerun_seconds']}s; "
              f"identical: {record['identical']}", file=sys.stderr)
        runs.append(record)
        if not args.keep:
            _prune(home)
        yield runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=12, help="kills of erg run (each in a fresh home, then a rerun)")
    parser.add_argument("--min-per-stage", type=int, default=2, help="kills go on until every stage was hit this "
                        "many times")
    parser.add_argument("--experiment-kills", type=int, default=2, help="kills of erg experiment (0: none)")
    parser.add_argument("--conf", default="local", help="conf of every run (local: the generated sample)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="conf overrides")
    parser.add_argument("--experiment-training-kills", type=int, default=0, help="more kills of erg experiment, "
                        "each aimed inside the cells' training")
    parser.add_argument("--experiment-conf", default=None, help="conf of the experiment homes' erg run and erg "
                        "experiment (default: --conf, with --set)")
    parser.add_argument("--experiment-set", action="append", default=[], metavar="KEY=VALUE",
                        help="conf overrides of the experiment homes only")
    parser.add_argument("--seed", type=int, default=2021, help="seed of the stages' order and the moments")
    parser.add_argument("--work", type=Path, default=REPO / ".erg-chaos", help="homes of the runs (removed and "
                        "recreated per kill; the references are kept and reused)")
    parser.add_argument("--fresh-reference", action="store_true", help="rerun the references even if they exist")
    parser.add_argument("--fresh-experiment", action="store_true", help="with --resume: keep the recorded kills of "
                        "erg run, but rerun the experiment reference and the experiment kills (the experiment's "
                        "code changed)")
    parser.add_argument("--resume", action="store_true", help="keep the kills already recorded in --out by the same "
                        "command (a session's end or a crash stopped it) and go on after them")
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
    command = " ".join(["python", "benchmarks/chaos.py", "--kills", str(args.kills), "--min-per-stage",
                        str(args.min_per_stage), "--experiment-kills", str(args.experiment_kills), "--conf", args.conf,
                        "--seed", str(args.seed), *[f"--set {s}" for s in args.set]]
                       + (["--experiment-training-kills", str(args.experiment_training_kills)]
                          if args.experiment_training_kills else [])
                       + (["--experiment-conf", args.experiment_conf] if args.experiment_conf else [])
                       + [f"--experiment-set {s}" for s in args.experiment_set])

    ref = reference_run(args, work)
    folders = DeltaFolders()
    runs, exp_runs = prior_records(args.out, command) if args.resume else ([], [])
    if args.fresh_experiment:
        exp_runs = []
    if runs or exp_runs:
        print(f"resuming: {len(runs)} erg run attempts and {len(exp_runs)} experiment kills from {args.out}",
              file=sys.stderr)
    for runs in pipeline_kills(args, work, ref, folders, runs):
        _write(args.out, runs, exp_runs, command, ref, args)
    for exp_runs in (experiment_kills(args, work, exp_runs)
                     if args.experiment_kills + args.experiment_training_kills else ()):
        _write(args.out, runs, exp_runs, command, ref, args)
    _write(args.out, runs, exp_runs, command, ref, args)
    done = [r for r in runs + exp_runs if r["killed"]]
    print(f"{len(done)} kills, {sum(bool(r.get('identical')) for r in done)} identical; {args.out}", file=sys.stderr)
    return 0 if all(r.get("identical") for r in done) else 1


def _pipeline_part(command: str) -> str:
    """``command`` without its experiment options: what the kills of ``erg run`` depend on."""
    return re.sub(r" --experiment-(?:conf|set|training-kills) \S+", "", command)


def _without_training_kills(command: str) -> str:
    """``command`` without ``--experiment-training-kills``: adding kills aimed inside training keeps the others."""
    return re.sub(r" --experiment-training-kills \S+", "", command)


def prior_records(out: Path, command: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The run and experiment records of ``out`` (written by :func:`_write`), each with its differences back in it;
    none unless ``out`` was written by the same ``command`` (the same kills, conf, seed and overrides). The kills
    of ``erg run`` are kept where only the experiment options (``--experiment-conf``, ``--experiment-set``,
    ``--experiment-training-kills``) differ, the experiment kills where the command is the same but for
    ``--experiment-training-kills``."""
    try:
        summary = json.loads(out.read_text())
    except (OSError, ValueError):
        return [], []
    written = summary.get("command") or ""
    if _pipeline_part(written) != _pipeline_part(command):
        print(f"not resuming: {out} was written by `{written}`", file=sys.stderr)
        return [], []
    runs = [{**r, "differences": []} for r in summary.get("runs", [])]
    exp_runs = ([{**r, "differences": []} for r in summary.get("experiment_runs", [])]
                if _without_training_kills(written) == _without_training_kills(command) else [])
    for d in summary.get("differences", []):
        d = dict(d)
        if "kill" in d:
            kill, _ = d.pop("kill"), d.pop("stage_hit", None)
            next(r for r in runs if r["kill"] == kill and r["killed"])["differences"].append(d)
        elif "experiment_kill" in d and exp_runs:
            kill = d.pop("experiment_kill")
            next(r for r in exp_runs if r["experiment_kill"] == kill and r["killed"])["differences"].append(d)
    return runs, exp_runs


def _write(out: Path, runs: list[dict], exp_runs: list[dict], command: str, ref: dict, args) -> None:
    done = [r for r in runs if r["killed"]]
    exp_done = [r for r in exp_runs if r["killed"]]
    per_stage = {s: sum(1 for r in done if r["stage_hit"] == s) for s in STAGES}
    per_stage["experiment"] = len(exp_done)
    aims = {aim: sum(1 for r in exp_done if r.get("aim", "anywhere") == aim) for aim in ("anywhere", "training")}
    differences = ([{"kill": r["kill"], "stage_hit": r["stage_hit"], **d} for r in done for d in r.get("differences", [])]
                   + [{"experiment_kill": r["experiment_kill"], **d} for r in exp_done for d in r.get("differences", [])])
    summary = {
        "kills": len(done) + len(exp_done),
        "kills_per_stage": per_stage,
        "stages_hit": [s for s in (*STAGES, "experiment") if per_stage[s]],
        "identical": sum(1 for r in done + exp_done if r.get("identical")),
        **({"experiment_kills_by_aim": aims} if exp_done else {}),
        "registry_aliases_broken": sum(len(r.get("registry_after_kill", {}).get("broken", []))
                                       + len(r.get("registry_after_rerun", {}).get("broken", [])) for r in done + exp_done),
        "differences": differences,
        "command": command,
        "conf": args.conf,
        **(dict(zip(("experiment_conf", "experiment_overrides"), experiment_conf(args)))
           if getattr(args, "experiment_kills", 0) else {}),
        "rerun": "erg run --incremental; erg experiment (the same command: finished cells are reused)",
        "reference_seconds": ref["seconds"],
        "reference_stage_seconds": {s: round(v, 1) for s, v in ref["windows"].items()},
        "compared": {"tables": list(TABLES), "left_out_columns": sorted(VOLATILE),
                     "float_tolerance": {"rtol": RTOL, "atol": ATOL},
                     "experiment": "every per-seed cell's metrics (run ids, paths, seconds left out)"},
        "runs": [{k: v for k, v in r.items() if k != "differences"} for r in runs],
        "experiment_runs": [{k: v for k, v in r.items() if k != "differences"} for r in exp_runs],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2, default=str) + "\n")


if __name__ == "__main__":
    sys.exit(main())
