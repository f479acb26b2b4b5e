"""JAX behind one adapter: outside pallas_check/jaxbridge/, no module imports `jax._src`,
reads an equation's or a pallas_call's params by key, or reads a GridMapping/BlockMapping
attribute; JAX's names reach the rest of pallas-check only through the bridge's modules.

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
