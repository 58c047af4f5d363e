"""The stateful fuzzers run clean: hypothesis drives contexts, tensors, ops of the table,
graphs, backward passes, computes on two threads, closes and collections
(tests/stateful_machine.py), and the backend layer: backends, buffers, graph allocators,
schedulers, datasets and optimizers, re-allocations and closes in every order, computes
racing on other threads (tests/stateful_backend_machine.py). Each runs in a fresh
interpreter, so a crash is a failed test naming the exit status; the sanitizer stage
(scripts/sanitize.py) runs them under ASan, where a use of freed memory is a report."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.mark.parametrize("machine, steps", [("stateful_machine.py", 40), ("stateful_backend_machine.py", 30)])
def test_state_machine_runs_clean(tmp_path, machine, steps):
    examples = int(os.environ.get("PYGGML_STATEFUL_EXAMPLES", "60"))
    proc = subprocess.run([sys.executable, str(HERE / machine), str(examples), str(steps)], capture_output=True,
                          text=True, timeout=900, cwd=tmp_path)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}"
    m = re.search(r"steps (\d+) calls (\d+)", proc.stdout)
    assert m and int(m.group(1)) > 0 and int(m.group(2)) > 0
    if machine == "stateful_backend_machine.py":
        # graphs computed in fresh memory while everything else happens, each checked
        assert int(re.search(r"checked (\d+)", proc.stdout).group(1)) > 0
    print(proc.stdout.strip())
