"""Where each buffer of one simulated call lives (`CallBuffers`, a part of
engine/call/state.py's `CallState`): allocation, `pl.run_scoped` scopes, and the registry
that names a buffer by its place in the kernel, so that another device's or core's DMA or
signal aimed at "the same" ref finds its copy there."""

from __future__ import annotations

from typing import Any

import numpy as np

from pallas_check.jaxbridge.types import AbstractValue
from pallas_check.engine.call.describe import MeshInfo, is_semaphore_aval
from pallas_check.engine.call.event_data import Core
from pallas_check.engine.jaxpr.halts import KernelError
from pallas_check.engine.memory.buffer import (Buffer, MemorySpace, RefView,
                                               memory_space_name)
from pallas_check.engine.memory.usage import EverWritten
from pallas_check.findings.finding import SourceFrame


class CallBuffers:
    """The call's buffers by place; CallState sets the fields below."""

    fill_mode: str
    semaphores: list[Buffer]
    registry: dict[tuple[int, int | None, tuple[object, ...]], Buffer]
    scoped_avals: dict[tuple[object, ...], tuple[Any, str]]
    mesh: MeshInfo
    carried: dict[tuple[object, ...], object]
    collective_id: int | None
    ever_written: EverWritten | None

    def fill(self, dtype: np.dtype) -> np.ndarray:
        raise NotImplementedError  # CallState's

    def allocate(self, aval: Any, name: str, default_space: str = MemorySpace.VMEM,
                 owner: str = "") -> Buffer:
        space = memory_space_name(getattr(aval, "memory_space", None), default_space)
        if is_semaphore_aval(aval) or space == MemorySpace.SEMAPHORE:
            buf = Buffer(name, MemorySpace.SEMAPHORE, np.zeros(aval.shape, np.int64), True,
                         owner=owner)
            self.semaphores.append(buf)
            return buf
        return Buffer.filled(name, space, aval.shape, aval.dtype, self.fill_mode, owner=owner)

    def allocate_scoped(self, ctx: Core, aval: AbstractValue, name: str,
                        site: tuple[int, int]) -> RefView:
        """A `pl.run_scoped` allocation. The same program allocates in the same order on
        every device and core, so an allocation is at one address for the whole kernel:
        `site` (the run_scoped equation and the position in it) names it everywhere, and
        what another device sent there before this core entered the scope (a semaphore
        count, a DMA's data) is kept."""
        key = ("scoped",) + site
        self.scoped_avals.setdefault(key, (aval, name))
        buf = self.registry.get((ctx.device_id, ctx.core_id, key))
        if buf is None:
            buf = self.register(self.allocate(aval, name, owner=ctx.actor), ctx.device_id,
                                ctx.core_id, key)
        return RefView(buf)

    def release_scoped(self, ctx: Core, refs: list[RefView]) -> None:
        """The scope ends: its memory holds nothing defined any more (semaphore counts stay,
        as on the chip, and are checked at kernel end)."""
        for ref in refs:
            buf = ref.buffer
            if buf.space != MemorySpace.SEMAPHORE:
                if self.ever_written is not None:
                    self.ever_written.before_reset(buf)
                buf.writable()[...] = self.fill(buf.data.dtype)
                buf.mark_written(Ellipsis, False)

    def register(self, buf: Buffer, device: int, core: int | None,
                 key: tuple[object, ...]) -> Buffer:
        """Name a buffer by its place in the kernel, so that another device's DMA or
        signal aimed at "the same" ref finds this device's copy."""
        buf.key, buf.device, buf.core = key, device, core
        self.registry[(device, core, key)] = buf
        return buf

    def remote(self, buf: Buffer, device: int, frames: tuple[SourceFrame, ...] = (),
               core: int | None = None) -> Buffer:
        """The buffer on `device` (and `core`, when the id names a core of a TensorCore
        mesh) that corresponds to `buf` (a ref of this core)."""
        target_core = buf.core if core is None or buf.core is None else core
        if device == buf.device and target_core == buf.core:
            return buf
        if not 0 <= device < self.mesh.num_devices:
            raise KernelError(f"device id {device} is outside the mesh of"
                              f" {self.mesh.num_devices} devices", frames)
        other = self.registry.get((device, target_core, buf.key))
        if other is None and buf.key == ("barrier",):
            other = self._barrier(device)
        if other is None and buf.key[:1] == ("scoped",) and buf.key in self.scoped_avals:
            # The other core has not entered the scope yet: its allocation is there all
            # the same (same address), and keeps what lands in it.
            aval, name = self.scoped_avals[buf.key]
            owner = (f"device {device} core {target_core}" if self.mesh.num_devices > 1
                     else f"core {target_core}")
            other = self.register(self.allocate(aval, name, owner=owner), device,
                                  target_core, buf.key)
        if other is None:
            where = f"device {device}" + (f" core {target_core}" if core is not None else "")
            raise KernelError(f"{buf.name} has no counterpart on {where}", frames)
        return other

    def barrier_semaphore(self, ctx: Core) -> RefView:
        return RefView(self._barrier(ctx.device_id))

    def _barrier(self, device: int) -> Buffer:
        """A device's barrier semaphore; its count carries over to the next call."""
        buf = self.registry.get((device, None, ("barrier",)))
        if buf is None:
            count = self.carried.get(("barrier", self.collective_id, device), 0)
            buf = Buffer("barrier_semaphore", MemorySpace.SEMAPHORE,
                         np.array(count, np.int64), True)
            self.register(buf, device, None, ("barrier",))
            self.semaphores.append(buf)
        return buf

    def save_carried(self) -> None:
        for (device, _, key), buf in self.registry.items():
            if key == ("barrier",):
                self.carried[("barrier", self.collective_id, device)] = int(buf.data)
