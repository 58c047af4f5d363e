"""Random graphs through the public API never kill the interpreter.

Each seed runs tests/fuzz_graphs.py in a fresh interpreter (random tensors,
strides, ops, forward and backward graphs, threads, contexts closed at random),
so an abort or a segfault is a failed test that names the seed, not a dead run.
The fuzzer found kernel preconditions that ggml's builders do not check (a
diag_mask_inf or scale input whose unit dimensions carry odd strides, a
REPEAT_BACK of a permuted gradient); they are now refused or proven first.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

FUZZER = Path(__file__).with_name("fuzz_graphs.py")


@pytest.mark.parametrize("seed", range(8))
def test_random_graphs_do_not_crash(seed, tmp_path):
    env = dict(os.environ, GGML_NO_BACKTRACE="1")
    proc = subprocess.run([sys.executable, str(FUZZER), str(seed), "60"], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path, env=env)
    assert proc.returncode == 0, (f"seed {seed}: exit {proc.returncode}\n"
                                  f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    assert proc.stdout.strip() == f"ok {seed}"
