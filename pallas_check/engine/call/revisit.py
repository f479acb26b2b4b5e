"""Output blocks visited again after other blocks, and whether an earlier visit's work
survives: what the pipeline records of each revisit, the perturbation of the inputs a
first visit consumed (a re-run of the call, as the second-fill run decides uninitialized
memory), and the comparison that decides it.

A TPU pipeline writes an output block back when its index changes and, unless the block
is `pl.Buffered(1, revisit=pl.RevisitMode.ANY)`, never reads it back in: a revisit starts
from a buffer holding nothing of the earlier visit, and its write-back lands last. Correct
kernels revisit all the same (partial sums kept in scratch and written at the last visit,
a running value from scratch written at every visit, ANY); what separates them from a
kernel that loses work is data flow: does what the first visit consumed still reach the
block's final value? The shape of the writes cannot tell (an MoE combine that re-zeroes
its block at every run of a group writes it whole at its last visit, and is wrong).
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Sequence

import jax.numpy as jnp
import numpy as np

from pallas_check.engine.memory.buffer import Buffer, MemorySpace, all_written
from pallas_check.findings.finding import IndexRange, SourceFrame


# How many perturbed re-runs at most: NaN first (it flows through arithmetic, as a
# never-written fill does), then large values of either sign (`perturbed`: a contribution
# that reaches the result only through comparisons, a running max or argmax, shows).
# Under the last two the first visit's own result is also fingerprinted: a first visit
# whose result is the same under both did nothing with its inputs, and lost nothing.
ROUNDS = 3


@dataclasses.dataclass
class RevisitRecord:
    """One output block of one core visited in more than one run of grid steps."""

    device: int
    actor: str
    name: str  # the kernel's parameter name of the output
    position: int  # the output's place among the kernel's parameters
    block: tuple[int, ...]
    hbm_index: tuple[int | slice, ...]  # the block's valid part in the output array
    frames: tuple[SourceFrame, ...]  # the out_specs index_map
    restored: bool  # pl.Buffered(1, revisit=ANY): the pipeline reads the block back
    # each run's (grid point of its write-back, written)
    visits: list[tuple[tuple[int, ...], bool | np.ndarray]]
    first_points: tuple[tuple[int, ...], ...]  # the grid points of the first visit
    inputs: tuple[tuple[str, tuple[int, ...]], ...]  # input blocks the first visit read

    @property
    def first_point(self) -> tuple[int, ...]:
        return self.first_points[0]

    @property
    def last_point(self) -> tuple[int, ...]:
        return self.visits[-1][0]

    @property
    def first_end(self) -> tuple[int, tuple[int, ...]]:
        """The (device, grid point) of the first visit's last step."""
        return self.device, self.first_points[-1]

    @property
    def perturbable(self) -> bool:
        """Whether the first visit consumed any input block a re-run can perturb."""
        return bool(self.inputs)


@dataclasses.dataclass
class Lost:
    """A revisit that loses an earlier visit's work (what the checker reports)."""

    record: RevisitRecord
    index_range: IndexRange  # in the output array
    elements: int
    earlier_point: tuple[int, ...]
    by_flow: bool  # decided by perturbation (else: by what the last visit wrote)


class Perturbation:
    """What a perturbed re-run changes: the input blocks the kernel sees at `points`
    ((device, grid point) pairs), replaced for the body of that step only."""

    def __init__(self, points: set[tuple[int, tuple[int, ...]]], round_: int,
                 capture: set[tuple[int, tuple[int, ...]]] | None = None) -> None:
        self.points = points
        self.round = round_
        # (device, grid point) -> a digest of the core's VMEM/SMEM after that step's body
        # (`capture`: the last steps of first visits, whose results are compared).
        self.capture = capture or set()
        self.fingerprints: dict[tuple[int, tuple[int, ...]], bytes] = {}

    def fingerprint(self, key: tuple[int, tuple[int, ...]], buffers: Sequence[Buffer]) -> None:
        """What a first visit left behind: its output block and the core's scratch (and
        its input blocks, the same in every run once restored)."""
        digest = hashlib.blake2b(digest_size=16)
        for buf in buffers:
            digest.update(np.ascontiguousarray(buf.data).reshape(-1).view(np.uint8).data)
        self.fingerprints[key] = digest.digest()

    def apply(self, buffers: Sequence[Buffer]
              ) -> list[tuple[Buffer, np.ndarray, bool | np.ndarray]]:
        """Swap perturbed values into the step's input blocks; what to restore after."""
        saved = []
        for k, buf in enumerate(buffers):
            # An integer in SMEM is a size or an index more often than data: moved by one,
            # never to an extreme (a DMA length of 2**31 would be the engine's to allocate).
            values = perturbed(buf.data, self.round, buf.space == MemorySpace.SMEM, k % 2 == 1)
            if values is None:
                continue
            written = buf.written_at(Ellipsis)
            saved.append((buf, buf.data, written))
            buf.adopt(values, written)
        return saved

    @staticmethod
    def restore(saved: list[tuple[Buffer, np.ndarray, bool | np.ndarray]]) -> None:
        """The step's body is done: the blocks hold what the pipeline landed again (the
        next step may use them unchanged, without a copy)."""
        for buf, values, written in saved:
            buf.adopt(values, written)


def perturbed(values: np.ndarray, round_: int, mild: bool = False,
              odd: bool = False) -> np.ndarray | None:
    """Values of the same dtype as `values`: round 0 differs from them in every element
    (NaN for floats); round 1 is a large value; round 2 a large negative one, but a small
    positive one for the odd-numbered input blocks (`odd`), so that a product or a sum of
    two inputs, a square, a maximum or a minimum each differ between rounds 1 and 2.
    `mild` integers move by one or two, never to an extreme. None: a dtype it cannot
    perturb."""
    dtype = values.dtype
    out = np.empty_like(values)
    try:
        if dtype == np.bool_:
            out[...] = np.logical_not(values) if round_ == 0 else (round_ == 1 or odd)
        elif np.issubdtype(dtype, np.integer):
            info = np.iinfo(dtype)
            if round_ == 0 or (mild and round_ == 1):
                out[...] = np.where(values == info.max, info.min, values + 1)
            elif mild:
                out[...] = np.where(values >= info.max - 1, info.min, values + 2) if odd \
                    else np.where(values == info.min, info.max, values - 1)
            else:
                out[...] = info.max if round_ == 1 else (info.max // 4 if odd else info.min)
        elif "float" in dtype.name or np.issubdtype(dtype, np.floating):
            top = np.float64(jnp.finfo(dtype).max)  # type: ignore[no-untyped-call]
            # Large, yet a dot product of two such values stays finite for f32 and bf16.
            big = top ** 0.25 if top > 1e30 else top ** 0.5
            out[...] = (np.nan if round_ == 0 else big if round_ == 1
                        else big / 4 if odd else -big / 2)
        else:
            return None
    except (TypeError, ValueError):
        return None
    return out


def perturbation_points(records: Sequence[RevisitRecord]
                        ) -> set[tuple[int, tuple[int, ...]]]:
    return {(r.device, p) for r in records for p in r.first_points}


def block_changed(record: RevisitRecord, outputs: Sequence[Sequence[np.ndarray]],
                  other: Sequence[Sequence[np.ndarray]], first_output: int) -> bool:
    """Whether the block's final value differs between the two runs (NaN equals NaN)."""
    j = record.position - first_output
    a = np.asarray(outputs[record.device][j][record.hbm_index])
    b = np.asarray(other[record.device][j][record.hbm_index])
    if "float" in a.dtype.name or a.dtype.kind in "fc":
        af, bf = a.astype(np.float64), b.astype(np.float64)
        return bool(np.any((af != bf) & ~(np.isnan(af) & np.isnan(bf))))
    return bool(np.any(a != b))


def lost_by_flow(record: RevisitRecord) -> Lost:
    """Nothing the first visit consumed reaches the block's final value: what it wrote
    (the whole block when it wrote nothing: its work went through scratch) is lost."""
    written = record.visits[0][1]
    shape = _block_shape(record.hbm_index)
    if isinstance(written, np.ndarray) and written.any():
        mask = written
    else:
        mask = np.ones(shape, bool)
    return Lost(record, lost_range(record.hbm_index, mask), int(np.count_nonzero(mask)),
                record.first_point, True)


def lost_by_writes(record: RevisitRecord) -> Lost | None:
    """Undecidable by data flow (the first visit consumed no input block, or a perturbed
    re-run did not finish): elements an earlier visit wrote that the last visit's
    write-back does not carry are lost (a restored block carries what it read back)."""
    last_point, last_written = record.visits[-1]
    if all_written(last_written):
        return None
    lost, earlier_point = None, None
    for point, written in reversed(record.visits[:-1]):
        here = np.logical_and(written, np.logical_not(last_written))
        if here.any():
            lost = here if lost is None else lost | here
            earlier_point = point if earlier_point is None else earlier_point
    if lost is None or earlier_point is None:
        return None
    return Lost(record, lost_range(record.hbm_index, lost), int(np.count_nonzero(lost)),
                earlier_point, False)


def _block_shape(hbm_index: tuple[int | slice, ...]) -> tuple[int, ...]:
    return tuple(i.stop - i.start for i in hbm_index if isinstance(i, slice))


def lost_range(hbm_index: tuple[int | slice, ...], lost: np.ndarray) -> IndexRange:
    """The HBM range (bounding box) of the lost elements of a block's valid part."""
    lost = np.broadcast_to(lost, _block_shape(hbm_index))
    dims = iter(range(lost.ndim))
    out = []
    for index in hbm_index:
        if isinstance(index, int):
            out.append((index, index + 1))
            continue
        d = next(dims)
        along = np.nonzero(lost.any(axis=tuple(i for i in range(lost.ndim) if i != d)))[0]
        out.append((index.start + int(along[0]), index.start + int(along[-1]) + 1))
    return tuple(out)
