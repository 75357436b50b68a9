"""The ``erg`` command: one sub-command per job, each on a conf (``--conf local|databricks|test|<file>``).

Examples::

    erg sample                       # write the generated sample
    erg ingest                       # ingest conf's sources (the sample when none are listed)
    erg run                          # the whole pipeline on the embedded local default
    erg sql "SELECT style, count(*) FROM erg.stylized_captions GROUP BY style"
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from jobs.config import ConfigError, load_config

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _print(result: object) -> None:
    print(json.dumps(result, indent=2, default=str))


def cmd_setup(cfg, args) -> dict:
    from jobs.spark_jars import resolve_delta_jars

    return {"jars": resolve_delta_jars(cfg.spark.jars_dir, quiet=False)}


def cmd_sample(cfg, args) -> dict:
    from jobs.sample import write_sample

    return write_sample(cfg)


def cmd_ingest(cfg, args) -> dict:
    from jobs.ingest import ingest
    from jobs.spark import get_spark

    return ingest(get_spark(cfg), cfg)


def cmd_sql(cfg, args) -> None:
    from jobs.spark import get_spark

    spark = get_spark(cfg)
    df = spark.sql(args.query)
    if args.json:
        for row in df.limit(args.limit).collect():
            print(json.dumps(row.asDict(recursive=True), default=str))
    else:
        df.show(args.limit, truncate=args.truncate)


def cmd_run(cfg, args) -> dict:
    from jobs.pipeline import run_pipeline
    from jobs.spark import get_spark

    return run_pipeline(get_spark(cfg), cfg, incremental=getattr(args, "incremental", False))


COMMANDS = {
    "setup": (cmd_setup, "resolve Delta Lake's jars through Maven into spark.jars_dir"),
    "sample": (cmd_sample, "write the generated sample (the embedded default data)"),
    "ingest": (cmd_ingest, "ingest the configured sources into the Delta tables"),
    "run": (cmd_run, "run the whole pipeline"),
    "sql": (cmd_sql, "run a SQL query over the erg tables"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="erg", description="Extract-Retrieve-Generate on Spark")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (_, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--conf", default=os.environ.get("ERG_CONF", "local"),
                       help="conf name (local, databricks, test) or a .yaml path")
        p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override a conf key, e.g. --set extract.eps=0.3 (repeatable)")
        if name == "sql":
            p.add_argument("query")
            p.add_argument("--limit", type=int, default=50)
            p.add_argument("--truncate", type=int, default=60)
            p.add_argument("--json", action="store_true", help="print rows as JSON lines")
        if name == "run":
            p.add_argument("--incremental", action="store_true", help="process only new stylized/factual rows")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cfg = load_config(args.conf, args.overrides)
    except ConfigError as exc:
        print(f"erg: {exc}", file=sys.stderr)
        return 2
    handler, _ = COMMANDS[args.command]
    started = time.time()
    result = handler(cfg, args)
    if result is not None:
        _print(result)
    print(f"erg {args.command}: done in {time.time() - started:.1f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
