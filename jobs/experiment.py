"""``erg experiment``: the paper's evaluation (Sect. 4) as one command: does augmenting help, by how much, and with
which settings.

1. **ERG** on the train split (``erg run``), unless a generator is already trained (``experiment.run_erg``).
   Then the **tuning** (``experiment.tuning``, :mod:`jobs.tuning`): training knobs chosen on the *val* split by a
   criterion declared in the conf, before any test image is captioned; every step below runs with the chosen values
   (``experiment.tuning.only`` stops after it).
2. **Pairs.** Original = the train split of the stylized set, per style; augmented = the passing augmented pairs of
   the *current generator version* (``training_set`` holds every version's passing rows; ``experiment.
   generator_version: all`` takes them all), capped per style at ``max_augmented_pairs`` (the same pairs every run:
   the lowest hash of the pair id), which keeps the Table 2 part within its time budget. Each pair gets its image's
   scene features (``train.features``, :mod:`jobs.scene_features`); pairs without are counted and left out.
   Test = every (image, style) of the test split with its stylized captions as references (``max_test_images``).
3. **Cells.** Table 2: each measured style x ``experiment.captioners`` x {original, augmented}. Table 5 (one
   captioner, one style set): each retrieval type's augmented pairs alone. Fig. 5 (likewise): shares of the
   augmented pairs (nested: the lowest trigram perplexity first, as the paper, ``experiment.fig5.order``), and the
   augmented pairs of ERG rerun at each
   other extraction proportion eps (``experiment.fig5.eps``: :mod:`jobs.eps_sweep`, each in a schema of its own,
   nested under the experiment's run and only where Fig. 5's style set is measured; :func:`measure_eps`). Equal
   cells are trained once, once per seed (``experiment.seeds``). Every cell's pairs are written as its training
   snapshot, then one TorchDistributor (or Horovod) launch trains all the cells' captioners one after the other in
   the same worker processes; each cell is a child MLflow run. **Resumable**: a cell is known by its fingerprint
   (cell, seed, training conf, a content version of its pairs); one recorded by an earlier run is reused, and one a
   stopped launch finished is recorded from its folder, so a rerun after a stop trains only what is left
   (:func:`train_cells`).
4. **Scores.** Per style, every cell's captioner captions the test images (greedy, an iterator pandas UDF), scored
   by BLEU-1/3, METEOR, CIDEr (one ``CaptionScorer``), cls. by the per-style evaluation classifiers (filter 1 of
   generate), cls. by an *independent* classifier trained here on the half of the train split's images that a hash
   puts in half B (never a filter, so no filter grades its own output), and ppl. under the style's trigram LM.
5. **Report.** ``report.md`` (Table 2 layout with delta C % and delta cls., Table 5, Fig. 5, each cell's most
   frequent captions), ``table2.png``, ``fig5_size.png``, ``fig5_eps.png``, ``experiment.json`` (rows, leakage,
   not_measured, modes) and ``hypotheses.parquet`` (every cell's scored caption of every test image) as artifacts of
   the parent run.

A style is *not measured* (listed with the reason) when it has no train pair or fewer than ``min_test_images``
test images with scene features: e.g. SentiCap's train images have no tags or descriptions on ../shared/data.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import shlex
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pandas as pd
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from jobs.ablation import (ABLATION_PREFIX, ablation_pairs, candidates_per_style, erg_pass_counts, make_ablation_rows,
                           summary)
from jobs.config import ErgConfig
from jobs.model_store import get_current, model_dir, require_current
from jobs.spark import default_parallelism, spread_tasks
from jobs.tables import read_table
from jobs.tracking import configure_mlflow, job_run, log_counts
from jobs.reports import log_loss_curve
from jobs.train import SUMMARY_FILE, run_distributed_many, snapshot_config, worker_config

logger = logging.getLogger(__name__)


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


def plan_cells(table2_styles: list[str], captioners: list[str], table5: tuple[str, list[str], list[str]] | None,
               fig5: tuple[str, list[str], list[float]] | None, seeds: list[int] = (23,),
               seeds_per_captioner: dict[str, int] | None = None) -> list[Cell]:
    """Every cell to train, each once per seed (a captioner of ``seeds_per_captioner`` with its first seeds only):
    Table 2's, then Table 5's (captioner, styles, retrieval types), then Fig. 5's (captioner, styles, shares)."""
    cells: dict[tuple, Cell] = {}
    per_captioner = seeds_per_captioner or {}

    def add(cell: Cell) -> None:
        for seed in seeds[: per_captioner.get(cell.captioner, len(seeds))]:
            seeded = dataclasses.replace(cell, seed=seed)
            cells.setdefault(seeded.key, seeded)

    for style in table2_styles:
        for captioner in captioners:
            add(Cell(style, captioner, "original", None, 0.0))
            add(Cell(style, captioner, "augmented", None, 1.0))
    if table5 is not None:
        captioner, styles, types = table5
        for style in styles:
            add(Cell(style, captioner, "original", None, 0.0))
            add(Cell(style, captioner, "augmented", None, 1.0))
            if len(types) > 1:  # one type alone would be "all types" again
                for kind in types:
                    add(Cell(style, captioner, f"augmented:{kind}", (kind,), 1.0))
    if fig5 is not None:
        captioner, styles, shares = fig5
        for style in styles:
            for share in shares:
                if share == 0:
                    add(Cell(style, captioner, "original", None, 0.0))
                elif share == 1:
                    add(Cell(style, captioner, "augmented", None, 1.0))
                else:
                    add(Cell(style, captioner, f"augmented@{share:g}", None, float(share)))
    return list(cells.values())


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


def _style_set_styles(cfg: ErgConfig, name: str | None, measured: list[str]) -> list[str]:
    name = name or next(iter(cfg.style_sets))
    return [s for s in cfg.style_sets[name] if s in measured]


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
    from jobs.evaluate import evaluation_pairs

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
    from jobs.extract import factual_pool, read_factual_for_classifiers, read_stylized
    from jobs.readers import stable_id
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
    from udfs.grading import GRADE_DDL, make_grader

    frame = hypotheses[["variant", "image_id", "style", "hypothesis"]].reset_index(drop=True)
    frame = frame.assign(row=range(len(frame)))
    parts = spread_tasks(default_parallelism(spark), len(frame), batch_size)
    graded = (spark.createDataFrame(frame[["row", "style", "hypothesis"]])
              .repartition(parts).mapInPandas(make_grader(classifier_path, batch_size, device), GRADE_DDL)
              .toPandas().set_index("row")["probability"])
    return graded.reindex(frame["row"]).reset_index(drop=True)


# ---------------------------------------------------------------------------------------------- the experiment
def _command() -> str:
    argv = sys.argv if sys.argv and sys.argv[0].endswith("erg") else ["erg", *sys.argv[1:]]
    return " ".join(shlex.quote(a) for a in argv)


def _log_child_metrics(run_id: str, metrics: dict[str, float]) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    for key, value in metrics.items():
        if value is not None and not (isinstance(value, float) and math.isnan(value)):
            client.log_metric(run_id, key, float(value))


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
    from jobs.scene_features import scene_features

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


def measurable_styles(cfg: ErgConfig, styles: list[str], counts: dict[str, float],
                      available: dict[tuple[str, str], int], test_counts: dict[str, int], generator_version: str
                      ) -> tuple[list[str], dict[str, str], dict[str, int]]:
    """Step 2 (no Spark): the styles that can be measured, the others with the reason, and each measured style's
    augmented pool (its pairs with features, at most ``max_augmented_pairs``). A RuntimeError when none can be."""
    e = cfg.experiment
    sources = ", ".join(cfg.train.visual_context.sources) if cfg.train.features == "visual_context" else ""
    not_measured: dict[str, str] = {}
    for style in styles:
        n_train, n_test = available.get((style, "original"), 0), test_counts.get(style, 0)
        if n_train == 0 or n_test < e.min_test_images:
            total_train = int(counts.get(f"pairs.{style}.original.with_features", 0)
                              + counts.get(f"pairs.{style}.original.without_features", 0))
            total_test = int(counts.get(f"test.{style}.with_features", 0)
                             + counts.get(f"test.{style}.without_features", 0))
            not_measured[style] = (
                f"scene features ({cfg.train.features}: {sources}) exist for {n_train} of {total_train} train pairs "
                f"and {n_test} of {total_test} test images (at least 1 and {e.min_test_images} needed)")
    measured = [s for s in styles if s not in not_measured]
    if not measured:
        raise RuntimeError(f"no style can be measured: {not_measured}; see train.features and "
                           "train.visual_context.sources")
    pool = {s: min(available.get((s, "augmented"), 0), e.max_augmented_pairs or 10 ** 12) for s in measured}
    for s in [s for s in measured if not pool[s]]:
        not_measured[s] = (f"no passing augmented pair of generator {generator_version} with scene "
                           "features: run `erg generate`, or lower experiment.min_test_images")
    measured = [s for s in measured if pool[s]]
    if not measured:
        raise RuntimeError(f"no style has augmented pairs to compare: {not_measured}")
    return measured, not_measured, {s: pool[s] for s in measured}


def plan_experiment(cfg: ErgConfig, measured: list[str], types: list[str]
                    ) -> tuple[list[Cell], tuple | None, tuple | None]:
    """Step 3 (no Spark): the cells, with Table 5's (captioner, styles, retrieval types) and Fig. 5's (captioner,
    styles, shares) where enabled and their style set is measured."""
    e = cfg.experiment
    t5 = f5 = None
    if e.table5.enabled:
        t5_styles = _style_set_styles(cfg, e.table5.style_set, measured)
        if t5_styles:
            t5 = (e.table5.captioner, t5_styles, types)
    if e.fig5.enabled:
        f5_styles = _style_set_styles(cfg, e.fig5.style_set, measured)
        if f5_styles:
            f5 = (e.fig5.captioner, f5_styles, e.fig5.sizes)
    return plan_cells(measured, list(e.captioners), t5, f5, list(e.seeds), dict(e.seeds_per_captioner)), t5, f5


def measure_leakage(spark: SparkSession, cfg: ErgConfig, data: ExperimentData, pool: dict[str, int],
                    tables: bool = True) -> dict[str, int]:
    """Step 4: leakage on exactly what the cells train and test on, plus the tables' own leakage counts (``tables``)."""
    from jobs.leakage import leakage_counts
    from jobs.scene_features import feature_leaks

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
    planned = []
    for cell in cells:
        cell_cfg = with_captioner(conf_of(cell) if conf_of else cfg, cell.captioner, cell.style, cell.seed)
        frame, n_orig, n_aug = cell_pairs(data.pairs_ok, cell, pool, data.available, cfg.experiment.fig5.order)
        conf = worker_config(cell_cfg, [], Path("."), data.train_features.regions, "n_regions")
        fingerprint = cell_fingerprint(cell, conf, data_version(frame))
        planned.append((cell, cell_cfg, frame, n_orig, n_aug, fingerprint,
                        model_dir(cfg, "experiment_cell", fingerprint)))
    recorded = recorded_cells(cfg, [p[5] for p in planned]) if cfg.experiment.resume else {}
    trained: dict[str, dict[str, Any]] = {}
    configs, todo = [], []
    for cell, cell_cfg, frame, n_orig, n_aug, fingerprint, cell_dir in planned:
        info = {"cell": cell, "train_pairs": n_orig + n_aug, "train_pairs_original": n_orig,
                "train_pairs_augmented": n_aug, "epochs": cell_cfg.train.epochs, "fingerprint": fingerprint}
        run = recorded.get(fingerprint)
        reused = _reuse(run, cell_dir) if run is not None else None
        if run is not None and reused is None:
            counts["cells.reuse_failed"] += 1
        if reused is not None:
            model, summary = reused
            counts["cells.reused"] += 1
            logger.info("experiment cell %s: reused from run %s", cell.label, run.info.run_id)
            trained[cell.label] = {**info, "run_id": run.info.run_id, "path": str(model), "reused": True,
                                   "train_seconds": summary["seconds"], "loss_last": summary["loss_last"]}
            continue
        if cfg.experiment.resume and _summary_of(cell_dir / "model") is not None:
            counts["cells.recorded_from_disk"] += 1
            logger.info("experiment cell %s: trained by a launch that stopped before recording it", cell.label)
            todo.append((cell, cell_cfg, info, cell_dir))
            continue
        shutil.rmtree(cell_dir / "model", ignore_errors=True)
        config, _, _ = snapshot_config(spark, cell_cfg, frame, cell_dir, data.train_features.regions)
        configs.append({**config, "label": cell.label})
        todo.append((cell, cell_cfg, info, cell_dir))
        logger.info("experiment cell %s: %d original + %d augmented pairs", cell.label, n_orig, n_aug)
    lap("snapshots")
    if configs:
        run_distributed_many(cfg, configs)
        counts["cells.trained"] += len(configs)
    lap("training")
    for cell, cell_cfg, info, cell_dir in todo:
        trained[cell.label] = record_cell(cell, cell_cfg, info, cell_dir, data.train_features.kind, parent_id)
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


def score_cells(spark: SparkSession, cfg: ErgConfig, trained: dict[str, dict[str, Any]], data: ExperimentData,
                measured: list[str], classifiers_path: str, lm_path: str, grader: dict[str, Any] | None,
                metric_prefix: str = "") -> tuple[list[dict[str, Any]], list[dict[str, Any]], pd.DataFrame]:
    """Step 6: per style, every cell's captioner captions the test images on the executors; the captions are
    scored (BLEU-1/3, METEOR, CIDEr, cls., cls. by the independent grader, ppl.). Returns (rows, samples,
    hypotheses); each child run logs its scores, named with ``metric_prefix`` (``val.`` for the tuning's)."""
    from jobs.evaluate import nonfinite_perplexities, style_scores
    from models.caption_metrics import CaptionScorer
    from udfs.captioning import HYPOTHESIS_DDL, make_captioner_evaluator

    e, ev = cfg.experiment, cfg.evaluate
    rows: list[dict[str, Any]] = []
    samples: list[dict[str, Any]] = []
    captions: list[pd.DataFrame] = []
    with CaptionScorer() as scorer:
        for style in measured:
            mine = {name: info for name, info in trained.items() if info["cell"].style == style}
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
            captions.append(hypotheses)
            for name, group in hypotheses.groupby("variant", sort=False):
                info = mine[name]
                cell = info["cell"]
                scores = style_scores(group, {i: references[i] for i in group["image_id"]}, scorer,
                                      e.ppl_statistic)
                independent = (float((group["independent_probability"] > 0.5).mean())
                               if "independent_probability" in group else float("nan"))
                row = {"style": style, "captioner": cell.captioner, "variant": cell.variant,
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
                rows.append(row)
                _log_child_metrics(info["run_id"], {f"{metric_prefix}{k}": row[k] for k in (
                    "bleu1", "bleu3", "meteor", "cider", "cls", "cls_independent", "ppl", "ppl_nonfinite",
                    "test_images")})
                for r in group.head(e.samples_to_log if cell.seed == e.seeds[0] else 0).itertuples():
                    samples.append({"style": style, "captioner": cell.captioner, "variant": cell.variant,
                                    "seed": cell.seed, "image_id": r.image_id, "hypothesis": r.hypothesis,
                                    "references": references[r.image_id][:2]})
    order = {label: i for i, label in enumerate(trained)}
    rows.sort(key=lambda r: order[f"{r['style']}/{r['captioner']}/{r['variant']}#seed={r['seed']}"])
    return rows, samples, pd.concat(captions, ignore_index=True) if captions else pd.DataFrame()


def measure_eps(spark: SparkSession, cfg_eps: ErgConfig, run: dict[str, Any], f5: tuple, parent_id: str, lap, classifiers_path: str, lm_path: str, grader: dict[str, Any] | None,
                counts: dict[str, float] | None = None) -> dict[str, Any]:
    """Fig. 5's eps curve, one eps: Fig. 5's captioner trained on each style's original pairs plus the passing
    augmented pairs of the ERG run at that eps (``cfg_eps``'s schema, :func:`jobs.eps_sweep.run_erg_at`; capped as
    the main cells), scored as every cell (the main run's evaluation classifiers, LM and independent grader).
    Returns ``{"rows", "samples", "hypotheses", "leakage", "not_measured"}``."""
    captioner, styles, _ = f5
    eps, version = run["eps"], run["generator_version"]
    data = load_data(spark, cfg_eps, styles, version)
    lap("features")
    try:
        measured, not_measured, pool = measurable_styles(cfg_eps, styles, data.counts, data.available,
                                                         data.test_counts, version)
    except RuntimeError as exc:
        data.unpersist()
        return {"rows": [], "samples": [], "hypotheses": pd.DataFrame(), "leakage": {},
                "not_measured": {s: str(exc) for s in styles}}
    cells = [Cell(style, captioner, f"augmented@eps={eps:g}", None, 1.0, eps, cfg_eps.experiment.seeds[0])
             for style in measured]
    leakage = measure_leakage(spark, cfg_eps, data, pool)
    lap("leakage")
    trained = train_cells(spark, cfg_eps, cells, data, pool, parent_id, lap, counts)
    rows, samples, hypotheses = score_cells(spark, cfg_eps, trained, data, measured, classifiers_path, lm_path,
                                            grader)
    data.unpersist()
    return {"rows": rows, "samples": samples, "hypotheses": hypotheses, "leakage": leakage,
            "not_measured": not_measured}


def measure_ablations(spark: SparkSession, cfg: ErgConfig, data: ExperimentData, measured: list[str],
                      pool: dict[str, int], generator: dict[str, Any], classifiers: dict[str, Any], parent_id: str,
                      lap, counts: dict[str, float], grader: dict[str, Any] | None) -> dict[str, Any]:
    """The ablations (:mod:`jobs.ablation`): per kind, its passing pairs with scene features, the ablation's
    captioner trained on each style's original pairs plus as many of them as ERG's pool holds, once per seed, and
    scored as every cell. Returns ``{"rows", "samples", "hypotheses", "leakage", "pairs"}``."""
    from jobs.scene_features import scene_features

    a = cfg.experiment.ablations
    styles = [s for s in (a.styles or measured) if s in measured]
    empty = {"rows": [], "samples": [], "hypotheses": pd.DataFrame(), "leakage": {}, "pairs": {}}
    if not a.kinds or not styles:
        return empty
    erg_counts = erg_pass_counts(spark, cfg, generator["version"], styles)
    per_style = candidates_per_style(erg_counts, {s: pool[s] for s in styles}, a.candidate_margin)
    originals = data.pairs_ok.where((F.col("origin") == "original") & F.col("style").isin(styles))
    out = dict(empty, hypotheses=[])
    for kind in a.kinds:
        rows, made = make_ablation_rows(spark, cfg, kind, generator, classifiers, per_style)
        counts.update(made)
        lap(f"ablation_{kind}.generate")
        built = scene_features(spark, cfg, ablation_pairs(rows, kind))
        ranked = rank_augmented(built.frame).where(F.col("features").isNotNull())
        pairs = originals.unionByName(ranked).cache()
        available = {(s, "original"): data.available.get((s, "original"), 0) for s in styles}
        for r in ranked.groupBy("style").count().collect():
            available[(r["style"], "augmented")] = r["count"]
        kind_pool = {s: min(pool[s], available.get((s, "augmented"), 0)) for s in styles}
        sub = ExperimentData(data.train_features, pairs, data.tests, counts, available, data.test_counts)
        out["leakage"].update({f"ablation_{kind}.{k}": v for k, v in measure_leakage(spark, cfg, sub, kind_pool).items()
                               if not k.startswith(("retrievals_", "augmented_", "training_set_", "factual_",
                                                    "queries_"))})
        seeds = cfg.experiment.seeds[: cfg.experiment.seeds_per_captioner.get(a.captioner, len(cfg.experiment.seeds))]
        cells = [Cell(s, a.captioner, f"{ABLATION_PREFIX}{kind}", None, 1.0, None, seed)
                 for s in styles if kind_pool[s] for seed in seeds]
        trained = train_cells(spark, cfg, cells, sub, kind_pool, parent_id,
                              lambda stage, kind=kind: lap(f"ablation_{kind}.{stage}"), counts)
        got_rows, got_samples, got_hyp = score_cells(spark, cfg, trained, sub, [s for s in styles if kind_pool[s]],
                                                     classifiers["path"], generator["lm_path"], grader)
        pairs.unpersist()
        out["rows"] += got_rows
        out["samples"] += got_samples
        out["hypotheses"].append(got_hyp)
        out["pairs"][kind] = {s: {**v, "trained": kind_pool[s]} for s, v in summary(kind, counts, pool).items()
                              if s in styles}
        lap(f"ablation_{kind}.decode_and_score")
    out["hypotheses"] = pd.concat(out["hypotheses"], ignore_index=True) if out["hypotheses"] else pd.DataFrame()
    return out


def ablation_deltas(seed_rows: list[dict[str, Any]], captioner: str, kinds: list[str]) -> list[dict[str, Any]]:
    """ERG minus each ablation (the augmented cell against the ablation's, same style, captioner and seed), with
    the 95% t-interval over the seeds of every delta."""
    from models.experiment_report import seed_deltas

    out = []
    for kind in kinds:
        variant = f"{ABLATION_PREFIX}{kind}"
        chosen = [r for r in seed_rows if r["captioner"] == captioner and r["variant"] in ("augmented", variant)]
        out += [{**d, "ablation": kind} for d in seed_deltas(chosen, baseline=variant) if d["variant"] == "augmented"]
    return out


def describe_setup(cfg: ErgConfig, generator: dict[str, Any], classifiers: dict[str, Any],
                   grader: dict[str, Any] | None, versioned: bool) -> dict[str, str]:
    """The report's sentences on where the pairs, test references, training recipe, cls. and ppl. come from."""
    e, t = cfg.experiment, cfg.train
    return {
        "augmented_source": (f"passing rows of generator {generator['version']} only" if versioned else
                             "passing rows of every generator version")
        + (f", at most {e.max_augmented_pairs} per style (lowest hash of the pair id)"
           if e.max_augmented_pairs else ", all of them"),
        "test_source": f"test split, {'all' if not e.max_test_images else f'at most {e.max_test_images}'} "
                       "images per style, references = the image's stylized captions of that style",
        "training": (f"per style and captioner, {t.optimizer} lr {t.lr}, batch {t.batch_size}, {t.epochs} epochs"
                     + "".join(f" ({n} for {s})" for s, n in e.epochs.items()) + ", "
                     f"scheduled sampling {t.scheduled_sampling.increase} every {t.scheduled_sampling.every_epochs} "
                     f"epochs (max {t.scheduled_sampling.max}), {t.backend} x {t.num_processes}"
                     + (f"; the words an augmented caption adds to its factual source weigh {t.inserted_word_weight:g} "
                        "in the loss (original pairs 1)" if t.inserted_word_weight != 1 else "")),
        "cls_source": (f"evaluation classifiers {classifiers['version']} ({classifiers.get('kind')}, also "
                       "generate's filter 1); cls. (indep.): " + (
                           f"{grader['kind']} per style trained on half B of the train split's images"
                           if grader else "not fitted")),
        "ppl_source": f"{e.ppl_statistic} trigram perplexity under the style's LM of generator "
                      f"{generator['version']}",
    }


def write_report(result: dict[str, Any], folder: Path, hypotheses: pd.DataFrame | None = None,
                 tuning_hypotheses: pd.DataFrame | None = None) -> Path:
    """Step 7: report.md, experiment.json, the plots and ``hypotheses.parquet`` (every cell's caption of every test
    image, with its scores; ``tuning_hypotheses.parquet``: every tuning cell's caption of every val image), logged as
    the active run's ``report`` artifacts and kept under ``folder/report``."""
    import mlflow

    from models.experiment_report import plot_fig5, plot_table2, render_report

    report_dir = folder / "report"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        (out / "report.md").write_text(render_report(result))
        (out / "experiment.json").write_text(json.dumps(result, indent=2, default=str))
        if result["rows"]:
            plot_table2(result["rows"], out / "table2.png")
        if result.get("fig5", {}).get("points"):
            plot_fig5(result["fig5"]["points"], out / "fig5_size.png")
        if result.get("fig5", {}).get("eps_points"):
            plot_fig5(result["fig5"]["eps_points"], out / "fig5_eps.png", x="eps")
        if hypotheses is not None and len(hypotheses):
            hypotheses.to_parquet(out / "hypotheses.parquet", index=False)
        if tuning_hypotheses is not None and len(tuning_hypotheses):
            tuning_hypotheses.to_parquet(out / "tuning_hypotheses.parquet", index=False)
        mlflow.log_artifacts(str(out), "report")
        report_dir.mkdir(parents=True, exist_ok=True)
        for path in out.iterdir():
            (report_dir / path.name).write_bytes(path.read_bytes())
    return report_dir


def _tuning_only(cfg: ErgConfig, command: str, parent_id: str, tuning: dict[str, Any], folder: Path,
                 started: float, stages: dict[str, float]) -> dict[str, Any]:
    """``experiment.tuning.only``: the result, report and counts of the sweep alone (no Table 2 cell is trained)."""
    result: dict[str, Any] = {
        "command": command, "run_id": parent_id, "tuning_only": True, "tuning": tuning["result"], "rows": [],
        "seed_rows": [], "styles": tuning["styles"], "captioners": [], "not_measured": {},
        "leakage": {f"tuning.{k}": v for k, v in tuning["result"]["leakage"].items()},
        "seconds": time.time() - started, "stage_seconds": stages,
        "next": "erg experiment with the same conf (the tuning cells are reused by their fingerprints; Table 2 "
                "trains with the chosen values)"}
    result["report_dir"] = str(write_report(result, folder, None, tuning["hypotheses"]))
    log_counts({"seconds": result["seconds"], **{f"stage_seconds.{k}": v for k, v in stages.items()}})
    return result


def run_experiment(spark: SparkSession, cfg: ErgConfig, *, command: str | None = None) -> dict[str, Any]:
    """Run the experiment (module docstring); returns the result (rows, tables, leakage, not_measured, run ids)."""
    import mlflow

    from jobs.eps_sweep import run_erg_at, sweep_values
    from jobs.vocabulary import EVALUATION_CLASSIFIERS
    from jobs.train import check_hparams
    from models.experiment_report import (aggregate_seeds, caption_modes, eps_curve, render_ablations, render_fig5,
                                          render_fig5_eps, render_table5, seed_deltas, size_curve)

    e = cfg.experiment
    command = command or _command()
    started = time.time()
    erg_result = None
    if e.run_erg == "always" or (e.run_erg == "auto" and get_current(cfg, "generator") is None):
        from jobs.pipeline import run_pipeline

        erg_result = run_pipeline(spark, cfg)
    generator = require_current(cfg, "generator", "run")
    classifiers = require_current(cfg, EVALUATION_CLASSIFIERS, "extract")
    for captioner in e.captioners:
        check_hparams(with_captioner(cfg, captioner))
    styles = list(e.styles or cfg.styles)
    version = generator["version"] if e.generator_version == "current" else None

    experiment_id = configure_mlflow(cfg)
    with mlflow.start_run(run_name="experiment", experiment_id=experiment_id,
                          tags={"erg.job": "experiment", "erg.conf": cfg.name, "erg.command": command[:5000],
                                "erg.generator_version": generator["version"]}) as parent:
        parent_id = parent.info.run_id
        folder = model_dir(cfg, "experiment", parent_id)
        folder.mkdir(parents=True, exist_ok=True)

        stages: dict[str, float] = {}
        clock = [time.time()]

        def lap(stage: str) -> None:
            now = time.time()
            took, clock[0] = now - clock[0], now
            stages[stage] = stages.get(stage, 0.0) + took  # a stage run more than once adds up
            logger.info("experiment: %s took %.1fs", stage, took)

        tuning = None
        if e.tuning.enabled and e.tuning.knobs:  # Step 0: knobs chosen on the val split, before any test scoring
            from jobs.tuning import run_tuning

            tuning = run_tuning(spark, cfg, styles, version, generator, classifiers, parent_id, folder, lap)
            cfg, e = tuning["cfg"], tuning["cfg"].experiment
            for captioner in e.captioners:
                check_hparams(with_captioner(cfg, captioner))
            if e.tuning.only:
                return _tuning_only(cfg, command, parent_id, tuning, folder, started, stages)
        mlflow.log_params({"styles": json.dumps(styles), "captioners": json.dumps(e.captioners),
                           "features": cfg.train.features, "generator_version": e.generator_version,
                           "max_augmented_pairs": str(e.max_augmented_pairs), "epochs": cfg.train.epochs,
                           "epochs_by_style_set": json.dumps(e.epochs),
                           "inserted_word_weight": cfg.train.inserted_word_weight,
                           "max_test_images": str(e.max_test_images)})
        data = load_data(spark, cfg, styles, version)
        measured, not_measured, pool = measurable_styles(cfg, styles, data.counts, data.available, data.test_counts,
                                                         generator["version"])
        types = sorted(r.retrieval_type for r in data.pairs_ok.where(F.col("origin") == "augmented")
                       .select("retrieval_type").distinct().collect())
        cells, t5, f5 = plan_experiment(cfg, measured, types)
        logger.info("experiment: %d cells over styles %s", len(cells), measured)
        lap("features")
        leakage = measure_leakage(spark, cfg, data, pool)
        lap("leakage")
        if tuning is not None and tuning["styles"] == measured:
            grader = tuning["grader"]  # fitted on the same styles, in the same order: the same classifiers
        else:
            grader = fit_independent_classifier(spark, cfg, measured, folder / "independent_classifier")
        lap("independent_classifier")
        cell_counts: dict[str, float] = {}
        trained = train_cells(spark, cfg, cells, data, pool, parent_id, lap, cell_counts)
        rows, samples, hypotheses = score_cells(spark, cfg, trained, data, measured, classifiers["path"],
                                                generator["lm_path"], grader)
        ablations = measure_ablations(spark, cfg, data, measured, pool, generator, classifiers, parent_id,
                                      lap, cell_counts, grader)
        rows += ablations["rows"]
        samples += ablations["samples"]
        hypotheses = pd.concat([hypotheses, ablations["hypotheses"]], ignore_index=True)
        leakage.update(ablations["leakage"])
        if tuning is not None:
            leakage.update({f"tuning.{k}": v for k, v in tuning["result"]["leakage"].items()})
        data.unpersist()
        lap("decode_and_score")
        eps_measured = []
        if f5 is not None:  # Fig. 5's eps curve: ERG at each other eps, in a schema of its own, nested here
            for eps in sweep_values(cfg):
                tag = f"eps{eps:g}"
                cfg_eps, run = run_erg_at(spark, cfg, eps)
                lap(f"{tag}.erg")
                got = measure_eps(spark, cfg_eps, run, f5, parent_id,
                                  lambda stage, tag=tag: lap(f"{tag}.{stage}"), classifiers["path"],
                                  generator["lm_path"], grader, cell_counts)
                rows += got["rows"]
                samples += got["samples"]
                hypotheses = pd.concat([hypotheses, got["hypotheses"]], ignore_index=True)
                leakage.update({f"{tag}.{k}": v for k, v in got["leakage"].items()})
                eps_measured.append({**run, "not_measured": got["not_measured"]})
                lap(f"{tag}.decode_and_score")

        seed_rows, rows = rows, aggregate_seeds(rows)
        deltas = seed_deltas(seed_rows)
        intervals = {(d["style"], d["captioner"], d["variant"]): d["ci95"] for d in deltas}
        for row in rows:
            if (row["style"], row["captioner"], row["variant"]) in intervals:
                row["ci95"] = intervals[(row["style"], row["captioner"], row["variant"])]
        result: dict[str, Any] = {
            "command": command, "run_id": parent_id, "styles": measured, "captioners": list(e.captioners),
            "seeds": list(e.seeds), "interval": "95% t-interval over the seeds of the paired (same seed) deltas",
            "seed_rows": seed_rows, "deltas": deltas, "cell_counts": cell_counts,
            "features": data.train_features.description, "rows": rows, "leakage": leakage,
            "not_measured": not_measured, **describe_setup(cfg, generator, classifiers, grader, version is not None),
            "generator_version": generator["version"], "counts": data.counts, "samples": samples,
            "modes": caption_modes(hypotheses) if len(hypotheses) else [],
            "seconds": time.time() - started, "stage_seconds": stages,
            "erg_run": erg_result.get("parent_run_id") if erg_result else None,
        }
        if tuning is not None:
            result["tuning"] = tuning["result"]
        if ablations["pairs"]:
            a = e.ablations
            deltas = ablation_deltas(seed_rows, a.captioner, list(a.kinds))
            result["ablations"] = {"kinds": list(a.kinds), "captioner": a.captioner, "pairs": ablations["pairs"],
                                   "deltas": deltas, "markdown": render_ablations(ablations["pairs"], deltas)}
        if t5 is not None:
            result["table5"] = {"captioner": t5[0], "styles": t5[1], "types": t5[2],
                                "markdown": render_table5(rows, t5[0], t5[1])}
        if f5 is not None:
            points = size_curve(rows, f5[0], f5[1])
            result["fig5"] = {"captioner": f5[0], "styles": f5[1], "points": points, "markdown": render_fig5(points)}
            if eps_measured:
                eps_points = eps_curve(rows, f5[0], f5[1], cfg.extract.eps)
                result["fig5"].update({"eps_points": eps_points, "eps_markdown": render_fig5_eps(eps_points),
                                       "eps_runs": eps_measured})
        result["report_dir"] = str(write_report(result, folder, hypotheses,
                                                tuning["hypotheses"] if tuning is not None else None))
        log_counts({**{k: v for k, v in data.counts.items() if isinstance(v, (int, float))},
                    **{f"leakage.{k}": v for k, v in leakage.items()}, "cells": len(cells), **cell_counts,
                    **{f"stage_seconds.{k}": v for k, v in stages.items()},
                    "seconds": result["seconds"]})
        for row in rows:
            prefix = (f"{row['style']}.{row['captioner']}.{row['variant']}".replace(":", "_").replace("@", "_at_")
                      .replace("=", ""))
            log_counts({f"{prefix}.{m}": row[m] for m in ("bleu1", "bleu3", "meteor", "cider", "cls", "ppl")
                        if row[m] is not None and not math.isnan(row[m])})
        return result
