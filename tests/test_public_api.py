"""The public API: ``jobs.<command>`` is the function ``erg <command>`` calls, and ``import jobs`` imports no Spark."""
from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import jobs
from jobs import cli

ROOT = Path(__file__).resolve().parents[1]
STAGE_COMMANDS = ["ingest", "extract", "embed", "retrieve", "generate", "run", "train", "evaluate", "experiment",
                  "sql", "compare"]


def test_every_stage_command_is_exported_under_its_name():
    assert sorted(jobs.COMMANDS) == sorted(STAGE_COMMANDS) and set(jobs.__all__) == set(STAGE_COMMANDS)
    assert set(STAGE_COMMANDS) <= set(cli.COMMANDS)
    for command in STAGE_COMMANDS:
        module, name = jobs.COMMANDS[command]
        function = getattr(jobs, command)
        assert callable(function) and function is getattr(importlib.import_module(module), name), command
        assert command in dir(jobs)
    from jobs import generate, run  # noqa: F401  (from-imports see the same functions)
    assert generate.__name__ == "generate_augmented" and run.__name__ == "run_pipeline"
    # importing a stage module first (as the CLI and the jobs do) leaves the package's name on the function
    code = ("import jobs.ingest; from jobs.ingest import summary_lines; "
            "print(jobs.ingest.__module__, jobs.ingest.__name__)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["jobs.ingest", "ingest"]
    assert importlib.import_module("jobs.ingest").__name__ == "jobs.ingest"  # the module, by its full name


def test_import_jobs_imports_no_spark():
    code = ("import sys, jobs, jobs.platform.config; "
            "print(sorted(m for m in ('pyspark', 'torch', 'mlflow') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


class Called(Exception):
    """Raised by a stand-in for a stage function, so the CLI stops right after calling it."""


@pytest.mark.parametrize("command", STAGE_COMMANDS)
def test_the_cli_calls_the_exported_function(command, monkeypatch, tmp_path):
    """``erg <command>`` calls exactly the function ``jobs.<command>`` names (replaced here by a stand-in)."""
    monkeypatch.setenv("ERG_HOME", str(tmp_path))
    module_name, name = jobs.COMMANDS[command]
    module = importlib.import_module(module_name)
    exported = getattr(jobs, command)
    assert exported is getattr(module, name)
    spark = object()
    calls = []

    def stand_in(*args, **kwargs):
        calls.append((args, kwargs))
        raise Called(command)

    monkeypatch.setattr(module, name, stand_in)
    monkeypatch.setattr(importlib.import_module("jobs.platform.spark"), "get_spark", lambda cfg, **kwargs: spark)
    # the run lock needs a real session: off here, where get_spark hands out a stand-in
    argv = [command, "--conf", "test", "--set", "lock.enabled=false"] + (["SELECT 1", "--engine", "spark"] if command == "sql" else [])  # the Spark path
    with pytest.raises(Called):
        cli.main(argv)
    (args, kwargs), = calls
    assert args[0] is spark or command == "compare"  # compare reads MLflow, no Spark
    assert getattr(jobs, command) is stand_in  # the export is that attribute, looked up when used
