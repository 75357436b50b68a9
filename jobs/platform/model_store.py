"""Where trained models live between jobs: a local/Volume folder per run, MLflow artifacts and the registry.

A job that trains a model saves it under ``<home>/models/<schema>/<kind>/<run id>``, logs it to MLflow and records
it as the *current* model of its kind: a version of the registered model ``erg_<kind>`` (``/`` written ``_``; a
Unity Catalog name ``<catalog>.<schema>.erg_<kind>`` on Databricks) carries the MLflow alias ``current``. Where the
job registered the model itself (a transformers classifier or generator, ``mlflow.register_models``), that version
is aliased; otherwise a version whose source is the model's folder is created. The record (paths, version, what the
model was trained with) is written as ``record.json`` under ``<kind>/records/<version>`` and named by the version's
tag ``erg.record``; moving the alias is one registry call, so a crash never leaves half a pointer. Later jobs resolve
``erg_<kind>@current`` and load from the folder, so executors never need MLflow access. Models belong to the tables
they were trained on, hence the schema in the path (and in the Unity Catalog name).
"""
from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from jobs.platform.config import ErgConfig, TablesConf

CURRENT_ALIAS = "current"
DEFAULT_SCHEMA = TablesConf.model_fields["schema_name"].default
RECORD_TAG = "erg.record"


def _root(cfg: ErgConfig, kind: str) -> Path:
    schema = f"{cfg.tables.catalog}.{cfg.tables.schema_name}" if cfg.tables.catalog else cfg.tables.schema_name
    return Path(cfg.home) / "models" / schema / kind


def model_dir(cfg: ErgConfig, kind: str, run_id: str) -> Path:
    return _root(cfg, kind) / run_id


def current_model_name(cfg: ErgConfig, kind: str) -> str:
    """The registered model whose alias ``current`` names the current model of ``kind``."""
    return registered_name(cfg, "erg_" + kind.replace("/", "_"))


def _client(cfg: ErgConfig):
    from mlflow import MlflowClient

    from jobs.platform.mlflow_setup import configure_mlflow

    configure_mlflow(cfg)  # creates the local store's folder; the registry is that store unless conf names one
    return MlflowClient(tracking_uri=cfg.mlflow.tracking_uri, registry_uri=cfg.mlflow.registry_uri)


def set_current(cfg: ErgConfig, kind: str, info: dict[str, Any], registered_version: str | None = None) -> str:
    """Record ``info`` as the current model of ``kind``; returns the registered version the alias now names.

    ``registered_version``: a version of :func:`current_model_name` the job registered itself (its logged model);
    without it, a version whose source is the model's folder (``info["path"]``, else the record's folder) is made.
    """
    import mlflow

    name = current_model_name(cfg, kind)
    record_dir = _root(cfg, kind) / "records" / f"{info.get('version') or 'v'}-{uuid.uuid4().hex[:8]}"
    record_dir.mkdir(parents=True, exist_ok=True)
    record_path = record_dir / "record.json"
    record_path.write_text(json.dumps(info, indent=2, default=str))
    client = _client(cfg)
    if registered_version is None:
        try:
            client.get_registered_model(name)
        except mlflow.exceptions.MlflowException:
            client.create_registered_model(name, description=f"ERG's {kind}; the alias '{CURRENT_ALIAS}' names the "
                                                             f"one later jobs use")
        source = Path(info["path"]) if info.get("path") and Path(str(info["path"])).exists() else record_dir
        active = mlflow.active_run()
        registered_version = client.create_model_version(
            name, source=source.resolve().as_uri(), run_id=active.info.run_id if active else None,
            description=f"{kind} {info.get('version', '')}").version
    client.set_model_version_tag(name, str(registered_version), RECORD_TAG, str(record_path))
    if info.get("version"):
        client.set_model_version_tag(name, str(registered_version), "erg.version", str(info["version"]))
    client.set_registered_model_alias(name, CURRENT_ALIAS, str(registered_version))
    return str(registered_version)


def get_current(cfg: ErgConfig, kind: str) -> dict[str, Any] | None:
    """The record of ``erg_<kind>@current``; None where no model of ``kind`` was recorded yet. A pointer file of
    an older home (``<kind>/current.json``) is registered on first read."""
    import mlflow

    client = _client(cfg)
    try:
        version = client.get_model_version_by_alias(current_model_name(cfg, kind), CURRENT_ALIAS)
    except mlflow.exceptions.MlflowException as error:
        if "RESOURCE_DOES_NOT_EXIST" not in str(error.error_code) and "not found" not in str(error).lower():
            raise
        legacy = _root(cfg, kind) / "current.json"
        if not legacy.exists():
            return None
        info = json.loads(legacy.read_text())
        set_current(cfg, kind, info)
        legacy.replace(legacy.with_suffix(".json.registered"))
        return info
    record = version.tags.get(RECORD_TAG)
    if not record or not Path(record).exists():
        raise RuntimeError(f"{current_model_name(cfg, kind)}@{CURRENT_ALIAS} (version {version.version}) has no "
                           f"readable record ({RECORD_TAG}={record!r}): retrain it (`erg run`) or move the alias "
                           f"to a version with one")
    return json.loads(Path(record).read_text())


def require_current(cfg: ErgConfig, kind: str, job: str) -> dict[str, Any]:
    info = get_current(cfg, kind)
    if info is None:
        raise RuntimeError(f"no trained {kind} under {cfg.home}/models: run `erg {job}` first")
    return info


def registered_name(cfg: ErgConfig, name: str) -> str:
    """``<catalog>.<schema>.erg_style_classifier`` in Unity Catalog; locally ``erg_style_classifier`` for the
    default schema and ``<schema>.erg_style_classifier`` for any other, so that two schemas sharing one MLflow store
    (e.g. ``erg experiment``'s eps sweep, :mod:`jobs.eps_sweep`) never move each other's ``current`` alias."""
    if cfg.mlflow.registry_uri == "databricks-uc" and cfg.tables.catalog:
        return f"{cfg.tables.catalog}.{cfg.tables.schema_name}.{name}"
    if cfg.tables.schema_name != DEFAULT_SCHEMA:
        return f"{cfg.tables.schema_name}.{name}"
    return name


def log_transformers_model(cfg: ErgConfig, model, tokenizer, *, name: str, task: str | None) -> str | None:
    """Log a transformers model + tokenizer to the active MLflow run and register it as ``erg_<name>`` (when conf
    says so); returns the registered version (None when not registered)."""
    import mlflow
    import torch
    import transformers

    info = mlflow.transformers.log_model(
        transformers_model={"model": model, "tokenizer": tokenizer}, name=name, task=task,
        # explicit requirements: inferring them pulls in torchvision, which this stack does not pin
        pip_requirements=[f"transformers=={transformers.__version__}", f"torch=={torch.__version__.split('+')[0]}"],
        registered_model_name=registered_name(cfg, f"erg_{name}") if cfg.mlflow.register_models else None,
    )
    return None if info.registered_model_version is None else str(info.registered_model_version)


def current_aliases(cfg: ErgConfig) -> dict[str, str | None]:
    """Every registered model of ``cfg``'s schema (``erg_<kind>``, named as :func:`registered_name` names it) and
    the version its ``current`` alias names (None: no alias)."""
    import mlflow

    client = _client(cfg)
    prefix = registered_name(cfg, "erg_")

    def search(filter_string: str | None) -> list:
        found, token = [], None
        while True:
            page = client.search_registered_models(filter_string=filter_string, page_token=token)
            found += list(page)
            token = getattr(page, "token", None)
            if not token:
                return found

    try:
        models = search(f"name LIKE '{prefix}%'")
    except mlflow.exceptions.MlflowException:  # a registry without LIKE filters: every model, filtered here
        models = search(None)
    out: dict[str, str | None] = {}
    for model in models:
        # the default schema's prefix "erg_" also begins other schemas' names ("erg_eps0.05.erg_generator")
        if not model.name.startswith(prefix) or "." in model.name[len(prefix):]:
            continue
        aliases = client.get_registered_model(model.name).aliases or {}
        out[model.name] = str(aliases[CURRENT_ALIAS]) if CURRENT_ALIAS in aliases else None
    return out


def point_current(cfg: ErgConfig, name: str, version: str | None) -> None:
    """Move the ``current`` alias of registered model ``name`` to ``version`` (None: remove the alias)."""
    import mlflow

    client = _client(cfg)
    if version is not None:
        client.set_registered_model_alias(name, CURRENT_ALIAS, str(version))
        return
    try:
        client.delete_registered_model_alias(name, CURRENT_ALIAS)
    except mlflow.exceptions.MlflowException:  # no such alias (or model): nothing to remove
        pass
