"""``erg train``: train a captioner on ``training_set`` with Spark's TorchDistributor (or Horovod) (ERG step 4).

The training pairs are the ``train`` split of the ``training_set`` view: the original stylized pairs, plus the
augmented pairs (``origin = 'augmented'``) when ``train.use_augmented`` is on, restricted to the conf's styles, each
with its image's scene features (``train.features``, :mod:`jobs.scene_features`: by default the textual visual
context, independent of the retrieval encoder). Pairs whose image has no features are counted per origin and
logged, never lost silently.

The pairs are written once as a snapshot under ``<home>/models/captioner/<run id>/data``: Spark Parquet (every
worker process of :func:`models.captioner_training.train_worker` reads all files), Mosaic Streaming shards with
``train.reader: mds`` (``streaming``'s Spark ``dataframe_to_mds``; each worker reads its own partition through a
``StreamingDataset``, the loader Databricks recommends), or petastorm's Spark converter with ``train.reader:
petastorm``, which falls back to Spark Parquet with a warning and the MLflow tag ``erg.reader_fallback`` where
petastorm cannot be imported (it cannot with the pyarrow that pyspark 4.2 needs). Workers run under
``TorchDistributor(num_processes, local_mode, use_gpu)`` (DDP: gloo on CPU, nccl on GPU), or under
``horovod.spark.run(..., use_gloo=True)`` with ``train.backend: horovod``.

The model (weights, vocabulary, config) goes to ``.../<run id>/model``, is logged as MLflow artifacts and becomes
the current ``captioner_original`` or ``captioner_augmented`` (the *variant*, tag ``erg.captioner_variant``), which
``erg evaluate`` compares in the layout of the paper's Table 2.
"""
from __future__ import annotations

import json
import logging
import shutil
import time
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs import reports
from jobs.platform.config import ErgConfig
from jobs.platform.model_store import model_dir, set_current
from jobs.platform.runner import JobContext, Step, run_job
from jobs.platform.tables import read_table
from jobs.scene_features import SceneFeatures, scene_features
from jobs.vocabulary import CaptionerRecord, captioner_kind, captioner_variant

logger = logging.getLogger(__name__)

ORIGINS = ("original", "augmented")
INSTALL_HOROVOD = "scripts/install_horovod.sh"
SUMMARY_FILE = "train_summary.json"
READERS = ("parquet", "mds", "petastorm")
MDS_INDEX_COLUMN = "row_index"
SOURCE_COLUMN = "source_caption"  # the snapshot's factual source of an augmented caption ("" for an original pair)


def training_pairs(spark: SparkSession, cfg: ErgConfig, generator_version: str | None = None) -> DataFrame:
    """The ``train`` split of ``training_set`` for the conf's styles: original pairs, plus augmented ones if on.

    ``source_caption`` is the factual caption an augmented pair was generated from (null for original pairs);
    ``generator_version`` keeps only that generator's augmented pairs (``training_set`` holds every version's).
    """
    origins = list(ORIGINS) if cfg.train.use_augmented else ["original"]
    frame = (read_table(spark, cfg, "training_set")
             .filter((F.col("split") == "train") & F.col("origin").isin(origins) & F.col("style").isin(cfg.styles)))
    if generator_version is not None:
        frame = frame.filter((F.col("origin") == "original") | (F.col("generator_version") == generator_version))
    return frame.select("pair_id", "image_id", "caption", "style", "origin",
                        F.col("factual_caption").alias("source_caption"), "retrieval_type")


def with_image_vectors(pairs: DataFrame, vectors: DataFrame) -> tuple[DataFrame, dict[str, int], list[str]]:
    """Pairs left-joined with their image vector (``features`` null where the image has none; cached, so unpersist
    it when done); the counts per origin, ``rows.<origin>`` (with a vector) and ``rows_without_vector.<origin>``;
    and the styles that have pairs with a vector."""
    return count_features(pairs.join(vectors, "image_id", "left"))


def count_features(frame: DataFrame) -> tuple[DataFrame, dict[str, int], list[str]]:
    """``frame`` (pairs with ``features``, null where the image has none) cached (unpersist it when done); the
    counts per origin, ``rows.<origin>`` (with features) and ``rows_without_vector.<origin>``; and the styles that
    have pairs with features."""
    joined = frame.cache()  # counted, then written: join once
    counts = {f"{key}.{origin}": 0 for origin in ORIGINS for key in ("rows", "rows_without_vector")}
    styles: set[str] = set()
    for row in joined.groupBy("origin", "style", F.col("features").isNull().alias("missing")).count().collect():
        counts[f"{'rows_without_vector' if row.missing else 'rows'}.{row.origin}"] += row["count"]
        if not row.missing:
            styles.add(row.style)
    return joined, counts, sorted(styles)


def petastorm_files(spark: SparkSession, frame: DataFrame, folder: Path) -> list[str]:
    """Materialise ``frame`` with petastorm's Spark converter into ``folder``; its Parquet files as local paths.

    Raises ImportError where petastorm cannot be imported (petastorm 0.12/0.13 need ``pyarrow.filesystem``, which
    pyarrow >= 18, as pyspark 4.2 requires, no longer has).
    """
    from petastorm.spark import SparkDatasetConverter, make_spark_converter

    folder.mkdir(parents=True, exist_ok=True)
    spark.conf.set(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, folder.resolve().as_uri())
    converter = make_spark_converter(frame)
    return sorted(urlparse(url).path for url in converter.file_urls)


def mds_dataset(frame: DataFrame, folder: Path) -> str:
    """Write ``frame`` as Mosaic Streaming (MDS) shards with ``streaming``'s Spark converter (one writer per Spark
    partition, indexes merged into ``folder/index.json``), each row numbered in ``row_index``; returns ``folder``."""
    try:
        from streaming.base.converters import dataframe_to_mds
    except ImportError as err:
        raise ImportError(f"train.reader=mds needs Mosaic Streaming ({err}): pip install -e '.[mds]' && pip install "
                          "--no-deps mosaicml-streaming==0.13.0 (a Databricks ML runtime has it), or set "
                          "train.reader=parquet") from err
    if folder.exists():
        shutil.rmtree(folder)  # a rerun after a crash: the converter refuses a folder that has shards
    numbered = frame.withColumn(MDS_INDEX_COLUMN, F.monotonically_increasing_id())
    dataframe_to_mds(numbered, merge_index=True, mds_kwargs={"out": str(folder), "compression": "zstd"})
    if not (folder / "index.json").is_file():
        raise RuntimeError(f"the MDS snapshot in {folder} has no index.json")
    return str(folder)


def write_snapshot(spark: SparkSession, frame: DataFrame, folder: Path, reader: str) -> tuple[list[str], str | None]:
    """Write the training pairs once for every worker; returns (what the workers read, reason of a fallback or None).

    ``reader`` ``parquet`` writes Spark Parquet (its files); ``mds`` writes MDS shards (their folder, see
    :func:`mds_dataset`); ``petastorm`` uses petastorm's converter and, where petastorm cannot be imported, warns
    and falls back to Spark Parquet, returning the import error as the reason.
    """
    if reader not in READERS:
        raise ValueError(f"reader must be one of {list(READERS)}, got {reader!r}")
    if reader == "mds":
        return [mds_dataset(frame, folder / "mds")], None
    if reader == "petastorm":
        try:
            return petastorm_files(spark, frame, folder / "petastorm"), None
        except ImportError as err:
            reason = f"{type(err).__name__}: {err}"
            message = f"train.reader=petastorm cannot run here ({reason}); reading the Spark Parquet snapshot instead"
            logger.warning(message)
            warnings.warn(message, RuntimeWarning, stacklevel=2)
            fallback = reason
    else:
        fallback = None
    target = folder / "parquet"
    frame.write.mode("overwrite").parquet(str(target))
    files = sorted(str(p) for p in target.glob("*.parquet"))
    if not files:
        raise RuntimeError(f"the training snapshot in {target} has no Parquet files")
    return files, fallback


def check_hparams(cfg: ErgConfig) -> None:
    """ValueError naming the allowed keys when ``train.hparams`` has one the captioner kind does not take."""
    from models.captioners import captioner_hparams

    allowed = captioner_hparams(cfg.train.captioner)
    unknown = sorted(set(cfg.train.hparams) - set(allowed))
    if unknown:
        raise ValueError(f"train.hparams has unknown keys {unknown} for captioner {cfg.train.captioner!r}; "
                         f"allowed: {sorted(allowed)}")


def worker_config(cfg: ErgConfig, train_paths: list[str], output_dir: Path, feature_regions: int = 1,
                  regions_column: str | None = None) -> dict[str, Any]:
    """The ``config`` dict of :func:`models.captioner_training.train_worker` for the conf's ``train`` section
    (``train.reader: mds`` reads an MDS folder; parquet and petastorm, which falls back to it, Parquet files)."""
    t = cfg.train
    return {"train_paths": list(train_paths), "output_dir": str(output_dir), "kind": t.captioner,
            "hparams": dict(t.hparams), "min_count": t.min_count, "max_words": t.max_words, "epochs": t.epochs,
            "batch_size": t.batch_size, "lr": t.lr, "optimizer": t.optimizer, "weight_decay": t.weight_decay,
            "grad_clip": t.grad_clip, "scheduled_sampling": t.scheduled_sampling.model_dump(),
            "seed": t.seed, "device": "cuda" if t.use_gpu else "cpu",
            "backend": "horovod" if t.backend == "horovod" else "ddp", "feature_regions": feature_regions,
            "regions_column": regions_column, "train_format": "mds" if t.reader == "mds" else "parquet",
            "index_column": MDS_INDEX_COLUMN,
            **({"source_column": SOURCE_COLUMN, "inserted_word_weight": t.inserted_word_weight}
               if t.inserted_word_weight != 1 else {})}


def _record_summary(config: dict[str, Any], summary: dict[str, Any] | None) -> None:
    """Rank 0's summary (None on other ranks: nothing written) to ``<output_dir>/train_summary.json``, atomically."""
    if summary is not None:
        path = Path(config["output_dir"]) / SUMMARY_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(summary))
        tmp.replace(path)


def train_and_record(config: dict[str, Any]) -> dict[str, Any] | None:
    """:func:`models.captioner_training.train_worker`, with rank 0's summary also written as JSON to
    ``<output_dir>/train_summary.json``.

    TorchDistributor's local mode has every process pickle its return value to one file, so the driver gets the
    value of whichever process finishes last (None from a rank other than 0); the file written by rank 0 is the
    reliable channel, in local and in distributed mode alike.
    """
    from models.captioner_training import train_worker

    summary = train_worker(config)
    _record_summary(config, summary)
    return summary


def train_and_record_many(configs: list[dict[str, Any]]) -> list[dict[str, Any] | None]:
    """:func:`models.captioner_training.train_workers` (several models in one launch), each rank 0 summary also
    written to its ``<output_dir>/train_summary.json`` as soon as that model is done."""
    from models.captioner_training import train_workers

    return train_workers(configs, on_trained=_record_summary)


def run_distributed_many(cfg: ErgConfig, configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Train every config (from :func:`worker_config`) in one launch (:func:`train_and_record_many` under the
    conf's backend, as :func:`run_distributed`); rank 0's summaries, in order."""
    _launch(cfg, train_and_record_many, configs)
    summaries = []
    for config in configs:
        path = Path(config["output_dir"]) / SUMMARY_FILE
        if not path.is_file():
            raise RuntimeError(f"training finished without rank 0's summary {path}: see the workers' output above")
        summaries.append(json.loads(path.read_text()))
    return summaries


def run_distributed(cfg: ErgConfig, config: dict[str, Any]) -> dict[str, Any]:
    """Run :func:`train_and_record` (``config`` from :func:`worker_config`) on ``train.num_processes`` processes;
    rank 0's summary.

    ``torch_distributor``: ``TorchDistributor(num_processes, local_mode, use_gpu).run`` (local_mode null = true
    locally, false on Databricks). ``horovod``: ``horovod.spark.run(num_proc=..., use_gloo=True)``; an ImportError
    naming :data:`INSTALL_HOROVOD` where Horovod is not installed.
    """
    _launch(cfg, train_and_record, config)
    path = Path(config["output_dir"]) / SUMMARY_FILE
    if not path.is_file():
        raise RuntimeError(f"training finished without rank 0's summary {path}: see the workers' output above")
    return json.loads(path.read_text())


def _launch(cfg: ErgConfig, function, argument) -> None:
    """``function(argument)`` on ``train.num_processes`` processes under ``train.backend``."""
    from models.captioner_training import HOROVOD_INSTALL_HINT

    t = cfg.train
    if t.backend == "horovod":
        try:
            import horovod.spark as horovod_spark
        except ImportError as err:
            raise ImportError(f"train.backend=horovod but Horovod cannot be imported ({err}): run "
                              f"{INSTALL_HOROVOD} (builds horovod 0.28.1 into this venv), or set "
                              f"train.backend=torch_distributor. {HOROVOD_INSTALL_HINT}") from err
        horovod_spark.run(function, args=(argument,), num_proc=t.num_processes, use_gloo=True, use_mpi=False)
    else:
        from pyspark.ml.torch.distributor import TorchDistributor

        local_mode = t.local_mode if t.local_mode is not None else cfg.platform != "databricks"
        TorchDistributor(num_processes=t.num_processes, local_mode=local_mode,
                         use_gpu=t.use_gpu).run(function, argument)


SNAPSHOT_ORDER: tuple[str, ...] = ("pair_id", "origin", "style", "caption", "image_id")
"""The training snapshot's row order (a range-partitioned sort: part files in order, each sorted)."""


def snapshot_config(spark: SparkSession, cfg: ErgConfig, pairs: DataFrame, folder: Path, regions: int
                    ) -> tuple[dict[str, Any], int, str | None]:
    """Write ``pairs`` (with ``features`` and ``n_regions``, none null) as the training snapshot under
    ``folder/data``, in one order whatever Spark's partitions held (:data:`SNAPSHOT_ORDER`: the workers shuffle with
    a seeded sampler over the rows as they read them, so the same pairs train the same model in any home); returns
    (the worker config training ``train.captioner`` on it into ``folder/model``, number of snapshot files, the
    reader fallback's reason or None)."""
    snapshot = pairs.select("features", "n_regions", "style", "caption", "origin", "pair_id", "image_id",
                            F.coalesce(F.col("source_caption"), F.lit("")).alias(SOURCE_COLUMN))
    snapshot = snapshot.orderBy(*SNAPSHOT_ORDER)
    files, fallback = write_snapshot(spark, snapshot, folder / "data", cfg.train.reader)
    return worker_config(cfg, files, folder / "model", regions, "n_regions"), len(files), fallback


def fit_captioner(spark: SparkSession, cfg: ErgConfig, pairs: DataFrame, folder: Path, regions: int
                  ) -> tuple[dict[str, Any], int, str | None]:
    """:func:`snapshot_config`, then train with ``train.backend``; returns (rank 0's summary, number of snapshot
    files, the reader fallback's reason or None)."""
    config, n_files, fallback = snapshot_config(spark, cfg, pairs, folder, regions)
    return run_distributed(cfg, config), n_files, fallback


def check_step(ctx: JobContext) -> DataFrame:
    """The pairs with their features, counted per origin (cached until the job ends); RuntimeError when no pair has
    features (or no augmented pair has, with ``train.use_augmented``)."""
    features: SceneFeatures = ctx["features"]
    joined, counts, styles = count_features(features.frame)
    ctx.on_exit(joined.unpersist)
    ctx.counts.update(counts)
    ctx.summary["styles"] = styles
    missing = {k: v for k, v in counts.items() if k.startswith("rows_without_vector") and v}
    if missing:
        logger.warning("training pairs without scene features (%s) are left out: %s", features.kind, missing)
    if sum(counts[f"rows.{origin}"] for origin in ORIGINS) == 0:
        raise RuntimeError(f"no training pairs with scene features ({features.description}): {counts}; "
                           "run `erg ingest` first, or choose other train.features")
    if ctx.cfg.train.use_augmented and counts["rows.augmented"] == 0:
        raise RuntimeError("train.use_augmented is true but training_set has no augmented pairs with scene "
                           "features: run `erg generate` first, or set train.use_augmented=false")
    return joined


def fit_step(ctx: JobContext) -> dict[str, Any]:
    """Snapshot the pairs with features and train the captioner under ``train.backend``; rank 0's summary."""
    folder = model_dir(ctx.cfg, "captioner", ctx.run_id)
    started = time.time()
    summary, n_files, fallback = fit_captioner(ctx.spark, ctx.cfg, ctx["check"].filter(F.col("features").isNotNull()),
                                               folder, ctx["features"].regions)
    ctx.counts.update({"rows": sum(ctx.counts[f"rows.{origin}"] for origin in ORIGINS),
                       "train_seconds": time.time() - started, "loss_first": summary["loss_first"],
                       "loss_last": summary["loss_last"], "steps": summary["steps"],
                       "world_size": summary["world_size"], "vocab_size": summary["vocab_size"],
                       "snapshot_files": n_files, **ctx["features"].counts})
    reader = "parquet" if fallback else ctx.cfg.train.reader
    ctx.tag({"erg.reader": reader, **({"erg.reader_fallback": fallback[:5000]} if fallback else {})})
    ctx.summary.update({"losses": summary["losses"], "backend": summary["backend"], "reader": reader,
                        "reader_fallback": fallback})
    return {**summary, "folder": folder}


def record_step(ctx: JobContext) -> CaptionerRecord:
    """The loss curve and the model as artifacts; the model recorded as the variant's current captioner."""
    import mlflow

    fit, features, t = ctx["fit"], ctx["features"], ctx.cfg.train
    reports.log_loss_curve(ctx.run_id, fit)
    mlflow.log_artifacts(str(fit["folder"] / "model"), "captioner")  # weights, vocabulary, config, summary
    current: CaptionerRecord = {
        "path": str(fit["folder"] / "model"), "version": ctx.run_id, "variant": ctx["variant"], "kind": t.captioner,
        "styles": ctx.summary["styles"], "encoder_version": features.version, "features": features.kind,
        "regions": features.regions, "rows": ctx.counts["rows"], "rows_augmented": ctx.counts["rows.augmented"],
        "loss_first": fit["loss_first"], "loss_last": fit["loss_last"], "backend": fit["backend"],
        "world_size": fit["world_size"]}
    set_current(ctx.cfg, captioner_kind(ctx["variant"]), current)
    ctx.summary["model_path"] = current["path"]
    return current


def tag_step(ctx: JobContext) -> None:
    features = ctx["features"]
    ctx.tag({"erg.captioner_variant": ctx["variant"], "erg.encoder_version": features.version,
             "erg.backend": ctx.cfg.train.backend, "erg.features": features.description[:5000]})


TRAIN_STEPS = (Step("tag", tag_step), Step("check", check_step), Step("fit", fit_step),
               Step("record", record_step))


def train(spark: SparkSession, cfg: ErgConfig) -> dict[str, Any]:
    """Train the conf's captioner variant; returns the counts it logged, the losses, the model path and run id."""
    variant = captioner_variant(cfg)
    check_hparams(cfg)
    features = scene_features(spark, cfg, training_pairs(spark, cfg))
    return run_job(spark, cfg, "train", TRAIN_STEPS, sections=("train",),
                   params={"variant": variant, "encoder_version": features.version, "features": features.kind},
                   inputs={"variant": variant, "features": features},
                   result=lambda ctx: {**ctx.counts, **ctx.summary, "run_id": ctx.run_id, "variant": variant,
                                       "encoder_version": features.version})
