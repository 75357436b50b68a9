"""The tables of DESIGN.md (one schema, default ``erg``): names, schemas, natural keys, and idempotent writes.

Every write is a Delta MERGE on the table's natural key: a rerun, or a rerun after a crash, leaves the same rows
and never duplicates. Tables are created with Change Data Feed on, so downstream jobs can read what is new.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from jobs.platform.config import ErgConfig

_S, _I, _L, _D, _B = T.StringType(), T.IntegerType(), T.LongType(), T.DoubleType(), T.BooleanType()
_TS = T.TimestampType()


def _schema(*fields: tuple[str, T.DataType, bool]) -> T.StructType:
    return T.StructType([T.StructField(name, dtype, nullable) for name, dtype, nullable in fields])


@dataclass(frozen=True)
class TableSpec:
    name: str
    keys: tuple[str, ...]
    schema: T.StructType
    comment: str
    #: MERGEs change rows spread over the whole table (an incremental retrieve re-ranks hits of every query): they
    #: mark them in deletion vectors instead of rewriting every file they touch
    deletion_vectors: bool = False


TABLES: dict[str, TableSpec] = {spec.name: spec for spec in [
    TableSpec("stylized_captions", ("scene_id",), _schema(
        ("scene_id", _S, False), ("image_id", _S, False), ("image_uri", _S, True), ("caption", _S, False),
        ("style", _S, False), ("split", _S, True), ("source", _S, False), ("source_key", _S, True),
        ("ingest_time", _TS, False), ("run_id", _S, True)),
        "D_s: one stylized caption (a scene = a stylized caption with its image)"),
    TableSpec("factual_captions", ("caption_id",), _schema(
        ("caption_id", _S, False), ("image_id", _S, False), ("image_uri", _S, True), ("caption", _S, False),
        ("source", _S, False), ("split", _S, True), ("ingest_time", _TS, False), ("run_id", _S, True)),
        "P: one factual caption"),
    TableSpec("images", ("image_id",), _schema(
        ("image_id", _S, False), ("uri", _S, True), ("tags", _S, True), ("region_features", T.BinaryType(), True),
        ("n_regions", _I, True), ("width", _I, True), ("height", _I, True), ("source", _S, False),
        ("ingest_time", _TS, False), ("run_id", _S, True), ("descriptions", T.ArrayType(_S), True),
        ("tags_confidence", _D, True)),
        "one image: uri, visual context (object tags with the label classifier's mean confidence in them; "
        "descriptions = factual captions of a stylized image, which are not part of P), optional region features "
        "(float32 [n_regions, 2054])"),
    TableSpec("quarantine", ("quarantine_id",), _schema(
        ("quarantine_id", _S, False), ("source", _S, False), ("source_file", _S, True), ("line_no", _L, True),
        ("raw", _S, True), ("reason", _S, False), ("quarantined_at", _TS, False), ("run_id", _S, True)),
        "one rejected input row, kept with its reason"),
    TableSpec("style_phrases", ("scene_id",), _schema(
        ("scene_id", _S, False), ("style", _S, False), ("caption", _S, False), ("tokens", T.ArrayType(_S), False),
        ("importance", T.ArrayType(_D), False), ("style_phrase", _S, False), ("phrase_words", T.ArrayType(_S), False),
        ("phrase_mask", T.ArrayType(_B), False),
        ("content", _S, False), ("layer", _I, False), ("head", _I, False), ("eps", _D, False),
        ("classifier_version", _S, False), ("run_id", _S, False), ("created_at", _TS, False)),
        "D'_s: the style phrase e^s and content of each stylized caption under the selected head (l_s, h_s)"),
    TableSpec("embeddings", ("item_id", "modality", "encoder_version"), _schema(
        ("item_id", _S, False), ("item_kind", _S, False), ("modality", _S, False), ("vector", T.ArrayType(T.FloatType()), False),
        ("encoder", _S, False), ("encoder_version", _S, False), ("run_id", _S, False), ("created_at", _TS, False)),
        "one item (scene, factual caption or image) x modality (image/text) x encoder version"),
    TableSpec("retrievals", ("query_id", "scene_id", "retrieval_type", "encoder_version"), _schema(
        ("query_id", _S, False), ("query_image_id", _S, False), ("scene_id", _S, False), ("retrieval_type", _S, False),
        ("rank", _I, False), ("similarity", _D, False), ("encoder_version", _S, False), ("run_id", _S, False),
        ("created_at", _TS, False)),
        "P': factual query (caption id) x stylized scene hit, per retrieval type", deletion_vectors=True),
    TableSpec("augmented_captions", ("query_id", "scene_id", "retrieval_type", "generator_version"), _schema(
        ("query_id", _S, False), ("image_id", _S, False), ("image_uri", _S, True), ("factual_caption", _S, False),
        ("scene_id", _S, False), ("retrieval_type", _S, False), ("style", _S, False), ("style_phrase", _S, False),
        ("generated_caption", _S, False), ("similarity", _D, False), ("predicted_style", _S, True),
        ("style_probability", _D, True), ("perplexity", _D, True), ("passed_style", _B, False),
        ("passed_perplexity", _B, False), ("passed_similarity", _B, False), ("content_similarity", _D, True),
        ("passed_content", _B, True), ("passed_well_formed", _B, True), ("passed", _B, False),
        ("reject_reason", _S, True), ("generator_version", _S, False), ("run_id", _S, False), ("created_at", _TS, False),
        ("transfer_phrase", _S, True), ("factual_relatedness", _D, True), ("generated_relatedness", _D, True),
        ("passed_visual", _B, True), ("fluency", _D, True), ("passed_fluent", _B, True)),
        "D_a: one generated caption with every filter verdict (failed candidates are kept with their reason)"),
]}


def table_name(cfg: ErgConfig, table: str) -> str:
    """``erg.stylized_captions`` locally; ``<catalog>.<schema>.<table>`` in Unity Catalog."""
    if table not in TABLES and table != "training_set":
        raise KeyError(f"unknown table {table!r}; tables are {sorted(TABLES)}")
    prefix = f"{cfg.tables.catalog}.{cfg.tables.schema_name}" if cfg.tables.catalog else cfg.tables.schema_name
    return f"{prefix}.{table}"


def table_location(cfg: ErgConfig, table: str) -> str | None:
    if not cfg.tables.location:
        return None
    return str(Path(cfg.tables.location) / cfg.tables.schema_name / table)


def register_tables(spark: SparkSession, cfg: ErgConfig) -> None:
    """Create the schema and every table (empty, Change Data Feed on) if absent; names resolve afterwards."""
    prefix = f"{cfg.tables.catalog}.{cfg.tables.schema_name}" if cfg.tables.catalog else cfg.tables.schema_name
    spark.sql(f"CREATE SCHEMA IF NOT EXISTS {prefix}")
    for table in TABLES:
        ensure_table(spark, cfg, table)
    create_training_set_view(spark, cfg)


def create_training_set_view(spark: SparkSession, cfg: ErgConfig) -> str:
    """``training_set``: the original stylized pairs plus the augmented captions that passed every filter.

    ``origin`` tells them apart ('original' / 'augmented'); augmented pairs are training data only (split
    'train'), and never show an image of the val/test split of the stylized set nor carry a phrase from a scene
    outside its train split. ``scene_id`` is the stylized scene a pair comes from: the original pair's own, or the
    scene whose phrase an augmented caption took. :func:`jobs.leakage.leakage_counts` checks both. An augmented
    pair also carries its ``generator_version`` (the view holds the passing rows of every version: filter on it to
    train on one generator's output), the ``factual_caption`` it was generated from, its ``retrieval_type`` and
    its ``perplexity`` under the style's trigram LM (null for original pairs).
    """
    name = table_name(cfg, "training_set")
    stylized, augmented = table_name(cfg, "stylized_captions"), table_name(cfg, "augmented_captions")
    spark.sql(f"""
        CREATE OR REPLACE VIEW {name} AS
        SELECT scene_id AS pair_id, image_id, image_uri, caption, style, split, 'original' AS origin, run_id,
               scene_id, CAST(NULL AS STRING) AS generator_version, CAST(NULL AS STRING) AS factual_caption,
               CAST(NULL AS STRING) AS retrieval_type, CAST(NULL AS DOUBLE) AS perplexity
        FROM {stylized}
        UNION ALL
        SELECT concat_ws('|', a.query_id, a.scene_id, a.retrieval_type, a.generator_version) AS pair_id,
               a.image_id, a.image_uri, a.generated_caption AS caption, a.style, 'train' AS split,
               'augmented' AS origin, a.run_id, a.scene_id, a.generator_version, a.factual_caption,
               a.retrieval_type, a.perplexity
        FROM {augmented} a
        WHERE a.passed
          AND a.image_id NOT IN (SELECT image_id FROM {stylized} WHERE coalesce(split, '') <> 'train')
          AND a.scene_id IN (SELECT scene_id FROM {stylized} WHERE split = 'train')
    """)
    return name


def ensure_table(spark: SparkSession, cfg: ErgConfig, table: str) -> str:
    spec = TABLES[table]
    name = table_name(cfg, table)
    columns = ", ".join(f"`{f.name}` {f.dataType.simpleString()}{'' if f.nullable else ' NOT NULL'}"
                        for f in spec.schema.fields)
    location = table_location(cfg, table)
    where = f" LOCATION '{location}'" if location else ""
    if location and not spark.catalog.tableExists(name) and is_delta_table(spark, location):
        # a table written by an earlier session (or an older version, which may lack a column): register it as it
        # is (CREATE with the new schema would raise on the mismatch), then add the missing columns below
        spark.sql(f"CREATE TABLE IF NOT EXISTS {name} USING DELTA LOCATION '{location}'")
    properties = {"delta.enableChangeDataFeed": "true"}
    if cfg.tables.auto_optimize:
        properties.update({"delta.autoOptimize.optimizeWrite": "true", "delta.autoOptimize.autoCompact": "true"})
    if spec.deletion_vectors:
        properties["delta.enableDeletionVectors"] = "true"
    if not spark.catalog.tableExists(name):
        spark.sql(
            f"CREATE TABLE IF NOT EXISTS {name} ({columns}) USING DELTA{where} "
            f"COMMENT '{spec.comment.replace(chr(39), '')}' "
            f"TBLPROPERTIES ({', '.join(f'{k} = {v}' for k, v in properties.items())})"
        )
    else:  # a table made before a property was set here (e.g. auto compaction) gets it
        have_props = {r["key"]: r["value"] for r in spark.sql(f"SHOW TBLPROPERTIES {name}").collect()}
        missing = {k: v for k, v in properties.items() if have_props.get(k) != v}
        if missing:
            spark.sql(f"ALTER TABLE {name} SET TBLPROPERTIES ("
                      + ", ".join(f"'{k}' = '{v}'" for k, v in missing.items()) + ")")
    have = set(spark.table(name).columns)
    added = [f for f in spec.schema.fields if f.name not in have and f.nullable]
    if added:  # a table made by an older version: add the new nullable columns (existing rows read NULL)
        spark.sql(f"ALTER TABLE {name} ADD COLUMNS ("
                  + ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in added) + ")")
    return name


def conform(df: DataFrame, table: str) -> DataFrame:
    """Select and cast ``df``'s columns to the table schema (missing nullable columns become NULL)."""
    spec = TABLES[table]
    have = set(df.columns)
    cols = []
    for field in spec.schema.fields:
        if field.name in have:
            cols.append(F.col(field.name).cast(field.dataType).alias(field.name))
        elif field.nullable:
            cols.append(F.lit(None).cast(field.dataType).alias(field.name))
        else:
            raise ValueError(f"rows for {table} lack the required column {field.name!r}")
    return df.select(*cols)


def merge_rows(spark: SparkSession, cfg: ErgConfig, table: str, df: DataFrame, *, update_existing: bool = False,
               fill_nulls: tuple[str, ...] = ()) -> dict:
    """MERGE ``df`` into ``table`` on its natural key; returns {"inserted": n, "updated": n}.

    Source rows are de-duplicated on the key first (MERGE forbids two source rows matching one target row).
    With ``update_existing`` False an existing key is left untouched, so re-ingesting keeps the first ingest;
    ``fill_nulls`` columns of an existing row that are NULL are filled from the source (e.g. an image's tags
    arriving from a later source), and only such rows are rewritten.

    The MERGE is SQL over a temporary view of the source, so it runs the same on a classic session and on Spark
    Connect (where the Python ``DeltaTable`` API needs Delta Connect on the server); its counts are the ones the
    MERGE statement returns.
    """
    spec = TABLES[table]
    source = conform(df, table).dropDuplicates(list(spec.keys))
    clauses = []
    if update_existing:
        clauses.append("WHEN MATCHED THEN UPDATE SET *")
    elif fill_nulls:
        missing = " OR ".join(f"(t.`{c}` IS NULL AND s.`{c}` IS NOT NULL)" for c in fill_nulls)
        fills = ", ".join(f"t.`{c}` = coalesce(t.`{c}`, s.`{c}`)" for c in fill_nulls)
        clauses.append(f"WHEN MATCHED AND ({missing}) THEN UPDATE SET {fills}")
    clauses.append("WHEN NOT MATCHED THEN INSERT *")
    counts = _merge(spark, cfg, table, source, clauses)
    return {"inserted": counts["inserted"], "updated": counts["updated"]}


def _merge(spark: SparkSession, cfg: ErgConfig, table: str, source: DataFrame, clauses: list[str]) -> dict:
    """``MERGE INTO table t USING source s ON <its key> <clauses>`` in SQL, the source a temporary view (dropped
    after); the statement's own counts."""
    view = f"erg_merge_source_{table}_{uuid.uuid4().hex[:12]}"
    condition = " AND ".join(f"t.`{k}` = s.`{k}`" for k in TABLES[table].keys)
    source.createOrReplaceTempView(view)
    try:
        result = spark.sql(f"MERGE INTO {table_name(cfg, table)} t USING {view} s ON {condition} "
                           + " ".join(clauses)).collect()
    finally:
        spark.catalog.dropTempView(view)
    metrics = result[0].asDict() if result else {}
    return {key: int(metrics.get(f"num_{key}_rows") or 0) for key in ("inserted", "updated", "deleted")}


#: a MERGE source of at most this many rows is broadcast to find the files it touches (:func:`apply_changes`)
MERGE_BROADCAST_MAX_ROWS = 500_000


def apply_changes(spark: SparkSession, cfg: ErgConfig, table: str, changes: DataFrame, *,
                  compare: tuple[str, ...]) -> dict:
    """Apply keyed changes to ``table`` in one MERGE: each row of ``changes`` (the table's columns plus ``_action``)
    either replaces its key's row (``upsert``: inserted, or updated when a ``compare`` column differs, else left as
    it is) or deletes it (``delete``; absent keys are ignored). The changes are computed once, before the MERGE,
    and held on the executors (a local checkpoint). Returns {"inserted", "updated", "deleted"}; a rerun of the same
    changes returns zeros."""
    spec = TABLES[table]
    if "_action" not in changes.columns:
        raise ValueError(f"changes for {table} need an _action column ('upsert' or 'delete')")
    typed = [F.col(f.name).cast(f.dataType).alias(f.name) for f in spec.schema.fields]
    # computed once, here: the MERGE plans its source again without the session's cached DataFrames, so a source
    # built on a persisted one (the new scenes' hits) was recomputed from its search
    source = changes.select(*typed, "_action").dropDuplicates(list(spec.keys)).localCheckpoint(eager=True)
    if source.count() <= MERGE_BROADCAST_MAX_ROWS:  # the MERGE's scan for the files it touches: no table shuffle
        source = F.broadcast(source)
    columns = [f.name for f in spec.schema.fields]
    differs = " OR ".join(f"NOT (t.`{c}` <=> s.`{c}`)" for c in compare)
    updates = ", ".join(f"t.`{c}` = s.`{c}`" for c in columns if c not in spec.keys)
    names = ", ".join(f"`{c}`" for c in columns)
    values = ", ".join(f"s.`{c}`" for c in columns)
    return _merge(spark, cfg, table, source, [
        "WHEN MATCHED AND s._action = 'delete' THEN DELETE",
        f"WHEN MATCHED AND s._action = 'upsert' AND ({differs}) THEN UPDATE SET {updates}",
        f"WHEN NOT MATCHED AND s._action = 'upsert' THEN INSERT ({names}) VALUES ({values})"])


def append_rows(spark: SparkSession, cfg: ErgConfig, table: str, df: DataFrame) -> dict:
    """INSERT ``df``, whose keys the caller knows are not in ``table``, in one commit: no MERGE, so no join against
    the whole table. Computed once (a local checkpoint) to count it; returns {"inserted", "updated", "deleted"}."""
    source = conform(df, table).dropDuplicates(list(TABLES[table].keys)).localCheckpoint(eager=True)
    inserted = source.count()
    if inserted:
        source.write.insertInto(table_name(cfg, table))
    return {"inserted": inserted, "updated": 0, "deleted": 0}


def is_delta_table(spark: SparkSession, location: str) -> bool:
    """Whether ``location`` holds a Delta table (False for an absent or non-Delta folder), by SQL, so that it
    also answers on Spark Connect."""
    try:
        rows = spark.sql(f"DESCRIBE DETAIL delta.`{location}`").select("format").collect()
    except Exception:  # noqa: BLE001 - AnalysisException (classic or Connect): absent, or not Delta
        return False
    return bool(rows) and rows[0]["format"] == "delta"


def read_table(spark: SparkSession, cfg: ErgConfig, table: str) -> DataFrame:
    return spark.table(table_name(cfg, table))


DESCRIPTION_QUERY_SOURCE = "train_scene_description"


def query_captions(spark: SparkSession, cfg: ErgConfig) -> DataFrame:
    """The factual captions that ERG augments (the queries of retrieval, the sources of generation), with the
    columns of ``factual_captions``: P, plus with ``retrieve.train_descriptions_as_queries`` the scene descriptions
    of the images whose stylized captions are all in the train split (``source`` = ``train_scene_description``,
    ``split`` train, ``caption_id`` = ``desc-`` + a hash of image and caption). A val or test image's description
    is never a query: ``jobs.leakage`` counts queries of held-out images."""
    factual = read_table(spark, cfg, "factual_captions")
    if not cfg.retrieve.train_descriptions_as_queries:
        return factual
    stylized = read_table(spark, cfg, "stylized_captions")
    held = stylized.where(F.coalesce(F.col("split"), F.lit("")) != "train").select("image_id")
    train_images = (stylized.where(F.col("split") == "train").select("image_id").distinct()
                    .join(held, "image_id", "left_anti"))
    images = read_table(spark, cfg, "images").where(F.col("descriptions").isNotNull())
    described = (images.join(train_images, "image_id", "left_semi")
                 .select("image_id", F.col("uri").alias("image_uri"), F.explode("descriptions").alias("caption"),
                         "ingest_time", "run_id")
                 .where(F.length(F.trim("caption")) > 0)
                 .withColumn("caption_id", F.concat(F.lit("desc-"), F.substring(
                     F.sha2(F.concat_ws("|", "image_id", "caption"), 256), 1, 20)))
                 .dropDuplicates(["caption_id"])
                 .select("caption_id", "image_id", "image_uri", "caption",
                         F.lit(DESCRIPTION_QUERY_SOURCE).alias("source"), F.lit("train").alias("split"),
                         "ingest_time", "run_id"))
    return factual.select(*described.columns).unionByName(described)


def scene_descriptions(spark: SparkSession, cfg: ErgConfig) -> DataFrame:
    """``image_id, caption``: the scene descriptions of the stylized images, one row per description.

    These are the factual captions of images that have stylized captions (e.g. FlickrStyle10K's five Flickr30K
    captions per image), which are not part of the factual corpus P; ingest keeps them in ``images.descriptions``.
    Use them as gold scene content (phrase quality) or as textual visual context; they are retrieval queries only
    through :func:`query_captions` (train images, behind a conf switch).
    """
    return (read_table(spark, cfg, "images").where(F.col("descriptions").isNotNull())
            .select("image_id", F.explode("descriptions").alias("caption")))
