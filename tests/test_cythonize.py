"""pyggml/_cythonize.py: the build's batch transpile. A module's C is rewritten only when
its content changed; a failed module fails the batch and leaves no file behind; the depfile
lists what each module reads, only below the folders the build names."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sources import load_source

pytestmark = pytest.mark.tooling      # (pyproject.toml: what the upstream matrix runs once)

pytest.importorskip("Cython")
ROOT = Path(__file__).resolve().parent.parent
cythonize = load_source("pyggml/_cythonize.py", "_cythonize")


def transpile(*args):
    """Run the batch as the build does, in a process of its own: the exit status and its
    stderr. (Importing Cython's compiler adds about 230 MiB to a process for good, which
    would make every fork of this test worker after it slower: a forked proof, 15 ms more.)"""
    proc = subprocess.run([sys.executable, str(ROOT / "pyggml" / "_cythonize.py"), *args],
                          capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stderr


def _tree(tmp_path):
    src = tmp_path / "src"
    src.mkdir(parents=True)
    (src / "helper.pxd").write_text("cdef int twice(int x)\n")
    (src / "helper.pyx").write_text("cdef int twice(int x):\n    return 2 * x\n")
    (src / "a.pyx").write_text("from libc.stdint cimport int64_t\nfrom helper cimport twice\n"
                               "def f(int64_t x):\n    return twice(x)\n")
    (src / "b.pyx").write_text("def g():\n    return 1\n")
    out = tmp_path / "out"
    out.mkdir()
    jobs = [f"pkg.{m}={src / (m + '.pyx')}={out / (m + '.c')}" for m in ("a", "b")]
    return src, out, jobs


def test_unchanged_c_keeps_its_time_stamp_and_a_changed_one_is_rewritten(tmp_path):
    src, out, jobs = _tree(tmp_path)
    dep = out / "a.c.dep"
    assert transpile("-I", str(src), "--depfile", str(dep), *jobs)[0] == 0
    a, b = out / "a.c", out / "b.c"
    assert "__pyx_pw_3pkg_1a_1f" in a.read_text()
    old = 1_000_000_000
    for path in (a, b):
        os.utime(path, (old, old))
    (src / "b.pyx").write_text("def g():\n    return 2\n")
    a_record = (out / "a.c.inputs").stat().st_mtime_ns
    assert transpile("-I", str(src), "--depfile", str(dep), *jobs)[0] == 0
    assert (out / "a.c.inputs").stat().st_mtime_ns == a_record    # a's inputs unchanged: not transpiled
    assert a.stat().st_mtime == old
    assert b.stat().st_mtime != old                 # new C: rewritten
    assert "return 2" in b.read_text() or "__pyx_int_2" in b.read_text()
    # a's .pyx touched, not changed: transpiled again, but the same C keeps its time stamp
    os.utime(src / "a.pyx", (old + 10**8, old + 10**8))
    os.utime(out / "a.c.inputs", (old, old))
    assert transpile("-I", str(src), "--depfile", str(dep), *jobs)[0] == 0
    assert (out / "a.c.inputs").stat().st_mtime > old + 10**8
    assert a.stat().st_mtime == old                 # same C: untouched, so it does not recompile
    assert sorted(p.name for p in out.iterdir()) == ["a.c", "a.c.dep", "a.c.inputs", "b.c", "b.c.inputs"]


def test_the_depfile_names_every_pxd_read_and_only_below_the_given_folders(tmp_path):
    src, out, jobs = _tree(tmp_path)
    dep = out / "a.c.dep"
    assert transpile("-I", str(src), "--depfile", str(dep), *jobs)[0] == 0
    deps = cythonize._deps_of(str(dep))
    assert dep.read_text().startswith(f"{out / 'a.c'}:")
    assert str(src / "helper.pxd") in deps and str(src / "b.pyx") in deps
    assert any(d.endswith(os.path.join("libc", "stdint.pxd")) for d in deps)    # Cython's own
    src, out, jobs = _tree(tmp_path / "2")
    dep = out / "a.c.dep"
    assert transpile("-I", str(src), "--depfile", str(dep), "--deps-under", str(src), *jobs)[0] == 0
    deps = cythonize._deps_of(str(dep))
    assert deps and all(d.startswith(str(src) + os.sep) for d in deps)


def test_a_module_that_does_not_compile_fails_the_batch_and_leaves_no_file(tmp_path):
    src, out, jobs = _tree(tmp_path)
    (src / "b.pyx").write_text("def g(:\n")
    dep = out / "a.c.dep"
    rc, err = transpile("-I", str(src), "--depfile", str(dep), *jobs)
    assert rc == 1 and "1 of 2 modules failed" in err
    assert sorted(p.name for p in out.iterdir()) == ["a.c", "a.c.inputs"]   # no b.c, depfile, .new.c


def test_a_malformed_job_is_refused(tmp_path):
    with pytest.raises(SystemExit):
        cythonize.main(["pkg.a=a.pyx"])
