"""Where pure equations run (engine/jaxpr/segment_order.py): fewer compiled segments, the same
values, the same memory accesses in the same order, the same findings."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_check.config import Config
from pallas_check.engine.jaxpr import program as jaxpr_program
from pallas_check.engine.jaxpr.segment_order import schedule
from pallas_check.engine.runtime.caches import BoundedCache
from jax._src import core as jax_core  # the oracle: JAX's own types


def _programs_built(monkeypatch) -> list[jaxpr_program.Program]:
    """Every program the engine builds from now on (the cache is bypassed)."""
    built: list[jaxpr_program.Program] = []
    original = jaxpr_program._build_program

    def build(jaxpr, skip_floats):
        program = original(jaxpr, skip_floats)
        built.append(program)
        return program

    monkeypatch.setattr(jaxpr_program, "_build_program", build)
    monkeypatch.setattr(jaxpr_program, "_programs", BoundedCache(256))
    return built


def _softmax_kernel(x_ref, m_ref, o_ref, m_scratch):
    """Pure arithmetic interleaved with loads and stores, a value read before a store and
    used after it, a jnp.where (a nested jit) between them."""
    m_scratch[...] = m_ref[...]
    x = x_ref[...] * 0.5
    old = m_scratch[...]                     # read before the store below ...
    m_new = jnp.maximum(old, jnp.max(x, axis=1, keepdims=True))
    m_scratch[...] = m_new
    p = jnp.exp(x - m_new)
    total = jnp.where(p > 0.25, p, 0.0).sum(axis=1, keepdims=True)
    o_ref[...] = p / total + old             # ... and used after it: the old value


def _softmax(x, m):
    return pl.pallas_call(
        _softmax_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[pltpu.VMEM((x.shape[0], 1), jnp.float32)])(x, m)


def _softmax_ref(x, m):
    x = x * 0.5
    m_new = jnp.maximum(m, jnp.max(x, axis=1, keepdims=True))
    p = jnp.exp(x - m_new)
    total = jnp.where(p > 0.25, p, 0.0).sum(axis=1, keepdims=True)
    return p / total + m


def _kernel_program(built: list[jaxpr_program.Program]) -> jaxpr_program.Program:
    return max(built, key=lambda p: len(p.steps))


def test_pure_code_between_loads_and_stores_merges_and_keeps_values(check, monkeypatch):
    built = _programs_built(monkeypatch)
    x = jax.random.normal(jax.random.key(0), (8, 128), jnp.float32)
    m = jnp.full((8, 1), 0.1, jnp.float32)
    r = check(_softmax, x, m)
    assert r.findings == []
    np.testing.assert_allclose(np.asarray(r.value), np.asarray(_softmax_ref(x, m)),
                               rtol=1e-6)
    program = _kernel_program(built)
    segments = [s for s in program.steps if isinstance(s, jaxpr_program.Segment)]
    ruled = [s for s in program.steps if not isinstance(s, jaxpr_program.Segment)]
    # Ruled: 3 loads, 3 stores, in the kernel's order; the nested jit of jnp.where is
    # pure and runs inside a segment. In source order the pure code sits in 4 gaps
    # (after x's load, after old's load, after the second store, before o's store); all
    # of it is ready once `old` is loaded and needed only by the stores after it: 1 gap.
    names = [e.primitive.name for e in ruled]
    assert names == ["get", "swap", "get", "get", "swap", "swap"]
    assert not any(e.primitive.name == "jit" for e in ruled)
    assert len(segments) == 1
    assert program.steps.index(segments[0]) == 4  # right after the third load


def test_unused_old_value_of_a_store_is_dropped(check, monkeypatch):
    built = _programs_built(monkeypatch)
    x = jnp.ones((8, 128), jnp.float32)
    check(_softmax, x, jnp.zeros((8, 1), jnp.float32))
    program = _kernel_program(built)
    swaps = [s for s in program.steps
             if not isinstance(s, jaxpr_program.Segment) and s.primitive.name == "swap"]
    assert swaps and all(isinstance(s.outvars[0], jax_core.DropVar) for s in swaps)


def test_findings_keep_their_lines_after_reordering(check):
    """An uninitialized scratch read between pure code is reported at its own line."""

    def kernel(x_ref, o_ref, acc_ref):
        y = x_ref[...] * 2.0
        acc = acc_ref[...]  # never written: uninitialized
        o_ref[...] = y + acc
    line = kernel.__code__.co_firstlineno + 2

    def f(x):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              scratch_shapes=[pltpu.VMEM(x.shape, jnp.float32)])(x)

    r = check(f, jnp.ones((8, 128), jnp.float32), config=Config())
    uninit = [fd for fd in r.findings if fd.kind.value == "uninitialized"]
    assert len(uninit) == 1
    assert uninit[0].buffer == "acc_ref" and uninit[0].frames[0].line == line


def _jaxpr_of(fn, *args):
    return jax.make_jaxpr(fn)(*args).jaxpr


def test_schedule_keeps_anchor_order_and_defines_before_use():
    """On a plain jaxpr, with some equations declared unmovable: the unmovable ones keep
    their order, every variable is defined before it is read, and the movable ones end up
    in the fewest gaps."""

    def fn(a, b):
        c = a + 1.0          # movable, needs only an input
        d = jnp.sin(b)       # anchor 1 (declared below)
        e = c * 2.0          # movable
        f = jnp.cos(d)       # anchor 2
        g = e + f            # movable: needs anchor 2
        h = c - 3.0          # movable
        return g, h

    jaxpr = _jaxpr_of(fn, np.float32(1), np.float32(2))
    anchors = {"sin", "cos"}
    movable = [e.primitive.name not in anchors for e in jaxpr.eqns]
    order = [jaxpr.eqns[i] for i in schedule(jaxpr.eqns, jaxpr.outvars, movable)]
    assert sorted(map(id, order)) == sorted(map(id, jaxpr.eqns))
    assert [e.primitive.name for e in order if e.primitive.name in anchors] == ["sin", "cos"]
    defined = set(jaxpr.invars)
    for e in order:
        assert all(v in defined for v in e.invars if isinstance(v, jax_core.Var))
        defined.update(e.outvars)
    # g needs cos, so one gap after cos holds it; c, e, h fit there too: one gap used.
    assert [e.primitive.name for e in order] == ["sin", "cos", "add", "mul", "add", "sub"]


def _gaps_used(eqns, movable, order) -> int:
    """How many gaps between unmovable equations hold some movable one, in `order`."""
    used, current = 0, False
    for i in order:
        if movable[i]:
            current = True
        else:
            used, current = used + current, False
    return used + current


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(st.data())
def test_schedule_on_random_programs(data):
    """Random straight-line programs, random unmovable equations: the order is a
    permutation, keeps the unmovable ones in order, defines before use, and never uses
    more gaps (compiled segments) than the original order."""
    n_ops = data.draw(st.integers(2, 14))
    picks = [(data.draw(st.sampled_from(["add", "mul", "sin", "neg"])),
              data.draw(st.integers(0, 10**6)), data.draw(st.integers(0, 10**6)))
             for _ in range(n_ops)]

    def fn(a, b):
        values = [a, b]
        for op, i, j in picks:
            x, y = values[i % len(values)], values[j % len(values)]
            values.append({"add": lambda: x + y, "mul": lambda: x * y,
                           "sin": lambda: jnp.sin(x), "neg": lambda: -x}[op]())
        return values[-1], values[len(values) // 2]

    jaxpr = _jaxpr_of(fn, np.float32(1), np.float32(2))
    movable = [not data.draw(st.booleans()) for _ in jaxpr.eqns]
    order = schedule(jaxpr.eqns, jaxpr.outvars, movable)
    assert sorted(order) == list(range(len(jaxpr.eqns)))
    anchors = [i for i in order if not movable[i]]
    assert anchors == sorted(anchors)
    defined = set(jaxpr.invars)
    for i in order:
        eqn = jaxpr.eqns[i]
        assert all(v in defined for v in eqn.invars if isinstance(v, jax_core.Var))
        defined.update(eqn.outvars)
    assert _gaps_used(jaxpr.eqns, movable, order) <= _gaps_used(
        jaxpr.eqns, movable, list(range(len(jaxpr.eqns))))
