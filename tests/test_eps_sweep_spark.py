"""Fig. 5's eps curve end to end on the sample: ``erg run`` (test conf, extract.eps 0.25), then ``erg experiment``
with ``experiment.fig5.eps: [0.25, 0.5]``. ERG reruns at 0.5 in the schema ``<schema>_eps0p5``, on the main schema's
classifiers (nothing refit, the style head re-selected), and Fig. 5's captioner (NIC, humor) is trained on the
original pairs plus that run's augmented pairs. The filters are opened (perplexity, similarities, well-formedness)
so that the sample's tiny generator leaves passing pairs at both eps.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]

EPS = 0.5


@pytest.fixture(scope="module")
def swept(spark, erg_home) -> dict:
    from jobs.experiment import run_experiment
    from jobs.pipeline import run_pipeline
    from jobs.platform.config import load_config
    from jobs.platform.model_store import get_current
    from jobs.platform.spark import get_spark
    from jobs.vocabulary import EVALUATION_CLASSIFIERS, classifier_kind

    home = erg_home / "eps_sweep"
    overrides = [f"home={home}", "tables.schema=t_eps", f"sample.dir={home / 'sample'}",
                 "generate.filters.ppl_max=1000000", "generate.filters.min_similarity=0",
                 "generate.filters.min_content_similarity=0", "generate.filters.well_formed=false",
                 "train.num_processes=1", "train.epochs=2", "train.batch_size=16", "train.lr=0.01",
                 "train.hparams={embed_dim: 16, hidden_dim: 32}", "experiment.captioners=[nic]",
                 "experiment.styles=[humor]", "experiment.table5.enabled=false", "experiment.fig5.sizes=[0, 1]",
                 f"experiment.fig5.eps=[0.25, {EPS}]", "experiment.min_test_images=1", "experiment.samples_to_log=1",
                 "evaluate.max_len=12"]
    cfg = load_config("test", overrides)
    get_spark(cfg)
    erg = run_pipeline(spark, cfg)
    kinds = ("generator", EVALUATION_CLASSIFIERS, *[classifier_kind(s) for s in cfg.style_sets])
    before = {kind: get_current(cfg, kind) for kind in kinds}
    result = run_experiment(spark, cfg, command="erg experiment --conf test")
    after = {kind: get_current(cfg, kind) for kind in kinds}
    return {"cfg": cfg, "erg": erg, "result": result, "before": before, "after": after}


def test_the_eps_run_reuses_the_classifiers_and_extracts_at_its_eps(spark, swept) -> None:
    from jobs.eps_sweep import eps_config
    from jobs.platform.model_store import get_current
    from jobs.platform.tables import read_table
    from jobs.vocabulary import EVALUATION_CLASSIFIERS, classifier_kind
    from models.style_phrases import phrase_size

    cfg = swept["cfg"]
    cfg_eps = eps_config(cfg, EPS)
    assert cfg_eps.tables.schema_name == "t_eps_eps0p5"
    # the main schema's current models did not move (the eps schema's are registered under their own names)
    assert {k: v["version"] for k, v in swept["after"].items()} == {k: v["version"]
                                                                   for k, v in swept["before"].items()}
    for style_set in cfg.style_sets:
        main, swept_record = get_current(cfg, classifier_kind(style_set)), get_current(cfg_eps,
                                                                                      classifier_kind(style_set))
        assert swept_record["path"] == main["path"] and swept_record["version"] == main["version"]  # not refit
        assert (main["eps"], swept_record["eps"]) == (0.25, EPS)
    assert get_current(cfg_eps, EVALUATION_CLASSIFIERS)["version"] == get_current(cfg, EVALUATION_CLASSIFIERS)[
        "version"]
    assert get_current(cfg_eps, "generator")["version"] != get_current(cfg, "generator")["version"]

    words = {}
    for conf, eps in ((cfg, 0.25), (cfg_eps, EPS)):
        phrases = read_table(spark, conf, "style_phrases").select("tokens", "phrase_mask", "eps",
                                                                   "classifier_version").toPandas()
        assert len(phrases) == swept["erg"]["extract"]["scenes_to_extract"] > 0
        assert set(phrases["eps"]) == {eps}
        assert set(phrases["classifier_version"]) <= {get_current(cfg, classifier_kind(s))["version"]
                                                      for s in cfg.style_sets}
        # every phrase has min(ceil(eps * T), T - 1) of its caption's T words
        assert all(sum(mask) == phrase_size(len(tokens), eps)
                   for tokens, mask in zip(phrases["tokens"], phrases["phrase_mask"]))
        words[eps] = phrases["phrase_mask"].map(sum).mean()
    assert words[EPS] > 1.5 * words[0.25]  # 0.5 takes about twice the words of 0.25


def test_the_eps_curve_is_trained_scored_and_reported(swept) -> None:
    result = swept["result"]
    f5 = result["fig5"]
    points = f5["eps_points"]
    assert [(p["style"], p["eps"]) for p in points] == [("humor", 0.25), ("humor", EPS)]
    rows = {r["variant"]: r for r in result["rows"] if r["style"] == "humor"}
    assert set(rows) == {"original", "augmented", f"augmented@eps={EPS:g}"}
    swept_row = rows[f"augmented@eps={EPS:g}"]
    assert swept_row["eps"] == EPS and swept_row["train_pairs_augmented"] > 0
    assert swept_row["train_pairs_original"] == rows["original"]["train_pairs"]
    assert points[1]["augmented_pairs"] == swept_row["train_pairs_augmented"]
    assert points[0]["augmented_pairs"] == rows["augmented"]["train_pairs_augmented"]
    assert 0 <= swept_row["cls"] <= 1 and swept_row["cider"] >= 0 and swept_row["test_images"] > 0
    assert [r["eps"] for r in f5["eps_runs"]] == [EPS] and f5["eps_runs"][0]["erg_run"]
    # the rerun is a child of the experiment's run (started inside it, once Fig. 5's style set was measured)
    import mlflow
    rerun = mlflow.get_run(f5["eps_runs"][0]["erg_run"])
    assert rerun.data.tags.get("mlflow.parentRunId") == result["run_id"]
    for key in ("test_scene_phrases_in_training", "test_images_in_training", "scene_features_from_scored_references"):
        assert result["leakage"][f"eps{EPS:g}.{key}"] == 0
    report = Path(result["report_dir"])
    text = (report / "report.md").read_text()
    assert "## Fig. 5: eps (nic, humor)" in text and f"| humor | {EPS:g} | {swept_row['train_pairs_augmented']} |" in text
    assert (report / "fig5_eps.png").read_bytes()[:4] == b"\x89PNG"
    assert len(json.loads((report / "experiment.json").read_text())["fig5"]["eps_points"]) == 2


def test_a_second_sweep_reuses_the_eps_run(spark, swept) -> None:
    from jobs.eps_sweep import run_erg_at

    _, info = run_erg_at(spark, swept["cfg"], EPS)
    assert info["erg_run"] is None and info["heads"] is None
    assert info["generator_version"] == swept["result"]["fig5"]["eps_runs"][0]["generator_version"]
