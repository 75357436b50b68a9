"""The names the jobs share: the model-store kinds of the current models and their typed records, the captioner
variants, the scene encoder of the conf, and the readers of the image vectors in ``embeddings``.

A stage job writes what a later one reads (``extract`` records the evaluation classifiers that ``generate`` and
``evaluate`` load; ``train`` records the captioners that ``evaluate`` compares; ``embed`` writes the vectors that
``retrieve`` and the scene features read): the names of those hand-overs live here, so that no stage job imports
another.
"""
from __future__ import annotations

from typing import Any, Optional, TypedDict

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.platform.config import ErgConfig
from jobs.platform.tables import read_table
from udfs.embedding import EncoderSpec

# ------------------------------------------------------------------------------------ model-store kinds
EVALUATION_CLASSIFIERS = "evaluation_classifiers"
"""model_store kind of the current evaluation classifiers (:class:`EvaluationClassifiersRecord`); load with
:func:`models.caption_scoring.load_evaluation_classifiers` (path)."""

GENERATOR = "generator"
"""model_store kind of the current generator (:class:`GeneratorRecord`)."""

VARIANTS = ("original", "augmented")
"""The captioner variants: trained on the original pairs, or on original + augmented pairs (Table 2)."""


def classifier_kind(style_set: str) -> str:
    """model_store kind of a style set's extractor classifier, e.g. ``style_classifier/flickrstyle``."""
    return f"style_classifier/{style_set}"


def captioner_variant(cfg: ErgConfig) -> str:
    """``augmented`` when the conf trains on original + augmented pairs, else ``original``."""
    return "augmented" if cfg.train.use_augmented else "original"


def captioner_kind(variant: str) -> str:
    """The model-store kind of a variant's current captioner, e.g. ``captioner_augmented``."""
    if variant not in VARIANTS:
        raise ValueError(f"captioner variant must be one of {list(VARIANTS)}, got {variant!r}")
    return f"captioner_{variant}"


# ------------------------------------------------------------------------------- current-model records
class ExtractorRecord(TypedDict):
    """The current ``style_classifier/<set>``: a style set's classifier and its style head (l_s, h_s)."""

    path: str
    version: str
    style_set: str
    styles: list[str]
    layer: int
    head: int
    eps: float
    max_length: int
    val_accuracy: Optional[float]


class EvaluationClassifiersRecord(TypedDict):
    """The current ``evaluation_classifiers``: one style-vs-factual classifier per style (paper Sect. 4.4)."""

    path: str
    version: str
    kind: str
    styles: list[str]
    factual_label: str
    val_accuracy: dict[str, float]


class GeneratorRecord(TypedDict, total=False):
    """The current ``generator``: the model, its trigram LMs, vocabulary, phrase propensities and (with the fluency
    filter) the discriminator and its threshold."""

    path: str
    kind: str
    version: str
    lm_path: str
    vocabulary_path: str
    propensity_path: Optional[str]
    max_source_len: int
    max_target_len: int
    fluency_path: str
    fluency_threshold: float


class CaptionerRecord(TypedDict):
    """The current ``captioner_<variant>``: a trained captioner and what it was trained on."""

    path: str
    version: str
    variant: str
    kind: str
    styles: list[str]
    encoder_version: str
    features: str
    regions: int
    rows: int
    rows_augmented: int
    loss_first: float
    loss_last: float
    backend: str
    world_size: int


# ---------------------------------------------------------------------------------------- embeddings
def encoder_spec(cfg: ErgConfig) -> EncoderSpec:
    """The scene encoder of ``cfg.embed.encoder`` (what ``erg embed`` writes and ``erg retrieve`` reads)."""
    conf = cfg.embed.encoder
    return EncoderSpec.of(conf.kind, conf.name_or_path, conf.device, conf.batch_size, conf.options)


def latest_image_encoder(spark: SparkSession, cfg: ErgConfig) -> str:
    """The encoder version of the most recent image embedding; RuntimeError if ``embeddings`` has no image rows."""
    row = (read_table(spark, cfg, "embeddings")
           .filter((F.col("item_kind") == "image") & (F.col("modality") == "image"))
           .orderBy(F.col("created_at").desc(), F.col("encoder_version")).select("encoder_version").first())
    if row is None:
        raise RuntimeError("embeddings holds no image vectors (item_kind 'image'): run `erg embed` first")
    return row.encoder_version


def image_vectors(spark: SparkSession, cfg: ErgConfig, encoder_version: str) -> DataFrame:
    """``image_id, features`` of every image embedded by ``encoder_version``."""
    return (read_table(spark, cfg, "embeddings")
            .filter((F.col("item_kind") == "image") & (F.col("modality") == "image")
                    & (F.col("encoder_version") == encoder_version))
            .select(F.col("item_id").alias("image_id"), F.col("vector").alias("features"))
            .dropDuplicates(["image_id"]))


def record_versions(records: dict[str, Any]) -> dict[str, str]:
    """name -> version of each record (e.g. the current extractor of every style set)."""
    return {name: record["version"] for name, record in records.items()}
