"""One case of the suite row (benchmarks/suite.py) under one mode, in a fresh process.

    python benchmarks/_suite_one.py --mode pc --case add_ok --path samples/add_ok.py \
        --options "--races" --out result.json

Why a process of its own per case and mode: the row measures *cold* calls, the first call
of every structure (tracing, lowering, compiling, pallas-check's analysis), as a user's
script or test pays them. A process that ran anything before would have JAX's caches and
pallas-check's warm. The driver sets XLA_FLAGS (`--devices N`) in this process's
environment before it starts, so JAX sees its CPU devices from the first import.

Modes:
  pc          `pallas_check.checking(races=True, project=False, **options)`
  tpu-interp  `pltpu.force_tpu_interpret_mode(pltpu.InterpretParams(detect_races=True,
              dma_execution_mode=..., num_cores_or_threads=cores))`
  hlo         every `pl.pallas_call` gets `interpret=True` (JAX's HLO interpreter)
  floor       every pallas_call answered with the outputs `record` saved for its inputs
              (a host callback looks them up): the script's own work, with no kernel run
  record      (untimed, for `floor`) the script under the TPU interpreter, races off,
              saving each pallas_call's outputs keyed by its name, shapes and input bytes

JAX's two modes run inside `pallas_check.simulated_tpu(generation, cores)`: a kernel that
asks which TPU it runs on (`emit_pipeline`, `get_tpu_info`, megacore kernels asking for
`num_cores`) is told the case's `--tpu`/`--cores`, as pallas-check tells it; on a bare CPU
it would fail for a reason that has nothing to do with the interpreter.

Only `runpy.run_path` is timed (after `import jax` and the mode's setup). The result is
written as one JSON object to `--out` (and printed as one line): the script's own prints
cannot be mistaken for it.

Nothing here imports JAX at module level: suite.py imports `api_options` to list cases.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import runpy
import sys
import time
from pathlib import Path
from typing import Any, Iterator, Literal

MODES = ("pc", "tpu-interp", "hlo", "floor", "record")


def _api_flags() -> dict[str, Any]:
    """Every flag `checking()` has a keyword for (long, short and `--no-x`) -> its row of
    the public `pallas_check.api.OPTIONS` (the options `pallas-check run` shares with the
    API; `--format`, `--output`, `--native`, `--trace`, `--devices` ... are not there)."""
    import pallas_check.api

    flags: dict[str, Any] = {}
    # Re-exported by api.py for the API's users, not in its __all__: read by name.
    options = getattr(pallas_check.api, "OPTIONS")
    for option in options.values():
        for flag in option.flags:
            flags[flag] = option
        if option.negative:
            flags[option.negative] = option
    return flags


def api_options(options: str) -> tuple[dict[str, Any], int, str | None]:
    """A case's CLI options as `checking()` keywords, its device count (`--devices`, which
    becomes XLA_FLAGS), and why the case cannot run under pallas-check's API (None: it
    can). `races` is always True here: the row compares race detectors."""
    flags = _api_flags()
    tokens = options.split()
    keywords: dict[str, Any] = {}
    devices = 1
    i = 0
    while i < len(tokens):
        flag, _, inline = tokens[i].partition("=")
        option = flags.get(flag)
        if flag == "--devices":
            takes_value = True
        elif option is None:
            return keywords, devices, f"skipped: {flag} has no checking() keyword"
        else:
            takes_value = option.kind is not bool
        if takes_value and not inline and i + 1 >= len(tokens):
            return keywords, devices, f"skipped: {flag} has no value"
        negative = getattr(option, "negative", None)
        value: Any = (inline or tokens[i + 1]) if takes_value else flag != negative
        i += 1 if inline or not takes_value else 2
        if option is None:  # --devices
            devices = int(value)
            continue
        name = option.key.replace("-", "_")
        if option.kind is int:
            keywords[name] = int(value)
        elif str(option.kind).startswith("typing.Optional[typing.List"):
            keywords.setdefault(name, []).append(value)
        else:
            keywords[name] = value
    keywords["races"] = True
    return keywords, devices, None


def _jax_setup(mode: str, keywords: dict[str, Any],
               recording: Path | None = None) -> tuple[contextlib.ExitStack, list[str]]:
    """The context JAX's interpreters run the script in, and what of the case's options
    they cannot mirror (reported, not hidden)."""
    import pallas_check
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    notes = []
    cores = int(keywords.get("cores", 1))
    generation = str(keywords.get("tpu", "v5e")).split(",")[0]
    stack = contextlib.ExitStack()
    stack.enter_context(pallas_check.simulated_tpu(generation, cores))
    if mode in ("tpu-interp", "record"):
        dma: Literal["eager", "on_wait"] = ("eager" if keywords.get("dma") == "eager"
                                            else "on_wait")
        if keywords.get("dma") not in (None, "eager", "on_wait"):
            notes.append(f"dma={keywords['dma']} run as on_wait")
        params = pltpu.InterpretParams(detect_races=mode == "tpu-interp",
                                       dma_execution_mode=dma, num_cores_or_threads=cores)
        stack.enter_context(pltpu.force_tpu_interpret_mode(params))
        if mode == "record":
            stack.enter_context(_recording(recording))
    elif mode == "floor":
        # The interpreter's mode turns a core_map into a pallas_call (whose bind is
        # replayed): no kernel is interpreted.
        stack.enter_context(pltpu.force_tpu_interpret_mode(pltpu.InterpretParams()))
        stack.enter_context(_replaying(recording))
    else:
        if cores > 1:
            notes.append(f"cores={cores}: the HLO interpreter has no TensorCores")
        stack.enter_context(_hlo_pallas_call(pl))
    for name in ("compile", "schedules"):
        if keywords.get(name) not in (None, False, 1):
            notes.append(f"{name}={keywords[name]}: pallas-check only")
    return stack, notes


@contextlib.contextmanager
def _hlo_pallas_call(pl: Any) -> Iterator[None]:
    """Library kernels take no interpret= argument (and samples pass none): give every
    `pl.pallas_call` interpret=True while the script runs, as benchmarks/run.py does.
    Installed before the script runs, so its imports (`from jax.experimental.pallas import
    pallas_call` too) get the wrapper. SparseCore kernels (`plsc`, `core_map`) do not go
    through `pallas_call`: the HLO interpreter cannot run them and they fail here."""
    original = pl.pallas_call

    def with_interpret(*args: Any, **kwargs: Any) -> Any:
        kwargs["interpret"] = True
        return original(*args, **kwargs)

    pl.pallas_call = with_interpret
    try:
        yield
    finally:
        pl.pallas_call = original


def _call_key(params: dict[str, Any], arrays: Any) -> str:
    """What identifies one pallas_call's answer: the kernel's name, its output shapes and
    the bytes of every input. A deterministic script gives the same inputs in every run,
    whatever order its calls run in (two calls of one program may run in either order)."""
    import hashlib

    import numpy as np

    digest = hashlib.sha1()
    # The kernel function and where it is defined (two kernels may take the same inputs).
    kernels = [params.get("jaxpr")] + list(params.get("jaxprs") or ())
    where = [getattr(getattr(k, "debug_info", None), "func_src_info", None) for k in kernels]
    digest.update(repr((params.get("name"), where,
                        [(a.shape, str(a.dtype)) for a in params["out_avals"]])).encode())
    for array in arrays:
        value = np.asarray(array)
        digest.update(repr((value.shape, str(value.dtype))).encode())
        digest.update(np.ascontiguousarray(value).tobytes())
    return digest.hexdigest()


@contextlib.contextmanager
def _recording(path: Path | None) -> Iterator[None]:
    """Every pallas_call bound while the script runs also hands its inputs and outputs to a
    host callback, which keeps the outputs under `_call_key`; written to `path` at the end
    (pickle). The primitive's `bind` is wrapped, so calls that no `pl.pallas_call` makes
    (core_map, pl.kernel) are kept too."""
    import pickle

    import jax
    import numpy as np

    assert path is not None
    kept: dict[str, list[list[Any]]] = {}

    def wrap(original: Any) -> Any:
        def bind(*args: Any, **params: Any) -> Any:
            outs = original(*args, **params)
            count = len(args)

            def keep(*arrays: Any) -> None:
                kept.setdefault(_call_key(params, arrays[:count]), []).append(
                    [np.asarray(a) for a in arrays[count:]])

            jax.debug.callback(keep, *args, *outs)
            return outs
        return bind

    with _binds_replaced(wrap):
        try:
            yield
            jax.effects_barrier()
        finally:
            path.write_bytes(pickle.dumps(kept))


@contextlib.contextmanager
def _replaying(path: Path | None) -> Iterator[None]:
    """Every pallas_call becomes a host callback that returns the outputs `_recording` kept
    for the same inputs: the script runs its own work (inputs, references, checks, the
    compiles of its programs) and no kernel. An answer never recorded raises."""
    import pickle

    import jax

    assert path is not None
    kept: dict[str, list[list[Any]]] = pickle.loads(path.read_bytes())

    def wrap(_original: Any) -> Any:
        def bind(*args: Any, **params: Any) -> Any:
            shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in params["out_avals"]]

            def answer(*arrays: Any) -> list[Any]:
                key = _call_key(params, arrays)
                if key not in kept:
                    raise LookupError(f"no recorded outputs for kernel {params.get('name')}")
                return kept[key][0]

            return jax.pure_callback(answer, shapes, *args, vmap_method="sequential")
        return bind

    with _binds_replaced(wrap):
        yield


@contextlib.contextmanager
def _binds_replaced(wrap: Any) -> Iterator[None]:
    """The `bind` of both kernel primitives (pallas_call; mpmd_map, which core_map and
    pl.kernel become) replaced by `wrap(original bind)` while the block runs."""
    from jax._src.pallas.mpmd import mpmd_map_p
    from jax._src.pallas.pallas_call import pallas_call_p

    primitives = (pallas_call_p, mpmd_map_p)
    for primitive in primitives:
        primitive.bind = wrap(primitive.bind)  # type: ignore[method-assign]
    try:
        yield
    finally:
        for primitive in primitives:
            del primitive.bind


def _short(exc: BaseException) -> str:
    """An exception as one line of at most 200 characters."""
    first = (str(exc).strip().splitlines() or [""])[0]
    text = f"{type(exc).__name__}: {first}".rstrip(": ")
    return text if len(text) <= 200 else text[:197] + "..."


def _run_script(path: Path) -> tuple[float, str | None]:
    """Run the script as `python path` would (its folder first on sys.path: the shipped
    kernel cases import their `_case_common`), timed; (seconds, error or None)."""
    sys.argv = [str(path)]
    sys.path.insert(0, str(path.parent))
    error = None
    start = time.perf_counter()
    try:
        runpy.run_path(str(path), run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0):
            error = f"SystemExit: {exc.code}"
    except Exception as exc:  # the case failed under this mode: reported, not raised
        error = _short(exc)
    return time.perf_counter() - start, error


def _races_found_by_jax() -> bool | None:
    """Whether JAX's race detector reported a race (its module state; None: unknown)."""
    try:
        from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc
    except ImportError:
        return None
    races = getattr(ipc, "races", None)
    return None if races is None else bool(getattr(races, "races_found", False))


def _run_pc(path: Path, keywords: dict[str, Any],
            result: dict[str, Any]) -> tuple[float, str | None]:
    """The script under pallas-check; its report's findings and calls go into `result`
    (an `_ok` sample should have no findings)."""
    import pallas_check

    with pallas_check.checking(project=False, **keywords) as run:
        seconds, error = _run_script(path)
    report = run.report
    result["findings"] = len(report.findings) if report else None
    result["calls"] = len(report.calls) if report else None
    if report is not None and report.internal_error and error is None:
        error = f"pallas-check internal error: {report.internal_error}"[:200]
    return seconds, error


def _run_jax(mode: str, path: Path, keywords: dict[str, Any], result: dict[str, Any],
             recording: Path | None = None) -> tuple[float, str | None]:
    """The script under one of JAX's interpreters (or recorded, or replayed); what of the
    case's options they cannot mirror goes into `result["notes"]`, and for the TPU
    interpreter whether it found races."""
    stack, notes = _jax_setup(mode, keywords, recording)
    result["notes"] = notes
    with stack:
        seconds, error = _run_script(path)
    if mode == "tpu-interp":
        result["races_found"] = _races_found_by_jax()
    return seconds, error


def run_case(case: str, mode: str, path: Path, options: str,
             recording: Path | None = None) -> dict[str, Any]:
    """The case under the mode: the result the driver reads."""
    keywords, _devices, skip = api_options(options)
    result: dict[str, Any] = {"case": case, "mode": mode, "seconds": None, "ok": False,
                              "error": None, "options": options}
    if skip is not None and mode == "pc":
        result.update(error=skip, skipped=True)
        return result
    import jax  # noqa: F401  (before the timer: every mode pays it outside)

    outer = time.perf_counter()
    try:
        seconds, error = (_run_pc(path, keywords, result) if mode == "pc"
                          else _run_jax(mode, path, keywords, result, recording))
    except Exception as exc:  # the mode's own setup or teardown failed: reported
        seconds, error = None, f"{mode} setup: {_short(exc)}"
    result.update(seconds=seconds, ok=error is None, error=error,
                  with_setup_seconds=time.perf_counter() - outer)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=MODES, required=True)
    parser.add_argument("--case", required=True)
    parser.add_argument("--path", required=True, type=Path)
    parser.add_argument("--options", default="")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--recording", type=Path,
                        help="record: where the outputs go; floor: where they come from")
    args = parser.parse_args()
    if args.mode in ("record", "floor") and args.recording is None:
        parser.error(f"--mode {args.mode} needs --recording")
    result = run_case(args.case, args.mode, args.path.resolve(), args.options,
                      args.recording)
    line = json.dumps(result)
    if args.out is not None:
        args.out.write_text(line)
    sys.stdout.flush()
    print(line, flush=True)


if __name__ == "__main__":
    main()
