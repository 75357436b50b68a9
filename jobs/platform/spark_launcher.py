"""pyspark's own launcher scripts (``bin/spark-submit``, ``bin/spark-class``) and stopping what they started: shared
by the local Spark Connect server (:mod:`jobs.platform.connect_server`) and the standalone cluster
(:mod:`jobs.platform.standalone_cluster`)."""
from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path


def pyspark_script(name: str) -> str:
    """The path of pyspark's ``bin/<name>`` (the pip package's own Spark)."""
    import pyspark

    path = Path(pyspark.__file__).parent / "bin" / name
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: pyspark {pyspark.__version__} is installed without its launcher")
    return str(path)


def stop_process_group(process: subprocess.Popen, timeout_s: float = 60.0) -> None:
    """SIGTERM the process's group (a JVM and what it started: executors, Python workers), SIGKILL it if it is still
    there after ``timeout_s``."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout_s)
    except ProcessLookupError:
        pass
