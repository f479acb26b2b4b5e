"""Every JAX primitive pallas-check's rules evaluate or its passes look for, under
pallas-check's own names.

A rule registers for `dma_start_p`, never for a module attribute of `jax._src`: when JAX
moves a primitive, or a supported version lacks one, this file is the one to change. A
primitive a version lacks is `None`, and `present()` drops it from a rule's list.

Families: `ref_*` (JAX's state primitives on refs: `x[...]`, `x[...] = v`, `x[...] += v`),
`pl_*` (Pallas' masked load / store), `sc_*` (SparseCore, plsc); the rest keep JAX's name.
"""

from __future__ import annotations

from jax._src.core import Primitive, closed_call_p as closed_call_p
from jax._src import checkify as _checkify
from jax._src import debugging as _debugging
from jax._src import pjit as _pjit
from jax._src.lax import control_flow as _control_flow
from jax._src.random import prng as _prng
from jax._src.lax import parallel as _parallel
from jax._src.pallas import pallas_call as _pallas_call
from jax._src.pallas import primitives as _pallas
from jax._src.pallas.mosaic import primitives as _mosaic
from jax._src.pallas.mosaic import sc_primitives as _sc
from jax._src.state import primitives as _state

# The kernel call itself (intercepted, and rebound by --compile).
pallas_call_p: Primitive = _pallas_call.pallas_call_p

# Refs: get / swap / addupdate (JAX's state primitives) and Pallas' masked load / store.
ref_get_p: Primitive = _state.get_p
ref_swap_p: Primitive = _state.swap_p
ref_addupdate_p: Primitive = _state.addupdate_p
pl_load_p: Primitive = _pallas.load_p
pl_swap_p: Primitive = _pallas.swap_p

# The grid, scoped allocations, hints.
program_id_p: Primitive = _pallas.program_id_p
num_programs_p: Primitive = _pallas.num_programs_p
multiple_of_p: Primitive = _pallas.multiple_of_p
run_scoped_p: Primitive = _pallas.run_scoped_p
delay_p: Primitive = _pallas.delay_p

# Semaphores and DMAs (Mosaic).
semaphore_read_p: Primitive = _pallas.semaphore_read_p
semaphore_signal_p: Primitive = _pallas.semaphore_signal_p
semaphore_wait_p: Primitive = _pallas.semaphore_wait_p
get_barrier_semaphore_p: Primitive = _mosaic.get_barrier_semaphore_p
dma_start_p: Primitive = _mosaic.dma_start_p
dma_wait_p: Primitive = _mosaic.dma_wait_p

# The TPU's stateful PRNG and no-op hints.
prng_seed_p: Primitive = _mosaic.prng_seed_p
prng_random_bits_p: Primitive = _mosaic.prng_random_bits_p
# Typed PRNG keys (jax.random on keys; Pallas' own split/join of a key's words).
random_seed_p: Primitive = _prng.random_seed_p
random_bits_p: Primitive = _prng.random_bits_p
random_fold_in_p: Primitive = _prng.random_fold_in_p
random_wrap_p: Primitive = _prng.random_wrap_p
random_unwrap_p: Primitive = _prng.random_unwrap_p
prng_split_p: Primitive = _mosaic.split_key_p
prng_join_p: Primitive = _mosaic.join_key_p
touch_p: Primitive = _mosaic.touch_p
trace_value_p: Primitive = _mosaic.trace_value_p

# Conversions of the TPU's own: narrow values packed into wider words, stochastic rounding.
pack_elementwise_p: Primitive = _mosaic.pack_elementwise_p
unpack_elementwise_p: Primitive = _mosaic.unpack_elementwise_p
stochastic_round_p: Primitive = _mosaic.stochastic_round_p

# Explicit MXU operations (Mosaic accepts them from TPU v7 on).
matmul_push_rhs_p: Primitive = _mosaic.matmul_push_rhs_p
matmul_acc_lhs_p: Primitive = _mosaic.matmul_acc_lhs_p
matmul_pop_p: Primitive = _mosaic.matmul_pop_p

# Control flow and calls (lax, jit).
cond_p: Primitive = _control_flow.cond_p
while_p: Primitive = _control_flow.while_p
scan_p: Primitive = _control_flow.scan_p
jit_p: Primitive = _pjit.jit_p
axis_index_p: Primitive = _parallel.axis_index_p

# The kernel's own assertions and prints.
check_p: Primitive = _checkify.check_p
debug_print_p: Primitive = _debugging.debug_print_p

# SparseCore (plsc).
sc_load_p: Primitive = _sc.load_p
sc_swap_p: Primitive = _sc.swap_p
sc_gather_p: Primitive = _sc.gather_p
sc_scatter_p: Primitive = _sc.scatter_p
sc_bitcast_p: Primitive = _sc.bitcast_p
sc_pack_p: Primitive = _sc.pack_p
sc_unpack_p: Primitive = _sc.unpack_p
sc_masked_sort_p: Primitive = _sc.masked_sort_p
sc_masked_cumsum_p: Primitive = _sc.masked_cumsum_p
sc_masked_cummax_p: Primitive = _sc.masked_cummax_p
sc_masked_cummin_p: Primitive = _sc.masked_cummin_p
sc_scan_count_p: Primitive = _sc.scan_count_p
sc_all_reduce_population_count_p: Primitive = _sc.all_reduce_population_count_p
sc_all_reduce_ffs_p: Primitive = _sc.all_reduce_ffs_p
sc_fetch_and_add_p: Primitive = _sc.fetch_and_add_p
sc_barrier_p: Primitive = _sc.barrier_p
sc_parallel_loop_p: Primitive = _sc.parallel_loop_p


def _custom_call_primitives() -> tuple[Primitive, ...]:
    """custom_jvp / custom_vjp calls (their primal function is evaluated)."""
    try:
        from jax._src import custom_derivatives as module
    except ImportError:  # pragma: no cover - layout of another JAX version
        return ()
    return tuple(getattr(module, n) for n in ("custom_jvp_call_p", "custom_vjp_call_p")
                 if hasattr(module, n))


custom_call_primitives: tuple[Primitive, ...] = _custom_call_primitives()
