"""The donated operands of a jitted call, copied so that it can be run again.

intercept/judge.py decides a kernel's `unwritten-output` and `uninitialized` findings by
running the program around it again, the same executable on the same arguments
(intercept/outer.py). An argument the program donates (`jax.jit(f, donate_argnums=...)`)
is the executable's to consume: XLA may write an output into its buffer (JAX then marks
the caller's array deleted; XLA:CPU does so wherever an output of its shape and type can
take the buffer, and warns "Some donated buffers were not usable" where none can). After
the first run its values are gone, and a second run on the caller's array would fail, or
write into a buffer the script still holds.

So, before the first run, the donated arrays are copied (on their own devices, with their
shardings), and every re-run runs on fresh copies of those copies: the script's first run
is the one it asked for, on its own buffers, and no re-run touches them. Whether a re-run
will be needed is known only after the kernels ran (which elements they left undecided,
and whether the program's results are those outputs as they are), too late: the buffers
may have been consumed by then. So the copies are taken whenever the program holds a
kernel whose outputs are not all its results as they are (intercept/outer.py), and only
up to `KEPT_BYTES` of donated operands per program: a program donating more keeps its
findings as the kernel's boundary decides them, with a note saying so. The copies are
dropped when the program's findings are judged. A re-run holds one more copy of the
donated operands while it runs (the copy it consumes).

Operands that are no JAX arrays (numpy arrays, Python scalars) are never consumed: JAX
copies them to the device for each run, and a re-run passes them again as they are.
"""

from __future__ import annotations

from typing import Sequence

import jax

from pallas_check.findings.units import format_bytes

# At most this many bytes of donated operands are copied per program (see the module).
KEPT_BYTES = 512 * 2**20


class Kept:
    """A program's donated JAX arrays, copied before its first run (by position among
    its flat arguments)."""

    def __init__(self, copies: dict[int, jax.Array]) -> None:
        self._copies = copies

    @property
    def copies(self) -> tuple[jax.Array, ...]:
        return tuple(self._copies.values())

    def arguments(self, args: Sequence[object]) -> list[object]:
        """`args` for one re-run: each donated array replaced by a fresh copy of the copy
        kept (the re-run may consume it; the one kept serves the next re-run)."""
        out = list(args)
        for position, copy in self._copies.items():
            out[position] = jax.device_put(copy, copy.sharding, may_alias=False)
        return out

    def release(self) -> None:
        """Free the copies now (the program is judged), not when they are collected."""
        for copy in self._copies.values():
            if not copy.is_deleted():
                copy.delete()
        self._copies = {}


def keep(args: Sequence[object], donated: Sequence[bool], limit: int | None = None
         ) -> Kept | str:
    """Copies of the JAX arrays among `args` that `donated` marks, or why none were taken
    (more than `limit` bytes, `KEPT_BYTES` when None; a copy that failed)."""
    limit = KEPT_BYTES if limit is None else limit
    arrays = {k: a for k, (a, d) in enumerate(zip(args, donated))
              if d and isinstance(a, jax.Array) and not a.is_deleted()}
    size = sum(int(a.nbytes) for a in arrays.values())
    if size > limit:
        return (f"its donated operands, {format_bytes(size)}, are more than the"
                f" {format_bytes(limit)} pallas-check copies to re-run a program")
    copies: dict[int, jax.Array] = {}
    try:
        for position, array in arrays.items():
            copies[position] = jax.device_put(array, array.sharding, may_alias=False)
    except Exception as exc:  # noqa: BLE001 - ours to note, never the script's failure
        Kept(copies).release()
        return f"copying its donated operands failed ({type(exc).__name__}: {exc})"
    return Kept(copies)
