"""``erg compare``: real MLflow runs (a tmp sqlite store, logged through jobs.platform.tracking as the jobs log them)
side by side: only the params that differ, metrics by section with deltas, the erg.* tags; bad input fails clearly."""
from __future__ import annotations

import math

import pytest

from jobs.cli import main
from jobs.compare import compare, metric_section
from jobs.platform.config import load_config
from jobs.platform.tracking import job_run, log_counts


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Two generate runs (ppl_max 80 vs 60) with an extract run between them, in a fresh sqlite store (no tables:
    no state recorded, so no Spark session)."""
    root = tmp_path_factory.mktemp("compare_store")
    base = [f"mlflow.tracking_uri=sqlite:///{root}/mlflow.db", f"mlflow.artifact_location={root}/artifacts",
            "mlflow.experiment=erg-compare", f"home={root}"]
    cfg_a = load_config("test", base)
    cfg_b = load_config("test", base + ["generate.filters.ppl_max=60", "generate.decoding.num_beams=3"])
    ids = {}
    with job_run(cfg_a, "generate", sections=("generate",), params={"incremental": False, "note": "[humor] a"},
                 record_state=False) as run:
        log_counts({"candidates": 40, "passed": 10, "pass_rate.all": 0.25, "pass_rate.humor": 0.5,
                    "generator.final_loss": 2.5, "generator.train_captions": 30})
        ids["a"] = run.info.run_id
    with job_run(cfg_a, "extract", sections=("extract",), record_state=False) as run:
        log_counts({"classifier.accuracy": 0.9})
        ids["extract"] = run.info.run_id
    with job_run(cfg_b, "generate", sections=("generate",), params={"incremental": False, "note": "[sep] b"},
                 record_state=False) as run:
        log_counts({"candidates": 40, "passed": 6, "pass_rate.all": 0.15, "generator.final_loss": 2.0,
                    "generator.train_captions": 30, "stage_seconds.generate": 12.5})
        ids["b"] = run.info.run_id
    return cfg_a, ids


def test_last_runs_of_a_job_show_only_differing_params(store):
    cfg, ids = store
    result = compare(cfg, None, "generate", 2)
    assert list(result.runs["run_id"]) == [ids["a"], ids["b"]]  # oldest first; the extract run is not a generate run
    assert set(result.runs["job"]) == {"generate"} and set(result.runs["status"]) == {"FINISHED"}
    a, b = ids["a"][:8], ids["b"][:8]
    assert list(result.params.columns) == [a, b]
    assert set(result.params.index) == {"generate.filters.ppl_max", "generate.decoding.num_beams", "note"}
    assert result.params.loc["generate.filters.ppl_max"].tolist() == ["80.0", "60.0"]
    assert result.params.loc["generate.decoding.num_beams"].tolist() == ["2", "3"]


def test_metrics_side_by_side_with_sections_and_deltas(store):
    cfg, ids = store
    metrics = compare(cfg, None, "generate", 5).metrics  # only two generate runs exist
    a, b = ids["a"][:8], ids["b"][:8]
    assert list(metrics.columns) == ["section", a, b, "delta"]
    assert metrics.loc["passed", [a, b]].tolist() == [10.0, 6.0] and metrics.loc["passed", "delta"] == -4.0
    assert metrics.loc["pass_rate.all", "section"] == "pass rates"
    assert metrics.loc["pass_rate.all", "delta"] == pytest.approx(-0.10)
    assert metrics.loc["generator.final_loss", "section"] == "generator"
    assert metrics.loc["candidates", "section"] == "counts" and metrics.loc["candidates", "delta"] == 0.0
    # a metric only one run logged is shown with a gap, not dropped
    assert math.isnan(metrics.loc["pass_rate.humor", b]) and metrics.loc["pass_rate.humor", a] == 0.5
    assert metrics.loc["stage_seconds.generate", "section"] == "timings"
    sections = metrics["section"].tolist()
    assert sections == sorted(sections, key=["counts", "pass rates", "classifier", "generator", "training",
                                             "evaluation", "timings"].index)


def test_run_ids_in_given_order_and_tags(store):
    cfg, ids = store
    result = compare(cfg, [ids["b"], ids["extract"]])
    assert list(result.runs["run_id"]) == [ids["b"], ids["extract"]]
    assert result.tags.loc["erg.job"].tolist() == ["generate", "extract"]
    assert result.tags.loc["erg.conf"].tolist() == ["test", "test"]
    assert all(tag.startswith("erg.") for tag in result.tags.index)
    # generate.* params exist only on the generate run, extract.* only on the extract run: both differ
    assert "generate.filters.ppl_max" in result.params.index and "extract.eps" in result.params.index
    assert "conf" not in result.params.index  # identical in both runs
    assert result.metrics.loc["classifier.accuracy", "section"] == "classifier"


def test_default_job_is_the_newest_runs_job(store):
    cfg, ids = store
    assert compare(cfg).runs["run_id"].tolist() == [ids["a"], ids["b"]]


@pytest.mark.parametrize("call, message", [
    (dict(run_ids=["x1", "x2"], job="generate"), "not both"),
    (dict(job="generate", last=1), "at least 2"),
    (dict(run_ids=["only-one"]), "at least two run ids"),
    (dict(job="extract"), "holds 1 run"),
    (dict(job="ingest"), "holds 0 run"),
    (dict(job="gen' OR 1=1"), "must be a job name"),
])
def test_bad_input_is_a_clear_error(store, call, message):
    cfg, _ = store
    with pytest.raises(ValueError, match=message):
        compare(cfg, **call)


def test_unknown_run_id_and_experiment(store):
    cfg, ids = store
    with pytest.raises(ValueError, match="'deadbeef' was not found"):
        compare(cfg, [ids["a"], "deadbeef"])
    other = cfg.model_copy(update={"mlflow": cfg.mlflow.model_copy(update={"experiment": "no-such-experiment"})})
    with pytest.raises(ValueError, match="'no-such-experiment' does not exist"):
        compare(other, job="generate")


def test_metric_sections():
    assert metric_section("pass_rate_style/humor") == "pass rates"
    assert metric_section("head.layer") == metric_section("phrase.attention.f1") == "classifier"
    assert metric_section("evaluate.humor.CIDEr") == metric_section("humor.BLEU-1") == "evaluation"
    assert metric_section("index.image.build_seconds") == "timings"
    assert metric_section("loss_last") == metric_section("rows.augmented") == "training"
    assert metric_section("retrievals.inserted") == "counts"


def test_cli_prints_rich_tables(store, capsys, monkeypatch):
    cfg, ids = store
    monkeypatch.setenv("COLUMNS", "200")
    args = ["compare", "--conf", "test", "--set", f"mlflow.tracking_uri={cfg.mlflow.tracking_uri}",
            "--set", "mlflow.experiment=erg-compare", "--job", "generate"]
    assert main(args) == 0
    out = capsys.readouterr().out
    for text in ("params that differ", "generate.filters.ppl_max", "[sep] b", "pass_rate.all", "metrics", "erg.job",
                 ids["a"][:8], ids["b"][:8]):
        assert text in out
    assert "generate.decoding.strategy" not in out  # identical in both runs
    with pytest.raises(SystemExit, match="erg compare: .*not both"):
        main(args + [ids["a"], ids["b"]])
