"""Where a jaxpr's pure equations run: as few compiled segments as the order allows.

A kernel body interleaves pure arithmetic with ref reads and writes (`x = ref[...]`), and
each ruled equation ends the compiled segment before it: the flash-attention body's
softmax arrives as three segments between its loads and stores. Pure equations touch no
memory, so running one earlier or later changes nothing a kernel (or a checker) can
observe, as long as every ruled equation keeps its place relative to the others and
every value exists before it is used. This module moves the pure equations only: each
may run in any gap between two ruled equations from the one after its inputs exist to the
one before its first use, and the gaps are chosen so that the fewest are used (interval
stabbing), which merges what the original order had split.
"""

from __future__ import annotations

import bisect
from typing import Sequence

from pallas_check.jaxbridge.types import Atom, JaxprEqn, Var


def schedule(eqns: Sequence[JaxprEqn], outvars: Sequence[Atom],
             movable: Sequence[bool]) -> list[int]:
    """An order of the equations (their indices) that keeps the unmovable ones in their
    order and puts the movable (pure, effect-free) ones into as few gaps between them as
    possible."""
    anchors = [i for i, m in enumerate(movable) if not m]
    last_gap = len(anchors)  # gap k runs before anchor k; the last one after them all
    if len(anchors) == len(eqns) or not anchors:
        return list(range(len(eqns)))
    # Earliest gap: after the anchor that defines an input (inputs of the jaxpr: gap 0).
    ready: dict[Var, int] = {}
    earliest: dict[int, int] = {}
    k = 0
    for i, eqn in enumerate(eqns):
        if movable[i]:
            earliest[i] = max((ready.get(v, 0) for v in eqn.invars
                               if isinstance(v, Var)), default=0)
            for v in eqn.outvars:
                ready[v] = earliest[i]
        else:
            k += 1
            for v in eqn.outvars:
                ready[v] = k
    # Latest gap: before the first anchor that reads a result (outputs: the last gap).
    needed: dict[Var, int] = {v: last_gap for v in outvars if isinstance(v, Var)}
    latest: dict[int, int] = {}
    k = last_gap
    for i in range(len(eqns) - 1, -1, -1):
        eqn = eqns[i]
        if movable[i]:
            bound = min((needed.get(v, last_gap) for v in eqn.outvars), default=last_gap)
            latest[i] = bound
        else:
            k -= 1
            bound = k
        for operand in eqn.invars:
            if isinstance(operand, Var):
                needed[operand] = min(needed.get(operand, last_gap), bound)
    # Fewest gaps that every [earliest, latest] interval contains (greedy by right end),
    # then each equation into the latest chosen gap it may use: a producer's latest is
    # never after its consumer's, so producers still come first.
    chosen: list[int] = []
    for i in sorted(latest, key=lambda i: latest[i]):
        if not chosen or earliest[i] > chosen[-1]:
            chosen.append(latest[i])
    gap_of = {i: chosen[bisect.bisect_right(chosen, latest[i]) - 1] for i in latest}
    by_gap: list[list[int]] = [[] for _ in range(last_gap + 1)]
    for i in sorted(gap_of):
        by_gap[gap_of[i]].append(i)
    order: list[int] = []
    for gap, anchor in enumerate(anchors):
        order.extend(by_gap[gap])
        order.append(anchor)
    order.extend(by_gap[last_gap])
    return order
