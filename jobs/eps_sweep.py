"""Fig. 5's eps curve: ERG rerun at another extraction proportion eps, beside the main run, for ``erg experiment``.

eps is the share of a stylized caption's words that Extract takes as its style phrase (the rest is the scene), so
every later stage depends on it: the scenes that are embedded and retrieved, the phrases the generator learns to
place and transfers. For each eps of ``experiment.fig5.eps`` other than ``extract.eps``:

1. **Schema.** The same conf with ``extract.eps`` set and ``tables.schema`` = ``<schema>_eps<eps>`` (0.05 ->
   ``erg_eps0p05``): its own tables and models (``<home>/models/<schema>``, registered as ``<schema>.erg_*``), the
   main schema's feature cache (content-addressed, ``train.features_cache_schema``).
2. **Models.** What does not depend on eps is reused, never refit: each style set's classifier and the evaluation
   classifiers (filter 1 of generate, cls. of the experiment) are the main schema's current ones. Each set's style
   head is selected again by Eq. 2 at this eps (the head that best separates styles depends on how many words are
   taken).
3. **ERG.** ``erg run --incremental`` on that schema: ingest, extract (apply only: the models of step 2), embed,
   retrieve, generate (the generator trained on this eps's phrases). Where that schema already has a generator, the
   step is skipped: a rerun of the experiment reuses it (drop the schema and its ``<home>/models`` folder to redo
   it).

The experiment then trains Fig. 5's captioner on the original pairs plus that schema's passing augmented pairs and
scores it like every other cell (:func:`jobs.experiment.measure_eps`).
"""
from __future__ import annotations

import logging
import math
from typing import Any

from pyspark.sql import SparkSession

from jobs.platform.config import ErgConfig
from jobs.platform.model_store import get_current, require_current, set_current

logger = logging.getLogger(__name__)


def eps_schema(schema: str, eps: float) -> str:
    """The schema of the ERG run at ``eps``: ``erg`` and 0.05 give ``erg_eps0p05``."""
    return f"{schema}_eps{eps:g}".replace(".", "p").replace("-", "m")


def sweep_values(cfg: ErgConfig) -> list[float]:
    """The eps values of ``experiment.fig5.eps`` that need an ERG run of their own (all but ``extract.eps``)."""
    if not cfg.experiment.fig5.enabled:
        return []
    return [eps for eps in cfg.experiment.fig5.eps if not math.isclose(eps, cfg.extract.eps)]


def eps_config(cfg: ErgConfig, eps: float) -> ErgConfig:
    """``cfg`` at extraction proportion ``eps`` in its own schema (module docstring, step 1)."""
    out = cfg.model_copy(deep=True)
    out.extract.eps = eps
    out.tables.schema_name = eps_schema(cfg.tables.schema_name, eps)
    out.train.features_cache_schema = cfg.train.features_cache_schema or cfg.tables.schema_name
    out.experiment.fig5.eps = []
    return out


def seed_models(spark: SparkSession, cfg: ErgConfig, cfg_eps: ErgConfig) -> dict[str, Any]:
    """Step 2: the main schema's classifiers as ``cfg_eps``'s current ones, each set's head selected again at
    ``cfg_eps.extract.eps``; returns ``{style_set: {"layer", "head"}}`` of the new heads."""
    from jobs.extract import EVALUATION_CLASSIFIERS, classifier_kind, fit_style_head, read_stylized, set_classifier_data
    from models.style_classifier import StyleClassifier

    set_current(cfg_eps, EVALUATION_CLASSIFIERS, require_current(cfg, EVALUATION_CLASSIFIERS, "extract"))
    stylized = read_stylized(spark, cfg)
    heads: dict[str, Any] = {}
    for style_set, styles in cfg.style_sets.items():
        record = require_current(cfg, classifier_kind(style_set), "extract")
        train = set_classifier_data(stylized, styles, cfg.extract.classifier_for(style_set))["train"]
        clf = StyleClassifier.load(record["path"], device=cfg.extract.device, max_length=record["max_length"])
        selection = fit_style_head(cfg_eps, clf, style_set, train)
        set_current(cfg_eps, classifier_kind(style_set),
                    {**record, "layer": selection.layer, "head": selection.head, "eps": cfg_eps.extract.eps})
        heads[style_set] = {"layer": selection.layer, "head": selection.head}
        logger.info("eps %g: %s head (%d, %d) (at eps %g: (%d, %d))", cfg_eps.extract.eps, style_set,
                    selection.layer, selection.head, record["eps"], record["layer"], record["head"])
    return heads


def run_erg_at(spark: SparkSession, cfg: ErgConfig, eps: float) -> tuple[ErgConfig, dict[str, Any]]:
    """Steps 1-3 for one eps: its conf and ``{"eps", "schema", "generator_version", "erg_run", "heads"}``
    (``erg_run`` and ``heads`` None where the schema's generator was reused)."""
    from jobs.pipeline import run_pipeline
    from jobs.platform.spark import get_spark

    cfg_eps = eps_config(cfg, eps)
    get_spark(cfg_eps)  # the schema and its tables
    info: dict[str, Any] = {"eps": eps, "schema": cfg_eps.tables.schema_name, "erg_run": None, "heads": None}
    if get_current(cfg_eps, "generator") is None:
        info["heads"] = seed_models(spark, cfg, cfg_eps)
        info["erg_run"] = run_pipeline(spark, cfg_eps, incremental=True)["parent_run_id"]
    info["generator_version"] = require_current(cfg_eps, "generator", "run")["version"]
    return cfg_eps, info
