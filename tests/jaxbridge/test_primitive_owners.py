"""Whose code lowers a primitive (jaxbridge/primitive_owners.py): JAX's primitives under
JAX's rules, and pallas-check's chip-arithmetic product, are trusted; a primitive of the
script's, and one of JAX's whose CPU rule the script replaced (even through JAX's own
`mlir.lower_fun`), are not."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.interpreters import mlir

from jax._src.interpreters import mlir as jax_mlir

from pallas_check.jaxbridge import primitive_owners
from pallas_check.jaxbridge.chip_arithmetic import chip_arithmetic


def test_jaxs_primitives_under_jaxs_rules_are_trusted():
    for primitive in (lax.sin_p, lax.add_p, lax.scan_p, lax.cond_p, lax.dot_general_p):
        assert primitive_owners.trusted(primitive), primitive


def test_pallas_checks_chip_arithmetic_rules_are_trusted():
    with chip_arithmetic(True):  # (registers its CPU rules: products, exp, division, ...)
        for primitive in (lax.dot_general_p, lax.exp_p, lax.exp2_p, lax.div_p, lax.logistic_p):
            rule = primitive_owners.cpu_rule(primitive)
            assert rule is not None
            assert rule.__module__ == "pallas_check.jaxbridge.chip_arithmetic", primitive
            assert primitive_owners.trusted(primitive), primitive


def test_a_primitive_of_the_scripts_is_not():
    scale = jax.extend.core.Primitive("script_scale_owned")
    scale.def_abstract_eval(lambda x: x)
    mlir.register_lowering(scale, mlir.lower_fun(lambda x: x * 2.0, multiple_results=False))
    assert not primitive_owners.trusted(scale)


def test_a_jax_primitive_whose_cpu_rule_the_script_replaced_is_not(monkeypatch):
    """Replaced through JAX's own `lower_fun` (a function of JAX's module wrapping the
    script's), then given back: trusted again."""
    assert primitive_owners.trusted(lax.sin_p)
    rule = mlir.lower_fun(lambda x: jnp.cos(x), multiple_results=False)
    cpu_rules = jax_mlir._platform_specific_lowerings["cpu"]
    monkeypatch.setitem(cpu_rules, lax.sin_p, jax_mlir.LoweringRuleEntry(rule, True))
    assert not primitive_owners.trusted(lax.sin_p)
    monkeypatch.undo()
    assert primitive_owners.trusted(lax.sin_p)
