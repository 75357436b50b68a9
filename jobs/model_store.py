"""Where trained models live between jobs: a local/Volume folder per run, MLflow artifacts and the registry.

A job that trains a model saves it under ``<home>/models/<schema>/<kind>/<run id>``, logs and registers it in
MLflow, and records it as the *current* model of that kind in ``.../<kind>/current.json``; later jobs (and the
UDFs on executors) load it from that folder, so executors never need MLflow access. Models belong to the tables
they were trained on, hence the schema in the path.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jobs.config import ErgConfig


def _root(cfg: ErgConfig, kind: str) -> Path:
    schema = f"{cfg.tables.catalog}.{cfg.tables.schema_name}" if cfg.tables.catalog else cfg.tables.schema_name
    return Path(cfg.home) / "models" / schema / kind


def model_dir(cfg: ErgConfig, kind: str, run_id: str) -> Path:
    return _root(cfg, kind) / run_id


def set_current(cfg: ErgConfig, kind: str, info: dict[str, Any]) -> None:
    path = _root(cfg, kind) / "current.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(info, indent=2, default=str))
    tmp.replace(path)  # atomic: a crash never leaves half a pointer


def get_current(cfg: ErgConfig, kind: str) -> dict[str, Any] | None:
    path = _root(cfg, kind) / "current.json"
    return json.loads(path.read_text()) if path.exists() else None


def require_current(cfg: ErgConfig, kind: str, job: str) -> dict[str, Any]:
    info = get_current(cfg, kind)
    if info is None:
        raise RuntimeError(f"no trained {kind} under {cfg.home}/models: run `erg {job}` first")
    return info


def registered_name(cfg: ErgConfig, name: str) -> str:
    """``erg_style_classifier`` locally; ``<catalog>.<schema>.erg_style_classifier`` in Unity Catalog."""
    if cfg.mlflow.registry_uri == "databricks-uc" and cfg.tables.catalog:
        return f"{cfg.tables.catalog}.{cfg.tables.schema_name}.{name}"
    return name


def log_transformers_model(cfg: ErgConfig, model, tokenizer, *, name: str, task: str | None) -> str | None:
    """Log a transformers model + tokenizer to the active MLflow run and register it (when conf says so)."""
    import mlflow
    import torch
    import transformers

    info = mlflow.transformers.log_model(
        transformers_model={"model": model, "tokenizer": tokenizer}, name=name, task=task,
        # explicit requirements: inferring them pulls in torchvision, which this stack does not pin
        pip_requirements=[f"transformers=={transformers.__version__}", f"torch=={torch.__version__.split('+')[0]}"],
        registered_model_name=registered_name(cfg, f"erg_{name}") if cfg.mlflow.register_models else None,
    )
    return info.model_uri
