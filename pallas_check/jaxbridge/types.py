"""JAX's jaxpr, ref and block types, under the names pallas-check's modules use.

Annotations and `isinstance` tests name these, never a module of `jax._src`: when JAX moves
or renames one (0.11 merges `Jaxpr` and `ClosedJaxpr`), this file is what changes. A type a
supported JAX version lacks is a class nothing is an instance of (`_Absent`), so that a check
for it is simply false there, in the one place the difference is written down.
"""

from __future__ import annotations

from typing import Any

from jax._src.core import (
    AbstractValue as AbstractValue,
    ClosedJaxpr as ClosedJaxpr,
    DropVar as DropVar,
    Jaxpr as Jaxpr,
    JaxprEqn as JaxprEqn,
    Literal as Literal,
    Primitive as Primitive,
    ShapedArray as ShapedArray,
    Var as Var,
)
from jax._src.literals import TypedInt as TypedInt
from jax._src.pallas.core import (
    AbstractSemaphoreTy as AbstractSemaphoreTy,
    Blocked as Blocked,
    BoundedSlice as BoundedSlice,
    Element as Element,
    Squeezed as Squeezed,
)
from jax._src.pallas.mosaic.sc_core import (
    ScalarSubcoreMesh as ScalarSubcoreMesh,
    VectorSubcoreMesh as VectorSubcoreMesh,
)
from jax._src.state.indexing import NDIndexer as NDIndexer, Slice as Slice
from jax._src.state.types import (
    AbstractRef as AbstractRef,
    BitcastTransform as BitcastTransform,
    ReshapeTransform as ReshapeTransform,
    Transform as Transform,
    TransformedRef as TransformedRef,
    TransposeTransform as TransposeTransform,
)

# An operand of an equation: a variable, or a literal constant.
Atom = Var | Literal


class _Absent:
    """Stands for a JAX type the running version does not have: nothing is an instance."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # pragma: no cover - never made
        raise TypeError("not a type of this JAX version")


# jax >= 0.10: SparseCore's gather/scatter index vector `plsc.Indices` (before: none, an
# indirect DMA indexes with a plain ref).
try:
    from jax._src.pallas.mosaic.sc_core import Indices as Indices
except ImportError:  # jax 0.9
    Indices = _Absent  # type: ignore[misc,assignment]

# jax >= 0.10: `pl.select_ref`'s transform (before: no ref selection).
try:
    from jax._src.state.types import SelectTransform as SelectTransform
except ImportError:  # jax 0.9
    SelectTransform = _Absent  # type: ignore[misc,assignment]


__all__ = [
    "AbstractRef", "AbstractSemaphoreTy", "AbstractValue", "Atom", "BitcastTransform",
    "Blocked", "BoundedSlice", "ClosedJaxpr", "DropVar", "Element", "Indices", "Jaxpr",
    "JaxprEqn", "Literal", "NDIndexer", "Primitive", "ReshapeTransform",
    "ScalarSubcoreMesh", "SelectTransform", "ShapedArray", "Slice", "Squeezed",
    "Transform", "TransformedRef", "TransposeTransform", "TypedInt", "Var", "VectorSubcoreMesh",
]
