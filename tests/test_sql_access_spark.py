"""``erg sql`` is read-only unless asked (--write): every statement kind that writes is refused, by Spark's own
parser (``--engine spark``) and by the fast path's check (the default, ``jobs.sql_fast``), with exit status 2 and no
traceback, and leaves the tables as they were; --write runs it and logs it."""
from __future__ import annotations

import datetime as dt

import pytest

from jobs.cli import main
from jobs.sql_access import writing_node
from tests.write_statements import write_statements

pytestmark = pytest.mark.spark
SCHEMA = "t_sql_access"
T = f"{SCHEMA}.images"

WRITES = write_statements(SCHEMA, "images")
READS = [f"SELECT source, count(*) FROM {T} GROUP BY source", f"WITH x AS (SELECT * FROM {T}) SELECT count(*) FROM x",
         f"sElEcT image_id FROM {T} WHERE image_id IN (SELECT image_id FROM {T}) LIMIT 1",
         f"SHOW TABLES IN {SCHEMA}", f"DESCRIBE {T}", f"DESCRIBE HISTORY {T}", f"EXPLAIN SELECT * FROM {T}",
         f"SELECT * FROM {T} VERSION AS OF 0", "VALUES (1), (2)"]


@pytest.fixture(scope="module")
def table(spark, erg_home):
    from jobs.platform.config import load_config
    from jobs.platform.tables import conform, merge_rows, register_tables

    cfg = load_config("test", [f"tables.schema={SCHEMA}"])
    register_tables(spark, cfg)
    now = dt.datetime(2026, 1, 1)
    rows = [dict(image_id=f"img:{i}", source="t", ingest_time=now) for i in range(3)]
    merge_rows(spark, cfg, "images", conform(spark.createDataFrame(rows), "images"))
    return cfg


def _state(spark):
    rows = sorted(tuple(r) for r in spark.table(T).select("image_id", "tags").collect())
    return rows, spark.sql(f"DESCRIBE HISTORY {T} LIMIT 1").first()["version"], spark.conf.get(
        "spark.sql.shuffle.partitions")


@pytest.mark.parametrize("engine", ["spark", "auto"])
def test_every_write_is_refused_and_the_tables_are_unchanged(spark, table, capsys, engine):
    before = _state(spark)
    refused = 0
    for kind, statement in WRITES.items():
        capsys.readouterr()
        with pytest.raises(SystemExit) as info:
            main(["sql", "--conf", "test", "--set", f"tables.schema={SCHEMA}", "--engine", engine, statement])
        err = capsys.readouterr().err
        assert info.value.code == 2 and "Traceback" not in err, (kind, err)
        lines = [line for line in err.splitlines() if line.startswith(("erg sql:", "  fix:"))]
        assert lines and ("refused" in lines[0] or "syntax error" in lines[0]), (kind, err)
        refused += 1
        assert _state(spark) == before, kind
    assert refused == len(WRITES)
    assert not spark.catalog.tableExists(f"{SCHEMA}.other")


def test_queries_run_and_the_parser_names_what_writes(spark, table):
    for statement in READS:
        assert writing_node(spark, statement) is None, statement
    assert writing_node(spark, WRITES["DELETE"]) == "DeleteFromTable"
    assert writing_node(spark, WRITES["INSERT under WITH"]) == "InsertIntoStatement"
    assert writing_node(spark, WRITES["RESTORE"]) == "RestoreTableStatement"
    for engine in ("spark", "auto"):
        assert main(["sql", "--conf", "test", "--set", f"tables.schema={SCHEMA}", "--engine", engine, READS[0]]) == 0


def test_write_runs_with_the_flag_and_is_logged_with_versions(spark, table, capsys):
    import mlflow

    version = _state(spark)[1]
    assert main(["sql", "--conf", "test", "--set", f"tables.schema={SCHEMA}", "--write",
                 f"UPDATE {T} SET tags = 'cat' WHERE image_id = 'img:0'"]) == 0
    assert spark.table(T).where("tags = 'cat'").count() == 1
    mlflow.set_tracking_uri(table.mlflow.tracking_uri)
    runs = mlflow.search_runs(experiment_names=[table.mlflow.experiment], filter_string="tags.`erg.job` = 'sql_write'",
                              order_by=["attributes.start_time DESC"])
    run = runs.iloc[0]
    assert run["metrics.version_before.images"] == version and run["metrics.version_after.images"] == version + 1
    assert "UPDATE" in run["tags.erg.sql_statement"]
