"""A donated KV cache's append kernel reads one entry past its schedule's live prefix.

As donated_schedule_ok.py: a decode step, jitted with its paged KV cache donated, builds
a schedule of cache rows for its `num_seqs` live sequences only, and an append kernel
copies each live sequence's new row there, in place. Here the append kernel loops over
`num_seqs + 1` sequences: its last copy goes to the row the schedule's first
never-written entry names (clamped into the cache), whatever memory held there. The
donated step is run again on a copy of the cache with that entry holding the other fill:
another row of the returned cache changes, so the unwritten entries reach what the
program keeps, and pallas-check reports them, naming the result they reach (result 0,
the cache).

Run: pallas-check run samples/donated_schedule_bug.py --races
Expected finding: kind=unwritten-output buffer=slots_ref range=[3:8] line=29
(an unwritten element has no statement of its own: the line is the kernel's `def`)
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

    jax.lax.fori_loop(0, num_ref[0] + 1, body, 0)  # BUG: one entry past the live prefix


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
    out, _ = decode_step(jnp.asarray(cache), jnp.asarray(new), jnp.asarray(lens),
                         jnp.asarray(pages), jnp.asarray([3], jnp.int32))
    print("donated_schedule_bug: cache matches the reference:",
          bool(np.array_equal(np.asarray(out), reference(cache, new, lens, pages, 3))))
