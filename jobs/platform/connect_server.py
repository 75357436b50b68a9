"""A local Spark Connect server with Delta Lake: what Databricks serverless and standard-access clusters speak.

The server is pyspark's own (``org.apache.spark.sql.connect.service.SparkConnectServer``, whose jar pyspark ships),
started by ``spark-submit`` with the same Delta jars and settings as a local session (:func:`jobs.platform.spark.
session_settings`). The jobs then run against it with ``spark.remote: sc://127.0.0.1:<port>`` (``--set
spark.remote=...``): there is no SparkContext on that side, so the jobs size partitions from the session's
settings, MERGE through SQL and ship the scene index as a file (``retrieve.index_transport``).

    python -m jobs.platform.connect_server --conf local --port 15002      # serves until stopped (Ctrl-C)
    erg run --conf local --set spark.remote=sc://127.0.0.1:15002
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time

from jobs.platform.config import ErgConfig, load_config
from jobs.platform.spark import session_settings
from jobs.platform.spark_launcher import pyspark_script, stop_process_group

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def server_command(cfg: ErgConfig, port: int, host: str = "127.0.0.1") -> list[str]:
    """The ``spark-submit`` command line of a Connect server for ``cfg`` (``spark.master``, Delta, the warehouse)
    listening on ``host:port``."""
    settings = {**session_settings(cfg), "spark.connect.grpc.binding.port": str(port),
                "spark.connect.grpc.binding.address": host, "spark.log.level": "WARN"}
    command = [pyspark_script("spark-submit"), "--master", cfg.spark.master, "--class", SERVER_CLASS, "--name", "erg connect server"]
    for key, value in settings.items():
        command += ["--conf", f"{key}={value}"]
    return command


def wait_for_port(host: str, port: int, process: subprocess.Popen, timeout_s: float = 180.0) -> None:
    """Return once ``host:port`` accepts connections; raise if the server exits or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the Spark Connect server exited with code {process.returncode} before listening on "
                               f"{host}:{port}: see its log")
        with socket.socket() as probe:
            probe.settimeout(1.0)
            if probe.connect_ex((host, port)) == 0:
                return
        time.sleep(1.0)
    raise TimeoutError(f"the Spark Connect server did not listen on {host}:{port} within {timeout_s:.0f} s")


def start_server(cfg: ErgConfig, port: int, log_path: str | os.PathLike, host: str = "127.0.0.1",
                 timeout_s: float = 180.0) -> subprocess.Popen:
    """Start the server in the background (its output to ``log_path``) and wait until it listens."""
    log = open(log_path, "ab")  # noqa: SIM115 - the child keeps writing to it
    process = subprocess.Popen(server_command(cfg, port, host), stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True, env=dict(os.environ))
    try:
        wait_for_port(host, port, process, timeout_s)
    except BaseException:
        stop_server(process)
        raise
    return process


def stop_server(process: subprocess.Popen, timeout_s: float = 60.0) -> None:
    """Stop the server (and its Python workers: the whole process group)."""
    stop_process_group(process, timeout_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs.platform.connect_server", description=__doc__.splitlines()[0])
    parser.add_argument("--conf", default="local", help="conf name or path (its spark.* and home are used)")
    parser.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE")
    parser.add_argument("--port", type=int, default=15002)
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args(argv)
    cfg = load_config(args.conf, args.overrides)
    print(f"Spark Connect server on sc://{args.host}:{args.port} (Delta, warehouse under {cfg.home}); "
          f"run the jobs with --set spark.remote=sc://{args.host}:{args.port}", file=sys.stderr)
    return subprocess.call(server_command(cfg, args.port, args.host))


if __name__ == "__main__":
    sys.exit(main())
