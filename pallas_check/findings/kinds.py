"""Every kind of defect pallas-check reports, and everything said about each kind.

`FindingKind` names the kinds (its values are the stable JSON and SARIF names); `CATALOGUE`
holds, per kind, what the reports and the suppression stage say about it: the table's
title, the SARIF rule's name, short description, help and level, and how a finding of the
kind is shown. One exhaustive table, so that a new kind is one enum member and one entry
here (tests/findings/test_kinds.py checks that every kind has its entry and a sample under samples/),
and no report keeps per-kind text of its own.

Plain data: nothing here imports the engine or a report.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Literal


class FindingKind(str, enum.Enum):
    """Kinds of defect pallas-check reports; the value is the stable JSON name."""

    OUT_OF_BOUNDS = "out-of-bounds"
    UNINITIALIZED = "uninitialized"
    UNWRITTEN_OUTPUT = "unwritten-output"
    OUTPUT_REVISITED = "output-revisited"
    SEMAPHORE_LEAK = "semaphore-leak"
    DMA_NOT_WAITED = "dma-not-waited"
    RACE = "race"
    DEADLOCK = "deadlock"
    UNUSED_SUPPRESSION = "unused-suppression"  # a `# pallas-check: ignore` that matched nothing
    COMPILE_ERROR = "compile-error"  # --compile: the TPU toolchain rejects the kernel
    VMEM_EXCEEDED = "vmem-exceeded"  # the kernel does not fit the chip's VMEM or SMEM
    CHECK_FAILED = "check-failed"  # the kernel's own `pl.debug_check` failed
    # A SparseCore signal naming another subcore that Mosaic lowers to a local signal.
    SIGNAL_NOT_REMOTE = "signal-not-remote"
    # An explicit MXU operation against JAX's rules, or an MXU left holding data at the end.
    MXU_MISUSE = "mxu-misuse"
    # Random numbers misused: one stream at several grid points, stochastic rounding fed
    # bits the chip does not read.
    RANDOM_MISUSE = "random-misuse"

    @property
    def info(self) -> KindInfo:
        """This kind's catalogue entry."""
        return CATALOGUE[self]


Severity = Literal["error", "warning", "note"]  # SARIF's levels


@dataclass(frozen=True)
class KindInfo:
    """What is said about one kind of finding, wherever findings are shown."""

    title: str  # the table's heading over this kind's findings
    sarif_name: str  # the SARIF rule's `name` (its `id` is the kind's value)
    short: str  # one sentence: the SARIF rule's short and full description
    help: str  # what goes wrong on a TPU and how to fix it (SARIF `help`)
    severity: Severity = "error"  # SARIF `level` of the rule and of each result
    # The table lists the accesses a finding of this kind names (the two sides of a race,
    # the reads of an uninitialized value, who waits on what in a deadlock).
    shows_accesses: bool = False
    access_labels: tuple[str, ...] = ()  # the table's label of each access, in order
    on_timeline: bool = False  # the table points at the --trace timeline for it
    # The run option without which the run does not look for this kind: an `ignore`
    # comment for it is not "unused" in a run without the option (report/suppress.py).
    needs_option: str | None = None


CATALOGUE: dict[FindingKind, KindInfo] = {
    FindingKind.OUT_OF_BOUNDS: KindInfo(
        title="Out-of-bounds accesses",
        sarif_name="OutOfBounds",
        short="A load, store or DMA slice outside its ref, or a BlockSpec block outside its array.",
        help=("On a TPU an out-of-bounds access reads or overwrites unrelated memory without an"
              " error. Check the index arithmetic (pl.ds start and size, the BlockSpec index map)"
              " against the ref's shape; mask the edge with pl.when or a masked load/store.")),
    FindingKind.UNINITIALIZED: KindInfo(
        title="Uninitialized memory reaching outputs",
        sarif_name="UninitializedRead",
        short="Output values depend on memory that was never written.",
        help=("The kernel read scratch, an output block or the padding of an edge block before"
              " writing it, and the value reached an output. Initialize the buffer (e.g. under"
              " pl.when(pl.program_id(k) == 0)), wait for the DMA that fills it before reading,"
              " or mask the padding away."),
        shows_accesses=True),
    FindingKind.UNWRITTEN_OUTPUT: KindInfo(
        title="Output elements never written",
        sarif_name="UnwrittenOutput",
        short="Output elements the kernel never wrote.",
        help=("Those elements hold whatever the TPU's memory held. Make every grid step write its"
              " whole output block, or alias the output to an input (input_output_aliases) if"
              " keeping the old values is intended.")),
    FindingKind.OUTPUT_REVISITED: KindInfo(
        title="Output blocks revisited",
        sarif_name="OutputRevisited",
        short="An output block is visited again after other blocks were written.",
        help=("The pipeline does not read an output block back: its first write-back is lost when"
              " the block comes round again. Order the grid so that the steps writing one output"
              " block are consecutive (reduction axes last, marked 'arbitrary').")),
    FindingKind.SEMAPHORE_LEAK: KindInfo(
        title="Semaphore leaks",
        sarif_name="SemaphoreLeak",
        short="A semaphore's count is not zero when the kernel ends.",
        help=("Every signal (or DMA completion) needs a matching wait before the kernel returns;"
              " a leftover count corrupts the next kernel that uses the semaphore.")),
    FindingKind.DMA_NOT_WAITED: KindInfo(
        title="DMAs never waited",
        sarif_name="DmaNotWaited",
        short="A DMA was started and never waited on.",
        help=("Without a wait the kernel can end, or read the destination, before the copy lands."
              " Call .wait() on the copy descriptor before using the destination and before the"
              " kernel returns.")),
    FindingKind.RACE: KindInfo(
        title="Data races",
        sarif_name="DataRace",
        short=("Two accesses to overlapping memory, at least one a write, with no ordering"
               " between them."),
        help=("The accesses (listed as related locations) are not ordered by a DMA or semaphore"
              " wait, a barrier or the grid's sequential order, so the result depends on timing."
              " Add the missing wait, or give each actor its own buffer. Replay with the reported"
              " --seed."),
        shows_accesses=True,
        on_timeline=True,
        access_labels=("current:  ", "previous: "),
        needs_option="races"),
    FindingKind.DEADLOCK: KindInfo(
        title="Deadlocks",
        sarif_name="Deadlock",
        short="A wait that nothing can satisfy.",
        help=("On a TPU the kernel hangs. The related locations show who waits on which semaphore"
              " for what value; make sure every wait has a matching signal or DMA, on the right"
              " core and device."),
        shows_accesses=True,
        on_timeline=True),
    FindingKind.UNUSED_SUPPRESSION: KindInfo(
        title="Suppressions that matched nothing",
        sarif_name="UnusedSuppression",
        short="A `# pallas-check: ignore` comment that matched no finding in this run.",
        help=("The finding it was written for is gone (or it names a kind that does not exist):"
              " delete the comment, so that stale suppressions do not hide a future defect.")),
    FindingKind.COMPILE_ERROR: KindInfo(
        title="TPU compile errors",
        sarif_name="TpuCompileError",
        short="The TPU compiler rejects the kernel for this TPU generation.",
        help=("pallas-check compiled the call with libtpu for the named generation (--compile):"
              " the Pallas TPU lowering or Mosaic failed at the reported line. Typical causes: a"
              " block whose last two dimensions are not multiples of (8, 128), a primitive Mosaic"
              " cannot lower, a dynamic slice whose alignment cannot be proven. Without --compile,"
              " the simulation reports what it knows Mosaic never lowers (a ref indexed by an"
              " array of indices) and skips the call.")),
    FindingKind.VMEM_EXCEEDED: KindInfo(
        title="VMEM/SMEM overflows (the kernel does not fit the TPU)",
        sarif_name="VmemExceeded",
        short="The kernel needs more VMEM (or SMEM) than this TPU generation has for it.",
        help=("Blocks (double-buffered), scratch and the compiler's own scratch together exceed"
              " the scoped VMEM limit or the chip's VMEM (or SMEM: scalar prefetch and SMEM"
              " scratch exceed the chip's). A call that fits no generation of --tpu is not"
              " simulated. Use smaller blocks, or raise the limit with"
              " pltpu.CompilerParams(vmem_limit_bytes=...) where the chip has room.")),
    FindingKind.CHECK_FAILED: KindInfo(
        title="Failed kernel checks (pl.debug_check)",
        sarif_name="DebugCheckFailed",
        short="The kernel's own assertion (pl.debug_check) failed.",
        help=("The condition the kernel's author asserted is false at the reported grid step(s)."
              " pallas-check evaluates every pl.debug_check, with or without"
              " pl.enable_debug_checks(); on a TPU the check runs only inside"
              " pl.enable_debug_checks() (and stops the kernel), otherwise it is compiled out and"
              " the kernel goes on with the state the author ruled out.")),
    FindingKind.SIGNAL_NOT_REMOTE: KindInfo(
        title="Signals that do not reach the subcore they name (SparseCore)",
        sarif_name="SignalNotRemote",
        short=("A pl.semaphore_signal naming another subcore in a SparseCore kernel signals"
               " the signaller's own semaphore."),
        help=("In a plsc.VectorSubcoreMesh kernel, Mosaic lowers pl.semaphore_signal(sem,"
              " device_id={core: c, subcore: s}) on an ordinary semaphore to a LOCAL signal"
              " (tpu.sem_signal with no core or subcore operand): subcore s is never"
              " signalled, so its wait hangs on the chip, or a wait of the signaller's own"
              " consumes the count and orders nothing. Synchronise subcores with"
              " plsc.subcore_barrier(), or count with plsc.fetch_and_add.")),
    FindingKind.MXU_MISUSE: KindInfo(
        title="Explicit MXU operations misused (TPU v7)",
        sarif_name="MxuMisuse",
        short=("pltpu.matmul_push_rhs / matmul_acc_lhs / matmul_pop used against JAX's rules"
               " for them, or an MXU left holding data when the kernel ends."),
        help=("JAX's rules: push into a staging register only when it is empty (a"
              " matmul_acc_lhs with load_staged_rhs=r empties register r), load only a"
              " pushed register, load an RHS before the first matmul_acc_lhs of an MXU, and"
              " leave no data in the staging registers or the accumulator when the kernel"
              " ends (load every pushed RHS, pop every accumulator slice added to). The"
              " compiler sees only some of it (two pushes in straight-line code); on the"
              " chip a later kernel's matrix products on that MXU start from what this one"
              " left (not observed on a chip: pallas-check's reading of JAX's rules).")),
    FindingKind.RANDOM_MISUSE: KindInfo(
        title="Random numbers misused",
        sarif_name="RandomMisuse",
        short=("A random stream seeded alike at several grid points, or stochastic rounding"
               " fed random bits the chip does not read."),
        help=("pltpu.prng_seed with the same values (or one key drawn from unchanged) at"
              " several grid points gives each of them the same random numbers: seed with"
              " pl.program_id too, or fold it into the key (a kernel that wants one stream"
              " everywhere suppresses the finding with `# pallas-check:"
              " ignore[random-misuse]` on the seeding line). pltpu.stochastic_round reads"
              " only the low 23 bits of each uint32 random word (a TPU v5e): random bits in"
              " the top bits leave the rounding biased or deterministic; pass uniform uint32"
              " words whole, or put narrower random bits in the low 23.")),
}
