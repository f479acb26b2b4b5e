"""The names of pallas-check's environment variables, in one place.

Each option of the table (options.py) is also a variable: `PALLAS_CHECK_` and its settings
key in capitals (`skip-floats` -> PALLAS_CHECK_SKIP_FLOATS; read by layers.py). One more
variable is no option: PALLAS_CHECK_DEBUG, for bug reports. Imports nothing of ours, so
that any module (the TPU compile stage too) can ask whether debugging was asked for.
"""

from __future__ import annotations

import os

# Every environment variable of ours starts so; an option's is ENV_PREFIX + its key.
ENV_PREFIX = "PALLAS_CHECK_"
# Our one variable that is no option: a traceback instead of a one-line error, errors not
# shortened, libtpu's start-up output kept.
DEBUG_VARIABLE = ENV_PREFIX + "DEBUG"


def env_variable(key: str) -> str:
    """The variable of a settings key: `skip-floats` -> PALLAS_CHECK_SKIP_FLOATS."""
    return ENV_PREFIX + key.upper().replace("-", "_")


def debug_requested() -> bool:
    """Whether PALLAS_CHECK_DEBUG is set (to anything but the empty string)."""
    return bool(os.environ.get(DEBUG_VARIABLE))
