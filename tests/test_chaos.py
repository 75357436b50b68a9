"""benchmarks/chaos.py without Spark: the table comparison finds what a kill could break, the kill plan covers
every stage, and a process group is really killed. (The two-kill run is tests/test_pipeline_spark.py.)"""
from __future__ import annotations

import json
import sys

import numpy as np
import pandas as pd

from benchmarks.chaos import banners, compare_table, kill_plan, run_and_kill
from jobs.pipeline import STAGES


def _phrases(**changes) -> pd.DataFrame:
    rows = [{"scene_id": f"s{i}", "style": "humor", "caption": f"a dog {i}", "tokens": np.array(["a", "dog"]),
             "importance": np.array([0.25, 0.75]), "style_phrase": "dog", "content": "a", "layer": 1, "head": 2,
             "eps": 0.25, "classifier_version": "run-a", "run_id": "run-a", "created_at": pd.Timestamp("2026-01-01")}
            for i in range(3)]
    frame = pd.DataFrame(rows)
    for column, value in changes.items():
        frame.loc[0, column] = value
    return frame


def test_compare_finds_missing_duplicate_and_changed_rows():
    ref = _phrases()
    # run ids, times and run-named model versions differ between two correct runs: not differences
    same = _phrases(run_id="run-b", classifier_version="run-b", created_at=pd.Timestamp("2027-01-01"))
    assert compare_table("style_phrases", ref, same) == []
    nearly = ref.copy()
    nearly.at[0, "importance"] = np.array([0.25 + 1e-7, 0.75])
    assert compare_table("style_phrases", ref, nearly) == []
    changed = ref.copy()
    changed.at[1, "importance"] = np.array([0.5, 0.5])
    changed.at[2, "head"] = 3
    kinds = {(d["kind"], d.get("column")) for d in compare_table("style_phrases", ref, changed)}
    assert kinds == {("values differ", "importance"), ("values differ", "head")}
    dup = pd.concat([ref, ref.iloc[[1]]], ignore_index=True)
    assert [d["kind"] for d in compare_table("style_phrases", ref, dup)] == ["duplicate keys (rerun)"]
    lost = ref.iloc[1:]
    diff = compare_table("style_phrases", ref, lost)
    assert diff == [{"table": "style_phrases", "kind": "keys missing after the rerun", "count": 1, "examples": [["s0"]]}]


def test_compare_writes_homes_as_one():
    row = {"quarantine_id": "x", "source": "s", "source_file": "/a/home1/sample/f.txt", "line_no": 3, "raw": "r",
           "reason": "empty caption", "quarantined_at": None, "run_id": "1"}
    other = {**row, "quarantine_id": "y", "source_file": "/b/home2/sample/f.txt"}
    assert compare_table("quarantine", pd.DataFrame([row]), pd.DataFrame([other]), ("/a/home1", "/b/home2")) == []
    assert compare_table("quarantine", pd.DataFrame([row]), pd.DataFrame([{**other, "raw": "q"}]),
                         ("/a/home1", "/b/home2"))[0]["column"] == "raw"


def test_kill_plan_covers_every_stage():
    windows = {s: 10.0 for s in STAGES}
    plan = kill_plan(10, 3, windows)
    assert sorted(s for s, _ in plan) == sorted(STAGES * 2)
    assert all(0 <= d <= 10 for _, d in plan) and plan == kill_plan(10, 3, windows)


def test_run_and_kill_kills_the_process_group(tmp_path):
    script = ("import subprocess, sys, time\n"
              "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
              "print(child.pid, flush=True)\n"
              "for n, s in enumerate(['ingest', 'extract'], 1):\n"
              "    print(f'--- {n}/5 {s} ---', flush=True); time.sleep(0.5)\n"
              "time.sleep(60)\n")
    log = tmp_path / "run.log"
    result = run_and_kill([sys.executable, "-c", script], {}, log, stage="extract", delay=0.2, timeout=30)
    assert result["killed"] and result["stage_hit"] == "extract" and result["rc"] == -9
    child = int(log.read_text().split()[0])
    import os
    import time

    for _ in range(50):  # the grandchild went with the group
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the child process survived the kill")
    assert banners(log.read_text()) == ["ingest", "extract"]
    done = run_and_kill([sys.executable, "-c", "print('1/5 ingest')"], {}, tmp_path / "done.log", stage="generate")
    assert not done["killed"] and done["rc"] == 0


def test_windows_shrink_to_what_a_run_saw():
    from benchmarks.chaos import observed_windows

    seen = observed_windows({"ingest": 1.0, "extract": 10.0, "embed": 40.0})
    assert seen == {"ingest": 9.0, "extract": 30.0}  # embed never ended in that run: no window for it


def test_compare_experiments_by_cell_and_seed():
    from benchmarks.chaos import compare_experiments

    def cell(seed, cider, run_id="r1"):
        return {"style": "humor", "captioner": "nic", "variant": "augmented", "seed": seed, "cider": cider,
                "cls": 0.5, "run_id": run_id, "train_seconds": 12.0}

    ref = {"seed_rows": [cell(23, 0.31), cell(24, 0.33)]}
    assert compare_experiments(ref, {"seed_rows": [cell(24, 0.33, "r9"), cell(23, 0.31 + 1e-9, "r8")]}) == []
    diffs = compare_experiments(ref, {"seed_rows": [cell(23, 0.35)]})
    assert {d["kind"] for d in diffs} == {"cells missing after the rerun", "values differ"}
    assert [d["columns"] for d in diffs if d["kind"] == "values differ"] == [["cider"]]


def test_registry_check_finds_an_alias_naming_a_half_written_model(tmp_path):
    from mlflow import MlflowClient

    from benchmarks.chaos import registry_check

    home = tmp_path / "home"
    uri = f"sqlite:///{home / 'mlflow.db'}"
    home.mkdir()
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    for name, weights in (("erg_generator", True), ("erg_style_classifier", False)):
        folder = home / "models" / name
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
        if weights:
            (folder / "model.safetensors").write_bytes(b"0")
        record = home / "models" / f"{name}.record.json"
        record.write_text(json.dumps({"path": str(folder), "version": "v1"}))
        client.create_registered_model(name)
        version = client.create_model_version(name, source=folder.as_uri()).version
        client.set_model_version_tag(name, version, "erg.record", str(record))
        client.set_registered_model_alias(name, "current", version)
    result = registry_check(home)
    assert result["aliases"] == 2
    assert [b["model"] for b in result["broken"]] == ["erg_style_classifier"]
    assert result["broken"][0]["paths"] == ["<home>/models/erg_style_classifier"]


def test_resume_keeps_the_recorded_kills_with_their_differences(tmp_path):
    """``--resume`` reads back what ``_write`` wrote: every record, each with its own differences, and nothing
    from a file another command wrote."""
    from types import SimpleNamespace

    from benchmarks.chaos import _write, prior_records

    runs = [{"kill": 0, "target_stage": "extract", "delay_s": 3.0, "killed": True, "stage_hit": "extract",
             "identical": True, "differences": []},
            {"kill": 1, "target_stage": "embed", "delay_s": 9.0, "killed": False, "stage_hit": "retrieve",
             "note": "the run ended before the kill moment"},
            {"kill": 1, "target_stage": "embed", "delay_s": 2.0, "killed": True, "stage_hit": "embed",
             "identical": False, "differences": [{"table": "embeddings", "kind": "values differ"}]}]
    exp_runs = [{"experiment_kill": 0, "killed": True, "identical": False,
                 "differences": [{"kind": "rerun failed", "rc": 1}]}]
    out = tmp_path / "chaos.json"
    ref = {"seconds": 60.0, "windows": {s: 10.0 for s in STAGES}}
    _write(out, runs, exp_runs, "python benchmarks/chaos.py --kills 2", ref, SimpleNamespace(conf="test"))
    written = json.loads(out.read_text())
    assert written["kills"] == 3 and written["identical"] == 1 and len(written["differences"]) == 2

    got_runs, got_exp = prior_records(out, "python benchmarks/chaos.py --kills 2")
    assert [(r["kill"], r["killed"]) for r in got_runs] == [(0, True), (1, False), (1, True)]
    assert got_runs[0]["differences"] == [] and got_runs[1]["differences"] == []
    assert got_runs[2]["differences"] == [{"table": "embeddings", "kind": "values differ"}]
    assert got_exp[0]["differences"] == [{"kind": "rerun failed", "rc": 1}]
    # written again from what was read back: the same file
    _write(out, got_runs, got_exp, "python benchmarks/chaos.py --kills 2", ref, SimpleNamespace(conf="test"))
    assert json.loads(out.read_text()) == written
    assert prior_records(out, "python benchmarks/chaos.py --kills 12") == ([], [])
    assert prior_records(tmp_path / "missing.json", "python benchmarks/chaos.py --kills 2") == ([], [])
    # other experiment options: the kills of erg run are kept, the experiment kills start again
    got_runs, got_exp = prior_records(out, "python benchmarks/chaos.py --kills 2 --experiment-conf local "
                                           "--experiment-set train.epochs=1")
    assert len(got_runs) == 3 and got_runs[2]["differences"] and got_exp == []
    # more kills aimed inside training: every recorded kill is kept
    got_runs, got_exp = prior_records(out, "python benchmarks/chaos.py --kills 2 --experiment-training-kills 1")
    assert len(got_runs) == 3 and len(got_exp) == 1


def test_the_experiment_homes_take_their_own_conf_and_overrides():
    from types import SimpleNamespace

    from benchmarks.chaos import experiment_conf

    assert experiment_conf(SimpleNamespace(conf="test", set=["a=1"], experiment_conf=None, experiment_set=[])) == (
        "test", ["a=1"])
    # --set belongs to --conf: another experiment conf takes only --experiment-set
    assert experiment_conf(SimpleNamespace(conf="test", set=["a=1"], experiment_conf="local",
                                           experiment_set=["b=2"])) == ("local", ["b=2"])
    assert experiment_conf(SimpleNamespace(conf="test", set=["a=1"], experiment_conf="test",
                                           experiment_set=["b=2"])) == ("test", ["a=1", "b=2"])


def test_cells_snapshotted_counts_the_home_log_named_on_the_console(tmp_path: Path) -> None:
    from benchmarks.chaos import cells_snapshotted, training_seconds

    home_log = tmp_path / "experiment.log"
    home_log.write_text("INFO experiment cell humor/nic/original#seed=23: 40 original + 0 augmented pairs\n"
                        "INFO experiment cell humor/nic/augmented#seed=23: 40 original + 38 augmented pairs\n"
                        "INFO experiment cell humor/nic/original#seed=23: reused from run abc\n")
    console = tmp_path / "console.log"
    console.write_text(f"log: {home_log}\n1/5 ingest\n")
    assert cells_snapshotted(console) == 2
    assert training_seconds(home_log) is None
    home_log.write_text("INFO jobs.experiment: experiment: snapshots took 20.8s\n"
                        "INFO jobs.experiment: experiment: training took 25.5s\n")
    assert training_seconds(home_log) == 25.5
    console.write_text("Traceback (most recent call last):\n")
    assert cells_snapshotted(console) == 0
