"""What an ``erg`` command prints: its own lines only, the libraries' chatter in a log file under the home.

By default (:class:`Output`, entered by :func:`jobs.cli.main`) a command prints the path of its log file once, one
progress line per stage (:func:`stage`: elapsed time, the Spark tasks done of the running jobs, tasks/s and time
left while it runs, then the stage's time and rows written), and a short summary table at the end
(:func:`summary_table`). Everything else goes to ``<home>/logs/<command>-<time>.log``:

- the Spark JVM's output (the log4j banner, its INFO/WARN lines, the Python workers' stderr): the JVM is launched with
  its stdout and stderr on the log file (:func:`jvm_output`), and Spark's console progress bar is off;
- Python's ``logging`` (MLflow and its database migrations, py4j, transformers, ...) and ``warnings``, by a handler
  on the root logger; libraries that print to ``sys.stderr`` or ``sys.stdout`` (progress bars, reports) write to the
  file too, as both point at it while the command runs. The command's own lines go to the terminal's streams
  (:func:`out`, :func:`err`).

``--verbose`` leaves all of it on the terminal as before; ``--json`` prints the result as JSON instead of the table.
A real error still prints in full (its traceback on the terminal).
"""
from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator, TextIO

#: the log file of the command running in this process (None when verbose or outside the CLI)
LOG_FILE_ENV = "ERG_LOG_FILE"
_state: dict[str, Any] = {"out": None, "err": None, "log": None}

#: library loggers whose INFO lines are worth keeping in the log file
_CHATTY = ("mlflow", "alembic", "py4j", "pyspark", "transformers", "urllib3", "filelock", "fsspec", "torch")


def out() -> TextIO:
    """The terminal's stdout (the command's own output), also while library output goes to the log file."""
    return _state["out"] or sys.stdout


def err() -> TextIO:
    """The terminal's stderr (the command's own progress lines and messages)."""
    return _state["err"] or sys.stderr


def log_path() -> Path | None:
    """The log file of the running command, or None (verbose, or not under the CLI)."""
    return _state["log"]


class Output:
    """Route library output of one command to a log file under ``home`` (unless ``verbose``); restore on exit."""

    def __init__(self, home: str | Path, command: str, verbose: bool = False) -> None:
        """The log file's path is printed when a JVM starts (:func:`jvm_output`), else at the end when something
        was logged; a log that got nothing (``erg sample``, ``erg sql`` answered without Spark) is removed."""
        self.home, self.command, self.verbose = Path(home), command, verbose
        self._saved: dict[str, Any] = {}

    def __enter__(self) -> "Output":
        self._saved = {"stdout": sys.stdout, "stderr": sys.stderr, "state": dict(_state),
                       "env": os.environ.get(LOG_FILE_ENV), "level": logging.getLogger().level}
        _state.update(out=sys.stdout, err=sys.stderr, log=None)
        if self.verbose:
            return self
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
        path = self.home / "logs" / f"{self.command}-{stamp}-{os.getpid()}.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        # kept open after the command: handlers that libraries made while it ran hold it
        self.file = open(path, "a", buffering=1, encoding="utf-8", errors="replace")
        self.file.write(f"erg {' '.join(sys.argv[1:]) or self.command} (pid {os.getpid()}, {stamp} UTC)\n")
        _state["log"] = path
        _state["command"] = self.command
        os.environ[LOG_FILE_ENV] = str(path)
        self.header_bytes = self.file.tell()
        self.handler = logging.StreamHandler(self.file)
        self.handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root = logging.getLogger()
        root.addHandler(self.handler)
        root.setLevel(logging.INFO)
        self.swapped = []
        for name in _CHATTY:  # libraries that log to stderr by their own handler: to the file instead
            logger = logging.getLogger(name)
            for handler in list(logger.handlers):
                if isinstance(handler, logging.StreamHandler) and getattr(handler, "stream", None) in (
                        sys.stderr, sys.stdout, sys.__stderr__, sys.__stdout__):
                    self.swapped.append((handler, handler.setStream(self.file)))
        logging.captureWarnings(True)
        sys.stdout = sys.stderr = self.file
        return self

    def __exit__(self, kind: Any, value: Any, trace: Any) -> None:
        sys.stdout, sys.stderr = self._saved["stdout"], self._saved["stderr"]
        if not self.verbose:
            if kind is not None and not issubclass(kind, SystemExit):
                import traceback

                self.file.write("".join(traceback.format_exception(kind, value, trace)))
            self.file.flush()
            path = _state.get("log")
            if path and not _state.get("announced"):
                if path.stat().st_size > self.header_bytes:
                    announce()
                else:  # nothing was logged: no file left behind (still open: a handler made meanwhile may hold it)
                    path.unlink(missing_ok=True)
            logging.captureWarnings(False)
            logging.getLogger().removeHandler(self.handler)
            logging.getLogger().setLevel(self._saved["level"])
            for handler, stream in self.swapped:
                handler.setStream(stream)
            if self._saved["env"] is None:
                os.environ.pop(LOG_FILE_ENV, None)
            else:
                os.environ[LOG_FILE_ENV] = self._saved["env"]
        _state.clear()
        _state.update(self._saved["state"])


def announce() -> None:
    """Print the log file's path on the terminal, once per command."""
    if _state.get("log") and not _state.get("announced"):
        _state["announced"] = True
        print(f"log: {_state['log']}", file=err())


def quiet() -> bool:
    """Whether library output goes to a log file (a command under the CLI, not ``--verbose``)."""
    return bool(os.environ.get(LOG_FILE_ENV))


@contextlib.contextmanager
def jvm_output() -> Iterator[None]:
    """While a JVM is launched in the block, this process's stdout and stderr (file descriptors 1 and 2) are the log
    file, so the JVM and every process it starts (Python workers) write there for as long as they run."""
    path = os.environ.get(LOG_FILE_ENV)
    if not path:
        yield
        return
    announce()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(Exception):
            stream.flush()
    saved = [os.dup(1), os.dup(2)]
    target = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.dup2(target, 1)
        os.dup2(target, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, target):
            os.close(fd)


# --------------------------------------------------------------------------------------------------- progress
def _spark_tasks() -> tuple[int, int] | None:
    """(tasks done, tasks) of the Spark jobs running now on this process's SparkContext, or None."""
    try:
        from pyspark import SparkContext

        sc = SparkContext._active_spark_context
        if sc is None:
            return None
        tracker = sc.statusTracker()
        done = total = 0
        for stage_id in tracker.getActiveStageIds():
            info = tracker.getStageInfo(stage_id)
            if info is not None:
                done += info.numCompletedTasks
                total += info.numTasks
        return done, total
    except Exception:  # noqa: BLE001 - progress is a nicety: never fail a job for it
        return None


def _seconds(value: float) -> str:
    value = int(round(value))
    return f"{value // 60}m{value % 60:02d}s" if value >= 60 else f"{value}s"


def rows_written(result: Any) -> int:
    """Rows a job's result says it wrote: the sum of its ``<table>.inserted/updated/deleted`` counts."""
    if not isinstance(result, dict):
        return 0
    return int(sum(v for k, v in result.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
                   and k.rsplit(".", 1)[-1] in ("inserted", "updated", "deleted") and "." in k))


class _Stage:
    def __init__(self, label: str) -> None:
        self.label, self.started, self.result = label, time.time(), None


@contextlib.contextmanager
def stage(name: str, number: int | None = None, total: int | None = None) -> Iterator[_Stage]:
    """One progress line for a stage: ``n/N name`` when it starts; on a terminal the line is redrawn every half
    second with the elapsed time and the Spark tasks done of the running jobs (tasks/s, time left); when it ends,
    ``name: <seconds>s`` and the rows written (set ``.result`` to the job's result to report them)."""
    label = f"{number}/{total} {name}" if number is not None else name
    current = _Stage(label)
    stream = err()
    live = quiet() and getattr(stream, "isatty", lambda: False)()
    stop = threading.Event()
    if live:
        def draw() -> None:
            seen: list[tuple[float, int]] = []
            while not stop.wait(0.5):
                elapsed = time.time() - current.started
                text = f"{label}  {_seconds(elapsed)}"
                tasks = _spark_tasks()
                if tasks and tasks[1]:
                    seen.append((time.time(), tasks[0]))
                    seen[:] = [s for s in seen if s[0] > time.time() - 20]
                    rate = (seen[-1][1] - seen[0][1]) / max(seen[-1][0] - seen[0][0], 1e-9) if len(seen) > 1 else 0
                    text += f"  Spark tasks {tasks[0]}/{tasks[1]}"
                    if rate > 0:
                        text += f" ({rate:.1f}/s, {_seconds((tasks[1] - tasks[0]) / rate)} left)"
                stream.write("\r\033[K" + text[:200])
                stream.flush()

        thread = threading.Thread(target=draw, daemon=True)
        print(label, file=stream)
        thread.start()
    else:
        print(label, file=stream)
    try:
        yield current
    finally:
        stop.set()
        if live:
            thread.join(timeout=2)
            stream.write("\r\033[K")
        seconds = time.time() - current.started
        rows = rows_written(current.result)
        rate = f", {rows / seconds:,.0f} rows/s" if rows and seconds > 0 else ""
        print(f"{name}: {seconds:.1f}s" + (f"  {rows:,} rows written{rate}" if rows else ""), file=stream)


# ---------------------------------------------------------------------------------------------------- summary
def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 100 else f"{value:.3g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def summary_rows(result: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The compact summary of a job's result: per table the rows inserted / updated / deleted, then the run id and
    the other plain values (counts, seconds) up to a dozen; nested values are left to ``--json``."""
    tables: dict[str, dict[str, Any]] = {}
    other: list[tuple[str, Any]] = []
    for key, value in result.items():
        head, _, tail = key.rpartition(".")
        if head and tail in ("inserted", "updated", "deleted") and isinstance(value, (int, float)):
            tables.setdefault(head, {})[tail] = value
        elif isinstance(value, (str, int, float, bool)) or value is None:
            other.append((key, value))
    rows = [[table, *(_cell(counts.get(k, 0)) for k in ("inserted", "updated", "deleted"))]
            for table, counts in tables.items()]
    header = ["table", "inserted", "updated", "deleted"] if rows else ["", ""]
    picked = sorted(other, key=lambda kv: (kv[0] != "run_id", not kv[0].startswith("seconds"), kv[0]))[:12]
    if rows:
        rows += [[key, _cell(value), "", ""] for key, value in picked]
    else:
        rows = [[key, _cell(value)] for key, value in picked]
    return header, rows


def summary_table(command: str, result: Any) -> str:
    """A short table of ``result`` for the terminal (``erg run``: a row per stage)."""
    if not isinstance(result, dict):
        return f"{result}\n"
    stages = {k: v for k, v in result.items() if isinstance(v, dict) and ("run_id" in v or rows_written(v))}
    if command in ("run",) and stages:
        header = ["stage", "rows written", "run id"]
        rows = [[name, _cell(rows_written(v)), str(v.get("run_id", ""))] for name, v in stages.items()]
        rows += [[k, _cell(v), ""] for k, v in result.items() if not isinstance(v, (dict, list))]
    else:
        header, rows = summary_rows(result)
    hidden = sum(1 for v in result.values() if isinstance(v, (dict, list)))
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip()] if any(header) else []
    lines.append("  ".join("-" * w for w in widths))
    for row in rows:
        lines.append("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip())
    total = len(result)
    if hidden or total > len(rows):
        lines.append(f"({total} values in all: --json prints them)")
    return "\n".join(lines) + "\n"
