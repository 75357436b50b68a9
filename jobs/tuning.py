"""The val-scored sweep of ``erg experiment`` (``experiment.tuning``): training knobs chosen on the val split before
Table 2, so that the test split is scored once per reported cell and chooses nothing.

Each knob of ``experiment.tuning.knobs`` (a dotted conf key and its candidate values) is swept in turn, the knobs
before it at their chosen values and those after it at the conf's. For each value, ``tuning.captioner`` trains per
tuning style on the original pairs and on the original + augmented pairs (the pairs and cap of Table 2's cells, the
train split only), with ``tuning.seed``; each cell captions the style's **val** images (the val split of
``stylized_captions``, references = the image's val captions of the style) and is scored as Table 2's cells are:
BLEU, METEOR, CIDEr, cls. by the evaluation classifiers, cls. (indep.) by a grader fitted on half B of the train
split's images. The value chosen is the one the criterion declared in the conf picks (:func:`choose_value`): the
highest mean over the tuning styles of the val delta of cls. (augmented minus original, same seed), among the values
whose mean val delta C % stays above ``-max_cider_drop``; a value that leaves a tuning style unmeasured (no scene
features, fewer than ``min_val_images`` val images) while another value measures it is not chosen, and a style no
value measures is left out of the comparison. Table 2's cells then train with every chosen value.

A knob that cannot change what an original pair teaches (:data:`ORIGINAL_INVARIANT`: original pairs always weigh 1)
shares one original cell across its values. A knob that changes the scene features (``train.visual_context.*``,
``train.features``) gets the pairs and val images built again under each value. Tuning cells are cells like any
other (fingerprinted, reused by a rerun) whose variant ``tuning:<original|augmented>:<id>`` names the knob values
they train with (``id`` of the values that differ from the conf's), so they never stand for a Table 2 cell and the
same values reached from two knobs are one cell.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.cells import (Cell, ExperimentData, fit_independent_classifier, load_data, measure_leakage, score_cells,
                        train_cells, with_captioner)
from jobs.platform.config import ErgConfig, get_setting, with_setting
from jobs.platform.tables import read_table
from jobs.platform.tracking import log_counts
from jobs.train import check_hparams
from models.experiment_report import cider_gain_percent

logger = logging.getLogger(__name__)

ORIGINAL_INVARIANT = ("train.inserted_word_weight",)
VARIANT_PREFIX = "tuning:"
DELTAS = ("delta_cls", "delta_cls_independent", "delta_cider_percent")
METRICS = ("bleu1", "bleu3", "meteor", "cider", "cls", "cls_independent", "ppl")


def settings_id(settings: dict[str, Any]) -> str:
    """A short name of a set of knob values ({} = the conf's own values)."""
    if not settings:
        return "conf"
    return hashlib.sha1(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:8]


def apply_settings(cfg: ErgConfig, settings: dict[str, Any]) -> ErgConfig:
    """``cfg`` with every dotted key of ``settings`` set, validated as ``--set`` would be."""
    for key, value in settings.items():
        cfg = with_setting(cfg, key, value)
    return cfg


def differing(cfg: ErgConfig, settings: dict[str, Any]) -> dict[str, Any]:
    """The entries of ``settings`` whose validated value differs from ``cfg``'s (4 and 4.0 are the same value)."""
    return {k: v for k, v in settings.items() if get_setting(with_setting(cfg, k, v), k) != get_setting(cfg, k)}


def criterion_text(criterion: str, max_cider_drop: float) -> str:
    what = {"delta_cls": "cls. (the evaluation classifiers, as Table 2)",
            "delta_cls_independent": "cls. (indep.) (the grader trained on half B of the train split)"}[criterion]
    return (f"the highest mean over the tuning styles of the val delta of {what}, augmented minus original cell "
            f"(same seed, in points), among the values whose mean val delta C % is at least -{max_cider_drop:g}% "
            "(if none is, the value that loses the least CIDEr); ties: the higher delta C %, then the value listed "
            "first")


def choose_value(results: list[dict[str, Any]], criterion: str, max_cider_drop: float) -> tuple[int | None, str]:
    """The index of the chosen value among ``results`` (each: ``eligible`` and the means ``delta_cls``,
    ``delta_cls_independent``, ``delta_cider_percent`` over the tuning styles) and why; None when no value was
    measured on every tuning style."""
    def finite(value: Any) -> bool:
        return value is not None and not math.isnan(value)

    eligible = [(i, r) for i, r in enumerate(results) if r.get("eligible") and finite(r.get(criterion))]
    if not eligible:
        return None, "no value was measured on every tuning style: the conf's value is kept"
    guarded = [(i, r) for i, r in eligible
               if finite(r.get("delta_cider_percent")) and r["delta_cider_percent"] >= -max_cider_drop]
    if guarded:
        i, r = max(guarded, key=lambda p: (p[1][criterion], p[1]["delta_cider_percent"], -p[0]))
        return i, (f"highest mean val {criterion} ({r[criterion]:+.1f}) among the {len(guarded)} of "
                   f"{len(results)} values whose mean val delta C % is at least -{max_cider_drop:g}% (it has "
                   f"{r['delta_cider_percent']:+.1f}%)")

    def cider(p):
        return p[1]["delta_cider_percent"] if finite(p[1].get("delta_cider_percent")) else -math.inf

    i, r = max(eligible, key=lambda p: (cider(p), p[1][criterion], -p[0]))
    return i, (f"no value kept its mean val delta C % at -{max_cider_drop:g}% or above: the one that loses the "
               f"least CIDEr ({r['delta_cider_percent']:+.1f}%; {criterion} {r[criterion]:+.1f})")


def value_summary(per_style: dict[str, dict[str, Any]]) -> dict[str, float]:
    """The means over the styles of each style's deltas (NaN where no style has one)."""
    out = {}
    for delta in DELTAS:
        values = [s[delta] for s in per_style.values() if s.get(delta) is not None and not math.isnan(s[delta])]
        out[delta] = sum(values) / len(values) if values else float("nan")
    return out


def style_deltas(original: dict[str, Any], augmented: dict[str, Any]) -> dict[str, float]:
    """One style's deltas of the augmented cell against the original (cls. in points, C in percent)."""
    def points(key):
        a, o = augmented.get(key), original.get(key)
        return (a - o) * 100.0 if a is not None and o is not None else float("nan")

    return {"delta_cls": points("cls"), "delta_cls_independent": points("cls_independent"),
            "delta_cider_percent": cider_gain_percent(original["cider"], augmented["cider"])}


def _features_key(cfg: ErgConfig) -> str:
    t = cfg.train
    return json.dumps({"features": t.features, "visual_context": t.visual_context.model_dump(),
                       "max_regions": t.max_regions, "clip": t.clip.model_dump(), "cache": t.features_cache_schema},
                      sort_keys=True, default=str)


def _decoding_key(cfg: ErgConfig) -> str:
    return json.dumps([cfg.evaluate.max_len, cfg.evaluate.no_repeat_ngram_size])


def _cell_metrics(row: dict[str, Any]) -> dict[str, Any]:
    keep = (*METRICS, "test_images", "train_pairs", "train_pairs_augmented", "run_id", "fingerprint", "reused")
    return {k: row.get(k) for k in keep}


@dataclass
class Sweep:
    """The sweep's inputs and what it has gathered so far: the datasets by their scene features
    (:func:`_features_key`), the scored cells by label, their captions, the cell counts and leakage counts, the
    values chosen so far (``chosen``: those that differ from the conf's) and each knob's section of the result."""

    spark: SparkSession
    cfg: ErgConfig
    styles: list[str]
    generator_version: str | None
    generator: dict[str, Any]
    classifiers: dict[str, Any]
    parent_id: str
    lap: Callable[[str], None]
    seed: int
    grader: dict[str, Any] | None
    stylized: DataFrame
    client: Any = None
    datasets: dict[str, dict[str, Any]] = field(default_factory=dict)
    scored: dict[str, dict[str, Any]] = field(default_factory=dict)
    hypotheses: list[pd.DataFrame] = field(default_factory=list)
    counts: dict[str, float] = field(default_factory=dict)
    leakage: dict[str, int] = field(default_factory=dict)
    chosen: dict[str, Any] = field(default_factory=dict)
    chosen_values: dict[str, Any] = field(default_factory=dict)
    knobs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def tuning(self):
        return self.cfg.experiment.tuning


def tuning_cell(sweep: Sweep, style: str, variant: str, settings: dict[str, Any]) -> Cell:
    """The tuning cell of ``style`` trained on the ``variant`` pairs (original / augmented) with ``settings``."""
    return Cell(style, sweep.tuning.captioner, f"{VARIANT_PREFIX}{variant}:{settings_id(settings)}", None,
                1.0 if variant == "augmented" else 0.0, None, sweep.seed)


def val_pool(sweep: Sweep, data: ExperimentData) -> tuple[dict[str, int], dict[str, str]]:
    """Each tuning style's augmented pool (capped as Table 2's), and why a style has none."""
    e, t = sweep.cfg.experiment, sweep.tuning
    pool, reasons = {}, {}
    for style in sweep.styles:
        n_orig = data.available.get((style, "original"), 0)
        n_aug = data.available.get((style, "augmented"), 0)
        n_val = data.test_counts.get(style, 0)
        if n_orig and n_aug and n_val >= t.min_val_images:
            pool[style] = min(n_aug, e.max_augmented_pairs or 10 ** 12)
        else:
            reasons[style] = (f"scene features exist for {n_orig} original and {n_aug} augmented train pairs and "
                              f"{n_val} val images (at least 1, 1 and {t.min_val_images} needed)")
    return pool, reasons


def dataset(sweep: Sweep, point_cfg: ErgConfig) -> dict[str, Any]:
    """The train pairs and val images under ``point_cfg``'s scene features (built once per features key), their
    pools, and the leakage counts they add."""
    key = _features_key(point_cfg)
    if key in sweep.datasets:
        return sweep.datasets[key]
    data = load_data(sweep.spark, point_cfg, sweep.styles, sweep.generator_version, split="val")
    pool, reasons = val_pool(sweep, data)
    leakage = sweep.leakage
    if pool:
        for k, v in measure_leakage(sweep.spark, point_cfg, data, pool, tables=False).items():
            leakage[k] = leakage.get(k, 0) + v
    scored_images = data.tests_ok.select("image_id").distinct()
    leakage["scored_images_not_val"] = leakage.get("scored_images_not_val", 0) + scored_images.join(
        sweep.stylized.where(F.coalesce(F.col("split"), F.lit("")) != "val").select("image_id"), "image_id",
        "left_semi").count()
    sweep.datasets[key] = {"data": data, "pool": pool, "reasons": reasons, "val_images": dict(data.test_counts)}
    sweep.lap("tuning.features")
    return sweep.datasets[key]


def knob_points(sweep: Sweep, key: str, values: list[Any]) -> list[dict[str, Any]]:
    """Each value of the knob ``key`` (the knobs before it at their chosen values): the settings of its augmented
    cells and of its original cells (without the knobs of :data:`ORIGINAL_INVARIANT`), with their confs."""
    cfg, points = sweep.cfg, []
    for value in values:
        settings = differing(cfg, {**sweep.chosen, key: value})
        original = {k: v for k, v in settings.items() if k not in ORIGINAL_INVARIANT}
        points.append({"value": value, "settings": settings, "original_settings": original,
                       "cfg": apply_settings(cfg, settings), "original_cfg": apply_settings(cfg, original)})
    return points


def group_cells(sweep: Sweep, members: list[dict[str, Any]], pool: dict[str, int]
                ) -> tuple[dict[str, Cell], dict[str, ErgConfig], dict[str, dict[str, Any]]]:
    """The cells of a group of points not scored yet, by label, with each one's conf and settings."""
    cells: dict[str, Cell] = {}
    confs: dict[str, ErgConfig] = {}
    tags: dict[str, dict[str, Any]] = {}
    for point in members:
        for style in pool:
            for variant, settings, point_cfg in (("original", point["original_settings"], point["original_cfg"]),
                                                 ("augmented", point["settings"], point["cfg"])):
                cell = tuning_cell(sweep, style, variant, settings)
                if cell.label not in sweep.scored and cell.label not in cells:
                    cells[cell.label], confs[cell.label], tags[cell.label] = cell, point_cfg, settings
    return cells, confs, tags


def score_group(sweep: Sweep, members: list[dict[str, Any]]) -> None:
    """Train and score on the val images the cells of points that share their scene features and decoding; each
    cell's child run is tagged ``erg.tuning`` and with its settings."""
    group_cfg = members[0]["cfg"]
    ds = dataset(sweep, group_cfg)
    cells, confs, tags = group_cells(sweep, members, ds["pool"])
    if not cells:
        return
    trained = train_cells(sweep.spark, group_cfg, list(cells.values()), ds["data"], ds["pool"], sweep.parent_id,
                          lambda stage: sweep.lap(f"tuning.{stage}"), sweep.counts, conf_of=lambda c: confs[c.label])
    measured = [s for s in sweep.styles if any(c.style == s for c in cells.values())]
    rows, _, got = score_cells(sweep.spark, group_cfg, trained, ds["data"], measured, sweep.classifiers["path"],
                               sweep.generator["lm_path"], sweep.grader, metric_prefix="val.")
    sweep.hypotheses.append(got)
    for row in rows:
        name = f"{row['style']}/{row['captioner']}/{row['variant']}#seed={row['seed']}"
        sweep.scored[name] = row
        sweep.client.set_tag(row["run_id"], "erg.tuning", "val")
        sweep.client.set_tag(row["run_id"], "erg.tuning_settings", json.dumps(tags[name], default=str)[:5000])
    sweep.lap("tuning.decode_and_score")


def point_result(sweep: Sweep, point: dict[str, Any]) -> dict[str, Any]:
    """One value's val metrics and deltas per tuning style (a style without both cells: why), and their means."""
    ds = sweep.datasets[_features_key(point["cfg"])]
    per_style: dict[str, dict[str, Any]] = {}
    missing: dict[str, str] = {}
    for style in sweep.styles:
        before = sweep.scored.get(tuning_cell(sweep, style, "original", point["original_settings"]).label)
        after = sweep.scored.get(tuning_cell(sweep, style, "augmented", point["settings"]).label)
        if before is None or after is None:
            missing[style] = ds["reasons"].get(style, "not scored")
            continue
        per_style[style] = {"original": _cell_metrics(before), "augmented": _cell_metrics(after),
                            **style_deltas(before, after)}
    return {"value": point["value"], "settings_id": settings_id(point["settings"]),
            "styles": per_style, "not_measured": missing, **value_summary(per_style)}


def choose_knob(sweep: Sweep, key: str, values: list[Any], results: list[dict[str, Any]]) -> None:
    """The value of ``key`` the criterion chooses among ``results``, recorded in the sweep with the knob's
    section of the result."""
    t, cfg = sweep.tuning, sweep.cfg
    # a style that no value measures cannot tell the values apart and is left out of the comparison; a value
    # that leaves out a style another value measures is not chosen
    compared = [s for s in sweep.styles if any(s in r["styles"] for r in results)]
    for r in results:
        r["eligible"] = bool(compared) and all(s in r["styles"] for s in compared)
    index, why = choose_value(results, t.criterion, t.max_cider_drop)
    if index is not None:
        sweep.chosen[key] = values[index]
    sweep.chosen_values[key] = values[index] if index is not None else get_setting(cfg, key)
    for i, r in enumerate(results):
        r["chosen"] = i == index
    sweep.knobs.append({"key": key, "values": list(values), "conf_value": get_setting(cfg, key), "styles": compared,
                        "chosen": sweep.chosen_values[key], "chosen_by": "criterion" if index is not None else "conf",
                        "why": why, "results": results})
    logger.info("tuning: %s = %r (%s)", key, sweep.chosen_values[key], why)


def sweep_knob(sweep: Sweep, key: str, values: list[Any]) -> None:
    """One knob: its values' cells trained and scored (grouped by scene features and decoding), one chosen."""
    points = knob_points(sweep, key, values)
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for point in points:
        groups.setdefault((_features_key(point["cfg"]), _decoding_key(point["cfg"])), []).append(point)
    for members in groups.values():
        score_group(sweep, members)
    choose_knob(sweep, key, values, [point_result(sweep, point) for point in points])


def sweep_result(sweep: Sweep) -> dict[str, Any]:
    """The experiment's ``tuning`` section."""
    t = sweep.tuning
    return {
        "split": "val", "test_scored": False,
        "statement": "every setting below was chosen on the val split before Table 2; no test image was captioned "
                     "or scored for it, and the tuning cells train on the train split only",
        "captioner": t.captioner, "seed": sweep.seed, "styles": sweep.styles,
        "criterion": {"name": t.criterion, "max_cider_drop": t.max_cider_drop,
                      "text": criterion_text(t.criterion, t.max_cider_drop)},
        "knobs": sweep.knobs, "chosen": sweep.chosen_values, "cell_counts": sweep.counts, "leakage": sweep.leakage,
        "val_images": {s: max((ds["val_images"].get(s, 0) for ds in sweep.datasets.values()), default=0)
                       for s in sweep.styles},
    }


def log_sweep(sweep: Sweep) -> None:
    """The criterion, the values and the chosen ones as params of the active (experiment) run; each value's mean
    val deltas and its cells' val scores, the cell counts and the leakage counts as its metrics."""
    import mlflow

    t, knobs = sweep.tuning, sweep.knobs
    mlflow.log_params({"tuning.knobs": json.dumps(dict(t.knobs), default=str)[:5000],
                       "tuning.criterion": t.criterion, "tuning.max_cider_drop": t.max_cider_drop,
                       "tuning.captioner": t.captioner, "tuning.seed": sweep.seed,
                       "tuning.styles": json.dumps(sweep.styles),
                       **{f"tuning.chosen.{k}": json.dumps(v, default=str) for k, v in sweep.chosen_values.items()},
                       **{f"tuning.{k['key']}.v{i}": json.dumps(r["value"], default=str)
                          for k in knobs for i, r in enumerate(k["results"])}})
    log_counts({**{f"tuning.{k['key']}.v{i}.{d}": r[d] for k in knobs for i, r in enumerate(k["results"])
                   for d in DELTAS if not math.isnan(r[d])},
                **{f"tuning.{k['key']}.v{i}.{s}.{variant}.{m}": v[variant][m]
                   for k in knobs for i, r in enumerate(k["results"]) for s, v in r["styles"].items()
                   for variant in ("original", "augmented") for m in ("cider", "cls", "cls_independent")
                   if v[variant][m] is not None and not math.isnan(v[variant][m])},
                **{f"tuning.{k}": v for k, v in sweep.counts.items()},
                **{f"tuning.leakage.{k}": v for k, v in sweep.leakage.items()}})


def run_tuning(spark: SparkSession, cfg: ErgConfig, styles: list[str], generator_version: str | None,
               generator: dict[str, Any], classifiers: dict[str, Any], parent_id: str, folder: Path,
               lap: Callable[[str], None]) -> dict[str, Any]:
    """The sweep (module docstring). Returns ``{"result", "cfg" (``cfg`` with the chosen values), "hypotheses",
    "grader"}``; ``result`` is the experiment's ``tuning`` section. Logs the criterion, the values' val metrics and
    the chosen values on the active (experiment) run, and tags each tuning cell's child run."""
    from mlflow.tracking import MlflowClient

    e, t = cfg.experiment, cfg.experiment.tuning
    seed = t.seed if t.seed is not None else e.seeds[0]
    tuning_styles = list(t.styles or styles)
    for key, values in t.knobs.items():  # every value's captioner recipe is checked before anything trains
        for value in values:
            check_hparams(with_captioner(with_setting(cfg, key, value), t.captioner))
    grader = fit_independent_classifier(spark, cfg, tuning_styles, folder / "independent_classifier_tuning")
    lap("tuning.independent_classifier")
    sweep = Sweep(spark, cfg, tuning_styles, generator_version, generator, classifiers, parent_id, lap, seed, grader,
                  read_table(spark, cfg, "stylized_captions"), MlflowClient())
    for key, values in t.knobs.items():
        sweep_knob(sweep, key, values)
    for ds in sweep.datasets.values():
        ds["data"].unpersist()
    result = sweep_result(sweep)
    log_sweep(sweep)
    return {"result": result, "cfg": apply_settings(cfg, sweep.chosen), "grader": grader, "styles": tuning_styles,
            "hypotheses": pd.concat(sweep.hypotheses, ignore_index=True) if sweep.hypotheses else pd.DataFrame()}
