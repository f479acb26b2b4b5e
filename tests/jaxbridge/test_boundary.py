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
# JAX modules the bridge still hands out whole, for the interception and platform plumbing.
_PLUMBING = frozenset({"callback_module", "dispatch", "ffi", "sharding_impls", "pjit", "mlir",
                       "pallas_call_module", "jax_tpu_info", "jax_mesh_utils", "jax_shard_map",
                       "xla_bridge", "compiler"})
# Modules that use a plumbing module handout (lowering patches, dispatch hooks, tpu_info).
_PLUMBING_USERS = frozenset({"intercept.py", "outer.py", "tpu_info.py", "runner.py",
                             "hostcall.py", "tpu_compile/mlirloc.py", "children.py"})


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


def test_only_plumbing_modules_are_handed_out_and_only_to_the_plumbing() -> None:
    """A bridge import is of a name (a type, a primitive, a function) or of one of our own
    bridge modules; the JAX modules it still hands out go to the plumbing only."""
    offenders = []
    for name, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "pallas_check.jaxbridge":
                for alias in node.names:
                    ours = alias.name in ("call", "params", "primitives", "types", "jaxprs",
                                          "version")
                    if ours:
                        continue
                    if alias.name in _PLUMBING and name not in _PLUMBING_USERS:
                        offenders.append(f"{name}:{node.lineno} {alias.name}")
    assert offenders == []


def test_no_params_or_mapping_reads_outside_the_bridge() -> None:
    offenders = []
    for name, tree in _modules():
        lines = _params_key_reads(tree)
        lines += [node.lineno for node in ast.walk(tree)
                  if isinstance(node, ast.Attribute) and node.attr in _MAPPING_ATTRIBUTES]
        offenders += [f"{name}:{line}" for line in sorted(set(lines))]
    assert offenders == []
