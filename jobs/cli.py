"""The ``erg`` command: one sub-command per job, each on a conf (``--conf local|databricks|test|<file>``).

Examples::

    erg sample                       # write the generated sample
    erg ingest                       # ingest conf's sources (the sample when none are listed)
    erg run                          # the whole pipeline on the embedded local default
    erg sql "SELECT style, count(*) FROM erg.stylized_captions GROUP BY style"
    erg history                      # the runs, with the tables and Delta versions each wrote
    erg restore --run RUN_ID         # every table, watermark and current model back to right after that run

A writing command (run, ingest, extract, embed, retrieve, generate, train, experiment, restore, sql --write) holds
the schema's run lock while it runs (:mod:`jobs.platform.lock`): a second one waits up to ``lock.wait_s`` and then
refuses with exit status 2, naming the job that holds it.

A command prints its own lines only: one progress line per stage and a short summary table at the end (``--json``
prints the whole result as JSON instead, for scripts); MLflow's and Spark's chatter goes to a log file under the home
whose path is printed once (``--verbose`` shows it instead; see :mod:`jobs.platform.console`).

A user error (a bad conf, a bad input file, a missing table, a step run before the one it needs; see
:mod:`jobs.platform.errors`) is printed as one or two lines, the problem and the fix, with exit status 2; ``--debug``
(or ``ERG_DEBUG=1``) shows its traceback instead. Any other failure is a bug and shows its traceback (exit status 1).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from jobs.platform import console
from jobs.platform.config import load_config
from jobs.platform.errors import as_user_error

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _print(command: str, result: object, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result, indent=2, default=str), file=console.out())
    else:
        print(console.summary_table(command, result), end="", file=console.out())


def cmd_setup(cfg, args) -> dict:
    from jobs.platform.spark_jars import resolve_delta_jars

    return {"jars": resolve_delta_jars(cfg.spark.jars_dir, quiet=False)}


def cmd_sample(cfg, args) -> dict:
    from jobs.sample import write_sample

    return write_sample(cfg)


def cmd_ingest(cfg, args) -> dict:
    from jobs.ingest import ingest, summary_lines
    from jobs.platform.spark import get_spark

    spark = get_spark(cfg)
    with console.stage("ingest") as stage:
        stage.result = counts = ingest(spark, cfg)
    print("\n".join(["every record read is kept, quarantined or a duplicate:", *summary_lines(counts["sources"])]),
          file=console.err())
    if counts["skipped_sources"]:
        print(f"not read again (same files as the last ingest): {', '.join(counts['skipped_sources'])}",
              file=console.err())
    return counts


def cmd_extract(cfg, args) -> dict:
    from jobs.extract import extract
    from jobs.platform.spark import get_spark

    spark = get_spark(cfg)
    with console.stage("extract") as stage:
        stage.result = extract(spark, cfg, incremental=args.incremental)
    return stage.result


def cmd_embed(cfg, args) -> dict:
    from jobs.embed import embed
    from jobs.platform.spark import get_spark

    spark = get_spark(cfg)
    with console.stage("embed") as stage:
        stage.result = embed(spark, cfg)
    return stage.result


def cmd_retrieve(cfg, args) -> dict:
    from jobs.platform.spark import get_spark
    from jobs.retrieve import retrieve

    spark = get_spark(cfg)
    with console.stage("retrieve") as stage:
        stage.result = retrieve(spark, cfg, incremental=args.incremental)
    return stage.result


def cmd_generate(cfg, args) -> dict:
    from jobs.generate import generate_augmented
    from jobs.platform.spark import get_spark

    spark = get_spark(cfg)
    with console.stage("generate") as stage:
        stage.result = generate_augmented(spark, cfg, incremental=args.incremental)
    return stage.result


def cmd_train(cfg, args) -> dict:
    from jobs.platform.spark import get_spark
    from jobs.train import train

    spark = get_spark(cfg)
    with console.stage("train") as stage:
        stage.result = train(spark, cfg)
    return stage.result


def cmd_evaluate(cfg, args) -> dict:
    from jobs.evaluate import evaluate
    from jobs.platform.spark import get_spark

    spark = get_spark(cfg)
    with console.stage("evaluate") as stage:
        stage.result = evaluate(spark, cfg)
    return stage.result


def cmd_experiment(cfg, args) -> dict:
    from jobs.experiment import run_experiment
    from jobs.platform.spark import get_spark

    result = run_experiment(get_spark(cfg), cfg)
    keep = ("run_id", "styles", "captioners", "not_measured", "leakage", "report_dir", "seconds")
    return {**{k: result.get(k) for k in keep}, "tuning": (result.get("tuning") or {}).get("chosen"),
            "table2": [{k: r[k] for k in ("style", "captioner", "variant", "bleu1", "bleu3", "meteor", "cider",
                                          "cls", "cls_independent", "ppl", "train_pairs")} for r in result["rows"]]}


def _json_value(value):
    import datetime as dt

    if isinstance(value, dt.datetime) and value.tzinfo is not None:  # as Spark hands it over: UTC, naive
        return value.astimezone(dt.timezone.utc).replace(tzinfo=None)
    return value


def cmd_sql(cfg, args) -> None:
    from jobs import sql_fast
    from jobs.platform.errors import UserError

    if not args.write:  # a query: DuckDB answers it where it can (no Spark, no JVM), else Spark as below
        engine, note = sql_fast.route(cfg, args.query, args.engine)
        if engine == "duckdb":
            try:
                result = sql_fast.query(cfg, args.query, limit=args.limit)
            except sql_fast.NotFast as exc:
                if args.engine == "duckdb":
                    raise UserError(f"--engine duckdb cannot run this statement: {exc}",
                                    "leave --engine at auto (Spark runs it)") from None
                note = str(exc)
            else:
                if args.json:
                    for row in result.rows[:args.limit]:
                        print(json.dumps(dict(zip(result.columns, map(_json_value, row))), default=str),
                              file=console.out())
                else:
                    print(sql_fast.show(result, args.limit, args.truncate), end="", file=console.out())
                return
    else:
        note = None
    if not args.debug:
        _quiet_query_logs()
    from jobs.platform.spark import get_spark
    from jobs.sql_access import sql

    df = sql(get_spark(cfg), cfg, args.query, write=args.write)  # a write without --write is refused before it runs
    if args.json:
        for row in df.limit(args.limit).collect():
            print(json.dumps(row.asDict(recursive=True), default=str), file=console.out())
    else:
        # as df.show() prints it, on the terminal's stdout (library output goes to the log file)
        print(df._show_string(args.limit, args.truncate), end="", file=console.out())
    if note:  # after the answer: a statement Spark refuses or fails on gets its own message only
        print(f"erg sql: answered by Spark ({note})", file=console.err())


def cmd_run(cfg, args) -> dict:
    from jobs.pipeline import run_pipeline
    from jobs.platform.spark import get_spark

    return run_pipeline(get_spark(cfg), cfg, incremental=getattr(args, "incremental", False))


def cmd_history(cfg, args) -> None:
    from jobs.platform.history import history, render_history

    rows = history(cfg, args.last)
    if args.json:
        for row in rows:
            print(json.dumps(row, default=str), file=console.out())
    else:
        print(render_history(rows), file=console.out())


def cmd_restore(cfg, args) -> dict:
    from jobs.platform.history import restore
    from jobs.platform.spark import get_spark

    result = restore(get_spark(cfg), cfg, args.run)
    for table, change in result["tables"].items():
        print(f"{table}: {change['action']}" + (f" (version {change['from']} -> {change['to']}, the content of "
                                                f"version {change['as_of']})" if change["action"] == "restored" else ""),
              file=console.err())
    return result


def cmd_compare(cfg, args) -> None:
    from rich.console import Console

    from jobs.compare import compare, render

    try:
        comparison = compare(cfg, args.run_ids or None, args.job, args.last)
    except ValueError as exc:
        raise SystemExit(f"erg compare: {exc}") from None
    render(comparison, Console(file=console.out()))


COMMANDS = {
    "setup": (cmd_setup, "resolve Delta Lake's jars through Maven into spark.jars_dir"),
    "sample": (cmd_sample, "write the generated sample (the embedded default data)"),
    "ingest": (cmd_ingest, "ingest the configured sources into the Delta tables"),
    "extract": (cmd_extract, "fine-tune the style classifier, select the style head, write style_phrases"),
    "embed": (cmd_embed, "embed scenes, factual captions and images not yet embedded by the encoder's version"),
    "retrieve": (cmd_retrieve, "retrieve similar stylized scenes for the factual captions (i2i, i2t, t2i, t2t)"),
    "generate": (cmd_generate, "fine-tune the generator, generate from retrievals, filter, write augmented_captions"),
    "train": (cmd_train, "train a captioner on training_set (original, + augmented with train.use_augmented)"),
    "evaluate": (cmd_evaluate, "score the trained captioners per style (BLEU, METEOR, CIDEr, cls., ppl.): Table 2"),
    "run": (cmd_run, "run the whole pipeline"),
    "experiment": (cmd_experiment, "the paper's evaluation: per style x captioner, original vs augmented, trained, "
                   "decoded and scored (Table 2, Table 5, Fig. 5 report)"),
    "sql": (cmd_sql, "run a SQL query over the erg tables"),
    "compare": (cmd_compare, "MLflow runs side by side: params that differ, counts, pass rates, metrics, tags"),
    "history": (cmd_history, "the writing jobs' runs, newest first, with the tables and Delta versions each wrote"),
    "restore": (cmd_restore, "bring every table, the watermarks and the current models back to right after a run"),
}

#: commands that write the schema (tables, watermarks, current models): each holds the schema's run lock
#: (jobs.platform.lock) while it runs; ``sql`` only with --write
WRITING = frozenset({"ingest", "extract", "embed", "retrieve", "generate", "train", "run", "experiment", "restore",
                     "sql"})


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="erg", description="Extract-Retrieve-Generate on Spark")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (_, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--conf", default=os.environ.get("ERG_CONF", "local"),
                       help="conf name (local, databricks, test) or a .yaml path")
        p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override a conf key, e.g. --set extract.eps=0.3 (repeatable)")
        p.add_argument("--debug", action="store_true", default=os.environ.get("ERG_DEBUG", "") not in ("", "0"),
                       help="show the traceback of a user error (bad conf or input, missing table or step)")
        p.add_argument("--verbose", action="store_true",
                       help="show MLflow's and Spark's own output (INFO/WARN lines, banners) instead of sending it to "
                            "the log file under the home")
        if name == "sql":
            p.add_argument("query")
            p.add_argument("--limit", type=int, default=50)
            p.add_argument("--truncate", type=int, default=60)
            p.add_argument("--json", action="store_true", help="print rows as JSON lines")
            p.add_argument("--engine", choices=("auto", "duckdb", "spark"), default="auto",
                           help="auto (default): a plain SELECT over a local home is answered by DuckDB without "
                                "Spark, anything else by Spark; spark: always Spark; duckdb: DuckDB or fail")
            p.add_argument("--write", action="store_true",
                           help="allow a statement that writes or changes state (INSERT, DELETE, DROP, SET, ...); "
                                "logged to MLflow with the tables' Delta versions before and after")
        if name == "compare":
            p.add_argument("run_ids", nargs="*", metavar="RUN_ID", help="runs to compare (default: a job's last runs)")
            p.add_argument("--job", help="compare this job's last runs (tag erg.job; default: the newest run's job)")
            p.add_argument("--last", type=int, default=2, help="how many of the job's last runs to compare")
        if name == "history":
            p.add_argument("--last", type=int, default=30, help="how many runs (stage runs included)")
        if name == "restore":
            p.add_argument("--run", required=True, metavar="RUN_ID", help="the run to go back to (see erg history)")
        if name not in ("sql", "compare"):
            p.add_argument("--json", action="store_true",
                           help="print the result as JSON (every value) instead of the summary table, for scripts")
        if name in ("run", "extract", "retrieve", "generate"):
            p.add_argument("--incremental", action="store_true", help="process only new stylized/factual rows")
    return parser


def _quiet_query_logs() -> None:
    """PySpark logs every SQL analysis error as a JSON line before raising it; the error's own message says it."""
    import logging

    try:
        from pyspark.logger import PySparkLogger
    except ImportError:
        return
    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        PySparkLogger.getLogger(name).setLevel(logging.CRITICAL)


def _schema_lock(cfg, args, argv: list[str] | None):
    """The schema's run lock (jobs.platform.lock) for a writing command, taken before its tables are touched (a restore
    never waits: it refuses while another job writes); a no-op context for the others."""
    import contextlib

    if args.command not in WRITING or (args.command == "sql" and not args.write) or not cfg.lock.enabled:
        return contextlib.nullcontext()
    from jobs.platform.lock import hold
    from jobs.platform.spark import get_spark

    words = sys.argv[1:] if argv is None else argv
    return hold(get_spark(cfg, register=False), cfg, " ".join(["erg", *words]),
                wait_s=0 if args.command == "restore" else None)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    started = time.time()
    try:
        cfg = load_config(args.conf, args.overrides)
        handler, _ = COMMANDS[args.command]
        # on a cluster the driver's log keeps everything: no log file of our own there
        verbose = args.verbose or cfg.platform != "local"
        with console.Output(cfg.home, args.command, verbose=verbose):
            if not args.debug and args.command != "sql":  # erg sql does it only where it starts Spark
                _quiet_query_logs()
            with _schema_lock(cfg, args, argv):
                result = handler(cfg, args)
            if result is not None:
                _print(args.command, result, getattr(args, "json", False))
    except Exception as exc:
        error = as_user_error(exc, sql=args.command == "sql")
        if error is None or args.debug:
            raise
        lines = error.lines()
        print(f"erg {args.command}: {lines[0]}", file=sys.stderr)
        for line in lines[1:]:
            print(f"  {line}", file=sys.stderr)
        # raised, not returned: Databricks calls the entry point directly and must see the task fail
        raise SystemExit(2) from None
    print(f"erg {args.command}: done in {time.time() - started:.1f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
