"""Spark + Delta Lake: round trip, ingest of the sample with quarantine, idempotent re-ingest, SQL by name."""
from __future__ import annotations

import datetime as dt
import json
import shutil

import mlflow
import pytest
from pyspark.sql import types as T

from jobs.ingest import ingest
from jobs.platform.spark import get_spark
from jobs.platform.tables import TABLES, merge_rows, register_tables, table_location, table_name
from jobs.sample import PLANTED_BAD_ROWS

pytestmark = pytest.mark.spark


def test_delta_round_trip_and_merge(spark, fresh_cfg):
    get_spark(fresh_cfg)
    name = table_name(fresh_cfg, "stylized_captions")
    now = dt.datetime(2026, 1, 1)
    rows = [("s1", "coco:1", None, "a lovely dog", "positive", "train", "t", "k1", now, "r1"),
            ("s2", "coco:2", None, "a sad dog", "negative", "train", "t", "k2", now, "r1")]
    df = spark.createDataFrame(rows, schema=TABLES["stylized_captions"].schema)
    assert merge_rows(spark, fresh_cfg, "stylized_captions", df)["inserted"] == 2
    again = merge_rows(spark, fresh_cfg, "stylized_captions", df.union(df))
    assert again["inserted"] == 0
    out = spark.table(name).orderBy("scene_id").collect()
    assert [(r.scene_id, r.caption) for r in out] == [("s1", "a lovely dog"), ("s2", "a sad dog")]
    detail = spark.sql(f"DESCRIBE DETAIL {name}").collect()[0]
    assert detail.format == "delta"
    assert spark.sql(f"SHOW TBLPROPERTIES {name}").filter("key = 'delta.enableChangeDataFeed'").collect()[0].value == "true"
    first = spark.read.format("delta").option("versionAsOf", 0).table(name).count()
    assert first == 0  # version 0 is the empty CREATE TABLE: time travel works


def test_tables_compact_themselves_so_a_small_table_stays_a_few_files(spark, fresh_cfg):
    get_spark(fresh_cfg)
    name = table_name(fresh_cfg, "stylized_captions")
    props = {r.key: r.value for r in spark.sql(f"SHOW TBLPROPERTIES {name}").collect()}
    assert props["delta.autoOptimize.autoCompact"] == "true" and props["delta.autoOptimize.optimizeWrite"] == "true"
    now = dt.datetime(2026, 1, 1)
    spark.conf.set("spark.databricks.delta.autoCompact.minNumFiles", "4")
    try:
        for i in range(8):  # eight small writes (one row each), as incremental runs make them
            row = [(f"s{i}", f"coco:{i}", None, f"caption {i}", "positive", "train", "t", f"k{i}", now, "r1")]
            merge_rows(spark, fresh_cfg, "stylized_captions", spark.createDataFrame(row, TABLES["stylized_captions"].schema))
    finally:
        spark.conf.unset("spark.databricks.delta.autoCompact.minNumFiles")
    detail = spark.sql(f"DESCRIBE DETAIL {name}").collect()[0]
    assert spark.table(name).count() == 8
    assert detail.numFiles < 4  # without compaction: 8 files


def test_ingest_sample_quarantine_and_idempotent(spark, fresh_cfg):
    cfg = fresh_cfg
    get_spark(cfg)
    counts = ingest(spark, cfg)
    sample = cfg.sample
    n_styl = spark.table(table_name(cfg, "stylized_captions")).count()
    n_fact = spark.table(table_name(cfg, "factual_captions")).count()
    n_quar = spark.table(table_name(cfg, "quarantine")).count()
    assert n_styl == 4 * sample.stylized_per_style - 2
    # P excludes the stylized images: their factual captions are kept as images.descriptions instead
    n_desc = spark.table(table_name(cfg, "images")).selectExpr("sum(size(descriptions))").collect()[0][0]
    assert n_fact + n_desc == sample.factual_captions and n_desc == counts["factual_captions.excluded_stylized_image"]
    assert spark.table(table_name(cfg, "factual_captions")).join(
        spark.table(table_name(cfg, "stylized_captions")), "image_id", "left_semi").count() == 0
    from jobs.platform.tables import scene_descriptions
    assert scene_descriptions(spark, cfg).count() == n_desc
    assert n_quar == sum(PLANTED_BAD_ROWS.values())
    # every record read is accounted for, per source: read = kept + quarantined + duplicates
    assert counts["rows.read"] == counts["rows.kept"] + counts["rows.quarantined"] + counts["rows.duplicates"]
    assert counts["rows.unaccounted"] == 0 and counts["rows.quarantined"] == n_quar
    assert counts["rows.read"] == (counts["stylized_captions.read"] + counts["factual_captions.read"]
                                   + counts["quarantine.read"] + sample.n_images)  # + the image manifest's lines
    assert counts["stylized_captions.read"] == n_styl + counts["stylized_captions.duplicates"]
    for name, c in counts["sources"].items():
        assert c["read"] == c["kept"] + c["quarantined"] + c["duplicates"], name
    # splits by image: one split per image, the paper's recipe scaled to the sample
    per_image = spark.sql(f"SELECT image_id, count(DISTINCT split) AS n FROM {table_name(cfg, 'stylized_captions')} "
                          "GROUP BY image_id").collect()
    assert {r.n for r in per_image} == {1}
    assert counts["stylized_captions.images.test"] > 0 and counts["stylized_captions.images.val"] > 0
    assert spark.table(table_name(cfg, "images")).count() == sample.n_images
    assert spark.table(table_name(cfg, "images")).filter("tags IS NULL").count() == 0
    reasons = {r.reason.split(" (")[0] for r in spark.table(table_name(cfg, "quarantine")).collect()}
    assert reasons == {"empty caption", "missing image id", "bad encoding", "malformed line", "unknown style 2",
                       "unpaired line"}
    # every row carries the MLflow run id of the ingest run, which logged its counts
    run_ids = {r.run_id for r in spark.table(table_name(cfg, "stylized_captions")).select("run_id").distinct().collect()}
    assert run_ids == {counts["run_id"]}
    run = mlflow.get_run(counts["run_id"])
    assert run.data.metrics["stylized_captions.inserted"] == n_styl
    assert run.data.metrics["quarantine.inserted"] == n_quar
    assert run.data.tags["erg.job"] == "ingest"
    # the ingest run shows read = kept + quarantined + duplicates per source, and the duplicates' keys
    humor = "source.sample_flickrstyle:funny_train.txt"
    assert [run.data.metrics[f"{humor}.{k}"] for k in ("read", "kept", "quarantined", "duplicates")] == [
        sample.stylized_per_style + 1, sample.stylized_per_style - 2, 3, 0]
    artifacts = {a.path for a in mlflow.MlflowClient().list_artifacts(counts["run_id"])}
    assert {"ingest_sources.json", "duplicates.json", "ingest_summary.txt"} <= artifacts

    again = ingest(spark, cfg)
    assert again["stylized_captions.inserted"] == 0 and again["factual_captions.inserted"] == 0
    assert again["quarantine.inserted"] == 0 and again["images.inserted"] == 0
    assert spark.table(table_name(cfg, "stylized_captions")).count() == n_styl
    assert spark.table(table_name(cfg, "quarantine")).count() == n_quar
    # still the first ingest's run id: re-ingest rewrote nothing
    assert {r.run_id for r in spark.table(table_name(cfg, "stylized_captions")).select("run_id").distinct().collect()} == run_ids


def test_sql_by_name_through_cli(spark, fresh_cfg, capsys):
    from jobs.cli import main

    get_spark(fresh_cfg)
    schema = fresh_cfg.tables.schema_name
    assert main(["ingest", "--conf", "test", "--set", f"tables.schema={schema}",
                 "--set", f"sample.dir={fresh_cfg.sample.dir}"]) == 0
    err = capsys.readouterr().err
    # erg ingest prints every source's read = kept + quarantined + duplicates
    summary = err[err.index("every record read is kept, quarantined or a duplicate:"):].splitlines()
    assert summary[1].split() == ["source", "read", "=", "kept", "+", "quarantined", "+", "duplicates"]
    total = next(line for line in summary if line.startswith("total")).replace(",", "").split()
    assert int(total[1]) == int(total[3]) + int(total[5]) + int(total[7]) and int(total[5]) == 8
    code = main(["sql", "--conf", "test", "--set", f"tables.schema={schema}", "--json",
                 f"SELECT style, count(*) AS n FROM {schema}.stylized_captions GROUP BY style ORDER BY style"])
    assert code == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    per_style = {row["style"]: row["n"] for row in map(json.loads, lines)}
    n = fresh_cfg.sample.stylized_per_style
    assert per_style == {"humor": n - 2, "negative": n, "positive": n, "romantic": n}


def test_cli_rejects_bad_conf(capsys):
    from jobs.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["ingest", "--conf", "test", "--set", "extract.eps=2"])
    assert exit_info.value.code == 2
    assert "key 'extract.eps'" in capsys.readouterr().err


def test_a_table_from_an_older_version_gains_the_new_columns(spark, fresh_cfg):
    """A later session finds a Delta table written by an older version (a column short): it is registered as it is
    and gets the new nullable column; its rows survive and read NULL there."""
    from jobs.platform.tables import ensure_table, table_location

    get_spark(fresh_cfg)
    name, location = table_name(fresh_cfg, "augmented_captions"), table_location(fresh_cfg, "augmented_captions")
    spark.sql(f"DROP TABLE {name}")  # external (LOCATION): the catalog entry goes, as in a new session
    older = T.StructType([f for f in TABLES["augmented_captions"].schema.fields if f.name != "transfer_phrase"])
    row = {f.name: None for f in older.fields}
    row.update(query_id="q1", image_id="coco:1", factual_caption="a dog", scene_id="s1", retrieval_type="t2t",
               style="positive", style_phrase="nice", generated_caption="a nice dog", similarity=0.9,
               passed_style=True, passed_perplexity=True, passed_similarity=True, passed=True, generator_version="g1",
               run_id="r1", created_at=dt.datetime(2026, 1, 1))
    (spark.createDataFrame([tuple(row[f.name] for f in older.fields)], older).write.format("delta")
     .mode("overwrite").option("overwriteSchema", "true").save(location))
    assert ensure_table(spark, fresh_cfg, "augmented_captions") == name
    out = spark.table(name).collect()
    assert "transfer_phrase" in spark.table(name).columns
    assert [(r.query_id, r.generated_caption, r.transfer_phrase) for r in out] == [("q1", "a nice dog", None)]


def test_ingest_reads_only_new_source_files(spark, fresh_cfg, tmp_path):
    """New files land, old ones are skipped; a new stylized image makes every source read again (its factual captions
    in old files become scene descriptions); a table made again forgets what it held."""
    from pyspark.sql import functions as F

    from jobs.platform.config import IngestSource
    from jobs.sample import sample_sources

    cfg = fresh_cfg
    get_spark(cfg)
    sources = sample_sources(cfg)
    first = ingest(spark, cfg)
    assert first["sources.read"] == len(sources) and first["sources.skipped_unchanged"] == 0
    stylized, images = (spark.table(table_name(cfg, t)) for t in ("stylized_captions", "images"))
    styled = (stylized.where("source = 'sample_flickrstyle'").join(images, "image_id")
              .select("image_id", "uri", "split").orderBy("image_id").first())
    unstyled = [r.uri for r in images.join(stylized, "image_id", "left_anti").where(F.col("uri").isNotNull())
                .orderBy("image_id").limit(2).collect()]
    name = lambda uri: uri.rsplit("/", 1)[-1]  # noqa: E731
    root = cfg.sample.dir + "/images"
    (tmp_path / "factual_new.txt").write_text(f"{name(unstyled[0])}#900\ta dog runs on new grass .\n")
    (tmp_path / "funny_new.txt").write_text("a dog runs on grass like a clown .\n")
    (tmp_path / "names_new.txt").write_text(name(styled.uri) + "\n")
    new = [IngestSource(format="flickr30k_tokens", path=str(tmp_path / "factual_new.txt"), name="new_factual",
                        image_root=root),
           IngestSource(format="flickrstyle", style="humor", path=str(tmp_path / "funny_new.txt"),
                        image_names=str(tmp_path / "names_new.txt"), name="new_humor", image_root=root)]
    n_factual = spark.table(table_name(cfg, "factual_captions")).count()

    second = ingest(spark, cfg, sources + new)
    assert second["sources.skipped_unchanged"] == len(sources) and second["sources.read"] == 2
    assert second["sources.reread_for_new_stylized_images"] == 0
    assert second["factual_captions.inserted"] == 1 and second["stylized_captions.inserted"] == 1
    assert second["rows.read"] == 2 and set(second["sources"]) == {"new_factual:factual_new.txt",
                                                                   "new_humor:funny_new.txt"}
    assert spark.table(table_name(cfg, "factual_captions")).count() == n_factual + 1
    added = stylized.where("caption = 'a dog runs on grass like a clown .'").collect()
    assert [(r.image_id, r.split) for r in added] == [(styled.image_id, styled.split)]  # the image keeps its split

    # a stylized caption of an image that had none: every source is read, so the protocol sees the image whole
    (tmp_path / "romantic_new.txt").write_text("a dog runs on grass with all its heart .\n")
    (tmp_path / "names_new2.txt").write_text(name(unstyled[1]) + "\n")
    newer = IngestSource(format="flickrstyle", style="romantic", path=str(tmp_path / "romantic_new.txt"),
                         image_names=str(tmp_path / "names_new2.txt"), name="new_romantic", image_root=root)
    third = ingest(spark, cfg, sources + new + [newer])
    assert third["sources.reread_for_new_stylized_images"] == len(sources) + 2
    assert third["sources.read"] == len(sources) + 3 and third["sources.skipped_unchanged"] == 0
    assert third["stylized_captions.inserted"] == 1 and third["factual_captions.inserted"] == 0
    image = images.where(F.col("uri") == unstyled[1]).first()
    assert image.descriptions  # its factual captions (old files) are now its scene descriptions

    # the same files again: nothing read; a table dropped with its files and made again: everything read
    assert ingest(spark, cfg, sources + new + [newer])["sources.read"] == 0
    spark.sql(f"DROP TABLE {table_name(cfg, 'factual_captions')}")
    location = table_location(cfg, "factual_captions")
    if location:
        shutil.rmtree(location)
    register_tables(spark, cfg)  # makes the missing table again, empty
    assert spark.table(table_name(cfg, "factual_captions")).count() == 0
    again = ingest(spark, cfg, sources + new + [newer])
    assert again["sources.read"] == len(sources) + 3 and again["sources.skipped_unchanged"] == 0
    assert spark.table(table_name(cfg, "factual_captions")).count() > 0
