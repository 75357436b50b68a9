"""The Asset Bundle validated against the Databricks CLI's own JSON schema (v1.13.0, ``databricks bundle schema``).

databricks.yml and the files its ``include:`` globs match are merged into one document as the CLI merges them
(mappings key by key, sequences appended, a later scalar wins; a resource defined twice is an error) and validated
with python-jsonschema (Draft 2020-12) against ``../shared/schemas/databricks-bundle-v1.13.0.json``. As that
folder's README says, the schema's ``\\p{L}`` / ``\\p{N}`` classes (which Python's ``re`` lacks) are rewritten
before compiling: ``[\\p{L}\\p{N}]`` -> ``[^\\W_]``, then ``\\p{L}`` -> ``[^\\W\\d_]`` and ``\\p{N}`` -> ``\\d``.
Skipped, saying so, where the schema file is absent.
"""
from __future__ import annotations

import copy
import functools
import json
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT.parent / "shared" / "schemas" / "databricks-bundle-v1.13.0.json"
# (the order matters: rewriting \p{L} first would leave a set nested in a set)
PATTERN_REWRITES = ((r"[\p{L}\p{N}]", r"[^\W_]"), (r"\p{L}", r"[^\W\d_]"), (r"\p{N}", r"\d"))


def _rewrite_patterns(node):
    """The schema with every ``pattern`` and ``patternProperties`` key rewritten for Python's ``re``."""
    if isinstance(node, list):
        return [_rewrite_patterns(item) for item in node]
    if not isinstance(node, dict):
        return node

    def rewrite(pattern: str) -> str:
        for old, new in PATTERN_REWRITES:
            pattern = pattern.replace(old, new)
        return pattern

    out = {}
    for key, value in node.items():
        if key == "pattern" and isinstance(value, str):
            out[key] = rewrite(value)
        elif key == "patternProperties" and isinstance(value, dict):
            out[key] = {rewrite(k): _rewrite_patterns(v) for k, v in value.items()}
        else:
            out[key] = _rewrite_patterns(value)
    return out


@functools.cache
def _validator():
    if not SCHEMA.is_file():
        pytest.skip(f"the Databricks CLI's bundle schema is not at {SCHEMA} (see ../shared/schemas/README.md); "
                    "the bundle is not validated against it here")
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is in the test extra: pip install -e '.[test]'")
    schema = _rewrite_patterns(json.loads(SCHEMA.read_text()))
    assert "\\p{" not in json.dumps(schema), "a \\p{...} class survived the rewrite"
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _merge(base, other):
    """``other`` merged into ``base`` as the CLI merges an included file: mappings key by key, sequences appended,
    scalars overridden."""
    if isinstance(base, dict) and isinstance(other, dict):
        out = dict(base)
        for key, value in other.items():
            out[key] = _merge(base[key], value) if key in base else value
        return out
    if isinstance(base, list) and isinstance(other, list):
        return base + other
    return other


def merged_bundle() -> dict:
    """databricks.yml with every file its ``include:`` globs match merged in."""
    bundle = yaml.safe_load((ROOT / "databricks.yml").read_text())
    for pattern in bundle.get("include", []):
        files = sorted(ROOT.glob(pattern))
        assert files, f"include {pattern!r} matches no file"
        for path in files:
            part = yaml.safe_load(path.read_text()) or {}
            assert "include" not in part, f"{path.name}: only databricks.yml may include files"
            for kind, defined in part.get("resources", {}).items():
                twice = set(defined) & set(bundle.get("resources", {}).get(kind, {}))
                assert not twice, f"{path.name}: resources.{kind} {sorted(twice)} defined twice"
            bundle = _merge(bundle, part)
    return bundle


def _messages(errors) -> list[str]:
    """Every message of the errors, with those of the branches of a oneOf/anyOf under them."""
    out = []
    for error in errors:
        out.append(f"{error.json_path}: {error.message}")
        out += _messages(error.context or [])
    return out


def test_bundle_validates_against_the_databricks_cli_schema():
    validator = _validator()
    bundle = merged_bundle()
    assert set(bundle["resources"]["jobs"]) == {"erg_pipeline", "erg_incremental", "erg_experiment"}
    assert set(bundle["targets"]) == {"dev", "prod"}
    errors = list(validator.iter_errors(bundle))
    assert not errors, "the bundle fails the Databricks CLI's schema:\n" + "\n".join(_messages(errors))


@pytest.mark.parametrize("path, key, typo", [
    (("resources", "jobs", "erg_pipeline"), "tasks", "taskz"),
    (("resources", "jobs", "erg_pipeline"), "max_concurrent_runs", "max_concurent_runs"),
    (("resources", "jobs", "erg_pipeline", "job_clusters", 0, "new_cluster"), "spark_version", "spark_verison"),
    (("resources", "jobs", "erg_pipeline", "tasks", 0, "python_wheel_task"), "entry_point", "entrypoint"),
    (("targets", "prod"), "mode", "mdoe"),
])
def test_a_misspelt_key_is_rejected(path, key, typo):
    validator = _validator()
    bundle = copy.deepcopy(merged_bundle())
    node = bundle
    for step in path:
        node = node[step]
    node[typo] = node.pop(key)
    messages = _messages(validator.iter_errors(bundle))
    assert messages, f"{typo!r} for {key!r} passed the schema"
    assert any(f"'{typo}' was unexpected" in message for message in messages), messages
