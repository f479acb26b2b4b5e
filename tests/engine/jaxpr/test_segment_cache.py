"""engine/jaxpr/segment_cache.py: a segment's disk entry is found by what the segment is,
and nothing that changes its program shares an entry with it."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_check.engine.jaxpr.segment_cache import segment_path
from pallas_check.engine.runtime import disk_cache


def _avals(*shapes, dtype=jnp.float32):
    return [jax.ShapeDtypeStruct(s, dtype) for s in shapes]


def test_what_changes_a_segments_program_changes_its_entry(tmp_path, monkeypatch):
    monkeypatch.setenv(disk_cache.ENV, str(tmp_path))
    base = segment_path("('{ lambda ; a:f32[8,128]. let b = tanh a in (b,) }', False, True)",
                        _avals((8, 128)))
    assert base is not None and base.parent == tmp_path
    assert segment_path("('{ lambda ; a:f32[8,128]. let b = tanh a in (b,) }', False, True)",
                        _avals((8, 128))) == base  # the same segment: one entry
    others = [
        segment_path("('{ lambda ; a:f32[8,128]. let b = tanh a in (b,) }', False, False)",
                     _avals((8, 128))),  # the other arithmetic
        segment_path("('{ lambda ; a:f32[8,128]. let b = tanh a in (b,) }', False, True)",
                     _avals((16, 128))),  # other operands
        segment_path("('{ lambda ; a:f32[8,128]. let b = tanh a in (b,) }', False, True)",
                     _avals((8, 128), dtype=jnp.bfloat16)),
    ]
    with jax.default_matmul_precision("highest"):
        others.append(segment_path(
            "('{ lambda ; a:f32[8,128]. let b = tanh a in (b,) }', False, True)",
            _avals((8, 128))))
    assert len({base, *others}) == 5


def test_no_entry_with_the_cache_off(monkeypatch):
    monkeypatch.setenv(disk_cache.ENV, "off")
    assert segment_path("x", _avals((8, 128))) is None
