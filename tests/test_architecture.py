"""The boundaries the code promises (ARCHITECTURE.md), checked on its source.

import-linter (`lint-imports`, in the README's test command) checks the layer contracts in
pyproject.toml; it sees only pallas-check's own modules, so the JAX boundary is checked here.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "pallas_check"
BRIDGE = PACKAGE / "jaxbridge"


def _imported_modules(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from jax._src import core` imports jax._src.core (or a name of jax._src).
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def test_only_the_bridge_imports_jax_private_modules():
    offenders = [f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}"
                 for path in sorted(PACKAGE.rglob("*.py")) if BRIDGE not in path.parents
                 for line, module in _imported_modules(path)
                 if module == "jax._src" or module.startswith("jax._src.")]
    assert offenders == []


def test_the_bridge_imports_each_private_module_once():
    modules = [m for _, m in _imported_modules(BRIDGE / "__init__.py")
               if m.startswith("jax._src")]
    assert modules and len(modules) == len(set(modules))


def test_every_folder_of_the_package_is_a_package():
    """setuptools ships only folders with an __init__.py (engine/ once had none)."""
    folders = {p.parent for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts}
    assert [f for f in folders if not (f / "__init__.py").exists()] == []


def test_run_diff_and_native_share_one_run_path(monkeypatch):
    """The three commands differ only in the Command they hand to runner.run_command."""
    from pallas_check import compare, native, runner
    from pallas_check.config import Config
    from pallas_check.exitcodes import ExitCode

    seen: list[str] = []

    def fake_run_command(command, script, args, fmt, output):
        seen.append(type(command).__name__)
        return ExitCode.CLEAN

    monkeypatch.setattr(runner, "run_command", fake_run_command)
    config = Config()
    runner.run_and_report("k.py", [], config, "json", None)
    compare.run_diff_and_report("k.py", [], config, compare.parse_against("hlo", config),
                                None, None, "json", None)
    native.run_native_and_report("k.py", [], "json", None)
    assert seen == ["CheckCommand", "DiffCommand", "NativeCommand"]


def test_no_import_cycle_anywhere():
    """Strongly connected groups of pallas-check modules (lazy imports included): none."""
    import grimp

    graph = grimp.build_graph("pallas_check")
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(module: str) -> None:  # Tarjan's strongly connected components
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in edges[module]:
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    assert cycles == []


def test_no_function_is_longer_than_80_lines():
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > 80:
                    long.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
                                f" {node.name} ({lines} lines)")
    assert long == []


def test_no_module_is_longer_than_500_lines():
    """A module that outgrows 500 lines holds more than one thing: cut it along what it
    holds (issue 27; the engine's wings keep each concern in a file of its own)."""
    long = [f"{path.relative_to(PACKAGE.parent)}: {count} lines"
            for path in sorted(PACKAGE.rglob("*.py"))
            if (count := len(path.read_text().splitlines())) > 500]
    assert long == []
