"""The fast path's read-only check (DuckDB's parser, no Spark) and its printing of values as Spark's show() does."""
from __future__ import annotations

import datetime as dt

import pytest

from jobs.platform.config import load_config
from jobs.platform.errors import UserError
from jobs.sql_fast import NotFast, Result, classify, first_word, route, show, spark_text
from tests.write_statements import write_statements

T = "erg.images"
#: every kind of write, and the tricky ways of writing one (the same forms tests/test_sql_access_spark.py gives Spark)
WRITES = {
    **write_statements("erg", "images"),
    "CREATE VIEW": f"CREATE VIEW erg.v AS SELECT * FROM {T}",
    "COPY to a file": f"COPY (SELECT * FROM {T}) TO '/tmp/out.csv'",
    "ATTACH": "ATTACH '/tmp/other.db'",
    "a write after a comment line": f"-- SELECT 1\nDELETE FROM {T}",
}
#: read-only statements: DuckDB answers the plain queries, Spark the rest
FAST = [f"SELECT source, count(*) FROM {T} GROUP BY source", f"WITH x AS (SELECT * FROM {T}) SELECT count(*) FROM x",
        f"sElEcT image_id FROM {T} WHERE image_id IN (SELECT image_id FROM {T}) LIMIT 1", "VALUES (1), (2)",
        f"/* hi */ (SELECT image_id FROM {T}) UNION ALL (SELECT image_id FROM {T})",
        f"SELECT * FROM {T} WHERE caption LIKE '%concat(%'"]
TO_SPARK = ["SHOW TABLES IN erg", f"DESCRIBE {T}", f"DESCRIBE HISTORY {T}", f"EXPLAIN SELECT * FROM {T}",
            f"SELECT * FROM {T} VERSION AS OF 0", f"SELECT concat(tags, 'x') FROM {T}",
            f'SELECT * FROM {T} WHERE tags = "dog"', f"SELECT explode(descriptions) FROM {T}"]


def test_every_write_is_refused_before_it_runs():
    for kind, statement in WRITES.items():
        with pytest.raises(UserError) as info:
            classify(statement)
        assert info.value.problem.startswith("refused: the statement is"), (kind, info.value.problem)
        assert "--write" in info.value.fix, kind
    assert "DELETE" in str(_refused(WRITES["DELETE after a comment, odd case"]))
    assert "statement 2 of 2" in str(_refused(WRITES["a write as a second statement"]))
    assert "OPTIMIZE" in str(_refused(WRITES["OPTIMIZE"]))
    with pytest.raises(UserError, match="syntax error: 2 statements"):
        classify("SELECT 1; SELECT 2")
    with pytest.raises(UserError, match="empty SQL statement"):
        classify(" -- nothing\n")


def _refused(statement: str) -> UserError:
    with pytest.raises(UserError) as info:
        classify(statement)
    return info.value


def test_queries_take_the_fast_path_and_the_rest_goes_to_spark():
    for statement in FAST:
        assert classify(statement) == "duckdb", statement
    for statement in TO_SPARK:
        with pytest.raises(NotFast):
            classify(statement)
    assert first_word("/* a */ -- b\n  (select 1)") == "(" and first_word("\n with x as (select 1)") == "WITH"


def test_route_follows_the_conf_and_the_engine_asked_for(tmp_path, monkeypatch):
    monkeypatch.setenv("ERG_HOME", str(tmp_path))
    cfg = load_config("test")
    assert route(cfg, FAST[0]) == ("duckdb", None)
    assert route(cfg, FAST[0], "spark") == ("spark", None)
    assert route(cfg, TO_SPARK[0])[0] == "spark" and "SHOW" in route(cfg, TO_SPARK[0])[1]
    with pytest.raises(UserError, match="--engine duckdb cannot"):
        route(cfg, TO_SPARK[0], "duckdb")
    remote = load_config("test", ["spark.remote=sc://127.0.0.1:15002"])
    assert route(remote, FAST[0]) == ("spark", "spark.remote is set (the tables are the Connect server's)")


def test_values_print_as_spark_shows_them():
    assert [spark_text(v) for v in (None, True, 0.5, 1e7, 1.5e-5, 100.0, 12345678.9, 3, "x")] == [
        "NULL", "true", "0.5", "1.0E7", "1.5E-5", "100.0", "1.23456789E7", "3", "x"]
    assert spark_text(dt.datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=dt.timezone.utc)) == "2026-01-02 03:04:05.678"
    assert spark_text(dt.datetime(2026, 1, 2)) == "2026-01-02 00:00:00"
    assert spark_text([0.10000000149011612, None], "FLOAT[]") == "[0.1, NULL]"
    assert spark_text(b"\x01\xff") == "[01 FF]"
    result = Result(["style", "count(1)"], ["VARCHAR", "BIGINT"], [("humor", 12), ("a much longer style", 3)])
    # widths from the rows shown, as Spark's showString
    assert show(result, 1, 10) == ("+-----+--------+\n"
                                   "|style|count(1)|\n"
                                   "+-----+--------+\n"
                                   "|humor|      12|\n"
                                   "+-----+--------+\n"
                                   "only showing top 1 row\n")
    assert "|a much l...|" in show(result, 5, 11) and "|a much longer style|3       |" in show(result, 5, 0)
