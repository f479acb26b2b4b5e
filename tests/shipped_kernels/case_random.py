"""Shipped kernel case: jax.experimental.pallas.ops.tpu.random (threefry, philox).

Run as a user would: make a key with the Pallas PRNG implementation
(``jax.random.key(seed, impl=threefry.plthreefry_prng_impl)`` /
``philox.plphilox_prng_impl``) and call ``jax.random.bits`` on it; the
PRNGImpl's random_bits runs the pallas_call.  No ``interpret`` parameter is
exposed, so none is passed.  Keys (and the philox counter offset) live in SMEM
(whole-array BlockSpec(memory_space=SMEM)); the output is tiled in (256, 256)
blocks.  The threefry kernel binds the core threefry2x32 primitive.

Calls:
  threefry_bits_padded  shape (8, 300): padded to (256, 512), grid (1, 2),
                        cropped; reference = jax.random.bits with the default
                        (partitionable) threefry2x32 impl, which must match
                        bit for bit
  philox_bits           shape (256, 512), grid (1, 2); reference = an
                        independent numpy Philox-4x32-10

CASE_INTERPRET (verification only; unset under the pallas-check interceptor):
  unset  -> call the kernel as-is (the interceptor replaces the lowering)
  "hlo"  -> every pl.pallas_call gets interpret=True (JAX HLO interpreter)
  "tpu"  -> run under pltpu.force_tpu_interpret_mode(pltpu.InterpretParams())
            (CASE_DETECT_RACES=1 turns on the interpreter's race detector)
Verified with: hlo, tpu
"""

NAME = "random"


# ---------------------------------------------------------------- verification
from _case_common import (  # noqa: E402  (this folder is sys.path[0] when run)
    interpret_ctx as _interpret_ctx, report_races as _report_races,
    verification_setup as _verification_setup, run_case)


# ----------------------------------------------------------------------- calls
def _philox_reference(key_data, shape):
  """numpy Philox-4x32-10 of counter (0, flat_index, 0, 0); returns o0 ^ o1."""
  import numpy as np
  m32 = np.uint64(0xFFFFFFFF)
  k_hi, k_lo = (np.uint64(int(x)) for x in np.asarray(key_data).reshape(2))
  lo0 = np.arange(int(np.prod(shape)), dtype=np.uint64)
  hi0 = np.zeros_like(lo0)
  hi1 = np.zeros_like(lo0)
  lo1 = np.zeros_like(lo0)
  for r in range(10):
    p0 = np.uint64(0xCD9E8D57) * hi1
    p1 = np.uint64(0xD2511F53) * hi0
    hi0, lo0, hi1, lo1 = (((p0 >> np.uint64(32)) ^ lo0 ^ k_hi) & m32,
                          p0 & m32,
                          ((p1 >> np.uint64(32)) ^ lo1 ^ k_lo) & m32,
                          p1 & m32)
    if r != 9:
      k_hi = (k_hi + np.uint64(0x9E3779B9)) & m32
      k_lo = (k_lo + np.uint64(0xBB67AE85)) & m32
  return (hi0 ^ lo0).astype(np.uint32).reshape(shape)


def make_calls():
  """[(label, fn, args, ref_fn, rtol, atol)]; fn(*args) invokes the kernel."""
  import jax
  from jax.experimental.pallas.ops.tpu.random import philox
  from jax.experimental.pallas.ops.tpu.random import threefry

  def threefry_bits(seed):
    key = jax.random.key(seed, impl=threefry.plthreefry_prng_impl)
    return jax.random.bits(key, (8, 300))

  def threefry_ref(seed):
    with jax.threefry_partitionable(True):
      return jax.random.bits(jax.random.key(seed, impl="threefry2x32"),
                             (8, 300))

  def philox_bits(seed):
    key = jax.random.key(seed, impl=philox.plphilox_prng_impl)
    return jax.random.bits(key, (256, 512))

  def philox_ref(seed):
    key = jax.random.key(seed, impl=philox.plphilox_prng_impl)
    return _philox_reference(jax.random.key_data(key), (256, 512))

  return [
      ("threefry_bits_padded", threefry_bits, (42,), threefry_ref, 0, 0),
      ("philox_bits", philox_bits, (7,), philox_ref, 0, 0),
  ]


def inspect_calls():
  """For _inspect.py only: jax.random.bits binds random_bits_p, whose lowering
  (not its jaxpr) traces the PRNGImpl and hence the pallas_call, so
  make_jaxpr(make_calls()) shows no pallas_call.  Trace the impls' random_bits
  functions directly instead (same kernels, same shapes)."""
  import jax.numpy as jnp
  from jax.experimental.pallas.ops.tpu.random import philox
  from jax.experimental.pallas.ops.tpu.random import threefry
  key_data = jnp.array([0, 42], jnp.uint32)
  return [
      ("threefry_bits_padded",
       lambda k: threefry.plthreefry_random_bits(k, 32, (8, 300)),
       (key_data,), None, 0, 0),
      ("philox_bits",
       lambda k: philox.philox_random_bits(k, 32, (256, 512)),
       (key_data,), None, 0, 0),
  ]


# ------------------------------------------------------------------------ main
def _comparable(o, e):
  """Bits are compared exactly as uint32 (no float conversion)."""
  import numpy as np
  return np.asarray(o), np.asarray(e)


def main():
  run_case(NAME, make_calls, _verification_setup, _interpret_ctx, _report_races, comparable=_comparable)


if __name__ == "__main__":
  main()
