"""Shipped kernel case: jax.experimental.pallas.ops.tpu.megablox (gmm, tgmm).

Run as a user would: ``megablox.gmm(lhs, rhs, group_sizes, ...)`` (the
custom_vjp wrapper in megablox/ops.py), forward and jax.grad (whose backward
calls gmm with transpose_rhs=True and tgmm), plus the sharded-groups form of
the backend ``gmm.gmm`` with group_offset and existing_out (input/output
aliasing).  These functions expose ``interpret``; it is passed (True) only
when CASE_INTERPRET=hlo and otherwise left at its default.  The grids are
dynamic (number of active m tiles is computed from group_sizes at run time)
and the index maps read two scalar-prefetch operands (group metadata).

Calls:
  gmm_fwd         3 groups (10, 0, 54 rows), tile (16, 128, 128), k = 192 so
                  the last k tile is partial (masked in-kernel)
  gmm_grad        d/dlhs (gmm, transpose_rhs=True) and d/drhs (tgmm)
  gmm_offset_out  gmm.gmm over groups 1..2 only (group_offset=1) into an
                  existing_out buffer (input_output_aliases={6: 0})

CASE_INTERPRET (verification only; unset under the pallas-check interceptor):
  unset  -> call the kernel as-is (the interceptor replaces the lowering)
  "hlo"  -> interpret=True is passed to gmm/tgmm (JAX HLO interpreter)
  "tpu"  -> run under pltpu.force_tpu_interpret_mode(pltpu.InterpretParams())
            (CASE_DETECT_RACES=1 turns on the interpreter's race detector)
Verified with: hlo, tpu
"""

NAME = "megablox_gmm"


# ---------------------------------------------------------------- verification
from _case_common import (  # noqa: E402  (this folder is sys.path[0] when run)
    MODE, interpret_ctx as _interpret_ctx, report_races as _report_races,
    verification_setup as _verification_setup, run_case)


# ----------------------------------------------------------------------- calls
def _interpret_kw():
  return {"interpret": True} if MODE == "hlo" else {}


def _gmm_reference(lhs, rhs, group_sizes):
  """out[rows of group g] = lhs[rows of group g] @ rhs[g]."""
  import jax
  import jax.numpy as jnp
  ends = jnp.cumsum(group_sizes)
  starts = ends - group_sizes
  row = jnp.arange(lhs.shape[0])
  out = jnp.zeros((lhs.shape[0], rhs.shape[2]), jnp.float32)
  for g in range(rhs.shape[0]):
    in_g = ((row >= starts[g]) & (row < ends[g]))[:, None]
    out = jnp.where(in_g, jnp.dot(lhs, rhs[g],
                                  precision=jax.lax.Precision.HIGHEST), out)
  return out


def make_calls():
  """[(label, fn, args, ref_fn, rtol, atol)]; fn(*args) invokes the kernel."""
  import importlib
  import jax
  import jax.numpy as jnp
  from jax.experimental.pallas.ops.tpu import megablox
  # `megablox.gmm` is the custom_vjp function, which shadows the submodule.
  gmm_backend = importlib.import_module(
      "jax.experimental.pallas.ops.tpu.megablox.gmm")

  m, k, n, num_groups = 64, 192, 128, 3
  tiling = (16, 128, 128)
  keys = jax.random.split(jax.random.key(0), 4)
  lhs = jax.random.normal(keys[0], (m, k), jnp.float32)
  rhs = jax.random.normal(keys[1], (num_groups, k, n), jnp.float32)
  dout = jax.random.normal(keys[2], (m, n), jnp.float32)
  existing = jax.random.normal(keys[3], (m, n), jnp.float32)
  group_sizes = jnp.array([10, 0, 54], jnp.int32)

  def fwd(lhs, rhs, group_sizes):
    return megablox.gmm(lhs, rhs, group_sizes, jnp.float32, tiling,
                        **_interpret_kw())

  def grad_of(f):
    def loss(lhs, rhs, group_sizes, dout):
      return jnp.sum(f(lhs, rhs, group_sizes) * dout)
    return jax.grad(loss, argnums=(0, 1))

  def offset_out(lhs, rhs, group_sizes, existing):
    return gmm_backend.gmm(lhs, rhs[1:], group_sizes, jnp.float32, tiling,
                           group_offset=jnp.array(1, jnp.int32),
                           existing_out=existing, **_interpret_kw())

  def offset_out_ref(lhs, rhs, group_sizes, existing):
    full = _gmm_reference(lhs, rhs, group_sizes)
    in_g0 = (jnp.arange(m) < group_sizes[0])[:, None]
    return jnp.where(in_g0, existing, full)

  return [
      ("gmm_fwd", fwd, (lhs, rhs, group_sizes), _gmm_reference, 1e-4, 1e-3),
      ("gmm_grad", grad_of(fwd), (lhs, rhs, group_sizes, dout),
       grad_of(_gmm_reference), 1e-4, 1e-3),
      ("gmm_offset_out", offset_out, (lhs, rhs, group_sizes, existing),
       offset_out_ref, 1e-4, 1e-3),
  ]


# ------------------------------------------------------------------------ main
def main():
  run_case(NAME, make_calls, _verification_setup, _interpret_ctx, _report_races)


if __name__ == "__main__":
  main()
