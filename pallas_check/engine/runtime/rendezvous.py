"""Where the devices of one multi-device pallas_call meet.

Under `shard_map` each device's host callback arrives on its own thread. The k-th call of
every device is the same pallas_call, so callbacks are matched by a per-device sequence
number; the last device to arrive runs the one simulation of all devices (`run`), the
others wait and take their own outputs.
"""

from __future__ import annotations

import threading
from typing import Callable, Sequence, TypeVar, cast

T = TypeVar("T")
R = TypeVar("R")


TIMEOUT_S = 600.0


class RendezvousTimeout(Exception):
    """A device waited too long for the other devices' callbacks of the same call."""


class _Meeting:
    """One multi-device pallas_call while its devices' callbacks arrive."""

    def __init__(self) -> None:
        # (each device's operands and outputs, of the types its `meet` names)
        self.operands: dict[int, Sequence[object] | None] = {}
        self.outputs: Sequence[object] | None = None
        self.error: BaseException | None = None
        self.abandoned = False  # a device stopped waiting (its operands are gone)
        self.done = threading.Event()


class Rendezvous:
    def __init__(self, timeout_s: float = TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._device_calls: dict[int, int] = {}
        self._meetings: dict[int, _Meeting] = {}

    def meet(self, device: int, num_devices: int, operands: Sequence[T],
             run: Callable[[list[Sequence[T]]], Sequence[R]]) -> R:
        """Hand in this device's operands; return this device's outputs of `run`, which is
        called once, with every device's operands in device order, while every device's
        callback is still inside `meet`."""
        with self._lock:
            seq = self._device_calls.get(device, 0)
            self._device_calls[device] = seq + 1
            meeting = self._meetings.setdefault(seq, _Meeting())
            meeting.operands[device] = operands
            last = len(meeting.operands) == num_devices
            if last:
                del self._meetings[seq]
        if last:
            try:
                if meeting.abandoned:
                    raise RendezvousTimeout(
                        f"device {device} arrived after another device of the same"
                        f" pallas_call stopped waiting for it")
                meeting.outputs = run([cast("Sequence[T]", meeting.operands[d])
                                       for d in range(num_devices)])
            except BaseException as exc:
                meeting.error = exc
            finally:
                meeting.done.set()
        elif not meeting.done.wait(timeout=self.timeout_s):
            with self._lock:
                if not meeting.done.is_set():
                    # This device's call fails now: a device arriving later must not be
                    # simulated together with it (its operands are from a dead call).
                    meeting.operands[device] = None
                    meeting.abandoned = True
            if not meeting.done.is_set():
                raise RendezvousTimeout(
                    f"device {device} waited {self.timeout_s:.0f} s for the other devices'"
                    f" callbacks of the same pallas_call; they never came")
            meeting.done.wait()
        if meeting.error is not None:
            raise meeting.error
        assert meeting.outputs is not None
        return cast(R, meeting.outputs[device])
