"""The stateful fuzzer (tests/stateful_machine.py) runs clean: hypothesis drives
contexts, tensors, ops of the table, graphs, backward passes, computes on two threads,
closes and collections in orderings no test lists. It runs in a fresh interpreter, so a
crash is a failed test naming the exit status."""

import os
import re
import subprocess
import sys
from pathlib import Path

MACHINE = Path(__file__).with_name("stateful_machine.py")


def test_state_machine_runs_clean(tmp_path):
    examples = int(os.environ.get("PYGGML_STATEFUL_EXAMPLES", "60"))
    proc = subprocess.run([sys.executable, str(MACHINE), str(examples), "40"], capture_output=True, text=True,
                          timeout=900, cwd=tmp_path)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}"
    m = re.search(r"steps (\d+) calls (\d+)", proc.stdout)
    assert m and int(m.group(1)) > 0 and int(m.group(2)) > 0
    print(proc.stdout.strip())
