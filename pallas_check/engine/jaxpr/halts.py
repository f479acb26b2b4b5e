"""How a kernel's simulation stops short: the kernel's own error (located at the user's
line), a call halted on purpose after its finding, and pallas-check's own bug (exit 4).
"""

from __future__ import annotations

from pallas_check.engine.events import KernelPrint
from pallas_check.findings.finding import SourceFrame


class CallHalted(Exception):
    """The kernel did something after which nothing it does is defined (a DMA or signal
    aimed at a device outside the mesh); the finding saying so was already added, and the
    call's simulation ends there, cleanly."""


class KernelError(Exception):
    """An error in evaluating a kernel, located at the user's source line."""

    def __init__(self, message: str, frames: tuple[SourceFrame, ...] = ()):
        super().__init__(message)
        self.message = message
        self.frames = frames
        self.primitive = ""  # set where raised without frames: the equation evaluated
        self.prints: list[KernelPrint] = []  # what the kernel printed before

    def located(self) -> str:
        doing = f"evaluating `{self.primitive}`" if self.primitive else ""
        if self.frames:
            f = self.frames[0]
            doing += (" " if doing else "") + f"at {f.file}:{f.line} in {f.function}"
        return f"{self.message} ({doing})" if doing else self.message


class EngineBug(Exception):
    """An exception of pallas-check's own code (a rule, a specializer, the generated
    program) while evaluating one equation: ours, never the kernel's (exit 4). It names the
    primitive and the user's line being evaluated, so that the one line the run ends with
    says where to look."""

    def __init__(self, error: BaseException, primitive: str = "",
                 frames: tuple[SourceFrame, ...] = (), where: str = "",
                 verb: str = "evaluating") -> None:
        self.error = error
        self.primitive = primitive
        self.frames = frames
        self.where = where  # outside any equation: what was running
        self.verb = verb  # what was done with the equation
        # What the kernel printed before (set by the call, as above).
        self.prints: list[KernelPrint] = []
        super().__init__(self.describe())

    def describe(self) -> str:
        doing = f"{self.verb} `{self.primitive}`" if self.primitive else self.where
        if self.frames:
            f = self.frames[0]
            doing += (" " if doing else "") + f"at {f.file}:{f.line} in {f.function}"
        text = f"{type(self.error).__name__}: {self.error}"
        return f"{text} ({doing})" if doing else text


class UnsupportedPrimitive(KernelError):
    """The kernel uses a primitive pallas-check cannot simulate."""
