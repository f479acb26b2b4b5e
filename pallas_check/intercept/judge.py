"""Whether what a kernel leaves undecided reaches what the program keeps.

A kernel may leave output elements unwritten, or let never-written memory reach them
(engine/call/exposures.py), and still be right: the padding rows a caller slices off
(`out[:num_tokens]`), the launch whose output `jnp.where(is_decode, decode_out,
prefill_out)` drops, the tail of a table the next kernel never reads. So a call's
`unwritten-output` and `uninitialized` findings are decided as the second fill decides a
read of never-written memory, one level up: by running the program again with those
elements holding other values and comparing what it returns.

The program is the outermost jitted call around the kernel (intercept/outer.py: `jax.jit(f)(x)` from
the script or a test, or the jitted computation JAX runs an eager pallas_call as). While
it runs, the findings of its calls wait here. When it returns, it is run again -- the same
executable on the same arguments -- with every pallas_call in it simulated again (the
schedule whose outputs the program got, no checks) and every suspect call's exposed
elements set to their other values: all suspects at once, one re-run. Its results
unchanged: no finding reaches them, all are dropped. Changed, with one suspect: it stands,
naming the results it reaches. Changed, with several: each is tried alone (one re-run
each, at most `ALONE_TRIES`); one that changes the results alone stands, one that does not
is dropped; if none does alone, all stand, judged together. A call is keyed by its site in
the computation and how many times that site ran before it, so a loop's iterations are
told apart. A kernel whose outputs the program returns as they are (an eager pallas_call,
`jax.jit(f)` returning the call's output) needs no re-run: its elements are results. Nor
does a finding the report already holds (an earlier run kept the same defect): a re-run
could only add to its count, so it is counted, and a program called in a loop costs one
run a call, not two. One an earlier run dropped is judged again: what the program keeps
may depend on its arguments.

A program that donates arguments is re-run on copies of them taken before its first run
(intercept/donated.py), so that donation does not change the verdict. Where the program
cannot be re-run -- its donated operands are more than pallas-check copies
(`donated.KEPT_BYTES`), it has side effects (`io_callback`, `jax.debug.print`), failed,
ran alongside another jitted call on another thread, was compiled ahead of time, or the
re-run itself failed -- the findings are kept as they are, with a note that they were
judged at the kernel's boundary.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Callable, Sequence

import jax
import numpy as np

from pallas_check.intercept import empties
from pallas_check.process import interrupts
from pallas_check.intercept import outer
from pallas_check.checkers import CHECKERS
from pallas_check.checkers.uninit import bbox
from pallas_check.engine.call import capacity, explore
from pallas_check.engine.call.explore import CallSetting
from pallas_check.engine.call.describe import MeshInfo, kernel_info
from pallas_check.engine.call.exposures import Exposure, differs
from pallas_check.engine.runtime import progress
from pallas_check.engine.runtime.backend import engine_device
from pallas_check.findings.finding import Finding, FindingKind, format_range
from pallas_check.jaxbridge.call import kernel_of
from pallas_check.intercept.outer import OuterCall

# The session (intercept/session.py) the judge serves: its store, carried semaphores, config and
# call filter, and the calls it runs unchecked. Not imported: it imports the judge.
Session = Any

JUDGED_KINDS = (FindingKind.UNWRITTEN_OUTPUT, FindingKind.UNINITIALIZED)
ALONE_TRIES = 8  # re-runs that attribute a change to one suspect among several
# What a program may hold of its calls' undecided elements (masks and values) while it
# runs; beyond it (a long loop of calls each leaving different elements), the rest are
# judged at the kernel's boundary. Equal masks of one site's runs are held once.
HELD_BYTES = 512 * 2**20
_SHOWN_RESULTS = 3


@dataclasses.dataclass
class _Suspect:
    """Findings of one call about one output and kind, and the elements they are about."""

    findings: list[Finding]
    key: tuple[int, int]
    exposures: list[Exposure]


@dataclasses.dataclass
class Program:
    """A jitted call being run (or re-run): what its calls found that waits for it."""

    call: OuterCall
    carried: dict  # the session's semaphores carried between calls, when it began
    runs: dict[int, int] = dataclasses.field(default_factory=dict)  # a site -> its runs
    seeds: dict[tuple, tuple[int, int]] = dataclasses.field(default_factory=dict)
    sites: list = dataclasses.field(default_factory=list)  # keeps the keyed params alive
    kernels: dict[int, int] = dataclasses.field(default_factory=dict)  # site -> its jaxpr
    held: dict[tuple, Any] = dataclasses.field(default_factory=dict)  # the last exposures
    held_bytes: int = 0
    suspects: list[_Suspect] = dataclasses.field(default_factory=list)
    # While re-run: the exposures to apply, per call key; what failed in it.
    replay: dict[tuple, list[Exposure]] | None = None
    replay_carried: dict = dataclasses.field(default_factory=dict)
    replay_error: str | None = None

    def key(self, params: dict) -> tuple[int, int]:
        """This call's key: its site (the lowering's params, one object per site) and how
        many times that site ran before in this run of the program."""
        site = id(params)
        count = self.runs.get(site, 0)
        self.runs[site] = count + 1
        if count == 0 and self.replay is None:
            self.sites.append(params)
            self.kernels[site] = id(kernel_of(params))
        return site, count


class Judge:
    """The session's judge of findings about undecided output elements (see module)."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self._lock = threading.Condition()
        self._open: list[Program] = []
        self._replaying = False

    def replaying(self) -> bool:
        """Whether a program is being re-run now (commands/diff.py: a re-run's calls are
        the first run's again, not new calls to compare)."""
        return self._replaying

    # -- outer.Listener ------------------------------------------------------------------
    def opened(self, call: OuterCall) -> Program:
        with self._lock:
            while self._replaying:  # a re-run sees only its own program's calls
                self._lock.wait()
            program = Program(call, dict(self._session.carried))
            self._open.append(program)
        return program

    def closed(self, program: Program, outputs: Sequence[Any] | None,
               rerun: Callable[[], list[np.ndarray]] | None,
               error: BaseException | None) -> None:
        try:
            self._judge(program, outputs, rerun, error)
        except KeyboardInterrupt:
            self._settle(program, "the run was stopped while it was re-run")
            raise
        except Exception as exc:  # noqa: BLE001 - never the script's failure
            self._settle(program, f"re-running it failed ({type(exc).__name__}: {exc})")
        finally:
            with self._lock:
                if program in self._open:
                    self._open.remove(program)
                self._lock.notify_all()

    # -- what the session asks -----------------------------------------------------------
    def program(self) -> tuple[Program | None, str]:
        """The program a call now starting belongs to, or None and why none is known
        ("" where no program is ever known: the session is installed without intercept/outer.py's
        hook, as `pallas-check diff` installs it, and findings stay as they are)."""
        with self._lock:
            if len(self._open) == 1:
                return self._open[0], ""
            if not outer.listening(self):
                return None, ""
            if not self._open:
                return None, "it ran outside any jitted call pallas-check can re-run"
            return None, "another jitted call ran at the same time on another thread"

    def received(self, program: Program | None, why: str, key: tuple | None, index: int,
                 seed: int, findings: list[Finding], exposures: list[Exposure]) -> list[Finding]:
        """Call `index`'s findings: those to report now; the ones about undecided output
        elements wait for `program` (judged at the boundary where there is none, `why`).
        `seed`: the schedule whose outputs the program got (a re-run replays it)."""
        if program is not None and key is not None:
            program.seeds[key] = (seed, index)
        judged = [f for f in findings if f.kind in JUDGED_KINDS and _exposed(f, exposures)]
        now = [f for f in findings if not any(f is j for j in judged)]
        if not judged:
            return now
        if program is None or key is None:
            return now + [_at_boundary(f, why) if why else f for f in judged]
        exposures = [_shared(program, key[0], e) for e in exposures]
        if program.held_bytes > HELD_BYTES:
            return now + [_at_boundary(f, f"{program.call.describe()} left more undecided"
                                          " elements than pallas-check holds to re-run it")
                          for f in judged]
        groups: dict[tuple, _Suspect] = {}
        for finding in judged:
            which = (finding.kind, _output_of(finding))
            if which not in groups:
                groups[which] = _Suspect([], key, [e for e in exposures
                                                   if (e.kind, e.name) == which])
            groups[which].findings.append(finding)
        with self._lock:
            program.suspects.extend(groups.values())
        return now

    def patch(self, program: Program, key: tuple, outputs: list[list[np.ndarray]]
              ) -> list[list[np.ndarray]]:
        """A re-run call's outputs with the exposures under test applied."""
        for exposure in (program.replay or {}).get(key, ()):
            outputs = exposure.apply(outputs)
        return outputs

    def abandon(self, reason: str) -> None:
        """The run ends with programs still open: their findings as they are."""
        with self._lock:
            programs = list(self._open)
        for program in programs:
            self._settle(program, reason)

    # -- judging -------------------------------------------------------------------------
    def _judge(self, program: Program, outputs: Sequence[Any] | None,
               rerun: Callable[[], list[np.ndarray]] | None,
               error: BaseException | None) -> None:
        with self._lock:
            if not program.suspects:
                return
        if error is not None or outputs is None or rerun is None:
            self._settle(program, f"{program.call.describe()} failed")
            return
        suspects, reported = [], []
        for suspect in list(program.suspects):
            direct = _direct(program, suspect)
            if direct is not None:  # its outputs are the program's results: no re-run
                self._keep(program, [suspect], direct)
            elif all(self._session.store.holds(f) for f in suspect.findings):
                reported.append(suspect)
            else:
                suspects.append(suspect)
        if reported:  # seen again: counted, not re-judged (a re-run would only count)
            self._session.store.extend(
                [f for s in self._decided(program, reported) for f in s.findings])
            self._session.tell_owner()
        if not suspects:
            return
        reason = program.call.cannot_rerun()  # asked only of what needs a re-run
        if reason is not None:
            self._settle(program, reason)
            return
        base = [np.asarray(o) for o in outputs]
        together = self._rerun(program, suspects, rerun, base)
        if isinstance(together, str):
            self._settle(program, together)
            return
        if not together:
            self._drop(program, suspects)
            return
        if len(suspects) == 1:
            self._keep(program, suspects, together)
            return
        alone: dict[int, list | str] = {}
        for n, suspect in enumerate(suspects[:ALONE_TRIES]):
            alone[n] = self._rerun(program, [suspect], rerun, base)
        if not any(isinstance(c, list) and c for c in alone.values()):
            # Only together (or no try could tell): all stand, judged together.
            self._keep(program, suspects, together, together=True)
            return
        for n, suspect in enumerate(suspects):
            changes = alone.get(n, "not tried alone")
            if isinstance(changes, str):  # untold: it stands with the joint change
                self._keep(program, [suspect], together, together=True)
            elif changes:
                self._keep(program, [suspect], changes)
            else:
                self._drop(program, [suspect])

    def _rerun(self, program: Program, suspects: list[_Suspect],
               rerun: Callable[[], list[np.ndarray]], base: list[np.ndarray]
               ) -> list[tuple[int, np.ndarray]] | str:
        """The program's results that change when `suspects`' elements hold their other
        values: (result index, which elements), or why the re-run could not tell."""
        replay: dict[tuple, list[Exposure]] = {}
        for suspect in suspects:
            replay.setdefault(suspect.key, []).extend(suspect.exposures)
        with self._lock:
            if self._open != [program]:
                return "another jitted call ran at the same time on another thread"
            self._replaying = True
            program.replay, program.runs = replay, {}
            program.replay_carried, program.replay_error = dict(program.carried), None
        try:
            results = rerun()
        except Exception as exc:  # noqa: BLE001 - the re-run is ours, never the script's
            if self._session.interrupted or interrupts.requested():
                raise KeyboardInterrupt from exc  # Ctrl-C landed in a re-run call
            return f"re-running {program.call.describe()} failed ({type(exc).__name__})"
        finally:
            with self._lock:
                self._replaying, program.replay = False, None
                self._lock.notify_all()
        if program.replay_error is not None:
            return f"re-running {program.call.describe()} failed ({program.replay_error})"
        changes = []
        for k, (a, b) in enumerate(zip(base, results)):
            if a.shape != b.shape:
                return f"re-running {program.call.describe()} gave other shapes"
            changed = differs(a, b)
            if changed.any():
                changes.append((k, changed))
        return changes

    def _keep(self, program: Program, suspects: list[_Suspect],
              changes: list[tuple[int, np.ndarray]], together: bool = False) -> None:
        reaches: list[dict[str, Any]] = [
            {"function": program.call.describe(), "result": k,
             "range": [list(r) for r in bbox(mask)], "elements": int(mask.sum())}
            for k, mask in changes]
        shown = "; ".join(f"result {r['result']} of {r['function']}"
                          f"{format_range(tuple(tuple(x) for x in r['range']))},"
                          f" {r['elements']} elements" for r in reaches[:_SHOWN_RESULTS])
        if len(reaches) > _SHOWN_RESULTS:
            shown += f"; {len(reaches) - _SHOWN_RESULTS} more results"
        if together:
            shown += "; judged together with the other calls' undecided elements"
        self._session.store.extend(
            [_noted(f, f"kept by the program: {shown}", reaches=reaches)
             for s in self._decided(program, suspects) for f in s.findings])
        self._session.tell_owner()

    def _drop(self, program: Program, suspects: list[_Suspect]) -> None:
        for suspect in self._decided(program, suspects):
            for finding in suspect.findings:
                self._session.findings_dropped(finding.call_index, 1)

    def _decided(self, program: Program, suspects: list[_Suspect]) -> list[_Suspect]:
        """`suspects` taken off the program: those still waiting (not settled meanwhile
        by a run that stopped)."""
        with self._lock:
            waiting = [s for s in suspects if any(s is p for p in program.suspects)]
            program.suspects = [p for p in program.suspects
                                if not any(p is s for s in suspects)]
        return waiting

    def _settle(self, program: Program, reason: str) -> None:
        """Keep the program's waiting findings as they are, judged at the boundary."""
        with self._lock:
            suspects, program.suspects = list(program.suspects), []
        self._session.store.extend([_at_boundary(f, reason)
                                    for s in suspects for f in s.findings])
        self._session.tell_owner()


def _shared(program: Program, site: int, exposure: Any) -> Any:
    """`exposure`, holding the arrays of the site's previous run's one where they are
    equal (a loop's iterations leave the same elements undecided), counted once."""
    key = (site, exposure.kind, exposure.name, exposure.device, exposure.output)
    last = program.held.get(key)
    try:
        same = (last is not None and last.mask.shape == exposure.mask.shape
                and np.array_equal(last.mask, exposure.mask)
                and np.array_equal(last.values, exposure.values, equal_nan=True))
    except TypeError:  # values numpy cannot compare so: held apart
        same = False
    if same:
        return last
    program.held[key] = exposure
    program.held_bytes += exposure.mask.nbytes + np.asarray(exposure.values).nbytes
    return exposure


def _direct(program: Program, suspect: _Suspect) -> list[tuple[int, np.ndarray]] | None:
    """The results a suspect's elements are, when its call's outputs are results as they
    are (outer.OuterCall.direct; a call that ran once, on one device); else None."""
    site, count = suspect.key
    mapping = program.call.direct.get(program.kernels.get(site))
    if mapping is None or count != 0 or program.runs.get(site) != 1:
        return None
    changes = []
    for exposure in suspect.exposures:
        results = mapping[exposure.output] if exposure.output < len(mapping) else ()
        if exposure.device != 0 or not results:
            return None
        changes += [(k, exposure.mask) for k in results]
    return changes


def _output_of(finding: Finding) -> str:
    """The kernel's name of the output a judged finding is about."""
    if finding.kind == FindingKind.UNWRITTEN_OUTPUT:
        return finding.buffer
    return str(finding.details.get("output", ""))


def _exposed(finding: Finding, exposures: list[Exposure]) -> bool:
    which = (finding.kind, _output_of(finding))
    return any((e.kind, e.name) == which for e in exposures)


def _at_boundary(finding: Finding, reason: str) -> Finding:
    return _noted(finding, f"judged at the kernel's boundary: {reason}",
                  judged_at="kernel boundary", why=reason)


def _noted(finding: Finding, note: str, **details: Any) -> Finding:
    """`finding` with `note` after its message (in parentheses: the message's last word,
    often a `file:line`, stays whole) and `details` added. Changed in place: the call's
    timeline (--trace) marked this very finding."""
    finding.message = f"{finding.message} ({note})"
    finding.details = {**finding.details, **details}
    return finding


def replay_call(session: Session, program: Program, key: tuple, params: dict,
                device_operands: list, mesh: MeshInfo, results: Sequence[np.ndarray] | None
                ) -> list[list[np.ndarray]]:
    """A call of a program being re-run: simulated again as the first run simulated it
    (the schedule whose outputs the program got, no checks, no prints), the exposures
    under test applied. A failure here fails only the re-run: the call answers with
    never-written memory and the program's findings are judged at the boundary."""
    run_call_devices = explore.run_call_devices  # looked up per call (tests replace it)
    config = session.config
    seed, index = program.seeds.get(key, (config.seed, -1))
    try:
        if session.call_filter is not None and not session.checks(params, device_operands[0]):
            outputs, _ = session.unchecked.outputs(params, device_operands, mesh, results,
                                                   index, program.replay_carried)
        elif not capacity.check(params, config, kernel_info(params), index, None).simulated:
            outputs = capacity.unsimulated_outputs(params, device_operands,
                                                   config.uninit.value, results)
        else:
            # Checks off (races watch, they never change a value or an interleaving).
            same = dataclasses.replace(config, schedules=1, seed=seed, keep_going=False,
                                       check_uninit_outputs=False, timeline=False,
                                       compile=False, races=False)
            never = (empties.never_written_inputs(params, device_operands[0])
                     if len(device_operands) == 1 else frozenset())
            with jax.default_device(engine_device()):
                outputs = run_call_devices(
                    params, device_operands, same, index,
                    CallSetting(mesh, program.replay_carried, CHECKERS, never_written=never),
                    results=results).outputs
    except KeyboardInterrupt:
        session.interrupted = True
        raise
    except Exception as exc:  # noqa: BLE001 - the re-run's failure, not the script's
        program.replay_error = f"{type(exc).__name__}: {exc}"
        outputs = capacity.unsimulated_outputs(params, device_operands, config.uninit.value,
                                               results)
    finally:
        progress.call_ended(index)  # shown on the progress line while it runs, then gone
    return session.judge.patch(program, key, outputs)
