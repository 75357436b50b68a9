"""The shape of the jobs (read from the source with ``ast``, no Spark): short functions in the stage jobs and the
orchestrators, no stage job importing another, no private name borrowed across modules, project imports at the
top of the stage jobs, no import cycle among ``jobs/`` modules (``jobs/platform/`` included), the platform
importing nothing of the jobs that run on it, and the readers importing nothing of ``jobs``."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from jobs.platform.runner import LAZY_IMPORTS

ROOT = Path(__file__).resolve().parents[1]
JOBS = ROOT / "jobs"
#: what the jobs run on (the conf, the Spark session, tables, MLflow, the lock, the runner): below every job
PLATFORM = JOBS / "platform"
#: the corpora's file formats, below ``jobs`` (beside ``udfs``)
READERS = ROOT / "readers"
STAGE_JOBS = ("ingest", "extract", "embed", "retrieve", "generate", "train", "evaluate")
ORCHESTRATORS = ("pipeline", "experiment")
#: the modules the experiment is made of besides its orchestrator: held to the same shape
EXPERIMENT_PARTS = ("cells", "tuning")
MAX_LINES = 40

#: functions still over MAX_LINES, with their length now: the list may only shrink, a listed function only get
#: shorter
OVER_LENGTH: dict[tuple[str, str], int] = {}

#: imports of project modules inside function bodies of the stage jobs and orchestrators still to be moved to the
#: top
INNER_IMPORTS_LEFT: set[str] = set()


def _dotted(path: Path) -> str:
    """``jobs/platform/config.py`` -> ``jobs.platform.config``; a package's ``__init__.py`` -> the package."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


#: every module of ``jobs/`` and ``jobs/platform/`` by its dotted name
JOBS_MODULES = {_dotted(path): path for path in sorted([*JOBS.glob("*.py"), *PLATFORM.glob("*.py")])}


def _tree(module: str) -> ast.Module:
    return ast.parse((JOBS / f"{module}.py").read_text(), filename=f"jobs/{module}.py")


def _functions(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def _imported(node: ast.AST) -> list[str]:
    """The modules an import statement names (``from jobs import x`` names ``jobs.x``, ``from jobs.platform import
    x`` names ``jobs.platform.x``: the names imported from a package of the project are its modules)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.module and not node.level:
        if (ROOT.joinpath(*node.module.split(".")) / "__init__.py").is_file():
            return [f"{node.module}.{alias.name}" for alias in node.names]
        return [node.module]
    return []


def _jobs_imports(tree: ast.AST) -> set[str]:
    """Every module of ``jobs/`` or ``jobs/platform/`` (its dotted name) a module imports, at its top or inside a
    function."""
    return {name for node in ast.walk(tree) for name in _imported(node) if name in JOBS_MODULES}


def _length(node: ast.AST) -> int:
    return node.end_lineno - node.lineno + 1


@pytest.mark.parametrize("module", STAGE_JOBS + ORCHESTRATORS + EXPERIMENT_PARTS)
def test_no_function_over_forty_lines(module):
    tree = _tree(module)
    for fn in _functions(tree):
        limit = OVER_LENGTH.get((module, fn.name), MAX_LINES)
        assert _length(fn) <= limit, f"jobs/{module}.py: {fn.name} is {_length(fn)} lines (at most {limit})"


def test_the_over_length_list_only_shrinks():
    """A listed function that is now short enough is taken off the list."""
    for (module, name), limit in OVER_LENGTH.items():
        lengths = [_length(fn) for fn in _functions(_tree(module)) if fn.name == name]
        assert lengths and max(lengths) > MAX_LINES, f"jobs/{module}.py: {name} is short now: drop it from the list"
        assert max(lengths) <= limit


@pytest.mark.parametrize("module", STAGE_JOBS)
def test_no_stage_job_imports_another(module):
    stages = {f"jobs.{name}" for name in STAGE_JOBS + ORCHESTRATORS}
    others = _jobs_imports(_tree(module)) & stages - {f"jobs.{module}"}
    assert not others, f"jobs/{module}.py imports the stage jobs {sorted(others)}: share names via jobs.vocabulary"


def test_the_platform_imports_nothing_of_the_jobs_that_run_on_it():
    """``jobs/platform/`` imports no stage job, orchestrator or other module of ``jobs/``: only ``jobs.platform``."""
    platform = {name: path for name, path in JOBS_MODULES.items() if path.parent == PLATFORM}
    assert {"jobs.platform.config", "jobs.platform.runner", "jobs.platform.spark"} <= set(platform)
    for name, path in platform.items():
        above = {m for m in _jobs_imports(ast.parse(path.read_text())) if not m.startswith("jobs.platform")}
        stages = above & {f"jobs.{stage}" for stage in STAGE_JOBS + ORCHESTRATORS}
        assert not above, (f"{path.relative_to(ROOT)} imports {sorted(above)} (stage jobs: {sorted(stages)}): the "
                           "platform is below the jobs")


def test_the_readers_import_nothing_of_jobs():
    """``readers/`` (the corpora's file formats, pandas only) imports nothing of ``jobs`` and no Spark."""
    paths = sorted(READERS.glob("*.py"))
    assert READERS / "corpora.py" in paths
    for path in paths:
        names = {name for node in ast.walk(ast.parse(path.read_text())) for name in _imported(node)}
        above = sorted(n for n in names if n.split(".")[0] in ("jobs", "pyspark"))
        assert not above, f"{path.relative_to(ROOT)} imports {above}: the readers are below the jobs"


def test_no_private_name_is_borrowed_across_modules():
    for path in [*JOBS_MODULES.values(), *sorted(READERS.glob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            prefixes = ("jobs", "udfs", "models", "readers")
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(prefixes):
                private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                assert not private, f"{path.relative_to(ROOT)} imports private {private} from {node.module}"


@pytest.mark.parametrize("module", STAGE_JOBS + ORCHESTRATORS + EXPERIMENT_PARTS)
def test_project_imports_at_module_top(module):
    """Inside functions only the heavy or optional imports of :data:`jobs.platform.runner.LAZY_IMPORTS`."""
    if module in INNER_IMPORTS_LEFT:
        pytest.skip(f"jobs/{module}.py: inner imports not moved yet")
    inner = set()
    for fn in _functions(_tree(module)):
        for node in ast.walk(fn):
            for name in _imported(node):
                if not any(name == lazy or name.startswith(lazy + ".") for lazy in LAZY_IMPORTS):
                    inner.add(name)
    assert not inner, f"jobs/{module}.py imports {sorted(inner)} inside functions: move them to the top"


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of ``graph`` (module -> the modules it imports) as a path that ends where it starts, or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(module: str, path: list[str]) -> list[str] | None:
        state[module] = 1
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state and (cycle := visit(target, path + [target])):
                return cycle
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module, [module])):
            return cycle
    return None


def test_no_import_cycle_among_jobs_modules():
    """Over ``jobs/*.py`` and ``jobs/platform/*.py`` together."""
    graph = {name: _jobs_imports(ast.parse(path.read_text())) - {name} for name, path in JOBS_MODULES.items()}
    assert "jobs.platform.runner" in graph["jobs.ingest"]  # the platform's modules are in the graph
    cycle = find_cycle(graph)
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


def test_the_cycle_check_sees_imports_inside_functions():
    """A cycle hidden by an import inside a function body is found (the check itself is checked)."""
    a = ast.parse("def f():\n    from jobs.b import g\n")
    b = ast.parse("from jobs import a\n")
    graph = {"a": {n.split(".")[1] for node in ast.walk(a) for n in _imported(node)},
             "b": {n.split(".")[1] for node in ast.walk(b) for n in _imported(node)}}
    assert find_cycle(graph) == ["a", "b", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
