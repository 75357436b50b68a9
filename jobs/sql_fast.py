"""``erg sql`` without Spark: a query over the local Delta tables answered by DuckDB, with no JVM to start.

Where it applies (:func:`unavailable_reason` is None): a local home whose tables live in folders
(``tables.location``, the local default), no Spark Connect server, no Unity Catalog. There a statement takes this
path when DuckDB's own parser reads it as exactly one SELECT (``SELECT``, ``WITH ... SELECT``, ``VALUES``); then

- only the tables it names are opened, by the delta-kernel reader (``delta-kernel-rust-sharing-wrapper``, the Delta
  project's Rust kernel), which applies deletion vectors (``retrievals`` has them) and refuses a table whose reader
  features it does not support: that table's query goes to Spark with a note;
- each opened table is an in-memory Arrow table behind a view ``<schema>.<table>`` (``training_set`` is the same
  view as Spark's, over them); the connection then has file access and configuration changes switched off, so the
  query can read nothing else and write nothing at all;
- DuckDB is set to Spark's NULL order and the UTC time zone, so common SQL (filters, joins, GROUP BY, ORDER BY,
  aggregates) gives Spark's answer.

A statement DuckDB parses as anything but a query (INSERT, UPDATE, DELETE, MERGE, CREATE, DROP, ALTER, TRUNCATE,
VACUUM, COPY, ATTACH, SET, ...), or more than one statement, is refused before anything runs (exit 2, the same line
as Spark's check, see :mod:`jobs.sql_access`); one it cannot parse whose first word writes (RESTORE, OPTIMIZE,
CACHE, ...) too. Everything else that is not plainly a query for DuckDB goes to Spark, whose parser decides as before:
SHOW, DESCRIBE, EXPLAIN, time travel (``VERSION AS OF``), Spark-only syntax or functions (a DuckDB error), double
quotes (Spark reads ``"x"`` as a string, DuckDB as a name) and the functions whose meaning differs between the two
(:data:`SPARK_ONLY_FUNCTIONS`). This module imports neither pyspark nor pandas.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobs.platform.config import ErgConfig
from jobs.platform.errors import UserError

READ_ONLY_WORDS = "queries (SELECT, WITH ... SELECT, VALUES, SHOW, DESCRIBE, EXPLAIN)"
#: the tables of :data:`jobs.platform.tables.TABLES` (listed here so that this module needs no pyspark)
TABLE_NAMES = ("stylized_captions", "factual_captions", "images", "quarantine", "style_phrases", "embeddings",
               "retrievals", "augmented_captions")
#: first words of a statement DuckDB runs when it parses it as a SELECT
QUERY_WORDS = frozenset({"SELECT", "WITH", "VALUES", "("})
#: first words of read-only statements whose output is Spark's own (its parser checks them)
SPARK_WORDS = frozenset({"SHOW", "DESCRIBE", "DESC", "EXPLAIN", "LIST"})
#: first words of statements that write or change state, refused even where DuckDB cannot parse them
WRITE_WORDS = frozenset({
    "INSERT", "UPDATE", "DELETE", "MERGE", "UPSERT", "REPLACE", "CREATE", "DROP", "ALTER", "TRUNCATE", "RESTORE",
    "OPTIMIZE", "VACUUM", "REORG", "SET", "RESET", "CACHE", "UNCACHE", "CLEAR", "REFRESH", "MSCK", "REPAIR", "ANALYZE",
    "COPY", "LOAD", "ADD", "USE", "GRANT", "REVOKE", "CALL", "CONVERT", "CLONE", "FSCK", "COMMENT", "ATTACH", "DETACH",
    "INSTALL", "EXPORT", "IMPORT", "PRAGMA", "BEGIN", "START", "COMMIT", "ROLLBACK", "CHECKPOINT", "DECLARE", "EXECUTE",
    "PREPARE", "DEALLOCATE", "UNDROP", "APPLY", "SYNC", "GENERATE"})
#: functions both engines know but answer differently (NULLs in concat, Java vs RE2 regular expressions, hashes,
#: random numbers, approximations, formats): a query that calls one runs on Spark
SPARK_ONLY_FUNCTIONS = frozenset({
    "concat", "split", "regexp_replace", "regexp_extract", "regexp_extract_all", "regexp_like", "rlike",
    "regexp", "hash", "xxhash64", "md5", "sha1", "sha2", "crc32", "rand", "random", "randn", "uuid", "shuffle",
    "approx_count_distinct", "approx_percentile", "percentile_approx", "first", "last", "any_value",
    "date_format", "from_unixtime", "unix_timestamp", "to_timestamp", "to_date", "format_number", "format_string",
    "printf", "range", "round", "bround", "collect_list", "collect_set", "sort_array", "array_sort", "size",
    "sequence", "explode", "posexplode", "inline", "stack", "json_tuple", "get_json_object", "from_json", "to_json",
    "element_at", "slice", "substring_index", "locate", "position", "instr", "mode", "median", "percentile"})


class NotFast(Exception):
    """This statement (or a table it reads) is answered by Spark instead; the message says why, for the note."""


@dataclass
class Result:
    """A query's answer: column names, DuckDB type names and rows (tuples of Python values)."""
    columns: list[str]
    types: list[str]
    rows: list[tuple]


def unavailable_reason(cfg: ErgConfig) -> str | None:
    """Why the fast path cannot serve ``cfg`` (None where it can)."""
    if cfg.platform != "local":
        return "the tables are the cluster's (platform databricks)"
    if cfg.spark.remote:
        return "spark.remote is set (the tables are the Connect server's)"
    if cfg.tables.catalog:
        return "tables.catalog is set (Unity Catalog names)"
    if not cfg.tables.location:
        return "tables.location is null (managed tables of the Spark catalog)"
    return None


_COMMENT = re.compile(r"\s+|--[^\n]*(?:\n|$)|/\*.*?\*/", re.S)


def first_word(sql: str) -> str:
    """The statement's first keyword in upper case, past white space and comments ('(' for a parenthesised query)."""
    pos = 0
    while (m := _COMMENT.match(sql, pos)) and m.end() > pos:
        pos = m.end()
    if sql[pos:pos + 1] == "(":
        return "("
    m = re.match(r"[A-Za-z_]+", sql[pos:])
    return m.group(0).upper() if m else ""


def _article(word: str) -> str:
    return f"an {word}" if word[:1].upper() in "AEIOU" else f"a {word}"


def refusal(what: str) -> UserError:
    """The one-line refusal of a statement that is not read-only, and the fix (as :mod:`jobs.sql_access`)."""
    return UserError(f"refused: the statement is {_article(what)}, and erg sql runs only {READ_ONLY_WORDS} by default",
                     "add --write to run it (it is logged to MLflow with every table's Delta version before and "
                     "after)")


def _strip_literals(sql: str) -> str:
    """``sql`` without its comments and single-quoted strings (to look for words and double quotes in the rest)."""
    return re.sub(r"--[^\n]*|/\*.*?\*/|'(?:[^']|'')*'", " ", sql, flags=re.S)


def classify(sql: str) -> str:
    """``"duckdb"`` when the fast path may run ``sql``, else raises :class:`NotFast` (Spark decides and runs it) or a
    refusal :class:`UserError` (it writes or changes state). Nothing is run."""
    import duckdb

    if not sql.strip():
        raise UserError("empty SQL statement", "pass a query, e.g. erg sql \"SHOW TABLES IN erg\"")
    word = first_word(sql)
    if word in SPARK_WORDS:
        raise NotFast(f"{word} is answered by Spark")
    try:
        statements = duckdb.connect(":memory:").extract_statements(sql)
    except duckdb.Error:  # not DuckDB's SQL: a write by its first word is refused here, anything else is Spark's
        if word in WRITE_WORDS:
            raise refusal(word) from None
        raise NotFast("DuckDB cannot parse it (Spark SQL only)") from None
    kinds = [s.type.name for s in statements]
    if not kinds:
        raise UserError("empty SQL statement", "pass a query, e.g. erg sql \"SHOW TABLES IN erg\"")
    writes = [k for k in kinds if k != "SELECT"]
    if writes:
        what = word if word in WRITE_WORDS and len(kinds) == 1 else writes[0].replace("_", " ")
        raise refusal(what if len(kinds) == 1 else f"{what} (as statement {kinds.index(writes[0]) + 1} of "
                      f"{len(kinds)})")
    if len(kinds) > 1:
        raise UserError(f"SQL syntax error: {len(kinds)} statements; erg sql runs one at a time", "fix the query")
    if word not in QUERY_WORDS:
        raise NotFast(f"{word or 'this statement'} is Spark SQL")
    rest = _strip_literals(sql)
    if '"' in rest:
        raise NotFast('double quotes: Spark reads "x" as a string, DuckDB as a name')
    called = {m.group(1).lower() for m in re.finditer(r"\b([A-Za-z_]\w*)\s*\(", rest)}
    if differing := sorted(called & SPARK_ONLY_FUNCTIONS):
        raise NotFast(f"{', '.join(differing)}() differ{'s' if len(differing) == 1 else ''} between DuckDB and "
                      "Spark")
    return "duckdb"


def table_folder(cfg: ErgConfig, table: str) -> Path:
    return Path(cfg.tables.location) / cfg.tables.schema_name / table


def read_delta(folder: Path):
    """The current snapshot of the Delta table in ``folder`` as a pyarrow Table (deletion vectors applied)."""
    import delta_kernel_rust_sharing_wrapper as kernel
    import pyarrow as pa

    uri = folder.resolve().as_uri() + "/"
    interface = kernel.PythonInterface(uri)
    snapshot = kernel.Table(uri).snapshot(interface)
    reader = kernel.ScanBuilder(snapshot).build().execute(interface)
    return pa.Table.from_batches(list(reader), schema=reader.schema)


def _training_set_sql(schema: str) -> str:
    """Spark's ``training_set`` view (:func:`jobs.platform.tables.create_training_set_view`) in SQL both engines read
    alike."""
    return f"""
        SELECT scene_id AS pair_id, image_id, image_uri, caption, style, split, 'original' AS origin, run_id,
               scene_id, CAST(NULL AS VARCHAR) AS generator_version, CAST(NULL AS VARCHAR) AS factual_caption,
               CAST(NULL AS VARCHAR) AS retrieval_type, CAST(NULL AS DOUBLE) AS perplexity
        FROM {schema}.stylized_captions
        UNION ALL
        SELECT concat_ws('|', a.query_id, a.scene_id, a.retrieval_type, a.generator_version) AS pair_id,
               a.image_id, a.image_uri, a.generated_caption AS caption, a.style, 'train' AS split,
               'augmented' AS origin, a.run_id, a.scene_id, a.generator_version, a.factual_caption,
               a.retrieval_type, a.perplexity
        FROM {schema}.augmented_captions a
        WHERE a.passed
          AND a.image_id NOT IN (SELECT image_id FROM {schema}.stylized_captions WHERE coalesce(split, '') <> 'train')
          AND a.scene_id IN (SELECT scene_id FROM {schema}.stylized_captions WHERE split = 'train')"""


_ALIAS = re.compile(r"\s+AS\s+\S+$", re.IGNORECASE)


def referenced_tables(cfg: ErgConfig, sql: str) -> list[str]:
    """The erg tables ``sql`` reads (``training_set``'s own tables included); an unknown name is a user error, a
    name outside the schema's tables Spark's to resolve."""
    import duckdb

    schema = cfg.tables.schema_name
    wanted: list[str] = []
    for name in sorted(duckdb.get_table_names(sql, qualified=True)):
        name = _ALIAS.sub("", name)  # duckdb 2 names a table with its alias: "s.retrievals AS r"
        parts = [p.strip('`"') for p in name.split(".")]
        if len(parts) == 3 and parts[0].lower() == "spark_catalog":
            parts = parts[1:]
        if len(parts) != 2 or parts[0].lower() != schema.lower():
            raise NotFast(f"{name} is not a table of the schema {schema}")
        table = parts[1].lower()
        if table == "training_set":
            wanted += ["stylized_captions", "augmented_captions"]
        elif table in TABLE_NAMES:
            wanted.append(table)
        else:
            raise UserError(f"the table or view {schema}.{parts[1]} cannot be found",
                            f"check the name (`erg sql \"SHOW TABLES IN {schema}\"` lists the tables) or run the job "
                            "that writes it (`erg run` writes them all)")
    return sorted(set(wanted))


def connect(cfg: ErgConfig, tables: list[str]):
    """A DuckDB connection with views ``<schema>.<table>`` over in-memory Arrow copies of ``tables`` (and
    ``training_set``), then locked: no file access, no configuration change."""
    import duckdb

    schema = cfg.tables.schema_name
    con = duckdb.connect(":memory:", config={"threads": 2})
    con.execute("SET default_null_order = 'nulls_first_on_asc_last_on_desc'")  # Spark's NULL order
    con.execute("SET TimeZone = 'UTC'")  # spark.sql.session.timeZone of jobs.platform.spark
    con.execute(f'CREATE SCHEMA "{schema}"')
    for table in tables:
        folder = table_folder(cfg, table)
        if not (folder / "_delta_log").is_dir():
            raise NotFast(f"{schema}.{table} has no Delta table yet (Spark creates it empty)")
        try:
            arrow = read_delta(folder)
        except Exception as exc:  # noqa: BLE001 - the kernel refuses a reader feature it lacks, or fails to read
            raise NotFast(f"{schema}.{table}: {str(exc).strip().splitlines()[0][:200]}") from None
        con.register(f"__erg_{table}", arrow)
        con.execute(f'CREATE VIEW "{schema}"."{table}" AS SELECT * FROM "__erg_{table}"')
    if {"stylized_captions", "augmented_captions"} <= set(tables):
        con.execute(f'CREATE VIEW "{schema}".training_set AS {_training_set_sql(schema)}')
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
    return con


#: column names DuckDB gives where Spark gives another
_SPARK_NAMES = {"count_star()": "count(1)"}


def query(cfg: ErgConfig, sql: str, limit: int | None = None) -> Result:
    """Run a query that :func:`classify` accepted; at most ``limit`` + 1 rows are fetched when ``limit`` is set
    (so the caller can tell there were more). A DuckDB error raises :class:`NotFast` (Spark runs it and reports its
    own error, if any)."""
    import duckdb

    con = connect(cfg, referenced_tables(cfg, sql))
    try:
        cursor = con.execute(sql)
        rows = cursor.fetchall() if limit is None else cursor.fetchmany(limit + 1)
    except duckdb.Error as exc:
        raise NotFast(f"DuckDB: {str(exc).strip().splitlines()[0][:200]}") from None
    columns = [_SPARK_NAMES.get(d[0], d[0]) for d in cursor.description]
    types = [str(d[1]) for d in cursor.description]
    con.close()
    return Result(columns, types, rows)


def query_arrow(cfg: ErgConfig, sql: str):
    """Run a query that :func:`classify` accepted; its whole answer as a pyarrow Table (Spark's column names)."""
    import duckdb

    con = connect(cfg, referenced_tables(cfg, sql))
    try:
        table = con.execute(sql).to_arrow_table()  # duckdb 2: fetch_arrow_table is gone
    except duckdb.Error as exc:
        raise NotFast(f"DuckDB: {str(exc).strip().splitlines()[0][:200]}") from None
    finally:
        con.close()
    return table.rename_columns([_SPARK_NAMES.get(c, c) for c in table.column_names])


# ------------------------------------------------------------------------------------------------ printing
def _java_double(value: float) -> str:
    """A double as Java's ``Double.toString`` writes it (what Spark shows): 0.5, 100.0, 1.0E7, 1.0E-4, NaN."""
    from decimal import Decimal

    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "Infinity" if value > 0 else "-Infinity"
    sign = "-" if str(value).startswith("-") else ""
    if value == 0:
        return f"{sign}0.0"
    shortest = Decimal(repr(abs(value)))  # the shortest digits that read back as the value, as Java picks them
    digits = "".join(map(str, shortest.as_tuple().digits)).rstrip("0") or "0"
    exponent = shortest.adjusted()  # of the leading digit
    if 1e-3 <= abs(value) < 1e7:
        if exponent >= 0:
            whole, fraction = digits[:exponent + 1].ljust(exponent + 1, "0"), digits[exponent + 1:]
        else:
            whole, fraction = "0", "0" * (-exponent - 1) + digits
        return f"{sign}{whole}.{fraction or '0'}"
    return f"{sign}{digits[0]}.{digits[1:] or '0'}E{exponent}"


def _float32(value: float) -> float:
    """The shortest decimal that is the same float32 as ``value`` (Java's ``Float.toString`` digits)."""
    import struct

    bits = struct.pack("f", value)
    for digits in range(1, 10):
        candidate = float(f"{value:.{digits}g}")
        if struct.pack("f", candidate) == bits:
            return candidate
    return value


def spark_text(value: Any, type_name: str = "") -> str:
    """A value as Spark's ``show()`` prints it."""
    import datetime as dt
    from decimal import Decimal

    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return _java_double(_float32(value) if type_name.upper() == "FLOAT" else value)
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.timezone.utc).replace(tzinfo=None)
        text = value.strftime("%Y-%m-%d %H:%M:%S")
        if value.microsecond:
            text += f".{value.microsecond:06d}".rstrip("0")
        return text
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "[" + " ".join(f"{b:02X}" for b in bytes(value)) + "]"
    if isinstance(value, (list, tuple)):
        inner = type_name[:-2] if type_name.endswith("[]") else ""
        return "[" + ", ".join("NULL" if v is None else spark_text(v, inner) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{spark_text(v)}" for v in value.values()) + "}"
    if isinstance(value, Decimal):
        return str(value)
    return str(value)


def show(result: Result, limit: int = 20, truncate: int = 20) -> str:
    """``result`` as Spark's ``DataFrame.show(limit, truncate)`` prints it."""
    rows = result.rows[:limit]
    cells = [[spark_text(v, t) for v, t in zip(row, result.types)] for row in rows]
    if truncate > 0:
        cells = [[c if len(c) <= truncate else (c[:truncate] if truncate < 4 else c[:truncate - 3] + "...")
                  for c in row] for row in cells]
    header = list(result.columns)
    widths = [max(3, len(h), *(len(row[i]) for row in cells)) for i, h in enumerate(header)]

    def line(values: list[str]) -> str:
        if truncate > 0:
            return "|" + "|".join(v.rjust(w) for v, w in zip(values, widths)) + "|"
        return "|" + "|".join(v.ljust(w) for v, w in zip(values, widths)) + "|"

    rule = "+" + "+".join("-" * w for w in widths) + "+"
    out = [rule, line(header), rule, *(line(row) for row in cells), rule]
    if len(result.rows) > limit:
        out.append(f"only showing top {limit} row{'s' if limit != 1 else ''}")
    return "\n".join(out) + "\n"


ENGINES = ("auto", "duckdb", "spark")


def route(cfg: ErgConfig, sql: str, engine: str = "auto") -> tuple[str, str | None]:
    """Which engine answers the read-only ``sql``: ``("duckdb", None)``, or ``("spark", why)`` (``why`` None when
    Spark was asked for). Raises the refusal of a statement that writes (:func:`classify`); with ``engine`` "duckdb",
    a :class:`UserError` where the fast path cannot run it."""
    if engine not in ENGINES:
        raise UserError(f"unknown engine {engine!r}", f"use one of {', '.join(ENGINES)}")
    if engine == "spark":
        return "spark", None
    why = unavailable_reason(cfg)
    if why is None:
        try:
            return classify(sql), None
        except NotFast as exc:
            why = str(exc)
    if engine == "duckdb":
        raise UserError(f"--engine duckdb cannot run this statement: {why}", "leave --engine at auto (Spark runs it)")
    return "spark", why
