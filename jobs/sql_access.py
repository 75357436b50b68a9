"""``erg sql`` is read-only unless asked: which statements only read, decided by Spark's own parser.

A statement runs by default only when every node of its parsed plan is one that reads (:data:`READ_ONLY_NODES`:
the relational operators of a query, SHOW, DESCRIBE, EXPLAIN). Anything else (INSERT, UPDATE, DELETE, MERGE,
CREATE, DROP, ALTER, TRUNCATE, RESTORE, OPTIMIZE, VACUUM, SET, CACHE, ...) is refused before Spark runs it, however
it is written: after a comment, in odd case, under a WITH, or as a second statement (which Spark's parser rejects
as a syntax error). An allowlist, not a list of writes: a plan node this module does not know is refused (use
``--write``), never run by mistake. With ``--write`` the statement runs and is logged to MLflow with the Delta
version of every table before and after (:func:`run_write`).

On a classic session the plan comes from the session's parser (py4j); on Spark Connect, which has none, from the
parsed plan of ``EXPLAIN EXTENDED`` (which parses and analyses, never runs).

Locally, a query that DuckDB reads as a plain SELECT does not need Spark at all: :mod:`jobs.sql_fast` answers it
(and refuses writes by DuckDB's parser); :func:`run_query` runs a query on either path.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING

from jobs.platform.config import ErgConfig
from jobs.platform.errors import UserError
from jobs.sql_fast import refusal

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import SparkSession

READ_ONLY_NODES = frozenset({
    # queries
    "Project", "Filter", "Aggregate", "Sort", "GlobalLimit", "LocalLimit", "Limit", "Offset", "Tail", "Join",
    "LateralJoin", "SubqueryAlias", "UnresolvedRelation", "UnresolvedWith", "WithCTE", "CTERelationDef",
    "CTERelationRef", "OneRowRelation", "LocalRelation", "UnresolvedInlineTable", "Union", "Intersect", "Except",
    "Distinct", "Deduplicate", "Window", "UnresolvedHaving", "Generate", "Pivot", "Unpivot", "Sample",
    "RepartitionByExpression", "Repartition", "RebalancePartitions", "UnresolvedTableValuedFunction",
    "UnresolvedTVFAliases", "RelationTimeTravel", "UnresolvedSubqueryColumnAliases", "Expand", "Range",
    "PlanWithUnresolvedIdentifier", "UnresolvedNamespace", "UnresolvedTableOrView", "UnresolvedTable",
    "UnresolvedView", "UnresolvedIdentifier", "UnresolvedFunctionName",
    # SHOW, DESCRIBE, EXPLAIN
    "ShowTables", "ShowTablesExtended", "ShowViews", "ShowColumns", "ShowNamespaces", "ShowFunctions",
    "ShowTableProperties", "ShowCreateTable", "ShowPartitions", "ShowCatalogs", "ShowCurrentNamespace",
    "DescribeRelation", "DescribeColumn", "DescribeNamespace", "DescribeFunction", "DescribeQuery",
    "DescribeDeltaHistory", "DescribeDeltaDetail", "ExplainCommand",
})


def _plan_nodes_classic(spark: SparkSession, query: str) -> list[str]:
    """Class names of every node of the parsed plan (children and inner children, e.g. a CTE's definitions)."""
    jvm = spark._jvm
    plan_class = jvm.java.lang.Class.forName("org.apache.spark.sql.catalyst.plans.logical.LogicalPlan")
    names: list[str] = []
    todo = [spark._jsparkSession.sessionState().sqlParser().parsePlan(query)]
    while todo:
        node = todo.pop()
        names.append(node.getClass().getSimpleName())
        for seq in (node.children(), node.innerChildren()):
            for i in range(seq.size()):
                child = seq.apply(i)
                if plan_class.isInstance(child):
                    todo.append(child)
    return names


_NODE = re.compile(r"^[\s:+\-|!]*'?([A-Z]\w*)")


def _plan_nodes_explained(spark: SparkSession, query: str) -> list[str]:
    """Node names of the parsed plan that ``EXPLAIN EXTENDED`` prints (Spark Connect)."""
    text = spark.sql(f"EXPLAIN EXTENDED {query}").collect()[0][0]
    parsed = text.split("== Parsed Logical Plan ==", 1)[-1].split("== Analyzed Logical Plan ==", 1)[0]
    return [m.group(1) for line in parsed.splitlines() if (m := _NODE.match(line))]


def writing_node(spark: SparkSession, query: str) -> str | None:
    """The first node of ``query``'s parsed plan that is not read-only (e.g. ``DeleteFromTable``), or None when the
    statement only reads. A statement Spark cannot parse raises its ParseException (a user error)."""
    if not query.strip():
        raise UserError("empty SQL statement", "pass a query, e.g. erg sql \"SHOW TABLES IN erg\"")
    classic = getattr(spark, "_jsparkSession", None) is not None
    nodes = _plan_nodes_classic(spark, query) if classic else _plan_nodes_explained(spark, query)
    return next((n for n in nodes if n not in READ_ONLY_NODES), None)


def check_read_only(spark: SparkSession, query: str) -> None:
    """A :class:`UserError` (exit 2, one line and the fix) when ``query`` would write or change state."""
    node = writing_node(spark, query)
    if node is not None:
        raise refusal(node)


def table_versions(spark: SparkSession, cfg: ErgConfig) -> dict[str, int]:
    """The latest Delta version of every table of the schema that exists."""
    from jobs.platform.tables import TABLES, table_name
    from jobs.platform.watermarks import table_version

    return {table: table_version(spark, cfg, table) for table in TABLES
            if spark.catalog.tableExists(table_name(cfg, table))}


def run_write(spark: SparkSession, cfg: ErgConfig, query: str):
    """Run a statement that may write (``erg sql --write``) inside an MLflow run that logs it and every table's
    Delta version before and after (``version_before.<table>``, ``version_after.<table>``); returns its result."""
    import mlflow

    from jobs.platform.tracking import job_run, log_counts

    with job_run(cfg, "sql_write", params={"statement": query[:5000]}):
        mlflow.set_tag("erg.sql_statement", query[:5000])
        before = table_versions(spark, cfg)
        result = spark.sql(query)
        result.count() if result.columns else None  # a command runs on spark.sql; a query is read here
        after = table_versions(spark, cfg)
        log_counts({**{f"version_before.{t}": v for t, v in before.items()},
                    **{f"version_after.{t}": v for t, v in after.items()}})
        mlflow.log_dict({"statement": query, "before": before, "after": after}, "sql_write.json")
        return result


def sql(spark: SparkSession, cfg: ErgConfig, query: str, *, write: bool = False):
    """``erg sql``: the result of ``query`` over the tables. Read-only unless ``write``: a statement that would
    write or change state is refused before Spark runs it (:func:`check_read_only`); with ``write`` it runs and is
    logged (:func:`run_write`)."""
    if write:
        return run_write(spark, cfg, query)
    check_read_only(spark, query)
    return spark.sql(query)


def run_query(cfg: ErgConfig, query: str, engine: str = "auto") -> "pd.DataFrame":
    """A read-only query's whole answer as pandas, on DuckDB where :func:`jobs.sql_fast.route` allows it (no Spark
    session is started then), else on Spark; ``attrs["engine"]`` says which answered and ``attrs["note"]`` why
    Spark did. A statement that writes raises the refusal (:class:`UserError`) on both paths."""
    from jobs import sql_fast

    chosen, note = sql_fast.route(cfg, query, engine)
    if chosen == "duckdb":
        try:
            arrow = sql_fast.query_arrow(cfg, query)
        except sql_fast.NotFast as exc:
            if engine == "duckdb":
                raise UserError(f"--engine duckdb cannot run this statement: {exc}",
                                "leave --engine at auto (Spark runs it)") from None
            note = str(exc)
        else:
            frame = arrow.to_pandas()
            for column in frame.columns:  # Spark hands timestamps over in its session time zone (UTC), naive
                if getattr(frame[column].dtype, "tz", None) is not None:
                    frame[column] = frame[column].dt.tz_convert("UTC").dt.tz_localize(None)
            frame.attrs.update(engine="duckdb", note=None)
            return frame
    from jobs.platform.spark import get_spark

    spark = get_spark(cfg)
    check_read_only(spark, query)
    frame = spark.sql(query).toPandas()
    frame.attrs.update(engine="spark", note=note)
    return frame
