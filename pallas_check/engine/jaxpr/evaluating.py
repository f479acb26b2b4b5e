"""What the evaluator of a kernel jaxpr (program.py) sees of the core running it.

The seam between the rules and the call is typed in layers, each naming only what its own
wing uses: this protocol (the evaluator's), engine/dma/engine.py's `DmaCore` and `DmaCall`
(a DMA's), and engine/seam.py's `RunningCore` and `RunningCall` (a rule's). The concrete
core and call (engine/call/state.py) satisfy them structurally; nothing here runs.
"""

from __future__ import annotations

from typing import Protocol

from pallas_check.config import Config
from pallas_check.findings.finding import SourceFrame
from pallas_check.jaxbridge.types import JaxprEqn


class Evaluating(Protocol):
    """The core a generated program runs on: the equation it is evaluating (set by the
    program before each rule), the source frames of the equations around it (where a
    finding or error points when the equation itself has none), and the options."""

    @property
    def eqn(self) -> JaxprEqn | None: ...

    @property
    def frame_stack(self) -> list[tuple[SourceFrame, ...]]: ...

    @property
    def config(self) -> Config: ...
