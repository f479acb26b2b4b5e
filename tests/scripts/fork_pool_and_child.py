"""A kernel call with a finding, a pool of 2 forked workers, and a forked child that calls
the kernel (tests/cli/test_child_processes.py).

Under `pallas-check run`: one report, the owner's (1 call, 1 finding, exit 1). The
workers end with the pool. The child's call is refused at once (JAX cannot compile in a
process forked after it started), one line on stderr, and the child exits 1, which the
script prints ("child exit: 1"). The children's pids go to stderr ("children: ...").
"""

import multiprocessing
import os
import sys

import numpy as np
from children_kernel import block_sum


def square(i):
    return i * i


if __name__ == "__main__":
    block_sum(np.ones((8, 128), np.float32))
    with multiprocessing.get_context("fork").Pool(2) as pool:
        pids = [p.pid for p in pool._pool]
        assert pool.map(square, range(4)) == [0, 1, 4, 9]
    child = os.fork()
    if child == 0:
        block_sum(np.zeros((8, 128), np.float32))  # a numpy operand: the kernel compiles first
        sys.exit(0)
    print("children:", *pids, child, file=sys.stderr, flush=True)
    _, status = os.waitpid(child, 0)
    print("child exit:", os.waitstatus_to_exitcode(status))
