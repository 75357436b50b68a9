"""Is it safe to share a home? ``erg sql``'s read-only guarantee and its speed, measured on a home's real tables.

Writes (merges into) ``benchmarks/results/safety.json``: each part's entry is replaced when it is measured again,
the others keep theirs, each with the command line that measured it (``commands``). Parts (:data:`PARTS`; pick
some with ``--parts``):

- ``sql_refusals``: every kind of write (INSERT, UPDATE, DELETE, MERGE, CREATE, DROP, ALTER, TRUNCATE, RESTORE,
  OPTIMIZE, VACUUM, SET TBLPROPERTIES, CACHE) and tricky forms of one (after a comment, as a second statement,
  inside a CTE, in odd case, ...) tried through the real ``erg sql`` CLI, one subprocess each, on both paths
  (``--engine auto``: the fast path, which refuses by DuckDB's parser; ``--engine spark``: Spark's parser). A
  statement counts as refused when the process exits 2 with an ``erg sql: refused`` (or syntax error) line and no
  traceback. Every table's Delta version, row count and files are compared before and after.
- ``concurrency`` and ``restore`` (:mod:`benchmarks.safety_runs`): two writing runs started together on one
  home, and ``erg restore --run`` after a bad delivery, with real ``erg`` processes on ``--runs-conf`` (the
  generated sample by default) in homes of their own under ``--work``.
- ``sql_speed``: wall-clock seconds of the ``erg sql`` CLI (a subprocess, start-up included) for the README's
  example query, the median of ``--repeats`` runs on the fast path against the Spark path in the same run, and
  whether both printed the same rows.

Run it from the repository root on the home to measure, e.g.
``python benchmarks/safety.py --home .erg-real --conf shared_data``. The write statements target
``--target-table`` (default ``quarantine``); they are all meant to be refused, so run it on a copy of a home you
cannot rebuild. More parts are added to :data:`PARTS` by name.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

README_QUERY = "SELECT style, count(*) FROM {schema}.augmented_captions GROUP BY style"

#: one statement of every kind of write, on the target table ``{t}`` of the schema ``{s}``
WRITE_KINDS = {
    "INSERT": "INSERT INTO {t} SELECT * FROM {t}",
    "UPDATE": "UPDATE {t} SET reason = 'changed'",
    "DELETE": "DELETE FROM {t} WHERE true",
    "MERGE": "MERGE INTO {t} a USING {t} b ON a.quarantine_id = b.quarantine_id WHEN MATCHED THEN DELETE",
    "CREATE": "CREATE TABLE {s}.safety_probe (a INT) USING DELTA",
    "CREATE AS SELECT": "CREATE TABLE {s}.safety_probe USING DELTA AS SELECT * FROM {t}",
    "DROP": "DROP TABLE {t}",
    "ALTER": "ALTER TABLE {t} ADD COLUMNS (probe INT)",
    "TRUNCATE": "TRUNCATE TABLE {t}",
    "RESTORE": "RESTORE TABLE {t} TO VERSION AS OF 0",
    "OPTIMIZE": "OPTIMIZE {t}",
    "VACUUM": "VACUUM {t}",
    "SET TBLPROPERTIES": "ALTER TABLE {t} SET TBLPROPERTIES ('owner' = 'someone')",
    "CACHE": "CACHE TABLE {t}",
}
#: the same writes written so that a naive check would miss them
TRICKY_FORMS = {
    "after a block comment": "/* only a look */ DELETE FROM {t} -- really\n WHERE true",
    "after a line comment": "-- SELECT 1\nDELETE FROM {t}",
    "as a second statement": "SELECT 1; DROP TABLE {t}",
    "after a query and a comment": "SELECT count(*) FROM {t}; /* and then */ TRUNCATE TABLE {t}",
    "inside a CTE": "WITH x AS (SELECT * FROM {t}) INSERT INTO {t} SELECT * FROM x",
    "odd case": "dElEtE fRoM {t} wHeRe TrUe",
    "odd case MERGE": "mErGe InTo {t} a UsInG {t} b On a.quarantine_id = b.quarantine_id WhEn MaTcHeD ThEn DeLeTe",
    "a session setting": "SET spark.sql.shuffle.partitions = 3",
    "COPY to a file": "COPY (SELECT * FROM {t}) TO '/tmp/erg_safety_probe.csv'",
    "ATTACH a database": "ATTACH '/tmp/erg_safety_probe.db' AS probe",
}
ENGINES = ("auto", "spark")


def erg_sql(args: argparse.Namespace, statement: str, engine: str, *extra: str) -> dict[str, Any]:
    """``erg sql`` in a subprocess on the home: exit status, seconds, stdout, stderr."""
    sets = [item for value in args.overrides for item in ("--set", value)]
    cmd = [sys.executable, "-m", "jobs.cli", "sql", "--conf", args.conf, *sets, "--engine", engine, *extra, statement]
    env = {**os.environ, "ERG_HOME": str(args.home), "PYTHONPATH": str(REPO)}
    started = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=args.timeout)
    return {"rc": done.returncode, "seconds": time.perf_counter() - started, "out": done.stdout, "err": done.stderr}


def table_state(cfg) -> dict[str, dict[str, Any]]:
    """Per table: its latest Delta version (from the log), its row count (delta-kernel reader, no Spark) and a
    digest of its files (names, sizes, modification times)."""
    from jobs.sql_fast import TABLE_NAMES, read_delta, table_folder

    state: dict[str, dict[str, Any]] = {}
    for table in TABLE_NAMES:
        folder = table_folder(cfg, table)
        if not (folder / "_delta_log").is_dir():
            continue
        commits = sorted(int(p.stem) for p in (folder / "_delta_log").glob("*.json") if p.stem.isdigit())
        files = sorted((str(p.relative_to(folder)), p.stat().st_size, p.stat().st_mtime_ns)
                       for p in folder.rglob("*") if p.is_file())
        state[table] = {"version": commits[-1] if commits else None, "rows": read_delta(folder).num_rows,
                        "files": len(files), "digest": hashlib.sha256(json.dumps(files).encode()).hexdigest()[:16]}
    probe = table_folder(cfg, "safety_probe")
    state["safety_probe_exists"] = {"exists": probe.exists()}
    return state


def refused(run: dict[str, Any]) -> bool:
    """Exit status 2, the refusal (or a syntax error, Spark's answer to a second statement) and no traceback."""
    lines = run["err"].splitlines()
    return (run["rc"] == 2 and "Traceback" not in run["err"]
            and any(line.startswith(("erg sql: refused", "erg sql: SQL syntax error")) for line in lines))


def part_sql_refusals(args: argparse.Namespace) -> dict[str, Any]:
    cfg = _config(args)
    schema = cfg.tables.schema_name
    target = f"{schema}.{args.target_table}"
    statements = {**{f"write: {k}": v for k, v in WRITE_KINDS.items()},
                  **{f"tricky: {k}": v for k, v in TRICKY_FORMS.items()}}
    statements = {k: v.format(t=target, s=schema) for k, v in statements.items()}
    before = table_state(cfg)
    per_engine: dict[str, Any] = {}
    for engine in args.engines:
        outcomes = {}
        for kind, statement in statements.items():
            run = erg_sql(args, statement, engine)
            outcomes[kind] = {"refused": refused(run), "rc": run["rc"], "seconds": round(run["seconds"], 2),
                              "message": next((line for line in run["err"].splitlines()
                                               if line.startswith("erg sql:")), run["err"][-300:])}
            print(f"sql_refusals [{engine}] {kind}: {'refused' if outcomes[kind]['refused'] else 'NOT REFUSED'} "
                  f"({run['seconds']:.1f}s)", file=sys.stderr)
        per_engine[engine] = {
            "tried": len(outcomes), "refused": sum(o["refused"] for o in outcomes.values()),
            "not_refused": [k for k, o in outcomes.items() if not o["refused"]],
            "median_seconds": statistics.median(o["seconds"] for o in outcomes.values()),
            "statements": outcomes}
    after = table_state(cfg)
    return {"home": str(args.home), "conf": args.conf, "target": target,
            "statements": statements, "engines": per_engine,
            "tables_unchanged": before == after, "tables_before": before,
            **({} if before == after else {"tables_after": after})}


def _rows(text: str) -> list[str]:
    """The data lines of a printed table, sorted (the query has no ORDER BY)."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    return sorted(lines[1:])


def part_sql_speed(args: argparse.Namespace) -> dict[str, Any]:
    cfg = _config(args)
    query = README_QUERY.format(schema=cfg.tables.schema_name)
    runs: dict[str, list[dict[str, Any]]] = {engine: [] for engine in args.engines}
    for _ in range(args.repeats):  # alternated, so that both paths see the same machine load
        for engine in args.engines:
            run = erg_sql(args, query, engine)
            if run["rc"] != 0:
                raise RuntimeError(f"erg sql --engine {engine} exited {run['rc']}: {run['err'][-2000:]}")
            runs[engine].append(run)
            print(f"sql_speed [{engine}] {run['seconds']:.2f}s", file=sys.stderr)
    result: dict[str, Any] = {"home": str(args.home), "conf": args.conf, "query": query, "repeats": args.repeats}
    for engine, done in runs.items():
        seconds = [r["seconds"] for r in done]
        result[engine] = {"median_seconds": statistics.median(seconds), "seconds": [round(s, 3) for s in seconds],
                          "answered_by_spark_note": any("answered by Spark" in r["err"] for r in done),
                          "rows": _rows(done[0]["out"])}
    if {"auto", "spark"} <= set(runs):
        result["same_rows"] = result["auto"]["rows"] == result["spark"]["rows"]
        result["spark_over_fast"] = result["spark"]["median_seconds"] / result["auto"]["median_seconds"]
        result["fast_within_3s"] = result["auto"]["median_seconds"] <= 3.0
    return result


def runs_part(name: str) -> Callable[[argparse.Namespace], dict[str, Any]]:
    """A part of :mod:`benchmarks.safety_runs` (real ``erg`` processes in homes of their own under ``--work``, on
    ``--runs-conf``), as a part of this file."""
    def part(args: argparse.Namespace) -> dict[str, Any]:
        from benchmarks import safety_runs

        safety_runs.CONF.update(name=args.runs_conf, overrides=list(args.runs_set))
        args.work.mkdir(parents=True, exist_ok=True)
        return {"conf": args.runs_conf, "overrides": list(args.runs_set), **safety_runs.PARTS[name](args.work)}
    return part


#: the parts, by name: each takes the parsed arguments and returns its entry of safety.json
PARTS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "sql_refusals": part_sql_refusals,
    "sql_speed": part_sql_speed,
    "concurrency": runs_part("concurrency"),
    "restore": runs_part("restore"),
}


def _config(args: argparse.Namespace):
    from jobs.platform.config import load_config

    os.environ["ERG_HOME"] = str(args.home)
    return load_config(args.conf, args.overrides)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument("--home", type=Path, default=REPO / ".erg", help="the ERG home whose tables are measured")
    parser.add_argument("--conf", default="local", help="the conf the home was built with (e.g. shared_data)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="a conf override of the home (e.g. tables.schema=...), passed on to erg sql")
    parser.add_argument("--engines", default=",".join(ENGINES), help="erg sql --engine values to compare")
    parser.add_argument("--repeats", type=int, default=5, help="runs per path of sql_speed (the median is kept)")
    parser.add_argument("--target-table", default="quarantine", help="the table the write statements name")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one erg sql may take")
    parser.add_argument("--work", type=Path, default=REPO / ".erg-safety",
                        help="homes of the concurrency and restore parts' runs")
    parser.add_argument("--runs-conf", default="local",
                        help="conf of the concurrency and restore parts' erg commands (local: the generated sample)")
    parser.add_argument("--runs-set", action="append", default=[], metavar="KEY=VALUE",
                        help="a conf override of those commands")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "safety.json")
    args = parser.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if unknown := sorted(set(parts) - set(PARTS)):
        parser.error(f"unknown parts {unknown}: choose from {', '.join(PARTS)}")
    args.engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    args.home = args.home.resolve()
    command = "python benchmarks/safety.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    result: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    result.setdefault("commands", {})
    for part in parts:
        started = time.perf_counter()
        result[part] = PARTS[part](args)
        result[part]["part_seconds"] = round(time.perf_counter() - started, 1)
        result["commands"][part] = command
        result["machine"] = {"cpus": os.cpu_count(), "load_average": os.getloadavg()}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
        print(f"wrote {part} to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
