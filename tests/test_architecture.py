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
    from pallas_check.commands import diff as compare
    from pallas_check.commands import native, sides
    from pallas_check.run import runner
    from pallas_check.config import Config
    from pallas_check.config.exitcodes import ExitCode

    seen: list[str] = []

    def fake_run_command(command, script, args, fmt, output):
        seen.append(type(command).__name__)
        return ExitCode.CLEAN

    monkeypatch.setattr(runner, "run_command", fake_run_command)
    config = Config()
    runner.run_and_report("k.py", [], config, "json", None)
    compare.run_diff_and_report("k.py", [], config, sides.parse_against("hlo", config),
                                compare.Tolerance(), "json", None)
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


# A format's name: what `--format` takes (config/formats.py `Format`, its values and members).
_FORMAT_NAMES = {"table", "json", "sarif", "text"}
_FORMAT_MEMBERS = {"TABLE", "JSON", "SARIF", "TEXT"}


def _is_a_format_name(node: ast.expr) -> bool:
    """`"table"`, `Format.TABLE`, or a tuple/list/set holding one (`in ("table", "text")`)."""
    if isinstance(node, ast.Constant):
        return node.value in _FORMAT_NAMES
    if isinstance(node, ast.Attribute):
        return (node.attr in _FORMAT_MEMBERS and isinstance(node.value, ast.Name)
                and node.value.id == "Format")
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_is_a_format_name(element) for element in node.elts)
    return False


def _is_a_format(node: ast.expr) -> bool:
    """An expression that holds a format: it reads a name, attribute or key spelled with
    `fmt` or `format` (`fmt`, `self.fmt`, `Format(fmt).value`, `options["fmt"]`)."""
    spelled = [n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute)
               else n.value for n in ast.walk(node)
               if isinstance(n, (ast.Name, ast.Attribute))
               or (isinstance(n, ast.Constant) and isinstance(n.value, str))]
    return any("fmt" in word.lower() or "format" in word.lower() for word in spelled)


def branches_on_a_format_name(source: str) -> list[int]:
    """The lines of `source` that compare a format with a format's name (`fmt == "table"`,
    `self.fmt != "json"`, `fmt not in ("table", "text")`, `fmt is Format.SARIF`, a `match`
    on a format with a format's name as a case)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any((_is_a_format_name(a) and _is_a_format(b))
                   or (_is_a_format_name(b) and _is_a_format(a))
                   for a, b in zip(operands, operands[1:])):
                lines.append(node.lineno)
        elif isinstance(node, ast.Match) and _is_a_format(node.subject):
            lines += [case.pattern.lineno for case in node.cases
                      if isinstance(case.pattern, ast.MatchValue)
                      and _is_a_format_name(case.pattern.value)]
    return lines


def test_the_scan_sees_a_branch_on_a_format_name_and_nothing_else():
    flagged = ['fmt == "table"', 'self.fmt != "table"', '"sarif" == fmt',
               'fmt not in ("table", "text")', 'Format(fmt) is Format.TABLE',
               'str(options["fmt"]) == "json"', 'output_format in ["json"]']
    for source in flagged:
        assert branches_on_a_format_name(source) == [1], source
    assert branches_on_a_format_name('match fmt:\n    case "sarif":\n        pass') == [2]
    unrelated = ['fmt == INTERLEAVED', 'region["snippet"] = {"text": code}',
                 'mode == "text"', 'kind in ("json", "sarif")', 'fmt.for_people',
                 'Format(fmt) in Format.accepted_by(NATIVE)', 'match mode:\n case "json": pass']
    for source in unrelated:
        assert branches_on_a_format_name(source) == [], source


def test_no_module_branches_on_a_format_name():
    """What a format means to a command (the table for people, a progress line beside it,
    how the hook merges scripts' reports) lives on its `Format` member
    (config/formats.py), so that a new format is one member and one module (issue 37)."""
    from pallas_check.config.formats import Format

    assert ({f.value for f in Format}, {f.name for f in Format}) == (_FORMAT_NAMES,
                                                                     _FORMAT_MEMBERS)
    formats = PACKAGE / "config" / "formats.py"
    offenders = [f"{path.relative_to(PACKAGE.parent)}:{line}"
                 for path in sorted(PACKAGE.rglob("*.py")) if path != formats
                 for line in branches_on_a_format_name(path.read_text())]
    assert offenders == []


def test_the_command_line_imports_no_jax_rich_or_report_module():
    """`pallas-check --help` and every usage error answer before JAX, rich or a reporter is
    imported: the CLI reads the option table and the format registry only (formats.py)."""
    import os
    import subprocess
    import sys

    probe = ("import sys, pallas_check.cli.app; print(sorted(m for m in sys.modules"
             " if m.split('.')[0] in ('jax', 'jaxlib', 'rich')"
             " or m.startswith(('pallas_check.report', 'pallas_check.config.formats',"
             " 'pallas_check.config.display'))))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(PACKAGE.parent), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env=env, cwd=PACKAGE.parent, check=True)
    assert proc.stdout.split("\n")[0] == str(["pallas_check.config.formats"])


def test_no_package_cycle():
    """The stages (the package's top-level folders and modules) import each other one way
    only, top to bottom (pyproject.toml's stage contract; ARCHITECTURE.md): no two of them
    reach each other, directly or through others (lazy imports included)."""
    import grimp

    graph = grimp.build_graph("pallas_check")
    tops = sorted({".".join(m.split(".")[:2]) for m in graph.modules if m != "pallas_check"})
    reach = {top: {t for t in tops if t != top and graph.chain_exists(
        importer=top, imported=t, as_packages=True)} for top in tops}
    both_ways = sorted(f"{a} <-> {b}" for a in tops for b in reach[a] if a < b and a in reach[b])
    assert both_ways == []


def test_every_stage_is_in_the_stage_contract():
    """A new top-level folder or module is placed in the flow (pyproject.toml's layers
    contract of the stages), so that the contract covers the whole package."""
    import tomllib

    pyproject = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
    contract = next(c for c in pyproject["tool"]["importlinter"]["contracts"]
                    if c["name"].startswith("The stages"))
    placed = {part.strip() for layer in contract["layers"] for part in layer.split("|")}
    tops = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
            if (p.is_dir() and (p / "__init__.py").exists())
            or (p.suffix == ".py" and p.name not in ("__init__.py", "__main__.py"))}
    assert {f"pallas_check.{t}" for t in tops} == placed


def _functions() -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    return [(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}", node)
            for path in sorted(PACKAGE.rglob("*.py"))
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def test_no_function_takes_more_than_7_parameters():
    """A longer list is a few objects not yet named (issue 37): `self`/`cls` not counted."""
    many = []
    for where, node in _functions():
        args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
        names = [a.arg for a in args if a.arg not in ("self", "cls")]
        if len(names) > 7:
            many.append(f"{where} {node.name} ({len(names)})")
    assert many == []


def _annotations() -> list[tuple[str, ast.expr]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            where = f"{path.relative_to(PACKAGE.parent)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                params = a.posonlyargs + a.args + a.kwonlyargs + [
                    x for x in (a.vararg, a.kwarg) if x is not None]
                found += [(where, p.annotation) for p in params if p.annotation is not None]
                if node.returns is not None:
                    found.append((where, node.returns))
            elif isinstance(node, ast.AnnAssign):
                found.append((where, node.annotation))
    return found


def _names_any(annotation: ast.expr) -> bool:
    return any(isinstance(n, ast.Name) and n.id == "Any"
               or isinstance(n, ast.Attribute) and n.attr == "Any"
               or isinstance(n, ast.Constant) and isinstance(n.value, str)
               and "Any" in n.value
               for n in ast.walk(annotation))


def test_any_is_in_at_most_4_percent_of_annotations_and_no_rule_context_is_any():
    """`Any` only where a value truly is any (issue 37: coverage.py and pip-audit keep it
    near 4 %); what a rule gets as `ctx` is engine/seam.py's protocol, never Any."""
    annotations = _annotations()
    with_any = [where for where, annotation in annotations if _names_any(annotation)]
    assert len(with_any) <= 0.04 * len(annotations), (len(with_any), len(annotations))
    ctx_any = [f"{where} {node.name}" for where, node in _functions()
               for p in node.args.posonlyargs + node.args.args + node.args.kwonlyargs
               if p.arg == "ctx" and p.annotation is not None and _names_any(p.annotation)]
    assert ctx_any == []


def test_few_function_local_imports_of_our_own_each_with_its_reason():
    """Imports at the top of each module, below the one start-up boundary (the CLI and the
    plugin import the run after XLA_FLAGS is set): at most 10 inside functions, each
    saying on its line why it waits."""
    local = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        lines = text.splitlines()
        tree = ast.parse(text)
        inside = {id(n) for f in ast.walk(tree)
                  if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                  for n in ast.walk(f) if n is not f}
        for node in ast.walk(tree):
            if id(node) not in inside:
                continue
            ours = (isinstance(node, ast.ImportFrom) and (node.level > 0 or (
                node.module or "").startswith("pallas_check"))) or (
                isinstance(node, ast.Import)
                and any(a.name.startswith("pallas_check") for a in node.names))
            if ours:
                local.append((f"{path.relative_to(PACKAGE.parent)}:{node.lineno}",
                              "#" in lines[node.end_lineno - 1]))
    assert len(local) <= 10, local
    assert [where for where, has_reason in local if not has_reason] == []
