"""A donated KV cache, updated by a kernel that reads only the live prefix of its
schedule: nothing to report.

A decode step appends each live sequence's new key row to a paged KV cache, in place:
the jitted step donates the cache (`donate_argnums=0`) and the append kernel aliases it
to its output. A first kernel builds the step's metadata schedule -- for each live
sequence, the cache row its new token goes to, through the page table -- and writes only
the `num_seqs` live entries of the fixed-size schedule, as ragged paged attention's
wrappers write theirs; the append kernel, its one consumer, reads only those. The
schedule's tail is never written and never reaches the cache: pallas-check runs the step
again with the tail holding other values -- on a copy of the donated cache taken before
the step ran, since the step consumed the script's -- and gets the same cache back, so
nothing is reported (before, a donating step could not be re-run, and the tail was
reported at the kernel's boundary).

Run: pallas-check run samples/donated_schedule_ok.py --races
Expected findings: none.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

MAX_SEQS, PAGE, PAGES_PER_SEQ, PAGES = 8, 8, 2, 16


def schedule_kernel(num_ref, lens_ref, pages_ref, slots_ref):
    def body(i, carry):  # only the live sequences' entries
        length = lens_ref[i]
        slots_ref[i] = pages_ref[i, length // PAGE] * PAGE + length % PAGE
        return carry

    jax.lax.fori_loop(0, num_ref[0], body, 0)


def append_kernel(num_ref, slots_ref, new_hbm, cache_hbm, out_hbm, sem):
    del cache_hbm  # aliased to out_hbm: updated in place
    last = out_hbm.shape[0] - 1

    def body(i, carry):
        row = jnp.minimum(slots_ref[i], last)
        copy = pltpu.make_async_copy(new_hbm.at[pl.ds(i, 1)], out_hbm.at[pl.ds(row, 1)], sem)
        copy.start()
        copy.wait()
        return carry

    jax.lax.fori_loop(0, num_ref[0], body, 0)  # the live prefix of the schedule


@functools.partial(jax.jit, donate_argnums=0)
def decode_step(cache, new, lens, pages, num_seqs):
    smem, hbm = pl.BlockSpec(memory_space=pltpu.SMEM), pl.BlockSpec(memory_space=pl.ANY)
    slots = pl.pallas_call(
        schedule_kernel, in_specs=[smem, smem, smem], out_specs=smem,
        out_shape=jax.ShapeDtypeStruct((MAX_SEQS,), jnp.int32))(num_seqs, lens, pages)
    cache = pl.pallas_call(
        append_kernel, in_specs=[smem, smem, hbm, hbm], out_specs=hbm,
        out_shape=jax.ShapeDtypeStruct(cache.shape, cache.dtype),
        scratch_shapes=[pltpu.SemaphoreType.DMA(())],
        input_output_aliases={3: 0})(num_seqs, slots, new, cache)
    return cache, lens + (jnp.arange(MAX_SEQS) < num_seqs[0]).astype(lens.dtype)


def inputs():
    cache = np.arange(PAGES * PAGE * 128, dtype=np.float32).reshape(PAGES * PAGE, 128) / 9.0
    new = np.repeat(-np.arange(1, MAX_SEQS + 1, dtype=np.float32)[:, None], 128, axis=1)
    lens = np.array([3, 9, 0, 15, 0, 0, 0, 0], np.int32)
    pages = np.array([[5, 2], [7, 1], [0, 3], [4, 6], [8, 9], [10, 11], [12, 13], [14, 15]],
                     np.int32)
    return cache, new, lens, pages


def reference(cache, new, lens, pages, num_seqs):
    want = cache.copy()
    for i in range(num_seqs):
        want[pages[i, lens[i] // PAGE] * PAGE + lens[i] % PAGE] = new[i]
    return want


if __name__ == "__main__":
    cache, new, lens, pages = inputs()
    donated = jnp.asarray(cache)
    out, grown = decode_step(donated, jnp.asarray(new), jnp.asarray(lens), jnp.asarray(pages),
                             jnp.asarray([3], jnp.int32))
    assert donated.is_deleted()  # donated: the step consumed it, as on a TPU
    np.testing.assert_array_equal(np.asarray(out), reference(cache, new, lens, pages, 3))
    np.testing.assert_array_equal(np.asarray(grown), lens + [1, 1, 1, 0, 0, 0, 0, 0])
    print("donated_schedule_ok: output matches")
