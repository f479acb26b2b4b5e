"""The rule registry: which of our rules evaluates each primitive a kernel jaxpr may hold
(`RULES`, filled by the rule modules under engine/rules/ as they are imported), which
rules only evaluate sub-jaxprs (`BODY_ONLY`), and per-equation specializations
(`SPECIALIZERS`). Programs (program.py) read it when they are generated.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from pallas_check.jaxbridge.types import JaxprEqn, Primitive


RuleFn = Callable[..., Any]


@dataclasses.dataclass(frozen=True)
class Rule:
    fn: RuleFn
    is_generator: bool


RULES: dict[Primitive, Rule] = {}


# Primitives whose rule only evaluates their sub-jaxprs (jit, cond, loops, custom
# derivatives): the rule is needed for bodies that touch refs; with pure bodies and no
# ref operands the equation is pure, and XLA runs it inside a compiled segment.
BODY_ONLY: set[Primitive] = set()


# Per primitive, `specialize(eqn) -> rule fn or None`: a rule made for one equation when
# its operands' static structure allows a shorter path (a scalar load), chosen once when
# the program is generated. The specialized fn takes what the general rule takes and
# falls back to it for any value its shortcut does not cover.
SPECIALIZERS: dict[Primitive, Callable[[JaxprEqn], RuleFn | None]] = {}


def specializer(primitive: Primitive) -> Callable[[Callable], Callable]:
    """Register `fn(eqn) -> rule fn or None` as the specializer of a primitive's rule (a
    generator rule's specialized fn is a generator too)."""

    def register(fn: Callable) -> Callable:
        SPECIALIZERS[primitive] = fn
        return fn

    return register


def rule(*primitives: Primitive, generator: bool = False,
         body_only: bool = False) -> Callable[[RuleFn], RuleFn]:
    """Register `fn(ctx, eqn, invals) -> outvals` as the rule for the primitives.

    With generator=True the rule may yield scheduler requests (`yield from` it); with
    body_only=True the rule does nothing but evaluate the equation's sub-jaxprs.
    """

    def register(fn: RuleFn) -> RuleFn:
        for primitive in primitives:
            RULES[primitive] = Rule(fn, generator)
            if body_only:
                BODY_ONLY.add(primitive)
        return fn

    return register
