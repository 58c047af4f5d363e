"""The guarded proof in the calling process (csrc/guarded.c, pyggml_guarded_compute_here),
as a parity worker runs it: the same verdict as the forked proof for each kind of finding,
and the process marked tainted after one. Each mode runs in a subprocess of its own (a
proof in process abandons a kernel part way: the process is disposable)."""

import json
import subprocess
import sys

import pytest

import pyggml

SCRIPT = r"""
import json, sys
import numpy as np
import pyggml
from pyggml import Type, _core, _cpu
from pyggml.errors import GGMLError
from pyggml.parity import runner

mode = sys.argv[1]
_core._set_rules_enabled(False)             # the kernels get what the rules would refuse
_cpu._set_proof_in_process(mode == "here")
_cpu.set_proof_timeout(2.0)
out = {"rows": [], "tainted_before": _cpu._proof_state_tainted()}


def proof(name, build):
    with pyggml.Context(1 << 20) as ctx:
        node = build(ctx)
        g = pyggml.Graph(ctx)
        g.build_forward_expand(node)
        try:
            _cpu.prove(g)
            out[name] = ["ok", ""]
        except GGMLError as e:
            out[name] = [type(e).__name__, str(e)]
        out[name + "_tainted"] = _cpu._proof_state_tainted()


def add(ctx):
    a = ctx.from_numpy(np.arange(6, dtype=np.float32))
    return pyggml.add(ctx, a, a)


def get_rows_past_the_end(ctx):                 # ggml's kernel asserts the row: an abort
    a = ctx.from_numpy(np.zeros((4, 3), np.float32))
    return pyggml.get_rows(ctx, a, ctx.from_numpy(np.array([1, 7], np.int32)))


proof("add", add)
proof("abort", get_rows_past_the_end)
for case in runner.select(["rope_ext_back", "set_1d"], ["F32"]):
    rows, _ = runner.check_case(case, ["ggml", "reference"])
    out["rows"] += [[r.case, r.a, r.b, r.verdict, r.detail] for r in rows]
out["tainted"] = _cpu._proof_state_tainted()
print(json.dumps(out))
"""


def _run(mode):
    p = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=240,
                       cwd="/")          # not the source tree's pyggml
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def both():
    return _run("fork"), _run("here")


def _kind(verdict, detail):
    """A row's verdict and the part of its detail that does not say where the proof ran."""
    return verdict, detail.split(": the child was killed")[0].split(": the compute ran in this process")[0]


def test_a_clean_proof_leaves_the_process_untainted(both):
    fork, here = both
    assert fork["add"] == here["add"] == ["ok", ""]
    assert not here["tainted_before"] and not here["add_tainted"]


def test_an_abort_in_a_kernel_is_the_same_exception_in_either_mode(both):
    fork, here = both
    assert fork["abort"][0] == here["abort"][0] == "GGMLAbort"
    assert "ggml would abort (signal 6)" in here["abort"][1] and "GGML_ASSERT" in here["abort"][1]
    assert here["abort"][1] == fork["abort"][1]
    assert here["abort_tainted"] and not fork["abort_tainted"]       # the forked child took the abort


def test_each_finding_of_the_sweep_is_the_same_row_in_either_mode(both):
    fork, here = both
    assert len(fork["rows"]) == len(here["rows"]) > 10
    verdicts = {}
    for f, h in zip(fork["rows"], here["rows"]):
        assert f[:3] == h[:3]
        assert _kind(f[3], f[4]) == _kind(h[3], h[4]), (f, h)
        verdicts[f[3]] = verdicts.get(f[3], 0) + 1
    # what these two ops give with the rules off, on ggml 0.25.3: reads and a write past a
    # tensor (oob), and rope's n_dims 0 spinning (a timeout of the 2 s proof)
    if pyggml.build_info()["ggml_version"] == "0.25.3":
        assert verdicts.get("oob") == 3 and verdicts.get("error") == 1, verdicts
        timeouts = [h for h in here["rows"] if h[3] == "error"]
        assert "KernelTimeout" in timeouts[0][4] and "the compute ran in this process, and was stopped" in timeouts[0][4]
    assert here["tainted"] and not fork["tainted"]


SWEEP = r"""
import json, os, sys
from pyggml import _core
from pyggml.parity import runner
_core._set_rules_enabled(False)     # module level: the spawned workers run it too

if __name__ == "__main__":
    started = []
    init = runner._Worker.__init__

    def counting(self, *a, **k):
        started.append(1)
        init(self, *a, **k)

    runner._Worker.__init__ = counting
    cases = runner.select(["set_1d"], ["F32"])
    rows, _ = runner.run_cases(cases, ["ggml", "reference"], workers=1, timeout=60)
    print(json.dumps({"cases": len(cases), "workers": len(started),
                      "rows": sorted([r.case, r.a, r.b, r.verdict, r.detail] for r in rows)}))
"""


def _sweep(tmp_path, proof):
    script = tmp_path / "sweep.py"
    script.write_text(SWEEP)
    env = {**__import__("os").environ, "PYGGML_PARITY_PROOF": proof}
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_a_worker_that_found_something_retires_and_a_new_one_takes_the_rest_of_its_batch(tmp_path):
    fork, here = _sweep(tmp_path, "fork"), _sweep(tmp_path, "here")
    assert fork["rows"] == here["rows"] and fork["cases"] == here["cases"] > 3
    bad = [r for r in here["rows"] if r[3] not in ("ok", "skipped", "refused")]
    assert bad and all(r[3] == "oob" for r in bad), bad
    # one worker throughout with forked proofs; in process, a fresh one after each finding
    # (none is a death: no row says crashed)
    assert fork["workers"] == 1
    assert here["workers"] == 1 + len({r[0] for r in bad})
