"""Children still running when the run is stopped (tests/cli/test_child_processes.py): a
pool of 2 forked workers and one forked child, all blocked reading a pipe nobody writes.
"ready" on stdout once they are started; their pids on stderr ("children: ...").

On SIGTERM pallas-check reports the run as interrupted (exit 3); the pool's `with` ends
its workers, pallas-check the child the script left.
"""

import multiprocessing
import os
import sys


def wait_forever(fd):
    return os.read(fd, 1)


if __name__ == "__main__":
    never_written, keep = os.pipe()
    with multiprocessing.get_context("fork").Pool(2) as pool:
        pending = pool.map_async(wait_forever, [never_written] * 2)
        child = os.fork()
        if child == 0:
            wait_forever(never_written)
            os._exit(0)
        print("children:", *[p.pid for p in pool._pool], child, file=sys.stderr, flush=True)
        print("ready", flush=True)
        pending.get()
