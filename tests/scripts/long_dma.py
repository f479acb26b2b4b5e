"""A long call of manual DMAs, each waited before its data is read (correct: no finding).

From a debug callback at grid steps STEPS // 4 and STEPS - 1 it prints how much memory
allocated by the trace recorder (engine/timeline.py, report/trace.py) is still alive
(`retained STEP BYTES BLOCKS`, measured with tracemalloc, which this script starts and stops): with
`--trace`, that must not grow with the steps run (tests/report/test_trace_stream.py). It
prints "running" at grid step 1, so that a test knows the call is being simulated.

Usage: long_dma.py [STEPS]  (default 400)
"""

import gc
import sys
import tracemalloc

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 400
RECORDER = ("*/pallas_check/engine/timeline.py", "*/pallas_check/report/trace.py")


def measure(i):
    gc.collect()  # (it also empties the free lists, whose blocks tracemalloc counts as alive)
    snapshot = tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.Filter(True, pattern) for pattern in RECORDER])
    stats = snapshot.statistics("filename")
    print("retained", int(i), sum(s.size for s in stats), sum(s.count for s in stats),
          flush=True)


def say_running():
    print("running", flush=True)


def kernel(x_hbm, o_ref, buf, sem):
    i = pl.program_id(0)
    copy = pltpu.make_async_copy(x_hbm, buf, sem)
    copy.start()
    copy.wait()
    o_ref[...] = buf[...] * 2.0
    pl.when(i == 1)(lambda: jax.debug.callback(say_running))
    pl.when((i == STEPS // 4) | (i == STEPS - 1))(lambda: jax.debug.callback(measure, i))


def twice(x):
    return pl.pallas_call(
        kernel, grid=(STEPS,),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
        out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA],
    )(x)


if __name__ == "__main__":
    tracemalloc.start()
    try:
        out = jax.jit(twice)(jnp.ones((8, 128), jnp.float32))
        assert float(out[0, 0]) == 2.0
    finally:
        tracemalloc.stop()
    print("long_dma: finished", flush=True)
