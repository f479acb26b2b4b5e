"""What the chip's compiler said of a call, kept on disk between runs.

Why: every run compiles each distinct call for the first `--tpu` generation at the call
(intercept/chip.py), and a test suite starts hundreds of processes that compile the same
kernels. The lowering (the Pallas TPU lowering to Mosaic, in Python) is redone each
process -- its text is the key -- but XLA:TPU's and Mosaic's compile of that text (the
larger part: paged attention 0.1-0.4 s) is read back from here.

A call's structure (`structure_key`: its static parameters, operands and mesh, before
the lowering) is a second key to the same success, so that the next run skips the lowering
too.

Only successes are kept (the scoped VMEM the compiled kernels use): a failure is
compiled again, so that its exception and the failing operation come from the compiler.
Never stale: the key is the lowered module's text (the whole kernel, its Mosaic body and
compiler params included), the generation, and the versions of JAX, jaxlib and libtpu. An
entry is written to a temporary file and renamed (several processes may write one key);
one that cannot be read is compiled again. The folder is the engine's XLA cache's
(`PALLAS_CHECK_CACHE_DIR`, `off` turns both off), under `chip/`.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Mapping

import jax

from pallas_check.engine.runtime import disk_cache
from pallas_check.jaxbridge.params import static_text

_SUFFIX = ".json"


@functools.cache
def _versions() -> str:
    found = []
    for name in ("jax", "jaxlib", "libtpu"):
        try:
            found.append(f"{name}={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{name}=none")
    return " ".join(found)


@functools.cache
def _own_code() -> str:
    """A digest of the code that builds the compiled program from a call (an entry keyed
    by the call's structure was made by this code)."""
    digest = hashlib.sha256()
    for name in ("compiler.py", "export.py"):
        for path in (Path(__file__).with_name(name),
                     Path(__file__).parent.parent / "jaxbridge" / name):
            if path.exists():
                digest.update(path.read_bytes())
    return digest.hexdigest()


def structure_key(params: Mapping[str, object], avals: object, mesh_axes: object) -> str:
    """A call's key before it is lowered: its static parameters as text (the kernel's
    jaxpr, grid, block specs and compiler params; object addresses dropped), its operands'
    shapes and dtypes, its mesh axes, JAX's 64-bit switch and the code that builds the
    program. The lowering is a function of these, so a success found under it is the
    lowered module's (`read`), and the Pallas TPU lowering (tens of milliseconds a call)
    is skipped on the next run."""
    text = re.sub(r" at 0x[0-9a-f]+", "", static_text(params))
    x64 = bool(jax.config.jax_enable_x64)  # type: ignore[attr-defined]
    return f"structure\n{_own_code()}\nx64={x64}\n{avals!r}\n{mesh_axes!r}\n{text}"


def _path(lowered_text: str, generation: str) -> Path | None:
    where = disk_cache.folder()
    if where is None:
        return None
    digest = hashlib.sha256(f"{_versions()}\n{generation}\n{lowered_text}".encode())
    return where / "chip" / (digest.hexdigest() + _SUFFIX)


def read(lowered_text: str, generation: str) -> int | None:
    """The compiled kernels' scoped VMEM bytes of a call that compiled before, or None."""
    path = _path(lowered_text, generation)
    if path is None:
        return None
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))
        return int(entry["scoped_bytes"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write(lowered_text: str, generation: str, scoped_bytes: int) -> None:
    """Keep a success; a folder that cannot be written is no error."""
    path = _path(lowered_text, generation)
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump({"scoped_bytes": scoped_bytes}, out)
        os.replace(temporary, path)
    except OSError:
        return


def empty() -> bool:
    """Whether no success is kept yet for this cache folder (a first run: the compile
    worker is worth starting ahead, intercept/chip.py), or the cache is off."""
    where = disk_cache.folder()
    if where is None:
        return True
    try:
        with os.scandir(where / "chip") as entries:
            return not any(entry.name.endswith(_SUFFIX) for entry in entries)
    except OSError:
        return True
