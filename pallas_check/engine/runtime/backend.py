"""The engine's own CPU client: every computation the engine starts runs there.

The engine runs inside a host callback of the user's computation. Computations it started
on JAX's default CPU client could queue behind work of the user's that waits for that very
callback (a jitted kernel in a loop hung this way). A private client shares no queue, thread
pool or device with the user's runtime, so nothing the engine runs can wait on the callback
it runs in. It is synchronous: the engine's small segments execute inline on the calling
thread.
"""

from __future__ import annotations

import functools
import threading
from typing import TYPE_CHECKING, Protocol, Sequence

import numpy as np
from jax.sharding import SingleDeviceSharding

from pallas_check.jaxbridge import xla_client
from pallas_check.jaxbridge.types import ShapedArray

if TYPE_CHECKING:  # only for annotations
    import jax


_lock = threading.Lock()


class _Client(Protocol):
    def devices(self) -> list[jax.Device]: ...


@functools.cache
def _client() -> _Client:
    client: _Client = xla_client().make_cpu_client(asynchronous=False)
    return client


def engine_device() -> jax.Device:
    """The device of the engine's private CPU client (created on first use)."""
    with _lock:
        return _client().devices()[0]


def started() -> bool:
    """Whether the private client exists in this process (then so do its threads: a
    process forked from this one cannot use XLA; process/children.py)."""
    return _client.cache_info().currsize > 0


def lend_to_engine(arrays: Sequence[np.ndarray]) -> list[jax.Array]:
    """Host arrays as arrays of the engine's device, lent (zero-copy) where XLA's alignment
    allows, else copied: what `jax.device_put(arrays, engine_device(), may_alias=True)`
    makes, put one by one through the XLA client. A compiled call puts its operands at
    every run, and `jax.device_put`'s own dispatch (tree flattening, abstracting each
    value, sharding checks) costs 4-5x the puts themselves (paged attention's five
    operands: about 180 us against 45). The arrays lent must outlive what is made of them."""
    device = engine_device()
    sharding = _placement(device)
    put = xla_client().batched_device_put
    return [put(ShapedArray(array.shape, array.dtype), sharding, [array], [device], True)
            for array in arrays]


@functools.cache
def _placement(device: jax.Device) -> SingleDeviceSharding:
    """The sharding that places an array on `device`, made once (it caches its hash)."""
    return SingleDeviceSharding(device)
