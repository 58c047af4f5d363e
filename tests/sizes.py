"""The sizes of the tests' long computes, said once.

Under scripts/sanitize.py (``PYGGML_SANITIZED=1``) ggml's kernels run about 10 times slower,
so the computes that other threads interrupt, close or race against do 1/8 of the work there.
And machines differ (a Zen 5 core multiplies F32 matrices several times faster than a Zen 3
one): a compute that must still be running when another thread acts on it is as long as
:func:`long_depth` measures it must be here, not a fixed number of nodes.
"""

import functools
import math
import os
import time

SANITIZED = os.environ.get("PYGGML_SANITIZED") == "1"

# A forked proof runs while another thread of the process runs (the proof's own waiter, the
# caller's thread handling signals, pytest-xdist's I/O thread). ASan's allocator, unlike
# glibc's, does not reset its locks in the child, which can then hang until the proof's
# timeout kills it (one proof hung 600 s in a CI run of the sanitizer stage, another past a
# test's 120 s). Tests that fork many proofs while other threads allocate skip under ASan.
FORKS_WHILE_THREADS_ALLOCATE = ("forks proofs while another thread allocates: ASan's allocator, unlike glibc's, "
                                "does not reset its locks in the child, which can then hang")

# the side of the square F32 matrices those computes multiply
LONG_N = 512 if SANITIZED else 1024


@functools.lru_cache(maxsize=None)
def node_seconds(n: int = LONG_N) -> float:
    """Seconds one n x n F32 matrix product takes on one CPU thread here (the best of three)."""
    import numpy as np

    import pyggml

    with pyggml.Context(4 * n * n * 4 + (1 << 20)) as ctx:
        a = ctx.from_numpy(np.full((n, n), 1e-3, np.float32))
        g = pyggml.Graph(ctx)
        g.build_forward_expand(pyggml.mul_mat(ctx, a, a))
        best = math.inf
        for _ in range(3):
            t0 = time.perf_counter()
            g.compute(1)
            best = min(best, time.perf_counter() - t0)
    return best


def long_depth(seconds: float, n: int = LONG_N) -> int:
    """How many n x n products a chain needs to compute for about ``seconds`` on one thread
    here (8 to 500): long enough for another thread to act while it runs, on a fast
    machine as on a slow one."""
    return min(500, max(8, math.ceil(seconds / node_seconds(n))))
