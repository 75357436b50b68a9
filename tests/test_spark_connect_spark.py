"""The jobs against a local Spark Connect server (what Databricks serverless and standard-access clusters speak).

pyspark's own Connect server is started with Delta (:mod:`jobs.platform.connect_server`); ``erg run`` runs in a separate
process with ``spark.remote`` set, as a user would run it (a Connect client switches pyspark into Connect mode for
its whole process, so the classic session of these tests stays out of it). There is no SparkContext on the client:
the MERGEs go through SQL and the scene index ships as a file. The tables it leaves are then read here (that a rerun
adds nothing is the same SQL MERGE, tested on the classic session).
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest

from jobs.pipeline import STAGES
from jobs.platform.spark import get_spark
from jobs.platform.tables import table_name
from jobs.platform.tracking import configure_mlflow

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = "t_connect"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _erg(args: list[str], log: Path) -> dict:
    """``erg <args>`` in a child process (its output to ``log``); returns the JSON result it prints last."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open(log, "ab") as out:
        done = subprocess.run([sys.executable, "-m", "jobs.cli", *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=out, timeout=1500)
    text = done.stdout.decode()
    assert done.returncode == 0, f"erg {' '.join(args)} exited {done.returncode}; see {log}\n{text[-2000:]}"
    lines = text.splitlines()
    start = max(i for i, line in enumerate(lines) if line == "{")  # the result, printed last as indented JSON
    return json.loads("\n".join(lines[start:]))


@pytest.fixture(scope="module")
def connect_run(erg_home, tmp_path_factory):
    from jobs.platform.config import load_config
    from jobs.platform.connect_server import start_server, stop_server

    port = _free_port()
    logs = tmp_path_factory.mktemp("connect")
    overrides = [f"tables.schema={SCHEMA}", f"sample.dir={erg_home / 'samples' / SCHEMA}",
                 f"spark.remote=sc://127.0.0.1:{port}"]
    cfg = load_config("test", overrides)
    server = start_server(cfg, port, logs / "server.log")
    try:
        sets = [item for value in overrides for item in ("--set", value)]
        run = _erg(["run", "--conf", "test", "--json", *sets], logs / "run.log")
    finally:
        stop_server(server)
    cfg = load_config("test", overrides[:2])
    configure_mlflow(cfg)  # the runs were logged by the child processes, to the conf's tracking store
    return cfg, run, logs


def test_the_pipeline_runs_on_spark_connect(spark, connect_run):
    cfg, run, _ = connect_run
    parent = run["parent_run_id"]
    children = mlflow.search_runs(filter_string=f"tags.mlflow.parentRunId = '{parent}'", search_all_experiments=True)
    assert sorted(children["tags.erg.job"]) == sorted(STAGES)
    get_spark(cfg)  # the classic session of the tests registers the same tables by their folders
    counts = {t: spark.table(table_name(cfg, t)).count()
              for t in ("stylized_captions", "factual_captions", "style_phrases", "embeddings", "retrievals",
                        "augmented_captions")}
    assert all(n > 0 for n in counts.values()), counts
    assert counts["augmented_captions"] == run["generate"]["candidates"]
    assert run["ingest"]["stylized_captions.inserted"] == counts["stylized_captions"]
    assert spark.table(table_name(cfg, "retrievals")).count() == run["retrieve"]["retrievals.inserted"]


def test_the_scene_index_travels_as_a_file(spark, connect_run):
    cfg, run, _ = connect_run
    first = mlflow.get_run(run["retrieve"]["run_id"]).data.metrics
    assert first["index.transport_file"] == 1.0  # no SparkContext, no broadcast variable
    assert first["retrievals.inserted"] > 0
    assert first["leakage.retrievals_non_train_scene"] == 0
    assert not list((Path(cfg.home) / "scene_indexes").glob("*.pkl"))  # the run removed its index file
