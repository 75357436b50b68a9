"""What ``erg`` prints: by default its own lines only (the log file's path once, a line per stage, a short summary
table), with Spark's and MLflow's chatter in the log file under the home; ``--json`` the whole result as JSON;
``--verbose`` the chatter on the terminal. Each run is a fresh process on a fresh home, as a user's."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.platform.console import summary_table

pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parents[1]
CHATTER = re.compile(r"log4j|\bINFO\b|\bWARN\b|WARNING|Using Spark's default|mlflow\.store|Setting default log level")


def _erg(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ERG_HOME": str(home), "PYTHONPATH": str(ROOT)}
    env.pop("ERG_DEBUG", None)
    done = subprocess.run([sys.executable, "-m", "jobs.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def test_default_output_is_quiet_and_ends_with_a_summary_table(tmp_path):
    done = _erg(tmp_path, "ingest", "--conf", "test")
    both = done.stdout + done.stderr
    assert not CHATTER.search(both), both
    logs = [line for line in done.stderr.splitlines() if line.startswith("log: ")]
    assert len(logs) == 1, done.stderr
    log = Path(logs[0].removeprefix("log: "))
    assert log.parent == tmp_path / "logs" and log.is_file()
    text = log.read_text()
    # the chatter is in the file: Spark's log4j banner and MLflow creating its store
    assert "log4j" in text and "Creating initial MLflow database tables" in text, text[:3000]
    # the stage's line, the accounting, and a compact table of what was written
    assert "ingest: " in done.stderr and "every record read is kept" in done.stderr
    table = done.stdout.strip().splitlines()
    assert table[0].split() == ["table", "inserted", "updated", "deleted"], done.stdout
    rows = {line.split()[0]: line.split()[1:] for line in table[2:]}
    assert int(rows["stylized_captions"][0].replace(",", "")) > 0 and "run_id" in rows
    assert len(table) <= 20


def test_json_for_scripts_and_verbose_shows_the_chatter(tmp_path):
    done = _erg(tmp_path, "ingest", "--conf", "test", "--json", "--verbose")
    result = json.loads(done.stdout)
    assert result["stylized_captions.inserted"] > 0 and re.fullmatch(r"[0-9a-f]{32}", result["run_id"])
    assert "log: " not in done.stderr and not (tmp_path / "logs").exists()
    assert "log4j" in done.stderr and "Creating initial MLflow database tables" in done.stderr


def test_summary_table_is_short():
    result = {"run_id": "abc", "stylized_captions.inserted": 318, "stylized_captions.updated": 0,
              "quarantine.inserted": 8, "seconds.read": 1.23, "sources": {"x": {"read": 1}}, "skipped_sources": []}
    lines = summary_table("ingest", result).splitlines()
    assert lines[0].split() == ["table", "inserted", "updated", "deleted"]
    assert lines[2].split() == ["stylized_captions", "318", "0", "0"] and lines[3].split() == ["quarantine", "8", "0",
                                                                                                 "0"]
    assert lines[4].split() == ["run_id", "abc"] and lines[-1] == "(7 values in all: --json prints them)"
