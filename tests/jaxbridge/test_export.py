"""jaxbridge/export.py: a call exported for the TPU compile worker carries the kernel the
plain lowering makes (the one a TPU host compiles under `jax.jit`), not the
forward-compatible one `jax.export` makes by default."""

from __future__ import annotations

import pickle
import re

import pytest

from pallas_check.tpu_compile.toolchain import libtpu_missing

_KERNEL = re.compile(r'backend_config = "([^"]*)"')


@pytest.mark.skipif(libtpu_missing() is not None, reason="needs libtpu")
def test_the_exported_kernel_is_the_plain_lowerings():
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    from pallas_check.config import TpuGeneration
    from pallas_check.jaxbridge.export import exported_for_tpu
    from pallas_check.tpu_compile import toolchain

    def kernel(x_ref, o_ref):
        o_ref[...] = 1.0 / x_ref[...]

    def fn(x):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    device = toolchain.compile_device(TpuGeneration.V5E)
    arg = jax.ShapeDtypeStruct((8, 128), jnp.float32,
                               sharding=jax.sharding.SingleDeviceSharding(device))
    with jax.default_device(device):
        plain = jax.jit(fn).lower(arg).as_text()
        carried = pickle.loads(exported_for_tpu(jax.jit(fn), [arg])).mlir_module()
        default = jax.export.export(jax.jit(fn), platforms=["tpu"])(arg).mlir_module()
    [kernel_text] = _KERNEL.findall(plain)
    assert _KERNEL.findall(carried) == [kernel_text]
    # (what the option is for: JAX's default export lowers this kernel otherwise)
    assert _KERNEL.findall(default) != [kernel_text]
