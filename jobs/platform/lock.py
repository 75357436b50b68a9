"""The schema's run lock: one writing ``erg`` job at a time per schema, across processes, hosts and clusters.

Two writing jobs on one schema at once would trample each other: both MERGE into the same tables (Delta's
optimistic concurrency fails the second with ``ConcurrentAppendException``), both train a model and move its
``current`` alias, both rewrite the watermarks. So every writing command takes the schema's lock first and holds it
to the end (:func:`hold`, called by :mod:`jobs.cli`); a second one waits up to ``lock.wait_s`` (default 0) and then
refuses with exit status 2, naming the holder (its command, MLflow run, host, process id, start and last heartbeat).

The lock is a row of the Delta table ``<schema>.run_lock``, in the tables' own storage: it is taken by a conditional
MERGE, so two jobs that try at once, in one process tree or on two clusters, conflict through Delta's optimistic
concurrency and exactly one wins. A holder renews its lease every ``lock.heartbeat_s``; a holder that was killed
leaves its row behind, and the next job takes it over when the holder is dead for sure: on the same host when its
process is gone (its id and start time checked, so a reused process id is not mistaken for it), on another host
when its heartbeat is older than ``lock.ttl_s``. A finished job deletes its row.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import os
import random
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from jobs.platform import console
from jobs.platform.config import ErgConfig
from jobs.platform.errors import UserError, is_concurrent_write

LOCK_TABLE = "run_lock"
_COLUMNS = ("lock_key STRING NOT NULL, holder STRING NOT NULL, command STRING, run_id STRING, host STRING, "
            "pid INT, process_start STRING, acquired_at TIMESTAMP, heartbeat_at TIMESTAMP, expires_at TIMESTAMP")


def lock_table(cfg: ErgConfig) -> str:
    prefix = f"{cfg.tables.catalog}.{cfg.tables.schema_name}" if cfg.tables.catalog else cfg.tables.schema_name
    return f"{prefix}.{LOCK_TABLE}"


def lock_key(cfg: ErgConfig) -> str:
    return f"{cfg.tables.catalog}.{cfg.tables.schema_name}" if cfg.tables.catalog else cfg.tables.schema_name


class LockHeld(UserError):
    """Another job holds the schema's lock (exit 2)."""

    def __init__(self, problem: str, fix: str, holder: "Holder") -> None:
        super().__init__(problem, fix)
        self.holder = holder


# ------------------------------------------------------------------------------------------------ processes
def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def process_start(pid: int) -> str | None:
    """An identity of process ``pid`` that a reused id does not share (boot id and start time where /proc tells
    them); None when the process does not exist or is a zombie."""
    stat = Path(f"/proc/{pid}/stat")
    if stat.parent.parent.is_dir() and Path("/proc/self/stat").exists():
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return None
        if fields[0] in ("Z", "X"):  # killed, not yet reaped
            return None
        return f"{_boot_id()}:{fields[19]}"
    try:  # no /proc: only whether the id is in use
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return "alive"


HOST = socket.gethostname()


# --------------------------------------------------------------------------------------------------- holder
@dataclass(frozen=True)
class Holder:
    holder: str
    command: str | None
    run_id: str | None
    host: str | None
    pid: int | None
    process_start: str | None
    acquired_at: float
    heartbeat_at: float
    expires_at: float

    def dead(self, now: float) -> str | None:
        """Why this holder is dead for sure (None: it may be alive). On this host: its process is gone; elsewhere:
        its lease expired."""
        if self.host == HOST and self.pid is not None:
            if process_start(self.pid) != self.process_start:
                return f"its process {self.pid} on {self.host} is gone"
            return None
        if self.expires_at < now:
            return f"its last heartbeat was {now - self.heartbeat_at:.0f}s ago"
        return None

    def describe(self, now: float | None = None) -> str:
        now = time.time() if now is None else now
        started = dt.datetime.fromtimestamp(self.acquired_at, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        run = f", MLflow run {self.run_id}" if self.run_id else ""
        return (f"`{self.command or 'erg'}` (pid {self.pid} on {self.host}{run}, since {started}, last heartbeat "
                f"{max(0.0, now - self.heartbeat_at):.0f}s ago)")


def _ensure(spark, cfg: ErgConfig) -> str:
    """Create the schema and the lock table when absent (two jobs creating it at once: one wins, the other retries
    and finds it)."""
    from jobs.platform.tables import is_delta_table, table_location

    name = lock_table(cfg)
    prefix = name.rsplit(".", 1)[0]
    location = table_location(cfg, LOCK_TABLE)

    def create() -> None:
        spark.sql(f"CREATE SCHEMA IF NOT EXISTS {prefix}")
        if spark.catalog.tableExists(name):
            return
        if location and is_delta_table(spark, location):
            spark.sql(f"CREATE TABLE IF NOT EXISTS {name} USING DELTA LOCATION '{location}'")
            return
        where = f" LOCATION '{location}'" if location else ""
        spark.sql(f"CREATE TABLE IF NOT EXISTS {name} ({_COLUMNS}) USING DELTA{where} "
                  "COMMENT 'the schema run lock of erg: one row while a writing erg job runs (jobs.platform.lock)'")

    _retry(create, creating=True)
    return name


def _retry(fn, *, creating: bool = False, within_s: float = 300.0):
    """``fn()``, again after a short random pause while it fails on a concurrent Delta commit (for up to
    ``within_s``: on a busy machine the other job's commit can take a while)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - Delta's conflicts come through py4j as various classes
            text = str(exc)
            # creating: another job made the table first, or is making it (its folder is there, its log not yet)
            racing = is_concurrent_write(exc) or (creating and any(
                s in text for s in ("already exists", "FileAlreadyExists", "TABLE_OR_VIEW_ALREADY_EXISTS",
                                    "DELTA_CREATE_TABLE_WITH_NON_EMPTY_LOCATION", "is not empty")))
            if not racing or time.monotonic() > deadline:
                raise
            time.sleep(random.uniform(0.2, 1.0))


def read_holder(spark, cfg: ErgConfig) -> Holder | None:
    """The job holding the schema's lock (None: free); the lock table must exist (:func:`_ensure`)."""
    rows = spark.sql(
        f"SELECT holder, command, run_id, host, pid, process_start, CAST(acquired_at AS DOUBLE) AS acquired_at, "
        f"CAST(heartbeat_at AS DOUBLE) AS heartbeat_at, CAST(expires_at AS DOUBLE) AS expires_at "
        f"FROM {lock_table(cfg)} WHERE lock_key = '{_q(lock_key(cfg))}'").collect()
    if not rows:
        return None
    return Holder(**rows[0].asDict())


def current_holder(spark, cfg: ErgConfig) -> Holder | None:
    """The job holding the schema's lock, or None (also when no job ever took it)."""
    if not spark.catalog.tableExists(lock_table(cfg)):
        return None
    return read_holder(spark, cfg)


def _q(text: str | None) -> str:
    return "" if text is None else str(text).replace("\\", "\\\\").replace("'", "\\'")


def _lit(value) -> str:
    return "NULL" if value is None else f"'{_q(value)}'"


# ---------------------------------------------------------------------------------------------------- lease
class Lease:
    """The lock held by this process: renewed by a daemon thread until :meth:`release`."""

    def __init__(self, spark, cfg: ErgConfig, holder: Holder, took_over: str | None) -> None:
        self.spark, self.cfg, self.holder, self.took_over = spark, cfg, holder, took_over
        self.lost = False
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._run_id: str | None = None
        self._thread = threading.Thread(target=self._beat, name="erg-lock-heartbeat", daemon=True)
        self._thread.start()

    def note_run(self, run_id: str) -> None:
        """Name the job's MLflow run in the lock row (written by the heartbeat thread, at once)."""
        if self._run_id is None:
            self._run_id = run_id
            self._wake.set()

    def _beat(self) -> None:
        from jobs.platform.spark import has_spark_context

        if has_spark_context(self.spark):
            # a pool of its own: where the scheduler is FAIR (Databricks) the renewal is not queued behind a stage
            self.spark.sparkContext.setLocalProperty("spark.scheduler.pool", "erg_lock")
        written_run = None
        while not self._stop.is_set():
            self._wake.wait(self.cfg.lock.heartbeat_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                run_id = self._run_id
                self._renew(run_id if run_id != written_run else None)
                written_run = run_id
            except Exception as exc:  # noqa: BLE001 - a missed beat is retried; the lease lasts ttl_s
                print(f"erg: could not renew the run lock ({type(exc).__name__}); retrying", file=console.err())

    def _renew(self, run_id: str | None) -> None:
        now = time.time()
        sets = [f"heartbeat_at = timestamp_seconds({now:.3f})",
                f"expires_at = timestamp_seconds({now + self.cfg.lock.ttl_s:.3f})"]
        if run_id:
            sets.append(f"run_id = {_lit(run_id)}")
        result = _retry(lambda: self.spark.sql(
            f"UPDATE {lock_table(self.cfg)} SET {', '.join(sets)} WHERE lock_key = '{_q(lock_key(self.cfg))}' "
            f"AND holder = '{self.holder.holder}'").collect())
        updated = int(result[0][0]) if result and len(result[0]) else 1
        if updated == 0 and not self.lost:
            self.lost = True
            print("erg: WARNING: this job's run lock was taken over by another job (its lease expired); the two may "
                  "now write the same tables", file=console.err())

    def release(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=60)
        try:
            _retry(lambda: self.spark.sql(
                f"DELETE FROM {lock_table(self.cfg)} WHERE lock_key = '{_q(lock_key(self.cfg))}' "
                f"AND holder = '{self.holder.holder}'").collect())
        except Exception as exc:  # noqa: BLE001 - the row stays; the next job sees this process gone
            print(f"erg: could not release the run lock ({type(exc).__name__}: {str(exc)[:200]}); the next job takes "
                  "it over once this process has ended", file=console.err())


def _take(spark, cfg: ErgConfig, me: Holder, previous: Holder | None) -> bool:
    """Write ``me`` as the holder if the lock is free, or still held by the dead ``previous``; whether it is mine."""
    values = (f"SELECT '{_q(lock_key(cfg))}' AS lock_key, '{me.holder}' AS holder, {_lit(me.command)} AS command, "
              f"CAST(NULL AS STRING) AS run_id, {_lit(me.host)} AS host, {int(me.pid)} AS pid, "
              f"{_lit(me.process_start)} AS process_start, timestamp_seconds({me.acquired_at:.3f}) AS acquired_at, "
              f"timestamp_seconds({me.heartbeat_at:.3f}) AS heartbeat_at, "
              f"timestamp_seconds({me.expires_at:.3f}) AS expires_at")
    clauses = ["WHEN NOT MATCHED THEN INSERT *"]
    if previous is not None:
        clauses.insert(0, f"WHEN MATCHED AND t.holder = '{_q(previous.holder)}' THEN UPDATE SET *")
    spark.sql(f"MERGE INTO {lock_table(cfg)} t USING ({values}) s ON t.lock_key = s.lock_key "
              + " ".join(clauses)).collect()
    now_holder = read_holder(spark, cfg)
    return now_holder is not None and now_holder.holder == me.holder


def acquire(spark, cfg: ErgConfig, command: str, *, wait_s: float | None = None) -> Lease:
    """Take the schema's lock for ``command``, waiting up to ``wait_s`` (default ``lock.wait_s``) while another live
    job holds it; :class:`LockHeld` (exit 2) when it is still held then."""
    _ensure(spark, cfg)
    wait_s = cfg.lock.wait_s if wait_s is None else wait_s
    deadline = time.time() + wait_s
    told = False
    while True:
        holder = read_holder(spark, cfg)
        now = time.time()
        why_dead = holder.dead(now) if holder is not None else None
        if holder is None or why_dead:
            me = Holder(uuid.uuid4().hex, command[:500], None, HOST, os.getpid(), process_start(os.getpid()),
                        now, now, now + cfg.lock.ttl_s)
            try:
                mine = _take(spark, cfg, me, holder)
            except Exception as exc:  # noqa: BLE001
                if not is_concurrent_write(exc):
                    raise
                mine = False  # another job took it in the same moment: look again
            if mine:
                took_over = f"{holder.describe(now)}: {why_dead}" if holder is not None else None
                if took_over:
                    print(f"erg: took over the run lock of schema {lock_key(cfg)} from {took_over}", file=console.err())
                return Lease(spark, cfg, me, took_over)
            time.sleep(random.uniform(0.1, 0.5))
            continue
        if now >= deadline:
            waited = f" after waiting {wait_s:.0f}s" if wait_s else ""
            raise LockHeld(
                f"refused{waited}: another erg job is writing schema {lock_key(cfg)}: {holder.describe(now)}",
                "wait for it to finish (or set lock.wait_s to wait); a killed job's lock is taken over once its "
                f"process is gone (same host) or its heartbeat is {cfg.lock.ttl_s:.0f}s old (lock.ttl_s)", holder)
        if not told:
            print(f"erg: waiting up to {deadline - now:.0f}s for the run lock of schema {lock_key(cfg)}, held by "
                  f"{holder.describe(now)}", file=console.err())
            told = True
        time.sleep(max(0.1, min(cfg.lock.poll_s, deadline - now)))


_HELD: dict[str, Lease] = {}


def held(cfg: ErgConfig) -> Lease | None:
    """This process's lease on ``cfg``'s schema, if it holds one."""
    return _HELD.get(lock_key(cfg))


def note_run(cfg: ErgConfig, run_id: str) -> None:
    """Name ``run_id`` in the lock row when this process holds ``cfg``'s lock (the first run named stays)."""
    lease = held(cfg)
    if lease is not None:
        lease.note_run(run_id)


@contextlib.contextmanager
def hold(spark, cfg: ErgConfig, command: str, *, wait_s: float | None = None) -> Iterator[Lease | None]:
    """Hold ``cfg``'s schema lock for the block (re-entrant within a process; nothing with ``lock.enabled`` off)."""
    key = lock_key(cfg)
    if not cfg.lock.enabled or key in _HELD:
        yield _HELD.get(key)
        return
    lease = acquire(spark, cfg, command, wait_s=wait_s)
    _HELD[key] = lease
    try:
        yield lease
    finally:
        _HELD.pop(key, None)
        lease.release()
