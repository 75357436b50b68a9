"""Every kind of SQL statement that writes, and the tricky ways of writing one: the forms ``erg sql`` must refuse on
both of its engines (tests/test_sql_fast.py: DuckDB's parser; tests/test_sql_access_spark.py: Spark's)."""
from __future__ import annotations


def write_statements(schema: str, table: str) -> dict[str, str]:
    """Statement kind -> a statement of that kind on ``<schema>.<table>``."""
    SCHEMA, T = schema, f"{schema}.{table}"
    return {
        "INSERT": f"INSERT INTO {T} SELECT * FROM {T}",
        "INSERT under WITH": f"WITH x AS (SELECT * FROM {T}) INSERT INTO {T} SELECT * FROM x",
        "UPDATE": f"UPDATE {T} SET tags = 'x'",
        "DELETE": f"DELETE FROM {T} WHERE true",
        "DELETE after a comment, odd case": f"/* just a look */ dElEtE fRoM {T} -- really\n WHERE true",
        "MERGE": f"MERGE INTO {T} t USING {T} s ON t.image_id = s.image_id WHEN MATCHED THEN DELETE",
        "CREATE": f"CREATE TABLE {SCHEMA}.other (a INT) USING DELTA",
        "DROP": f"DROP TABLE {T}",
        "ALTER": f"ALTER TABLE {T} ADD COLUMNS (x INT)",
        "SET a table property": f"ALTER TABLE {T} SET TBLPROPERTIES ('owner' = 'me')",
        "TRUNCATE": f"TRUNCATE TABLE {T}",
        "RESTORE": f"RESTORE TABLE {T} TO VERSION AS OF 0",
        "OPTIMIZE": f"OPTIMIZE {T}",
        "VACUUM": f"VACUUM {T}",
        "SET": "SET spark.sql.shuffle.partitions = 3",
        "CACHE": f"CACHE TABLE {T}",
        "a write as a second statement": f"SELECT 1; DROP TABLE {T}",
        "CREATE AS SELECT": f"CREATE TABLE {SCHEMA}.other USING DELTA AS SELECT * FROM {T}",
    }
