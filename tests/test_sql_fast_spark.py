"""``erg sql``'s fast path (DuckDB over the delta-kernel reader, no Spark) answers as Spark does, on every table.

The generated sample is ingested by the real job (stylized_captions, factual_captions, images, quarantine); the
later tables get rows planted from it (the jobs that write them are tested in their own modules and would cost
minutes here), and ``retrievals`` gets deletion vectors by a DELETE and an UPDATE, as an incremental retrieve
leaves them. Each table is then queried on both paths: its row count, every row in key order, and an aggregate.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from jobs.platform.tables import TABLES, table_location
from jobs.sql_access import run_query

pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parents[1]
SCHEMA = "t_sql_fast"
NOW = dt.datetime(2026, 1, 2, 3, 4, 5, 678000)

AGGREGATES = {
    "stylized_captions": "SELECT style, split, count(*) AS n, min(caption) AS first_caption FROM {t} "
                         "GROUP BY style, split ORDER BY style, split",
    "factual_captions": "SELECT source, count(DISTINCT image_id) AS images, max(length(caption)) AS longest FROM {t} "
                        "GROUP BY source ORDER BY source",
    "images": "SELECT source, count(*) AS n, sum(CASE WHEN tags IS NULL THEN 1 ELSE 0 END) AS untagged, "
              "avg(width) AS mean_width FROM {t} GROUP BY source ORDER BY n DESC, source",
    "quarantine": "SELECT reason, count(*) AS n FROM {t} GROUP BY reason ORDER BY reason",
    "style_phrases": "SELECT style, layer, head, count(*) AS n, avg(eps) AS eps FROM {t} GROUP BY style, layer, head "
                     "ORDER BY style",
    "embeddings": "SELECT item_kind, modality, count(*) AS n, min(created_at) AS earliest FROM {t} "
                  "GROUP BY item_kind, modality ORDER BY item_kind, modality",
    "retrievals": "SELECT retrieval_type, rank, count(*) AS n, avg(similarity) AS mean_sim, max(query_id) AS last_q "
                  "FROM {t} GROUP BY retrieval_type, rank ORDER BY retrieval_type, rank",
    "augmented_captions": "SELECT style, passed, count(*) AS n, avg(perplexity) AS ppl, max(style_probability) AS p "
                          "FROM {t} GROUP BY style, passed ORDER BY style, passed NULLS LAST",
}


def _plant(spark, cfg) -> None:
    """Rows for the tables after ingest, derived from the ingested ones; deletion vectors in retrievals."""
    from planted_tables import append_rows

    from jobs.platform.tables import table_name

    stylized = spark.table(table_name(cfg, "stylized_captions")).toPandas().sort_values("scene_id")
    factual = spark.table(table_name(cfg, "factual_captions")).toPandas().sort_values("caption_id").head(60)
    rng = np.random.default_rng(5)
    words = stylized["caption"].str.split()
    append_rows(spark, cfg, "style_phrases", pd.DataFrame({
        "scene_id": stylized["scene_id"], "style": stylized["style"], "caption": stylized["caption"],
        "tokens": words, "importance": [[float(x) for x in rng.random(len(w))] for w in words],
        "style_phrase": [" ".join(w[-2:]) for w in words], "phrase_words": [w[-2:] for w in words],
        "phrase_mask": [[i >= len(w) - 2 for i in range(len(w))] for w in words],
        "content": [" ".join(w[:-2]) for w in words], "layer": 3, "head": 7, "eps": 0.25,
        "classifier_version": "v1", "run_id": "r-extract", "created_at": NOW}))
    items = [(sid, "scene") for sid in stylized["scene_id"]] + [(cid, "factual") for cid in factual["caption_id"]]
    append_rows(spark, cfg, "embeddings", pd.DataFrame({
        "item_id": [i for i, _ in items], "item_kind": [k for _, k in items], "modality": "text",
        "vector": [[float(x) for x in rng.standard_normal(8).astype(np.float32)] for _ in items], "encoder": "minilm",
        "encoder_version": "e1", "run_id": "r-embed", "created_at": NOW}))
    scenes = stylized["scene_id"].tolist()
    hits = [dict(query_id=q, query_image_id=img, scene_id=scenes[int(rng.integers(len(scenes)))],
                 retrieval_type=kind, rank=rank, similarity=float(rng.uniform(0.5, 1.0)), encoder_version="e1",
                 run_id="r-retrieve", created_at=NOW)
            for q, img in zip(factual["caption_id"], factual["image_id"]) for kind in ("t2t", "i2t")
            for rank in (1, 2, 3)]
    hits = pd.DataFrame(hits).drop_duplicates(["query_id", "scene_id", "retrieval_type"])
    append_rows(spark, cfg, "retrievals", hits)
    style_of = dict(zip(stylized["scene_id"], stylized["style"]))
    top = hits[hits["rank"] == 1].merge(factual[["caption_id", "caption", "image_uri"]], left_on="query_id",
                                        right_on="caption_id")
    passed = [bool(x) for x in rng.random(len(top)) < 0.6]
    append_rows(spark, cfg, "augmented_captions", pd.DataFrame({
        "query_id": top["query_id"], "image_id": top["query_image_id"], "image_uri": top["image_uri"],
        "factual_caption": top["caption"], "scene_id": top["scene_id"], "retrieval_type": top["retrieval_type"],
        "style": top["scene_id"].map(style_of), "style_phrase": "so funny",
        "generated_caption": top["caption"] + " so funny", "similarity": top["similarity"],
        "predicted_style": top["scene_id"].map(style_of),
        "style_probability": [float(x) for x in rng.random(len(top))],
        "perplexity": [None if i % 7 == 0 else float(x) for i, x in enumerate(rng.uniform(10, 90, len(top)))],
        "passed_style": passed, "passed_perplexity": True, "passed_similarity": True, "passed": passed,
        "reject_reason": [None if p else "style" for p in passed], "generator_version": "g1", "run_id": "r-gen",
        "created_at": NOW}))
    # deletion vectors, as an incremental retrieve's MERGE leaves them (the table property is on: jobs.platform.tables)
    retrievals = table_name(cfg, "retrievals")
    spark.sql(f"DELETE FROM {retrievals} WHERE rank = 3 AND retrieval_type = 'i2t'")
    spark.sql(f"UPDATE {retrievals} SET rank = 9 WHERE rank = 2 AND retrieval_type = 't2t' AND similarity < 0.7")


@pytest.fixture(scope="module")
def home(spark, erg_home):
    from jobs.ingest import ingest
    from jobs.platform.config import load_config
    from jobs.platform.spark import get_spark

    cfg = load_config("test", [f"tables.schema={SCHEMA}", f"sample.dir={erg_home / 'samples' / SCHEMA}"])
    get_spark(cfg)
    ingest(spark, cfg)
    _plant(spark, cfg)
    return cfg


def _comparable(frame: pd.DataFrame) -> list[tuple]:
    """Rows as tuples of plain values (arrays as tuples, NaN/NaT as None, floats to 9 decimals: the two engines may
    sum an average's values in another order)."""
    def plain(value):
        if isinstance(value, (list, tuple, np.ndarray)):
            return tuple(plain(v) for v in value)
        if value is None or (isinstance(value, float) and np.isnan(value)) or value is pd.NaT:
            return None
        if isinstance(value, (float, np.floating)):
            return round(float(value), 9)
        if isinstance(value, (np.integer,)):
            return int(value)
        if isinstance(value, (np.bool_,)):
            return bool(value)
        if isinstance(value, pd.Timestamp):
            return value.to_pydatetime()
        return value

    return [tuple(plain(v) for v in row) for row in frame.astype(object).itertuples(index=False)]


def _both(cfg, sql: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    fast, spark = run_query(cfg, sql, engine="duckdb"), run_query(cfg, sql, engine="spark")
    assert fast.attrs["engine"] == "duckdb" and spark.attrs["engine"] == "spark"
    return fast, spark


def test_retrievals_has_deletion_vectors(spark, home):
    log = Path(table_location(home, "retrievals")) / "_delta_log"
    actions = [json.loads(line) for f in sorted(log.glob("*.json")) for line in f.read_text().splitlines()]
    assert any((a.get("add") or {}).get("deletionVector") for a in actions)
    assert any("deletionVectors" in (a.get("protocol") or {}).get("readerFeatures", []) for a in actions)


def test_every_table_answers_as_spark(spark, home):
    for table, spec in TABLES.items():
        name = f"{SCHEMA}.{table}"
        fast, slow = _both(home, f"SELECT count(*) FROM {name}")
        assert list(fast.columns) == list(slow.columns) == ["count(1)"]
        assert int(fast.iloc[0, 0]) == int(slow.iloc[0, 0]) > 0, table
        keys = ", ".join(spec.keys)
        fast, slow = _both(home, f"SELECT * FROM {name} ORDER BY {keys}")
        assert list(fast.columns) == list(slow.columns) == [f.name for f in spec.schema.fields]
        assert len(fast) == len(slow) > 0, table
        assert _comparable(fast) == _comparable(slow), table
        fast, slow = _both(home, AGGREGATES[table].format(t=name))
        assert list(fast.columns) == list(slow.columns)
        assert len(fast) > 0 and _comparable(fast) == _comparable(slow), table
    # the view of the training pairs, and a join across two tables
    for sql in (f"SELECT origin, style, count(*) AS n FROM {SCHEMA}.training_set GROUP BY origin, style "
                "ORDER BY origin, style",
                f"SELECT s.style, count(*) AS hits, avg(r.similarity) AS sim FROM {SCHEMA}.retrievals r "
                f"JOIN {SCHEMA}.stylized_captions s ON r.scene_id = s.scene_id WHERE r.rank <= 2 "
                "GROUP BY s.style ORDER BY hits DESC, s.style"):
        fast, slow = _both(home, sql)
        assert len(fast) > 0 and _comparable(fast) == _comparable(slow), sql


def test_cli_answers_without_spark_and_prints_what_spark_shows(spark, home):
    """The real entry point in a fresh process whose PATH has no java: the answer, the same table text as Spark's
    show(), and pyspark never imported."""
    queries = [f"SELECT style, count(*) FROM {SCHEMA}.augmented_captions GROUP BY style ORDER BY style",
               f"SELECT query_id, scene_id, retrieval_type, similarity, created_at, passed, perplexity, style_probability "
               f"FROM {SCHEMA}.augmented_captions ORDER BY query_id, scene_id, retrieval_type LIMIT 12",
               f"SELECT item_id, vector FROM {SCHEMA}.embeddings ORDER BY item_id LIMIT 3"]
    env = {k: v for k, v in os.environ.items() if k not in ("JAVA_HOME", "SPARK_HOME")}
    env.update(PATH=str(Path(sys.executable).parent), PYTHONPATH=str(ROOT))
    script = ("import sys; from jobs.cli import main; rc = main(sys.argv[1:]); "
              "print('pyspark loaded:', 'pyspark' in sys.modules, file=sys.stderr); sys.exit(rc)")
    for sql in queries:
        done = subprocess.run([sys.executable, "-c", script, "sql", "--conf", "test", "--set",
                               f"tables.schema={SCHEMA}", "--limit", "10", sql],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert "pyspark loaded: False" in done.stderr and "Spark" not in done.stderr.replace("pyspark", "")
        expected = spark.sql(sql)._jdf.showString(10, 60, False)
        assert done.stdout.rstrip("\n") == expected.rstrip("\n"), (done.stdout, expected)  # show() adds a newline


def test_what_the_fast_path_hands_to_spark_and_what_it_refuses(spark, home, capsys):
    from jobs.cli import main

    version = len(list((Path(table_location(home, "images")) / "_delta_log").glob("*.json")))
    base = ["sql", "--conf", "test", "--set", f"tables.schema={SCHEMA}"]
    # Spark-only syntax: answered by Spark, with a note saying why
    assert main([*base, f"SELECT count(*) FROM {SCHEMA}.images VERSION AS OF 1"]) == 0
    captured = capsys.readouterr()
    assert "answered by Spark (DuckDB cannot parse it" in captured.err
    assert f"|{spark.table(f'{SCHEMA}.images').count()}|" in captured.out.replace(" ", "")
    sized = f"SELECT size(descriptions) AS n FROM {SCHEMA}.images ORDER BY image_id LIMIT 1"
    assert main([*base, "--json", sized]) == 0
    captured = capsys.readouterr()
    assert "answered by Spark (size() differs" in captured.err
    assert json.loads(captured.out.splitlines()[-1])["n"] == spark.sql(sized).first()["n"]
    # an unknown table of the schema: a user error, no Spark
    with pytest.raises(SystemExit) as info:
        main([*base, f"SELECT * FROM {SCHEMA}.nope"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and f"{SCHEMA}.nope cannot be found" in err and "SHOW TABLES" in err
    # writes: refused before anything runs, the table's Delta version unchanged
    for statement in (f"DELETE FROM {SCHEMA}.images", f"-- look\nOPTIMIZE {SCHEMA}.images",
                      f"SELECT 1; DROP TABLE {SCHEMA}.images"):
        with pytest.raises(SystemExit) as info:
            main([*base, statement])
        err = capsys.readouterr().err
        assert info.value.code == 2 and "erg sql: refused:" in err and "--write" in err, statement
    assert len(list((Path(table_location(home, "images")) / "_delta_log").glob("*.json"))) == version
