"""A Spark standalone cluster on this machine: one master and N workers from pyspark's own launcher.

``spark-class org.apache.spark.deploy.master.Master`` / ``...worker.Worker`` on 127.0.0.1, each worker with its
own cores, memory and work folder, so that the jobs run with real executors in other JVMs (tasks, shuffles and
broadcasts cross process boundaries) instead of local[*]'s threads in the driver. Tests and benchmarks start one and
stop it after; the jobs use it with ``--set spark.master=<cluster.master_url>``.

    python -m jobs.platform.standalone_cluster --workers 2 --cores 1 --memory 2g      # serves until stopped (Ctrl-C)
"""
from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from jobs.platform.spark_launcher import pyspark_script, stop_process_group

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class StandaloneCluster:
    """A running master and its workers (their processes and logs)."""

    master_url: str
    folder: Path
    processes: list[subprocess.Popen] = field(default_factory=list)

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop the workers, then the master (each with its process group: executors go with their worker)."""
        for process in reversed(self.processes):
            stop_process_group(process, timeout_s)

    def __enter__(self) -> "StandaloneCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _launch(args: list[str], log: Path) -> subprocess.Popen:
    out = open(log, "wb")  # noqa: SIM115 - the child keeps writing to it; a new log (workers are counted in it)
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1"}
    return subprocess.Popen([pyspark_script("spark-class"), *args], stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True, env=env)


def _registered_workers(master_log: Path) -> int:
    text = master_log.read_text(errors="replace") if master_log.exists() else ""
    return len(re.findall(r"Registering worker", text))


def start_cluster(folder: str | os.PathLike, workers: int = 2, cores: int = 1, memory: str = "2g",
                  timeout_s: float = 180.0) -> StandaloneCluster:
    """Start a master and ``workers`` workers (``cores`` and ``memory`` each) with logs and work folders under
    ``folder``; returns once every worker has registered with the master."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    master_log = folder / "master.log"
    cluster = StandaloneCluster(f"spark://127.0.0.1:{port}", folder)
    try:
        cluster.processes.append(_launch([MASTER_CLASS, "--host", "127.0.0.1", "--port", str(port),
                                          "--webui-port", str(free_port())], master_log))
        for n in range(workers):
            work = folder / f"worker{n}"
            work.mkdir(exist_ok=True)
            cluster.processes.append(_launch([WORKER_CLASS, cluster.master_url, "--host", "127.0.0.1",
                                              "--cores", str(cores), "--memory", memory, "--work-dir", str(work),
                                              "--webui-port", str(free_port())], folder / f"worker{n}.log"))
        deadline = time.monotonic() + timeout_s
        while _registered_workers(master_log) < workers:
            dead = [p for p in cluster.processes if p.poll() is not None]
            if dead:
                raise RuntimeError(f"a standalone cluster process exited with code {dead[0].returncode}: see the "
                                   f"logs under {folder}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{_registered_workers(master_log)} of {workers} workers registered with "
                                   f"{cluster.master_url} within {timeout_s:.0f} s: see the logs under {folder}")
            time.sleep(1.0)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs.platform.standalone_cluster",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cores", type=int, default=1, help="cores per worker")
    parser.add_argument("--memory", default="2g", help="memory per worker")
    parser.add_argument("--folder", default=".erg-cluster", help="logs and work folders")
    args = parser.parse_args(argv)
    with start_cluster(args.folder, args.workers, args.cores, args.memory) as cluster:
        print(f"standalone cluster at {cluster.master_url} ({args.workers} workers x {args.cores} cores); run the jobs "
              f"with --set spark.master={cluster.master_url}; Ctrl-C stops it", file=sys.stderr)
        try:
            while all(p.poll() is None for p in cluster.processes):
                time.sleep(5)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
