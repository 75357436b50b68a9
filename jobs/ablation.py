"""Ablations of ERG's idea for ``erg experiment`` (``experiment.ablations``): do *similar* scenes matter?

Each ablation makes augmented pairs another way from ERG's own candidates (the rows the current generator wrote
into ``augmented_captions``, passing or not: the same factual captions, target styles and retrieval types), passes
them through generate's filters (:func:`jobs.generate.score_generated`) and hands the passing ones to the experiment,
which trains them at ERG's pair count per style:

- ``random_scene``: each candidate takes the phrase of a random train scene of its target style (chosen by a hash of
  the candidate's key) instead of the retrieved scene's, then the same generator and decoding;
- ``graft``: the retrieved scene's transfer phrase appended to the factual caption, no generator
  (:func:`models.generator.graft`).

Per style, the candidates tried are the lowest hash of ERG's, ``candidate_margin`` x ERG's pool / ERG's pass rate
of that style (all of them where fewer). The scored rows are kept as a Delta table under
``<home>/models/ablation/<key>`` (the key: generator, classifiers, ablation, candidates per style), so a rerun
reuses them. Only train scenes' phrases are used: the experiment's leakage counters cover the ablation pairs too.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from jobs.generate import (CANDIDATE_COLUMNS, PHRASE_COLUMNS, VISUAL_CONTEXT_COLUMNS, apply_generator, ddl_of,
                           score_generated, train_scene_phrases)
from jobs.platform.config import ErgConfig
from jobs.platform.model_store import model_dir
from jobs.platform.tables import read_table
from udfs.generation import make_grafter

logger = logging.getLogger(__name__)

ABLATION_PREFIX = "ablation:"


def candidates_per_style(erg_counts: dict[str, tuple[int, int]], pool: dict[str, int], margin: float
                         ) -> dict[str, int]:
    """Per style, the ERG candidates an ablation tries: ``margin`` x the pool / ERG's pass rate, at most all of
    them (``erg_counts[style]`` = (candidates, passing))."""
    out = {}
    for style, size in pool.items():
        total, passing = erg_counts.get(style, (0, 0))
        rate = max(passing / total, 0.05) if total else 1.0
        out[style] = min(total, int(math.ceil(margin * size / rate)))
    return out


def erg_candidates(spark: SparkSession, cfg: ErgConfig, generator_version: str, per_style: dict[str, int]
                   ) -> DataFrame:
    """ERG's candidates of ``generator_version`` (every row it wrote), the lowest hash of their key first, at most
    ``per_style[style]`` per style: candidate columns less the phrase."""
    rows = (read_table(spark, cfg, "augmented_captions").where(F.col("generator_version") == generator_version)
            .where(F.col("style").isin(list(per_style))))
    limits = spark.createDataFrame([(s, int(n)) for s, n in per_style.items()], "style string, _limit int")
    order = Window.partitionBy("style").orderBy(F.xxhash64("query_id", "scene_id", "retrieval_type"), "query_id",
                                                "scene_id", "retrieval_type")
    return (rows.withColumn("_n", F.row_number().over(order)).join(F.broadcast(limits), "style")
            .where(F.col("_n") <= F.col("_limit"))
            .select("query_id", "image_id", "image_uri", "factual_caption", "scene_id", "retrieval_type", "style",
                    "similarity"))


def random_scene_candidates(base: DataFrame, phrases: DataFrame) -> DataFrame:
    """Each candidate with the phrase of a random train scene of its style instead of its retrieved scene's: the
    scene numbered ``hash(candidate key) mod n`` among the style's n scenes (numbered by a hash of the scene id)."""
    numbered = phrases.withColumn("_k", F.row_number().over(
        Window.partitionBy("style").orderBy(F.xxhash64("scene_id"), "scene_id")) - 1)
    sizes = phrases.groupBy("style").agg(F.count(F.lit(1)).alias("_scenes"))
    drawn = (base.join(F.broadcast(sizes), "style")
             .withColumn("_k", F.pmod(F.xxhash64("query_id", "scene_id", "retrieval_type", F.lit("random_scene")),
                                      F.col("_scenes")))
             .drop("scene_id", "_scenes"))
    return drawn.join(numbered, ["style", "_k"]).drop("_k").dropDuplicates(["query_id", "scene_id",
                                                                          "retrieval_type"])


def ablation_key(ablation: str, current: dict, classifiers: dict, per_style: dict[str, int], cfg: ErgConfig) -> str:
    payload = {"ablation": ablation, "generator": current["version"], "classifiers": classifiers["version"],
               "per_style": per_style, "filters": cfg.generate.filters.model_dump(),
               "decoding": cfg.generate.decoding.model_dump() if ablation == "random_scene" else None}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:20]


def make_ablation_rows(spark: SparkSession, cfg: ErgConfig, ablation: str, current: dict, classifiers: dict,
                       per_style: dict[str, int]) -> tuple[DataFrame, dict[str, float]]:
    """The scored rows of ``ablation`` (kept under the ablation's key; reused when there), and counts:
    ``ablation.<name>.<style>.{candidates,passed}``."""
    folder = model_dir(cfg, "ablation", ablation_key(ablation, current, classifiers, per_style, cfg))
    if not (Path(folder) / "_delta_log").is_dir():
        base = erg_candidates(spark, cfg, current["version"], per_style)
        phrases = train_scene_phrases(spark, cfg)
        cand = (random_scene_candidates(base, phrases) if ablation == "random_scene"
                else base.join(phrases, ["scene_id", "style"]))
        visual = read_table(spark, cfg, "images").select("image_id", *VISUAL_CONTEXT_COLUMNS)
        cand = (cand.join(visual, "image_id", "left")
                .select(*CANDIDATE_COLUMNS, *PHRASE_COLUMNS, *VISUAL_CONTEXT_COLUMNS).cache())
        n_cand = cand.count()
        if ablation == "random_scene":
            scored = apply_generator(spark, cfg, cand, n_cand, current, classifiers)
        else:
            grafted = cand.mapInPandas(make_grafter(current.get("propensity_path")),
                                       ddl_of(CANDIDATE_COLUMNS + VISUAL_CONTEXT_COLUMNS
                                              + ["transfer_phrase", "generated_caption"]))
            scored = score_generated(cfg, grafted, current, classifiers)
        logger.info("ablation %s: scoring %d candidates", ablation, n_cand)
        scored.withColumn("ablation", F.lit(ablation)).write.format("delta").mode("overwrite").save(str(folder))
        cand.unpersist()
    rows = spark.read.format("delta").load(str(folder))
    counts: dict[str, float] = {}
    for r in rows.groupBy("style").agg(F.count(F.lit(1)).alias("n"),
                                       F.sum(F.col("passed").cast("int")).alias("p")).collect():
        counts[f"ablation.{ablation}.{r['style']}.candidates"] = r["n"]
        counts[f"ablation.{ablation}.{r['style']}.passed"] = r["p"] or 0
    return rows, counts


def ablation_pairs(rows: DataFrame, ablation: str) -> DataFrame:
    """The passing rows of an ablation as the experiment's train pairs (``origin`` augmented)."""
    return (rows.where(F.col("passed"))
            .select(F.concat_ws("|", "query_id", "scene_id", "retrieval_type", F.lit(ablation)).alias("pair_id"),
                    "image_id", F.col("generated_caption").alias("caption"), "style",
                    F.lit("augmented").alias("origin"), "scene_id", "retrieval_type", "perplexity",
                    F.col("factual_caption").alias("source_caption")))


def erg_pass_counts(spark: SparkSession, cfg: ErgConfig, generator_version: str, styles: list[str]
                    ) -> dict[str, tuple[int, int]]:
    """Per style, ERG's (candidates, passing) of ``generator_version``."""
    rows = (read_table(spark, cfg, "augmented_captions").where(F.col("generator_version") == generator_version)
            .where(F.col("style").isin(styles)).groupBy("style")
            .agg(F.count(F.lit(1)).alias("n"), F.sum(F.col("passed").cast("int")).alias("p")).collect())
    return {r["style"]: (int(r["n"]), int(r["p"] or 0)) for r in rows}


def summary(ablation: str, counts: dict[str, float], pool: dict[str, int]) -> dict[str, Any]:
    """Per style: ERG's pool, the ablation's candidates and passing pairs (the report's sentence source)."""
    return {style: {"erg_pool": pool[style],
                    "candidates": int(counts.get(f"ablation.{ablation}.{style}.candidates", 0)),
                    "passed": int(counts.get(f"ablation.{ablation}.{style}.passed", 0))} for style in pool}
