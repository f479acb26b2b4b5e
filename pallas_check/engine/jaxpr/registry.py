"""The rule registry: which of our rules evaluates each primitive a kernel jaxpr may hold
(`RULES`, filled by the rule modules under engine/rules/ as they are imported), which
rules only evaluate sub-jaxprs (`BODY_ONLY`), and per-equation specializations
(`SPECIALIZERS`). Programs (program.py) read it when they are generated.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Generator, TypeVar

from pallas_check.jaxbridge.types import JaxprEqn, Primitive
from pallas_check.engine.runtime.scheduler import Wait


# A rule: `fn(ctx, eqn, invals) -> outvals`, where ctx is the core running the kernel (the
# rules' `RunningCore`, engine/seam.py, which this lower layer may not name), invals the
# equation's operand values and outvals its result (a list for a primitive with several).
# The parameters stay unchecked here so that each rule may state them as precisely as it
# can; what a rule returns is passed on to the generated program, never inspected.
RuleFn = Callable[..., object]

# What a generator rule is: it yields to the scheduler (a `Wait`, or None where another
# actor may run: runtime/scheduler.py) and returns the equation's result.
RuleGen = Generator[Wait | None, None, object]

_F = TypeVar("_F", bound=Callable[..., object])
_S = TypeVar("_S", bound=Callable[[JaxprEqn], RuleFn | None])


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


def specializer(primitive: Primitive) -> Callable[[_S], _S]:
    """Register `fn(eqn) -> rule fn or None` as the specializer of a primitive's rule (a
    generator rule's specialized fn is a generator too)."""

    def register(fn: _S) -> _S:
        SPECIALIZERS[primitive] = fn
        return fn

    return register


def rule(*primitives: Primitive, generator: bool = False,
         body_only: bool = False) -> Callable[[_F], _F]:
    """Register `fn(ctx, eqn, invals) -> outvals` as the rule for the primitives.

    With generator=True the rule may yield scheduler requests (`yield from` it); with
    body_only=True the rule does nothing but evaluate the equation's sub-jaxprs.
    """

    def register(fn: _F) -> _F:
        for primitive in primitives:
            RULES[primitive] = Rule(fn, generator)
            if body_only:
                BODY_ONLY.add(primitive)
        return fn

    return register
