"""Rules for the kernel author's own checks and prints: `pl.debug_check` and
`pl.debug_print`.

Both would otherwise run inside a compiled pure segment, where XLA's CPU lowering of a
debug check is a no-op (the check is dropped: a failing assertion ran clean) and a debug
print is written by XLA's host callback at every re-run of the call, saying nothing of
which core or grid step printed it. As rules they run where the kernel runs them, with the
core's context: a failing check goes to the checkers (a `check-failed` finding), a print
to the call's list of prints, which the session writes after the call (the engine never
prints).

`pl.debug_check(cond, msg)` reaches the kernel jaxpr as `check_p` with `debug=True`
whether or not `pl.enable_debug_checks()` is on: JAX decides at lowering time (the Mosaic
rule emits the assertion only with the flag on, else nothing). pallas-check evaluates it
always, so that an assertion is checked without the author having to turn it on
(except under --skip-floats, where the values it may be about are not computed).
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np
from pallas_check.jaxbridge import params as eqn_params
from pallas_check.jaxbridge.primitives import check_p, debug_print_p
from pallas_check.jaxbridge.types import JaxprEqn

from pallas_check.engine.jaxpr.registry import rule
from pallas_check.engine.seam import RunningCore


@rule(check_p)
def _debug_check(ctx: RunningCore, eqn: JaxprEqn, invals: Sequence[object]) -> list[object]:
    """An assertion of the kernel: nothing when it holds; else a finding with its message
    (its values formatted) at this core's grid step. Not under --skip-floats: float
    values are not computed there (they read as inf), and a check may be about them."""
    if ctx.config.skip_floats:
        return []
    error = jax.tree_util.tree_unflatten(eqn_params.check_error_tree(eqn),
                                         [np.asarray(v) for v in invals])
    if not eqn_params.any_check_failed(error):
        return []  # the common case: the check holds
    exception = error.get_exception()
    if exception is None:
        return []
    message, check = _check_message(exception)
    ctx.call.check_failed(ctx, message, check)
    return []


def _check_message(exception: Exception) -> tuple[str, str]:
    """The failed check's message with its values, and the message as written (which
    tells one check from another on the same line)."""
    fmt = getattr(exception, "fmt_string", None)
    if fmt is None:  # another checkify error (not a debug_check): JAX's own wording
        return str(exception), type(exception).__name__
    try:
        # (a checkify FailedCheckError: its values' args and kwargs)
        return fmt.format(*exception.args, **getattr(exception, "kwargs")), fmt
    except (IndexError, KeyError, ValueError):  # a format the values do not fit
        return fmt, fmt


@rule(debug_print_p)
def _debug_print(ctx: RunningCore, eqn: JaxprEqn, invals: Sequence[object]) -> list[object]:
    """A print of the kernel, formatted as JAX formats it, recorded with the core and
    grid step that printed it."""
    if ctx.call.report and not ctx.config.quiet_prints:
        ctx.call.kernel_print(ctx, print_text(eqn_params.params_of(eqn), invals))
    return []


def print_text(params: dict[str, Any], invals: Sequence[object]) -> str:
    """The text of one `pl.debug_print` / `jax.debug.print`: the format string with the
    values (placeholders), or followed by them (no placeholders, as on a TPU)."""
    printed = eqn_params.print_format(params)
    static = dict(printed.static_args)
    dynamic = iter(invals)
    leaves = [static[i] if i in static else np.asarray(next(dynamic))
              for i in range(len(static) + len(invals))]
    args, kwargs = jax.tree_util.tree_unflatten(printed.in_tree, leaves)
    fmt = printed.fmt
    if not printed.has_placeholders:
        return " ".join((fmt, *(str(a) for a in args)))
    with np.printoptions(**dict(printed.np_printoptions)):
        return fmt.format(*args, **kwargs)
