"""``erg extract`` on the sample: classifier logged and registered, head chosen, style_phrases written right."""
from __future__ import annotations

import math

import mlflow
import pytest

from jobs.extract import classifier_splits, extract
from jobs.ingest import ingest
from jobs.model_store import get_current
from jobs.spark import get_spark
from jobs.tables import table_name

pytestmark = pytest.mark.spark


def test_classifier_splits_hold_out_by_split(test_cfg):
    import pandas as pd

    stylized = pd.DataFrame({"caption": [f"a funny dog {i}" for i in range(20)], "style": ["humor", "romantic"] * 10,
                             "split": ["train"] * 16 + ["test"] * 4, "image_id": [f"i{i}" for i in range(20)],
                             "scene_id": [f"s{i}" for i in range(20)]})
    factual = pd.DataFrame({"caption": [f"a dog {i}" for i in range(200)], "image_id": [f"f{i}" for i in range(200)]})
    splits = classifier_splits(stylized, factual, test_cfg)
    train, held = splits["train"], splits["heldout"]
    assert set(train["label"]) == {"humor", "romantic", "factual"}
    assert (train["label"] == "factual").sum() == 8  # about the size of one style
    assert not set(train["text"]) & set(held["text"])
    assert set(held.loc[held["label"] != "factual", "text"]) == {f"a funny dog {i}" for i in range(16, 20)}


def test_extract_writes_style_phrases_and_reruns_incrementally(spark, fresh_cfg):
    cfg = fresh_cfg
    get_spark(cfg)
    ingest(spark, cfg)
    result = extract(spark, cfg)
    n_scenes = spark.table(table_name(cfg, "stylized_captions")).count()
    rows = spark.table(table_name(cfg, "style_phrases")).collect()
    assert len(rows) == n_scenes == result["style_phrases.inserted"]
    current = get_current(cfg, "style_classifier")
    assert current["version"] == result["run_id"]
    for r in rows:
        assert (r.layer, r.head) == (current["layer"], current["head"])
        assert 0 <= r.layer < 6 and 0 <= r.head < 12  # MiniLM: 6 layers x 12 heads
        n = len(r.tokens)
        k = len(r.phrase_words)
        assert k == (min(math.ceil(cfg.extract.eps * n - 1e-9), n - 1) if n >= 2 else 0)
        phrase, content = iter(r.phrase_words), iter(r.content.split())
        rebuilt = [next(phrase) if m else next(content) for m in r.phrase_mask]
        assert rebuilt == list(r.tokens)
        assert len(r.importance) == n and sum(r.importance) <= 1 + 1e-6
        assert r.run_id == result["run_id"] and r.classifier_version == current["version"]

    run = mlflow.get_run(result["run_id"])
    metrics = run.data.metrics
    per_class = {k: v for k, v in metrics.items() if k.startswith("classifier.accuracy/")}
    assert per_class and set(per_class) <= {f"classifier.accuracy/{label}" for label in cfg.labels}
    assert all(0.0 <= v <= 1.0 for v in per_class.values()) and 0.0 <= metrics["classifier.accuracy"] <= 1.0
    assert 0.0 <= metrics["phrase.attention.precision"] <= 1.0
    quality = mlflow.artifacts.load_dict(f"runs:/{result['run_id']}/phrase_quality.json")
    # the baselines pick as many words as the extractor
    assert quality["random"]["n_predicted"] == quality["attention"]["n_predicted"] \
        == quality["lexicon_salience"]["n_predicted"] == quality["lexicon_ctfidf"]["n_predicted"] > 0
    artifacts = {a.path for a in mlflow.MlflowClient().list_artifacts(result["run_id"])}
    assert {"head_confidence.png", "head_selection.json", "table4_importance.html", "table4_importance.png"} <= artifacts
    selection = mlflow.artifacts.load_dict(f"runs:/{result['run_id']}/head_selection.json")
    assert len(selection["confidence"]) == 6 and len(selection["confidence"][0]) == 12
    versions = mlflow.MlflowClient().search_model_versions("name='erg_style_classifier'")
    assert any(v.run_id == result["run_id"] for v in versions)

    again = extract(spark, cfg, incremental=True)
    assert again["scenes_to_extract"] == 0 and again["classifier_version"] == current["version"]
    assert spark.table(table_name(cfg, "style_phrases")).count() == n_scenes
