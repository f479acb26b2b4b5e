"""Inventory of what the shipped-kernel cases put inside their pallas_calls.

For every case_*.py next to this file, trace each call from make_calls() with
jax.make_jaxpr (nothing is lowered or run), find every pallas_call equation
(recursively through pjit / custom_vjp / shard_map / ... sub-jaxprs) and
report, per case:

* jaxpr primitives inside the kernel jaxprs (the `jaxpr` param of each
  pallas_call, recursively into cond / while / scan / pjit / run_scoped / ...);
* ref-transform types in the `tree` / `args_tree` params of ref-touching
  equations (get, swap, addupdate, dma_start, dma_wait, masked load/store,
  semaphore ops, ...), plus the transform chains seen and NDIndexer details.
  Chains are rendered from the unflattened tree: `ref` = untransformed ref,
  `ref[A, B]` = TransformedRef with transforms A then B, `v` = scalar value,
  `-` = None; get/swap trees hold only the transform tuple.  For dma_start /
  dma_wait the tuple is (src, dst, dst_sem, src_sem, device_id);
* grid_mapping features: grid (dynamic bounds), scalar prefetch
  (num_index_operands), scratch avals + memory spaces, operand memory spaces,
  block-dim kinds (Blocked / Squeezed / Element / BoundedSlice / whole-array),
  vmapped_dims, dimension_semantics and other compiler params,
  input_output_aliases, pipeline_mode.

Usage (from anywhere; CASE_INTERPRET must be unset):
  python tests/shipped_kernels/_inspect.py            # markdown to stdout
  python tests/shipped_kernels/_inspect.py --json     # raw JSON
  python tests/shipped_kernels/_inspect.py case_matmul case_random  # subset
"""
import collections
import importlib
import json
import os
import pathlib
import re
import sys

HERE = pathlib.Path(__file__).resolve().parent

# Source files of each case's kernels, scanned for TPU-generation queries.
KERNEL_SOURCES = {
    "case_matmul": ["matmul.py"],
    "case_example_kernel": ["example_kernel.py"],
    "case_flash_attention": ["flash_attention.py"],
    "case_paged_attention": ["paged_attention/paged_attention_kernel.py",
                             "paged_attention/quantization_utils.py",
                             "paged_attention/util.py"],
    "case_ragged_paged_attention": ["ragged_paged_attention/kernel.py",
                                    "ragged_paged_attention/tuned_block_sizes.py"],
    "case_megablox_gmm": ["megablox/gmm.py", "megablox/ops.py",
                          "megablox/common.py"],
    "case_splash_attention": [
        "splash_attention/splash_attention_kernel.py",
        "splash_attention/splash_attention_mask.py",
        "splash_attention/splash_attention_mask_info.py"],
    "case_random": ["random/threefry.py", "random/philox.py",
                    "random/prng_utils.py"],
    "case_all_gather": ["all_gather.py"],
}
TPU_QUERY_PATTERNS = [r"get_tpu_info", r"tpu_info", r"device_kind",
                      r"jax\.devices\(", r"is_tpu", r"tpu_generation",
                      r"get_tpu_version", r"ChipVersion", r"chip_version"]


def _setup():
  os.environ.pop("CASE_INTERPRET", None)  # trace the plain (non-interpret) calls
  sys.path.insert(0, str(HERE))
  import jax
  try:  # case_all_gather needs 4 devices; must precede backend start-up
    jax.config.update("jax_num_cpu_devices", 4)
  except Exception:
    pass


def _sub_jaxprs(params):
  from jax._src import core as jc

  def walk(v):
    if isinstance(v, jc.ClosedJaxpr):
      yield v.jaxpr
    elif isinstance(v, jc.Jaxpr):
      yield v
    elif isinstance(v, (tuple, list)):
      for x in v:
        yield from walk(x)
    elif isinstance(v, dict):
      for x in v.values():
        yield from walk(x)

  for name, v in params.items():
    if name == "grid_mapping":
      continue  # index-map jaxprs live here; not part of the kernel body
    yield from walk(v)


def _pallas_calls(jaxpr):
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "pallas_call":
      yield eqn
      continue
    for sub in _sub_jaxprs(eqn.params):
      yield from _pallas_calls(sub)


def _transform_objects(tree_obj):
  """Yield the non-container, non-variable objects of an unflattened tree."""
  from jax._src import core as jc
  if tree_obj is None or isinstance(tree_obj, (jc.Var, jc.Literal)):
    return
  if isinstance(tree_obj, (tuple, list)):
    for x in tree_obj:
      yield from _transform_objects(x)
  elif isinstance(tree_obj, dict):
    for x in tree_obj.values():
      yield from _transform_objects(x)
  else:
    yield tree_obj


def _render(obj):
  """Compact shape of an unflattened `tree`: ref / ref[T1, T2] / - / v / T."""
  from jax._src import core as jc
  from jax._src.state import types as state_types
  if obj is None:
    return "-"
  if isinstance(obj, (jc.Var, jc.Literal)):
    aval = getattr(obj, "aval", None)
    return "ref" if isinstance(aval, state_types.AbstractRef) else "v"
  if isinstance(obj, state_types.TransformedRef):
    return "ref[" + ", ".join(type(t).__name__ for t in obj.transforms) + "]"
  if isinstance(obj, (tuple, list)):
    return "(" + ", ".join(_render(x) for x in obj) + ")"
  return type(obj).__name__


def _indexer_features(idx):
  from jax._src.state import indexing
  feats = set()
  for s in idx.indices:
    if isinstance(s, indexing.Slice):
      feats.add("strided_slice" if s.stride > 1 else "slice")
      if not isinstance(s.start, int):
        feats.add("dynamic_slice_start")
    elif isinstance(s, int):
      feats.add("static_int")
    elif getattr(getattr(s, "aval", None), "shape", None) == ():
      feats.add("dynamic_scalar")
    elif getattr(s, "shape", None) == ():
      feats.add("dynamic_scalar")
    else:
      feats.add("array_index")
  return feats


def _scan_kernel(jaxpr, acc):
  from jax._src.state import indexing
  from jax._src.state import types as state_types
  for eqn in jaxpr.eqns:
    prim = eqn.primitive.name
    acc["primitives"][prim] += 1
    for key in ("tree", "args_tree"):
      tree = eqn.params.get(key)
      if tree is None or not hasattr(tree, "num_leaves"):
        continue
      leaves = list(eqn.invars)[len(eqn.invars) - tree.num_leaves:]
      try:
        obj = tree.unflatten(leaves)
      except Exception as e:  # pragma: no cover - diagnostic only
        acc["notes"].add(f"could not unflatten {key} of {prim}: {e}")
        continue
      for o in _transform_objects(obj):
        inner = (list(o.transforms)
                 if isinstance(o, state_types.TransformedRef) else [o])
        for t in inner:
          acc["transforms"][type(t).__name__].add(prim)
          if isinstance(t, indexing.NDIndexer):
            for f in _indexer_features(t):
              acc["indexer_features"][f].add(prim)
      acc["transform_chains"][f"{prim}: {_render(obj)}"] += 1
    for sub in _sub_jaxprs(eqn.params):
      _scan_kernel(sub, acc)


def _aval_str(a):
  ms = getattr(a, "memory_space", None)
  inner = getattr(a, "inner_aval", a)
  dtype = getattr(inner, "dtype", "?")
  shape = getattr(inner, "shape", "?")
  return f"{ms}:{dtype}{list(shape) if shape != '?' else ''}"


def _grid_features(eqn):
  from jax._src.pallas import core as plc
  gm = eqn.params["grid_mapping"]
  cp = eqn.params["compiler_params"]
  feats = {}
  feats["name"] = eqn.params.get("name") or getattr(
      eqn.params["jaxpr"].debug_info, "func_name", "?")
  feats["grid"] = [("dynamic" if plc.is_dynamic_dim(g) else g) for g in gm.grid]
  feats["num_dynamic_grid_bounds"] = gm.num_dynamic_grid_bounds
  feats["num_index_operands"] = gm.num_index_operands
  kernel_invars = eqn.params["jaxpr"].invars
  feats["index_operands"] = [
      _aval_str(v.aval) for v in kernel_invars[:gm.num_index_operands]]
  feats["scratch"] = [_aval_str(a) for a in gm.scratch_avals]
  ops = []
  block_kinds = set()
  for i, bm in enumerate(gm.block_mappings):
    role = "in" if i < gm.num_inputs else "out"
    kinds = []
    for bd in bm.block_shape:
      kinds.append(type(bd).__name__)
    whole = (all(isinstance(bd, plc.Blocked) for bd in bm.block_shape)
             and tuple(bd.block_size for bd in bm.block_shape)
             == tuple(bm.array_aval.shape))
    kind_set = sorted(set(kinds)) or ["scalar"]
    block_kinds.update(kind_set)
    ops.append({
        "role": role,
        "memory_space": str(bm.transformed_block_aval.memory_space),
        "array": f"{bm.array_aval.dtype}{list(bm.array_aval.shape)}",
        "block_dims": kind_set,
        "whole_array_block": whole,
        "pipeline_mode": None if bm.pipeline_mode is None else str(bm.pipeline_mode),
    })
  feats["operands"] = ops
  feats["block_dim_kinds"] = sorted(block_kinds)
  feats["operand_memory_spaces"] = sorted({o["memory_space"] for o in ops})
  feats["vmapped_dims"] = list(gm.vmapped_dims)
  feats["dimension_semantics"] = (
      list(cp.dimension_semantics) if getattr(cp, "dimension_semantics", None)
      is not None else None)
  other = {}
  for k in ("vmem_limit_bytes", "collective_id", "has_side_effects",
            "allow_input_fusion"):
    v = getattr(cp, k, None)
    if v is not None and v is not False:  # keep collective_id=0
      other[k] = v
  feats["other_compiler_params"] = other
  feats["input_output_aliases"] = [list(x) for x in
                                   eqn.params["input_output_aliases"]]
  feats["mesh"] = None if eqn.params.get("mesh") is None else str(
      eqn.params["mesh"])
  return feats


def _tpu_queries(case):
  import jax
  base = pathlib.Path(jax.__file__).parent / "experimental/pallas/ops/tpu"
  hits = []
  for rel in KERNEL_SOURCES.get(case, []):
    path = base / rel
    if not path.exists():
      continue
    for n, line in enumerate(path.read_text().splitlines(), 1):
      for pat in TPU_QUERY_PATTERNS:
        if re.search(pat, line):
          hits.append(f"{rel}:{n}: {line.strip()}")
          break
  return hits


def inspect_case(case):
  import jax
  mod = importlib.import_module(case)
  acc = {
      "primitives": collections.Counter(),
      "transforms": collections.defaultdict(set),
      "transform_chains": collections.Counter(),
      "indexer_features": collections.defaultdict(set),
      "notes": set(),
  }
  calls = []
  # A case may provide inspect_calls() when its user-level entry point hides
  # the pallas_call from make_jaxpr (e.g. bound inside a lowering rule).
  make = getattr(mod, "inspect_calls", mod.make_calls)
  for label, fn, args, *_ in make():
    closed = jax.make_jaxpr(fn)(*args)
    pcs = list(_pallas_calls(closed.jaxpr))
    calls.append({"label": label,
                  "pallas_calls": [_grid_features(e) for e in pcs]})
    for e in pcs:
      _scan_kernel(e.params["jaxpr"], acc)
  return {
      "case": case,
      "calls": calls,
      "primitives": dict(sorted(acc["primitives"].items())),
      "transforms": {k: sorted(v) for k, v in sorted(acc["transforms"].items())},
      "transform_chains": dict(sorted(acc["transform_chains"].items())),
      "indexer_features": {k: sorted(v) for k, v in
                           sorted(acc["indexer_features"].items())},
      "tpu_generation_queries": _tpu_queries(case),
      "notes": sorted(acc["notes"]),
  }


def _md(results):
  out = []
  union_p = collections.defaultdict(set)
  union_t = collections.defaultdict(set)
  for r in results:
    for p in r["primitives"]:
      union_p[p].add(r["case"])
    for t in r["transforms"]:
      union_t[t].add(r["case"])
  n = len(results)
  out.append("## Union over all cases\n")
  out.append(f"Kernel-jaxpr primitives ({len(union_p)}); cases listed when "
             f"used by fewer than all {n}:\n")
  for p in sorted(union_p, key=lambda p: (-len(union_p[p]), p)):
    users = union_p[p]
    extra = "" if len(users) == n else " — " + ", ".join(
        sorted(u.replace("case_", "") for u in users))
    out.append(f"- `{p}`{extra}")
  out.append("\nRef transform types:\n")
  for t in sorted(union_t):
    out.append(f"- `{t}` — " + ", ".join(
        sorted(u.replace("case_", "") for u in union_t[t])))
  out.append("")
  for r in results:
    out.append(f"## {r['case']}\n")
    out.append("Primitives (count of equations): " + ", ".join(
        f"`{k}`×{v}" for k, v in r["primitives"].items()))
    out.append("")
    out.append("Ref transforms (type → primitives): " + ("; ".join(
        f"`{k}` ({', '.join(v)})" for k, v in r["transforms"].items())
        or "none"))
    out.append("")
    out.append("Transform chains: " + "; ".join(
        f"`{k}`×{v}" for k, v in r["transform_chains"].items()))
    out.append("")
    if r["indexer_features"]:
      out.append("NDIndexer index kinds: " + "; ".join(
          f"{k} ({', '.join(v)})" for k, v in r["indexer_features"].items()))
      out.append("")
    for c in r["calls"]:
      for i, pc in enumerate(c["pallas_calls"]):
        out.append(f"- **{c['label']}** pallas_call #{i} `{pc['name']}`: "
                   f"grid={pc['grid']}, "
                   f"dimension_semantics={pc['dimension_semantics']}, "
                   f"vmapped_dims={pc['vmapped_dims']}, "
                   f"scalar_prefetch={pc['num_index_operands']}"
                   + (f" {pc['index_operands']}" if pc["index_operands"] else "")
                   + f", dynamic_grid_bounds={pc['num_dynamic_grid_bounds']}"
                   + f", scratch={pc['scratch']}"
                   + f", operand_memory_spaces={pc['operand_memory_spaces']}"
                   + f", block_dims={pc['block_dim_kinds']}"
                   + (f", io_aliases={pc['input_output_aliases']}"
                      if pc["input_output_aliases"] else "")
                   + (f", compiler_params={pc['other_compiler_params']}"
                      if pc["other_compiler_params"] else ""))
        for o in pc["operands"]:
          if o["memory_space"] not in ("default", "None") or o[
              "whole_array_block"] or "Squeezed" in o["block_dims"] or o[
              "pipeline_mode"]:
            out.append(f"    - {o['role']} {o['array']}: "
                       f"memory_space={o['memory_space']}, "
                       f"block_dims={o['block_dims']}"
                       + (", block == whole array" if o["whole_array_block"]
                          else "")
                       + (f", pipeline_mode={o['pipeline_mode']}"
                          if o["pipeline_mode"] else ""))
    out.append("")
    out.append("TPU-generation queries in kernel sources: " + (
        "none" if not r["tpu_generation_queries"] else ""))
    for h in r["tpu_generation_queries"]:
      out.append(f"    - `{h}`")
    if r["notes"]:
      out.append("Notes: " + "; ".join(r["notes"]))
    out.append("")
  return "\n".join(out)


def main(argv):
  _setup()
  as_json = "--json" in argv
  names = [a for a in argv if not a.startswith("--")]
  if not names:
    names = sorted(p.stem for p in HERE.glob("case_*.py"))
  results = [inspect_case(n) for n in names]
  if as_json:
    print(json.dumps(results, indent=1, default=str))
  else:
    print(_md(results))


if __name__ == "__main__":
  main(sys.argv[1:])
