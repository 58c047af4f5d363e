"""pyggml parity shrink: a failing op case shrunk to the smallest that still fails, written
as Python and C reproducers that fail the same way (a planted failure: a reference that is
wrong where a > 1, so ggml's real kernel disagrees with it)."""

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import pyggml
from pyggml import Type
from pyggml.opinfo import Arg, registry
from pyggml.parity import shrink

pytestmark = pytest.mark.tooling      # (pyproject.toml: what the upstream matrix runs once)

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


def _planted():
    add = registry()["add"]
    return dataclasses.replace(add, ref=lambda a, b, types=None: add.ref(a, b, types=types) + 0.5 * (np.asarray(a) > 1.0))


def _first_failing(info, t=Type.F32):
    return next(s for s in info.samples(np.random.default_rng(0), t) if shrink.fails(info, s, t) is not None)


def test_a_planted_failure_shrinks_to_one_element_per_tensor():
    info = _planted()
    s = _first_failing(info)
    sh = shrink.shrink(info, s, Type.F32)
    a, b = (np.asarray(x.value) for x in sh.sample.args)
    assert sh.elements_before >= 24 and sh.elements_after == 2 and a.size == b.size == 1
    assert a.reshape(-1)[0] > 1.0 and float(a.reshape(-1)[0]).is_integer()          # simplified, still > 1
    assert sh.nmse > sh.tol and sh.kept >= 3 and sh.tries <= 600
    assert shrink.fails(info, sh.sample, Type.F32) is not None
    with pytest.raises(pyggml.GGMLError, match="does not fail"):
        shrink.shrink(registry()["add"], s, Type.F32)               # the real reference: nothing to shrink


def _linked_is_the_pin():
    sys.path.insert(0, str(ROOT / "tests"))
    from sources import built_from_the_pin
    return built_from_the_pin()


def test_the_reproducers_fail_the_same_way_in_python_and_in_c(tmp_path):
    info = _planted()
    sh = shrink.shrink(info, _first_failing(info), Type.F32)
    paths = shrink.write(sh, str(tmp_path), "add-planted")
    assert [Path(p).suffix for p in paths] == [".py", ".c"]
    py = Path(paths[0]).read_text()
    assert len(py.splitlines()) <= 16 and "pyggml.add(ctx, x0, x1)" in py
    p = subprocess.run([PY, paths[0]], capture_output=True, text=True, cwd="/", timeout=120)
    assert p.returncode == 1 and re.search(r"NMSE 0\.\d+ tolerance 1e-07", p.stdout), p.stdout + p.stderr
    c = Path(paths[1]).read_text()
    assert "ggml_add(ctx, t0, t1)" in c and "pyggml" not in c.split("\n", 1)[1]      # ggml's API only
    if not _linked_is_the_pin():
        pytest.skip("the C reproducer compiles against this checkout's ggml headers, which are the pin's")
    from pyggml._machine import build_c_program
    exe = build_c_program(c, str(tmp_path), "repro", include=str(ROOT / "vendor" / "ggml" / "include"))
    if exe is None:
        pytest.skip("no C compiler, or no libggml beside pyggml's modules")
    r = subprocess.run([exe], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and re.search(r"NMSE 0\.\d+, tolerance 1e-07", r.stdout), r.stdout + r.stderr


def test_views_and_scalars_go_into_the_reproducers(tmp_path):
    """A transposed argument, an F16 one and a float parameter: both reproducers build them."""
    info = registry()["leaky_relu"]
    planted = dataclasses.replace(info, ref=lambda x, slope, inplace: info.ref(x, slope, inplace) + (x > 2.0))
    x = np.array([[0.5, 3.0, -1.0], [2.5, -0.25, 1.0]])
    s = shrink.Sample((Arg(x, Type.F16), 0.1, False), "planted")
    sh = shrink.shrink(planted, s, Type.F16)
    assert sh.elements_after == 1
    py, c = shrink.python_source(sh), shrink.c_source(sh)
    assert "np.float16" in py and "pyggml.leaky_relu(ctx, x0, 0.1, False)" in py
    assert "ggml_fp32_to_fp16_row" in c and "ggml_leaky_relu(ctx, t0, 0.1f, false)" in c
    t = registry()["mul_mat"]
    tr = shrink.Shrunk(t, Type.F32, shrink.Sample((Arg(np.ones((2, 3)), Type.F32, "transposed"),
                                                   Arg(np.ones((4, 3)))), "t"), 1.0, 1e-7, 0, 0, 12, 12)
    assert "pyggml.transpose(ctx, x0)" in shrink.python_source(tr) and "ggml_transpose(ctx, t0)" in shrink.c_source(tr)
    q = dataclasses.replace(tr, sample=shrink.Sample((Arg(np.ones((2, 32)), Type.Q8_0), Arg(np.ones((4, 32)))), "q"))
    assert shrink.c_source(q) is None and "pyggml.Type.Q8_0" in shrink.python_source(q)


PLANTED = """
import dataclasses, sys
import numpy as np
from pyggml.opinfo import registry
add = registry()["add"]
registry()["add"] = dataclasses.replace(add, ref=lambda a, b, types=None: add.ref(a, b, types=types) + 0.5 * (np.asarray(a) > 1.0))
from pyggml.__main__ import main
sys.exit(main(sys.argv[1:]))
"""


def test_the_command_and_the_sweeps_shrink_option(tmp_path):
    script = tmp_path / "planted.py"
    script.write_text(PLANTED)
    run = lambda *a: subprocess.run([PY, str(script), "parity", *a], capture_output=True, text=True,  # noqa: E731
                                    cwd=tmp_path, timeout=300)
    p = run("--op", "add", "--types", "F32", "--workers", "0", "--paths", "ggml,reference", "--shrink", "out")
    assert p.returncode == 1, p.stdout + p.stderr
    made = sorted(os.listdir(tmp_path / "out"))
    assert made and all(re.fullmatch(r"add-F32-\d+\.(py|c)", m) for m in made), made
    assert re.search(r"--shrink op:add\|F32\|\d+: \d+ -> 2 input elements", p.stdout)
    key = re.search(r"--shrink (op:add\|F32\|\d+)", p.stdout).group(1)
    p = run("shrink", key, "--out", "one")
    assert p.returncode == 0 and "shrunk from" in p.stdout and (tmp_path / "one").is_dir(), p.stdout + p.stderr
    for bad, say in (("op:add|F32|999", "samples of F32"), ("attention|F32|0", "op:NAME|TYPE|INDEX"),
                     ("op:add|F99|0", "no ggml type 'F99'"), ("op:sqr|Q4_0|0", "no samples of Q4_0")):
        p = run("shrink", bad)
        assert p.returncode == 2 and say in p.stderr, (bad, p.stderr)
    p = subprocess.run([PY, "-m", "pyggml", "parity", "shrink", "op:add|F32|0"], capture_output=True, text=True,
                       cwd="/", timeout=300)
    assert p.returncode == 2 and "does not fail" in p.stderr
