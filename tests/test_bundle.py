"""The Databricks Asset Bundle and the notebooks, checked without a Databricks CLI or workspace.

databricks.yml and its included resources/*.yml are parsed with PyYAML: targets, variables, the pipeline's task
graph (ingest -> {extract, embed} -> retrieve -> generate -> train -> evaluate), job clusters (GPU ones set the
GPU resource amounts), and every python_wheel_task's parameters parsed by the real ``erg`` parser and validated by
the real conf loader. The wheel artifact's build command is run on a copy of the project and the wheel's entry point
checked. The notebooks are checked for the Databricks source format, and every SQL they run is analysed by Spark
against the schemas of jobs.platform.tables.TABLES (and the training_set view).
"""
from __future__ import annotations

import ast
import datetime as dt
import fnmatch
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml

from jobs.cli import COMMANDS, build_parser
from jobs.platform.config import conf_names, load_config
from jobs.platform.tables import TABLES

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.py"))
HEADER = "# Databricks notebook source"
SEPARATOR = "\n# COMMAND ----------\n"
VAR = re.compile(r"\$\{var\.([A-Za-z_][A-Za-z0-9_]*)\}")
# the order of the ERG stages: a task may depend only on tasks of earlier stages
STAGE_RANK = {"ingest": 0, "extract": 1, "embed": 1, "retrieve": 2, "generate": 3, "train": 4, "evaluate": 5}


# ------------------------------------------------------------------------------------------------ the bundle
def _load_bundle() -> dict:
    bundle = yaml.safe_load((ROOT / "databricks.yml").read_text())
    jobs: dict = {}
    for pattern in bundle.get("include", []):
        files = sorted(ROOT.glob(pattern))
        assert files, f"include {pattern!r} matches no file"
        for path in files:
            part = yaml.safe_load(path.read_text())
            assert set(part) == {"resources"}, f"{path.name} should hold only resources"
            for name, job in part["resources"].get("jobs", {}).items():
                assert name not in jobs, f"job {name} is defined twice"
                jobs[name] = {**job, "_file": path}
    bundle["jobs"] = jobs
    return bundle


BUNDLE = _load_bundle()
DEFAULTS = {name: var["default"] for name, var in BUNDLE["variables"].items()}


def _resolve(value):
    """Substitute ``${var.x}`` with the variable's default, as ``databricks bundle validate`` does for dev."""
    if isinstance(value, str):
        whole = VAR.fullmatch(value)
        if whole:
            return DEFAULTS[whole.group(1)]
        return VAR.sub(lambda m: str(DEFAULTS[m.group(1)]), value)
    if isinstance(value, list):
        return [_resolve(v) for v in value]
    if isinstance(value, dict):
        return {k: _resolve(v) for k, v in value.items()}
    return value


def _strings(node):
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for value in node.values():
            yield from _strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from _strings(value)


def _wheel_tasks():
    for job_name, job in BUNDLE["jobs"].items():
        for task in job["tasks"]:
            yield job_name, job, task


PIPELINE = {task["task_key"]: task for task in BUNDLE["jobs"]["erg_pipeline"]["tasks"]}


def _command(task: dict) -> str:
    return task["python_wheel_task"]["parameters"][0]


def test_targets_and_variables():
    targets = BUNDLE["targets"]
    assert targets["dev"]["mode"] == "development" and targets["dev"]["default"] is True
    assert targets["prod"]["mode"] == "production" and "root_path" in targets["prod"]["workspace"]
    assert DEFAULTS["catalog"] == "main" and DEFAULTS["schema"] == "erg"
    prod_schema = targets["prod"]["variables"]["schema"]
    assert prod_schema != DEFAULTS["schema"] and re.fullmatch(r"[a-z_][a-z0-9_]*", prod_schema)
    used = {m.group(1) for text in _strings(BUNDLE) for m in VAR.finditer(text)}
    assert used <= set(DEFAULTS), f"undeclared variables: {used - set(DEFAULTS)}"
    assert set(DEFAULTS) <= used, f"declared but unused variables: {set(DEFAULTS) - used}"
    assert not any(re.search(r"(?i)(token|password|secret)\s*[:=]", text) for text in _strings(BUNDLE))


def test_prod_runs_as_a_service_principal_and_grants_an_operators_group_runs_only():
    prod, dev = BUNDLE["targets"]["prod"], BUNDLE["targets"]["dev"]
    assert VAR.fullmatch(prod["run_as"]["service_principal_name"]).group(1) == "prod_service_principal"
    assert prod["permissions"] == [{"level": "CAN_RUN", "group_name": "${var.operators_group}"}]
    assert "run_as" not in dev and "permissions" not in dev  # dev deploys run as the developer


def test_no_conf_or_bundle_file_holds_a_token_or_password():
    files = [ROOT / "databricks.yml", *sorted((ROOT / "resources").glob("*.yml")),
             *sorted((ROOT / "conf").glob("*.yaml"))]
    secret = re.compile(r"(?i)\b(token|password|passwd|secret|api[_-]?key|access[_-]?key)\b\s*[:=]\s*\S+"
                        r"|dapi[0-9a-f]{32}|AKIA[0-9A-Z]{16}|\bghp_[A-Za-z0-9]{36}\b")
    for path in files:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            assert not secret.search(line), f"{path.name}:{number} looks like a secret: {line.strip()}"
    assert secret.search("token: dapi0123456789abcdef0123456789abcdef")  # the check itself bites


def test_pipeline_task_graph_runs_the_erg_stages_in_order():
    keys = [task["task_key"] for task in BUNDLE["jobs"]["erg_pipeline"]["tasks"]]
    assert len(keys) == len(set(keys))
    deps = {key: [d["task_key"] for d in task.get("depends_on", [])] for key, task in PIPELINE.items()}
    for key, needs in deps.items():
        assert set(needs) <= set(PIPELINE), f"{key} depends on unknown tasks {set(needs) - set(PIPELINE)}"
        for need in needs:  # every edge goes forward in the ERG order, so the graph is acyclic
            assert STAGE_RANK[_command(PIPELINE[need])] < STAGE_RANK[_command(PIPELINE[key])], (need, key)
    order, done = [], set()
    while len(order) < len(deps):  # a topological order exists
        ready = sorted(k for k in deps if k not in done and set(deps[k]) <= done)
        assert ready, f"cycle among {set(deps) - done}"
        order += ready
        done |= set(ready)
    by_command = {}
    for key in keys:
        by_command.setdefault(_command(PIPELINE[key]), []).append(key)
    assert set(by_command) == set(STAGE_RANK)
    assert deps["ingest"] == [] and set(deps["extract"]) == set(deps["embed"]) == {"ingest"}
    assert deps["retrieve"] == ["embed"] and set(deps["generate"]) == {"extract", "retrieve"}
    trains = by_command["train"]
    assert all(deps[t] == ["generate"] for t in trains) and set(deps["evaluate"]) == set(trains)
    variants = {t: next(p for p in PIPELINE[t]["python_wheel_task"]["parameters"] if p.startswith("train.use_augmented="))
                for t in trains}
    assert sorted(variants.values()) == ["train.use_augmented=false", "train.use_augmented=true"]
    assert order.index("ingest") == 0 and order[-1] == "evaluate"


def test_tasks_run_on_their_jobs_clusters_and_gpu_clusters_claim_gpus():
    for job_name, job in BUNDLE["jobs"].items():
        clusters = {c["job_cluster_key"]: _resolve(c["new_cluster"]) for c in job["job_clusters"]}
        for task in job["tasks"]:
            assert task["job_cluster_key"] in clusters, (job_name, task["task_key"])
            gpu = "gpu" in clusters[task["job_cluster_key"]]["spark_version"]
            assert gpu == (_command(task) != "ingest"), f"{task['task_key']}: model tasks run on GPU, ingest on CPU"
        for key, cluster in clusters.items():
            assert "-ml-" in cluster["spark_version"] and cluster["spark_version"].endswith("scala2.13")
            assert isinstance(cluster["num_workers"], int) and cluster["num_workers"] >= 1
            assert cluster["spark_env_vars"]["ERG_CATALOG"] == DEFAULTS["catalog"]
            assert cluster["spark_env_vars"]["ERG_SCHEMA"] == DEFAULTS["schema"]
            if "gpu" in cluster["spark_version"]:
                assert float(cluster["spark_conf"]["spark.task.resource.gpu.amount"]) > 0, key
                assert float(cluster["spark_conf"]["spark.executor.resource.gpu.amount"]) >= 1, key
                assert cluster["node_type_id"].startswith(("g4dn", "g5", "g6", "p3", "p4", "p5")), "an AWS GPU node"


def test_incremental_job_is_triggered_by_new_raw_files():
    job = BUNDLE["jobs"]["erg_incremental"]
    url = _resolve(job["trigger"]["file_arrival"]["url"])
    assert url == f"/Volumes/{DEFAULTS['catalog']}/{DEFAULTS['schema']}/raw/"
    (task,) = job["tasks"]
    assert task["python_wheel_task"]["parameters"][:1] == ["run"] and "--incremental" in task["python_wheel_task"]["parameters"]
    assert job["max_concurrent_runs"] == 1


def test_every_wheel_task_parses_with_the_erg_cli_and_its_conf_validates(monkeypatch):
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    distribution = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"]
    parser = build_parser()
    count = 0
    for job_name, job, task in _wheel_tasks():
        wheel = task["python_wheel_task"]
        assert re.sub(r"[-.]+", "_", distribution) == wheel["package_name"]
        assert scripts[wheel["entry_point"]] == "jobs.cli:main"
        params = _resolve(wheel["parameters"])
        assert params[0] in COMMANDS, f"{task['task_key']}: {params[0]!r} is not an erg command"
        try:
            args = parser.parse_args(params)
        except SystemExit:
            pytest.fail(f"{job_name}.{task['task_key']}: erg cannot parse {params}")
        assert args.conf in conf_names(), f"--conf {args.conf} is not a shipped conf"
        env = _resolve(next(c for c in job["job_clusters"] if c["job_cluster_key"] == task["job_cluster_key"])
                       ["new_cluster"]["spark_env_vars"])
        for name, value in env.items():
            monkeypatch.setenv(name, str(value))
        cfg = load_config(args.conf, args.overrides)
        assert cfg.platform == "databricks"
        assert (cfg.tables.catalog, cfg.tables.schema_name) == (DEFAULTS["catalog"], DEFAULTS["schema"])
        if args.command in ("train", "experiment"):
            assert cfg.train.num_processes == DEFAULTS["gpu_workers"] and cfg.train.use_gpu
        libraries = [lib["whl"] for lib in task["libraries"] if "whl" in lib]
        packages = [lib["pypi"]["package"] for lib in task["libraries"] if "pypi" in lib]
        gpu = "spark.task.resource.gpu.amount" in next(
            c for c in job["job_clusters"] if c["job_cluster_key"] == task["job_cluster_key"]
        )["new_cluster"].get("spark_conf", {})
        # Faiss comes with the cluster's libraries: the GPU build on GPU clusters (never faiss-cpu beside it)
        assert [p.split("==")[0] for p in packages] == (["faiss-gpu-cu12"] if gpu else []), (task["task_key"], packages)
        artifact_files = [f["source"] for a in BUNDLE["artifacts"].values() for f in a["files"]]
        for lib in libraries:  # the library glob (relative to its resources file) covers the built wheel
            lib_path = os.path.relpath((job["_file"].parent / lib).resolve(), ROOT)
            assert any(fnmatch.fnmatch(src, lib_path) for src in artifact_files), (lib, artifact_files)
        count += 1
    assert count == len(PIPELINE) + 2  # the pipeline's tasks, erg_incremental's and erg_experiment's


def test_wheel_artifact_builds_with_the_erg_entry_point(tmp_path):
    (artifact,) = BUNDLE["artifacts"].values()
    assert artifact["type"] == "whl" and (ROOT / artifact["path"] / "pyproject.toml").is_file()
    project = tmp_path / "project"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in ("models", "udfs", "readers", "jobs", "conf"):
        shutil.copytree(ROOT / name, project / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, project / name)
    command = shlex.split(artifact["build"])
    assert command[0].startswith("python")
    # offline here: build against the installed setuptools rather than an isolated, downloaded one
    done = subprocess.run([sys.executable, *command[1:], "--no-build-isolation", "-q"], cwd=project,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = [w for pattern in artifact["files"] for w in glob.glob(str(project / pattern["source"]))]
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        assert {"jobs/cli.py", "jobs/compare.py", "conf/databricks.yaml", "jobs/platform/jars/pom.xml",
                "models/style_classifier.py", "udfs/runtime.py", "readers/corpora.py"} <= names
        info = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        assert re.search(r"^erg\s*=\s*jobs\.cli:main$", zf.read(info).decode(), re.M)
    assert Path(wheel).name.startswith("erg_on_spark-")


# ---------------------------------------------------------------------------------------------- the notebooks
def _cells(path: Path) -> list[str]:
    text = path.read_text()
    assert text.startswith(HEADER + "\n"), f"{path.name} must start with {HEADER!r}"
    cells = [cell.strip("\n") for cell in text[len(HEADER) + 1:].split(SEPARATOR)]
    assert all(cells), f"{path.name} has an empty cell"
    return cells


def _magic(cell: str) -> tuple[str, str] | None:
    """(``%sql``/``%md``/``%run``, body) for a magic cell; None for a Python cell."""
    lines = cell.splitlines()
    if not lines[0].startswith("# MAGIC %"):
        assert "# MAGIC" not in cell, "MAGIC lines only in magic cells"
        return None
    assert all(line == "# MAGIC" or line.startswith("# MAGIC ") for line in lines), cell
    body = "\n".join(line[len("# MAGIC "):] for line in lines)
    kind, _, rest = body.partition("\n")
    return kind.split()[0], (kind.split(maxsplit=1)[1] if " " in kind else rest)


def _notebook_sql(path: Path) -> list[str]:
    """Every SQL statement a notebook runs: %sql cells, spark.sql("...") and spark.table("...") in Python cells."""
    queries = []
    for cell in _cells(path):
        magic = _magic(cell)
        if magic is None:
            for node in ast.walk(ast.parse(cell)):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and isinstance(node.func.value, ast.Name) and node.func.value.id == "spark"
                        and node.func.attr in ("sql", "table")):
                    assert isinstance(node.args[0], ast.Constant), f"{path.name}: spark.{node.func.attr} takes a literal"
                    arg = node.args[0].value
                    queries.append(arg if node.func.attr == "sql" else f"SELECT * FROM {arg}")
        elif magic[0] == "%sql":
            queries.append(magic[1])
    return queries


def _tables_in(sql: str) -> set[str]:
    return {name.split(".")[-1].strip("`") for name in re.findall(r"(?i)\b(?:FROM|JOIN)\s+([`\w.]+)", sql)}


def test_notebooks_are_databricks_source_files():
    names = {path.stem for path in NOTEBOOKS}
    assert {"00_setup", "01_explore_augmented_captions", "02_compare_runs", "03_quarantine_and_lineage"} <= names
    for path in NOTEBOOKS:
        cells = _cells(path)
        ast.parse(path.read_text())  # the whole file is Python (magic cells are comments)
        assert _magic(cells[0])[0] == "%md", f"{path.name} opens with a title cell"
        runs = [_magic(c)[1].strip() for c in cells if _magic(c) and _magic(c)[0] == "%run"]
        for target in runs:
            assert (path.parent / f"{target}.py").is_file(), f"{path.name}: %run {target} does not exist"
        if path.stem != "00_setup":
            assert runs == ["./00_setup"] and _magic(cells[1]) == ("%run", "./00_setup")
    setup = (ROOT / "notebooks" / "00_setup.py").read_text()
    for widget in ("catalog", "schema"):
        assert f'dbutils.widgets.text("{widget}"' in setup
    assert "jobs.compare(cfg" in (ROOT / "notebooks" / "02_compare_runs.py").read_text()  # the public API


def test_notebook_sql_names_only_erg_tables():
    allowed = set(TABLES) | {"training_set"}
    seen = set()
    for path in NOTEBOOKS:
        for sql in _notebook_sql(path):
            tables = _tables_in(sql)
            assert tables <= allowed, f"{path.name} queries unknown tables {tables - allowed}"
            seen |= tables
    assert {"augmented_captions", "quarantine", "training_set"} <= seen


def _augmented_rows() -> list[dict]:
    now = dt.datetime(2026, 1, 1)
    rows = []
    for i, (style, passed_ppl, passed_sim) in enumerate(
            [("humor", True, True), ("humor", False, True), ("romantic", True, True), ("romantic", True, False)]):
        rows.append({
            "query_id": f"q{i}", "image_id": f"img{i}", "image_uri": None, "factual_caption": "a dog runs on grass",
            "scene_id": f"s{i}", "retrieval_type": "t2t" if i % 2 else "i2t", "style": style,
            "style_phrase": "happily", "generated_caption": "a dog happily runs on grass", "similarity": 0.7 - i / 10,
            "predicted_style": style, "style_probability": 0.9, "perplexity": 40.0 if passed_ppl else 200.0,
            "passed_style": True, "passed_perplexity": passed_ppl, "passed_similarity": passed_sim,
            "passed": passed_ppl and passed_sim,
            "reject_reason": None if passed_ppl and passed_sim else ("perplexity" if not passed_ppl else "similarity"),
            "generator_version": "gen-run", "run_id": "gen-run", "created_at": now})
    return rows


@pytest.mark.spark
def test_notebook_sql_runs_on_the_erg_tables(spark, test_cfg):
    """Every notebook query, analysed on temp views of the tables' real schemas (four augmented captions in D_a)
    and the registered training_set view: the tables and columns it names exist; two of them run, with the right
    pass rates and samples."""
    from jobs.platform.tables import table_name

    views = {name: spark.createDataFrame(_augmented_rows() if name == "augmented_captions" else [], spec.schema)
             for name, spec in TABLES.items()}
    views["training_set"] = spark.table(table_name(test_cfg, "training_set"))
    for name, frame in views.items():
        frame.createOrReplaceTempView(name)
    try:
        # spark.sql analyses eagerly: an unknown table or column fails here
        frames = {sql: spark.sql(sql) for path in NOTEBOOKS for sql in _notebook_sql(path)}
        per_filter = next(frame for sql, frame in frames.items() if "pass_rate_perplexity" in sql).collect()
        samples = next(frame for sql, frame in frames.items() if "rank_in_style" in sql).collect()
    finally:
        for name in views:
            spark.catalog.dropTempView(name)
    assert len(frames) >= 12 and any("FROM training_set" in sql for sql in frames)
    by_style = {row["style"]: row.asDict() for row in per_filter}
    assert by_style["humor"]["candidates"] == 2 and by_style["humor"]["pass_rate_perplexity"] == 0.5
    assert by_style["romantic"]["pass_rate_similarity"] == 0.5 and by_style["romantic"]["pass_rate"] == 0.5
    assert by_style["humor"]["pass_rate_style"] == 1.0
    assert sorted(row["style"] for row in samples) == ["humor", "romantic"]  # the kept caption of each style
    assert {row["similarity"] for row in samples} == {0.7, 0.5}
