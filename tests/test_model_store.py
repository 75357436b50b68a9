"""The current model of each kind is resolved through the MLflow registry: alias ``current`` on ``erg_<kind>``."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobs.platform.config import load_config
from jobs.platform.model_store import (CURRENT_ALIAS, RECORD_TAG, current_model_name, get_current, require_current,
                                       set_current)


@pytest.fixture()
def cfg(tmp_path: Path):
    return load_config("test", [f"home={tmp_path}"])


def _client(cfg):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=cfg.mlflow.tracking_uri, registry_uri=cfg.mlflow.registry_uri)


def test_alias_names_the_latest_record_and_keeps_the_older_versions(cfg, tmp_path: Path) -> None:
    assert get_current(cfg, "generator") is None
    with pytest.raises(RuntimeError, match=r"no trained generator .*run `erg generate` first"):
        require_current(cfg, "generator", "generate")
    first_dir, second_dir = tmp_path / "m1", tmp_path / "m2"
    first_dir.mkdir(), second_dir.mkdir()
    v1 = set_current(cfg, "generator", {"path": str(first_dir), "version": "run1", "lm_path": "a"})
    v2 = set_current(cfg, "generator", {"path": str(second_dir), "version": "run2", "lm_path": "b"})
    assert (v1, v2) == ("1", "2")
    assert get_current(cfg, "generator") == {"path": str(second_dir), "version": "run2", "lm_path": "b"}

    client = _client(cfg)
    name = current_model_name(cfg, "generator")
    assert name == "erg_generator"
    aliased = client.get_model_version_by_alias(name, CURRENT_ALIAS)
    assert str(aliased.version) == "2" and aliased.tags["erg.version"] == "run2"
    assert aliased.source == second_dir.resolve().as_uri()
    assert sorted(str(v.version) for v in client.search_model_versions(f"name='{name}'")) == ["1", "2"]

    # rolling back is moving the alias in the registry (UI, API or CLI): later jobs follow it
    client.set_registered_model_alias(name, CURRENT_ALIAS, "1")
    assert get_current(cfg, "generator")["version"] == "run1"


def test_a_version_the_job_registered_itself_is_aliased(cfg, tmp_path: Path) -> None:
    client = _client(cfg)
    name = current_model_name(cfg, "style_classifier/flickrstyle")
    assert name == "erg_style_classifier_flickrstyle"  # the name log_transformers_model registers the classifier as
    client.create_registered_model(name)
    logged = client.create_model_version(name, source=(tmp_path / "logged").as_uri())
    assert set_current(cfg, "style_classifier/flickrstyle", {"version": "r", "styles": ["humor"]},
                       registered_version=logged.version) == str(logged.version)
    assert len(client.search_model_versions(f"name='{name}'")) == 1
    assert get_current(cfg, "style_classifier/flickrstyle") == {"version": "r", "styles": ["humor"]}


def test_pointer_file_of_an_older_home_is_registered_on_first_read(cfg) -> None:
    legacy = Path(cfg.home) / "models" / cfg.tables.schema_name / "captioner_original" / "current.json"
    legacy.parent.mkdir(parents=True)
    legacy.write_text(json.dumps({"version": "old", "styles": ["humor"]}))
    assert get_current(cfg, "captioner_original") == {"version": "old", "styles": ["humor"]}
    assert not legacy.exists() and legacy.with_suffix(".json.registered").exists()
    assert _client(cfg).get_model_version_by_alias("erg_captioner_original", CURRENT_ALIAS).tags["erg.version"] == "old"
    assert get_current(cfg, "captioner_original")["version"] == "old"


def test_a_lost_record_is_an_error_that_names_the_fix(cfg) -> None:
    set_current(cfg, "evaluation_classifiers", {"version": "x"})
    version = _client(cfg).get_model_version_by_alias("erg_evaluation_classifiers", CURRENT_ALIAS)
    Path(version.tags[RECORD_TAG]).unlink()
    with pytest.raises(RuntimeError, match=r"erg_evaluation_classifiers@current .*no readable record.*erg run"):
        get_current(cfg, "evaluation_classifiers")


def test_two_schemas_in_one_store_keep_their_own_current_models(cfg, tmp_path: Path) -> None:
    """A schema other than the default registers its models as ``<schema>.erg_<kind>``: its current generator is
    not the default schema's (erg experiment's eps sweep runs ERG in ``<schema>_eps<eps>`` beside the main one)."""
    other = load_config("test", [f"home={tmp_path}", "tables.schema=erg_eps0p05"])
    assert current_model_name(other, "generator") == "erg_eps0p05.erg_generator"
    set_current(cfg, "generator", {"version": "main"})
    set_current(other, "generator", {"version": "eps"})
    assert get_current(cfg, "generator")["version"] == "main"
    assert get_current(other, "generator")["version"] == "eps"
