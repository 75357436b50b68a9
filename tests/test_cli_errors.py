"""User errors at the CLI: a bad conf, a bad input file, a missing table, a step run before the one it needs. Each
is one or two lines on stderr (the problem, then the fix) and exit status 2; the traceback only with --debug."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.cli import main
from jobs.platform.errors import MissingStepError, as_user_error
from readers.errors import InputFileError

REPO = Path(__file__).resolve().parents[1]


def _user_error(capsys, argv: list[str]) -> list[str]:
    """Run ``erg <argv>`` in this process; assert exit status 2 and at most two lines; return them."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    everything = capsys.readouterr().err
    assert "Traceback" not in everything, everything
    lines = [line for line in everything.splitlines() if line.strip()]
    # progress logged before the error (e.g. MLflow creating its store) may come first; the error is the end
    first = next(i for i, line in enumerate(lines) if line.startswith(f"erg {argv[0]}: "))
    err = lines[first:]
    assert 1 <= len(err) <= 2, err
    return err


def test_bad_conf_in_a_fresh_process():
    """The real entry point: exit status 2, the key named, no traceback (no Spark is started for this)."""
    proc = subprocess.run([sys.executable, "-m", "jobs.cli", "extract", "--conf", "test", "--set", "extract.eps=2"],
                          cwd=REPO, capture_output=True, text=True, timeout=120, env={**os.environ})
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2 and "key 'extract.eps'" in lines[0] and lines[1].strip().startswith("fix:"), lines
    proc = subprocess.run([sys.executable, "-m", "jobs.cli", "ingest", "--conf", "nope.yaml"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip() == "erg ingest: configuration file nope.yaml does not exist"


def test_bad_conf_and_debug(capsys):
    err = _user_error(capsys, ["ingest", "--conf", "test", "--set", "spark.bogus=1"])
    assert "unknown key 'spark.bogus'" in err[0] and err[1].startswith("  fix:")
    with pytest.raises(Exception, match="spark.bogus"):  # --debug: the exception itself, with its traceback
        main(["ingest", "--conf", "test", "--set", "spark.bogus=1", "--debug"])


@pytest.mark.spark
def test_bad_input_file(spark, erg_home, tmp_path, capsys):
    cut = tmp_path / "senticap.json"
    cut.write_text('{"images": [{"filename": "COCO_val2014_000000000001.jpg", "sentences": [{"raw": "a d')
    sources = json.dumps([{"format": "senticap_json", "path": str(cut)}])
    argv = ["ingest", "--conf", "test", "--set", "tables.schema=t_cli_empty", "--set", f"ingest.sources={sources}"]
    err = _user_error(capsys, argv)
    assert f"{cut}: not valid JSON" in err[0] and "cut short" in err[0] and "fix:" in err[1]
    with pytest.raises(InputFileError):
        main(argv + ["--debug"])
    # files paired by position whose counts differ: both files and both counts named
    (tmp_path / "funny.txt").write_text("a dog .\na cat .\na bird .\n")
    (tmp_path / "names.txt").write_text("1_a.jpg\n2_b.jpg\n")
    sources = json.dumps([{"format": "flickrstyle", "style": "humor", "path": str(tmp_path / "funny.txt"),
                           "image_names": str(tmp_path / "names.txt")}])
    err = _user_error(capsys, ["ingest", "--conf", "test", "--set", "tables.schema=t_cli_empty",
                               "--set", f"ingest.sources={sources}"])
    assert f"{tmp_path / 'funny.txt'} has 3 lines but {tmp_path / 'names.txt'} has 2" in err[0]
    assert "on_misaligned: quarantine" in err[1]
    missing = json.dumps([{"format": "flickr30k_tokens", "path": str(tmp_path / "nope.token")}])
    err = _user_error(capsys, ["ingest", "--conf", "test", "--set", "tables.schema=t_cli_empty",
                               "--set", f"ingest.sources={missing}"])
    assert f"{tmp_path / 'nope.token'}: no such file" in err[0]


@pytest.mark.spark
def test_missing_table_and_bad_sql(spark, erg_home, capsys):
    err = _user_error(capsys, ["sql", "--conf", "test", "SELECT * FROM erg.no_such_table"])
    assert "no_such_table" in err[0] and "SHOW TABLES" in err[1]
    err = _user_error(capsys, ["sql", "--conf", "test", "SELEKT 1"])
    assert err[0].startswith("erg sql: SQL syntax error")
    err = _user_error(capsys, ["sql", "--conf", "test", "SELECT no_such_column FROM erg.quarantine"])
    assert err[0].startswith("erg sql: SQL error") and "no_such_column" in err[0]


@pytest.mark.spark
def test_step_run_before_the_one_it_needs(spark, erg_home, capsys):
    schema = ["--set", "tables.schema=t_cli_empty"]
    err = _user_error(capsys, ["extract", "--conf", "test", *schema])
    assert "stylized_captions is empty" in err[0] and err[1] == "  fix: run `erg ingest` first"
    err = _user_error(capsys, ["retrieve", "--conf", "test", *schema])
    assert "run `erg embed` first" in err[1]
    err = _user_error(capsys, ["generate", "--conf", "test", "--incremental", *schema])
    assert "fix: run `erg extract` first" in err[1]


def test_what_counts_as_a_user_error():
    step = as_user_error(RuntimeError("style_phrases is empty: run `erg extract` first"))
    assert isinstance(step, MissingStepError) and step.lines() == ["style_phrases is empty", "fix: run `erg extract` first"]
    step = as_user_error(RuntimeError("no pairs {'a': 1}; run `erg ingest` and `erg embed` first"))
    assert step.lines() == ["no pairs {'a': 1}", "fix: run `erg ingest` and `erg embed` first"]
    step = as_user_error(ValueError("no trained captioner under /h: run `erg train` with\n x=1 first"))
    assert step.fix == "run `erg train` with x=1 first"
    assert as_user_error(RuntimeError("a bug")) is None and as_user_error(KeyError("x")) is None
    assert as_user_error(FileNotFoundError(2, "No such file", "/x/y")).problem == "/x/y: no such file or folder"
    error = InputFileError("f.txt: bad", "fix it")
    assert as_user_error(error) is error and error.lines() == ["f.txt: bad", "fix: fix it"]


def test_delta_concurrent_commit_is_a_user_error():
    """Delta refusing a commit because another writer committed first: exit 2 with the table named, not a trace."""
    class Py4JJavaError(Exception):
        pass

    trace = ("An error occurred while calling o412.sql.\n: io.delta.exceptions.ConcurrentAppendException: "
             "[DELTA_CONCURRENT_APPEND.WITH_PARTITION_HINT] ConcurrentAppendException: Files were added to the root "
             "of the table by a concurrent update. a concurrent MERGE added data to table erg.stylized_captions.\n"
             "\tat org.apache.spark.sql.delta.ConflictChecker.checkForAddedFilesThatShouldHaveBeenReadByCurrentTxn")
    error = as_user_error(Py4JJavaError(trace))
    assert error is not None and len(error.lines()) == 2
    assert error.lines()[0].startswith("another writer committed to erg.stylized_captions while this job ran "
                                       "(ConcurrentAppendException)")
    assert "rerun" in error.fix
    assert as_user_error(RuntimeError("MetadataChangedException: the metadata of the Delta table has been changed")) \
        is not None
    assert as_user_error(RuntimeError("no concurrent thing here")) is None
