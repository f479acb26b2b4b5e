"""One intercepted call as the session's report lists it: what its line is made of, known
as the call starts (intercept/session.py)."""

from __future__ import annotations

import dataclasses

from pallas_check.engine.call import describe
from pallas_check.engine.call.describe import MeshInfo
from pallas_check.engine.call.exposures import NeverWritten
from pallas_check.engine.runtime.inflight import InFlight
from pallas_check.findings.finding import KernelInfo, SourceFrame


# A call's name in the report while its kernel is not named (naming it failed).
UNNAMED = KernelInfo("pallas_call")


def kernel_or_unnamed(params: dict) -> KernelInfo:
    """The call's kernel, for listing a call that failed outside the engine."""
    try:
        return describe.kernel_info(params)
    except Exception:  # noqa: BLE001 - the call is listed whatever its params hold
        return UNNAMED


@dataclasses.dataclass
class Call:
    """What a call's line in the report is made of (Session._record), known as it starts
    (its kernel named as soon as it is known)."""

    index: int
    kernel: KernelInfo  # UNNAMED until named
    params: dict
    device_operands: list
    started: float  # time.perf_counter() when it began
    mesh: MeshInfo
    call_site: SourceFrame | None


@dataclasses.dataclass
class CallInFlight:
    call: Call
    live: InFlight  # what the call found so far


@dataclasses.dataclass(frozen=True)
class LastCall:
    """A thread's last call the session simulated and checked (Session.last_call): its
    index, the output elements it never wrote, and whether a core drew bits from its
    hardware PRNG (values no simulation reproduces: `diff` and `replay` do not compare
    them)."""

    index: int
    never_written: NeverWritten
    drew_random: bool = False
