"""The names of pallas-check's environment variables, in one place.

Each option of the table (options.py) is also a variable: `PALLAS_CHECK_` and its settings
key in capitals (`skip-floats` -> PALLAS_CHECK_SKIP_FLOATS; read by layers.py). Four
variables are no option: PALLAS_CHECK_DEBUG, for bug reports, PALLAS_CHECK_CACHE_DIR,
where compiled programs are kept between processes, PALLAS_CHECK_COMPILE_BUDGET, the
compiled tier's build budget, and PALLAS_CHECK_TEST_COMPILER_ABORT, a test hook. Imports nothing of ours, so that any module (the TPU compile stage too) can ask whether debugging was asked for.
"""

from __future__ import annotations

import os

# Every environment variable of ours starts so; an option's is ENV_PREFIX + its key.
ENV_PREFIX = "PALLAS_CHECK_"
# Our one variable that is no option: a traceback instead of a one-line error, errors not
# shortened, libtpu's start-up output kept.
DEBUG_VARIABLE = ENV_PREFIX + "DEBUG"
# Where our own compiled programs are kept between processes (engine/runtime/disk_cache.py);
# `off` keeps none.
CACHE_VARIABLE = ENV_PREFIX + "CACHE_DIR"
# The time budget, in seconds, of every compiled tier build under `--tier auto`
# (intercept/builds.py), in place of the one derived from the engine's time: tests make a
# build overrun with 0.
COMPILE_BUDGET_VARIABLE = ENV_PREFIX + "COMPILE_BUDGET"
# A test hook: the TPU compile worker aborts, as libtpu's compiler does on some kernels,
# instead of compiling a call of the kernel this names (tpu_compile/remote.py).
COMPILER_ABORT_VARIABLE = ENV_PREFIX + "TEST_COMPILER_ABORT"


def env_variable(key: str) -> str:
    """The variable of a settings key: `skip-floats` -> PALLAS_CHECK_SKIP_FLOATS."""
    return ENV_PREFIX + key.upper().replace("-", "_")


# How every yes-or-no variable of ours is read (case and surrounding blanks aside): an
# empty value is off, as if unset. Any other value is an error naming the variable.
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off", "")


def parse_flag(text: str) -> bool:
    """A yes-or-no variable's value as a bool; ValueError (one line, the value quoted) for
    a value that is neither: `PALLAS_CHECK_DEBUG=0` is off, never on because it is set."""
    word = text.strip().lower()
    if word in TRUE_WORDS or word in FALSE_WORDS:
        return word in TRUE_WORDS
    raise ValueError(f"expected {'/'.join(TRUE_WORDS)} or {'/'.join(FALSE_WORDS[:-1])},"
                     f" got {text!r}")


def debug_requested() -> bool:
    """Whether PALLAS_CHECK_DEBUG is on. A value that is not a yes-or-no word reads as off
    here (this is asked while an error is being reported, where raising would hide it);
    the command line refuses such a value at its start (layers.check_other_variables)."""
    try:
        return parse_flag(os.environ.get(DEBUG_VARIABLE, ""))
    except ValueError:
        return False
