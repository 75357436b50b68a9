"""ERG's yield at volume on the real corpora: retrieval hits, candidates and passing pairs per style, from P alone
and from the train images' scene descriptions as queries (``retrieve.train_descriptions_as_queries``).

Reads the tables of a real-data home after ``erg run --conf conf/shared_data.yaml`` (or its stages):

    ERG_HOME=.erg-real python benchmarks/volume.py --conf conf/shared_data.yaml

A query's hits do not depend on the other queries (top-k per query and retrieval type over the train scenes), so
the P-only yield ("without the descriptions") is the P rows of the same run. Writes
``benchmarks/results/volume.{json,md}`` (the command inside): per style and query source, the queries with a hit,
the hits (similarity > retrieve.min_similarity), the candidates generated and the pairs passing every filter of
the current generator, the pass rate of each filter, and the issue's targets (>= 5,000 passing pairs for humor and
romantic, >= 10,000 for positive and negative).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGETS = {"humor": 5000, "romantic": 5000, "positive": 10000, "negative": 10000}
FILTERS = ("passed_style", "passed_perplexity", "passed_similarity", "passed_content", "passed_well_formed",
           "passed_visual")


def measure(spark, cfg) -> dict:
    """The yield tables (Spark aggregations; only the per-style counts reach the driver)."""
    from pyspark.sql import functions as F

    from jobs.platform.model_store import get_current
    from jobs.platform.tables import DESCRIPTION_QUERY_SOURCE, query_captions, read_table

    queries = query_captions(spark, cfg).select(F.col("caption_id").alias("query_id"), "source")
    source = F.when(F.col("source") == DESCRIPTION_QUERY_SOURCE, "train_descriptions").otherwise("P")
    queries = queries.withColumn("query_source", source).select("query_id", "query_source")
    query_counts = {r["query_source"]: r["count"] for r in queries.groupBy("query_source").count().collect()}
    scenes = read_table(spark, cfg, "stylized_captions").select("scene_id", "style")
    hits = read_table(spark, cfg, "retrievals").join(scenes, "scene_id").join(queries, "query_id")
    out: dict = {"queries": query_counts, "styles": {}}
    for r in (hits.groupBy("style", "query_source")
              .agg(F.count(F.lit(1)).alias("hits"), F.countDistinct("query_id").alias("queries_with_a_hit"))
              .collect()):
        out["styles"].setdefault(r["style"], {}).setdefault(r["query_source"], {}).update(
            {"hits": r["hits"], "queries_with_a_hit": r["queries_with_a_hit"]})
    current = get_current(cfg, "generator")
    if current is not None:
        out["generator_version"] = current["version"]
        rows = (read_table(spark, cfg, "augmented_captions").where(F.col("generator_version") == current["version"])
                .join(queries, "query_id"))
        aggs = [F.count(F.lit(1)).alias("candidates"), F.sum(F.col("passed").cast("int")).alias("passed")]
        aggs += [F.avg(F.col(f).cast("double")).alias(f) for f in FILTERS]
        for r in rows.groupBy("style", "query_source").agg(*aggs).collect():
            entry = out["styles"].setdefault(r["style"], {}).setdefault(r["query_source"], {})
            entry.update({"candidates": r["candidates"], "passed": r["passed"] or 0,
                          "pass_rate": (r["passed"] or 0) / r["candidates"] if r["candidates"] else None,
                          "filter_pass_rates": {f: r[f] for f in FILTERS}})
    for style, by_source in out["styles"].items():
        total = {k: sum(v.get(k, 0) or 0 for v in by_source.values())
                 for k in ("hits", "queries_with_a_hit", "candidates", "passed")}
        p_only = by_source.get("P", {})
        generated = current is not None and total["candidates"] > 0
        out["styles"][style] = {**by_source, "all": total,
                                "target_passed": TARGETS.get(style),
                                "meets_target": (total["passed"] >= TARGETS[style])
                                if style in TARGETS and generated else None,
                                "meets_target_without_descriptions": (p_only.get("passed", 0) >= TARGETS[style])
                                if style in TARGETS and generated else None}
    return out


def render(result: dict) -> str:
    lines = ["# ERG's yield at volume (real corpora)", "", f"- command: `{result['command']}`",
             f"- queries: {result['queries']}", f"- generator: {result.get('generator_version')}", "",
             "| style | queries from | queries with a hit | hits | candidates | passing pairs | pass rate |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for style in sorted(result["styles"]):
        entry = result["styles"][style]
        for source in ("P", "train_descriptions", "all"):
            e = entry.get(source) or {}
            rate = e.get("pass_rate") if source != "all" else (
                e["passed"] / e["candidates"] if e.get("candidates") else None)
            lines.append(f"| {style} | {source} | {e.get('queries_with_a_hit', 0):,} | {e.get('hits', 0):,} | "
                         f"{e.get('candidates', 0):,} | {e.get('passed', 0):,} | "
                         + (f"{rate:.3f}" if rate is not None else "-") + " |")
    def verdict(style: str) -> str:
        met = result["styles"].get(style, {}).get("meets_target")
        return "not measured: nothing generated yet" if met is None else ("met" if met else "not met")

    lines += ["", "Targets (passing pairs): " + ", ".join(f"{s} >= {t:,} ({verdict(s)})" for s, t in TARGETS.items())]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conf", default="conf/shared_data.yaml")
    parser.add_argument("--out", default="benchmarks/results/volume")
    parser.add_argument("--set", action="append", default=[], help="conf overrides, key=value")
    args = parser.parse_args()
    from jobs.platform.config import load_config
    from jobs.platform.spark import get_spark
    from jobs.platform.tables import register_tables

    cfg = load_config(args.conf, ["spark.show_progress=false", *args.set])
    spark = get_spark(cfg)
    register_tables(spark, cfg)
    result = {"command": "ERG_HOME=" + os.environ.get("ERG_HOME", ".erg") + " python "
              + " ".join(shlex.quote(a) for a in sys.argv), **measure(spark, cfg)}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    out.with_suffix(".md").write_text(render(result))
    print(render(result))


if __name__ == "__main__":
    main()
