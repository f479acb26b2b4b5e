"""libtpu: whether it is installed, its start-up chatter silenced, its compile-only devices.

libtpu writes to the process's stderr (file descriptor 2) when it is loaded on a machine
without a TPU ("could not determine TPU accelerator type", InitGoogle logging). JAX loads
it when its backends start and when a topology is first asked for; both happen here, once,
with descriptor 2 pointed at a temporary file (kept for PALLAS_CHECK_DEBUG).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import sys
import tempfile
import threading
from typing import TYPE_CHECKING, Any, Callable, Iterator, TypeVar

from pallas_check.config import TpuGeneration
from pallas_check.config.environment import debug_requested

if TYPE_CHECKING:  # JAX is imported where a device is needed
    import jax

INSTALL_HINT = 'pip install "pallas-check[tpu]"'

# A run's note when the compile was asked for and libtpu is not there (intercept/chip.py's
# reports, the pytest plugin's header: here, where importing it loads no JAX).
NOT_CHECKED = (f"the TPU compile was not checked (libtpu is not installed): kernels the chip"
               f" cannot lower or compile are not found; install it with: {INSTALL_HINT}")

# Compile-only topologies: the smallest slice of each generation, and one of 16 chips for
# shard_map calls over more than 4 devices.
TOPOLOGIES: dict[TpuGeneration, tuple[str, str]] = {
    TpuGeneration.V5E: ("v5e:2x2", "v5e:4x4"),
    TpuGeneration.V5P: ("v5p:2x2x1", "v5p:2x2x4"),
    TpuGeneration.V6E: ("v6e:2x2", "v6e:4x4"),
    TpuGeneration.V7X: ("tpu7x:2x2x1", "tpu7x:2x2x4"),
}

# Set before libtpu loads (only where the user has not set them): fewer log lines at all.
_QUIET_ENV = {"TPU_STDERR_LOG_LEVEL": "3", "TPU_MIN_LOG_LEVEL": "3",
              "GRPC_VERBOSITY": "ERROR", "TF_CPP_MIN_LOG_LEVEL": "3"}

_lock = threading.Lock()
chatter: list[str] = []  # what libtpu wrote while starting (PALLAS_CHECK_DEBUG shows it)

T = TypeVar("T")


def libtpu_version() -> str:
    """The installed libtpu's version ("unknown" where its metadata says none)."""
    import importlib.metadata

    try:
        return importlib.metadata.version("libtpu")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def libtpu_missing() -> str | None:
    """None when libtpu is importable; else the one-line error for `--compile`."""
    if importlib.util.find_spec("libtpu") is not None:
        return None
    return (f"--compile needs libtpu (TPU compiler, no TPU needed); install it with:"
            f" {INSTALL_HINT}")


def quiet_environment(compiling: bool = False) -> None:
    """Lower libtpu's log levels; call before JAX starts its backends. `compiling`: also
    let libtpu load in several processes at once (it takes a lockfile in /tmp that only a
    process driving a real TPU needs; without this, a second pallas-check process compiling
    at the same time fails with "Internal error when accessing libtpu multi-process
    lockfile")."""
    for name, value in _QUIET_ENV.items():
        os.environ.setdefault(name, value)
    if compiling:
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


@contextlib.contextmanager
def _stderr_to_file() -> Iterator[None]:
    """Descriptor 2 into a temporary file while active (what C++ code prints goes there)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real descriptor 2 (an embedding host): nothing to do
        yield
        return
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            text = sink.read().decode("utf-8", "replace")
            if text.strip():
                chatter.append(text)
                if debug_requested():
                    sys.stderr.write(text)


def quietly(fn: Callable[[], T]) -> T:
    """`fn()` with whatever it prints on descriptor 2 kept off the terminal."""
    with _lock, _stderr_to_file():
        return fn()


def start_backends_quietly(compiling: bool = False) -> None:
    """Start JAX's backends now, with libtpu's chatter kept off the terminal (once libtpu
    is installed JAX tries it at start-up even for a CPU-only run)."""
    if importlib.util.find_spec("libtpu") is None:
        return
    quiet_environment(compiling)
    import jax

    quietly(jax.devices)


def topology_name(generation: TpuGeneration, devices_needed: int = 1) -> str:
    """The compile-only topology that has `devices_needed` chips of `generation` (the
    compile worker, tpu_compile/remote.py, makes the same one by this name)."""
    small, large = TOPOLOGIES[generation]
    return small if devices_needed <= 4 else large


@functools.cache
def compile_device(generation: TpuGeneration, devices_needed: int = 1) -> jax.Device:
    """A compile-only device of `generation` (its topology's first), cached per process."""
    return compile_devices(generation, devices_needed)[0]


@functools.cache
def compile_devices(generation: TpuGeneration, devices_needed: int = 1
                    ) -> tuple[jax.Device, ...]:
    """The devices of a compile-only topology of `generation` with enough chips."""
    from jax.experimental import topologies

    name = topology_name(generation, devices_needed)
    quiet_environment(compiling=True)
    topology = quietly(lambda: topologies.get_topology_desc(name, "tpu"))
    found = tuple(topology.devices)
    if len(found) < devices_needed:
        raise ValueError(f"a {devices_needed}-device call: the largest compile-only"
                         f" {generation.value} topology pallas-check uses ({name}) has"
                         f" {len(found)}")
    return found
