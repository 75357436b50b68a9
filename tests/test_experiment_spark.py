"""``erg experiment`` end to end on the sample, and the scene features it trains on (textual visual context).

One module-scoped setup in a home and schema of its own: the generated sample is read through the ingest readers
(stylized captions with their splits, factual captions P, images with their tags and descriptions) and appended to
the tables directly (the ingest job is tested in its own module). A test image's reference caption is planted into
its own ``images.descriptions`` (with other casing and punctuation): no feature may be built from it. Passing
augmented captions are planted for the current generator version (half t2t, half i2t) and for an older version,
which the experiment must leave out. Linear-probe evaluation classifiers and trigram LMs are the current ones (what
``erg extract`` / ``erg generate`` leave). Then the experiment runs: NIC, humor and positive, original vs augmented,
Table 5 and Fig. 5 on humor (7 cells, each trained through TorchDistributor), and writes its report. (Up-Down and
two-process training are tested in test_captioner_recipe / test_captioner_training; a cell is a cell whatever the
captioner: `experiment.captioners: [nic, updown]` passed here too, at twice the time.)
"""
from __future__ import annotations

import datetime as dt
import json
import math
import os
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from planted_tables import append_rows, set_current_scoring

os.environ.setdefault("HF_HUB_OFFLINE", "1")

pytestmark = [pytest.mark.spark, pytest.mark.slow]

STYLES = ["humor", "positive"]
CURRENT, OLD = "gen-current", "gen-old"
PLANTED_SUFFIX = "!!"


def _load(spark, cfg) -> dict:
    """The sample in the tables, a test reference planted into its image's descriptions; returns what was planted."""
    from jobs.ingest import read_sources
    from jobs.sample import sample_sources, write_sample

    write_sample(cfg)
    frames = read_sources(cfg, sample_sources(cfg))[0].frames()
    now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    stylized = frames["stylized_captions"][frames["stylized_captions"]["style"].isin(STYLES)]
    images = frames["images"].copy()
    test = stylized[(stylized["split"] == "test") & (stylized["style"] == "humor")].sort_values("scene_id").iloc[0]
    row = images.index[images["image_id"] == test["image_id"]][0]
    planted = test["caption"].upper().rstrip(" .") + PLANTED_SUFFIX  # the same words, other casing and punctuation
    images.at[row, "descriptions"] = list(images.at[row, "descriptions"]) + [planted]
    append_rows(spark, cfg, "stylized_captions", stylized.assign(ingest_time=now, run_id="fixture"))
    append_rows(spark, cfg, "factual_captions", frames["factual_captions"].assign(ingest_time=now, run_id="fixture"))
    append_rows(spark, cfg, "images", images.assign(ingest_time=now, run_id="fixture"))
    return {"stylized": stylized, "factual": frames["factual_captions"], "images": images,
            "test_image": test["image_id"], "planted": planted,
            "descriptions": [d for d in images.at[row, "descriptions"] if d != planted], "tags": images.at[row, "tags"]}


def _plant_augmented(spark, cfg, stylized, factual) -> dict[str, int]:
    """Passing augmented pairs on P images for the current generator (t2t / i2t alternating) and the old one."""
    train = stylized[stylized["split"] == "train"].sort_values("scene_id")
    chosen = factual.sort_values("caption_id").head(16)
    rows = []
    for i, f in enumerate(chosen.itertuples()):
        style = STYLES[i % 2]
        scenes = train[train["style"] == style]
        scene = scenes.iloc[i % len(scenes)]
        version = OLD if i % 4 == 3 else CURRENT
        rows.append({"query_id": f.caption_id, "image_id": f.image_id, "factual_caption": f.caption, "style": style,
                     "generated_caption": scene["caption"], "scene_id": scene["scene_id"],
                     "retrieval_type": "t2t" if (i // 2) % 2 == 0 else "i2t",
                     "generator_version": version})
    import pandas as pd

    frame = pd.DataFrame(rows)
    now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    append_rows(spark, cfg, "augmented_captions", frame.assign(
        style_phrase="planted", similarity=0.9, passed_style=True, passed_perplexity=True, passed_similarity=True,
        passed=True, run_id="planted", created_at=now))
    current = frame[frame["generator_version"] == CURRENT]
    return {"current": current.groupby("style").size().to_dict(), "old": int((frame["generator_version"] == OLD).sum()),
            "current_by_type": current.groupby(["style", "retrieval_type"]).size().to_dict()}


@pytest.fixture(scope="module")
def setup(spark, erg_home) -> dict:
    from jobs.platform.config import load_config
    from jobs.platform.spark import get_spark

    home = erg_home / "experiment"
    overrides = [f"home={home}", "tables.schema=t_experiment", f"sample.dir={home / 'sample'}",
                 f"styles=[{', '.join(STYLES)}]", "sample.stylized_per_style=20", "sample.n_images=80", "sample.factual_captions=240",
                 "train.num_processes=1", "train.epochs=3", "train.batch_size=16", "train.lr=0.01",
                 "train.hparams={embed_dim: 16, hidden_dim: 32}", "train.visual_context.max_regions=8",
                 "train.inserted_word_weight=3", "experiment.captioners=[nic]",
                 "experiment.min_test_images=1", "experiment.max_augmented_pairs=5",
                 "experiment.fig5.sizes=[0, 0.5, 1]", "experiment.fig5.eps=[]", "experiment.samples_to_log=1", "evaluate.max_len=12"]
    cfg = load_config("test", overrides)
    get_spark(cfg)
    from jobs.platform.tables import register_tables

    register_tables(spark, cfg)
    loaded = _load(spark, cfg)
    augmented = _plant_augmented(spark, cfg, loaded["stylized"], loaded["factual"])
    set_current_scoring(cfg, loaded["stylized"], loaded["factual"], STYLES, CURRENT)
    return {"cfg": cfg, "overrides": overrides, "augmented": augmented, **loaded}


@pytest.fixture(scope="module")
def experiment(spark, setup) -> dict:
    from jobs.experiment import run_experiment

    return run_experiment(spark, setup["cfg"], command="erg experiment --conf test")


def _key(text: str) -> str:
    return " ".join(re.sub(r"[^\w' ]", " ", text.lower()).split())


def _vectors(texts: list[str]) -> np.ndarray:
    from models.encoders import SentenceEncoder

    return SentenceEncoder("all-MiniLM-L6-v2", device="cpu").encode_texts(texts)


def test_features_are_never_built_from_a_scored_reference(spark, setup, experiment) -> None:
    """The planted description (a test reference, recased) is left out of the test pair's features; the image's
    tags and real descriptions are in them, padded to max_regions. (After the experiment: its text vectors are
    cached, so this builds the features without embedding again.)"""
    from jobs.scene_features import feature_leaks, scene_features

    cfg, image = setup["cfg"], setup["test_image"]
    pairs = spark.createDataFrame([(f"{image}|humor", image, "humor", None)],
                                  "pair_id string, image_id string, style string, source_caption string")
    built = scene_features(spark, cfg, pairs)
    row = built.frame.collect()[0]
    unique: dict[str, str] = {}
    for text in setup["descriptions"]:  # texts with the same words count once
        unique.setdefault(_key(text), text)
    expected_texts = [setup["tags"], *unique.values()]
    assert built.regions == 8 and built.dim == 384
    assert row.n_regions == len(expected_texts) >= 2
    regions = np.asarray(row.features, dtype=np.float32).reshape(8, 384)
    planted = _vectors([setup["planted"]])[0]
    assert (regions[: row.n_regions] @ planted).max() < 0.999  # the planted reference is no region
    expected = _vectors(expected_texts)
    assert np.allclose(np.sort(regions[: row.n_regions] @ expected.T, axis=1)[:, -1], 1.0, atol=1e-4)
    assert not regions[row.n_regions:].any()  # padding
    assert built.counts["features.dropped_stylized_caption"] >= 1
    assert feature_leaks(spark, cfg, pairs) == 0
    # the planted text reached the table: without the guard it would have been a feature
    described = spark.sql(f"SELECT descriptions FROM {cfg.tables.schema_name}.images WHERE image_id = '{image}'")
    assert setup["planted"] in described.first().descriptions


def test_an_augmented_pair_never_sees_its_own_source_caption(spark, setup, experiment) -> None:
    from jobs.scene_features import scene_features

    cfg = setup["cfg"]
    factual = setup["factual"].sort_values("caption_id")
    distinct = factual.assign(key=factual["caption"].map(_key)).groupby("image_id")["key"].agg(
        lambda keys: len(keys) >= 2 and keys.nunique() == len(keys))
    image = distinct[distinct].index[0]  # an image of P with two or more different captions
    captions = factual.loc[factual["image_id"] == image, "caption"].tolist()
    pairs = spark.createDataFrame([("with", image, "humor", captions[0]), ("without", image, "humor", None)],
                                  "pair_id string, image_id string, style string, source_caption string")
    rows = {r.pair_id: r for r in scene_features(spark, cfg, pairs).frame.collect()}
    assert rows["with"].n_regions == rows["without"].n_regions - 1
    source = _vectors([captions[0]])[0]
    with_regions = np.asarray(rows["with"].features, dtype=np.float32).reshape(8, 384)[: rows["with"].n_regions]
    without = np.asarray(rows["without"].features, dtype=np.float32).reshape(8, 384)[: rows["without"].n_regions]
    assert (with_regions @ source).max() < 0.999 and np.isclose((without @ source).max(), 1.0, atol=1e-4)


def test_experiment_trains_scores_and_reports_every_cell(setup, experiment) -> None:
    rows = experiment["rows"]
    cells = {(r["style"], r["captioner"], r["variant"]) for r in rows}
    table2 = {(s, "nic", v) for s in STYLES for v in ("original", "augmented")}
    assert table2 <= cells
    assert {("humor", "nic", "augmented:i2t"), ("humor", "nic", "augmented:t2t"),
            ("humor", "nic", "augmented@0.5")} <= cells
    assert len(cells) == len(rows) == len(table2) + 3
    assert experiment["not_measured"] == {}
    n_train = {s: int(((setup["stylized"]["style"] == s) & (setup["stylized"]["split"] == "train")).sum())
               for s in STYLES}
    for row in rows:
        for metric in ("bleu1", "bleu3", "meteor", "cls", "cls_independent"):
            assert 0.0 <= row[metric] <= 1.0, (row["variant"], metric)
        assert row["bleu3"] <= row["bleu1"] + 1e-9 and row["cider"] >= 0 and row["ppl"] >= 1
        assert row["train_pairs_original"] == n_train[row["style"]]  # every original train pair has features
        assert row["train_pairs"] == row["train_pairs_original"] + row["train_pairs_augmented"]
        assert row["test_images"] >= 1
    by = {(r["style"], r["captioner"], r["variant"]): r for r in rows}
    for style in STYLES:
        # only the current generator's pairs, capped at max_augmented_pairs = 5
        assert by[(style, "nic", "augmented")]["train_pairs_augmented"] == min(5, setup["augmented"]["current"][style])
        assert by[(style, "nic", "original")]["train_pairs_augmented"] == 0
    half = by[("humor", "nic", "augmented@0.5")]["train_pairs_augmented"]
    assert half == -(-min(5, setup["augmented"]["current"]["humor"]) // 2)
    typed = [by[("humor", "nic", f"augmented:{t}")]["train_pairs_augmented"] for t in ("i2t", "t2t")]
    assert sum(typed) == by[("humor", "nic", "augmented")]["train_pairs_augmented"] and min(typed) >= 1
    assert experiment["leakage"]["test_scene_phrases_in_training"] == 0
    assert experiment["leakage"]["test_images_in_training"] == 0
    assert experiment["leakage"]["scene_features_from_scored_references"] == 0
    assert experiment["counts"]["features.dropped_stylized_caption"] >= 1


def test_experiment_report_and_mlflow_runs(setup, experiment) -> None:
    import mlflow

    cfg = setup["cfg"]
    report = Path(experiment["report_dir"])
    text = (report / "report.md").read_text()
    assert "## Table 2" in text and "## Table 5" in text and "## Fig. 5" in text
    assert "| humor | nic | augmented |" in text and "| positive | nic | original |" in text
    assert (report / "table2.png").read_bytes()[:4] == b"\x89PNG" and (report / "fig5_size.png").stat().st_size > 0
    saved = json.loads((report / "experiment.json").read_text())
    assert len(saved["rows"]) == len(experiment["rows"]) and saved["command"] == "erg experiment --conf test"
    assert f"generator {CURRENT} only" in saved["augmented_source"]
    mlflow.set_tracking_uri(cfg.mlflow.tracking_uri)
    client = mlflow.tracking.MlflowClient()
    parent = client.get_run(experiment["run_id"])
    assert parent.data.tags["erg.job"] == "experiment"
    artifacts = {f.path for f in client.list_artifacts(experiment["run_id"], "report")}
    assert {"report/report.md", "report/experiment.json", "report/table2.png", "report/fig5_size.png",
            "report/hypotheses.parquet"} <= artifacts
    captions = pd.read_parquet(report / "hypotheses.parquet")
    per_cell = captions.groupby("variant").size()  # variant: the cell, style/captioner/data
    assert len(per_cell) == len(experiment["rows"])
    for row in experiment["rows"]:
        assert per_cell[f"{row['style']}/{row['captioner']}/{row['variant']}#seed=23"] == row["test_images"]
    assert sorted(m["captions"] for m in experiment["modes"]) == sorted(r["test_images"] for r in experiment["rows"])
    assert "## Most frequent captions" in text
    exp = client.get_experiment_by_name(cfg.mlflow.experiment)
    children = client.search_runs([exp.experiment_id], f"tags.`mlflow.parentRunId` = '{experiment['run_id']}'")
    assert len(children) == len(experiment["rows"])
    for row in experiment["rows"]:
        child = client.get_run(row["run_id"])
        assert child.data.tags["erg.cell"] == f"{row['style']}/{row['captioner']}/{row['variant']}"
        assert child.data.metrics["cider"] == pytest.approx(row["cider"])
        assert child.data.metrics["train_pairs"] == row["train_pairs"]
        # the words each augmented pair adds to its factual source were weighted; original-only cells have none
        assert (child.data.metrics["inserted_words_weighted"] > 0) == (row["train_pairs_augmented"] > 0)
    assert "weigh 3 in the loss (original pairs 1)" in saved["training"]


def test_table2_script_writes_json_and_markdown(setup, experiment, tmp_path: Path) -> None:
    from benchmarks.table2 import write_results

    out = write_results(experiment, tmp_path)
    data = json.loads((tmp_path / "table2.json").read_text())
    assert set(data) >= {"rows", "leakage", "not_measured", "command"}
    assert {(r["style"], r["captioner"], r["variant"]) for r in data["rows"]} == {
        (s, "nic", v) for s in STYLES for v in ("original", "augmented")}
    for row in data["rows"]:
        assert set(row) >= {"style", "captioner", "variant", "bleu1", "bleu3", "meteor", "cider", "cls", "ppl",
                            "train_pairs"}
    assert data["leakage"]["test_scene_phrases_in_training"] == data["leakage"]["test_images_in_training"] == 0
    assert (tmp_path / "table2.md").read_text().startswith("# ERG experiment") and out["json"].endswith("table2.json")


def test_a_stopped_experiment_resumes_without_training_finished_cells_again(spark, setup, experiment, monkeypatch
                                                                              ) -> None:
    """A launch stopped after two of its four cells (as a preempted cluster): the rerun records those two from
    their folders and trains only the other two; a third run reuses all four from MLflow; and every score equals
    that of a run that trains everything again (``experiment.resume: false``)."""
    import importlib

    cells_job = importlib.import_module("jobs.cells")  # where train_cells launches the training
    from jobs.experiment import run_experiment
    from jobs.platform.model_store import model_dir

    cfg = setup["cfg"].model_copy(deep=True)
    cfg.train.epochs = 2  # cells of their own: the fixture's (3 epochs) are not theirs to reuse
    cfg.experiment.table5.enabled = cfg.experiment.fig5.enabled = False
    real = cells_job.run_distributed_many

    def preempted(conf, configs):
        real(conf, configs[:2])
        raise RuntimeError("preempted after two cells")

    monkeypatch.setattr(cells_job, "run_distributed_many", preempted)
    with pytest.raises(RuntimeError, match="preempted"):
        run_experiment(spark, cfg, command="stopped")
    monkeypatch.setattr(cells_job, "run_distributed_many", real)
    cells_root = model_dir(cfg, "experiment_cell", "x").parent
    finished = {p: p.stat().st_mtime_ns for p in cells_root.glob("*/model/train_summary.json")}

    resumed = run_experiment(spark, cfg, command="resumed")
    assert resumed["cell_counts"] == {"cells.reused": 0, "cells.recorded_from_disk": 2, "cells.trained": 2,
                                      "cells.reuse_failed": 0}
    assert {p: p.stat().st_mtime_ns for p in finished} == finished  # not trained again
    again = run_experiment(spark, cfg, command="again")
    assert again["cell_counts"]["cells.reused"] == 4 and again["cell_counts"]["cells.trained"] == 0
    assert all(r["reused"] for r in again["seed_rows"])
    fresh_cfg = cfg.model_copy(deep=True)
    fresh_cfg.experiment.resume = False
    fresh = run_experiment(spark, fresh_cfg, command="uninterrupted")
    assert fresh["cell_counts"]["cells.trained"] == 4 and fresh["cell_counts"]["cells.reused"] == 0

    def table(result):
        return {(r["style"], r["variant"]): tuple(r[m] for m in ("bleu1", "bleu3", "meteor", "cider", "cls",
                                                                  "cls_independent", "ppl", "train_pairs"))
                for r in result["rows"]}

    assert len(table(fresh)) == 4
    assert table(resumed) == table(again) == table(fresh)


def _plant_style_phrases(spark, cfg, stylized) -> None:
    """Each train caption's last two words as its style phrase (what ``erg extract`` leaves)."""
    now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    rows = []
    for r in stylized[stylized["split"] == "train"].itertuples():
        words = r.caption.split()
        mask = [i >= len(words) - 2 for i in range(len(words))]
        rows.append({"scene_id": r.scene_id, "style": r.style, "caption": r.caption, "tokens": words,
                     "importance": [1.0 if m else 0.0 for m in mask], "style_phrase": " ".join(words[-2:]),
                     "phrase_words": words[-2:], "phrase_mask": mask, "content": " ".join(words[:-2]), "layer": 0,
                     "head": 0, "eps": 0.25, "classifier_version": "fixture", "run_id": "fixture", "created_at": now})
    append_rows(spark, cfg, "style_phrases", pd.DataFrame(rows))


def test_graft_ablation_passes_the_filters_and_is_reported_against_erg(spark, setup, experiment) -> None:
    """The graft ablation: ERG's candidates with the retrieved phrase appended, scored by generate's filters, its
    passing pairs trained at (at most) ERG's pair count, and ERG minus it reported per style with its seeds."""
    from jobs.experiment import run_experiment

    cfg = setup["cfg"].model_copy(deep=True)
    _plant_style_phrases(spark, cfg, setup["stylized"])
    cfg.experiment.table5.enabled = cfg.experiment.fig5.enabled = False
    cfg.experiment.ablations.kinds = ["graft"]
    cfg.generate.filters.ppl_max = 1e9  # the fixture's tiny LMs
    cfg.generate.filters.min_content_similarity = -1.0
    result = run_experiment(spark, cfg, command="erg experiment --set experiment.ablations.kinds=[graft]")
    pairs = result["ablations"]["pairs"]["graft"]
    assert set(pairs) == set(STYLES)
    for style, n in pairs.items():
        # all of ERG's candidates pass here (planted), so an ablation tries 1.5 x ERG's pool of them
        assert n["candidates"] == min(setup["augmented"]["current"][style], math.ceil(1.5 * n["erg_pool"]))
        assert n["trained"] == min(n["erg_pool"], n["passed"])  # never more than ERG's pool
    rows = {(r["style"], r["variant"]): r for r in result["rows"]}
    trained = [s for s, n in pairs.items() if n["trained"]]
    assert trained, pairs
    for style in trained:
        assert rows[(style, "ablation:graft")]["train_pairs_augmented"] == pairs[style]["trained"]
    assert {d["style"] for d in result["ablations"]["deltas"]} == set(trained)
    for d in result["ablations"]["deltas"]:
        assert d["variant"] == "augmented" and d["ablation"] == "graft" and d["seeds"] == [23]
        expected = (rows[(d["style"], "augmented")]["cls"] - rows[(d["style"], "ablation:graft")]["cls"]) * 100
        assert d["per_seed"]["delta_cls"] == [pytest.approx(expected)]
    assert "## Ablations" in Path(result["report_dir"], "report.md").read_text()
    assert all(v == 0 for k, v in result["leakage"].items() if k.startswith("ablation_graft."))


def test_random_scene_candidates_take_a_train_scene_of_the_same_style(spark) -> None:
    """Each candidate gets the phrase of one of its style's train scenes, drawn by a hash of its key (the same
    draw every run), spread over the style's scenes, never another style's."""
    from jobs.ablation import candidates_per_style, random_scene_candidates

    base = spark.createDataFrame(
        [(f"q{i}", f"img{i}", None, f"a caption {i}", f"s_{'h' if i % 2 else 'p'}0", "t2t",
          "humor" if i % 2 else "positive", 0.9) for i in range(40)],
        "query_id string, image_id string, image_uri string, factual_caption string, scene_id string, "
        "retrieval_type string, style string, similarity double")
    phrases = spark.createDataFrame(
        [(f"s_h{k}", "humor", f"funny {k}", ["funny", str(k)], [True, True]) for k in range(5)]
        + [(f"s_p{k}", "positive", f"nice {k}", ["nice", str(k)], [True, True]) for k in range(3)],
        "scene_id string, style string, style_phrase string, phrase_tokens array<string>, "
        "phrase_mask array<boolean>")
    drawn = random_scene_candidates(base, phrases).collect()
    assert len(drawn) == 40
    for r in drawn:
        assert r.scene_id.startswith("s_h" if r.style == "humor" else "s_p") and r.style_phrase.split()[0] in (
            "funny", "nice")
    assert len({r.scene_id for r in drawn if r.style == "humor"}) >= 3  # spread, not one scene
    again = {r.query_id: r.scene_id for r in random_scene_candidates(base, phrases).collect()}
    assert again == {r.query_id: r.scene_id for r in drawn}
    # an ablation tries margin x pool / ERG's pass rate candidates, at most all of them
    assert candidates_per_style({"humor": (1000, 500), "positive": (100, 10)}, {"humor": 100, "positive": 50},
                                1.5) == {"humor": 300, "positive": 100}
