"""Reading what a child process wrote to a pseudo-terminal (tests that need a real TTY)."""

from __future__ import annotations

import os
import select
import subprocess
import time
from typing import Callable


def read_until_closed(master: int, proc: subprocess.Popen, timeout: float = 300,
                      on_output: Callable[[bytes], None] | None = None) -> bytes:
    """Everything the child wrote to the terminal whose master end is `master`, until it
    closes the terminal or exits (at most `timeout` seconds); `master` is closed after.
    `on_output(seen)` is called with everything so far after each read: a test answers
    what the child showed (it waits on that, not on a time)."""
    seen = bytearray()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
            if on_output is not None:
                on_output(bytes(seen))
        elif proc.poll() is not None:
            break
    os.close(master)
    return bytes(seen)
