"""Delta Lake's jars for a local Spark session, resolved once through Maven into a local folder.

delta-spark's pip package ships no jars; its ``configure_spark_with_delta_pip`` only sets
``spark.jars.packages`` and leaves Ivy to fetch them on every new machine. Here the machine's Maven resolves
``io.delta:delta-spark_<spark>_<scala>`` with its dependencies into ``jars_dir`` (``mvn dependency:copy-dependencies``
over ``jobs/platform/jars/pom.xml``); artifacts that pyspark already ships (Hadoop, Jackson, Parquet, Scala ...) are
left out so the classpath holds one version of each. Once the folder is filled, sessions start with no network.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from importlib import resources
from pathlib import Path

DELTA_VERSION = "4.4.0"
DELTA_ARTIFACT = "delta-spark_4.2_2.13"
_MARKER = ".resolved"
_VERSIONED_JAR = re.compile(r"^(?P<artifact>.+?)-(?P<version>\d[\w.\-]*)\.jar$")


class JarResolutionError(RuntimeError):
    """Maven could not resolve Delta's jars."""


def artifact_name(jar_file: str) -> str:
    """``jackson-core-2.21.2.jar`` -> ``jackson-core``; ``hive-exec-2.3.10-core.jar`` -> ``hive-exec``."""
    match = _VERSIONED_JAR.match(jar_file)
    return match.group("artifact") if match else jar_file.removesuffix(".jar")


def pyspark_artifacts() -> set[str]:
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    return {artifact_name(p.name) for p in jars.glob("*.jar")}


def delta_jars(jars_dir: str | os.PathLike) -> list[str]:
    """The resolved jars in ``jars_dir``, or [] when the folder has not been resolved yet."""
    folder = Path(jars_dir)
    if not (folder / _MARKER).exists():
        return []
    return sorted(str(p) for p in folder.glob("*.jar"))


def resolve_delta_jars(jars_dir: str | os.PathLike, *, mvn: str | None = None, quiet: bool = True) -> list[str]:
    """Resolve Delta's jars into ``jars_dir`` with Maven (a no-op when already resolved); returns their paths."""
    existing = delta_jars(jars_dir)
    if existing:
        return existing
    mvn = mvn or shutil.which("mvn")
    if not mvn:
        raise JarResolutionError(
            "Maven ('mvn') is not on PATH: install it (apt-get install maven) or fill "
            f"{jars_dir} with io.delta:{DELTA_ARTIFACT}:{DELTA_VERSION} and its dependencies"
        )
    folder = Path(jars_dir)
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="erg-jars-") as staging:
        pom = resources.files("jobs.platform") / "jars" / "pom.xml"
        cmd = [mvn, "-B", "-f", str(pom), "dependency:copy-dependencies", f"-DoutputDirectory={staging}",
               "-DincludeScope=runtime", f"-Ddelta.version={DELTA_VERSION}", f"-Ddelta.artifact={DELTA_ARTIFACT}"]
        if quiet:
            cmd.insert(1, "-q")
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise JarResolutionError(f"mvn failed ({proc.returncode}): {(proc.stdout + proc.stderr)[-2000:]}")
        shipped = pyspark_artifacts()
        for jar in Path(staging).glob("*.jar"):
            if artifact_name(jar.name) not in shipped:
                shutil.copy2(jar, folder / jar.name)
    (folder / _MARKER).write_text(f"io.delta:{DELTA_ARTIFACT}:{DELTA_VERSION}\n")
    return delta_jars(folder)
