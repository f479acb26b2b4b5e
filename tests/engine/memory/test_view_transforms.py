"""The one table of view transforms (engine/memory/views.py `_TRANSFORMS`): each kind's
value path (`apply`, `undo`) and element-map path (`units`) say the same thing, and a kind
not in the table is refused by name."""

from __future__ import annotations

import numpy as np
import pytest

from pallas_check.engine.memory.views import (UnsupportedTransform, _TRANSFORMS,
                                              _build_map, view_transform)
from jax._src.state import indexing as state_indexing  # the oracle: JAX's ref types
from jax._src.state import types as state_types

SHAPE = (8, 128)


def _transforms() -> dict[str, object]:
    return {
        "index": state_indexing.NDIndexer.from_indices_shape(
            (state_indexing.Slice(2, 4, 1), slice(None)), SHAPE),
        "reshape": state_types.ReshapeTransform((4, 256)),
        "transpose": state_types.TransposeTransform((1, 0)),
        "bitcast": state_types.BitcastTransform(np.dtype(np.int32)),
    }


def test_every_transform_kind_has_one_entry() -> None:
    kinds = {type(t) for t in _transforms().values()}
    assert kinds == set(_TRANSFORMS)


@pytest.mark.parametrize("name", ["index", "reshape", "transpose", "bitcast"])
def test_value_and_element_map_agree(name: str) -> None:
    """The view's value at each element is the buffer's value at the element the map
    names: apply (values) and units (where they lie) are one description."""
    t = _transforms()[name]
    buffer = np.arange(np.prod(SHAPE), dtype=np.float32).reshape(SHAPE)
    seen = view_transform(t).apply(t, buffer)
    emap = _build_map(SHAPE, buffer.dtype, [(0, n, 1) for n in SHAPE], [t])
    elements = emap.units[..., 0] // emap.per
    assert seen.shape == elements.shape
    np.testing.assert_array_equal(seen.view(np.uint32),
                                  buffer.reshape(-1)[elements].view(np.uint32))


@pytest.mark.parametrize("name", ["index", "reshape", "transpose", "bitcast"])
def test_undo_inverts_apply(name: str) -> None:
    t = _transforms()[name]
    before = np.arange(np.prod(SHAPE), dtype=np.float32).reshape(SHAPE)
    new = view_transform(t).apply(t, before) * 1  # the view's value, written back
    np.testing.assert_array_equal(view_transform(t).undo(t, np.zeros_like(before) + before,
                                                         new), before)


def test_a_transform_not_in_the_table_is_refused_by_name() -> None:
    class Flip:
        pass

    with pytest.raises(UnsupportedTransform, match="Flip"):
        view_transform(Flip())
