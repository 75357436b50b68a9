"""Configuration: every shipped conf validates; a bad key or value fails naming the key and what is allowed."""
from __future__ import annotations

import pytest

from jobs.platform.config import ConfigError, load_config, parse_overrides


@pytest.mark.parametrize("name", ["local", "test", "databricks", "conf/shared_data.yaml"])
def test_shipped_confs_validate(name, monkeypatch):
    monkeypatch.setenv("ERG_HOME", "/tmp/erg-conf-test")
    cfg = load_config(name)
    assert cfg.labels[0] == "factual" and set(cfg.labels[1:]) == {"humor", "romantic", "positive", "negative"}
    assert 0 < cfg.extract.eps < 1
    assert cfg.retrieve.min_similarity == 0.6 and cfg.generate.filters.ppl_max == 80


def test_confs_are_overlays_of_the_full_fidelity_schema(monkeypatch):
    import yaml
    from pathlib import Path

    from jobs.platform.config import schema_defaults

    monkeypatch.setenv("ERG_HOME", "/tmp/erg-conf-test")
    conf = Path(__file__).resolve().parents[1] / "conf"
    parents = {p.stem: yaml.safe_load(p.read_text()).get("extends") for p in conf.glob("*.yaml")}
    assert parents == {"local": None, "test": "local", "shared_data": "local", "databricks": None}
    schema = schema_defaults()
    caps = {"generate.max_candidates": schema.generate.max_candidates,
            "generate.max_candidates_per_style": schema.generate.max_candidates_per_style,
            "generate.generator.max_train_pairs": schema.generate.generator.max_train_pairs,
            "extract.head_selection_captions": schema.extract.head_selection_captions,
            "extract.classifier.max_train_captions": schema.extract.classifier.max_train_captions,
            "extract.evaluation.max_train_captions": schema.extract.evaluation.max_train_captions,
            "experiment.max_augmented_pairs": schema.experiment.max_augmented_pairs,
            "spark.shuffle_partitions": schema.spark.shuffle_partitions}
    assert caps == dict.fromkeys(caps), caps
    assert (schema.extract.classifier.name_or_path, schema.embed.encoder.kind, schema.generate.generator.init) == (
        "bert-base-uncased", "clip", "pretrained")
    # the workspace conf changes where things run, not what the models are: its model settings are the schema's
    databricks = load_config("databricks")
    for section in ("extract", "embed", "generate", "experiment"):
        assert getattr(databricks, section) == getattr(schema, section), section
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
    ("retrieve.index.type=kmeans", "retrieve.index.type", "'auto', 'flat', 'ivf', 'hnsw' or 'hnsw_sq8'"),
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
    ("extract.classifier.batch_order=sorted", "extract.classifier.batch_order", "'length_buckets' or 'random'"),
    ("extract.evaluation.precision=fp16", "extract.evaluation.precision", "'fp32' or 'bf16'"),
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


# ------------------------------------------------------------------------------ each default written once
ERG_ENV = {"ERG_HOME": "/tmp/erg-env-home", "ERG_SPARK_MASTER": "local[3]", "ERG_JARS_DIR": "/tmp/erg-env-jars",
           "ERG_CATALOG": "env_catalog", "ERG_SCHEMA": "env_schema", "ERG_DATA": "/tmp/erg-env-data"}


def _leaves(tree: dict, prefix: tuple = ()):
    """(path, value) of every leaf of a conf mapping; a list, an empty mapping or a scalar is a leaf."""
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            yield from _leaves(value, prefix + (key,))
        else:
            yield prefix + (key,), value


def _without(tree: dict, path: tuple) -> dict:
    import copy

    out = copy.deepcopy(tree)
    node = out
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return out


def test_no_conf_leaf_repeats_what_its_parent_gives(tmp_path, monkeypatch):
    """Every leaf of a shipped conf changes the resolved config: deleting it (so that the parent conf, or the
    schema's defaults for a conf without ``extends``, gives that key) gives a different config."""
    import yaml
    from pathlib import Path

    from jobs.platform.config import conf_names

    conf = Path(__file__).resolve().parents[1] / "conf"
    assert conf_names() == ["databricks", "local", "shared_data", "test"]
    trimmed: dict[tuple, Path] = {}
    for name in conf_names():
        raw = yaml.safe_load((conf / f"{name}.yaml").read_text())
        for path, _ in _leaves(raw):
            if path not in (("extends",), ("name",)):
                trimmed[name, path] = tmp_path / f"{name}-{'.'.join(path)}.yaml"
                trimmed[name, path].write_text(yaml.safe_dump({**_without(raw, path), "name": name}))
    changes = dict.fromkeys(trimmed, False)
    # with the environment unset (each ${VAR:-default} takes its default) and set: a leaf such as
    # ${ERG_SCHEMA:-erg} gives the schema's value only while the variable is unset
    for env in ({}, ERG_ENV):
        for var in ERG_ENV:
            monkeypatch.delenv(var, raising=False)
        for var, value in env.items():
            monkeypatch.setenv(var, value)
        resolved = {name: load_config(name).model_dump() for name in conf_names()}
        for (name, path), file in trimmed.items():
            changes[name, path] |= load_config(str(file)).model_dump() != resolved[name]
    repeats = [f"{name}: {'.'.join(path)}" for (name, path), changed in changes.items() if not changed]
    assert not repeats, f"these conf leaves repeat what the parent conf or the schema already gives: {repeats}"


def test_the_schema_holds_the_full_fidelity_defaults(monkeypatch):
    """No base conf: the schema's defaults are the paper's settings, models by name, no caps."""
    from jobs.platform.config import schema_defaults

    monkeypatch.delenv("ERG_HOME", raising=False)
    cfg = schema_defaults()
    assert (cfg.extract.classifier.name_or_path, cfg.extract.classifier.max_length) == ("bert-base-uncased", 64)
    assert cfg.extract.classifier_for("senticap").batch_size == 64 and cfg.extract.classifier_for("senticap").lr == 2e-5
    assert (cfg.embed.encoder.kind, cfg.generate.generator.init, cfg.generate.decoding.strategy) == (
        "clip", "pretrained", "beam")
    assert cfg.train.inserted_word_weight == 4 and cfg.train.epochs == 20
    assert cfg.tables.location == f"{cfg.home}/warehouse"
    assert cfg.mlflow.tracking_uri == f"sqlite:///{cfg.home}/mlflow.db"
    # a conf or override that sets one key of a section keeps the schema's values for the others
    assert load_config("databricks", ["embed.encoder.batch_size=128"]).embed.encoder.name_or_path == \
        "openai/clip-vit-base-patch32"
    # env interpolation in a schema default
    monkeypatch.setenv("ERG_HOME", "/tmp/erg-schema-home")
    monkeypatch.setenv("ERG_SPARK_MASTER", "local[3]")
    cfg = schema_defaults()
    assert cfg.home == "/tmp/erg-schema-home" and cfg.sample.dir == "/tmp/erg-schema-home/sample"
    assert cfg.spark.master == "local[3]"


@pytest.mark.parametrize("name", ["local", "test", "databricks", "conf/shared_data.yaml"])
def test_decoding_and_filter_options_are_the_typed_sections(name, monkeypatch):
    """The generator's keyword arguments and the filter thresholds come from their conf sections whole: each key,
    with its value, once."""
    from jobs.generate import decoding_options, filter_options

    monkeypatch.setenv("ERG_HOME", "/tmp/erg-conf-test")
    cfg = load_config(name, ["generate.decoding.max_new_tokens=33", "generate.filters.max_relatedness_drop=null"])
    d, f = cfg.generate.decoding, cfg.generate.filters
    assert decoding_options(cfg) == {
        "strategy": d.strategy, "num_beams": d.num_beams, "top_p": d.top_p, "temperature": d.temperature,
        "max_new_tokens": 33, "batch_size": d.batch_size, "seed": cfg.generate.generator.seed,
        "no_repeat_ngram_size": d.no_repeat_ngram_size, "repetition_penalty": d.repetition_penalty,
        "constraint": d.constraint, "fast": d.fast}
    assert filter_options(cfg) == {"ppl_max": f.ppl_max, "min_similarity": f.min_similarity,
                                   "min_content_similarity": f.min_content_similarity, "well_formed": f.well_formed,
                                   "max_relatedness_drop": None}


def test_tuning_knobs_are_validated_as_overrides_of_the_conf():
    cfg = load_config("test", ["experiment.tuning.knobs={train.inserted_word_weight: [1, 4], "
                               "train.visual_context.sources: [[descriptions], [tags, descriptions]]}"])
    assert list(cfg.experiment.tuning.knobs) == ["train.inserted_word_weight", "train.visual_context.sources"]
    assert load_config("test").experiment.tuning.knobs == {}  # off in the schema; on in conf/shared_data.yaml
    shared = load_config("conf/shared_data.yaml").experiment.tuning
    assert shared.knobs["train.inserted_word_weight"] == [1, 4] and shared.criterion == "delta_cls"
    cases = [
        # an unknown key: named, with the keys allowed there
        ("{train.inserted_weight: [1, 4]}", ["experiment.tuning.knobs.train.inserted_weight",
                                             "unknown key 'train.inserted_weight'", "inserted_word_weight"]),
        # a value the key's own validation refuses: named, with the key's rule
        ("{train.inserted_word_weight: [1, 0.5]}", ["value 0.5 is not a valid train.inserted_word_weight",
                                                    "greater than or equal to 1"]),
        ("{train.visual_context.sources: [[descriptions], [pixels]]}", ["value ['pixels'] is not a valid"]),
        # a knob that changes the augmented pairs: refused, naming it and what to do instead
        ("{generate.clause_style_sets: [[], [flickrstyle]]}", ["generate.clause_style_sets",
                                                              "changes the augmented pairs",
                                                              "report Table 2 once per value"]),
        ("{extract.eps: [0.1, 0.25]}", ["extract.eps", "changes the augmented pairs"]),
        # fixed before the run
        ("{train.seed: [1, 2]}", ["train.seed", "seeds are fixed before the run"]),
        ("{experiment.max_augmented_pairs: [10, 20]}", ["not sweepable", "fixed before the run"]),
        ("{train.visual_context: [{}, {}]}", ["is a whole section"]),
        ("{train.inserted_word_weight: [4]}", ["at least two different values"]),
    ]
    for knobs, expected in cases:
        with pytest.raises(ConfigError) as err:
            load_config("test", [f"experiment.tuning.knobs={knobs}"])
        for text in expected:
            assert text in str(err.value), (knobs, str(err.value))
    with pytest.raises(ConfigError, match="experiment.tuning.styles \\['funny'\\]"):
        load_config("test", ["experiment.tuning.styles=[funny]"])


def test_with_setting_validates_the_whole_conf():
    from jobs.platform.config import get_setting, with_setting

    cfg = load_config("test", ["experiment.tuning.knobs={train.inserted_word_weight: [1, 4]}"])
    changed = with_setting(cfg, "experiment.hparams.nic.hidden_dim", 64)
    assert changed.experiment.hparams == {"nic": {"hidden_dim": 64}} and cfg.experiment.hparams == {}
    assert get_setting(changed, "experiment.hparams.nic.hidden_dim") == 64
    assert changed.experiment.tuning == cfg.experiment.tuning  # the sweep itself is kept
    with pytest.raises(ConfigError, match="train.epochs"):
        with_setting(cfg, "train.epochs", 0)
