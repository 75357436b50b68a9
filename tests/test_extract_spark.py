"""``erg extract`` on the sample: a classifier and head per style set (train split only), the per-style evaluation
classifiers, both logged and recorded as current, style_phrases written right, incremental rerun."""
from __future__ import annotations

import math

import mlflow
import pytest

from jobs.extract import extract, factual_pool, set_classifier_data
from jobs.ingest import ingest
from jobs.platform.model_store import get_current, registered_name
from jobs.platform.spark import get_spark
from jobs.platform.tables import table_name
from jobs.vocabulary import EVALUATION_CLASSIFIERS, classifier_kind

pytestmark = pytest.mark.spark


def _stylized_frame():
    import pandas as pd

    styles = ["humor", "romantic", "positive", "negative"] * 10
    splits = (["train"] * 6 + ["val"] * 2 + ["test"] * 2) * 4
    return pd.DataFrame({"caption": [f"{style} caption {i} ({split})" for i, (style, split) in
                                     enumerate(zip(styles, splits))],
                         "style": styles, "split": splits, "image_id": [f"i{i}" for i in range(40)],
                         "scene_id": [f"s{i}" for i in range(40)]})


def test_set_classifier_data_has_the_sets_labels_and_no_val_or_test_caption(test_cfg):
    stylized = _stylized_frame()
    for name, styles in test_cfg.style_sets.items():
        data = set_classifier_data(stylized, styles, test_cfg.extract.classifier_for(name))
        train, val = data["train"], data["val"]
        assert set(train["label"]) == set(styles) and set(val["label"]) == set(styles)
        expected = stylized[stylized["style"].isin(styles) & (stylized["split"] == "train")]["caption"]
        assert sorted(train["text"]) == sorted(expected)
        assert all(text.endswith("(val)") for text in val["text"])  # test captions are never used
    capped = test_cfg.extract.classifier_for("flickrstyle").model_copy(update={"max_train_captions": 10})
    train = set_classifier_data(stylized, ["humor", "romantic"], capped)["train"]
    assert train["label"].value_counts().to_dict() == {"humor": 5, "romantic": 5}
    assert all(text.endswith("(train)") for text in train["text"])


def test_factual_pool_skips_val_and_test_images():
    import pandas as pd

    stylized = _stylized_frame()
    factual = pd.DataFrame({"image_id": [f"i{i}" for i in range(40)] + [f"f{i}" for i in range(200)],
                            "caption": [f"a photo of i{i}" for i in range(40)] + [f"a dog {i}" for i in range(200)]})
    pool = factual_pool(stylized, factual, heldout_fraction=0.1)
    held_images = set(stylized.loc[stylized["split"] != "train", "image_id"])
    used = set(pool["train"]) | set(pool["heldout"])
    assert not used & {f"a photo of {i}" for i in held_images}
    assert {f"a photo of {i}" for i in set(stylized["image_id"]) - held_images} <= used
    assert not set(pool["train"]) & set(pool["heldout"]) and 5 <= len(pool["heldout"]) <= 40


def test_extract_writes_style_phrases_and_reruns_incrementally(spark, fresh_cfg):
    cfg = fresh_cfg
    get_spark(cfg)
    ingest(spark, cfg)
    result = extract(spark, cfg)
    n_scenes = spark.table(table_name(cfg, "stylized_captions")).count()
    rows = spark.table(table_name(cfg, "style_phrases")).collect()
    assert len(rows) == n_scenes == result["style_phrases.inserted"]
    currents = {name: get_current(cfg, classifier_kind(name)) for name in cfg.style_sets}
    set_of = {style: name for name, styles in cfg.style_sets.items() for style in styles}
    for name, current in currents.items():
        assert current["version"] == result["run_id"] == result["classifier_versions"][name]
        assert current["styles"] == cfg.style_sets[name]  # one classifier per set, over the set's styles
        from models.style_classifier import StyleClassifier
        clf = StyleClassifier.load(current["path"], device="cpu")
        assert clf.labels == cfg.style_sets[name] and clf.factual_label is None
    for r in rows:
        current = currents[set_of[r.style]]
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
    for name, styles in cfg.style_sets.items():
        per_class = {k for k in metrics if k.startswith(f"classifier.{name}.val_accuracy/")}
        assert per_class <= {f"classifier.{name}.val_accuracy/{style}" for style in styles}
        assert metrics[f"classifier.{name}.train_captions"] > 0
    evaluation = get_current(cfg, EVALUATION_CLASSIFIERS)
    assert evaluation["version"] == result["run_id"] and evaluation["styles"] == cfg.styles
    from models.caption_scoring import load_evaluation_classifiers, score_captions
    scored = score_captions(["a dog on the grass"], ["humor"], load_evaluation_classifiers(evaluation["path"], "cpu"))
    assert 0.0 <= scored["style_probability"].iloc[0] <= 1.0
    assert 0.0 <= metrics["phrase.attention.precision"] <= 1.0
    quality = mlflow.artifacts.load_dict(f"runs:/{result['run_id']}/phrase_quality.json")
    # the baselines pick as many words as the extractor
    assert quality["random"]["n_predicted"] == quality["attention"]["n_predicted"] \
        == quality["lexicon_salience"]["n_predicted"] == quality["lexicon_ctfidf"]["n_predicted"] > 0
    artifacts = {a.path for a in mlflow.MlflowClient().list_artifacts(result["run_id"])}
    assert {"table4_importance.html", "table4_importance.png", EVALUATION_CLASSIFIERS} <= artifacts
    for name in cfg.style_sets:
        assert {f"head_confidence_{name}.png", f"head_selection_{name}.json"} <= artifacts
        selection = mlflow.artifacts.load_dict(f"runs:/{result['run_id']}/head_selection_{name}.json")
        assert len(selection["confidence"]) == 6 and len(selection["confidence"][0]) == 12
        registered = registered_name(cfg, f"erg_style_classifier_{name}")  # <schema>.erg_... in this test's schema
        versions = mlflow.MlflowClient().search_model_versions(f"name='{registered}'")
        assert any(v.run_id == result["run_id"] for v in versions)

    again = extract(spark, cfg, incremental=True)
    assert again["scenes_to_extract"] == 0 and again["classifier_versions"] == result["classifier_versions"]
    assert again["evaluation_classifiers_version"] == result["run_id"]
    assert spark.table(table_name(cfg, "style_phrases")).count() == n_scenes


def test_factual_captions_for_the_classifiers_are_bounded_and_keep_the_stylized_images(spark, fresh_cfg):
    import pandas as pd

    from jobs.extract import read_factual_for_classifiers
    from tests.planted_tables import append_rows

    from jobs.platform.config import load_config

    def capped(cap: int):
        return load_config("test", [f"tables.schema={fresh_cfg.tables.schema_name}",
                                    f"extract.evaluation.max_factual_captions={cap}"])

    cfg = capped(100)
    get_spark(cfg)
    stylized = _stylized_frame()
    planted = {"source": "planted", "ingest_time": pd.Timestamp("2026-01-01")}
    append_rows(spark, cfg, "stylized_captions", stylized.assign(**planted))
    # P: 150 captions of 50 other images, and 2 factual captions of each of the first 5 stylized images
    p = pd.DataFrame({"caption_id": [f"c{i}" for i in range(150)], "image_id": [f"p{i % 50}" for i in range(150)],
                      "caption": [f"a factual caption {i}" for i in range(150)]})
    own = pd.DataFrame({"caption_id": [f"o{i}" for i in range(10)], "image_id": [f"i{i % 5}" for i in range(10)],
                        "caption": [f"the scene of image {i % 5}, take {i}" for i in range(10)]})
    append_rows(spark, cfg, "factual_captions", pd.concat([p, own], ignore_index=True).assign(**planted))

    first = read_factual_for_classifiers(spark, cfg)
    assert first.attrs["factual_captions_sampled"] is True
    assert set(own["caption"]) <= set(first["caption"])  # every caption of a stylized image is kept
    assert (~first["image_id"].str.startswith("i")).sum() == 100  # of P's other 150, the cap
    again = read_factual_for_classifiers(spark, cfg)
    pd.testing.assert_frame_equal(first, again)  # the same captions in every run

    whole = read_factual_for_classifiers(spark, capped(1000))
    assert whole.attrs["factual_captions_sampled"] is False and len(whole) == 160
