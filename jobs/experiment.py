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
   (:mod:`jobs.cells`).
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
import json
import logging
import math
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import jobs
from jobs.ablation import (ABLATION_PREFIX, ablation_pairs, candidates_per_style, erg_pass_counts, make_ablation_rows,
                           summary)
from jobs.cells import (Cell, ExperimentData, fit_independent_classifier, load_data, measure_leakage, rank_augmented,
                        score_cells, train_cells, with_captioner)
from jobs.eps_sweep import run_erg_at, sweep_values
from jobs.platform.config import ErgConfig
from jobs.platform.model_store import get_current, model_dir, require_current
from jobs.platform.runner import JobContext, Step, parent_run, run_steps
from jobs.platform.tracking import log_counts
from jobs.scene_features import scene_features
from jobs.train import check_hparams
from jobs.tuning import run_tuning
from jobs.vocabulary import EVALUATION_CLASSIFIERS, GENERATOR
from models.experiment_report import (aggregate_seeds, caption_modes, eps_curve, plot_fig5, plot_table2,
                                      render_ablations, render_fig5, render_fig5_eps, render_report, render_table5,
                                      seed_deltas, size_curve)

logger = logging.getLogger(__name__)


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



def _style_set_styles(cfg: ErgConfig, name: str | None, measured: list[str]) -> list[str]:
    name = name or next(iter(cfg.style_sets))
    return [s for s in cfg.style_sets[name] if s in measured]


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


# ---------------------------------------------------------------------------------------------- the experiment
def _command() -> str:
    argv = sys.argv if sys.argv and sys.argv[0].endswith("erg") else ["erg", *sys.argv[1:]]
    return " ".join(shlex.quote(a) for a in argv)


class StageClock:
    """The experiment's stage clock: :meth:`lap` adds the seconds since the last lap to ``stages[stage]`` (a stage
    run more than once adds up)."""

    def __init__(self) -> None:
        self.stages: dict[str, float] = {}
        self.last = time.time()

    def lap(self, stage: str) -> None:
        now = time.time()
        took, self.last = now - self.last, now
        self.stages[stage] = self.stages.get(stage, 0.0) + took
        logger.info("experiment: %s took %.1fs", stage, took)


@dataclass(frozen=True)
class ExperimentPlan:
    """Steps 2 and 3: the measured styles, the others with the reason, each measured style's augmented pool, the
    cells, and Table 5's and Fig. 5's parts (None where off or not measured)."""

    measured: list[str]
    not_measured: dict[str, str]
    pool: dict[str, int]
    cells: list[Cell]
    table5: tuple | None
    fig5: tuple | None


@dataclass
class Scored:
    """The scored cells so far: one row per cell and seed, the samples, and every cell's captions."""

    rows: list[dict[str, Any]]
    samples: list[dict[str, Any]]
    hypotheses: pd.DataFrame

    def add(self, got: dict[str, Any]) -> None:
        """Add the rows, samples and captions of more cells (the ablations', an eps's)."""
        self.rows += got["rows"]
        self.samples += got["samples"]
        self.hypotheses = pd.concat([self.hypotheses, got["hypotheses"]], ignore_index=True)


def measure_eps(spark: SparkSession, cfg_eps: ErgConfig, run: dict[str, Any], f5: tuple, parent_id: str, lap,
                classifiers_path: str, lm_path: str, grader: dict[str, Any] | None,
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


def ablation_data(ctx: JobContext, kind: str, styles: list[str], per_style: dict[str, int], originals: DataFrame
                  ) -> tuple[ExperimentData, dict[str, int]]:
    """One ablation kind's pairs (cached): its passing pairs with scene features beside the styles' original pairs,
    and each style's pool of them (at most ERG's)."""
    spark, cfg, data, pool = ctx.spark, ctx.cfg, ctx["data"], ctx["plan"].pool
    rows, made = make_ablation_rows(spark, cfg, kind, ctx["generator"], ctx["classifiers"], per_style)
    ctx.counts.update(made)
    ctx["clock"].lap(f"ablation_{kind}.generate")
    built = scene_features(spark, cfg, ablation_pairs(rows, kind))
    ranked = rank_augmented(built.frame).where(F.col("features").isNotNull())
    pairs = originals.unionByName(ranked).cache()
    available = {(s, "original"): data.available.get((s, "original"), 0) for s in styles}
    for r in ranked.groupBy("style").count().collect():
        available[(r["style"], "augmented")] = r["count"]
    kind_pool = {s: min(pool[s], available.get((s, "augmented"), 0)) for s in styles}
    return ExperimentData(data.train_features, pairs, data.tests, ctx.counts, available, data.test_counts), kind_pool


def measure_ablation(ctx: JobContext, kind: str, styles: list[str], per_style: dict[str, int], originals: DataFrame,
                     out: dict[str, Any]) -> None:
    """One ablation kind (:func:`measure_ablations`), added to ``out``: its leakage, rows, samples, captions and
    pair counts."""
    cfg, lap, a = ctx.cfg, ctx["clock"].lap, ctx.cfg.experiment.ablations
    sub, kind_pool = ablation_data(ctx, kind, styles, per_style, originals)
    out["leakage"].update({f"ablation_{kind}.{k}": v for k, v in measure_leakage(ctx.spark, cfg, sub, kind_pool).items()
                           if not k.startswith(("retrievals_", "augmented_", "training_set_", "factual_",
                                                "queries_"))})
    seeds = cfg.experiment.seeds[: cfg.experiment.seeds_per_captioner.get(a.captioner, len(cfg.experiment.seeds))]
    cells = [Cell(s, a.captioner, f"{ABLATION_PREFIX}{kind}", None, 1.0, None, seed)
             for s in styles if kind_pool[s] for seed in seeds]
    trained = train_cells(ctx.spark, cfg, cells, sub, kind_pool, ctx.run_id,
                          lambda stage: lap(f"ablation_{kind}.{stage}"), ctx.counts)
    got_rows, got_samples, got_hyp = score_cells(ctx.spark, cfg, trained, sub, [s for s in styles if kind_pool[s]],
                                                 ctx["classifiers"]["path"], ctx["generator"]["lm_path"], ctx["grader"])
    sub.pairs.unpersist()
    out["rows"] += got_rows
    out["samples"] += got_samples
    out["hypotheses"].append(got_hyp)
    out["pairs"][kind] = {s: {**v, "trained": kind_pool[s]}
                          for s, v in summary(kind, ctx.counts, ctx["plan"].pool).items() if s in styles}
    lap(f"ablation_{kind}.decode_and_score")


def measure_ablations(ctx: JobContext) -> dict[str, Any]:
    """The ablations (:mod:`jobs.ablation`): per kind, its passing pairs with scene features, the ablation's
    captioner trained on each style's original pairs plus as many of them as ERG's pool holds, once per seed, and
    scored as every cell. Returns ``{"rows", "samples", "hypotheses", "leakage", "pairs"}``."""
    a, plan, data = ctx.cfg.experiment.ablations, ctx["plan"], ctx["data"]
    styles = [s for s in (a.styles or plan.measured) if s in plan.measured]
    out: dict[str, Any] = {"rows": [], "samples": [], "hypotheses": [], "leakage": {}, "pairs": {}}
    if a.kinds and styles:
        erg_counts = erg_pass_counts(ctx.spark, ctx.cfg, ctx["generator"]["version"], styles)
        per_style = candidates_per_style(erg_counts, {s: plan.pool[s] for s in styles}, a.candidate_margin)
        originals = data.pairs_ok.where((F.col("origin") == "original") & F.col("style").isin(styles))
        for kind in a.kinds:
            measure_ablation(ctx, kind, styles, per_style, originals, out)
    out["hypotheses"] = pd.concat(out["hypotheses"], ignore_index=True) if out["hypotheses"] else pd.DataFrame()
    return out


def ablation_deltas(seed_rows: list[dict[str, Any]], captioner: str, kinds: list[str]) -> list[dict[str, Any]]:
    """ERG minus each ablation (the augmented cell against the ablation's, same style, captioner and seed), with
    the 95% t-interval over the seeds of every delta."""
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


def check_captioners(cfg: ErgConfig) -> None:
    """Every captioner's recipe is checked before anything trains."""
    for captioner in cfg.experiment.captioners:
        check_hparams(with_captioner(cfg, captioner))


def needs_erg(cfg: ErgConfig) -> bool:
    """Step 1 runs ERG (``erg run``): ``experiment.run_erg`` always, or auto and no generator trained yet."""
    e = cfg.experiment
    return e.run_erg == "always" or (e.run_erg == "auto" and get_current(cfg, GENERATOR) is None)


# ------------------------------------------------------------------------------------------ the experiment's steps
def tuning_step(ctx: JobContext) -> dict[str, Any]:
    """Step 0: knobs chosen on the val split, before any test scoring; the steps after it run with the chosen
    values (``ctx.cfg``)."""
    tuning = run_tuning(ctx.spark, ctx.cfg, ctx["styles"], ctx["version"], ctx["generator"], ctx["classifiers"],
                        ctx.run_id, ctx["folder"], ctx["clock"].lap)
    ctx.cfg = tuning["cfg"]
    check_captioners(ctx.cfg)
    return tuning


def tuning_enabled(ctx: JobContext) -> bool:
    return bool(ctx.cfg.experiment.tuning.enabled and ctx.cfg.experiment.tuning.knobs)


def params_step(ctx: JobContext) -> None:
    import mlflow

    cfg, e = ctx.cfg, ctx.cfg.experiment
    mlflow.log_params({"styles": json.dumps(ctx["styles"]), "captioners": json.dumps(e.captioners),
                       "features": cfg.train.features, "generator_version": e.generator_version,
                       "max_augmented_pairs": str(e.max_augmented_pairs), "epochs": cfg.train.epochs,
                       "epochs_by_style_set": json.dumps(e.epochs),
                       "inserted_word_weight": cfg.train.inserted_word_weight,
                       "max_test_images": str(e.max_test_images)})


def data_step(ctx: JobContext) -> ExperimentData:
    return load_data(ctx.spark, ctx.cfg, ctx["styles"], ctx["version"])


def plan_step(ctx: JobContext) -> ExperimentPlan:
    data = ctx["data"]
    measured, not_measured, pool = measurable_styles(ctx.cfg, ctx["styles"], data.counts, data.available,
                                                     data.test_counts, ctx["generator"]["version"])
    types = sorted(r.retrieval_type for r in data.pairs_ok.where(F.col("origin") == "augmented")
                   .select("retrieval_type").distinct().collect())
    cells, t5, f5 = plan_experiment(ctx.cfg, measured, types)
    logger.info("experiment: %d cells over styles %s", len(cells), measured)
    ctx["clock"].lap("features")
    return ExperimentPlan(measured, not_measured, pool, cells, t5, f5)


def leakage_step(ctx: JobContext) -> dict[str, int]:
    leakage = measure_leakage(ctx.spark, ctx.cfg, ctx["data"], ctx["plan"].pool)
    ctx["clock"].lap("leakage")
    return leakage


def grader_step(ctx: JobContext) -> dict[str, Any] | None:
    tuning, measured = ctx["tuning"], ctx["plan"].measured
    if tuning is not None and tuning["styles"] == measured:
        grader = tuning["grader"]  # fitted on the same styles, in the same order: the same classifiers
    else:
        grader = fit_independent_classifier(ctx.spark, ctx.cfg, measured, ctx["folder"] / "independent_classifier")
    ctx["clock"].lap("independent_classifier")
    return grader


def scores_step(ctx: JobContext) -> Scored:
    """Steps 5 and 6 for the planned cells; ``ctx.counts`` holds the cell counts (:func:`jobs.cells.train_cells`)."""
    plan, data = ctx["plan"], ctx["data"]
    trained = train_cells(ctx.spark, ctx.cfg, plan.cells, data, plan.pool, ctx.run_id, ctx["clock"].lap, ctx.counts)
    return Scored(*score_cells(ctx.spark, ctx.cfg, trained, data, plan.measured, ctx["classifiers"]["path"],
                               ctx["generator"]["lm_path"], ctx["grader"]))


def ablations_step(ctx: JobContext) -> dict[str, Any]:
    ablations = measure_ablations(ctx)
    ctx["scores"].add(ablations)
    ctx["leakage"].update(ablations["leakage"])
    if ctx["tuning"] is not None:
        ctx["leakage"].update({f"tuning.{k}": v for k, v in ctx["tuning"]["result"]["leakage"].items()})
    ctx["data"].unpersist()
    ctx["clock"].lap("decode_and_score")
    return ablations


def measure_eps_run(ctx: JobContext, eps: float) -> dict[str, Any]:
    """ERG at ``eps`` (:func:`jobs.eps_sweep.run_erg_at`) and its Fig. 5 cells (:func:`measure_eps`), added to the
    scores and the leakage; returns the run with the styles it could not measure."""
    tag, lap = f"eps{eps:g}", ctx["clock"].lap
    cfg_eps, run = run_erg_at(ctx.spark, ctx.cfg, eps)
    lap(f"{tag}.erg")
    got = measure_eps(ctx.spark, cfg_eps, run, ctx["plan"].fig5, ctx.run_id, lambda stage: lap(f"{tag}.{stage}"),
                      ctx["classifiers"]["path"], ctx["generator"]["lm_path"], ctx["grader"], ctx.counts)
    ctx["scores"].add(got)
    ctx["leakage"].update({f"{tag}.{k}": v for k, v in got["leakage"].items()})
    lap(f"{tag}.decode_and_score")
    return {**run, "not_measured": got["not_measured"]}


def eps_step(ctx: JobContext) -> list[dict[str, Any]]:
    """Fig. 5's eps curve: ERG at each other eps, in a schema of its own, nested here."""
    if ctx["plan"].fig5 is None:
        return []
    return [measure_eps_run(ctx, eps) for eps in sweep_values(ctx.cfg)]


def seed_summary(seed_rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The rows over the seeds (mean, sd, each seed's value) with the 95% interval of their paired deltas, and the
    deltas."""
    rows, deltas = aggregate_seeds(seed_rows), seed_deltas(seed_rows)
    intervals = {(d["style"], d["captioner"], d["variant"]): d["ci95"] for d in deltas}
    for row in rows:
        if (row["style"], row["captioner"], row["variant"]) in intervals:
            row["ci95"] = intervals[(row["style"], row["captioner"], row["variant"])]
    return rows, deltas


def result_step(ctx: JobContext) -> dict[str, Any]:
    """The result: Table 2's rows and what they were measured on, then the tuning, ablation, Table 5 and Fig. 5
    sections."""
    cfg, e, data, plan, scores = ctx.cfg, ctx.cfg.experiment, ctx["data"], ctx["plan"], ctx["scores"]
    generator, erg_result = ctx["generator"], ctx["erg_result"]
    rows, deltas = seed_summary(scores.rows)
    result: dict[str, Any] = {
        "command": ctx["command"], "run_id": ctx.run_id, "styles": plan.measured, "captioners": list(e.captioners),
        "seeds": list(e.seeds), "interval": "95% t-interval over the seeds of the paired (same seed) deltas",
        "seed_rows": scores.rows, "deltas": deltas, "cell_counts": ctx.counts,
        "features": data.train_features.description, "rows": rows, "leakage": ctx["leakage"],
        "not_measured": plan.not_measured,
        **describe_setup(cfg, generator, ctx["classifiers"], ctx["grader"], ctx["version"] is not None),
        "generator_version": generator["version"], "counts": data.counts, "samples": scores.samples,
        "modes": caption_modes(scores.hypotheses) if len(scores.hypotheses) else [],
        "seconds": time.time() - ctx["started"], "stage_seconds": ctx["clock"].stages,
        "erg_run": erg_result.get("parent_run_id") if erg_result else None,
    }
    if ctx["tuning"] is not None:
        result["tuning"] = ctx["tuning"]["result"]
    add_sections(ctx, result)
    return result


def add_sections(ctx: JobContext, result: dict[str, Any]) -> None:
    """The ablation, Table 5 and Fig. 5 sections of the result, where measured."""
    ablations, plan, rows = ctx["ablations"], ctx["plan"], result["rows"]
    if ablations["pairs"]:
        a = ctx.cfg.experiment.ablations
        deltas = ablation_deltas(result["seed_rows"], a.captioner, list(a.kinds))
        result["ablations"] = {"kinds": list(a.kinds), "captioner": a.captioner, "pairs": ablations["pairs"],
                               "deltas": deltas, "markdown": render_ablations(ablations["pairs"], deltas)}
    if plan.table5 is not None:
        t5 = plan.table5
        result["table5"] = {"captioner": t5[0], "styles": t5[1], "types": t5[2],
                            "markdown": render_table5(rows, t5[0], t5[1])}
    if plan.fig5 is not None:
        f5 = plan.fig5
        points = size_curve(rows, f5[0], f5[1])
        result["fig5"] = {"captioner": f5[0], "styles": f5[1], "points": points, "markdown": render_fig5(points)}
        if ctx["eps"]:
            eps_points = eps_curve(rows, f5[0], f5[1], ctx.cfg.extract.eps)
            result["fig5"].update({"eps_points": eps_points, "eps_markdown": render_fig5_eps(eps_points),
                                   "eps_runs": ctx["eps"]})


def row_metrics(row: dict[str, Any]) -> dict[str, float]:
    """A Table 2 row's scores as the parent run's metrics, ``<style>.<captioner>.<variant>.<metric>``."""
    prefix = (f"{row['style']}.{row['captioner']}.{row['variant']}".replace(":", "_").replace("@", "_at_")
              .replace("=", ""))
    return {f"{prefix}.{m}": row[m] for m in ("bleu1", "bleu3", "meteor", "cider", "cls", "ppl")
            if row[m] is not None and not math.isnan(row[m])}


def report_step(ctx: JobContext) -> dict[str, Any]:
    """Step 7: the report (:func:`write_report`) and the parent run's metrics; returns the result."""
    result, tuning, leakage = ctx["result"], ctx["tuning"], ctx["leakage"]
    result["report_dir"] = str(write_report(result, ctx["folder"], ctx["scores"].hypotheses,
                                            tuning["hypotheses"] if tuning is not None else None))
    log_counts({**{k: v for k, v in ctx["data"].counts.items() if isinstance(v, (int, float))},
                **{f"leakage.{k}": v for k, v in leakage.items()}, "cells": len(ctx["plan"].cells), **ctx.counts,
                **{f"stage_seconds.{k}": v for k, v in ctx["clock"].stages.items()},
                "seconds": result["seconds"]})
    for row in result["rows"]:
        log_counts(row_metrics(row))
    return result


EXPERIMENT_STEPS = (Step("params", params_step), Step("data", data_step), Step("plan", plan_step),
                    Step("leakage", leakage_step), Step("grader", grader_step), Step("scores", scores_step),
                    Step("ablations", ablations_step), Step("eps", eps_step), Step("result", result_step),
                    Step("report", report_step))
"""Steps 2 to 7, after the tuning (``experiment.tuning.only`` stops before them)."""


def run_experiment(spark: SparkSession, cfg: ErgConfig, *, command: str | None = None) -> dict[str, Any]:
    """Run the experiment (module docstring); returns the result (rows, tables, leakage, not_measured, run ids)."""
    command = command or _command()
    started = time.time()
    erg_result = jobs.run(spark, cfg) if needs_erg(cfg) else None
    generator = require_current(cfg, GENERATOR, "run")
    classifiers = require_current(cfg, EVALUATION_CLASSIFIERS, "extract")
    check_captioners(cfg)
    e = cfg.experiment
    inputs = {"command": command, "started": started, "erg_result": erg_result, "generator": generator,
              "classifiers": classifiers, "styles": list(e.styles or cfg.styles), "tuning": None,
              "version": generator["version"] if e.generator_version == "current" else None}
    with parent_run(cfg, "experiment", tags={"erg.job": "experiment", "erg.conf": cfg.name,
                                             "erg.command": command[:5000],
                                             "erg.generator_version": generator["version"]}) as parent:
        folder = model_dir(cfg, "experiment", parent.info.run_id)
        folder.mkdir(parents=True, exist_ok=True)
        ctx = JobContext(spark, cfg, parent, out={**inputs, "folder": folder, "clock": StageClock()})
        run_steps(ctx, (Step("tuning", tuning_step, when=tuning_enabled),))
        if ctx["tuning"] is not None and ctx.cfg.experiment.tuning.only:
            return _tuning_only(ctx.cfg, command, ctx.run_id, ctx["tuning"], folder, started, ctx["clock"].stages)
        return run_steps(ctx, EXPERIMENT_STEPS)["report"]
