"""What a plain program of the script is, before JAX lowers it: the key under which
jaxbridge/program_store.py finds its executable on disk without lowering it.

Why: keyed by the lowered module (JAX's own key), a warm run still lowered every plain
program to find its key -- 650 to 750 lowerings, a third of a warm suite run
(benchmarks/README.md, issue 55). Here a program is keyed by what JAX's dispatch is about to lower, as
engine/jaxpr/segment_cache.py keys the engine's own segments. A false hit would silently run
the wrong executable, so the key holds everything that decides the compiled program, and
anything this module cannot spell out faithfully refuses the key (`dispatch_identity` says
why): the program is then lowered as JAX does, and kept under JAX's key after all.

The key (`dispatch_identity`), part by part, and why each is there:

- The closed jaxpr, written out by `_Writer`: per equation the primitive (its name and
  class), every operand and result with its type, every parameter, and the equation's
  context (compute type, abstract mesh, XLA metadata, threefry mode: each changes the
  lowering). A nested jaxpr (cond branches, scan and while bodies, jit/closed_call and
  custom_jvp/custom_vjp call jaxprs, remat) is written out in place, recursively; of a
  custom_jvp/custom_vjp call only the call jaxpr, which is all JAX's rule lowers (its other
  parameters are differentiation rules: functions). Variables
  are numbered in order of appearance, so two tracings of the same code write the same
  text. Values are never printed (numpy summarizes a large array with "..."): every
  literal's and every constant's bytes are hashed with its dtype, shape and type. The
  jaxpr's debug info and source lines are left out: they name, they do not compute.
- The operands' types (aval with dtype, shape, weak type, sharding, memory space), their
  resolved shardings (committed or not, on which device) and layouts, the donated operands
  (aliasing is compiled in), keep_unused, inline, the jit's name (cheap, only a name), the
  compiler options and the context mesh.
- The device the program is compiled for and loaded onto: its platform, id, kind, process,
  the backend's version and whether it is JAX's client or another (an executable is loaded
  by device id, and the engine's private CPU client has a device 0 too).
- JAX's settings: every value of JAX's trace context by name (x64, the default matmul
  precision, shardy, the PRNG's threefry mode, dtype and rank promotion, pallas-check's
  chip arithmetic and program owner...), every other value of JAX's configuration (the
  compile options' knobs: optimization effort and level, remat pass...), and XLA_FLAGS.
- Through the store (engine/runtime/disk_cache.py `ScriptPrograms.identity_key`):
  pallas-check's own code (the lowering rules it patches, this key's own making), JAX's and
  jaxlib's versions and this machine's CPU.

Refused (no key): a jaxpr or equation with effects, a program that calls back into Python
(pure_callback, io_callback, debug callbacks: by primitive name or effect, anywhere), one
holding a pallas_call or a `pl.kernel` (the session intercepts it: it must always lower), an
FFI call (a target registered at run time), a primitive that is not JAX's own or whose CPU
lowering rule is neither JAX's nor pallas-check's (a user's rule can change without the
jaxpr changing), a parameter that is a function or prints with an object address or a
summary ("..."), a constant or literal that is not a plain array, a sharding or mesh over
concrete devices other than one device's, explicit in/out shardings or layouts, anything not
for one device of the host CPU, and a trace context inside a transformation (an axis
environment).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import os
import threading
import weakref
from typing import Iterable, Mapping, Sequence, cast

import jax
import numpy as np

from jax._src import config as _config
from jax._src import core as _core
from jax._src import dispatch as _dispatch
from jax._src import pjit as _pjit
from jax._src.random import prng as _prng
from jax._src.interpreters import pxla as _pxla

from pallas_check.jaxbridge import primitive_owners


class _Refused(Exception):
    """The program cannot be keyed faithfully (the message says why)."""


@dataclasses.dataclass(frozen=True)
class Identity:
    """What a dispatched program is (`text`, hashed by the store), and the one device it is
    compiled for (an entry is loaded onto it)."""

    text: str
    device: jax.Device


# The parameters JAX's dispatch lowers with (`_pjit_call_impl_python`); another set (a JAX
# whose dispatch passes something else) is refused.
_DISPATCH_PARAMS = frozenset({
    "jaxpr", "in_shardings", "out_shardings", "in_layouts", "out_layouts", "donated_invars",
    "ctx_mesh", "name", "keep_unused", "inline", "compiler_options_kvs"})

# Primitives whose program is never keyed: they call into this process (the session's
# kernel interception, Python callbacks, an FFI target registered at run time).
_NEVER = frozenset({"pallas_call", "mpmd_map", "pure_callback", "io_callback",
                    "debug_callback", "debug_print", "ffi_call"})

# Primitives whose lowering reads one parameter only (JAX 0.10's
# `_custom_jvp_vjp_call_lowering` reads `call_jaxpr`): the others are differentiation
# rules (functions, thunks), which the lowered program does not contain. Trusted only while
# the registered rule is that function.
_LOWERED_FROM = {"custom_jvp_call": "call_jaxpr", "custom_vjp_call": "call_jaxpr"}
_CALL_LOWERING = "_custom_jvp_vjp_call_lowering"

_Shardings = Sequence["_pjit.PjitSharding"]


def dispatch_identity(arg_types: Sequence[object], params: Mapping[str, object]
                      ) -> Identity | str:
    """The key of the program JAX's dispatch is about to lower for these operands
    (`MetaTy`s) and jit params, or why it is refused (see the module)."""
    try:
        return _identity(arg_types, params)
    except _Refused as refused:
        return str(refused)
    except Exception as exc:  # noqa: BLE001 - anything unforeseen: lowered as JAX does
        return f"{type(exc).__name__}: {exc}"


def _identity(arg_types: Sequence[object], params: Mapping[str, object]) -> Identity:
    if set(params) != _DISPATCH_PARAMS:
        raise _Refused(f"dispatch params {sorted(params)}")
    closed, mesh = params["jaxpr"], params["ctx_mesh"]
    if not isinstance(closed, _core.ClosedJaxpr) or not isinstance(mesh, _MESHES):
        raise _Refused("dispatch params of other types")
    in_s, out_s = _items(params["in_shardings"]), _items(params["out_shardings"])
    in_layouts = _items(params["in_layouts"])
    if not all(isinstance(s, _pxla.UnspecifiedValue) for s in in_s + out_s):
        raise _Refused("explicit in/out shardings")
    if any(layout is not None for layout in in_layouts + _items(params["out_layouts"])):
        raise _Refused("explicit layouts")
    if not mesh.empty:
        raise _Refused("a context mesh")
    resolved = _items(_pjit._resolve_in_shardings(arg_types, cast(_Shardings, in_s)))
    if any(layout is not None for layout in _items(_pjit._resolve_in_layouts(
            arg_types, in_layouts, resolved, closed.in_avals))):
        raise _Refused("operand layouts")
    device = _device(resolved)
    digest = jaxpr_digest(closed)
    writer = _Writer()
    parts = [
        "dispatch 1",
        digest,
        settings_text(),
        "operands " + " ".join(_meta_text(writer, m) for m in arg_types),
        "shardings " + " ".join(writer.value(s) for s in resolved),
        "donated " + writer.value(params["donated_invars"]),
        f"keep_unused {writer.value(params['keep_unused'])}",
        f"inline {writer.value(params['inline'])}",
        "options " + writer.value(params["compiler_options_kvs"]),
        "mesh " + writer.value(mesh),
        "name " + writer.value(params["name"]),
        "device " + device_text(device),
        "values " + writer.digest.hexdigest(),  # (arrays met on the way, if any)
    ]
    return Identity("\n".join(parts), device)


def _items(value: object) -> tuple[object, ...]:
    if not isinstance(value, (tuple, list)):
        raise _Refused(f"a {type(value).__name__} where JAX passes a tuple")
    return tuple(value)


def _device(resolved: Iterable[object]) -> jax.Device:
    """The one CPU device the program will be compiled for: the committed operands' (one
    device's sharding each, all the same), else JAX's default device."""
    devices: set[jax.Device] = set()
    for sharding in resolved:
        if isinstance(sharding, _pxla.UnspecifiedValue):
            continue
        if not isinstance(sharding, jax.sharding.SingleDeviceSharding):
            raise _Refused(f"operand sharding {type(sharding).__name__}")
        devices |= set(sharding.device_set)
    if len(devices) > 1:
        raise _Refused("operands on several devices")
    device: jax.Device = devices.pop() if devices else _pxla.get_default_device()
    if jax.process_count() != 1:
        raise _Refused("several processes")
    if device.platform != "cpu" or device.client.platform != "cpu":
        raise _Refused(f"not for the CPU ({device.platform})")
    return device


def device_text(device: jax.Device) -> str:
    """A device as the key names it; whether it is of JAX's own client for its platform or
    of another (the engine's private CPU client numbers its device 0 too)."""
    own = device.client is jax.devices(device.platform)[0].client
    return (f"{device.platform} {device.id} {device.device_kind!r} {device.process_index}"
            f" {device.client.platform_version!r} {'jax' if own else 'other'}-client")


def _meta_text(writer: "_Writer", meta: object) -> str:
    """An operand as the dispatch sees it (JAX's `MetaTy`): its type, sharding,
    committedness and kind."""
    fields = ("sharding", "committed", "is_np_array")
    return (f"({writer.aval(getattr(meta, 'aval'))} "
            + " ".join(writer.value(getattr(meta, f)) for f in fields) + ")")


# -- JAX's settings -------------------------------------------------------------------------

def settings_text() -> str:
    """Every value of JAX's trace context by name, every value of its configuration, and
    XLA_FLAGS (see the module)."""
    writer = _Writer()
    lines = []
    for name, value in zip(_config.trace_context_names(), _config.trace_context()):
        if name == "axis_env_state":
            if value.axis_sizes or value.spmd_axis_names or value.explicit_mesh_axis_names:
                raise _Refused("inside a transformation's axis environment")
            lines.append(f"{name}=empty")
        else:
            lines.append(f"{name}={writer.value(value)}")
    for name, value in sorted(jax.config.values.items()):
        lines.append(f"{name}:{writer.value(value)}")
    lines.append("XLA_FLAGS=" + repr(os.environ.get("XLA_FLAGS", "")))
    lines.append("values " + writer.digest.hexdigest())  # (arrays met on the way, if any)
    return "\n".join(lines)


# -- the jaxpr --------------------------------------------------------------------------------

_digests: "weakref.WeakKeyDictionary[_core.ClosedJaxpr, str | BaseException]" = (
    weakref.WeakKeyDictionary())
_digests_lock = threading.Lock()


def jaxpr_digest(closed: _core.ClosedJaxpr) -> str:
    """The closed jaxpr written out and hashed (`_Writer`); worked out once per jaxpr object
    (JAX's own lowering cache is keyed by that object too). Raises `_Refused`."""
    with _digests_lock:
        found = _digests.get(closed)
    if found is None:
        found = _digest_of(closed)
        try:
            with _digests_lock:
                _digests[closed] = found
        except TypeError:  # not weakly referenceable: written out again next time
            pass
    if isinstance(found, BaseException):
        raise _Refused(str(found))
    return found


def _digest_of(closed: _core.ClosedJaxpr) -> str | BaseException:
    """The digest, or why there is none (remembered: refused again, at once)."""
    try:
        writer = _Writer()
        writer.closed(closed)
        if _has_intermediate_shardings(closed):
            raise _Refused("shardings inside the program")
        return writer.digest.hexdigest()
    except Exception as exc:  # noqa: BLE001 - (a jaxpr this JAX writes otherwise)
        return exc


class _Writer:
    """Writes a jaxpr into a hash, every part of it spelled out (see the module)."""

    def __init__(self) -> None:
        self.digest = hashlib.sha256()
        self.names: dict[int, int] = {}
        self.held: list[object] = []  # (numbered objects kept alive: ids stay unique)

    def put(self, text: str) -> None:
        self.digest.update(text.encode())
        self.digest.update(b"\n")

    def closed(self, closed: _core.ClosedJaxpr) -> str:
        if closed.jaxpr.effects:
            raise _Refused(f"effects {closed.jaxpr.effects}")
        self.put(f"closed {len(closed.consts)}")
        for const in closed.consts:
            self.array(const)
        return self.jaxpr(closed.jaxpr)

    def jaxpr(self, jaxpr: _core.Jaxpr) -> str:
        if jaxpr.effects:
            raise _Refused(f"effects {jaxpr.effects}")
        self.put("{ const " + " ".join(map(self.binder, jaxpr.constvars))
                 + " ; in " + " ".join(map(self.binder, jaxpr.invars)))
        for eqn in jaxpr.eqns:
            self.eqn(eqn)
        self.put("out " + " ".join(map(self.atom, jaxpr.outvars)) + " }")
        return "jaxpr"

    def eqn(self, eqn: _core.JaxprEqn) -> None:
        primitive = eqn.primitive
        name = primitive.name
        if name in _NEVER or "callback" in name:
            raise _Refused(f"primitive {name}")
        if eqn.effects:
            raise _Refused(f"effects of {name}")
        if not primitive_owners.trusted(primitive):
            raise _Refused(f"primitive {name} is not JAX's, or not lowered by JAX")
        operands = " ".join(map(self.atom, eqn.invars))
        results = " ".join(map(self.binder, eqn.outvars))
        params: Mapping[str, object] = eqn.params
        only = _LOWERED_FROM.get(name)
        if only is not None and primitive_owners.rule_name(primitive) == _CALL_LOWERING:
            params = {only: params[only]}
        self.put(f"eqn {name} {_qualified(type(primitive))} ctx {self.value(eqn.ctx)}"
                 f" ({operands}) -> ({results})")
        for key in sorted(params):
            self.put(f"  {key}={self.value(params[key])}")

    def number(self, obj: object) -> int:
        number = self.names.get(id(obj))
        if number is None:
            number = self.names[id(obj)] = len(self.names)
            self.held.append(obj)
        return number

    def binder(self, var: _core.Var) -> str:
        if isinstance(var, _core.DropVar):
            return "_:" + self.aval(var.aval)
        return f"v{self.number(var)}:{self.aval(var.aval)}"

    def atom(self, atom: _core.Atom) -> str:
        if isinstance(atom, _core.Literal):
            return f"lit({self.aval(atom.aval)} {self.array(atom.val)})"
        return f"v{self.number(atom)}"

    def aval(self, aval: object) -> str:
        if isinstance(aval, _core.AbstractToken):
            return "token"
        if type(aval) is not _core.ShapedArray:
            raise _Refused(f"aval {type(aval).__name__}")
        shape = tuple(aval.shape)
        if not all(type(d) is int for d in shape):
            raise _Refused("a dynamic shape")
        return (f"{_dtype_text(aval.dtype)}{list(shape)} weak={bool(aval.weak_type)}"
                f" {self.value(aval.sharding)} {self.value(aval.memory_space)}"
                f" {self.value(getattr(aval, 'vma', None))}")

    def array(self, value: object) -> str:
        """A constant's or literal's value: its bytes hashed with its type (never printed)."""
        kind = type(value)
        if isinstance(value, jax.Array):
            if jax.dtypes.issubdtype(value.dtype, jax.dtypes.extended):
                raise _Refused("a constant of an extended dtype")
            if len(value.sharding.device_set) != 1 or not value.is_fully_addressable:
                raise _Refused("a constant over several devices")
            data = np.asarray(value)
        elif isinstance(value, (np.ndarray, np.generic, bool, int, float, complex)):
            data = np.asarray(value)
        else:
            raise _Refused(f"a constant of type {kind.__name__}")
        if data.dtype.kind not in "biufc" and data.dtype.name not in _ML_DTYPES:
            raise _Refused(f"a constant of dtype {data.dtype}")
        weak = getattr(value, "weak_type", None)
        self.put(f"array {_qualified(kind)} {data.dtype.name} {data.dtype.str}"
                 f" {list(data.shape)} weak={weak!r}")
        self.digest.update(np.ascontiguousarray(data).tobytes())
        self.digest.update(b"\n")
        return f"a{self.number(value)}"

    def value(self, value: object) -> str:
        """A parameter (or setting) spelled out, nested jaxprs and arrays written into the
        hash; refused where it cannot be spelled out faithfully."""
        if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
            return f"{type(value).__name__}:{value!r}"
        if isinstance(value, np.dtype) or _is_dtype(value):
            return "dtype:" + _dtype_text(value)
        if isinstance(value, enum.Enum):
            return f"{_qualified(type(value))}.{value.name}={self.value(value.value)}"
        if isinstance(value, type):
            return "type:" + _qualified(value)
        if isinstance(value, _core.ClosedJaxpr):
            return self.closed(value)
        if isinstance(value, _core.Jaxpr):
            return self.jaxpr(value)
        if isinstance(value, (np.ndarray, np.generic, jax.Array)):
            return self.array(value)
        if isinstance(value, (tuple, list)):
            return f"{_qualified(type(value))}(" + ",".join(map(self.value, value)) + ")"
        if isinstance(value, (frozenset, set)):
            return f"{_qualified(type(value))}{{" + ",".join(sorted(map(self.value, value))) + "}"
        if isinstance(value, Mapping):
            items = sorted((self.value(k), self.value(v)) for k, v in value.items())
            return f"{_qualified(type(value))}{{" + ",".join(f"{k}:{v}" for k, v in items) + "}"
        return self._other(value)

    def _other(self, value: object) -> str:
        if isinstance(value, jax.sharding.Mesh) and not value.empty:
            raise _Refused("a mesh of concrete devices")
        if isinstance(value, jax.sharding.NamedSharding) \
                and not isinstance(value.mesh, jax.sharding.AbstractMesh) \
                and not value.mesh.empty:
            raise _Refused("a sharding over a mesh of concrete devices")
        if isinstance(value, jax.sharding.Sharding) and not isinstance(
                value, (jax.sharding.NamedSharding, jax.sharding.SingleDeviceSharding)):
            raise _Refused(f"a sharding {type(value).__name__}")
        if callable(value) and not isinstance(value, _MESHES):
            raise _Refused(f"a function parameter {type(value).__name__}")
        if dataclasses.is_dataclass(value):  # every field, also those its repr leaves out
            fields = ",".join(f"{f.name}={self.value(getattr(value, f.name))}"
                              for f in dataclasses.fields(value))
            return f"{_qualified(type(value))}({fields})"
        text = repr(value)
        if " at 0x" in text or "..." in text:
            raise _Refused(f"a parameter that prints as {text[:60]!r}")
        return f"{_qualified(type(value))}:{text}"


_MESHES = (jax.sharding.Mesh, jax.sharding.AbstractMesh)  # (context managers: callable)
_ML_DTYPES = frozenset({"bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3b11fnuz",
                        "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e4m3", "float8_e3m4",
                        "float8_e8m0fnu", "float4_e2m1fn", "int4", "uint4", "int2", "uint2"})


def _qualified(kind: type) -> str:
    return f"{kind.__module__}.{kind.__qualname__}"


def _is_dtype(value: object) -> bool:
    return isinstance(value, _prng.KeyTy)


def _dtype_text(dtype: object) -> str:
    """A dtype by name; a typed PRNG key's by its implementation, which must be the one
    registered under that name (its functions are compiled in)."""
    if isinstance(dtype, _prng.KeyTy):
        impl = dtype._impl
        if _prng.prngs.get(impl.name) is not impl:
            raise _Refused(f"an unregistered PRNG implementation {impl.name}")
        return f"key<{impl.name}>"
    if not isinstance(dtype, np.dtype):
        raise _Refused(f"a dtype {type(dtype).__name__}")
    if dtype.kind not in "biufc" and dtype.name not in _ML_DTYPES:
        raise _Refused(f"dtype {dtype}")
    return f"{dtype.name}/{dtype.str}"


def _has_intermediate_shardings(closed: _core.ClosedJaxpr) -> bool:
    """Whether a program places values on devices inside (a sharding constraint, a nested
    jit's shardings, a device_put to a memory kind): the device it runs on is then not
    the operands' alone."""
    found = _dispatch.get_intermediate_shardings(closed.jaxpr)
    return any(not isinstance(s, _pxla.UnspecifiedValue) for s, _ in found)
