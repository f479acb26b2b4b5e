"""Calls lowered inline: a compiled call's computation inside the script's own program.

A call the compiled tier runs (intercept/tiers.py) costs, through the host callback, a
Python callback, its operands handed to the engine's XLA client and its outputs copied
back: about as much as the computation itself for a small kernel. Lowered inline
(intercept/patched_lowering.py's `Inline`), the computation is traced into the program,
and one FFI call reads its verdict on the host with the operands lent: a clear verdict
and no input made by `jnp.empty` (only the operands show one), and that run stands,
listed here as the compiled tier's call; otherwise XLA takes the branch that runs the
host callback, whose handler reports the call as it reports every call.

The engine's own programs are compiled without XLA's algebraic simplifier
(`SEGMENT_COMPILER_OPTIONS`): it turns a kernel's `x * mask.astype(f32)` into a select
that drops the NaN a TPU keeps, and a division by a constant into a multiplication; nor
with excess precision, which drops a kernel's bfloat16 roundings. So a program is
lowered inline only while intercept/outer.py compiles it with the segments' options,
which it does for a program holding a kernel that will run inline (`kernel_options`); a
program whose kernels all go through the handler compiles as it would without
pallas-check, and one compiled ahead of time (not through that hook) keeps the callback.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping, Sequence

import numpy as np

from pallas_check.config import Tier
from pallas_check.engine.call import capacity, describe
from pallas_check.engine.jaxpr.program import SEGMENT_COMPILER_OPTIONS
from pallas_check.engine.runtime import progress
from pallas_check.findings.finding import KernelInfo, SourceFrame
from pallas_check.intercept import empties, outer
from pallas_check.intercept.patched_lowering import Inline
from pallas_check.process import children

# The session (intercept/session.py) whose calls these are: its config, tiers, filters,
# judge and `record_inline`. Not imported: it imports this module.
Session = Any


class InlineCalls:
    """The session's calls lowered inline: which sites are, and each call's decision."""

    def __init__(self, session: Session) -> None:
        self._session = session

    def _handler_only(self) -> bool:
        """Whether every call needs the handler: `--tier engine`, a filter counts the
        calls, --compile records them, or a fork refuses them."""
        session = self._session
        return (Tier(session.config.tier) is Tier.ENGINE or session.call_filter is not None
                or session.compile_recorder is not None or session.refused is not None)

    def kernel_options(self, kernels: Sequence[Mapping[str, Any]]
                       ) -> Mapping[str, str | bool] | None:
        """The compiler options of a program holding these kernels: the engine's segments',
        when one of them will run inline (intercept/outer.py asks at each run)."""
        if self._handler_only():
            return None
        inlined = any(self._compiled(params) is not None for params in kernels)
        return SEGMENT_COMPILER_OPTIONS if inlined else None

    def _compiled(self, params: Mapping[str, Any]) -> Any:
        """The structure's function to inline (None: its calls go through the handler)."""
        try:
            return self._session.tiers.inline_function(params)
        except Exception:  # noqa: BLE001 - the handler meets (and reports) it per call
            return None

    def lowered(self, params: dict[str, Any], call_site: SourceFrame | None) -> Inline | None:
        """How a call site is lowered inline (None: through the handler), asked once per
        lowering; what only a call shows (the verdict, an input made empty) is decided
        at each call (`_decide`). (`params`: the pallas_call primitive's, any values.)"""
        if self._handler_only() or not outer.compiled_here():
            return None  # (not compiled here: the module keeps the simplifier)
        try:
            kernel = describe.kernel_info(params)
            # A call that overflows a chip is reported per call (engine/call/capacity.py).
            fits = capacity.check(params, self._session.config, kernel, -1, call_site)
            if fits.findings or not fits.simulated:
                return None
        except Exception:  # noqa: BLE001 - the handler meets (and reports) it per call
            return None
        function = self._compiled(params)
        if function is None:
            return None
        return Inline(function, functools.partial(self._decide, params, kernel, call_site))

    def _decide(self, params: dict[str, Any], kernel: KernelInfo, call_site: SourceFrame | None,
                verdict: np.ndarray, coverage: np.ndarray, *operands: np.ndarray) -> int:
        """0: the inline run stands (the call is recorded); 1: the handler runs the call
        (a verdict bit set, or an input made empty)."""
        session = self._session
        if session.refused is not None:  # forked after JAX started (see handle_call)
            raise children.ForkedProcessError(session.refused)
        progress.beat()
        if int(verdict) or empties.never_written_inputs(params, operands):
            return 1
        program, outside = session.judge.program()
        if program is not None and program.replay is not None:
            # A re-run of the program: its outputs are the first run's, and the site's
            # count goes on as it did then (a later call of it is keyed as it was).
            program.key(params)
            return 0
        session.record_inline(program, outside, params, kernel, call_site, operands,
                              session.tiers.coverage(np.asarray(coverage)))
        return 0
