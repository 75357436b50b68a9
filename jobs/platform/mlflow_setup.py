"""Where MLflow logs: the conf's tracking store, model registry and experiment (:func:`configure_mlflow`).

Below every module that talks to MLflow (:mod:`jobs.platform.tracking`, :mod:`jobs.platform.model_store`,
:mod:`jobs.platform.history`), so that none of them imports another only to point MLflow at the store.
"""
from __future__ import annotations

from pathlib import Path

from jobs.platform.config import ErgConfig


def configure_mlflow(cfg: ErgConfig) -> str:
    """Point MLflow at the configured tracking store and experiment; returns the experiment id."""
    import mlflow

    if cfg.platform == "local" and cfg.mlflow.tracking_uri.startswith("sqlite:///"):
        Path(cfg.mlflow.tracking_uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    mlflow.set_tracking_uri(cfg.mlflow.tracking_uri)
    if cfg.mlflow.registry_uri:
        mlflow.set_registry_uri(cfg.mlflow.registry_uri)
    experiment = mlflow.get_experiment_by_name(cfg.mlflow.experiment)
    if experiment is None:
        return mlflow.create_experiment(cfg.mlflow.experiment, artifact_location=cfg.mlflow.artifact_location)
    mlflow.set_experiment(cfg.mlflow.experiment)
    return experiment.experiment_id
