"""The cells of ``erg experiment`` and of its tuning sweep (:mod:`jobs.tuning`): what a cell is, the pairs and test
images it trains and is scored on, its fingerprint, and the steps every cell goes through.

A :class:`Cell` is one captioner trained on one style's pairs (original, augmented, a share or a retrieval type of
the augmented ones, another eps's, an ablation's) with one seed. :func:`load_data` reads the train pairs and the test
(or val) images with their scene features; :func:`train_cells` trains the cells, **resumably**: a cell is known by
its fingerprint (:func:`cell_fingerprint`: cell, seed, training conf, a content version of its pairs), one recorded
by an earlier run is reused, and one a stopped launch finished is recorded from its folder; :func:`score_cells`
captions the test images with every cell's captioner and scores them (BLEU-1/3, METEOR, CIDEr, cls., cls. by the
independent grader of :func:`fit_independent_classifier`, ppl.).
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pandas as pd
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from jobs.evaluate import evaluation_pairs, nonfinite_perplexities, style_scores
from jobs.extract import factual_pool, read_factual_for_classifiers, read_stylized
from jobs.leakage import leakage_counts
from jobs.platform.config import ErgConfig
from jobs.platform.model_store import model_dir
from jobs.platform.spark import default_parallelism, spread_tasks
from jobs.platform.tables import read_table
from jobs.platform.tracking import configure_mlflow, job_run, log_counts
from jobs.reports import log_loss_curve
from jobs.scene_features import feature_leaks, scene_features
from jobs.train import SUMMARY_FILE, run_distributed_many, snapshot_config, worker_config
from readers.corpora import stable_id
from udfs.captioning import HYPOTHESIS_DDL, make_captioner_evaluator
from udfs.grading import GRADE_DDL, make_grader

# the experiment's logger: the cells' lines read as they did when this was part of jobs/experiment.py
logger = logging.getLogger("jobs.experiment")


@dataclass(frozen=True)
class Cell:
    """One captioner trained on one style's pairs: ``types`` None = every retrieval type; ``fraction`` = the
    share of the (capped) augmented pairs, 0 for the original pairs alone; ``eps`` = the extraction proportion of
    the eps sweep's ERG run whose augmented pairs it takes (None: the main run's)."""

    style: str
    captioner: str
    variant: str
    types: tuple[str, ...] | None
    fraction: float
    eps: float | None = None
    seed: int = 23

    @property
    def key(self) -> tuple:
        return (self.style, self.captioner, self.types, self.fraction if self.fraction else 0.0, self.eps, self.seed)

    @property
    def name(self) -> str:
        """The cell as the tables name it (its seeds together)."""
        return f"{self.style}/{self.captioner}/{self.variant}"

    @property
    def label(self) -> str:
        """One training run of the cell: its name and seed."""
        return f"{self.name}#seed={self.seed}"


def cell_epochs(cfg: ErgConfig, style: str) -> int:
    """Epochs of a cell of ``style``: its style set's ``experiment.epochs`` entry, else ``train.epochs``."""
    return cfg.experiment.epochs.get(cfg.style_set_of(style), cfg.train.epochs)


def with_captioner(cfg: ErgConfig, captioner: str, style: str | None = None, seed: int | None = None
                   ) -> ErgConfig:
    """``cfg`` training ``captioner`` (its ``experiment.hparams`` entry, or ``train.hparams`` for the conf's own),
    for ``style``'s epochs (:func:`cell_epochs`) and with ``seed`` as ``train.seed`` when given."""
    out = cfg.model_copy(deep=True)
    if style is not None:
        out.train.epochs = cell_epochs(cfg, style)
    if seed is not None:
        out.train.seed = seed
    hparams = cfg.experiment.hparams.get(captioner)
    if hparams is None:
        hparams = dict(cfg.train.hparams) if captioner == cfg.train.captioner else {}
    out.train.captioner = captioner
    out.train.hparams = dict(hparams)
    return out


# ------------------------------------------------------------------------------------------------------- pairs
def experiment_pairs(spark: SparkSession, cfg: ErgConfig, styles: list[str], generator_version: str | None
                     ) -> DataFrame:
    """Train pairs of ``styles``: original ones and the augmented ones of ``generator_version`` (None: every
    version), with ``scene_id``, ``retrieval_type`` and ``source_caption``."""
    frame = (read_table(spark, cfg, "training_set")
             .where((F.col("split") == "train") & F.col("style").isin(styles)))
    if generator_version is not None:
        frame = frame.where((F.col("origin") == "original") | (F.col("generator_version") == generator_version))
    return frame.select("pair_id", "image_id", "caption", "style", "origin", "scene_id", "retrieval_type",
                        "perplexity", F.col("factual_caption").alias("source_caption"))


def rank_augmented(frame: DataFrame) -> DataFrame:
    """``aug_rank`` of each augmented pair with features within its style (1 = first), by a hash of the pair id:
    the order every cap and share takes them in (null for original pairs and pairs without features)."""
    has = F.col("features").isNotNull()
    order = Window.partitionBy("style", "origin", has).orderBy(F.xxhash64("pair_id"), "pair_id")
    return frame.withColumn("aug_rank", F.when((F.col("origin") == "augmented") & has, F.row_number().over(order)))


def test_pairs(spark: SparkSession, cfg: ErgConfig, styles: list[str], split: str = "test") -> DataFrame:
    """``pair_id, image_id, style, references`` of the test split (at most ``max_test_images`` per style), or of
    the val split (``split="val"``: the tuning's, at most ``tuning.max_val_images``)."""
    eval_cfg = cfg.model_copy(deep=True)
    eval_cfg.evaluate.split = split
    eval_cfg.evaluate.max_images = (cfg.experiment.max_test_images if split == "test"
                                    else cfg.experiment.tuning.max_val_images)
    return evaluation_pairs(spark, eval_cfg, styles).withColumn("pair_id", F.concat_ws("|", "image_id", "style"))


def cell_pairs(pairs: DataFrame, cell: Cell, pool: dict[str, int], available: dict[tuple[str, str], int],
               order: str) -> tuple[DataFrame, int, int]:
    """The training pairs of ``cell`` (with features): its style's original pairs plus its share of the capped
    augmented pool (``pool[style]`` pairs, the lowest hash ranks), restricted to its retrieval types; returns
    (pairs, original count, augmented count). A share below 1 takes the pool's pairs of lowest trigram perplexity
    (``order`` perplexity, Fig. 5 as the paper) or of lowest hash rank (``hash``), so the shares are nested.
    ``available[(style, origin)]`` counts the pairs with features."""
    original = available.get((cell.style, "original"), 0)
    mine = pairs.where(F.col("style") == cell.style)
    if cell.fraction <= 0:
        return mine.where(F.col("origin") == "original"), original, 0
    size = pool.get(cell.style, 0)
    limit = int(math.ceil(cell.fraction * size))
    augmented = mine.where((F.col("origin") == "augmented") & (F.col("aug_rank") <= size))
    if limit < size:
        by = ([F.col("perplexity").asc_nulls_last(), "aug_rank"] if order == "perplexity" else ["aug_rank"])
        share_rank = F.row_number().over(Window.partitionBy("style").orderBy(*by))
        augmented = augmented.withColumn("_share_rank", share_rank).where(F.col("_share_rank") <= limit).drop(
            "_share_rank")
    if cell.types is not None:
        augmented = augmented.where(F.col("retrieval_type").isin(list(cell.types)))
    n_aug = augmented.count()
    return mine.where(F.col("origin") == "original").unionByName(augmented), original, n_aug


# ------------------------------------------------------------------------------------------ independent grader
def fit_independent_classifier(spark: SparkSession, cfg: ErgConfig, styles: list[str], folder: Path
                               ) -> dict[str, Any] | None:
    """Per style, style vs factual, trained on the train-split images a hash puts in half B (the filter classifier
    is the current ``evaluation_classifiers``, trained by ``erg extract``); saved under ``folder``."""
    from models.caption_scoring import train_evaluation_classifiers

    c = cfg.experiment.independent_classifier
    if not c.enabled:
        return None
    stylized = read_stylized(spark, cfg)
    factual = read_factual_for_classifiers(spark, cfg)

    def half_b(image_ids: pd.Series) -> pd.Series:
        return image_ids.map(lambda i: int(stable_id("grader", i, length=8), 16) % 2 == 1)

    train = stylized[(stylized["split"] == "train") & half_b(stylized["image_id"])]
    pool = factual_pool(stylized, factual[half_b(factual["image_id"])], 0.01)["train"]
    positives = {s: train.loc[train["style"] == s, "caption"].tolist() for s in styles}
    positives = {s: texts for s, texts in positives.items() if texts}
    if not positives or not pool:
        logger.warning("no half-B train captions to fit the independent classifier on: cls_independent is not "
                       "reported")
        return None
    classifiers = train_evaluation_classifiers(
        c.kind, positives, pool, factual_label=cfg.factual_label, name_or_path=c.name_or_path,
        max_length=c.max_length, device=cfg.evaluate.device, epochs=c.epochs, batch_size=c.batch_size, lr=c.lr,
        max_train_captions=c.max_train_captions, seed=c.seed)
    path = classifiers.save(folder)
    return {"path": str(path), "styles": sorted(positives), "kind": c.kind,
            "train_captions": {s: len(t) for s, t in positives.items()}, "factual_captions": len(pool)}


def grade(spark: SparkSession, hypotheses: pd.DataFrame, classifier_path: str, batch_size: int,
          device: str) -> pd.Series:
    """p(target style) of each hypothesis under the independent classifiers (an iterator pandas UDF)."""
    frame = hypotheses[["variant", "image_id", "style", "hypothesis"]].reset_index(drop=True)
    frame = frame.assign(row=range(len(frame)))
    parts = spread_tasks(default_parallelism(spark), len(frame), batch_size)
    graded = (spark.createDataFrame(frame[["row", "style", "hypothesis"]])
              .repartition(parts).mapInPandas(make_grader(classifier_path, batch_size, device), GRADE_DDL)
              .toPandas().set_index("row")["probability"])
    return graded.reindex(frame["row"]).reset_index(drop=True)


# ------------------------------------------------------------------------------------------------------- data
@dataclass
class ExperimentData:
    """What the cells train and test on: pairs (ranked by :func:`rank_augmented`) and test images with their scene
    features, both cached, and their counts (``available[(style, origin)]`` and ``test_counts[style]``: those with
    features)."""

    train_features: Any
    pairs: DataFrame
    tests: DataFrame
    counts: dict[str, float]
    available: dict[tuple[str, str], int]
    test_counts: dict[str, int]

    @property
    def pairs_ok(self) -> DataFrame:
        return self.pairs.where(F.col("features").isNotNull())

    @property
    def tests_ok(self) -> DataFrame:
        return self.tests.where(F.col("features").isNotNull())

    def unpersist(self) -> None:
        self.pairs.unpersist()
        self.tests.unpersist()


def load_data(spark: SparkSession, cfg: ErgConfig, styles: list[str], generator_version: str | None,
              split: str = "test") -> ExperimentData:
    """Step 1: the train pairs and test images of ``styles`` with scene features, counted by Spark (``split="val"``:
    the val images instead, for the tuning; ``tests`` and ``test_counts`` then hold those)."""
    train_features = scene_features(spark, cfg, experiment_pairs(spark, cfg, styles, generator_version))
    pairs = rank_augmented(train_features.frame).cache()
    tests = scene_features(spark, cfg, test_pairs(spark, cfg, styles, split)).frame.cache()
    counts: dict[str, float] = dict(train_features.counts)
    available: dict[tuple[str, str], int] = {}
    for row in pairs.groupBy("style", "origin", F.col("features").isNull().alias("missing")).count().collect():
        counts[f"pairs.{row.style}.{row.origin}.{'without_features' if row.missing else 'with_features'}"] = row["count"]
        if not row.missing:
            available[(row.style, row.origin)] = row["count"]
    test_counts: dict[str, int] = {}
    for row in tests.groupBy("style", F.col("features").isNull().alias("missing")).count().collect():
        counts[f"test.{row.style}.{'without_features' if row.missing else 'with_features'}"] = row["count"]
        if not row.missing:
            test_counts[row.style] = row["count"]
    return ExperimentData(train_features, pairs, tests, counts, available, test_counts)


def measure_leakage(spark: SparkSession, cfg: ErgConfig, data: ExperimentData, pool: dict[str, int],
                    tables: bool = True) -> dict[str, int]:
    """Step 4: leakage on exactly what the cells train and test on, plus the tables' own leakage counts (``tables``)."""
    stylized = read_table(spark, cfg, "stylized_captions")
    held = F.coalesce(F.col("split"), F.lit("")) != "train"
    limits = spark.createDataFrame([(s, int(n)) for s, n in pool.items()], "style string, pool int")
    used = (data.pairs_ok.join(limits, "style")
            .where((F.col("origin") == "original") | (F.col("aug_rank") <= F.col("pool"))))
    leakage = {
        "test_scene_phrases_in_training": used.join(stylized.where(held).select("scene_id"), "scene_id",
                                                    "left_semi").count(),
        "test_images_in_training": used.join(stylized.where(held).select("image_id").distinct(), "image_id",
                                             "left_semi").count(),
        "scene_features_from_scored_references": feature_leaks(spark, cfg, data.tests_ok),
    }
    if tables:
        leakage.update({k.removeprefix("leakage."): v for k, v in leakage_counts(spark, cfg).items()})
    return leakage


# --------------------------------------------------------------------------------------------------- training
def data_version(frame: DataFrame) -> str:
    """A version of a cell's training pairs computed from their content (count, and a sum and an xor of a hash of
    every row's pair id, caption, style, origin, features and source caption): the same pairs give the same
    version however the tables were written."""
    row_hash = F.xxhash64("pair_id", "image_id", "caption", "style", "origin", "features", "n_regions",
                          F.coalesce(F.col("source_caption"), F.lit("")))
    got = frame.agg(F.count(F.lit(1)).alias("n"), F.sum(F.pmod(row_hash, F.lit(2 ** 31 - 1))).alias("s"),
                    F.bit_xor(row_hash).alias("x")).first()
    return f"{got['n']}-{got['s'] or 0}-{got['x'] or 0}"


def cell_fingerprint(cell: Cell, worker_conf: dict[str, Any], version: str) -> str:
    """What a trained cell is: its cell and seed, the training conf of its worker (paths and label aside) and its
    pairs' :func:`data_version`. Equal fingerprints train equal models (training is deterministic per seed)."""
    conf = {k: v for k, v in worker_conf.items() if k not in ("train_paths", "output_dir", "label")}
    payload = {"cell": [cell.style, cell.captioner, cell.variant, list(cell.types or []), cell.fraction, cell.eps],
               "seed": cell.seed, "train": conf, "data": version}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:24]


def recorded_cells(cfg: ErgConfig, fingerprints: list[str]) -> dict[str, Any]:
    """The finished MLflow runs of cells with these fingerprints (tag ``erg.cell_fingerprint``), the newest per
    fingerprint."""
    from mlflow.tracking import MlflowClient

    if not fingerprints:
        return {}
    client = MlflowClient()
    experiment_id = configure_mlflow(cfg)
    wanted = set(fingerprints)
    found: dict[str, Any] = {}
    token = None
    while True:
        page = client.search_runs([experiment_id], "tags.`erg.job` = 'experiment_cell' and "
                                  "attributes.status = 'FINISHED'", order_by=["attributes.start_time DESC"],
                                  max_results=1000, page_token=token)
        for run in page:
            fingerprint = run.data.tags.get("erg.cell_fingerprint")
            if fingerprint in wanted:
                found.setdefault(fingerprint, run)
        token = page.token
        if not token:
            return found


def _summary_of(model_path: Path) -> dict[str, Any] | None:
    path = model_path / SUMMARY_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def _reuse(run, cell_dir: Path) -> tuple[Path, dict[str, Any]] | None:
    """The model of a recorded cell run: its folder where it still is, else its ``captioner`` artifacts downloaded
    into ``cell_dir``; None when neither holds a model with its summary."""
    import mlflow

    model = cell_dir / "model"
    if _summary_of(model) is None:
        try:
            model = Path(mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path="captioner",
                                                             dst_path=str(cell_dir / "downloaded")))
        except Exception as err:  # noqa: BLE001 - artifacts gone: train the cell again, counted by the caller
            logger.warning("cell run %s has no captioner artifacts (%s): training it again", run.info.run_id, err)
            return None
    summary = _summary_of(model)
    return (model, summary) if summary is not None else None


@dataclass(frozen=True)
class PlannedCell:
    """A cell ready to train: the conf it trains with, its pairs, what it is (``info``: its pair counts, epochs and
    fingerprint, what every result of the cell starts with) and its folder (named by the fingerprint)."""

    cell: Cell
    cfg: ErgConfig
    frame: DataFrame
    info: dict[str, Any]
    folder: Path

    @property
    def fingerprint(self) -> str:
        return self.info["fingerprint"]


def plan_cell(cfg: ErgConfig, cell_conf: ErgConfig, cell: Cell, data: ExperimentData, pool: dict[str, int]
              ) -> PlannedCell:
    """``cell`` trained with ``cell_conf`` (:func:`with_captioner`): its pairs (:func:`cell_pairs`), its
    fingerprint (:func:`cell_fingerprint` of its worker conf and its pairs' :func:`data_version`) and folder."""
    cell_cfg = with_captioner(cell_conf, cell.captioner, cell.style, cell.seed)
    frame, n_orig, n_aug = cell_pairs(data.pairs_ok, cell, pool, data.available, cfg.experiment.fig5.order)
    conf = worker_config(cell_cfg, [], Path("."), data.train_features.regions, "n_regions")
    fingerprint = cell_fingerprint(cell, conf, data_version(frame))
    info = {"cell": cell, "train_pairs": n_orig + n_aug, "train_pairs_original": n_orig,
            "train_pairs_augmented": n_aug, "epochs": cell_cfg.train.epochs, "fingerprint": fingerprint}
    return PlannedCell(cell, cell_cfg, frame, info, model_dir(cfg, "experiment_cell", fingerprint))


def reused_cell(planned: PlannedCell, run, counts: dict[str, float]) -> dict[str, Any] | None:
    """The result of a cell that the earlier run ``run`` recorded (None: none did), when its model is still to be
    had (:func:`_reuse`; else ``cells.reuse_failed`` is counted and the cell trains again); else None."""
    reused = _reuse(run, planned.folder) if run is not None else None
    if run is not None and reused is None:
        counts["cells.reuse_failed"] += 1
    if reused is None:
        return None
    model, summary = reused
    counts["cells.reused"] += 1
    logger.info("experiment cell %s: reused from run %s", planned.cell.label, run.info.run_id)
    return {**planned.info, "run_id": run.info.run_id, "path": str(model), "reused": True,
            "train_seconds": summary["seconds"], "loss_last": summary["loss_last"]}


def snapshot_cell(spark: SparkSession, cfg: ErgConfig, planned: PlannedCell, regions: int,
                  counts: dict[str, float]) -> dict[str, Any] | None:
    """The worker config of a cell to train, its snapshot written (and an older model in its folder removed); None
    when a launch that stopped before recording it trained it already (``cells.recorded_from_disk``)."""
    label = planned.cell.label
    if cfg.experiment.resume and _summary_of(planned.folder / "model") is not None:
        counts["cells.recorded_from_disk"] += 1
        logger.info("experiment cell %s: trained by a launch that stopped before recording it", label)
        return None
    shutil.rmtree(planned.folder / "model", ignore_errors=True)
    config, _, _ = snapshot_config(spark, planned.cfg, planned.frame, planned.folder, regions)
    logger.info("experiment cell %s: %d original + %d augmented pairs", label, planned.info["train_pairs_original"],
                planned.info["train_pairs_augmented"])
    return {**config, "label": label}


def train_cells(spark: SparkSession, cfg: ErgConfig, cells: list[Cell], data: ExperimentData, pool: dict[str, int],
                parent_id: str, lap, counts: dict[str, float] | None = None,
                conf_of: Callable[[Cell], ErgConfig] | None = None) -> dict[str, dict[str, Any]]:
    """Step 5, resumable: each cell's fingerprint (:func:`cell_fingerprint`); a cell recorded by an earlier run
    with that fingerprint is reused (``experiment.resume``); a cell trained by a launch that stopped before it was
    recorded (its model and summary in its fingerprint's folder) is recorded now; the others' snapshots are written
    and one launch trains them all, each recorded as its own child run once the launch ends. ``counts`` gains
    ``cells.reused``, ``cells.recorded_from_disk``, ``cells.trained`` and ``cells.reuse_failed``. ``conf_of`` gives a
    cell a conf of its own (the tuning's knob values; how training runs stays ``cfg``'s)."""
    counts = counts if counts is not None else {}
    for key in ("reused", "recorded_from_disk", "trained", "reuse_failed"):
        counts.setdefault(f"cells.{key}", 0)
    planned = [plan_cell(cfg, conf_of(cell) if conf_of else cfg, cell, data, pool) for cell in cells]
    recorded = recorded_cells(cfg, [p.fingerprint for p in planned]) if cfg.experiment.resume else {}
    trained: dict[str, dict[str, Any]] = {}
    configs, todo = [], []
    for p in planned:
        reused = reused_cell(p, recorded.get(p.fingerprint), counts)
        if reused is not None:
            trained[p.cell.label] = reused
            continue
        config = snapshot_cell(spark, cfg, p, data.train_features.regions, counts)
        configs += [config] if config is not None else []
        todo.append(p)
    lap("snapshots")
    if configs:
        run_distributed_many(cfg, configs)
        counts["cells.trained"] += len(configs)
    lap("training")
    for p in todo:
        trained[p.cell.label] = record_cell(p.cell, p.cfg, p.info, p.folder, data.train_features.kind, parent_id)
    ordered = {c.label: trained[c.label] for c in cells}
    lap("child_runs")
    return ordered


def record_cell(cell: Cell, cell_cfg: ErgConfig, info: dict[str, Any], cell_dir: Path, features: str,
                parent_id: str) -> dict[str, Any]:
    """A trained cell as a child run of the experiment: its params (cell, seed, fingerprint), counts, loss curve
    and model (``captioner`` artifacts); the run's tag ``erg.cell_fingerprint`` is what a rerun finds it by."""
    import mlflow

    summary = _summary_of(cell_dir / "model")
    if summary is None:
        raise RuntimeError(f"cell {cell.label}: training finished without rank 0's summary in {cell_dir / 'model'}")
    with job_run(cell_cfg, "experiment_cell", sections=("train",), record_state=False,
                 params={"cell": cell.name, "style": cell.style, "captioner": cell.captioner,
                         "variant": cell.variant, "types": ",".join(cell.types or ["all"]),
                         "fraction": cell.fraction, "features": features, "seed": cell.seed,
                         "fingerprint": info["fingerprint"]}) as child:
        mlflow.set_tags({"erg.cell": cell.name, "erg.experiment_run": parent_id, "erg.seed": str(cell.seed)})
        log_counts({"train_pairs": info["train_pairs"], "train_pairs.original": info["train_pairs_original"],
                    "train_pairs.augmented": info["train_pairs_augmented"], "train_seconds": summary["seconds"],
                    "loss_first": summary["loss_first"], "loss_last": summary["loss_last"],
                    "vocab_size": summary["vocab_size"],
                    "inserted_words_weighted": summary.get("inserted_words_weighted", 0)})
        log_loss_curve(child.info.run_id, summary)
        mlflow.log_artifacts(str(cell_dir / "model"), "captioner")
        mlflow.set_tag("erg.cell_fingerprint", info["fingerprint"])  # last: only a fully logged cell is found
    return {**info, "run_id": child.info.run_id, "path": str(cell_dir / "model"), "reused": False,
            "train_seconds": summary["seconds"], "loss_last": summary["loss_last"]}


# ---------------------------------------------------------------------------------------------------- scoring
def _log_child_metrics(run_id: str, metrics: dict[str, float]) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    for key, value in metrics.items():
        if value is not None and not (isinstance(value, float) and math.isnan(value)):
            client.log_metric(run_id, key, float(value))


def caption_style(spark: SparkSession, cfg: ErgConfig, data: ExperimentData, style: str,
                  mine: dict[str, dict[str, Any]], classifiers_path: str, lm_path: str, grader: dict[str, Any] | None
                  ) -> tuple[pd.DataFrame, dict[str, list[str]]]:
    """``style``'s test images captioned by each of its cells' captioners (``mine``: label -> trained cell) on the
    executors, with the independent grader's p(style) where it grades the style; and each image's references."""
    ev = cfg.evaluate
    todo = data.tests_ok.where(F.col("style") == style)
    references = {r.image_id: list(r.references) for r in todo.select("image_id", "references").collect()}
    parts = spread_tasks(default_parallelism(spark), len(references), ev.batch_size)
    evaluator = make_captioner_evaluator({n: info["path"] for n, info in mine.items()}, classifiers_path,
                                         lm_path, ev.max_len, ev.batch_size, ev.device,
                                         ev.no_repeat_ngram_size)
    hypotheses = (todo.select("image_id", "style", "features", "n_regions")
                  .repartition(parts, "image_id").mapInPandas(evaluator, HYPOTHESIS_DDL).toPandas())
    if grader is not None and style in grader["styles"]:
        hypotheses["independent_probability"] = grade(spark, hypotheses, grader["path"], ev.batch_size,
                                                      ev.device).to_numpy()
    return hypotheses, references


def cell_row(style: str, info: dict[str, Any], group: pd.DataFrame, references: dict[str, list[str]], scorer,
             statistic: str) -> dict[str, Any]:
    """One trained cell's row: its captions (``group``) scored against ``references``, with what the cell is."""
    cell = info["cell"]
    scores = style_scores(group, {i: references[i] for i in group["image_id"]}, scorer, statistic)
    independent = (float((group["independent_probability"] > 0.5).mean())
                   if "independent_probability" in group else float("nan"))
    return {"style": style, "captioner": cell.captioner, "variant": cell.variant,
            "types": list(cell.types) if cell.types else "all", "fraction": cell.fraction,
            "eps": cell.eps, "seed": cell.seed, "reused": info.get("reused", False),
            "fingerprint": info["fingerprint"],
            "bleu1": scores["BLEU-1"], "bleu3": scores["BLEU-3"], "meteor": scores["METEOR"],
            "cider": scores["CIDEr"], "cls": scores["cls."], "cls_independent": independent,
            "ppl": scores["ppl."], "ppl_nonfinite": nonfinite_perplexities(group),
            "train_pairs": info["train_pairs"],
            "train_pairs_original": info["train_pairs_original"],
            "train_pairs_augmented": info["train_pairs_augmented"], "test_images": len(group),
            "run_id": info["run_id"], "train_seconds": info["train_seconds"], "epochs": info["epochs"]}


def cell_samples(cfg: ErgConfig, cell: Cell, group: pd.DataFrame, references: dict[str, list[str]]
                 ) -> list[dict[str, Any]]:
    """The first ``experiment.samples_to_log`` captions of a cell of the first seed (none of the other seeds)."""
    e = cfg.experiment
    return [{"style": cell.style, "captioner": cell.captioner, "variant": cell.variant, "seed": cell.seed,
             "image_id": r.image_id, "hypothesis": r.hypothesis, "references": references[r.image_id][:2]}
            for r in group.head(e.samples_to_log if cell.seed == e.seeds[0] else 0).itertuples()]


def score_cells(spark: SparkSession, cfg: ErgConfig, trained: dict[str, dict[str, Any]], data: ExperimentData,
                measured: list[str], classifiers_path: str, lm_path: str, grader: dict[str, Any] | None,
                metric_prefix: str = "") -> tuple[list[dict[str, Any]], list[dict[str, Any]], pd.DataFrame]:
    """Step 6: per style, every cell's captioner captions the test images on the executors; the captions are
    scored (BLEU-1/3, METEOR, CIDEr, cls., cls. by the independent grader, ppl.). Returns (rows, samples,
    hypotheses); each child run logs its scores, named with ``metric_prefix`` (``val.`` for the tuning's)."""
    from models.caption_metrics import CaptionScorer

    rows: list[dict[str, Any]] = []
    samples: list[dict[str, Any]] = []
    captions: list[pd.DataFrame] = []
    with CaptionScorer() as scorer:
        for style in measured:
            mine = {name: info for name, info in trained.items() if info["cell"].style == style}
            hypotheses, references = caption_style(spark, cfg, data, style, mine, classifiers_path, lm_path, grader)
            captions.append(hypotheses)
            for name, group in hypotheses.groupby("variant", sort=False):
                row = cell_row(style, mine[name], group, references, scorer, cfg.experiment.ppl_statistic)
                rows.append(row)
                _log_child_metrics(mine[name]["run_id"], {f"{metric_prefix}{k}": row[k] for k in (
                    "bleu1", "bleu3", "meteor", "cider", "cls", "cls_independent", "ppl", "ppl_nonfinite",
                    "test_images")})
                samples += cell_samples(cfg, mine[name]["cell"], group, references)
    order = {label: i for i, label in enumerate(trained)}
    rows.sort(key=lambda r: order[f"{r['style']}/{r['captioner']}/{r['variant']}#seed={r['seed']}"])
    return rows, samples, pd.concat(captions, ignore_index=True) if captions else pd.DataFrame()
