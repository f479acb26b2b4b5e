"""The Python API: check the pallas_calls a block of code makes, from a notebook, a test
or a script, with the same session, options, suppressions and report as `pallas-check run`.

    import pallas_check

    with pallas_check.checking(dma="on_wait") as run:  # races=False: no race detection
        y = f(x)                      # every pallas_call inside is simulated and checked
    run.findings                      # the findings that count (suppressions applied)
    run.report                        # the RunReport the CLI renders (report/run_report.py)
    run.raise_for_findings()          # FindingsError listing them, if there are any
    run                               # in Jupyter: the report table

Options are keyword arguments named as the `[tool.pallas-check]` keys (or the Config
fields: `dma_mode` for `dma`), checked as the command line checks them: a bad value is a
ValueError of one line. The project's `[tool.pallas-check]` table and `PALLAS_CHECK_*`
variables apply below them, as for `run` and the pytest plugin (`project=False`: not).
No progress line unless `progress=True`.
"""

from __future__ import annotations

import contextlib
import html
import io
import os
import sys
import traceback
from pathlib import Path
from typing import Callable, Iterator

from rich.console import Console
from rich.text import Text

from pallas_check.run.api_options import OPTIONS, Options, resolve  # noqa: F401 (the API's)
from pallas_check.config import TpuGeneration
from pallas_check.config.errors import FindingsError
from pallas_check.process.execfile import ScriptOutcome
from pallas_check.findings.finding import CallSummary, Finding
from pallas_check.intercept.generations import GenerationRun
from pallas_check.intercept.patched_lowering import installed
from pallas_check.deliver.progress_line import is_terminal
from pallas_check.report import reporter_for
from pallas_check.config.display import Display
from pallas_check.report.run_report import API_RERUN, RunReport, Suppression
from pallas_check.run.runner import (Origin, _settle_computations, callback_failures,
                                 finished_report, showing_progress)
from pallas_check.intercept.session import Session
from pallas_check.tpu_compile.toolchain import start_backends_quietly
from pallas_check.intercept.tpu_info import simulated_tpu as simulate
from pallas_check.findings.units import findings_in_calls

# A notebook cell's output: the table in a monospace block ({code}: rich's styled spans).
_HTML = ('<pre style="font-family: Menlo, \'DejaVu Sans Mono\', Consolas, monospace;'
         ' line-height: 1.25; white-space: pre; overflow-x: auto">{code}</pre>')


class Run:
    """What `checking` found; filled in when the block ends (`report` is None before)."""

    def __init__(self, options: Options, label: str) -> None:
        self.options = options
        self.label = label  # where the block is: the report's "script"
        self.report: RunReport | None = None  # once the block ended

    @property
    def findings(self) -> list[Finding]:
        """The findings that count (not suppressed), as the report lists them."""
        return list(self._finished().findings)

    @property
    def suppressed(self) -> list[tuple[Finding, Suppression]]:
        """(finding, why) for each suppressed finding."""
        return list(self._finished().suppressed)

    @property
    def calls(self) -> list[CallSummary]:
        """One CallSummary per pallas_call checked (findings/finding.py: kernel, grid, engine
        seconds, with races on what race checking covered, with compile=True each TPU
        generation's compile outcome and time), in call order."""
        return list(self._finished().calls)

    @property
    def exit_code(self) -> int:
        """What `pallas-check run` would exit with (config/exitcodes.py)."""
        return int(self._finished().exit_code)

    def raise_for_findings(self) -> None:
        """Raise FindingsError if the block had findings, or pallas-check failed on it."""
        report = self._finished()
        if not report.findings and report.internal_error is None:
            return
        lines = self.render("text").splitlines()
        if lines and lines[-1].startswith("pallas-check: "):
            lines.pop()  # the text format's summary: the head says it first
        head = (f"pallas-check: {findings_in_calls(len(report.findings), len(report.calls))}"
                if report.findings
                else "pallas-check could not check the block")
        message = "\n".join([f"{head}:", *lines])
        raise FindingsError(message, list(report.findings), report)

    def render(self, fmt: str = "table", width: int | None = None,
               color: bool = False) -> str:
        """The report as `pallas-check run --format FMT` prints it (`color`: the table's
        styles as ANSI escapes, as on a terminal)."""
        display = Display(color_system="truecolor") if color else Display()
        buffer = io.StringIO()
        reporter_for(fmt, width=width, display=display).render(self._finished(), buffer)
        return buffer.getvalue()

    def __str__(self) -> str:
        return self.render("table") if self.report is not None else repr(self)

    def __repr__(self) -> str:
        if self.report is None:
            return "<pallas_check.Run: running>"
        r = self.report
        return (f"<pallas_check.Run: {findings_in_calls(len(r.findings), len(r.calls))},"
                f" exit code {r.exit_code}>")

    def _repr_mimebundle_(self, include: object = None,
                          exclude: object = None) -> dict[str, str]:
        """Jupyter and IPython: ONE output, the HTML table, with the plain table as its
        text/plain fallback (a front end without HTML, `nbconvert --to markdown`)."""
        return {"text/html": self._repr_html_(), "text/plain": str(self)}

    def _repr_html_(self) -> str:
        """Jupyter: the report table as a terminal shows it, colours included (rich turns
        the table reporter's output into HTML with inline styles)."""
        if self.report is None:
            return html.escape(repr(self))
        from rich.console import Console
        from rich.text import Text

        width = 120
        # Not rich's Jupyter mode, which inside a kernel would send each printed line to
        # the notebook as its own output and leave the recording empty.
        console = Console(record=True, file=io.StringIO(), width=width,
                          color_system="truecolor", highlight=False, markup=False,
                          force_jupyter=False)
        console.print(Text.from_ansi(self.render("table", width=width, color=True)), end="")
        return console.export_html(inline_styles=True, code_format=_HTML)

    def _finished(self) -> RunReport:
        if self.report is None:
            raise RuntimeError("the report is made when the `with pallas_check.checking()`"
                               " block ends")
        return self.report


@contextlib.contextmanager
def checking(*, project: bool | str | Path = True, progress: bool = False,
             **options: object) -> Iterator[Run]:
    """Simulate and check every pallas_call made inside the block; the Run it yields
    holds the report once the block ends (also when the block raised: the exception
    goes on). Options: see the module docstring; `progress=True`: a progress line on
    stderr while a long call runs (only where stderr is a terminal)."""
    resolved = resolve(options, project=project)
    with checked(resolved, _caller(), rerun=API_RERUN, progress=progress) as run:
        yield run


@contextlib.contextmanager
def simulated_tpu(generation: str = "v5e", cores: int = 1) -> Iterator[None]:
    """While the block runs, whatever asks which TPU it runs on is told `generation` (v5e,
    v5p, v6e, v7x), not the CPU it runs on: `jax.devices()[0].device_kind` and `.num_cores`
    as libtpu reports them ("TPU v6 lite", 1; v5p: "TPU v5", 2), `pltpu.get_tpu_info()`,
    `plsc.get_sparse_core_info()`, `pltpu.create_tensorcore_mesh` without `num_cores`,
    `pltpu.emit_pipeline`'s tiling; `cores` > 1: that many TensorCores per device. The
    devices stay CPU devices (intercept/tpu_info.py). `checking()` does this itself (its `tpu` and
    `cores` options); this is for running such kernels under JAX's own interpreters
    (`interpret=True`, `pltpu.InterpretParams`) on a CPU, as benchmarks/run.py does."""
    with simulate(generation, cores):
        yield


@contextlib.contextmanager
def checked(options: Options, label: str, rerun: str | None = None,
            cwd: str | None = None, progress: bool = False,
            retrace: Callable[[TpuGeneration], GenerationRun] | None = None
            ) -> Iterator[Run]:
    """`checking` with options already resolved (the pytest plugin's way in): the run path
    of `pallas-check run` (run/runner.py) around a block instead of a script. `retrace(gen)`:
    how the block is run again as a further `tpu` generation (intercept/generations.py; the plugin
    runs the test again), None: its one trace is compiled for every generation."""
    if installed():
        raise RuntimeError("pallas-check is already checking the pallas_calls of this"
                           " process (pallas-check run, pytest --pallas-check, or a"
                           " checking() block): checking() blocks do not nest")
    # As `pallas-check run` does: JAX's backends started with libtpu's start-up chatter
    # kept off stderr (a no-op once the process has started them).
    start_backends_quietly(compiling=options.config.compile or options.config.chip_compile)
    run = Run(options, label)
    session = Session(options.config)  # not kept by the Run: the report is all it keeps
    session.retrace = retrace
    outcome = ScriptOutcome(ok=True)
    ours: list[str] = []
    try:
        with (callback_failures() as ours, session.install(),
              showing_progress(session, progress and is_terminal(sys.stderr))):
            try:
                yield run
            except BaseException as exc:
                outcome = _outcome_of(exc)
                raise
            finally:
                # What the block dispatched and did not wait for is waited for here (its
                # calls' findings are in the report), as at the end of a script.
                _settle_computations()
    finally:
        run.report = finished_report(session, outcome, ours, options.policy,
                                     Origin(label, rerun=rerun, cwd=cwd)).report


def _outcome_of(exc: BaseException) -> ScriptOutcome:
    """How the block ended, as a script's outcome (execfile.ScriptOutcome)."""
    if isinstance(exc, KeyboardInterrupt):
        return ScriptOutcome(ok=False, interrupted=True, error="interrupted (Ctrl-C)",
                             exception=exc)
    first_line = (str(exc).strip().splitlines() or [""])[0]
    return ScriptOutcome(ok=False, error=f"{type(exc).__name__}: {first_line}".rstrip(": "),
                         traceback="".join(traceback.format_exception(exc)), exception=exc)


def _caller() -> str:
    """The file of the code that opened the block (a notebook cell's is `<ipython-...>`)."""
    frame = sys._getframe(3)  # _caller <- checking <- contextmanager.__enter__ <- caller
    filename = frame.f_code.co_filename
    return filename if os.path.exists(filename) else "<notebook>"
