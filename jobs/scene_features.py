"""Scene features for the captioners (``train.features``), chosen apart from the retrieval encoder.

What a captioner sees of an image:

- ``visual_context`` (the default where no pixels exist): the image described in text, after the textual visual
  context dataset for COCO (Sabir et al.): its object labels (``images.tags``, one text), the independent factual
  descriptions of a stylized image (``images.descriptions``, e.g. FlickrStyle10K's five Flickr30K captions), its
  factual captions in P, and (opt-in, ``other_styles``, for the sets in ``other_styles_for``) the content of its
  captions in the other styles of the set, the style phrase ERG extracted removed (SentiCap's train images have
  no other description on ../shared/data; their other-polarity captions are written by other annotators and are
  never the scored style's references). Each text is embedded by the sentence encoder of ``train.visual_context.encoder`` as one region-like
  vector; an image is up to ``max_regions`` of them (padded, with ``n_regions`` real ones).
- ``clip``: CLIP (``train.clip``) on the image file at ``images.uri``, one vector.
- ``regions``: ``images.region_features`` (float32 ``[n_regions, d]``, e.g. 36 x 2048 Faster R-CNN), up to
  ``train.max_regions`` of them.
- ``retrieval_embeddings``: the image vector the retrieval encoder wrote into ``embeddings`` (as before this
  option existed; what retrieval sees, so not independent of it).

**No scene feature comes from the references that are scored for that image.** A context text equal (after
lower-casing and dropping punctuation) to any stylized caption of the same image is never used, whatever its
source, and is counted (``features.dropped_stylized_caption``); an ``other_styles`` text never comes from the style
of the pair it describes; an augmented pair never sees the factual caption it was generated from (the test images'
descriptions are independent of their references, so training mirrors that). :func:`feature_leaks` recounts, on
the finished features, the texts of a scored pair that equal one of its references (0 on a correct build).

The text vectors are cached per encoder version in a Delta folder under ``<home>/features`` (an anti-join on the
text's hash: a rerun embeds only new texts), embedded on the executors by :mod:`udfs.embedding`'s UDF.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.platform.config import CONTEXT_SOURCES, ErgConfig
from jobs.platform.spark import default_parallelism, spread_tasks
from jobs.platform.tables import is_delta_table, read_table
from jobs.vocabulary import image_vectors, latest_image_encoder

logger = logging.getLogger(__name__)

PAIR_COLUMNS = ("pair_id", "image_id", "style", "source_caption")
"""What :func:`scene_features` needs of each pair: ``source_caption`` is the factual caption an augmented pair was
generated from (null for original and test pairs)."""


@dataclass
class SceneFeatures:
    """Pairs with their features: ``frame`` has the pair columns plus ``features`` (``array<float>`` of
    ``regions * dim`` values, null where the image has none) and ``n_regions`` (real regions, the rest padding)."""

    frame: DataFrame
    kind: str
    regions: int
    dim: int
    version: str
    description: str
    counts: dict[str, int] = field(default_factory=dict)


def match_key(column) -> Any:
    """A Spark expression: lower-cased text with punctuation dropped and single spaces (how texts are compared)."""
    lowered = F.lower(F.coalesce(column, F.lit("")))
    return F.trim(F.regexp_replace(F.regexp_replace(lowered, r"[^\p{L}\p{N}' ]", " "), r"\s+", " "))


def context_texts(spark: SparkSession, cfg: ErgConfig, sources: list[str] | None = None) -> DataFrame:
    """``image_id, text, source, text_style, source_rank``: every text that describes an image, per source.

    ``text_style`` is the style of an ``other_styles`` text (null otherwise); ``source_rank`` orders the sources as
    :data:`jobs.platform.config.CONTEXT_SOURCES`. Texts equal to a stylized caption of the same image are not here.
    """
    sources = list(sources or cfg.train.visual_context.sources)
    unknown = sorted(set(sources) - set(CONTEXT_SOURCES))
    if unknown:
        raise ValueError(f"unknown visual context sources {unknown}: allowed are {list(CONTEXT_SOURCES)}")
    none = F.lit(None).cast("string")
    parts: list[DataFrame] = []
    images = read_table(spark, cfg, "images")
    if "tags" in sources:
        parts.append(images.where(F.col("tags").isNotNull() & (F.length(F.trim("tags")) > 0))
                     .select("image_id", F.trim("tags").alias("text"), F.lit("tags").alias("source"),
                             none.alias("text_style")))
    if "descriptions" in sources:
        parts.append(images.where(F.col("descriptions").isNotNull())
                     .select("image_id", F.explode("descriptions").alias("text"))
                     .select("image_id", "text", F.lit("descriptions").alias("source"), none.alias("text_style")))
    if "factual" in sources:
        parts.append(read_table(spark, cfg, "factual_captions")
                     .select("image_id", F.col("caption").alias("text"), F.lit("factual").alias("source"),
                             none.alias("text_style")))
    if "other_styles" in sources:
        scenes = read_table(spark, cfg, "stylized_captions").select("scene_id", "image_id")
        phrases = read_table(spark, cfg, "style_phrases")
        sets = cfg.train.visual_context.other_styles_for
        if sets is not None:
            phrases = phrases.where(F.col("style").isin([s for name in sets for s in cfg.style_sets[name]]))
        parts.append(phrases.join(scenes, "scene_id")
                     .select("image_id", F.col("content").alias("text"), F.lit("other_styles").alias("source"),
                             F.col("style").alias("text_style")))
    texts = parts[0]
    for part in parts[1:]:
        texts = texts.unionByName(part)
    rank = F.lit(len(CONTEXT_SOURCES))
    for i, name in reversed(list(enumerate(CONTEXT_SOURCES))):
        rank = F.when(F.col("source") == name, F.lit(i)).otherwise(rank)
    texts = (texts.where(F.col("text").isNotNull() & (F.length(F.trim("text")) > 0))
             .withColumn("source_rank", rank).withColumn("match_key", match_key(F.col("text")))
             .dropDuplicates(["image_id", "source", "text_style", "match_key"]))
    stylized = (read_table(spark, cfg, "stylized_captions")
                .select("image_id", match_key(F.col("caption")).alias("match_key")).distinct())
    return texts.join(stylized, ["image_id", "match_key"], "left_anti")


def dropped_stylized_captions(spark: SparkSession, cfg: ErgConfig, sources: list[str] | None = None) -> int:
    """How many context texts :func:`context_texts` leaves out because they equal a stylized caption of their image."""
    stylized = (read_table(spark, cfg, "stylized_captions")
                .select("image_id", match_key(F.col("caption")).alias("match_key")).distinct())
    sources = list(sources or cfg.train.visual_context.sources)
    images = read_table(spark, cfg, "images")
    candidates: list[DataFrame] = []
    if "tags" in sources:
        candidates.append(images.select("image_id", F.col("tags").alias("text")))
    if "descriptions" in sources:
        candidates.append(images.where(F.col("descriptions").isNotNull())
                          .select("image_id", F.explode("descriptions").alias("text")))
    if "factual" in sources:
        candidates.append(read_table(spark, cfg, "factual_captions").select("image_id", F.col("caption").alias("text")))
    if not candidates:
        return 0
    texts = candidates[0]
    for part in candidates[1:]:
        texts = texts.unionByName(part)
    return texts.where(F.col("text").isNotNull()).withColumn("match_key", match_key(F.col("text"))) \
        .join(stylized, ["image_id", "match_key"]).count()


# ---------------------------------------------------------------------------------------------- text vectors
def _encoder_spec(conf):
    from udfs.embedding import EncoderSpec

    return EncoderSpec.of(conf.kind, conf.name_or_path, conf.device, conf.batch_size, conf.options)


def _cache_path(cfg: ErgConfig, kind: str, version: str) -> str:
    schema = cfg.train.features_cache_schema or cfg.tables.schema_name
    schema = f"{cfg.tables.catalog}.{schema}" if cfg.tables.catalog else schema
    return str(Path(cfg.home) / "features" / schema / kind / version.replace("/", "_").replace(":", "_"))


def cached_vectors(spark: SparkSession, cfg: ErgConfig, items: DataFrame, spec, version: str, kind: str,
                   modality: str) -> tuple[DataFrame, int]:
    """Vectors of ``items`` (``item_id`` and ``text`` or ``uri``/``tags``) by the encoder ``spec``, from the cache
    under ``<home>/features``; only items not yet there are embedded (a mapInPandas UDF on the executors) and
    appended. Returns (``item_id, vector`` of every item the encoder could embed, number newly embedded)."""
    from udfs.embedding import EMBEDDED_SCHEMA, embed_partitions

    path = _cache_path(cfg, kind, version)
    exists = is_delta_table(spark, path)
    todo = items.dropDuplicates(["item_id"])
    if exists:
        todo = todo.join(spark.read.format("delta").load(path).select("item_id"), "item_id", "left_anti")
    none_text, none_bytes = F.lit(None).cast("string"), F.lit(None).cast("binary")
    columns = {"item_id": F.col("item_id"), "item_kind": F.lit(kind), "modality": F.lit(modality),
               "text": F.col("text") if "text" in items.columns else none_text,
               "tags": F.col("tags") if "tags" in items.columns else none_text,
               "uri": F.col("uri") if "uri" in items.columns else none_text,
               "region_features": none_bytes}
    todo = todo.select(*[value.alias(name) for name, value in columns.items()])
    pending = todo.count()
    if pending:
        partitions = spread_tasks(default_parallelism(spark), pending, max(spec.batch_size, 1))
        embedded = (todo.repartition(partitions, "item_id").mapInPandas(embed_partitions(spec), EMBEDDED_SCHEMA)
                    .where(F.col("vector").isNotNull()).select("item_id", "vector"))
        embedded.write.format("delta").mode("append").save(path)
    if not pending and not exists:
        return spark.createDataFrame([], "item_id string, vector array<float>"), 0
    return spark.read.format("delta").load(path).dropDuplicates(["item_id"]), pending


def text_id(column) -> Any:
    """The cache key of a context text: the SHA-1 of the text itself."""
    return F.sha1(F.col(column) if isinstance(column, str) else column)


# ---------------------------------------------------------------------------------------------- features
def _padded(regions: int, dim: int) -> Any:
    """``features`` from ``items`` (an array of structs (rank, vector) in order): flattened and zero-padded."""
    flat = F.flatten(F.transform(F.col("items"), lambda item: item["vector"]))
    pad = F.array_repeat(F.lit(0.0).cast("float"), (F.lit(regions) - F.size("items")) * F.lit(dim))
    return F.concat(flat, pad)


def visual_context_features(spark: SparkSession, cfg: ErgConfig, pairs: DataFrame) -> SceneFeatures:
    """Each pair's image described in text, one sentence-encoder vector per text (see the module docstring)."""
    from udfs.embedding import encoder_identity

    v = cfg.train.visual_context
    if v.encoder.kind != "sentence":
        raise ValueError(f"train.visual_context.encoder.kind must be 'sentence' (it embeds texts), got "
                         f"{v.encoder.kind!r}")
    spec = _encoder_spec(v.encoder)
    identity = encoder_identity(spec)
    texts = context_texts(spark, cfg, v.sources).withColumn("item_id", text_id("text")).cache()
    try:
        vectors, embedded = cached_vectors(spark, cfg, texts.select("item_id", "text"), spec, identity.version,
                                           "visual_context", "text")
        joined = (pairs.select(*PAIR_COLUMNS).join(texts, "image_id")
                  .where(~(F.col("source").isin("factual", "descriptions") & F.col("source_caption").isNotNull()
                           & (F.col("match_key") == match_key(F.col("source_caption")))))
                  .where(~((F.col("source") == "other_styles") & (F.col("text_style") == F.col("style")))))
        joined = joined.join(vectors, "item_id")
        from pyspark.sql import Window

        order = Window.partitionBy("pair_id").orderBy("source_rank", "match_key", "item_id")
        kept = joined.withColumn("_n", F.row_number().over(order)).where(F.col("_n") <= v.max_regions)
        grouped = kept.groupBy("pair_id").agg(
            F.sort_array(F.collect_list(F.struct(F.col("_n").alias("n"), F.col("vector").alias("vector"))))
            .alias("items"))
        features = grouped.select("pair_id", _padded(v.max_regions, identity.dim).alias("features"),
                                  F.size("items").cast("int").alias("n_regions"))
        frame = pairs.join(features, "pair_id", "left")
        counts = {"features.texts": texts.count(), "features.texts_embedded": embedded,
                  "features.dropped_stylized_caption": dropped_stylized_captions(spark, cfg, v.sources)}
    finally:
        texts.unpersist()
    description = (f"textual visual context: {', '.join(v.sources)} of each image, each embedded by "
                   f"{identity.name} as one of up to {v.max_regions} region-like {identity.dim}-d vectors")
    return SceneFeatures(frame, "visual_context", v.max_regions, identity.dim, f"visual_context:{identity.version}",
                         description, counts)


def clip_features(spark: SparkSession, cfg: ErgConfig, pairs: DataFrame) -> SceneFeatures:
    """CLIP (``train.clip``) on each pair's image file (``images.uri``): one region."""
    from udfs.embedding import encoder_identity

    conf = cfg.train.clip
    if conf.kind != "clip":
        raise ValueError(f"train.clip.kind must be 'clip', got {conf.kind!r}")
    spec = _encoder_spec(conf)
    identity = encoder_identity(spec)
    images = (read_table(spark, cfg, "images").where(F.col("uri").isNotNull())
              .join(pairs.select("image_id").distinct(), "image_id")
              .select(F.col("image_id").alias("item_id"), "uri", "tags"))
    vectors, embedded = cached_vectors(spark, cfg, images, spec, identity.version, "clip", "image")
    frame = pairs.join(vectors.select(F.col("item_id").alias("image_id"), F.col("vector").alias("features")),
                       "image_id", "left").withColumn("n_regions", F.when(F.col("features").isNotNull(), F.lit(1)))
    return SceneFeatures(frame, "clip", 1, identity.dim, f"clip:{identity.version}",
                         f"CLIP {identity.name} on the image files", {"features.images_embedded": embedded})


def region_features(spark: SparkSession, cfg: ErgConfig, pairs: DataFrame) -> SceneFeatures:
    """``images.region_features`` (float32 ``[n, d]``) of each pair's image, up to ``train.max_regions``."""
    from udfs.scene_features import decode_regions

    regions = cfg.train.max_regions
    stored = (read_table(spark, cfg, "images").where(F.col("region_features").isNotNull()
                                                      & (F.coalesce(F.col("n_regions"), F.lit(0)) > 0))
              .join(pairs.select("image_id").distinct(), "image_id")
              .select("image_id", "region_features", "n_regions"))
    first = stored.select((F.length("region_features") / F.col("n_regions") / 4).alias("dim")).first()
    dim = int(first.dim) if first is not None else 0
    decoded = decode_regions(stored, regions, dim) if dim else \
        spark.createDataFrame([], "image_id string, features array<float>, n_regions int")
    frame = pairs.join(decoded, "image_id", "left")
    return SceneFeatures(frame, "regions", regions, dim, f"regions:{regions}x{dim}",
                         f"precomputed region features (images.region_features), up to {regions} x {dim}")


def retrieval_embedding_features(spark: SparkSession, cfg: ErgConfig, pairs: DataFrame) -> SceneFeatures:
    """The retrieval encoder's image vector from ``embeddings`` (the most recent image encoder version)."""
    version = latest_image_encoder(spark, cfg)
    vectors = image_vectors(spark, cfg, version)
    first = vectors.select(F.size("features").alias("d")).first()
    frame = pairs.join(vectors, "image_id", "left").withColumn(
        "n_regions", F.when(F.col("features").isNotNull(), F.lit(1)))
    return SceneFeatures(frame, "retrieval_embeddings", 1, int(first.d) if first else 0, version,
                         f"the retrieval encoder's image vectors ({version})")


BUILDERS = {"visual_context": visual_context_features, "clip": clip_features, "regions": region_features,
            "retrieval_embeddings": retrieval_embedding_features}


def scene_features(spark: SparkSession, cfg: ErgConfig, pairs: DataFrame) -> SceneFeatures:
    """Features of ``pairs`` (columns :data:`PAIR_COLUMNS`, ``source_caption`` optional) by ``train.features``."""
    if "source_caption" not in pairs.columns:
        pairs = pairs.withColumn("source_caption", F.lit(None).cast("string"))
    missing = [c for c in PAIR_COLUMNS if c not in pairs.columns]
    if missing:
        raise ValueError(f"pairs lack the columns {missing}; scene features need {list(PAIR_COLUMNS)}")
    return BUILDERS[cfg.train.features](spark, cfg, pairs)


def feature_leaks(spark: SparkSession, cfg: ErgConfig, scored: DataFrame) -> int:
    """Texts the visual context features of scored pairs (``image_id, style``) are built from that equal one of that
    pair's references (the stylized captions of that image and style): 0 when no feature comes from a scored
    reference. Counted on the texts :func:`context_texts` hands to the features, by a join of its own."""
    if cfg.train.features != "visual_context":
        return 0
    references = (read_table(spark, cfg, "stylized_captions")
                  .select("image_id", "style", match_key(F.col("caption")).alias("match_key")))
    kept = context_texts(spark, cfg).select("image_id", "match_key", "text_style", "source")
    leaked = (scored.select("image_id", "style").distinct().join(references, ["image_id", "style"])
              .join(kept, ["image_id", "match_key"])
              .where(~((F.col("source") == "other_styles") & (F.col("text_style") == F.col("style")))))
    return leaked.count()
