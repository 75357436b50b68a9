"""The shape every job has: a short list of named steps (plan/fit -> apply -> write -> report) that
:func:`run_job` runs inside the job's MLflow run.

What every job repeats lives here once: the MLflow run (a child of ``erg run``'s or ``erg experiment``'s parent
when one is active, :func:`jobs.platform.tracking.job_run`; the parent itself, :func:`parent_run`), the step timing
(``seconds.<step>``, :func:`jobs.platform.tracking.step_seconds`, for the steps marked ``timed``), the counts (gathered
by the steps in :attr:`JobContext.counts`, logged once as metrics), the watermarks of incremental consumers
(:func:`watermark`, :func:`advance_watermark`) and the result the job returns; the stage jobs' shared step helpers
that know ERG (the leakage counts, :func:`jobs.leakage.count_leakage`) live with the jobs, not here.

A step is a function of the :class:`JobContext`: it reads the session, the conf, the run id and what earlier steps
returned (``ctx[name]``), adds to ``ctx.counts`` and returns its output. The logic a step calls takes plain values
(pandas frames, DataFrames, records), so it is testable without a run.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

from pyspark.sql import SparkSession

from jobs.platform.config import ErgConfig
from jobs.platform.tracking import configure_mlflow, job_run, log_counts, step_seconds
from jobs.platform.watermarks import record_version, watermark_version

LAZY_IMPORTS = ("mlflow", "models", "torch", "transformers", "faiss", "petastorm", "streaming", "horovod",
                "pyspark.ml.torch", "rich", "tqdm")
"""The imports the jobs keep inside functions, and why: ``mlflow`` (seconds to import; the CLI's ``--help`` and
the conf checks need none of it), the ``models`` layer and what it loads (torch, transformers, faiss: heavy, and
the driver of a job that does not train needs none of them), the optional training readers and backends
(petastorm, Mosaic ``streaming``, Horovod, TorchDistributor: absent where they are not installed), and the
console helpers (rich, tqdm). Every other import of a job module is at its top
(``tests/test_job_shape.py`` checks the project's)."""


@dataclass
class JobContext:
    """What a step sees: the session, the conf, the MLflow run, and the job's state so far.

    ``counts`` are logged as metrics once, after the last step, and returned; ``metrics`` are logged with them but
    not returned; ``summary`` is returned but not logged; ``out`` holds each earlier step's output by its name.
    """

    spark: SparkSession
    cfg: ErgConfig
    run: Any
    incremental: bool = False
    counts: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    out: dict[str, Any] = field(default_factory=dict)
    cleanups: list[Callable[[], Any]] = field(default_factory=list)

    @property
    def run_id(self) -> str:
        return self.run.info.run_id

    def __getitem__(self, name: str) -> Any:
        return self.out[name]

    def on_exit(self, cleanup: Callable[[], Any]) -> None:
        """Call ``cleanup`` when the job ends, failed or not (e.g. unpersist a cached DataFrame)."""
        self.cleanups.append(cleanup)

    @staticmethod
    def tag(tags: dict[str, str]) -> None:
        """Set MLflow tags on the job's run."""
        import mlflow

        mlflow.set_tags(tags)


@dataclass(frozen=True)
class Step:
    """A named step of a job: ``run(ctx)`` returns its output (``ctx[name]`` for the later steps). ``timed`` adds
    its wall-clock seconds to ``counts["seconds.<name>"]``; ``when(ctx)`` false skips it (no output, no timing)."""

    name: str
    run: Callable[[JobContext], Any]
    timed: bool = False
    when: Optional[Callable[[JobContext], bool]] = None


def run_steps(ctx: JobContext, steps: list[Step] | tuple[Step, ...]) -> JobContext:
    """Run ``steps`` in order on ``ctx``; the cleanups registered with :meth:`JobContext.on_exit` run at the end."""
    try:
        for step in steps:
            if step.when is not None and not step.when(ctx):
                continue
            if step.timed:
                with step_seconds(ctx.counts, step.name):
                    ctx.out[step.name] = step.run(ctx)
            else:
                ctx.out[step.name] = step.run(ctx)
    finally:
        while ctx.cleanups:
            ctx.cleanups.pop()()
    return ctx


def default_result(ctx: JobContext) -> dict[str, Any]:
    """What a job returns unless it says otherwise: its counts, its summary and the run id."""
    return {**ctx.counts, **ctx.summary, "run_id": ctx.run_id}


def run_job(spark: SparkSession, cfg: ErgConfig, job_name: str, steps: list[Step] | tuple[Step, ...], *,
            sections: tuple[str, ...] = (), params: dict | None = None, incremental: bool = False,
            inputs: dict[str, Any] | None = None,
            result: Callable[[JobContext], dict[str, Any]] = default_result,
            record_state: bool = True) -> dict[str, Any]:
    """Open the job's MLflow run (``erg.job`` = ``job_name``; the conf sections and ``params`` as params), run the
    steps (``inputs`` are outputs known before the run, by name), log the counts and metrics once; returns
    ``result(ctx)``. ``record_state``: the job may write tables, watermarks or ``current`` aliases, so the schema's
    state after it is recorded on its run (:func:`jobs.platform.tracking.job_run`)."""
    with job_run(cfg, job_name, sections=sections, params=params, record_state=record_state) as run:
        ctx = JobContext(spark, cfg, run, incremental, out=dict(inputs or {}))
        run_steps(ctx, steps)
        log_counts({**ctx.counts, **ctx.metrics})
        return result(ctx)


@contextlib.contextmanager
def parent_run(cfg: ErgConfig, run_name: str, tags: dict[str, str]) -> Iterator[Any]:
    """The MLflow run of an orchestrator (``erg run``, ``erg experiment``), nested under an active run when there is
    one; its stage jobs' runs are its children."""
    import mlflow

    experiment_id = configure_mlflow(cfg)
    with mlflow.start_run(run_name=run_name, experiment_id=experiment_id, nested=mlflow.active_run() is not None,
                          tags=tags) as run:
        yield run


# ---------------------------------------------------------------------------------- shared step helpers
def watermark(cfg: ErgConfig, consumer: str, table: str) -> int | None:
    """The version of ``table`` that ``consumer`` had read when it last finished (None: never)."""
    return watermark_version(cfg, consumer, table)


def advance_watermark(cfg: ErgConfig, consumer: str, versions: dict[str, int]) -> None:
    """After ``consumer`` succeeded: the table versions it read become its watermark."""
    record_version(cfg, consumer, versions)
