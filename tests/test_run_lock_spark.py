"""The schema's run lock (jobs.platform.lock): one writing job at a time, refused with the holder named, a dead holder
taken over; and two real ``erg ingest`` processes started together on one schema."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobs.platform.lock import HOST, Holder, LockHeld, _ensure, _take, acquire, process_start, read_holder

pytestmark = pytest.mark.spark
REPO = Path(__file__).resolve().parents[1]


def _plant(spark, cfg, *, host: str, pid: int, start: str | None, age: float, ttl: float = 600.0) -> Holder:
    """Write a lock row as if another job had taken the lock ``age`` seconds ago and renewed it then."""
    now = time.time() - age
    holder = Holder(f"planted{pid}", "erg run --planted", None, host, pid, start, now, now, now + ttl)
    previous = read_holder(spark, cfg)
    assert _take(spark, cfg, holder, previous)
    return holder


def test_lock_refuses_a_live_holder_and_takes_over_a_dead_one(spark, fresh_cfg):
    cfg = fresh_cfg
    lease = acquire(spark, cfg, "erg run --first")
    try:
        holder = read_holder(spark, cfg)
        assert (holder.holder, holder.pid, holder.host, holder.command) == (
            lease.holder.holder, os.getpid(), HOST, "erg run --first")
        lease.note_run("abc123")  # the heartbeat thread writes the job's MLflow run into the row
        for _ in range(120):
            if read_holder(spark, cfg).run_id == "abc123":
                break
            time.sleep(1)
        with pytest.raises(LockHeld) as refused:
            acquire(spark, cfg, "erg run --second", wait_s=0)
        problem = refused.value.lines()[0]
        assert "erg run --first" in problem and f"pid {os.getpid()}" in problem and "abc123" in problem
        started = time.time()
        with pytest.raises(LockHeld, match="after waiting 2s"):
            acquire(spark, cfg, "erg run --second", wait_s=2)
        assert time.time() - started >= 2
    finally:
        lease.release()
    assert read_holder(spark, cfg) is None

    # a killed job on this host: its process is gone, so its row is taken over at once
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    start = process_start(gone.pid)
    gone.wait()
    _plant(spark, cfg, host=HOST, pid=gone.pid, start=start, age=1)
    lease = acquire(spark, cfg, "erg run --after-kill", wait_s=0)
    assert f"its process {gone.pid} on {HOST} is gone" in lease.took_over
    lease.release()

    # a live job on this host holds it, however old its heartbeat; so does one elsewhere until its lease expires
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        _plant(spark, cfg, host=HOST, pid=alive.pid, start=process_start(alive.pid), age=3600, ttl=60)
        with pytest.raises(LockHeld, match=f"pid {alive.pid} on {re.escape(HOST)}"):
            acquire(spark, cfg, "erg run --third", wait_s=0)
    finally:
        alive.kill()
        alive.wait()
    _plant(spark, cfg, host="another-cluster-driver", pid=4242, start="x:1", age=5)
    with pytest.raises(LockHeld, match="pid 4242 on another-cluster-driver"):
        acquire(spark, cfg, "erg run --fourth", wait_s=0)
    _plant(spark, cfg, host="another-cluster-driver", pid=4243, start="x:1", age=700, ttl=600)
    lease = acquire(spark, cfg, "erg run --fifth", wait_s=0)
    ago = re.search(r"heartbeat was (\d+)s ago", lease.took_over)  # 700 s when planted, plus the seconds since
    assert ago and 700 <= int(ago.group(1)) < 700 + 120, lease.took_over
    lease.release()
    assert read_holder(spark, cfg) is None


def _erg(args: list[str], env: dict, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "jobs.cli", *args], cwd=str(REPO), env=env,
                            stdout=log.open("w"), stderr=subprocess.STDOUT)


def test_two_ingests_started_together(spark, erg_home):
    """Three ``erg ingest`` processes on one schema started together: two that do not wait (lock.wait_s 0) and one
    that does. Exactly one holds the lock at a time: a non-waiting one that finds it held exits 2 with one line naming
    the holder's command and pid (no traceback); the waiting one waits and succeeds (its ingest finds every file
    already in the tables). The tables equal one serial ingest's."""
    from benchmarks.chaos import compare_tables
    from jobs.platform.config import load_config
    from jobs.ingest import INGEST_TABLES, ingest
    from jobs.sample import write_sample
    from jobs.platform.spark import get_spark
    from jobs.platform.tables import table_name

    sample = erg_home / "samples" / "t_lock_pair"
    write_sample(load_config("test", [f"sample.dir={sample}"]))
    overrides = ["--set", "tables.schema=t_lock_pair", "--set", f"sample.dir={sample}"]
    env = {**os.environ, "ERG_HOME": str(erg_home), "PYTHONPATH": str(REPO)}
    procs = {name: _erg(["ingest", "--conf", "test", *overrides, *extra], env, erg_home / f"{name}.log")
             for name, extra in (("a", []), ("b", []), ("waiter", ["--set", "lock.wait_s=600"]))}
    codes = {name: proc.wait(timeout=900) for name, proc in procs.items()}
    logs = {name: (erg_home / f"{name}.log").read_text() for name in procs}
    assert codes["waiter"] == 0, logs["waiter"][-3000:]
    assert sorted(codes[n] for n in ("a", "b")) in ([0, 2], [2, 2]), (codes, logs)
    pids = {p.pid for p in procs.values()}
    for name in ("a", "b"):
        if codes[name] == 2:
            refusal = [line for line in logs[name].splitlines() if line.startswith("erg ingest:")]
            assert refusal and "Traceback" not in logs[name], logs[name][-3000:]
            assert refusal[0].startswith("erg ingest: refused: another erg job is writing schema t_lock_pair: "
                                         "`erg ingest --conf test"), refusal
            holder = int(re.search(r"\(pid (\d+) on ", refusal[0]).group(1))
            assert holder in pids - {procs[name].pid}
    if codes["a"] == codes["b"] == 2:  # the waiter got it first
        assert "waiting up to" not in logs["waiter"]
    else:
        assert "waiting up to" in logs["waiter"] and "held by `erg ingest" in logs["waiter"]

    cfg = load_config("test", ["tables.schema=t_lock_pair", f"sample.dir={sample}"])
    serial = load_config("test", ["tables.schema=t_lock_serial", f"sample.dir={sample}"])
    get_spark(cfg)
    get_spark(serial)
    ingest(spark, serial)
    comparison = compare_tables(lambda t: spark.table(table_name(serial, t)).toPandas(),
                                lambda t: spark.table(table_name(cfg, t)).toPandas(), tables=INGEST_TABLES)
    assert comparison["identical"], comparison["differences"]
    assert comparison["rows"]["stylized_captions"]["rerun"] > 0
    _ensure(spark, cfg)  # the lock table the processes made, registered in this session's catalog
    assert read_holder(spark, cfg) is None  # released by the last one
