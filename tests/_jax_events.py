"""What JAX reports while a block runs: the names of the functions behind each of one
kind of JAX's monitoring events (which programs XLA compiled, which jaxprs were lowered or
traced). Tests count them to show what a cache spared."""

from __future__ import annotations

import contextlib
from typing import Iterator

import jax

BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"
JAXPR_TRACE = "/jax/core/compile/jaxpr_trace_duration"
LOWERED = "/jax/core/compile/jaxpr_to_mlir_module_duration"


@contextlib.contextmanager
def events(event_name: str = BACKEND_COMPILE) -> Iterator[list[str]]:
    """The function names of the `event_name` events JAX records while open."""
    names: list[str] = []

    def listen(event: str, seconds: float, **kwargs: object) -> None:
        if event == event_name:
            names.append(str(kwargs.get("fun_name")))

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        yield names
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
