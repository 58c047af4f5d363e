"""The project's scripts and command line: vendoring, the upstream matrix's arguments, the CLI."""

import hashlib
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

import pyggml
from pyggml import _attn
from pyggml._machine import cpu_model
from sources import load_script, load_source

pytestmark = pytest.mark.tooling      # (pyproject.toml: what the upstream matrix runs once)

ROOT = Path(__file__).resolve().parent.parent


vendor = load_script("vendor_ggml")
ci = load_script("ci_upstream")
report = load_script("ci_report")
bis = load_script("ci_bisect")


def make_sdist(path, members, links=()):
    with tarfile.open(path, "w:gz") as tar:
        for name, text in members.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in links:
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tar.addfile(info)
    return hashlib.sha256(path.read_bytes()).hexdigest()


GOOD = {"pkg-1.0/ggml/CMakeLists.txt": "project(ggml)\n", "pkg-1.0/ggml/include/ggml.h": "/* h */\n",
        "pkg-1.0/ggml/src/ggml.c": "/* c */\n", "pkg-1.0/other/file.txt": "not ggml\n"}


def test_the_pinned_lock_is_well_formed():
    lock = vendor.read_lock()
    # ggml 0.25.3 as llama.cpp vendors it in the llama-cpp-python sdist (pinned in vendor/sdists/ too)
    assert lock["package"] == "llama-cpp-python==0.3.36" and lock["version"] == "0.25.3"
    assert len(lock["sha256"]) == 64 and lock["subdir"] == "vendor/llama.cpp/ggml"
    assert {k: v for k, v in vendor.read_sdist_lock(lock["package"]).items()} == lock
    # the pin before it stays buildable from the registry, by hash
    old = vendor.read_sdist_lock("libggml-python==0.20.2.post1")
    assert old["version"] == "0.20.2" and old["subdir"] == "ggml" and len(old["sha256"]) == 64


@pytest.fixture
def cached_sdist(tmp_path, monkeypatch):
    """A fake pinned sdist already in the cache, so no download happens."""
    cache = tmp_path / "cache"
    cache.mkdir()
    sha = make_sdist(cache / "pkg-1.0.tar.gz", GOOD)
    lockfile = tmp_path / "ggml.lock"
    lockfile.write_text(f"version = 1.0\npackage = pkg==1.0\nsdist = pkg-1.0.tar.gz\nsha256 = {sha}\nsubdir = ggml\n")
    monkeypatch.setenv("PYGGML_CACHE_DIR", str(cache))
    monkeypatch.setattr(vendor, "LOCK", lockfile)
    return cache, sha


def test_populate_from_the_cached_sdist(tmp_path, cached_sdist):
    dest = tmp_path / "vendor" / "ggml"
    vendor.populate(dest)
    assert (dest / "include" / "ggml.h").read_text() == "/* h */\n"
    assert not (dest / "other").exists() and not (dest / "ggml").exists()
    assert (dest / vendor.STAMP).read_text().startswith(f"pypi:pkg==1.0 sha256:{cached_sdist[1]}")
    # already populated: left alone unless forced
    (dest / "marker").write_text("x")
    vendor.populate(dest)
    assert (dest / "marker").exists()
    vendor.populate(dest, force=True)
    assert not (dest / "marker").exists()


def test_a_tree_of_an_earlier_pin_is_replaced(tmp_path, cached_sdist):
    # the lock moved (0.20.2 -> 0.25.3): a checkout's vendor/ggml of the old pin is never built
    dest = tmp_path / "vendor" / "ggml"
    vendor.populate(dest)
    (dest / vendor.STAMP).write_text("pypi:pkg==0.9 sha256:00\n")
    (dest / "marker").write_text("x")
    vendor.populate(dest)
    assert not (dest / "marker").exists()
    assert (dest / vendor.STAMP).read_text() == f"pypi:pkg==1.0 sha256:{cached_sdist[1]}\n"
    # a tree a developer copied there (--from) is theirs: left alone
    (dest / vendor.STAMP).write_text("src:/somewhere/ggml\n")
    vendor.populate(dest)
    assert (dest / vendor.STAMP).read_text() == "src:/somewhere/ggml\n"


def test_a_tampered_cache_is_not_used(tmp_path, cached_sdist, monkeypatch):
    cache, _ = cached_sdist
    make_sdist(cache / "pkg-1.0.tar.gz", {**GOOD, "pkg-1.0/ggml/src/ggml.c": "/* evil */\n"})
    calls = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, stdout="no network in this test")

    monkeypatch.setattr(vendor.subprocess, "run", fake_run)
    with pytest.raises(vendor.VendorError, match="pip download failed"):
        vendor.populate(tmp_path / "dest")
    assert calls and calls[0][1:4] == ["-m", "pip", "download"]
    assert "--no-binary" in calls[0]
    assert not (tmp_path / "dest").exists()          # nothing half-populated


def test_a_download_with_the_wrong_hash_is_refused(tmp_path, cached_sdist, monkeypatch):
    cache, _ = cached_sdist
    (cache / "pkg-1.0.tar.gz").unlink()

    def fake_run(cmd, **kw):
        dest = Path(cmd[cmd.index("--dest") + 1])
        make_sdist(dest / "pkg-1.0.tar.gz", {**GOOD, "pkg-1.0/ggml/extra.c": "changed\n"})
        return subprocess.CompletedProcess(cmd, 0, stdout="")

    monkeypatch.setattr(vendor.subprocess, "run", fake_run)
    with pytest.raises(vendor.VendorError, match="sha256 mismatch"):
        vendor.populate(tmp_path / "dest")


def test_unsafe_member_names_are_refused(tmp_path, cached_sdist, monkeypatch):
    cache, _ = cached_sdist
    sha = make_sdist(cache / "pkg-1.0.tar.gz", {**GOOD, "pkg-1.0/ggml/../../escape.txt": "x"})
    lockfile = vendor.LOCK
    lockfile.write_text(lockfile.read_text().replace(cached_sdist[1], sha))
    with pytest.raises(vendor.VendorError, match="unsafe member name"):
        vendor.populate(tmp_path / "dest")
    assert not (tmp_path / "escape.txt").exists()


@pytest.mark.parametrize("link, target", [
    ("pkg-1.0/ggml/src/up", ".."),                       # inside ggml/: allowed
    ("pkg-1.0/ggml/src/passwd", "/etc/passwd"),           # absolute
    ("pkg-1.0/ggml/src/out", "../../other/file.txt"),     # out of ggml/
])
def test_links_in_the_sdist_must_stay_inside(tmp_path, cached_sdist, link, target, monkeypatch):
    cache, _ = cached_sdist
    sha = make_sdist(cache / "pkg-1.0.tar.gz", GOOD, links=[(link, target)])
    lockfile = vendor.LOCK
    lockfile.write_text(lockfile.read_text().replace(cached_sdist[1], sha))
    monkeypatch.delattr(vendor.tarfile, "data_filter", raising=False)    # as on Python 3.10.0-3.10.11
    if target == "..":
        dest = vendor.populate(tmp_path / "dest")
        assert (dest / "src" / "up").is_symlink()
        return
    with pytest.raises(vendor.VendorError, match="points outside ggml/"):
        vendor.populate(tmp_path / "dest")
    assert not (tmp_path / "dest").exists()


def test_links_in_a_local_tree_must_stay_inside(tmp_path):
    src = tmp_path / "ggml-master"
    (src / "include").mkdir(parents=True)
    (src / "CMakeLists.txt").write_text("project(ggml)\n")
    (src / "include" / "ggml.h").write_text("/* h */\n")
    (src / "include" / "alias.h").symlink_to("ggml.h")         # inside: copied as a link
    dest = vendor.populate(tmp_path / "d1", source=src)
    assert (dest / "include" / "alias.h").is_symlink()
    secret = tmp_path / "secret.txt"
    secret.write_text("outside")
    (src / "leak.txt").symlink_to(secret)
    with pytest.raises(vendor.VendorError, match="is a link to .*secret.txt, outside"):
        vendor.populate(tmp_path / "d2", source=src)
    (src / "leak.txt").unlink()
    (src / "up").symlink_to("..")                              # a loop out of the tree
    with pytest.raises(vendor.VendorError, match="outside"):
        vendor.populate(tmp_path / "d3", source=src)


def test_populate_from_a_local_tree(tmp_path):
    src = tmp_path / "ggml-master"
    (src / "include").mkdir(parents=True)
    (src / "CMakeLists.txt").write_text("project(ggml)\n")
    (src / "include" / "ggml.h").write_text("/* h */\n")
    (src / ".git").mkdir()
    dest = tmp_path / "dest"
    vendor.populate(dest, source=src)
    assert (dest / "include" / "ggml.h").exists() and not (dest / ".git").exists()
    assert (dest / vendor.STAMP).read_text() == f"src:{src}\n"
    with pytest.raises(vendor.VendorError, match="is not a ggml source tree"):
        vendor.populate(tmp_path / "d2", source=tmp_path)


def test_malformed_lock(tmp_path):
    bad = tmp_path / "lock"
    bad.write_text("version = 1\nthis line has no equals sign\n")
    with pytest.raises(vendor.VendorError, match="malformed line"):
        vendor.read_lock(bad)
    bad.write_text("version = 1\n")
    with pytest.raises(vendor.VendorError, match="missing key 'package'"):
        vendor.read_lock(bad)


DEEP = {"big-2.0/vendor/proj/ggml/CMakeLists.txt": "set(GGML_VERSION_MAJOR 0)\nset(GGML_VERSION_MINOR 25)\n"
                                                   "set(GGML_VERSION_PATCH 3)\n",
        "big-2.0/vendor/proj/ggml/include/ggml.h": "/* h */\n", "big-2.0/vendor/proj/ggml/src/a.c": "/* a */\n",
        "big-2.0/vendor/proj/src/not-ggml.c": "/* the rest of the project */\n", "big-2.0/ggml/decoy.h": "x\n"}


@pytest.fixture
def registry(tmp_path, monkeypatch):
    """pip download of big==2.0 answered from a fake registry; the pins go to tmp_path."""
    served = []

    def fake_run(cmd, **kw):
        dest = Path(cmd[cmd.index("--dest") + 1])
        served.append(cmd[-1])
        make_sdist(dest / "big-2.0.tar.gz", DEEP)
        return subprocess.CompletedProcess(cmd, 0, stdout="")
    monkeypatch.setattr(vendor.subprocess, "run", fake_run)
    monkeypatch.setattr(vendor, "SDIST_LOCKS", tmp_path / "sdists")
    monkeypatch.setenv("PYGGML_CACHE_DIR", str(tmp_path / "cache"))
    return served


def test_pin_a_registry_sdist_and_populate_its_deep_ggml_folder(tmp_path, registry):
    lock = vendor.pin("big==2.0", "vendor/proj/ggml")
    assert lock == tmp_path / "sdists" / "big-2.0.lock"
    got = vendor.read_sdist_lock("big==2.0")
    sha = hashlib.sha256((tmp_path / "cache" / "big-2.0.tar.gz").read_bytes()).hexdigest()
    assert got == {"version": "0.25.3", "package": "big==2.0", "sdist": "big-2.0.tar.gz", "sha256": sha,
                   "subdir": "vendor/proj/ggml"}
    dest = vendor.populate(tmp_path / "tree", sdist="big==2.0")
    assert (dest / "src" / "a.c").read_text() == "/* a */\n" and (dest / "include" / "ggml.h").exists()
    assert not (dest / "decoy.h").exists() and not (dest / "vendor").exists()      # only the pinned folder
    assert (dest / vendor.STAMP).read_text() == f"pypi:big==2.0 sha256:{sha}\n"
    assert registry == ["big==2.0"]                # populated from the cache the pin filled


def test_a_registry_sdist_that_changed_is_refused(tmp_path, registry):
    vendor.pin("big==2.0", "vendor/proj/ggml")
    lock = tmp_path / "sdists" / "big-2.0.lock"
    lock.write_text(lock.read_text().replace("sha256 = ", "sha256 = 0"))   # the registry serves other bytes now
    with pytest.raises(vendor.VendorError, match="sha256 mismatch"):
        vendor.populate(tmp_path / "tree", sdist="big==2.0")
    assert not (tmp_path / "tree").exists()


def test_sdist_pins_are_exact_and_must_exist(tmp_path, registry):
    for bad in ("big", "big>=2.0", "big==", "../x==1", "a b==1"):
        with pytest.raises(vendor.VendorError, match="exact pin"):
            vendor.sdist_lock_path(bad)
    with pytest.raises(vendor.VendorError, match="no pin for big==3.0 .* --pin big==3.0 --subdir"):
        vendor.read_sdist_lock("big==3.0")
    with pytest.raises(vendor.VendorError, match="not a ggml tree"):
        vendor.pin("big==2.0", "vendor/proj")
    with pytest.raises(vendor.VendorError, match="has no vendor/none/ folder"):
        vendor.pin("big==2.0", "vendor/none")
    with pytest.raises(vendor.VendorError, match="bad subdir"):
        vendor.pin("big==2.0", "../x")


def test_the_registry_pins_in_the_checkout_are_well_formed():
    locks = sorted((ROOT / "vendor" / "sdists").glob("*.lock"))
    assert locks, "vendor/sdists/ holds the pinned registry sdists"
    for path in locks:
        lock = vendor.read_lock(path)
        assert path.name == f"{lock['package'].replace('==', '-')}.lock" and len(lock["sha256"]) == 64
        assert vendor.sdist_lock_path(lock["package"]) == path


def test_matrix_sdist_specs_are_source_builds(tmp_path):
    assert ci.parse_spec("sdist:llama-cpp-python==0.3.36") == ("sdist", "llama-cpp-python==0.3.36")
    assert ci.normalise_spec("sdist:llama-cpp-python==0.3.36+blas@avx2") == "sdist:llama-cpp-python==0.3.36+blas@avx2"
    for bad in ("sdist:", "sdist:llama-cpp-python", "sdist:llama-cpp-python>=0.3", "sdist:../x==1"):
        with pytest.raises(SystemExit):
            ci.parse_spec(bad)


def test_matrix_specs(tmp_path):
    assert ci.parse_spec("vendored") == ("vendored", "")
    assert ci.parse_spec("pypi:libggml-python==0.9.4") == ("pypi", "libggml-python==0.9.4")
    assert ci.parse_spec(f"src:{tmp_path}") == ("src", str(tmp_path.resolve()))
    for bad in ("pypi:numpy==1.0", "src:", "prefix:/no/such/dir", "master", "vendored:x"):
        with pytest.raises(SystemExit):
            ci.parse_spec(bad)
    assert ci.slug("pypi:libggml-python==0.9.4") == "pypi-libggml-python-0.9.4"
    assert len(ci.DEFAULT_SPECS) >= 4 and ci.DEFAULT_SPECS[0] == "vendored"


def test_matrix_table_marks_failures():
    rows = [dict(spec="vendored", ggml_version="0.20.2", built=True, tests_ok=True, parity_ok=True,
                 worst_nmse=1e-13, seconds=1.0, known_defects=["x"]),
            dict(spec="pypi:libggml-python==0.9.4", ggml_version=None, built=False, tests_ok=False,
                 parity_ok=False, worst_nmse=None, seconds=2.0, known_defects=[])]
    table = report.table(rows).splitlines()
    assert "yes" in table[1] and "1.00e-13" in table[1]
    assert table[2].count("NO") == 3


def test_matrix_reports_op_changes_between_specs():
    base = dict(spec="vendored", ggml_version="0.20.2",
                ops={"wrapped": ["GGML_OP_ADD", "GGML_OP_CUMSUM"], "not_wrapped": {"GGML_OP_NONE": "leaf"}},
                builders={"bound": ["add", "cumsum", "ssm_scan"], "not_bound": {}, "header_only": []},
                api=["ggml_add", "ggml_cumsum", "ggml_init"])
    old = dict(spec="pypi:libggml-python==0.9.4", ggml_version="0.9.4", api=["ggml_add", "ggml_init", "ggml_legacy"],
               ops={"wrapped": ["GGML_OP_ADD"], "not_wrapped": {"GGML_OP_NONE": "leaf", "GGML_OP_OLD": "x"}},
               builders={"bound": ["add"], "not_bound": {"cumsum": "this ggml has no ggml_cumsum",
                                                        "ssm_scan": "ggml_ssm_scan of this ggml takes (...)"},
                         "header_only": ["ggml_legacy"]})
    text = report.op_changes([base, old, dict(spec="broken", ggml_version=None)])
    assert "new ops: GGML_OP_OLD" in text and "removed ops: GGML_OP_CUMSUM" in text
    assert "not bound: cumsum: this ggml has no ggml_cumsum" in text
    assert "not bound: ssm_scan: ggml_ssm_scan of this ggml takes" in text
    assert "builders only in its header: ggml_legacy" in text
    assert "GGML_API functions added: ggml_legacy" in text and "GGML_API functions removed: ggml_cumsum" in text
    assert "broken" not in text


def test_the_drift_report_sees_every_ggml_api_function():
    """Not only graph builders: a function without a context (ggml_rope_set_offset, new
    after 0.20.2) and deprecated ones count; a declaration in a comment does not."""
    gen = load_source("pyggml/_gen_ops.py", "gen_ops_api")
    src = gen.strip_c_comments(
        "GGML_API struct ggml_tensor * ggml_add(struct ggml_context * ctx, struct ggml_tensor * a);\n"
        "GGML_API void ggml_rope_set_offset(struct ggml_tensor * t, int64_t offset);\n"
        "GGML_DEPRECATED(GGML_API void ggml_old_thing(int x), \"use ggml_new_thing\");\n"
        "GGML_API const char * ggml_op_name(enum ggml_op op);\n"
        "// GGML_API void ggml_commented_out(void);\n")
    assert gen.header_api(src) == ["ggml_add", "ggml_old_thing", "ggml_op_name", "ggml_rope_set_offset"]
    from pyggml import _optable
    assert "ggml_add" in _optable.API and "ggml_init" in _optable.API and len(_optable.API) > 300


def test_borrow_numpy_errors():
    with pyggml.Context(1 << 20) as ctx:
        with pytest.raises(ValueError, match="needs a no_alloc context"):
            ctx._borrow_numpy(np.zeros(3, np.float32))
    with pyggml.Context(1 << 20, no_alloc=True) as ctx:
        with pytest.raises(TypeError, match="must be a numpy.ndarray"):
            ctx._borrow_numpy([1.0])
        with pytest.raises(ValueError, match="C-contiguous, aligned and writeable"):
            ctx._borrow_numpy(np.zeros((4, 4), np.float32)[:, ::2])
        ro = np.zeros(3, np.float32)
        ro.flags.writeable = False
        with pytest.raises(ValueError, match="writeable"):
            ctx._borrow_numpy(ro)
        with pytest.raises(TypeError, match="dtype bool has no ggml type"):
            ctx._borrow_numpy(np.zeros(3, bool))
        with pytest.raises(ValueError, match="1 to 4 dims and elements"):
            ctx._borrow_numpy(np.zeros(0, np.float32))
        a = np.arange(6, dtype=np.float32).reshape(2, 3)
        t = ctx._borrow_numpy(a)
        assert t.data_ptr == a.ctypes.data and t.ne == (3, 2, 1, 1)
        with pytest.raises(ValueError, match="outside the memory of its contexts"):
            t.numpy()


def run_cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "pyggml", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


def test_cli_demo_and_info(tmp_path):
    demo = run_cli("demo", cwd=tmp_path)
    assert demo.returncode == 0, demo.stderr
    assert "graph: SCALE -> ADD -> SOFT_MAX" in demo.stdout and "row sums: [1. 1.]" in demo.stdout
    info = run_cli("info", cwd=tmp_path)
    assert info.returncode == 0 and json.loads(info.stdout)["ggml_version"] == pyggml.ggml_version()


def test_importing_from_the_source_tree_says_what_to_do():
    proc = subprocess.run([sys.executable, "-c", "import pyggml"], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert proc.returncode != 0
    assert "imported from its source tree" in proc.stderr


def test_isa_variants_are_ggml_options():
    assert ci.split_isa("vendored@avx2") == ("vendored", "avx2")
    assert ci.split_isa("pypi:libggml-python==0.9.4") == ("pypi:libggml-python==0.9.4", "")
    assert ci.parse_spec("vendored@generic") == ("vendored", "")
    for bad in ("vendored@mmx", "pypi:libggml-python==0.9.4@avx2"):
        with pytest.raises(SystemExit):
            ci.parse_spec(bad)
    d = ci.isa_defines("avx2")
    assert d["PYGGML_NATIVE"] == "OFF" and d["GGML_AVX2"] == d["GGML_FMA"] == "ON" and d["GGML_AVX512"] == "OFF"
    assert set(ci.isa_defines("generic").values()) == {"OFF"} and ci.isa_defines("") == {}
    assert any("@" in s for s in ci.DEFAULT_SPECS) and sum(s.startswith("pypi:") for s in ci.DEFAULT_SPECS) >= 8


def test_a_bisection_step_ignores_what_the_good_revision_gives_unstably():
    row = lambda case, path, bitwise, beyond: dict(case=case, path=path, bitwise=bitwise, beyond=beyond)  # noqa: E731
    diffs = [row("op:x|F16|0", "ggml", False, True),          # unstable at the good revision
             row("op:x|F16|1", "ggml", False, True),          # out of bounds there
             row("op:x|F32|0", "ggml", False, False),         # within tolerance
             row("op:x|F32|1", "ggml", True, False),          # the same bits
             row("op:x|F32|2", "ggml-ref", False, True)]      # a real change
    got = bis.changed_outputs(diffs, {"op:x|F16|0|ggml"}, {"op:x|F16|1"}, bitwise=False)
    assert [d["case"] for d in got] == ["op:x|F32|2"]
    got = bis.changed_outputs(diffs, {"op:x|F16|0|ggml"}, {"op:x|F16|1"}, bitwise=True)
    assert [d["case"] for d in got] == ["op:x|F32|0", "op:x|F32|2"]
    assert bis.changed_outputs(diffs[:2], {"op:x|F16|0|ggml"}, {"op:x|F16|1"}, bitwise=True) == []


def test_a_bisection_step_compares_which_outputs_are_wrong(tmp_path):
    def doc(name, verdicts):
        rows = [dict(subject="op:x", type="F16", index=i, a=a, b=b, verdict=v) for i, (a, b, v) in enumerate(verdicts)]
        (tmp_path / name).write_text(json.dumps({"rows": rows}))
        return tmp_path / name
    good = doc("good.json", [("ggml", "reference", "fail"), ("ggml", "reference", "ok"),
                             ("ggml", "torch", "fail"), ("ggml", "reference", "refused")])
    same = doc("same.json", [("ggml", "reference", "oob"), ("ggml", "reference", "ok"),
                             ("ggml", "torch", "ok"), ("ggml", "reference", "refused")])
    fixed = doc("fixed.json", [("ggml", "reference", "ok"), ("ggml", "reference", "ok"),
                               ("ggml", "torch", "ok"), ("ggml", "reference", "refused")])
    assert bis.wrong_outputs(good) == {"op:x|F16|0|ggml"} == bis.wrong_outputs(same)   # still wrong
    assert bis.wrong_outputs(fixed) == set()


def test_backend_suffixes_are_pyggml_options():
    assert ci.split_backends("vendored+blas") == ("vendored", ("blas",))
    assert ci.split_backends("src:/x/ggml-org+ggml/repo") == ("src:/x/ggml-org+ggml/repo", ())
    assert ci.split_backends("src:/x/a+b+blas") == ("src:/x/a+b", ("blas",))
    assert ci.parse_spec("vendored+blas@avx2") == ("vendored", "")
    assert ci.parse_spec("patched:vendored+blas") == ("patched", "")
    d = ci.build_defines("vendored+blas@avx2")
    assert d["PYGGML_BLAS"] == "ON" and d["GGML_AVX2"] == "ON" and d["PYGGML_NATIVE"] == "OFF"
    assert ci.build_defines("vendored") == {}
    with pytest.raises(SystemExit, match="only a source build"):
        ci.build_defines("pypi:libggml-python==0.17.0+blas")


def _spec(version, isa="native", defects=None, found=None, per_op=None):
    return dict(spec=f"v{version}{'' if isa == 'native' else '@' + isa}", ggml_version=version, built=True, isa=isa,
                defects=defects or {}, parity={"counts": {}, "ops": {}, "found": found or {}},
                diff={"against": "v0.20.2", "per_op": per_op or {}})


def test_timeline_first_seen_and_last_absent():
    op = lambda beyond: {"outputs": 4, "bitwise": 4 - beyond, "differ": beyond, "beyond": beyond,  # noqa: E731
                         "closer_a": beyond, "closer_b": 0}
    rows = [_spec("0.20.2", defects={"fab-batch-gqa": 64}),
            _spec("0.9.4", defects={"fab-batch-gqa": 0}, per_op={"op:rope": op(2)}),
            _spec("0.13.1", defects={"fab-batch-gqa": 64}, found={"oob:conv_2d": ["case: past"]},
                  per_op={"op:rope": op(1)}),
            _spec("0.17.0", defects={"fab-batch-gqa": 64}, per_op={"op:rope": op(0)}),
            _spec("0.20.2", isa="avx", defects={"fab-batch-gqa": 0})]          # an ISA variant: not a release
    items = {t["id"]: t for t in report.timeline(rows)}
    fab = items["defect:fab-batch-gqa"]
    assert (fab["first_seen"], fab["last_absent"], fab["absent_again"]) == ("0.13.1", "0.9.4", None)
    rope = items["disagrees:op:rope"]
    assert (rope["first_seen"], rope["last_absent"], rope["absent_again"]) == ("0.9.4", None, "0.17.0")
    oob = items["oob:conv_2d"]
    assert (oob["first_seen"], oob["last_absent"], oob["absent_again"]) == ("0.13.1", "0.9.4", "0.17.0")
    text = report.format_timeline(list(items.values()), ["0.9.4", "0.13.1", "0.17.0", "0.20.2"])
    assert "defect:fab-batch-gqa: first seen 0.13.1, last absent 0.9.4" in text
    dis = report.disagreements(rows)
    assert "op:rope: v0.9.4 2/4 (A 2, B 0); v0.13.1 1/4" in dis
    assert "undecided" not in dis
    # an output diff could not decide from digests (format 3) is counted, with what decides it
    rows[3]["diff"]["per_op"]["attention"] = {**op(0), "bitwise": 3, "differ": 1, "undecided": 1}
    assert "v0.17.0: 8 outputs compared, 7 bitwise equal, 1 differ, 0 beyond, 1 undecided (saved as digests: " \
           "rerun with --save-whole)" in report.disagreements(rows)


def test_a_kernel_verdict_of_ok_is_an_absent_defect():
    """A verdict probe measures "ok" where a defect is absent (fixed, or never there): the
    matrix must not list it as seen (the first run of rope-ndims0-hang's probe showed
    "first seen 0.17.0" for a defect no release before 0.21 has)."""
    rows = [_spec("0.17.0", defects={"hang-probe": "ok", "oob-probe": "out-of-bounds"}),
            _spec("0.20.2", defects={"hang-probe": "hang", "oob-probe": "ok"})]
    items = {t["id"]: t for t in report.timeline(rows)}
    hang, oob = items["defect:hang-probe"], items["defect:oob-probe"]
    assert (hang["first_seen"], hang["last_absent"]) == ("0.20.2", "0.17.0")
    assert (oob["first_seen"], oob["absent_again"]) == ("0.17.0", "0.20.2")
    for v, want in ((None, False), (0, False), ("ok", False), (64, True), ("hang", True), ("abort", True)):
        assert report.measures_defect(v) is want, v


def test_parity_summary_keeps_the_worst_verdict_and_the_findings():
    rows = [dict(op="a", verdict="ok", case="c", detail=""), dict(op="a", verdict="refused", case="c", detail=""),
            dict(op="b", verdict="oob", case="c2", detail="wrote 4 bytes past"), dict(op="b", verdict="ok", case="c",
                                                                                      detail="")]
    s = report.parity_summary(rows)
    assert s["ops"] == {"a": "refused", "b": "oob"} and s["counts"] == {"ok": 2, "refused": 1, "oob": 1}
    assert s["found"] == {"oob:b": ["c2: wrote 4 bytes past"]}


def test_bisect_finds_the_first_commit_that_changed(tmp_path):
    repo = tmp_path / "upstream"
    repo.mkdir()
    git = lambda *a: subprocess.run(["git", "-C", str(repo), *a], check=True, capture_output=True,  # noqa: E731
                                    text=True).stdout.strip()
    git("init", "-q")
    git("config", "user.email", "ci@example.invalid")
    git("config", "user.name", "ci")
    shas = []
    for i, value in enumerate([1, 1, 1, 2, 2, 2, 2]):       # commit 3 changes the result
        (repo / "result.txt").write_text(f"{value}\n")
        (repo / "n.txt").write_text(f"{i}\n")
        git("add", ".")
        git("commit", "-q", "-m", f"commit {i}")
        shas.append(git("rev-parse", "HEAD"))
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "ci_upstream.py"), "--bisect", f"src:{repo}",
                           "--good", shas[0], "--bad", shas[-1], "--bisect-test", 'test "$(cat result.txt)" = 1',
                           "--workdir", str(tmp_path / "w")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"changed: {shas[3]}" in proc.stdout and "commit 3" in proc.stdout
    assert git("rev-parse", "HEAD") == shas[-1]              # the checkout is left where it was
    bad = subprocess.run([sys.executable, str(ROOT / "scripts" / "ci_upstream.py"), "--bisect", f"src:{repo}",
                          "--good", shas[0]], capture_output=True, text=True)
    assert bad.returncode == 2 and "needs --good REV, --bad REV" in bad.stderr


patch = load_script("patch_upstream")


@pytest.fixture
def ggml_copy(tmp_path):
    src = ROOT / "vendor" / "ggml"
    if not (src / "src" / "ggml-cpu").is_dir():
        pytest.skip("vendor/ggml is not populated (a build populates it)")
    import shutil
    dst = tmp_path / "ggml"
    for rel in ("include", "src/ggml-cpu"):
        shutil.copytree(src / rel, dst / rel)
    return dst


def test_the_upstream_fixes_edit_only_their_expressions(ggml_copy):
    files = {p: p.read_text() for p in (ggml_copy / "src" / "ggml-cpu").glob("*.c*")}
    (ggml_copy / ".pyggml-source").write_text("pypi:pkg==1 sha256:ab\n")      # as vendor_ggml.py leaves it
    assert patch.status(ggml_copy) == {"fab-batch-gqa-oob": "not applied", "fab-work-size": "not applied"}
    assert patch.apply(ggml_copy) == {"fab-batch-gqa-oob": "applied", "fab-work-size": "applied"}
    assert patch.apply(ggml_copy) == {"fab-batch-gqa-oob": "applied", "fab-work-size": "applied"}  # idempotent
    # the tree's stamp says it is no longer the sdist's as fetched (the build reports it)
    assert (ggml_copy / ".pyggml-source").read_text() == (
        "pypi:pkg==1 sha256:ab; patched by scripts/patch_upstream.py: fab-batch-gqa-oob, fab-work-size\n")
    changed = {p.name: (before, p.read_text()) for p, before in files.items() if p.read_text() != before}
    assert set(changed) == {"ops.cpp", "ggml-cpu.c"}
    for name, (before, after) in changed.items():
        diff = [(a, b) for a, b in zip(before.splitlines(), after.splitlines()) if a != b]
        assert len(before.splitlines()) == len(after.splitlines())
        assert len(diff) == (2 if name == "ops.cpp" else 1)          # one line per edited expression
        for a, b in diff:
            if name == "ops.cpp":                # the k and v batch strides: q's head count becomes k's / v's
                assert a.replace("neq2", "nek2") == b or a.replace("neq2", "nev2") == b
            else:                                # the plan: a cache line more per row of S and SM
                assert "CACHE_LINE_SIZE_F32" in b and "CACHE_LINE_SIZE_F32" not in a


def test_an_upstream_tree_that_moved_on_is_not_patched(ggml_copy, tmp_path):
    ops = ggml_copy / "src" / "ggml-cpu" / "ops.cpp"
    text = ops.read_text()
    line = next(ln for ln in text.splitlines() if "nbgk3" in ln and "neq2" in ln)
    ops.write_text(text + "\n// " + line + "\n")         # the expression twice: ambiguous
    with pytest.raises(SystemExit, match="fab-batch-gqa-oob: cannot apply"):
        patch.apply(ggml_copy)
    assert ops.read_text() == text + "\n// " + line + "\n"  # nothing changed
    with pytest.raises(SystemExit, match="not a ggml source tree"):
        patch.status(tmp_path / "nothing")


def test_the_attention_benchmark_measures_every_kernel_side_by_side(tmp_path):
    """A smoke run of scripts/bench_flash_attn_back.py (no timing is asserted: rates on a
    shared machine are the script's output, not a test's): every kernel measured (the
    graph node too, --node), the ratios computed from the same run, the memory measured."""
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_flash_attn_back.py"), "--quick",
                           "--repeat", "2", "--threads", "1", "--node", "--json", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["sgemm_gflops"] > 0 and len(doc["rows"]) == 4       # N 256, 512 x masked or not
    assert doc["cpu"] and doc["blas"] and doc["command"][-2:] == ["--json", str(out)]
    assert doc["isa"] == _attn.set_isa("auto")                       # the kernel's path, named
    assert doc["tile_gflops"]["64"] > 0     # its tile products in cache, and each row's share of that,
    for r in doc["rows"]:                   # round by round against the ceiling measured in the round
        lse = r["cpu_rounds"]["blocked+lse"]
        assert len(r["tile_rounds"]) == 2 and r["lse_over_tile"] == pytest.approx(
            statistics.median(r["flops"] / t / 1e9 / c for t, c in zip(lse, r["tile_rounds"])))
    if doc["isa"] != "portable":    # the measured peak, and each row's share of it from the same run
        assert doc["fma_peak_gflops"] > 0
        for r in doc["rows"]:
            assert r["lse_over_peak"] == pytest.approx(statistics.median(
                r["flops"] / t / 1e9 / c for t, c in zip(r["cpu_rounds"]["blocked+lse"], r["peak_rounds"])))
    for r in doc["rows"]:
        assert {"ggml", "blocked", "blocked+lse", "float64", "node"} <= set(r["gflops"])
        assert all(v > 0 for v in r["gflops"].values())
        rounds = r["cpu_rounds"]        # the kernels alternated: one time each per round
        assert len(rounds["ggml"]) == len(rounds["blocked"]) == len(rounds["node"]) == 2
        assert r["blocked_over_ggml"] == pytest.approx(
            statistics.median(g / b for g, b in zip(rounds["ggml"], rounds["blocked"])))
        assert r["cpu_s"]["blocked"] == pytest.approx(statistics.median(rounds["blocked"]))
        assert r["extra_bytes"]["blocked"] > 0 and r["extra_bytes"]["ggml"] > 0
    assert "GFLOP/s per CPU-second" in proc.stdout and "blk/ggml" in proc.stdout
    assert f"CPU: {cpu_model()}" in proc.stdout and "FMA peak measured" in proc.stdout


def test_the_threads_benchmark_compares_every_system_on_1_and_2_threads(tmp_path):
    """A smoke run of scripts/bench_threads.py (no timing asserted): both graphs, every
    system (the C ones where a compiler and the vendored headers are here), each on 1 and
    2 threads, with the gain computed from the same run."""
    out = tmp_path / "threads.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_threads.py"), "--repeat", "7",
                           "--rounds", "1", "--json", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    has_c = "C figures skipped" not in proc.stdout
    systems = (["C, thread that stays", "C, new thread per compute"] if has_c else []) + \
        ["pyggml Graph.compute", "pyggml Backend"]
    assert sorted(doc) == sorted(f"{g}/{s}" for g in ("matmul", "decode") for s in systems)
    for row in doc.values():
        assert all(row[k] > 0 for k in ("wall_1", "wall_2", "cpu_1", "cpu_2"))
    gains = [ln.split()[-1] for ln in proc.stdout.splitlines() if ln.strip().startswith(("C,", "pyggml "))
             and ln.rstrip().endswith("x") and "/" not in ln]
    assert len(gains) == len(doc)
    assert f"CPU: {cpu_model()}" in proc.stdout


def test_the_training_benchmark_trains_the_same_models_in_both(tmp_path):
    """A smoke run of scripts/bench_train.py (no timing asserted): ggml-opt and torch train
    the same two models from the same weights on the same batches with the same AdamW, so
    their losses after the same epochs agree (a benchmark of two different computations
    would not); the CPU backend's two kernel rates are printed."""
    pytest.importorskip("torch")
    out = tmp_path / "train.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_train.py"), "--rounds", "1",
                           "--json", str(out)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert sorted(doc["models"]) == ["digits", "mlp784"] and doc["backends"] == ["CPU"] and doc["threads"] == 1
    for row in doc["models"].values():
        assert row["pyggml_ms"] > 0 and row["torch_ms"] > 0
        assert 0 < row["loss_pyggml"] < 3 and row["loss_pyggml"] == pytest.approx(row["loss_torch"], rel=1e-3)
    k = doc["cpu_backend_kernels"]
    assert all(v > 0 for v in k.values()) and k["OUT_PROD_ms"] < k["forward_backward_ms"]
    assert "OUT_PROD" in proc.stdout and f"CPU: {cpu_model()}" in proc.stdout


def test_the_build_comparison_benchmark_runs_both_builds(tmp_path):
    """A smoke run of scripts/bench_matmul_builds.py --dry-run, this interpreter as both
    builds: every weight type timed in each, the ratio printed, the llamafile flag read."""
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_matmul_builds.py"), "--dry-run",
                           "--a", sys.executable, "--b", sys.executable],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    flag = pyggml.build_info()["llamafile"]
    assert f"(llamafile {flag})" in proc.stdout
    rows = [ln.split() for ln in proc.stdout.splitlines() if ln.split()[:1] in (["F32"], ["F16"], ["Q8_0"], ["Q4_0"])]
    assert [r[0] for r in rows] == ["F32", "F16", "Q8_0", "Q4_0"] and all(float(r[3]) > 0 for r in rows)


def test_the_gpu_check_runs_its_in_process_steps_with_the_cpu_in_place_of_the_gpu(tmp_path, capsys):
    """scripts/gpu_check.py --dry-run (.ci/run runs the whole script, build and pytest included):
    the Llama block node by node and flash attention against float64, judged, in one JSON."""
    gc = load_script("gpu_check")
    rc = gc.main(["--dry-run", "--out", str(tmp_path), "--only", "info,llama,attention"])
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    steps = {s["step"]: s for s in report["steps"]}
    assert rc == 0 and report["device"] == "CPU" and report["dry_run"]
    assert [steps[s]["verdict"] for s in ("info", "tests", "parity", "llama", "attention")] == \
        ["ok", "skipped", "skipped", "ok", "ok"]
    llama = steps["llama"]["details"]
    assert llama["out_nmse_vs_cpu"] == 0.0
    if "compare_unavailable" not in llama:          # ggml 0.9.4's compare_graph_backend differs
        assert llama["compared"] >= 20 and llama["first_diverging"] is None
    cases = steps["attention"]["details"]["cases"]
    assert [(c["D"], c["N"]) for c in cases] == [(64, 128), (128, 64), (128, 1)]
    assert all(0 < c["device_nmse_f64"] < gc.FA_NMSE for c in cases)
    assert "llama      ok" in capsys.readouterr().out


def test_the_gpu_checks_isolated_steps_report_a_crash_or_a_hang_as_that_steps_failure():
    """--isolate-steps (scripts/vulkan_check.sh): an in-process step in a forked child; its
    outcome comes back, and a child killed by a signal (a driver's crash) or past the time
    limit is the step's FAIL, not the check's end."""
    import os
    import signal
    gc = load_script("gpu_check")

    def fine(c):
        c.verdict, c.summary, c.details = "ok", "computed", {"nmse": 1e-7}

    def crashes(c):
        os.kill(os.getpid(), signal.SIGSEGV)

    def hangs(c):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        while True:
            pass

    got = []
    for fn, limit in ((fine, 30), (crashes, 30), (hangs, 1)):
        c = gc.Check("x")
        gc._in_child(fn, c, limit)
        got.append((c.verdict, c.summary, c.details))
    assert got[0] == ("ok", "computed", {"nmse": 1e-7})
    assert got[1][:2] == ("FAIL", "the step's process died: killed by signal 11 (SIGSEGV)")
    assert got[2][:2] == ("FAIL", "no result within 1 s")


def test_the_gpu_check_fails_for_a_device_the_build_lacks(tmp_path):
    gc = load_script("gpu_check")
    assert gc.main(["--device", "CUDA0", "--out", str(tmp_path), "--only", "info,llama"]) == 1
    steps = {s["step"]: s for s in json.loads((tmp_path / "gpu_check.json").read_text())["steps"]}
    assert steps["info"]["verdict"] == "FAIL" and "CUDA0 is not among the devices" in steps["info"]["summary"]
    assert steps["llama"]["verdict"] == "skipped" and steps["llama"]["summary"] == "the device is not there"


def test_the_registry_cuda_toolkit_gets_the_unversioned_names_a_linker_looks_for(tmp_path):
    ct = load_script("cuda_toolkit")
    root = ct.toolkit_root(tmp_path)
    (root / "lib").mkdir(parents=True)
    for target in ct.LINKS.values():
        (root / "lib" / target).write_bytes(b"\x7fELF")
    assert sorted(ct.link(root)) == ["lib64", "libcublas.so", "libcublasLt.so", "libcudart.so"]
    assert (root / "lib64" / "libcudart.so.13").is_file()
    assert (root / "lib" / "libcudart.so").resolve() == (root / "lib" / "libcudart.so.13").resolve()
    assert ct.link(root) == []                                 # a second run makes none
    (root / "lib" / "libcublasLt.so.13").unlink()
    (root / "lib" / "libcublasLt.so").unlink()
    with pytest.raises(SystemExit, match="libcublasLt.so.13 is missing"):
        ct.link(root)
    cmd = ct.build_command(root, "90")
    assert cmd.startswith(f"CUDACXX={root}/bin/nvcc CUDAToolkit_ROOT={root} PYGGML_CUDA=ON pip install .")
    assert cmd.endswith("CMAKE_CUDA_ARCHITECTURES=90 -Ccmake.define.GGML_CUDA_NO_VMM=ON")
    assert all(w.count("==") == 1 for w in ct.WHEELS)         # exact pins
def test_the_parity_sweep_benchmark_runs_both_proof_modes_side_by_side():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_parity_sweep.py"), "--dry-run"],
                          capture_output=True, text=True, timeout=300, cwd="/")
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("CPU: ") and "usable cores" in lines[0] and "1 round(s), medians" in lines[0]
    walls = {ln.split()[0]: float(ln.split()[2]) for ln in lines[1:3]}
    assert set(walls) == {"fork", "in-process"} and all(w > 0 for w in walls.values())
    assert lines[3].strip().startswith("in-process / fork: wall ")


def test_the_sanitizer_script_refuses_to_do_nothing():
    # (.ci/run builds with --no-test in the background, then tests with --no-build); the
    # refusal comes first, even where no C compiler is on PATH
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "sanitize.py"), "--no-build", "--no-test"],
                          capture_output=True, text=True, env={**os.environ, "PATH": ""})
    assert proc.returncode == 2 and "--no-build and --no-test leave nothing to do" in proc.stderr
