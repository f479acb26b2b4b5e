"""A hardware recording: what each pallas_call of a script got and gave on a real chip.

`pallas-check record` writes one (commands/record.py) on a TPU; `pallas-check replay` and
the pytest form read it back on any CPU (commands/replay.py) and hold the simulation to
the chip's outputs. The file is ONE `numpy.savez_compressed` archive, so that a kernel
repository can keep its recordings in git and CI can read them with numpy alone:

- `meta`: a 0-d unicode array holding the JSON metadata (`Recording.meta_dict`):
  `format` ("pallas-check/recording"), `version`, the script (relative to the folder the
  recording was made in) and its arguments, the chip (`device_kind`), the platform, the
  JAX / jaxlib / libtpu / pallas-check versions, `script_error` (the script's own failure
  as one line, or null; on a chip this is how a kernel that halts or fails to compile
  shows: see `RecordedFailure`) and `calls`, one entry per pallas_call in the order the
  chip ran them: index, device, kernel name, file (relative where it can be) and line,
  grid, fingerprint, each operand's and output's shape and dtype;
- `c{i}_in{j}`: operand j of call i, as the kernel received it;
- `c{i}_out{k}`: output k of call i, as the chip returned it.

An array whose dtype numpy cannot store by itself (bfloat16, the float8 types) is stored
as unsigned integers of the same width; the dtype named in the metadata views it back.

The fingerprint identifies a call's structure across processes and machines: a hash of
the kernel jaxpr's text (no source lines), the grid, every block's shape and index map
(text), the operands' and outputs' shapes and dtypes, the scratch shapes and the compiler
parameters. Not the kernel's name or file: a script moved or a kernel renamed still
replays. The same code traced by another JAX may print another jaxpr: the recording keeps
the JAX version, which replay names when a fingerprint differs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import os
from pathlib import Path
from typing import Any, Sequence

import jax
import numpy as np

from pallas_check import __version__
from pallas_check.config.errors import UsageError
from pallas_check.deliver.outfile import StagedFile
from pallas_check.findings.finding import JsonObject, JsonValue
from pallas_check.jaxbridge.call import describe
from pallas_check.jaxbridge.jaxprs import stable_text

FORMAT = "pallas-check/recording"
VERSION = 1
META = "meta"


@dataclasses.dataclass
class RecordedCall:
    """One pallas_call as the chip ran it."""

    index: int  # in the order the calls reached the host (per device)
    device: int
    kernel: str
    file: str
    line: int
    grid: tuple[int, ...]
    fingerprint: str
    inputs: list[np.ndarray]
    outputs: list[np.ndarray]

    def meta_dict(self) -> JsonObject:
        return {"index": self.index, "device": self.device, "kernel": self.kernel,
                "file": self.file, "line": self.line, "grid": list(self.grid),
                "fingerprint": self.fingerprint,
                "inputs": [_aval(x) for x in self.inputs],
                "outputs": [_aval(x) for x in self.outputs]}


@dataclasses.dataclass
class Recording:
    """A whole recording: where it was made and every call (see the module docstring)."""

    script: str
    args: list[str]
    chip: str
    platform: str
    versions: dict[str, str | None]
    calls: list[RecordedCall]
    script_error: str | None = None
    partial: bool = False  # the run was stopped (Ctrl-C, a stuck call) before its end

    def meta_dict(self) -> JsonObject:
        versions: dict[str, JsonValue] = dict(self.versions)
        return {"format": FORMAT, "version": VERSION, "script": self.script,
                "args": list(self.args), "chip": self.chip, "platform": self.platform,
                "versions": versions, "script_error": self.script_error,
                "partial": self.partial, "calls": [c.meta_dict() for c in self.calls]}


def _aval(x: np.ndarray) -> JsonObject:
    return {"shape": list(x.shape), "dtype": str(x.dtype)}


def versions() -> dict[str, str | None]:
    """The versions a recording was made with: JAX, jaxlib, libtpu (None where absent)."""
    found: dict[str, str | None] = {"jax": jax.__version__, "pallas-check": __version__}
    for package in ("jaxlib", "libtpu"):
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = None
    return found


def fingerprint(params: dict[str, Any], operands: Sequence[np.ndarray]) -> str:
    """The call's structure as 16 hex digits (see the module docstring): equal for the same
    kernel on the same shapes in any process."""
    call = describe(params)
    parts = [stable_text(call.kernel), repr(tuple(call.grid)),
             repr(call.out_avals), repr(call.scratch), repr(call.compiler_params),
             repr(call.aliases), f"{call.num_scalars}/{call.num_inputs}/{call.num_outputs}"]
    for block in call.blocks:
        parts.append(repr([(d.kind, d.size, d.padding) for d in block.dims]))
        parts.append(stable_text(block.index_map.jaxpr))
        parts.append(f"{block.array_shape} {block.array_dtype}")
    parts += [f"{np.shape(x)} {np.asarray(x).dtype}" for x in operands]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def relative(path: str, base: Path | None = None) -> str:
    """`path` relative to `base` (the working folder) where it lies under it, else as is."""
    if not path:
        return path
    base = base or Path.cwd()
    try:
        return str(Path(os.path.abspath(path)).relative_to(base.resolve()))
    except ValueError:
        return path


# ---------------------------------------------------------------- the file


def _storable(x: np.ndarray) -> np.ndarray:
    """`x` as numpy can store it without pickling: a dtype numpy names itself as is,
    any other (bfloat16, float8) viewed as unsigned integers of its width."""
    x = np.ascontiguousarray(x)
    if x.dtype.kind in "biufc" and np.dtype(x.dtype.str) == x.dtype:
        return x
    return x.view(np.dtype(f"u{x.dtype.itemsize}"))


def _dtype(name: str) -> np.dtype:
    try:
        return np.dtype(name)
    except TypeError:
        return np.dtype(jax.numpy.dtype(name))  # bfloat16, float8_*: ml_dtypes, via JAX


def write(recording: Recording, path: Path) -> None:
    """The recording written to `path` atomically (a temporary file beside it, renamed:
    a reader sees the old file or the whole new one)."""
    arrays: dict[str, np.ndarray] = {
        META: np.array(json.dumps(recording.meta_dict(), sort_keys=True))}
    for n, call in enumerate(recording.calls):
        arrays.update({f"c{n}_in{j}": _storable(x) for j, x in enumerate(call.inputs)})
        arrays.update({f"c{n}_out{k}": _storable(x) for k, x in enumerate(call.outputs)})
    staged = StagedFile(path)
    try:
        np.savez_compressed(staged.handle, **arrays)  # type: ignore[arg-type]
    except BaseException:
        staged.discard()
        raise
    staged.commit()


class RecordingError(UsageError):
    """A file that is not a readable recording of this version (one line, exit 2)."""


def read(path: Path) -> Recording:
    """The recording at `path`; RecordingError (one line, exit 2) when it is none."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            meta = json.loads(str(archive[META]))
            if not isinstance(meta, dict) or meta.get("format") != FORMAT:
                raise RecordingError(f"{path} is not a pallas-check recording")
            if meta.get("version") != VERSION:
                raise RecordingError(f"{path} is a recording of format version"
                                     f" {meta.get('version')}; this pallas-check reads"
                                     f" version {VERSION}")
            calls = [_call(archive, n, entry) for n, entry in enumerate(meta["calls"])]
    except RecordingError:
        raise
    except FileNotFoundError:
        raise RecordingError(f"recording not found: {path}") from None
    except IsADirectoryError:
        raise RecordingError(f"{path} is a folder, not a recording") from None
    except Exception as exc:  # noqa: BLE001 - a damaged or foreign file: one line
        raise RecordingError(f"{path} is not a readable pallas-check recording"
                             f" ({type(exc).__name__}: {exc})") from None
    return Recording(script=meta["script"], args=list(meta["args"]), chip=meta["chip"],
                     platform=meta["platform"], versions=dict(meta["versions"]),
                     calls=calls, script_error=meta.get("script_error"),
                     partial=bool(meta.get("partial")))


def _call(archive: Any, n: int, entry: dict[str, Any]) -> RecordedCall:
    """Call `n` of the archive (np.load's NpzFile) from its metadata entry."""

    def array(key: str, aval: dict[str, Any]) -> np.ndarray:
        stored = archive[key]
        dtype = _dtype(aval["dtype"])
        value = stored if stored.dtype == dtype else stored.view(dtype)
        return value.reshape(aval["shape"])

    return RecordedCall(
        index=int(entry["index"]), device=int(entry["device"]), kernel=entry["kernel"],
        file=entry["file"], line=int(entry["line"]), grid=tuple(entry["grid"]),
        fingerprint=entry["fingerprint"],
        inputs=[array(f"c{n}_in{j}", a) for j, a in enumerate(entry["inputs"])],
        outputs=[array(f"c{n}_out{k}", a) for k, a in enumerate(entry["outputs"])])
