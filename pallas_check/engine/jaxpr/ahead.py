"""A kernel's segments compiled ahead of its first evaluation.

Why: on a first run each new kernel waits at its lowering for the chip's compile in the
compile worker (intercept/chip.py, about 0.1 s a kernel, on another core), then, at its
first call, for XLA to compile the engine's segments of its body (about as long, on this
core). Compiled while the worker compiles, the two overlap: a suite's cold run measured
about a tenth shorter (benchmarks/README.md, issue 55).
"""

from __future__ import annotations

from pallas_check.engine.jaxpr.program import DiskCachedSegment, Segment, program_for
from pallas_check.jaxbridge.jaxprs import sub_jaxprs
from pallas_check.jaxbridge.types import Jaxpr


def prepare(jaxpr: Jaxpr, skip_floats: bool, limit: int = 64) -> int:
    """Compile ahead the segments of a kernel's body and of the jaxprs nested in it (at
    most `limit`), as its first evaluation would: what the chip's compile at the call waits
    for runs meanwhile (intercept/chip.py), so that the call finds them ready. Anything
    that fails here is left for the evaluation to meet and report; how many it compiled."""
    done, pending, seen = 0, [jaxpr], set()
    while pending and done < limit:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        try:
            program = program_for(current, skip_floats)
        except Exception:  # noqa: BLE001 - the evaluation meets it and says so
            continue
        for step in program.steps:
            if isinstance(step, Segment):
                fn = step.fn  # (a scalar segment runs in numpy: nothing to compile)
                if isinstance(fn, DiskCachedSegment) and fn.prepare():
                    done += 1
            else:
                pending.extend(sub_jaxprs(step))
    return done
