"""The shape of the jobs (read from the source with ``ast``, no Spark): short functions in the stage jobs and the
orchestrators, no stage job importing another, no private name borrowed across modules, project imports at the
top of the stage jobs, and no import cycle among ``jobs/`` modules."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from jobs.platform.runner import LAZY_IMPORTS

JOBS = Path(__file__).resolve().parents[1] / "jobs"
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


def _tree(module: str) -> ast.Module:
    return ast.parse((JOBS / f"{module}.py").read_text(), filename=f"jobs/{module}.py")


def _functions(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def _imported(node: ast.AST) -> list[str]:
    """The modules an import statement names (``from jobs import x`` names ``jobs.x``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.module and not node.level:
        if node.module == "jobs":
            return [f"jobs.{alias.name}" for alias in node.names]
        return [node.module]
    return []


def _jobs_imports(tree: ast.AST) -> set[str]:
    """Every ``jobs.<module>`` a module imports, at its top or inside a function."""
    found = set()
    for node in ast.walk(tree):
        for name in _imported(node):
            if name.startswith("jobs.") and (JOBS / f"{name.split('.')[1]}.py").is_file():
                found.add(name.split(".")[1])
    return found


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
    others = _jobs_imports(_tree(module)) & (set(STAGE_JOBS) | set(ORCHESTRATORS)) - {module}
    assert not others, f"jobs/{module}.py imports the stage jobs {sorted(others)}: share names via jobs.vocabulary"


def test_no_private_name_is_borrowed_across_modules():
    for path in sorted(JOBS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(("jobs", "udfs", "models")):
                private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                assert not private, f"jobs/{path.name} imports private {private} from {node.module}"


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
    graph = {path.stem: _jobs_imports(ast.parse(path.read_text())) - {path.stem} for path in JOBS.glob("*.py")}
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
