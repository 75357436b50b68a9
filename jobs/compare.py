"""``erg compare``: MLflow runs side by side: the params that differ, the counts, pass rates and metrics, the tags.

Give run ids to compare those runs (in the order given), or a job name (the ``erg.job`` tag every job run
carries) to compare its last ``last`` runs in the conf's experiment, oldest first. With neither, the job of the
newest run in the experiment is taken, so ``erg compare`` right after two ``erg generate`` runs compares them.

The result is a :class:`RunComparison` of pandas DataFrames (one column per run, labelled by its short run id),
which notebooks display and :func:`render` prints as rich tables.
"""
from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd

from jobs.platform.config import ErgConfig
from models.paper_table import TABLE2_METRICS

if TYPE_CHECKING:
    from mlflow.entities import Run
    from mlflow.tracking import MlflowClient
    from rich.console import Console

JOB_TAG = "erg.job"
PARENT_TAG = "mlflow.parentRunId"

# A metric's section: the first whose prefixes start its key; else keys naming a Table 2 metric are evaluation,
# keys ending in "seconds" timings, and the rest counts.
METRIC_SECTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("pass rates", ("pass_rate",)),
    ("classifier", ("classifier.", "head.", "phrase.")),
    ("generator", ("generator.",)),
    ("training", ("train.", "captioner.", "loss", "epoch_loss", "steps", "world_size", "vocab_size", "rows.")),
    ("evaluation", ("evaluate.", "eval.")),
    ("timings", ("stage_seconds.",)),
)
SECTION_ORDER = ("counts", *(name for name, _ in METRIC_SECTIONS))
_JOB_NAME = re.compile(r"[A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class RunComparison:
    """Runs side by side; every frame but ``runs`` has one column per run (labelled as ``runs.index``).

    - ``runs``: one row per run: run_id, run_name, job, conf, status, started (UTC), duration_s, parent_run_id.
    - ``params``: the params whose values differ between the runs (a param one run lacks counts as differing).
    - ``metrics``: every metric's latest value, with a ``section`` (counts, pass rates, classifier, generator,
      training, evaluation, timings) and a ``delta`` (last run minus first run).
    - ``tags``: the ``erg.*`` tags (job, conf, platform, model versions, style head, ...).
    """

    runs: pd.DataFrame
    params: pd.DataFrame
    metrics: pd.DataFrame
    tags: pd.DataFrame

    def sections(self) -> dict[str, pd.DataFrame]:
        """The four frames by title, in print order."""
        return {"runs": self.runs, "params that differ": self.params, "metrics": self.metrics, "tags": self.tags}


def metric_section(key: str) -> str:
    """The section a metric key is shown in (see :data:`METRIC_SECTIONS`)."""
    for name, prefixes in METRIC_SECTIONS:
        if key.startswith(prefixes):
            return name
    if any(metric in key for metric in TABLE2_METRICS):
        return "evaluation"
    if key.endswith("seconds"):
        return "timings"
    return "counts"


def compare(cfg: ErgConfig, run_ids: list[str] | None = None, job: str | None = None, last: int = 2) -> RunComparison:
    """Compare ``run_ids`` (at least two), or the last ``last`` runs of ``job`` in ``cfg``'s MLflow experiment.

    Raises ValueError when both run ids and a job are given, when ``last`` < 2, when a run id is unknown, or when
    the experiment holds fewer than two runs of the job.
    """
    from mlflow.tracking import MlflowClient

    if run_ids and job:
        raise ValueError("give either run ids or a job (compare its last runs), not both")
    if job is not None and not _JOB_NAME.fullmatch(job):
        raise ValueError(f"job {job!r} must be a job name such as generate or extract (letters, digits, '_.-')")
    client = MlflowClient(tracking_uri=cfg.mlflow.tracking_uri, registry_uri=cfg.mlflow.registry_uri)
    if run_ids:
        if len(run_ids) < 2:
            raise ValueError(f"give at least two run ids to compare (given: {run_ids})")
        runs = [_get_run(client, run_id) for run_id in run_ids]
    else:
        if last < 2:
            raise ValueError(f"last must be at least 2 runs to compare (given: {last})")
        runs = _last_runs(client, cfg.mlflow.experiment, job, last)
    return _side_by_side(runs)


def _get_run(client: MlflowClient, run_id: str) -> Run:
    from mlflow.exceptions import MlflowException

    try:
        return client.get_run(run_id)
    except MlflowException as exc:
        raise ValueError(f"run {run_id!r} was not found in the tracking store: {exc.message}") from None


def _last_runs(client: MlflowClient, experiment_name: str, job: str | None, last: int) -> list[Run]:
    experiment = client.get_experiment_by_name(experiment_name)
    if experiment is None:
        raise ValueError(f"MLflow experiment {experiment_name!r} does not exist: run a job first "
                         "(or set mlflow.experiment to the experiment to compare)")
    newest_first = ["attributes.start_time DESC"]
    if job is None:
        newest = client.search_runs([experiment.experiment_id], f"tags.`{JOB_TAG}` LIKE '%'",
                                    order_by=newest_first, max_results=1)
        if not newest:
            raise ValueError(f"experiment {experiment_name!r} holds no erg job runs (tag {JOB_TAG}) to compare")
        job = newest[0].data.tags[JOB_TAG]
    runs = client.search_runs([experiment.experiment_id], f"tags.`{JOB_TAG}` = '{job}'",
                              order_by=newest_first, max_results=last)
    if len(runs) < 2:
        raise ValueError(f"experiment {experiment_name!r} holds {len(runs)} run(s) of job {job!r}; need at least 2 "
                         "to compare (run the job again, or give run ids)")
    return list(reversed(runs))


def _labels(runs: list[Run]) -> list[str]:
    short = [run.info.run_id[:8] for run in runs]
    return short if len(set(short)) == len(short) else [run.info.run_id for run in runs]


def _side_by_side(runs: list[Run]) -> RunComparison:
    labels = _labels(runs)
    summary = pd.DataFrame([_summary(run) for run in runs], index=pd.Index(labels, name="run"))

    params = pd.DataFrame({label: run.data.params for label, run in zip(labels, runs)}, columns=labels)
    params = params[params.nunique(axis=1, dropna=False) > 1].sort_index()
    params.index.name = "param"

    metrics = pd.DataFrame({label: run.data.metrics for label, run in zip(labels, runs)}, columns=labels, dtype=float)
    metrics.insert(0, "section", [metric_section(key) for key in metrics.index])
    metrics["delta"] = metrics[labels[-1]] - metrics[labels[0]]
    metrics.index.name = "metric"
    order = metrics["section"].map(SECTION_ORDER.index)
    metrics = metrics.assign(_order=order).sort_values(["_order", "metric"]).drop(columns="_order")

    tags = pd.DataFrame({label: {k: v for k, v in run.data.tags.items() if k.startswith("erg.")}
                         for label, run in zip(labels, runs)}, columns=labels).sort_index()
    tags.index.name = "tag"
    return RunComparison(runs=summary, params=params, metrics=metrics, tags=tags)


def _summary(run: Run) -> dict[str, object]:
    info, tags = run.info, run.data.tags
    started = dt.datetime.fromtimestamp(info.start_time / 1000, dt.timezone.utc) if info.start_time else None
    duration = (info.end_time - info.start_time) / 1000 if info.end_time and info.start_time else None
    return {"run_id": info.run_id, "run_name": info.run_name, "job": tags.get(JOB_TAG), "conf": tags.get("erg.conf"),
            "status": info.status, "started": started.strftime("%Y-%m-%d %H:%M:%S") if started else None,
            "duration_s": duration, "parent_run_id": tags.get(PARENT_TAG)}


def _cell(value: object, width: int = 60) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.0f}" if value.is_integer() and abs(value) < 1e15 else f"{value:.4g}"
    text = str(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def render(comparison: RunComparison, console: Console | None = None) -> None:
    """Print the comparison as rich tables (runs, params that differ, metrics by section, tags)."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = console or Console()
    for title, frame in comparison.sections().items():
        table = Table(title=title, title_justify="left", show_lines=False)
        table.add_column(frame.index.name or "", style="bold", overflow="fold")
        for column in frame.columns:
            numeric = pd.api.types.is_numeric_dtype(frame[column])
            table.add_column(str(column), overflow="fold", justify="right" if numeric else "left")
        if frame.empty:
            table.add_row("(none)", *["" for _ in frame.columns])
        previous_section = None
        for key, row in frame.iterrows():
            section = row["section"] if "section" in frame.columns else None
            if section != previous_section and previous_section is not None:
                table.add_section()
            previous_section = section
            # Text, not markup: a param value such as "[humor]" is printed as it is
            table.add_row(Text(_cell(key)), *[Text(_cell(value)) for value in row])
        console.print(table)
