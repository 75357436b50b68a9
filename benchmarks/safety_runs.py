"""Safe to share, with the real CLI: two writing runs at once on one home, and undo to a run.

``PARTS = {"concurrency": ..., "restore": ...}``: each part is ``fn(work_dir) -> dict`` and runs ``erg`` commands as
subprocesses on the generated sample (each scenario in a home of its own under ``work_dir``):

- **concurrency.** Three processes started together on one empty home: two ``erg run`` (``lock.wait_s`` 0) and one
  ``erg run --incremental --set lock.wait_s=<long>``. One takes the schema's run lock (:mod:`jobs.platform.lock`); a
  non-waiting one that finds it held exits 2 with a message naming the holder; the waiting one runs after it (an
  incremental run: nothing left to do, or the whole run when it got the lock first). Every table is then compared
  with a serial ``erg run``'s in a home of its own (:func:`benchmarks.chaos.compare_tables`).
- **restore.** ``erg ingest``, ``erg run`` (run R), a bad delivery (a SentiCap file with the wrong sentiments and a
  record without an image, and a file of new factual captions) ingested and a full ``erg run`` over it, then
  ``erg restore --run R``: every table must equal its Delta version that R recorded, and an ``erg run
  --incremental`` afterwards must leave the tables of the serial run that never saw the bad file. Also measured:
  ``erg restore`` refused while the run over the bad delivery holds the lock, and for an unknown run id (exit 2).

``benchmarks/safety.py`` runs them as its parts of the same names (``--runs-conf``, ``--work``) into
``benchmarks/results/safety.json``::

    python benchmarks/safety.py --parts concurrency,restore --runs-conf local --work .erg-safety
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.chaos import DeltaFolders, compare_tables  # noqa: E402

#: the conf every part runs (``safety.py --runs-conf`` sets it); ``local`` is the embedded default on the generated sample
CONF = {"name": "local", "overrides": []}
TIMEOUT = 4 * 3600


def _env(home: Path) -> dict:
    return {**os.environ, "ERG_HOME": str(home), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _command(args: list[str], conf: str | None = None) -> list[str]:
    sets = [x for item in CONF["overrides"] for x in ("--set", item)]
    return [sys.executable, "-m", "jobs.cli", args[0], "--conf", conf or CONF["name"], *sets, *args[1:]]


def _start(args: list[str], home: Path, log: Path, conf: str | None = None) -> tuple[subprocess.Popen, float]:
    return (subprocess.Popen(_command(args, conf), cwd=str(REPO), env=_env(home), stdout=log.open("w"),
                             stderr=subprocess.STDOUT, start_new_session=True), time.monotonic())


def _finish(proc: subprocess.Popen, started: float, log: Path, args: list[str]) -> dict[str, Any]:
    rc = proc.wait(timeout=TIMEOUT)
    text = log.read_text(errors="replace")
    lines = [line for line in text.splitlines() if line.startswith(("erg ", "  fix:", "erg: "))]
    return {"command": "erg " + " ".join(args), "rc": rc, "seconds": round(time.monotonic() - started, 1),
            "messages": lines[-6:], "traceback": "Traceback (most recent call last)" in text, "log": str(log)}


def _erg(args: list[str], home: Path, log: Path, conf: str | None = None) -> dict[str, Any]:
    proc, started = _start(args, home, log, conf)
    return _finish(proc, started, log, args)


def _fresh(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def _json_out(log: Path) -> Any:
    """The JSON an ``erg`` command printed (its result, indented, from a line "{" to a line "}"), from its log."""
    lines = log.read_text(errors="replace").splitlines()
    start = max(i for i, line in enumerate(lines) if line == "{")
    end = next(i for i in range(start, len(lines)) if lines[i] == "}")
    return json.loads("\n".join(lines[start:end + 1]))


def serial_reference(work_dir: Path) -> Path:
    """A home where ``erg run`` ran alone on the sample (made once per work folder and conf)."""
    home = work_dir / "serial"
    marker = home / "serial.json"
    if marker.exists() and json.loads(marker.read_text()).get("conf") == CONF:
        return home
    _fresh(home)
    result = _erg(["run"], home, work_dir / "serial.log")
    if result["rc"] != 0:
        raise SystemExit(f"the serial reference run failed (exit {result['rc']}); see {work_dir / 'serial.log'}")
    marker.write_text(json.dumps({"conf": CONF, "seconds": result["seconds"]}))
    return home


def _compare(work_dir: Path, reference: Callable, other: Callable, homes: tuple[str, ...]) -> dict[str, Any]:
    result = compare_tables(reference, other, homes=homes)
    return {"identical": result["identical"], "rows": result["rows"], "differences": result["differences"][:20]}


_FOLDERS = DeltaFolders()


def _versions_loader(work_dir: Path, home: Path, versions: dict[str, int]) -> Callable:
    def load(table: str):
        path = home / "warehouse" / "erg" / table
        return (_FOLDERS.spark(work_dir).read.format("delta").option("versionAsOf", versions[table])
                .load(str(path)).toPandas())
    return load


# -------------------------------------------------------------------------------------------- concurrency
def concurrency(work_dir: Path) -> dict[str, Any]:
    work_dir = work_dir.resolve()
    home = _fresh(work_dir / "concurrency")
    logs = work_dir / "concurrency-logs"
    _fresh(logs)
    sample = _erg(["sample"], home, logs / "sample.log")  # the sample once, before the runs race
    commands = {"run_a": ["run"], "run_b": ["run"],
                "waiter": ["run", "--incremental", "--set", f"lock.wait_s={TIMEOUT}"]}
    procs = {name: _start(args, home, logs / f"{name}.log") for name, args in commands.items()}
    runs = {name: _finish(proc, started, logs / f"{name}.log", commands[name])
            for name, (proc, started) in procs.items()}
    pids = {name: proc.pid for name, (proc, _) in procs.items()}
    refused = [n for n, r in runs.items() if r["rc"] == 2]
    reference = serial_reference(work_dir)
    comparison = _compare(work_dir, _FOLDERS.loader(work_dir, reference), _FOLDERS.loader(work_dir, home),
                          (str(reference), str(home)))
    ok = (sample["rc"] == 0 and runs["waiter"]["rc"] == 0 and sorted(runs[n]["rc"] for n in ("run_a", "run_b"))
          in ([0, 2], [2, 2]) and all(not runs[n]["traceback"] for n in refused) and comparison["identical"])
    return {"design": "a lock row in the Delta table <schema>.run_lock, taken by a conditional MERGE (Delta's "
                      "optimistic concurrency decides between two takers); the second refuses (exit 2) or waits "
                      "(lock.wait_s)",
            "started_together": {n: " ".join(["erg", *a]) for n, a in commands.items()}, "pids": pids,
            "runs": runs, "refused": refused, "tables_vs_serial_run": comparison, "ok": ok}


# ------------------------------------------------------------------------------------------------ restore
def bad_delivery(folder: Path) -> list[dict[str, Any]]:
    """A SentiCap file with the sentiments swapped (and one record with no image) and new factual captions."""
    folder.mkdir(parents=True, exist_ok=True)
    images = [{"imgid": 90000 + i, "split": "train", "filename": f"COCO_train2014_00000099{i:04d}.png",
               "sentences": [{"raw": f"a miserable dirty {animal} sits in the gloomy snow.", "sentiment": 1},
                             {"raw": f"a lovely happy {animal} plays on the wonderful beach.", "sentiment": 0}]}
              for i, animal in enumerate(["dog", "cat", "horse", "bird", "boy", "girl"])]
    images.append({"imgid": 99999, "split": "train", "filename": "", "sentences": [{"raw": "no image", "sentiment": 0}]})
    (folder / "bad_senticap.json").write_text(json.dumps({"images": images}))
    (folder / "bad_factual.txt").write_text("".join(
        f"99000{i:05d}_bad.jpg#{j}\ta {animal} is {verb} near the {place} {('again', 'today')[j]} .\n"
        for i, (animal, verb, place) in enumerate([("dog", "running", "water"), ("cat", "sitting", "street"),
                                                   ("man", "jumping", "field"), ("woman", "walking", "park"),
                                                   ("child", "playing", "garden")]) for j in range(2)))
    return [{"format": "senticap_json", "path": str(folder / "bad_senticap.json"), "name": "bad_senticap"},
            {"format": "flickr30k_tokens", "path": str(folder / "bad_factual.txt"), "name": "bad_flickr30k"}]


def _bad_conf(home: Path, folder: Path) -> Path:
    """A conf file: the run's conf, with the sample's sources and the bad delivery listed as ingest.sources."""
    from jobs.platform.config import load_config
    from jobs.sample import sample_sources

    os.environ["ERG_HOME"] = str(home)
    cfg = load_config(CONF["name"], CONF["overrides"])
    sources = [s.model_dump(exclude_none=True) for s in sample_sources(cfg)] + bad_delivery(folder)
    path = folder / "with_bad_delivery.yaml"
    path.write_text(json.dumps({"extends": CONF["name"], "name": "with_bad_delivery",
                                "ingest": {"sources": sources}}, indent=1))
    return path


def _history(home: Path, log: Path) -> list[dict[str, Any]]:
    result = _erg(["history", "--json", "--last", "200"], home, log)
    if result["rc"] != 0:
        raise RuntimeError(f"erg history failed; see {log}")
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]


def restore(work_dir: Path) -> dict[str, Any]:
    work_dir = work_dir.resolve()
    home = _fresh(work_dir / "restore")
    logs = _fresh(work_dir / "restore-logs")
    steps: dict[str, dict[str, Any]] = {}
    steps["ingest"] = _erg(["ingest"], home, logs / "ingest.log")
    steps["run"] = _erg(["run", "--json"], home, logs / "run.log")  # --json: the result, read below
    first = _json_out(logs / "run.log")["parent_run_id"]
    recorded = next(r for r in _history(home, logs / "history1.log") if r["run_id"] == first)
    bad = _bad_conf(home, home / "bad_delivery")
    steps["ingest_bad"] = _erg(["ingest"], home, logs / "ingest_bad.log", conf=str(bad))
    # the run over the bad delivery; while it holds the lock (its first stage banner is printed under it), a
    # restore is tried: refused
    proc, started = _start(["run"], home, logs / "run_bad.log", conf=str(bad))
    while proc.poll() is None and "1/5 ingest" not in (logs / "run_bad.log").read_text(errors="replace"):
        time.sleep(0.5)
    steps["restore_while_running"] = _erg(["restore", "--run", first], home, logs / "restore_refused.log")
    steps["restore_while_running"]["run_still_in_flight_after"] = proc.poll() is None
    steps["run_bad"] = _finish(proc, started, logs / "run_bad.log", ["run", "--conf", str(bad)])
    damaged = _compare(work_dir, _versions_loader(work_dir, home, recorded["versions"]),
                       _FOLDERS.loader(work_dir, home), (str(home),))
    steps["restore_unknown_run"] = _erg(["restore", "--run", "no-such-run"], home, logs / "restore_unknown.log")

    steps["restore"] = _erg(["restore", "--run", first, "--json"], home, logs / "restore.log")
    restored = _json_out(logs / "restore.log") if steps["restore"]["rc"] == 0 else {}
    after_restore = _compare(work_dir, _versions_loader(work_dir, home, recorded["versions"]),
                             _FOLDERS.loader(work_dir, home), (str(home),))
    steps["run_incremental"] = _erg(["run", "--incremental"], home, logs / "run_incremental.log")
    reference = serial_reference(work_dir)
    after_rerun = _compare(work_dir, _FOLDERS.loader(work_dir, reference), _FOLDERS.loader(work_dir, home),
                           (str(reference), str(home)))
    history_rows = _history(home, logs / "history2.log")
    ok = (all(steps[s]["rc"] == 0 for s in ("ingest", "run", "ingest_bad", "run_bad", "restore", "run_incremental"))
          and steps["restore_while_running"]["rc"] == 2 and steps["restore_unknown_run"]["rc"] == 2
          and not damaged["identical"] and after_restore["identical"] and after_rerun["identical"])
    return {"first_run": first, "first_run_versions": recorded["versions"], "steps": steps,
            "damage_before_restore": {"identical": damaged["identical"],
                                      "tables_differing": sorted({d["table"] for d in damaged["differences"]})},
            "restore": {k: restored.get(k) for k in ("tables", "watermarks", "watermarks_reset", "models")},
            "after_restore_vs_first_run": after_restore,
            "after_incremental_vs_run_without_bad_file": after_rerun,
            "history": [{k: r[k] for k in ("run_id", "job", "parent_run_id", "status", "written")}
                        for r in history_rows],
            "ok": ok}


PARTS: dict[str, Callable[[Path], dict[str, Any]]] = {"concurrency": concurrency, "restore": restore}

