"""Findings of the right kind at the right line (issue 10, item 6): each defect below used
to surface as another kind, at another line, or as pallas-check's own failure."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path


HEADER = """\
import jax, jax.numpy as jnp, numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import NamedSharding, PartitionSpec as P
"""

SHARD_MAIN = """
mesh = jax.make_mesh((N,), ("x",))
x = jnp.arange(N * 8 * 128, dtype=jnp.float32).reshape(N * 8, 128)
out = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                            check_vma=False))(jax.device_put(x, NamedSharding(mesh, P("x"))))
print("ran", np.asarray(out).shape)
"""


def run(tmp_path: Path, body: str, *options: str) -> tuple[subprocess.CompletedProcess, dict]:
    """Run the kernel script (a shard_mapped one when --devices is given)."""
    script = tmp_path / "kernel.py"
    script.write_text(HEADER + textwrap.dedent(body)
                      + (SHARD_MAIN if "--devices" in options else ""))
    proc = subprocess.run([sys.executable, "-m", "pallas_check", "run", "--format", "json",
                           *options, str(script)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)
    return proc, json.loads(proc.stdout)


def line_of(tmp_path: Path, marker: str) -> int:
    lines = (tmp_path / "kernel.py").read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if marker in line)


def test_a_device_id_outside_the_mesh_is_an_out_of_bounds_finding(tmp_path):
    proc, report = run(tmp_path, """
        N = 4
        def kernel(x_ref, o_ref, buf, send, recv):
            left = lax.rem(lax.axis_index("x") - 1, N)  # -1 on device 0
            copy = pltpu.make_async_remote_copy(x_ref, buf, send, recv, device_id=(left,),
                                                device_id_type=pl.DeviceIdType.MESH)
            copy.start()  # HERE
            copy.wait()
            o_ref[...] = buf[...]
        def f(x):
            return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                                  scratch_shapes=[pltpu.VMEM(x.shape, x.dtype),
                                                  pltpu.SemaphoreType.DMA,
                                                  pltpu.SemaphoreType.DMA])(x)
        """, "--devices", "4", "--no-races")  # no barrier before the copy: also a race
    assert proc.returncode == 1, proc.stderr
    assert report["internal_error"] is None
    (finding,) = report["findings"]
    assert finding["kind"] == "out-of-bounds" and finding["buffer"] == "device mesh"
    assert finding["frames"][0]["line"] == line_of(tmp_path, "# HERE")
    assert finding["message"].startswith("device id -1 is outside the device mesh (x: 4)")
    assert [c["failed"] for c in report["calls"]] == [False]
    assert "Exception ignored" not in proc.stderr and "Traceback" not in proc.stderr


def test_a_remote_copy_before_the_neighbour_entered_is_a_race_at_the_copy(tmp_path):
    proc, report = run(tmp_path, """
        N = 2
        def kernel(x_ref, o_ref, send, recv):
            other = 1 - lax.axis_index("x")  # no barrier: the other may not have entered
            copy = pltpu.make_async_remote_copy(x_ref, o_ref, send, recv, device_id=(other,),
                                                device_id_type=pl.DeviceIdType.MESH)
            copy.start()  # HERE
            copy.wait()
        def f(x):
            return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                                  scratch_shapes=[pltpu.SemaphoreType.DMA,
                                                  pltpu.SemaphoreType.DMA])(x)
        """, "--devices", "2", "--races")
    races = [f for f in report["findings"] if f["kind"] == "race"]
    assert races, report["findings"]
    assert races[0]["buffer"] == "o_ref"
    assert races[0]["frames"][0]["line"] == line_of(tmp_path, "# HERE")
    operations = {a["operation"] for a in races[0]["accesses"]}
    assert operations == {"DMA write", "kernel entry (its memory becomes the kernel's)"}
    assert not [f for f in report["findings"] if f["kind"] == "unwritten-output"]


def test_the_same_exchange_after_a_barrier_is_clean(tmp_path):
    proc, report = run(tmp_path, """
        N = 2
        def kernel(x_ref, o_ref, send, recv):
            other = 1 - lax.axis_index("x")
            barrier = pltpu.get_barrier_semaphore()
            pl.semaphore_signal(barrier, device_id=(other,), device_id_type=pl.DeviceIdType.MESH)
            pl.semaphore_wait(barrier, 1)
            copy = pltpu.make_async_remote_copy(x_ref, o_ref, send, recv, device_id=(other,),
                                                device_id_type=pl.DeviceIdType.MESH)
            copy.start()
            copy.wait()
        def f(x):
            return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                                  scratch_shapes=[pltpu.SemaphoreType.DMA,
                                                  pltpu.SemaphoreType.DMA],
                                  compiler_params=pltpu.CompilerParams(collective_id=0))(x)
        """, "--devices", "2", "--races")
    assert proc.returncode == 0, proc.stderr
    assert report["findings"] == []


def test_a_dma_of_never_written_elements_into_an_output_is_uninitialized_at_the_dma(tmp_path):
    proc, report = run(tmp_path, """
        def kernel(x_ref, o_hbm, scratch, sem):
            scratch[0:4] = x_ref[0:4]  # rows 4:8 of scratch are never written
            copy = pltpu.make_async_copy(scratch, o_hbm, sem)
            copy.start()  # HERE
            copy.wait()
        x = jnp.ones((8, 128), jnp.float32)
        out = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                             out_specs=pl.BlockSpec(memory_space=pl.ANY),
                             scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32),
                                             pltpu.SemaphoreType.DMA])(x)
        print("ran", out.shape)
        """)
    kinds = [f["kind"] for f in report["findings"]]
    assert kinds == ["uninitialized"], report["findings"]
    finding = report["findings"][0]
    assert finding["buffer"] == "scratch" and finding["index_range"] == [[4, 8], [0, 128]]
    assert finding["frames"][0]["line"] == line_of(tmp_path, "# HERE")


def test_dmas_of_different_sizes_waited_with_the_wrong_descriptor(tmp_path):
    proc, report = run(tmp_path, """
        def kernel(x_hbm, o_ref, small, big, sem):
            a = pltpu.make_async_copy(x_hbm.at[pl.ds(0, 8)], small, sem)
            b = pltpu.make_async_copy(x_hbm.at[pl.ds(8, 16)], big, sem)
            a.start()
            b.start()  # HERE
            a.wait()
            a.wait()  # should be b.wait(): 4096 of b's 8192 bytes are never waited
            o_ref[0:8] = small[...]
            o_ref[8:24] = big[...]
        x = jnp.arange(24 * 128, dtype=jnp.float32).reshape(24, 128)
        out = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                             in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                             scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32),
                                             pltpu.VMEM((16, 128), jnp.float32),
                                             pltpu.SemaphoreType.DMA])(x)
        print("ran", out.shape)
        """)
    (finding,) = [f for f in report["findings"] if f["kind"] == "dma-not-waited"]
    assert finding["frames"][0]["line"] == line_of(tmp_path, "# HERE")
    assert finding["details"]["bytes"] == 8192 and finding["details"]["waited_bytes"] == 4096
    assert finding["details"]["semaphore_count"] == 4096
    assert "4096 bytes were never waited, and semaphore sem ends the kernel with count 4096" \
        in finding["message"]
