"""``erg run`` end to end on the sample: every stage a child MLflow run; filters applied exactly; idempotent."""
from __future__ import annotations

import math

import mlflow
import pytest

from jobs.generate import generate_augmented
from jobs.pipeline import STAGES, run_pipeline
from jobs.platform.spark import get_spark
from jobs.platform.tables import table_name
from models.text import caption_words

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def pipeline(spark, erg_home):
    from jobs.platform.config import load_config

    cfg = load_config("test", ["tables.schema=t_pipeline", f"sample.dir={erg_home / 'samples' / 't_pipeline'}"])
    get_spark(cfg)
    return cfg, run_pipeline(spark, cfg)


def test_every_stage_is_a_child_run(pipeline):
    cfg, result = pipeline
    parent = result["parent_run_id"]
    children = mlflow.search_runs(filter_string=f"tags.mlflow.parentRunId = '{parent}'", search_all_experiments=True)
    assert sorted(children["tags.erg.job"]) == sorted(STAGES)
    assert mlflow.get_run(parent).data.metrics["stage_seconds.generate"] > 0


def test_augmented_captions_keep_every_verdict(spark, pipeline):
    cfg, result = pipeline
    gen = result["generate"]
    rows = spark.table(table_name(cfg, "augmented_captions")).collect()
    assert len(rows) == gen["candidates"] == gen["augmented_captions.inserted"] > 0
    f = cfg.generate.filters
    for r in rows:
        assert r.passed_similarity == (r.similarity > f.min_similarity)
        assert r.passed_perplexity == (r.perplexity is not None and not math.isnan(r.perplexity)
                                       and r.perplexity < f.ppl_max)
        assert r.passed_style == (r.predicted_style == r.style)
        assert r.passed_content == (r.content_similarity > f.min_content_similarity)
        # visual relatedness: the sample's images have tags (no confidence: the plain cosine), so both are scored
        if r.factual_relatedness is None or math.isnan(r.factual_relatedness):
            assert r.passed_visual  # no visual context, nothing to drift from
        else:
            assert 0 <= r.factual_relatedness <= 1 and 0 <= r.generated_relatedness <= 1
            assert r.passed_visual == (r.generated_relatedness
                                       >= r.factual_relatedness - f.max_relatedness_drop - 1e-9)
        assert r.passed == (r.passed_style and r.passed_perplexity and r.passed_similarity and r.passed_content
                            and r.passed_well_formed and r.passed_visual)
        assert (r.reject_reason is None) == r.passed
        # the merge decoding keeps every word of the factual caption, in order
        words = iter(r.generated_caption.split())
        assert all(w in words for w in caption_words(r.factual_caption)), (r.factual_caption, r.generated_caption)
        assert r.generated_caption is not None and r.style in cfg.styles
        assert r.run_id == gen["run_id"] and r.generator_version == gen["generator_version"]
    # the retrieved hits honour the threshold, so no candidate fails on similarity
    assert all(r.passed_similarity for r in rows)
    metrics = mlflow.get_run(gen["run_id"]).data.metrics
    assert 0.0 <= metrics["pass_rate.all"] <= 1.0
    assert metrics["pass_rate.visual"] == pytest.approx(sum(r.passed_visual for r in rows) / len(rows))
    assert metrics["passed"] == sum(r.passed for r in rows)
    assert metrics["leakage.augmented_non_train_phrase"] == 0 and metrics["leakage.training_set_non_train_images"] == 0
    artifacts = {a.path for a in mlflow.MlflowClient().list_artifacts(gen["run_id"])}
    assert {"fig4_samples.json", "pass_rates.json", "pass_rates.txt"} <= artifacts


def test_training_set_view_and_rerun_adds_nothing(spark, pipeline):
    cfg, result = pipeline
    n_aug = spark.table(table_name(cfg, "augmented_captions")).count()
    passed = spark.sql(f"""
        SELECT count(*) FROM {table_name(cfg, 'augmented_captions')}
        WHERE passed AND image_id NOT IN (SELECT image_id FROM {table_name(cfg, 'stylized_captions')}
                                          WHERE split IN ('val', 'test'))""").collect()[0][0]
    view = {r.origin: r.n for r in spark.sql(
        f"SELECT origin, count(*) AS n FROM {table_name(cfg, 'training_set')} GROUP BY origin").collect()}
    assert view["original"] == spark.table(table_name(cfg, "stylized_captions")).count()
    assert view.get("augmented", 0) == passed

    again = generate_augmented(spark, cfg, incremental=True)
    assert again["candidates"] == 0 and again["generator_version"] == result["generate"]["generator_version"]
    assert spark.table(table_name(cfg, "augmented_captions")).count() == n_aug


def test_per_style_candidate_cap_is_the_same_set_every_run(spark, pipeline):
    from jobs.generate import candidates

    cfg, _ = pipeline
    full, capped = cfg.model_copy(deep=True), cfg.model_copy(deep=True)
    full.generate.max_candidates = capped.generate.max_candidates = None
    capped.generate.max_candidates_per_style = 3
    keys = ["query_id", "scene_id", "retrieval_type"]
    everything = candidates(spark, full, "none").select("style", *keys).toPandas()
    first = candidates(spark, capped, "none").select("style", *keys).toPandas()
    again = candidates(spark, capped, "none").select("style", *keys).toPandas()
    available = everything.groupby("style").size()
    assert first.groupby("style").size().to_dict() == {s: min(3, n) for s, n in available.items()}
    assert sorted(map(tuple, first[keys].to_numpy())) == sorted(map(tuple, again[keys].to_numpy()))


@pytest.fixture(scope="module")
def standalone_cluster(tmp_path_factory):
    """A Spark standalone master and two workers (one core each) from pyspark's launcher, stopped after."""
    from jobs.platform.standalone_cluster import start_cluster

    with start_cluster(tmp_path_factory.mktemp("cluster"), workers=2, cores=1, memory="2g") as cluster:
        yield cluster


def test_killed_twice_then_rerun_equals_uninterrupted(spark, pipeline, erg_home, standalone_cluster):
    """Kill `erg run` (SIGKILL, the whole process group) at a random moment of ingest, rerun it incrementally and
    kill that at a random moment of generate, then rerun to the end: every table equals the uninterrupted run's
    (same keys, no duplicates, same values in the deterministic columns; benchmarks/chaos.py does this N times
    over all stages, on the local conf); a further rerun does no model work.

    The killed runs run on a standalone cluster (a master and two workers: executors in other JVMs), the
    uninterrupted one and the final rerun on local[2]: the tables the cluster wrote (ingest through retrieve, and
    part of generate) equal local[*]'s."""
    import os
    import random

    from benchmarks.chaos import compare_tables, erg_command, run_and_kill
    from jobs.platform.config import load_config

    cfg_done, _ = pipeline
    overrides = ["tables.schema=t_killed", f"sample.dir={erg_home / 'samples' / 't_pipeline'}"]
    cfg = load_config("test", overrides)
    on_cluster = [*overrides, f"spark.master={standalone_cluster.master_url}"]
    rng = random.Random(15)
    for n, (stage, delay, incremental) in enumerate([("ingest", rng.uniform(5, 30), False),
                                                     ("generate", rng.uniform(2, 10), True)]):
        log = erg_home / f"killed_run_{n}.log"
        killed = run_and_kill(erg_command("test", on_cluster, incremental=incremental), {**os.environ}, log,
                              stage=stage, delay=delay, timeout=1800)
        assert killed["killed"], f"the run ended before it could be killed in {stage}:\n{log.read_text()[-3000:]}"

    get_spark(cfg)
    rerun = run_pipeline(spark, cfg, incremental=True)
    comparison = compare_tables(lambda t: spark.table(table_name(cfg_done, t)).toPandas(),
                                lambda t: spark.table(table_name(cfg, t)).toPandas())
    assert comparison["identical"], comparison["differences"]

    noop = run_pipeline(spark, cfg, incremental=True)
    assert noop["ingest"]["stylized_captions.inserted"] == 0
    assert noop["extract"]["scenes_to_extract"] == 0
    assert sum(v for k, v in noop["embed"].items() if k.startswith("to_embed.")) == 0
    assert noop["retrieve"].get("skipped")
    assert noop["generate"]["candidates"] == 0
    assert rerun["generate"]["generator_version"] == noop["generate"]["generator_version"]


def _bad_files(folder) -> list:
    """A SentiCap file whose captions carry the wrong sentiment (and one record with no image, quarantined) and a
    Flickr30K file of new factual captions: what a bad delivery looks like (the one benchmarks/safety.py uses)."""
    from benchmarks.safety_runs import bad_delivery
    from jobs.platform.config import IngestSource

    return [IngestSource(**source) for source in bad_delivery(folder)]


def test_restore_to_a_run_undoes_a_bad_file(spark, pipeline, erg_home):
    """The pipeline fixture's run, then a bad file ingested and a full run over it (which retrains the models and
    moves their `current` aliases), then `restore` to the first run: every table equals its state after the first run
    (Delta time travel to the versions it recorded), the watermarks and aliases are the first run's, and an
    incremental run afterwards does no work and leaves the tables of a run that never saw the bad file.
    (Kept last in this module: it rewrites the fixture's schema and puts it back.)"""
    from benchmarks.chaos import compare_tables
    from jobs.platform.history import history, load_state, restore
    from jobs.ingest import ingest
    from jobs.platform.model_store import current_aliases
    from jobs.sample import sample_sources
    from jobs.platform.tables import TABLES
    from jobs.platform.watermarks import watermarks_path

    cfg, first = pipeline
    run_id = first["parent_run_id"]
    state = load_state(cfg, run_id)
    assert set(state["tables"]) == set(TABLES) and state["models"] and state["watermarks"]["retrieve"]
    after_first = {t: spark.read.option("versionAsOf", v).table(table_name(cfg, t)).toPandas()
                   for t, v in state["tables"].items()}

    bad = cfg.model_copy(deep=True)
    bad.ingest.sources = sample_sources(cfg) + _bad_files(erg_home / "bad_delivery")
    landed = ingest(spark, bad)
    assert landed["stylized_captions.inserted"] == 12 and landed["factual_captions.inserted"] == 10
    second = run_pipeline(spark, bad)
    assert second["extract"]["scenes_to_extract"] > 0
    assert current_aliases(cfg) != state["models"]  # retrained: the aliases moved
    damaged = compare_tables(after_first.__getitem__, lambda t: spark.table(table_name(cfg, t)).toPandas())
    assert {d["table"] for d in damaged["differences"]} >= {"stylized_captions", "factual_captions", "quarantine",
                                                            "embeddings", "style_phrases"}

    rows = {r["run_id"]: r for r in history(cfg, last=50)}
    assert rows[run_id]["job"] == "run" and rows[run_id]["written"] == {
        t: v for t, v in state["tables"].items() if v > 0}
    assert rows[second["parent_run_id"]]["restorable"] and rows[second["ingest"]["run_id"]]["written"] == {}

    result = restore(spark, cfg, run_id)
    actions = {t: c["action"] for t, c in result["tables"].items()}
    assert set(actions) == set(TABLES) and set(actions.values()) <= {"restored", "unchanged"}
    assert all(actions[d["table"]] == "restored" for d in damaged["differences"])
    for table, frame in after_first.items():
        now = spark.table(table_name(cfg, table)).toPandas()
        assert len(now) == len(frame), table
        keys = list(TABLES[table].keys)
        assert now.sort_values(keys).reset_index(drop=True).astype(str).equals(
            frame.sort_values(keys).reset_index(drop=True).astype(str)), table
    assert current_aliases(cfg) == state["models"]
    import json

    marks = json.loads(watermarks_path(cfg).read_text())
    assert marks["retrieve"] == {"embeddings": result["tables"]["embeddings"]["to"]}

    rerun = run_pipeline(spark, cfg, incremental=True)
    assert rerun["ingest"]["sources.skipped_unchanged"] == len(sample_sources(cfg))
    assert rerun["extract"]["scenes_to_extract"] == 0 and rerun["generate"]["candidates"] == 0
    assert rerun["retrieve"].get("skipped")
    final = compare_tables(after_first.__getitem__, lambda t: spark.table(table_name(cfg, t)).toPandas())
    assert final["identical"], final["differences"]
