"""Configuration: every shipped conf validates; a bad key or value fails naming the key and what is allowed."""
from __future__ import annotations

import pytest

from jobs.config import ConfigError, load_config, parse_overrides


@pytest.mark.parametrize("name", ["base", "local", "test", "databricks", "conf/shared_data.yaml"])
def test_shipped_confs_validate(name, monkeypatch):
    monkeypatch.setenv("ERG_HOME", "/tmp/erg-conf-test")
    cfg = load_config(name)
    assert cfg.labels[0] == "factual" and set(cfg.labels[1:]) == {"humor", "romantic", "positive", "negative"}
    assert 0 < cfg.extract.eps < 1
    assert cfg.retrieve.min_similarity == 0.6 and cfg.generate.filters.ppl_max == 80


def test_confs_are_overlays_of_one_full_fidelity_base(monkeypatch):
    import yaml
    from pathlib import Path

    monkeypatch.setenv("ERG_HOME", "/tmp/erg-conf-test")
    conf = Path(__file__).resolve().parents[1] / "conf"
    parents = {p.stem: yaml.safe_load(p.read_text()).get("extends") for p in conf.glob("*.yaml")}
    assert parents == {"base": None, "local": "base", "test": "local", "shared_data": "local", "databricks": "base"}
    base = load_config("base")
    caps = {"generate.max_candidates": base.generate.max_candidates,
            "generate.max_candidates_per_style": base.generate.max_candidates_per_style,
            "generate.generator.max_train_pairs": base.generate.generator.max_train_pairs,
            "extract.head_selection_captions": base.extract.head_selection_captions,
            "extract.classifier.max_train_captions": base.extract.classifier.max_train_captions,
            "extract.evaluation.max_train_captions": base.extract.evaluation.max_train_captions,
            "experiment.max_augmented_pairs": base.experiment.max_augmented_pairs,
            "spark.shuffle_partitions": base.spark.shuffle_partitions}
    assert caps == dict.fromkeys(caps), caps
    assert (base.extract.classifier.name_or_path, base.embed.encoder.kind, base.generate.generator.init) == (
        "bert-base-uncased", "clip", "pretrained")
    # the workspace conf changes where things run, not what the models are: its model settings are the base's
    databricks = load_config("databricks")
    for section in ("extract", "embed", "generate", "experiment"):
        assert getattr(databricks, section) == getattr(base, section), section
    assert databricks.generate.generator.config_overrides == {}  # local's word-level shape is not inherited
    local = load_config("local")
    assert local.generate.max_candidates == 400 and local.spark.shuffle_partitions == 4


def test_local_paths_and_interpolation(monkeypatch, tmp_path):
    monkeypatch.setenv("ERG_HOME", str(tmp_path))
    cfg = load_config("local")
    assert cfg.home == str(tmp_path)
    assert cfg.tables.location == f"{tmp_path}/warehouse"
    assert cfg.mlflow.tracking_uri == f"sqlite:///{tmp_path}/mlflow.db"
    assert cfg.tables.catalog is None and cfg.tables.schema_name == "erg"


def test_databricks_uses_unity_catalog(monkeypatch):
    monkeypatch.setenv("ERG_CATALOG", "prod_cat")
    cfg = load_config("databricks")
    assert cfg.platform == "databricks" and cfg.tables.catalog == "prod_cat" and cfg.tables.location is None
    assert cfg.mlflow.tracking_uri == "databricks" and cfg.mlflow.registry_uri == "databricks-uc"
    assert cfg.extract.classifier.name_or_path == "bert-base-uncased"


def test_overrides_parse_yaml_scalars():
    assert parse_overrides(["extract.eps=0.3", "retrieve.types=[t2t]", "spark.master=local[2]"]) == {
        "extract": {"eps": 0.3}, "retrieve": {"types": ["t2t"]}, "spark": {"master": "local[2]"}}
    assert load_config("test", ["extract.eps=0.3"]).extract.eps == 0.3


@pytest.mark.parametrize("override, key, allowed", [
    ("extract.eps=1.5", "extract.eps", "less than 1"),
    ("retrieve.index.type=kmeans", "retrieve.index.type", "'auto', 'flat', 'ivf' or 'hnsw'"),
    ("retrieve.index.target_recall=1.5", "retrieve.index.target_recall", "less than or equal to 1"),
    ("retrieve.index.target_recall=0", "retrieve.index.target_recall", "greater than 0"),
    ("retrieve.index.min_speedup=-1", "retrieve.index.min_speedup", "greater than or equal to 0"),
    ("retrieve.index.tune_queries=5", "retrieve.index.tune_queries", "greater than or equal to 10"),
    ("retrieve.types=[x2y]", "retrieve.types.0", "'i2i', 'i2t', 't2i' or 't2t'"),
    ("generate.filters.ppl_max=-3", "generate.filters.ppl_max", "greater than 0"),
    ("styles=[Humor]", "styles", "lower-case"),
    ("styles=[factual, humor]", "(top level)", "must not also be one of styles"),
    ("tables.schema=1bad-name", "tables.schema", "SQL identifier"),
    ("generate.filters.max_relatedness_drop=1.5", "generate.filters.max_relatedness_drop", "less than or equal to 1"),
    ("visual_relatedness.label_mode=mean", "visual_relatedness.label_mode", "'joint' or 'per_label'"),
    ("visual_relatedness.top_labels=0", "visual_relatedness.top_labels", "greater than or equal to 1"),
    ("evaluate.beam_size=1", "evaluate.beam_size", "greater than or equal to 2"),
])
def test_bad_value_names_key_and_allowed(override, key, allowed):
    with pytest.raises(ConfigError) as err:
        load_config("test", [override])
    assert f"'{key}'" in str(err.value) and allowed in str(err.value)


def test_auto_index_defaults():
    index = load_config("local").retrieve.index
    assert (index.type, index.target_recall, index.exact_max_items, index.tune_queries, index.min_speedup) == (
        "auto", 0.95, 50_000, 2000, 2.0)
    assert load_config("test", ["retrieve.index.target_recall=0.99"]).retrieve.index.target_recall == 0.99


def test_visual_relatedness_defaults_and_off_switch():
    cfg = load_config("test")
    assert cfg.generate.filters.max_relatedness_drop == 0.15
    assert (cfg.visual_relatedness.encoder, cfg.visual_relatedness.label_mode, cfg.visual_relatedness.top_labels) == (
        "all-MiniLM-L6-v2", "joint", 3)
    assert load_config("test", ["generate.filters.max_relatedness_drop=null"]).generate.filters.max_relatedness_drop \
        is None


def test_unknown_key_lists_allowed_keys():
    with pytest.raises(ConfigError) as err:
        load_config("test", ["extract.epz=0.3"])
    message = str(err.value)
    assert "unknown key 'extract.epz'" in message and "eps" in message and "classifier" in message


def test_flickrstyle_source_needs_style_and_names():
    with pytest.raises(ConfigError, match="needs 'style'"):
        load_config("test", ["ingest.sources=[{format: flickrstyle, path: x.txt}]"])


def test_unknown_conf_and_unset_env(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="unknown conf 'nope'"):
        load_config("nope")
    bad = tmp_path / "bad.yaml"
    bad.write_text("extends: local\nname: bad\nhome: ${ERG_SURELY_UNSET_VAR}\n")
    monkeypatch.delenv("ERG_SURELY_UNSET_VAR", raising=False)
    with pytest.raises(ConfigError, match="ERG_SURELY_UNSET_VAR"):
        load_config(str(bad))
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(str(broken))


def test_clause_style_sets_name_real_sets_and_map_to_their_styles():
    cfg = load_config("test", ["generate.clause_style_sets=[flickrstyle]", "generate.max_clause_words=6"])
    assert cfg.clause_words() == {"humor": 6, "romantic": 6}
    assert load_config("test").clause_words() == {}
    with pytest.raises(ConfigError, match="clause_style_sets names \\['flickr'\\].*sets are"):
        load_config("test", ["generate.clause_style_sets=[flickr]"])
    with pytest.raises(ConfigError, match="needs generate.min_phrase_propensity"):
        load_config("test", ["generate.clause_style_sets=[flickrstyle]", "generate.min_phrase_propensity=null"])


def test_embed_spreads_its_items_over_the_task_slots_unless_told() -> None:
    from jobs.embed import EMBED_TASK_MIN_ITEMS, embed_tasks

    cfg = load_config("local")
    assert cfg.embed.partitions is None
    # a million captions on 2 slots: 4 tasks (AQE alone had coalesced them into one)
    assert embed_tasks(cfg, slots=2, items=955_000) == 4
    assert embed_tasks(cfg, slots=64, items=955_000) == 128
    # a handful of items stays one task (each task loads the encoder once per worker)
    assert embed_tasks(cfg, slots=8, items=EMBED_TASK_MIN_ITEMS - 1) == 1
    assert embed_tasks(cfg, slots=8, items=3 * EMBED_TASK_MIN_ITEMS) == 4
    assert embed_tasks(load_config("local", {"embed": {"partitions": 3}}), slots=8, items=10**6) == 3
