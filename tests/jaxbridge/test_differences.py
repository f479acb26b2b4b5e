"""Each JAX version difference the bridge handles, one test each (run on the installed JAX;
the branch for the other version is exercised by faking its absence)."""

from __future__ import annotations

import inspect

import pytest

from pallas_check.jaxbridge import call, types
from pallas_check.jaxbridge.version import compiled_tier_refusal


def test_dict_compiler_params_under_either_key_give_the_semantics() -> None:
    """"mosaic_tpu" (jax >= 0.8) and "mosaic" (before) both carry dimension_semantics: a
    reader of one key would drop the megacore split of the other."""
    for key in ("mosaic_tpu", "mosaic"):
        given = {key: {"dimension_semantics": ("parallel", "arbitrary"),
                       "vmem_limit_bytes": 1 << 20}}
        assert call._semantics(given) == ("parallel", "arbitrary")
        assert call._vmem_limit(given) == 1 << 20
    assert call._semantics(None) == ()


def test_tpu_refusal_without_a_lowering_rule_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """jax 0.9 has no `get_lowering_rule`: any non-TPU params fail the TPU assertion."""
    monkeypatch.delattr(call._pallas_core, "get_lowering_rule", raising=False)
    assert call.tpu_refusal(object()) == call.MOSAIC_FOREIGN_PARAMS


def test_tpu_refusal_with_the_registry() -> None:
    if not hasattr(call._pallas_core, "get_lowering_rule"):
        pytest.skip("jax 0.9: no registry")
    assert call.tpu_refusal(object()) == call.MOSAIC_FOREIGN_PARAMS


def test_types_a_version_lacks_match_nothing() -> None:
    """`plsc.Indices` and `pl.select_ref`'s transform are jax >= 0.10: on 0.9 they are
    `_Absent`, which no value is an instance of (and which cannot be made)."""
    assert not isinstance(object(), types._Absent)
    with pytest.raises(TypeError):
        types._Absent()
    for name in ("Indices", "SelectTransform"):
        assert isinstance(getattr(types, name), type)


def test_discharge_state_takes_a_closed_jaxpr() -> None:
    """jax 0.9's `discharge_state` takes (jaxpr, consts), its closed form is
    `discharge_state2`; jax 0.10's takes the ClosedJaxpr: the bridge's takes a closed one
    on both (on 0.9 the plain call fails: a missing `consts`)."""
    import jax
    import jax.numpy as jnp

    from pallas_check.jaxbridge.jaxprs import discharge_state, jaxpr_as_fun

    closed = jax.make_jaxpr(lambda x: x * 2 + 1)(jnp.zeros((2,), jnp.int32))
    out = discharge_state(closed)
    assert [int(v) for v in jaxpr_as_fun(out)(jnp.array([1, 2], jnp.int32))[0]] == [3, 5]


class _Eqn:
    """An equation with only the params a DMA reader reads."""

    def __init__(self, tree: object) -> None:
        self.params = {"tree": tree}


def test_dma_operands_in_either_layout_give_the_same_arguments() -> None:
    """jax 0.10 flattens a DMA's (src, dst, dst_sem, src_sem, device_id) as five children,
    a ref with transforms as one `TransformedRef`; jax 0.9 as nine (ref, its transforms,
    ..., device id). Both read as the same five arguments, at the same flat positions."""
    import jax

    from pallas_check.jaxbridge import params

    from jax._src.pallas.mosaic import primitives as mosaic_primitives

    src, dst, sem = object(), object(), object()
    trees = [jax.tree_util.tree_structure((src, (1, 2), dst, (), sem, (), None, (), None))]
    if len(inspect.signature(mosaic_primitives._dma_flatten).parameters) == 1:  # jax 0.10
        trees.append(mosaic_primitives._dma_flatten(
            types.TransformedRef(src, (1, 2)), dst, sem, None, None)[1])
    for tree in trees:
        eqn = _Eqn(tree)
        s, d, m = 1.5, 2.5, 3.5  # leaves that are no Sequence (a str would be a multi-ref)
        got = params.dma_arguments(eqn, [s, 10, 20, d, m])
        assert len(got) == 5
        assert isinstance(got[0], types.TransformedRef)
        assert got[0].ref == s and tuple(got[0].transforms) == (10, 20)
        assert got[1:] == (d, m, None, None)
        spans = [(a.start, a.stop) for a in params.dma_operands(eqn)]
        assert spans == [(0, 3), (3, 4), (4, 5), (5, 5), (5, 5)]


def test_abstract_device_without_a_platform_reads_as_its_kind() -> None:
    """jax 0.10's AbstractDevice records its platform; jax 0.9's only its kind (a CPU
    device's is "cpu"): both read as the platform, and both take a core count."""
    import jax

    import pallas_check.jaxbridge as bridge

    class Older:  # jax 0.9's fields
        device_kind = "cpu"
        num_cores = None

    assert bridge.abstract_device_platform(Older()) == "cpu"
    fields: dict[str, object] = {"device_kind": "cpu", "num_cores": None}
    if "platform" in jax.sharding.AbstractDevice.__dataclass_fields__:  # jax 0.10
        fields["platform"] = "cpu"
    else:  # jax 0.9: the class made has no platform either
        made = bridge.abstract_device_with_cores(Older(), 2)
        assert (made.device_kind, made.num_cores) == ("cpu", 2)
    newer = jax.sharding.AbstractDevice(**fields)
    assert bridge.abstract_device_platform(newer) == "cpu"
    assert bridge.abstract_device_with_cores(newer, 2).num_cores == 2


@pytest.mark.parametrize("version, refused", [("0.9.2", True), ("0.9.9.dev1", True),
                                              ("0.10.0", False), ("0.10.2", False)])
def test_the_compiled_tier_needs_jax_0_10(version: str, refused: bool) -> None:
    """jaxlib 0.9's XLA crashes compiling inside a host callback: below 0.10 the tier
    refuses every call with one reason, from 0.10 it does not."""
    reason = compiled_tier_refusal(version)
    assert (reason == "jax < 0.10 (its XLA crashes compiling the call inside the host"
            " callback)") if refused else reason is None
