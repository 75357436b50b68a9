"""MLflow: one run per job (child runs under ``erg run``'s parent), params, counts, and the run id for rows."""
from __future__ import annotations

import contextlib
import json
import time
from typing import Any, Iterator

from jobs.platform.config import ErgConfig
from jobs.platform.mlflow_setup import configure_mlflow


def flatten(prefix: str, value: Any) -> dict[str, str]:
    """Nested config -> {"extract.eps": "0.25", ...} (lists as JSON), for mlflow.log_params."""
    if hasattr(value, "model_dump"):
        value = value.model_dump(by_alias=True)
    if isinstance(value, dict):
        out: dict[str, str] = {}
        for key, item in value.items():
            out.update(flatten(f"{prefix}.{key}" if prefix else str(key), item))
        return out
    text = json.dumps(value, default=str) if isinstance(value, (list, tuple)) else str(value)
    return {prefix: text[:6000]}


@contextlib.contextmanager
def job_run(cfg: ErgConfig, job: str, *, sections: tuple[str, ...] = (), params: dict | None = None,
            record_state: bool = True) -> Iterator[Any]:
    """An MLflow run for one job, nested under the active run (``erg run``'s parent) when there is one.

    Logs the conf name, the given config sections and extra params; tags ``erg.job`` and ``erg.schema``. Yields the
    run. With ``record_state`` (a job that may write tables, watermarks or ``current`` aliases), a job that finishes
    records the schema's state after it on the run (:func:`jobs.platform.state.record_state`: what ``erg restore``
    reads).
    """
    import mlflow

    from jobs.platform.state import SCHEMA_TAG, schema_key

    experiment_id = configure_mlflow(cfg)
    nested = mlflow.active_run() is not None
    with mlflow.start_run(run_name=job, nested=nested, experiment_id=experiment_id,
                          tags={"erg.job": job, "erg.conf": cfg.name, "erg.platform": cfg.platform,
                                SCHEMA_TAG: schema_key(cfg)}) as run:
        logged = {"conf": cfg.name, "styles": json.dumps(cfg.styles)}
        for section in sections:
            logged.update(flatten(section, getattr(cfg, section)))
        logged.update({k: str(v) for k, v in (params or {}).items()})
        items = list(logged.items())
        for start in range(0, len(items), 100):
            mlflow.log_params(dict(items[start:start + 100]))
        with recording(cfg, run.info.run_id, record_state):
            yield run


@contextlib.contextmanager
def recording(cfg: ErgConfig, run_id: str, enabled: bool = True) -> Iterator[None]:
    """Around a writing job's work: names its run in the schema's lock row (:mod:`jobs.platform.lock`) and, when the
    block finishes, records the schema's state after it on the run (:func:`jobs.platform.state.record_state`)."""
    if not enabled:
        yield
        return
    from jobs.platform.lock import note_run
    from jobs.platform.spark import get_spark
    from jobs.platform.state import record_state, table_versions

    note_run(cfg, run_id)
    spark = get_spark(cfg)
    before = table_versions(spark, cfg)
    yield
    record_state(spark, cfg, run_id, before)


@contextlib.contextmanager
def step_seconds(counts: dict[str, float], step: str) -> Iterator[None]:
    """Add the wall-clock seconds of the block to ``counts["seconds.<step>"]`` (Spark actions in the block included;
    lazy work runs in the step whose action triggers it)."""
    started = time.perf_counter()
    try:
        yield
    finally:
        counts[f"seconds.{step}"] = counts.get(f"seconds.{step}", 0.0) + time.perf_counter() - started


def log_counts(counts: dict[str, float], step: int | None = None) -> None:
    import mlflow

    clean = {k.replace(" ", "_"): float(v) for k, v in counts.items() if v is not None}
    if clean:
        mlflow.log_metrics(clean, step=step)


class StepLogger:
    """A callback ``on_step(step, metrics)`` for model-layer training loops: metrics per step into MLflow and a
    tqdm bar on the driver. Use as a context manager so the bar closes."""

    def __init__(self, prefix: str, total: int | None = None, every: int = 1, show: bool = True) -> None:
        from tqdm.auto import tqdm

        self.prefix, self.every = prefix, max(1, every)
        self.bar = tqdm(total=total, desc=prefix, unit="step", disable=not show, leave=False)

    def __call__(self, step: int, metrics: dict) -> None:
        import mlflow

        self.bar.update(step - self.bar.n)
        if "loss" in metrics:
            self.bar.set_postfix(loss=f"{float(metrics['loss']):.4f}")
        if step % self.every == 0:
            mlflow.log_metrics({f"{self.prefix}.{k}": float(v) for k, v in metrics.items()}, step=step)

    def __enter__(self) -> "StepLogger":
        return self

    def __exit__(self, *exc) -> None:
        self.bar.close()
