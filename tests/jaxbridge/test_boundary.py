"""JAX behind one adapter: outside pallas_check/jaxbridge/, no module imports `jax._src`,
reads an equation's or a pallas_call's params by key, reads a GridMapping/BlockMapping
attribute, or reads a private JAX name; JAX's names reach the rest of pallas-check only
through the bridge's modules.

Read with the AST (comments and docstrings do not count). What is still allowed is listed
below with the reason, so that the list can only shrink.
"""

from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "pallas_check"
BRIDGE = PACKAGE / "jaxbridge"

# GridMapping / BlockMapping attributes (JAX's names): read only by jaxbridge/call.py.
_MAPPING_ATTRIBUTES = frozenset({
    "grid_mapping", "block_mappings", "num_index_operands", "num_dynamic_grid_bounds",
    "num_scratch_operands", "vmapped_dims", "scratch_avals", "index_map_jaxpr",
    "index_map_out_tree", "transformed_block_aval", "array_aval", "has_trivial_window",
})
# JAX modules the bridge hands out to tests only (they look at what intercept/tpu_info.py patched);
# pallas-check's own modules call the bridge's functions instead (lowering.py, __init__).
_TEST_ONLY = frozenset({"jax_tpu_info", "jax_mesh_utils"})


# A private JAX name, read off a JAX object (an attribute, or `getattr`/`hasattr` of the name):
# (1) a name JAX keeps beside a jaxpr's documented fields (the "Understanding jaxprs" page and
#     `jax.extend`: a Jaxpr's constvars/invars/outvars/eqns/effects, a ClosedJaxpr's
#     jaxpr/consts/in_avals/out_avals, an equation's primitive/invars/outvars/params, an aval,
#     a literal's val): a ref aval's `inner_aval`, a jaxpr's `debug_info` and what it holds;
# (2) any `_name` (one underscore) that pallas-check does not define itself, read off
#     anything but `self`/`cls` -- what is left is another library's private name, and the
#     only library whose objects pallas-check reads is JAX -- less the few of Python's own
#     listed in _PYTHON_PRIVATE (namedtuple's and enum's documented ones, `sys._getframe`...).
_JAX_INTERNAL_ATTRIBUTES = frozenset({"inner_aval", "debug_info", "func_src_info"})
_PYTHON_PRIVATE = frozenset({
    "_replace", "_make", "_asdict", "_fields", "_value_", "_name_",  # namedtuple, enum
    "_getframe", "_exit", "_Pointer",  # sys._getframe, os._exit, ctypes._Pointer
})


def _defined_private_names() -> frozenset[str]:
    """The `_names` pallas-check defines: its functions, classes, attributes it assigns
    (`self._x = ...`, a class body's `_x = ...`) and parameters."""
    names = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
    return frozenset(n for n in names if n.startswith("_") and not n.startswith("__"))


def private_jax_reads(source: str | ast.Module,
                      ours: frozenset[str] = frozenset()) -> list[tuple[int, str]]:
    """(line, name) of each read of a private JAX name in `source` (see above); `ours` is
    the `_names` pallas-check defines itself."""
    found = []
    for node in ast.walk(ast.parse(source) if isinstance(source, str) else source):
        name = None
        if isinstance(node, ast.Attribute) and not (
                isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            name = node.attr
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("getattr", "hasattr") and len(node.args) > 1 \
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
            name = node.args[1].value
        if name is None:
            continue
        private = name.startswith("_") and not name.startswith("__") \
            and name not in ours and name not in _PYTHON_PRIVATE
        if private or name in _JAX_INTERNAL_ATTRIBUTES:
            found.append((node.lineno, name))
    return found


def test_the_scan_sees_a_private_jax_read_and_nothing_else() -> None:
    flagged = ["error._pred.values()", "aval.inner_aval", 'getattr(aval, "inner_aval", aval)',
               'hasattr(v.aval, "inner_aval")', "jaxpr.debug_info.arg_names",
               'getattr(kernel, "debug_info", None)', "info.func_src_info",
               "eqn.ctx._private_thing", 'getattr(closed, "_cache")']
    for source in flagged:
        assert private_jax_reads(source) != [], source
    assert private_jax_reads("x = error._pred") == [(1, "_pred")]
    unrelated = ["self._cache", "cls._by_mode", "point._replace(x=1)", "sys._getframe(1)",
                 "os._exit(3)", "closed.jaxpr.outvars", "closed.consts", "eqn.params",
                 "v.aval.shape", "atom.val", 'getattr(aval, "memory_space", None)',
                 "region._boxes"]
    for source in unrelated:
        assert private_jax_reads(source, frozenset({"_boxes"})) == [], source


def test_no_private_jax_name_is_read_outside_the_bridge() -> None:
    """A ref aval's value aval, a jaxpr's argument names and source, a checkify error's
    predicates: the bridge's functions (jaxprs.value_aval / is_ref_aval / arg_names /
    source_text, params.any_check_failed), never the attribute."""
    ours = _defined_private_names()
    offenders = [f"{name}:{line} {attr}" for name, tree in _modules()
                 for line, attr in private_jax_reads(tree, ours)]
    assert offenders == []


def _modules() -> list[tuple[str, ast.Module]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if BRIDGE in path.parents:
            continue
        found.append((path.relative_to(PACKAGE).as_posix(), ast.parse(path.read_text())))
    return found


def _params_key_reads(tree: ast.Module) -> list[int]:
    """Lines of `X.params[...]`, `params["key"]`, `params.get("key")`, `p["key"]`."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) \
                and isinstance(node.slice.value, str):
            target = node.value
            name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
            if name == "params":
                lines.append(node.lineno)
        if isinstance(node, ast.Attribute) and node.attr == "params" \
                and isinstance(node.value, ast.Name) and node.value.id == "eqn":
            lines.append(node.lineno)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "get" and isinstance(node.func.value, ast.Name) \
                and node.func.value.id == "params":
            lines.append(node.lineno)
    return lines


def test_no_module_imports_jax_private_modules() -> None:
    offenders = []
    for name, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("jax._src"):
                offenders.append(f"{name}:{node.lineno}")
            if isinstance(node, ast.Import) and any(a.name.startswith("jax._src")
                                                    for a in node.names):
                offenders.append(f"{name}:{node.lineno}")
    assert offenders == []


def test_no_jax_module_is_handed_out_to_pallas_check() -> None:
    """A bridge import is of a name (a type, a primitive, a function) or of one of our own
    bridge modules, never of a JAX module (those the bridge keeps for tests included)."""
    offenders = []
    for name, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "pallas_check.jaxbridge":
                for alias in node.names:
                    if alias.name in _TEST_ONLY:
                        offenders.append(f"{name}:{node.lineno} {alias.name}")
                    if alias.name.startswith("_"):
                        offenders.append(f"{name}:{node.lineno} {alias.name}")
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id == "bridge" and node.attr in _TEST_ONLY:
                offenders.append(f"{name}:{node.lineno} bridge.{node.attr}")
    assert offenders == []


def test_no_params_or_mapping_reads_outside_the_bridge() -> None:
    offenders = []
    for name, tree in _modules():
        lines = _params_key_reads(tree)
        lines += [node.lineno for node in ast.walk(tree)
                  if isinstance(node, ast.Attribute) and node.attr in _MAPPING_ATTRIBUTES]
        offenders += [f"{name}:{line}" for line in sorted(set(lines))]
    assert offenders == []
