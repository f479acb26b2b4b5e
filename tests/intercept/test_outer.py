"""The hook on JAX's dispatch (intercept/outer.py): what it keeps off JAX's C++ fast path."""

from __future__ import annotations

from pallas_check.intercept import outer


class _Call:
    has_host_callbacks = True


class _Executable:
    unsafe_call = _Call()


def test_no_program_that_calls_back_into_python_gets_the_fast_path(monkeypatch):
    """JAX's C++ cache outlives the session (patched_lowering.install keys JAX's caches
    rather than emptying them): an executable that calls back into Python -- every one that
    runs an intercepted kernel -- is refused its entry there, one that does not gets it."""
    monkeypatch.setattr(outer, "_saved", {"impl": None, "fastpath": lambda *a, **k: "data"})
    monkeypatch.setattr(_Call, "has_host_callbacks", True)
    assert outer._fastpath_data(_Executable(), "tree") is None
    monkeypatch.setattr(_Call, "has_host_callbacks", False)
    assert outer._fastpath_data(_Executable(), "tree") == "data"
