"""Probe: where the v5e's flash attention parts from the simulation (session 32).

The kernel repository's recording (hardware/device_call7.sh) showed the shipped flash
attention (jax.experimental.pallas.ops.tpu.flash_attention) 0.4 % of a row's largest value
off the simulation for the (2, 1, 128, 64) shapes, while a float32 model of it (operands of
`p @ v` rounded to bfloat16 or not) is as far from the chip. This probe computes the
kernel's stages one by one on the recorded operands (flash_inputs.npz: call 29, q, k, v
bfloat16-valued float32), each as its own kernel output, so that the stage where the chip
leaves float32 arithmetic shows: `s = q k^T` (the kernel's NT dot_general), the row max,
`p = exp(s - m)`, `l = sum(p)`, `1 / l`, `p @ v`, and the product; then `exp` alone and
`p @ v` alone on operands computed here in float64, and the shipped kernel itself.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from common import Results, call, main_guard

NT = (((1,), (1,)), ((), ()))


def stages(q, k, v):
    def kernel(q_ref, k_ref, v_ref, s_ref, p_ref, l_ref, inv_ref, o_ref, out_ref):
        s = lax.dot_general(q_ref[...], k_ref[...], NT, preferred_element_type=jnp.float32)
        s_ref[...] = s
        m = jnp.max(s, axis=1)[:, None]
        p = jnp.exp(s - m)
        p_ref[...] = p
        l = jnp.tile(jnp.sum(p, axis=1)[:, None], (1, 128))
        l_ref[...] = l
        inv = 1.0 / l
        inv_ref[...] = inv
        o = jax.lax.dot(p, v_ref[...], preferred_element_type=jnp.float32)
        o_ref[...] = o
        out_ref[...] = o * inv[:, :v_ref.shape[1]]
    n, d = q.shape
    f32 = jnp.float32
    shapes = [jax.ShapeDtypeStruct((n, n), f32), jax.ShapeDtypeStruct((n, n), f32),
              jax.ShapeDtypeStruct((n, 128), f32), jax.ShapeDtypeStruct((n, 128), f32),
              jax.ShapeDtypeStruct((n, d), f32), jax.ShapeDtypeStruct((n, d), f32)]
    outs = call(kernel, out_shape=shapes)(q, k, v)
    return dict(zip(["s", "p", "l", "inv", "o", "out"], outs))


def exp_only(x):
    def kernel(x_ref, o_ref):
        o_ref[...] = jnp.exp(x_ref[...])
    return call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def dot_only(a, b, nt=False):
    def kernel(a_ref, b_ref, o_ref):
        if nt:
            o_ref[...] = lax.dot_general(a_ref[...], b_ref[...], NT,
                                         preferred_element_type=jnp.float32)
        else:
            o_ref[...] = jax.lax.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)
    rows, cols = a.shape[0], (b.shape[0] if nt else b.shape[1])
    return call(kernel, out_shape=jax.ShapeDtypeStruct((rows, cols), jnp.float32))(a, b)


def run(r: Results) -> None:
    z = np.load(Path(__file__).with_name("flash_inputs.npz"))
    q4, k4, v4 = z["q"], z["k"], z["v"]
    q, k, v = q4[0, 0], k4[0, 0], v4[0, 0]
    r.case("stages", lambda: stages(q, k, v))
    s64 = q.astype(np.float64) @ k.astype(np.float64).T
    x = (s64 - s64.max(1, keepdims=True)).astype(np.float32)
    r.array("x", x)
    r.case("exp", lambda: exp_only(x))
    p = np.exp(x.astype(np.float64)).astype(np.float32)
    r.array("p_here", p)
    r.case("pv", lambda: dot_only(p, v))
    r.case("qk_nt", lambda: dot_only(q, k, nt=True))
    r.case("qk_nn", lambda: dot_only(q, np.ascontiguousarray(k.T)))
    from jax.experimental.pallas.ops.tpu import flash_attention as fa
    r.case("shipped", lambda: fa.flash_attention(q4, k4, v4, causal=False, sm_scale=1.0))


if __name__ == "__main__":
    main_guard(run, "flash_stages")
