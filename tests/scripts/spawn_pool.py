"""A pool of 2 workers started by argv[1] ('spawn' or 'forkserver'), each calling the
kernel, after the owner's own call (tests/cli/test_child_processes.py).

Under `pallas-check run`: one report with 5 calls (the owner's first, then the workers'
4), their one defect merged into one finding (count 5), exit 1. The workers' pids go to
stderr ("children: ...").
"""

import multiprocessing
import os
import sys

import numpy as np
from children_kernel import block_sum


def work(i):
    out = np.asarray(block_sum(np.full((8, 128), float(i), np.float32)))
    return os.getpid(), out.shape


if __name__ == "__main__":
    block_sum(np.ones((8, 128), np.float32))
    with multiprocessing.get_context(sys.argv[1]).Pool(2) as pool:
        print("children:", *[p.pid for p in pool._pool], file=sys.stderr, flush=True)
        assert [shape for _, shape in pool.map(work, range(4))] == [(8, 128)] * 4
