"""Which device and core a remote DMA or semaphore signal targets: a kernel's device id
(logical, or mesh coordinates) read against the call's mesh, and a view moved onto that
device's memory.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pallas_check.engine.dma.engine import DmaCore
from pallas_check.engine.jaxpr.halts import CallHalted, KernelError
from pallas_check.engine.jaxpr.program import current_frames
from pallas_check.engine.memory.buffer import RefView
from pallas_check.engine.verdicts import LostTransfer


def target_device(ctx: DmaCore, device_id: object, device_id_type: object
                  ) -> tuple[int, int | None]:
    """The logical device, and the core when the id names one, that a DMA or signal is
    aimed at. A device id resolves over every named axis: the shard_map mesh's and, in a
    kernel over a TensorCore mesh (core_map / pl.kernel), the core axes; core None means
    "the same core as the sender"."""
    if device_id is None:
        return ctx.device_id, None
    mesh = ctx.call.mesh
    names = [name for name, _ in mesh.axes]
    core_sizes = ctx.core_mesh_sizes()
    if isinstance(device_id, dict):
        unknown = [k for k in device_id if k not in names and k not in core_sizes]
        if unknown:
            known = ", ".join(map(str, [*names, *core_sizes])) or "none"
            raise KernelError(f"device id names the axis {unknown[0]!r}, which is not an axis"
                              f" of this call (axes: {known})", current_frames(ctx))
        coords = mesh.coords(ctx.device_id)
        coords.update({k: int(np.asarray(v)) for k, v in device_id.items() if k in names})
        cores = {k: int(np.asarray(v)) for k, v in device_id.items() if k in core_sizes}
        return _on_mesh(ctx, coords), _core_index(ctx, cores) if cores else None
    ids = device_id if isinstance(device_id, (tuple, list)) else (device_id,)
    ids = [int(np.asarray(x)) for x in ids]
    logical = getattr(device_id_type, "name", str(device_id_type)).upper().endswith("LOGICAL")
    if core_sizes and not logical and len(ids) == len(names) + len(core_sizes):
        device = _on_mesh(ctx, dict(zip(names, ids))) if names else ctx.device_id
        return device, _core_index(ctx, dict(zip(core_sizes, ids[len(names):])))
    if len(ids) == 1 and (logical or len(names) <= 1):
        if not 0 <= ids[0] < mesh.num_devices:
            _device_out_of_bounds(ctx, f"device id {ids[0]}", "device id")
        return ids[0], None
    if len(ids) == len(names):
        return _on_mesh(ctx, dict(zip(names, ids))), None
    raise KernelError(f"device id {tuple(ids)} does not match the mesh axes {names}",
                      current_frames(ctx))


def _on_mesh(ctx: DmaCore, coords: dict[str, int]) -> int:
    """The logical device at mesh coordinates, each of which must be on its axis."""
    mesh = ctx.call.mesh
    for name, size in mesh.axes:
        if not 0 <= coords[name] < size:
            shown = ", ".join(f"{n}={coords[n]}" for n, _ in mesh.axes)
            _device_out_of_bounds(ctx, f"device id ({shown})", f"coordinate {coords[name]} of"
                                  f" axis {name!r} (size {size})")
    return mesh.logical(coords)


def _device_out_of_bounds(ctx: DmaCore, device: str, what: str) -> None:
    """A DMA or signal aimed outside the mesh: the kernel's bug, an out-of-bounds finding;
    the call stops there (what would the DMA have done?)."""
    state = ctx.call
    state.device_out_of_bounds(ctx, device, what, current_frames(ctx))
    raise CallHalted()


def _core_index(ctx: DmaCore, cores: dict[str, int]) -> int:
    """A core of the TensorCore mesh, by its coordinates (others: the sender's own)."""
    sizes = ctx.core_mesh_sizes()
    coords = {**ctx.core_coords, **cores}
    index = 0
    for name, size in sizes.items():
        if not 0 <= coords[name] < size:
            raise KernelError(f"core {coords[name]} of axis {name!r} is outside the"
                              f" TensorCore mesh (size {size})", current_frames(ctx))
        index = index * size + coords[name]
    return index


def on_device(ctx: DmaCore, view: RefView, target: tuple[int, int | None]) -> RefView:
    """The same ref on another device or core (a remote DMA's destination, a remote
    signal)."""
    device, core = target
    if device == view.buffer.device and (core is None or core == view.buffer.core):
        return view
    other = ctx.call.remote(view.buffer, device, current_frames(ctx), core)
    return RefView(other, view.transforms)


def _with_core(ctx: DmaCore, target: tuple[int, int | None], core_index: object
               ) -> tuple[int, int]:
    """A signal's target with `core_index` (`pl.semaphore_signal(..., core_index=i)`): the
    semaphore of core i of the target device, a TensorCore of the chip (`--cores`) or a
    core of the kernel's TensorCore mesh, counted as the cores' ids are."""
    if target[1] is not None:
        raise KernelError("Cannot specify both `core_index` and the core axis in"
                          " `device_id` (Mosaic lowering)", current_frames(ctx))
    core = int(np.asarray(core_index))
    cores = ctx.call.cores_per_device
    if not 0 <= core < cores:
        raise KernelError(f"core_index {core} is outside the {cores} TensorCore(s) of the"
                          f" device (--cores, or the kernel's TensorCore mesh)",
                          current_frames(ctx))
    return target[0], core


def on_serial_chip(ctx: DmaCore, target: tuple[int, int | None], what: str
                   ) -> tuple[int, int | None] | None:
    """Where a signal or DMA (`what`) addressed to `target` goes when the call's mesh runs
    its cores one after another on a chip with one TensorCore (engine/call/serial.py, as
    a v5e did): core 0 is the chip's TensorCore, which is running the sender, so it reaches
    the sender's own core; core k > 0 is no core of the chip, and it is lost (None: the
    caller does nothing more). Elsewhere `target` as it is."""
    device, core = target
    if core is None or not ctx.call.serial_cores:
        return target
    if core == 0:
        return device, ctx.core_id
    ctx.call.sync.lost.append(LostTransfer(what, ctx.actor, core, current_frames(ctx)))
    return None
