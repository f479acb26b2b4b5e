"""Reading what a child process wrote to a pseudo-terminal (tests that need a real TTY)."""

from __future__ import annotations

import os
import select
import subprocess
import time


def read_until_closed(master: int, proc: subprocess.Popen, timeout: float = 300) -> bytes:
    """Everything the child wrote to the terminal whose master end is `master`, until it
    closes the terminal or exits (at most `timeout` seconds); `master` is closed after."""
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
        elif proc.poll() is not None:
            break
    os.close(master)
    return bytes(seen)
