"""The chip's compile in its worker process (pallas_check/tpu_compile/remote.py): a real
abort of libtpu's compiler is an answer, not the end of this process; the compiler's
exception comes back as its own class; the worker is replaced after a crash."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from pallas_check.tpu_compile.remote import last_words
from pallas_check.tpu_compile.toolchain import libtpu_missing

SAMPLES = Path(__file__).resolve().parents[2] / "samples"
needs_libtpu = pytest.mark.skipif(libtpu_missing() is not None, reason="needs libtpu")

# What a TPU v5e host wrote when `jax.jit(copy_start)` of samples/cross_call_dma_ok.py (a
# program whose results are DMA semaphores) was compiled there (libtpu 0.0.42.1, jax 0.10.2;
# the process aborted, exit 134), less the unrelated start-up lines.
V5E_STDERR = """\
F1207 07:02:20.471706    1918 lowering_util.cc:1534] Check failed: source->memory_space() \
== MemorySpace::kVmem || MemorySpaceIsShared(source->memory_space()) Unsupported source \
memory space LloInstruction{this=0x7ee22c004000, opcode=inlined-call-operand, ordinal=0, \
operands_size=0, operands=[], users=[], annotation="operand 0", memory_space=sflag}
*** Check failure stack trace: ***
    @     0x7ee4bd35d2a4  (unknown)
https://symbolize.stripped_domain/r/?trace=7ee4c4a8eec,7ee4c4a5a04f&map=
*** SIGABRT received by PID 1918 (TID 1918) on cpu 3, si_code=-6, from PID 1918; ***
"""
CHECK = ("Check failed: source->memory_space() == MemorySpace::kVmem ||"
         " MemorySpaceIsShared(source->memory_space()) Unsupported source memory space"
         " LloInstruction{this=0x..., opcode=inlined-call-operand, ordinal=0,"
         ' operands_size=0, operands=[], users=[], annotation="operand 0", memory_space=sflag}')


def test_last_words_are_the_check_failed_line_with_addresses_blanked():
    assert last_words(V5E_STDERR) == CHECK


def test_last_words_without_a_check_are_the_last_fatal_line_or_nothing():
    text = ("I0000 00:00:00.1 1 a.cc:1] starting\n"
            "F0101 00:00:00.2 7 b.cc:9] RET_CHECK failure at 0xdeadbeef\n")
    assert last_words(text) == "RET_CHECK failure at 0x..."
    assert last_words("Segmentation fault\n") == ""


def _sample(name: str):
    spec = importlib.util.spec_from_file_location(name, SAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _job(fn, *shapes):
    """`fn` exported for v5e on f32 operands of `shapes`, as the worker's job."""
    import jax
    import jax.numpy as jnp

    from pallas_check.config import TpuGeneration
    from pallas_check.jaxbridge.export import exported_for_tpu
    from pallas_check.tpu_compile import remote, toolchain

    device = toolchain.compile_device(TpuGeneration.V5E)
    sharding = jax.sharding.SingleDeviceSharding(device)
    args = [jax.ShapeDtypeStruct(shape, jnp.float32, sharding=sharding) for shape in shapes]
    with jax.default_device(device):
        blob = exported_for_tpu(jax.jit(fn), args)
    return remote.Job(blob, toolchain.topology_name(TpuGeneration.V5E))


@needs_libtpu
def test_a_real_compiler_abort_is_an_answer_and_the_next_compile_gets_a_new_worker():
    """The sample's first call compiled with its DMA semaphores as the program's results:
    libtpu's compiler aborts (as on the v5e above); this process goes on, and a compile
    after it is answered by a fresh worker."""
    from pallas_check.tpu_compile import remote

    copy_start = _sample("cross_call_dma_ok").copy_start
    before = remote.workers_started()
    answer = remote.compile_in_worker(_job(copy_start, (8, 128)))
    assert (answer.crashed, answer.signal_name, answer.last_words) == (True, "SIGABRT", CHECK)
    assert answer.error_class is None and answer.scoped_bytes is None

    def double(x):
        from jax.experimental import pallas as pl

        def kernel(x_ref, o_ref):
            o_ref[...] = x_ref[...] * 2.0
        import jax
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    answer = remote.compile_in_worker(_job(double, (8, 128)))
    assert not answer.crashed and answer.error_class is None
    # The scoped VMEM the same call takes compiled in this process (two 4 KiB blocks).
    assert answer.scoped_bytes == _compiled_here(double, (8, 128)) == 8192
    assert remote.workers_started() >= before + 1


def _compiled_here(fn, shape) -> int:
    import jax
    import jax.numpy as jnp

    from pallas_check.config import TpuGeneration
    from pallas_check.tpu_compile import toolchain
    from pallas_check.tpu_compile.remote import scoped_use

    device = toolchain.compile_device(TpuGeneration.V5E)
    arg = jax.ShapeDtypeStruct(shape, jnp.float32,
                               sharding=jax.sharding.SingleDeviceSharding(device))
    with jax.default_device(device):
        return scoped_use(jax.jit(fn).lower(arg).compile().as_text())


@needs_libtpu
def test_the_compilers_exception_comes_back_as_its_own_class_with_its_message():
    """A strided load from a 256-lane ref: Mosaic refuses it at compile time (not at the
    lowering, which ran in this process); the answer is Pallas's MosaicError."""
    from pallas_check.tpu_compile import remote

    def strided(x):
        import jax
        from jax.experimental import pallas as pl

        def kernel(x_ref, o_ref):
            o_ref[...] = x_ref[:, pl.ds(0, 128, stride=2)]
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), x.dtype))(x)

    answer = remote.compile_in_worker(_job(strided, (8, 256)))
    assert answer.error_class is not None and not answer.crashed
    assert answer.error_class.__name__ == "MosaicError"
    assert answer.error_class.__module__ == "jax._src.pallas.mosaic.error_handling"
    assert answer.error_args == (answer.message,)
    assert "The last dim size is not 128" in answer.message
