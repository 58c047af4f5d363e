"""The op table (pyggml/ops.txt), its generator and the drift guards.

The generator tests run pyggml/_gen_ops.py from the source tree into a temporary
directory; the drift-guard test compiles its output with the build's own flags.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import pyggml
from pyggml import _optable
from sources import built_from_the_pin

ROOT = Path(__file__).resolve().parent.parent
GEN = ROOT / "pyggml" / "_gen_ops.py"
TABLE = ROOT / "pyggml" / "ops.txt"
HEADER = ROOT / "vendor" / "ggml" / "include" / "ggml.h"

needs_sources = pytest.mark.skipif(not (GEN.exists() and HEADER.exists()),
                                   reason="needs the source tree with vendor/ggml populated")


def generate(tmp_path, table_text, strict=False):
    table = tmp_path / "ops.txt"
    table.write_text(table_text)
    shutil.copy(ROOT / "pyggml" / "_core.pyi.in", tmp_path / "_core.pyi.in")
    out = tmp_path / "gen"
    proc = subprocess.run([sys.executable, str(GEN), "--table", str(table), "--header", str(HEADER),
                           "--out", str(out)] + (["--strict"] if strict else []),
                          capture_output=True, text=True)
    return proc, out


def edit_row(text, name, old, new):
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.startswith(name + " ") and old in line:
            lines[i] = line.replace(old, new, 1)
            return "".join(lines)
    raise AssertionError(f"no row {name} with {old!r}")


# --- the table as this build sees it ------------------------------------------------

@pytest.mark.parametrize("release, rows, newer", [
    ("0.25.3", 227, {}),
    ("0.20.2", 224, {name: f"this ggml has no ggml_{name} (pyggml's table: since 0.25.3)"
                     for name in ("swiglu_clamp", "clamp_inplace", "dsv4_hc_pre_gated")}),
])
def test_every_row_is_bound_in_the_pinned_build(release, rows, newer):
    # the pin binds every row (strict: a drifted row fails its build); 0.20.2, the pin
    # before, every row but those of newer releases, which name the release they need
    src = pyggml.build_info()["ggml_source"]
    if pyggml.ggml_version() != release or not (built_from_the_pin() or "pypi:libggml-python==0.20.2.post1 " in src):
        pytest.skip(f"not a build of {release}'s registry tree")
    bound = [r for r in _optable.OPS if "unbound" not in r["flags"]]
    have = [r for r in bound if tuple(map(int, r["since"].split("."))) <= tuple(map(int, release.split(".")))]
    assert len(have) == rows and all(r["available"] for r in have)      # with flash_attn_back (impl=pyggml)
    assert {r["name"]: r["reason"] for r in bound if r not in have} == newer
    assert _optable.HEADER_ONLY == []


def test_graph_builders_count_and_coverage():
    rows = {r["name"] for r in _optable.OPS}
    custom = {r["name"] for r in _optable.OPS if "unbound" in r["flags"]}
    # the graph builders of ggml.h: 224 in 0.20.2 (flash_attn_back's pyggml's own), and 0.25.3's
    # swiglu_clamp, clamp_inplace and dsv4_hc_pre_gated
    assert len(rows) - len(custom) == 227
    assert custom == {"map_custom1", "map_custom1_inplace", "map_custom2", "map_custom2_inplace",
                      "map_custom3", "map_custom3_inplace", "custom_4d", "custom_inplace"}
    cov = pyggml.coverage.builder_coverage()
    assert set(cov["bound"]) | set(cov["not_bound"]) == rows
    assert not set(cov["bound"]) & set(cov["not_bound"])


def test_every_exported_op_is_a_table_row_with_a_docstring():
    for r in _optable.OPS:
        if not r["available"]:
            continue
        fn = getattr(pyggml, r["name"])
        assert fn.__doc__.startswith(f"{r['name']}(ctx")
        assert r["summary"] in fn.__doc__
        assert r["name"] in pyggml.__all__


def test_an_unavailable_op_raises_version_error(monkeypatch):
    rows = [r for r in _optable.OPS if not r["available"] and "unbound" not in r["flags"]]
    if not rows:
        pytest.skip("every row is available in this build")
    r = rows[0]
    with pyggml.Context(1 << 16) as ctx:
        with pytest.raises(pyggml.GGMLVersionError, match=f"{r['name']}: not available"):
            getattr(pyggml, r["name"])(ctx, *([None] * len(r["params"])))


def test_op_coverage_lists_every_op_of_the_linked_ggml_once():
    ops, unary, glu = pyggml._core.linked_op_names()
    names = ([f"GGML_OP_{n}" for n in ops] + [f"GGML_UNARY_OP_{n}" for n in unary]
             + [f"GGML_GLU_OP_{n}" for n in glu])
    cov = pyggml.op_coverage()
    assert sorted(cov["wrapped"] + list(cov["not_wrapped"])) == sorted(names)
    assert not set(cov["wrapped"]) & set(cov["not_wrapped"])
    assert all(isinstance(v, str) and v for v in cov["not_wrapped"].values())
    # what only custom callbacks make, and leaves, are the only ops pyggml does not wrap
    assert set(cov["not_wrapped"]) <= {"GGML_OP_NONE", "GGML_OP_MAP_CUSTOM1", "GGML_OP_MAP_CUSTOM2",
                                       "GGML_OP_MAP_CUSTOM3", "GGML_OP_CUSTOM"} or \
        not built_from_the_pin()
    assert "GGML_UNARY_OP_RELU" in cov["wrapped"] and "GGML_GLU_OP_SWIGLU" in cov["wrapped"]


# --- the generator and the drift guards ---------------------------------------------

@needs_sources
def test_an_edited_row_rewrites_only_its_familys_compiled_files(tmp_path):
    # the generator rewrites a file only when its content changes, and each family's module
    # includes only its own header: renaming cumsum's parameter must leave every other
    # module's inputs (their .pyx and pyggml_ops_<family>.h) untouched, so a rebuild
    # compiles pyggml_ops.c and _ops_reduce only
    text = TABLE.read_text()
    proc, out = generate(tmp_path, text)
    assert proc.returncode == 0, proc.stderr
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()}
    proc, _ = generate(tmp_path, edit_row(text, "cumsum", "| tensor a |", "| tensor x |"))
    assert proc.returncode == 0, proc.stderr
    after = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()}
    assert set(after) == set(before)
    touched = {name for name in after if after[name] != before[name]}
    compiled = {n for n in touched if n.endswith((".c", ".h", ".pyx"))}
    assert compiled == {"pyggml_ops.c", "pyggml_ops_reduce.h", "_ops_reduce.pyx"}
    assert touched - compiled <= {"_ops_reduce.pyi", "_optable.py"}


@needs_sources
def test_one_row_is_all_an_op_needs(tmp_path):
    # expm1 is a real builder of ggml.h; without its row it is nowhere, with it everywhere
    text = TABLE.read_text()
    without = "".join(line for line in text.splitlines(keepends=True) if not line.startswith("expm1 "))
    proc, out = generate(tmp_path, without)
    assert proc.returncode == 0, proc.stderr
    gen_files = {p.name: p.read_text() for p in out.iterdir()}
    assert "def expm1(" not in gen_files["_ops_math.pyx"]
    assert "'expm1'" not in gen_files["_ops.py"] and "'expm1'" not in gen_files["_optable.py"]
    proc, out = generate(tmp_path, text)
    gen_files = {p.name: p.read_text() for p in out.iterdir()}
    assert "def expm1(ctx, a):" in gen_files["_ops_math.pyx"]                   # the wrapper
    assert "def expm1(ctx: Context, a: Tensor) -> Tensor: ..." in gen_files["_ops_math.pyi"]  # the stub
    assert "    expm1,\n" in gen_files["_ops.py"] and "'expm1'," in gen_files["_ops.py"]    # the exports
    assert "'name': 'expm1'" in gen_files["_optable.py"]                        # coverage, tests, fuzzer
    assert "pyggml_try_expm1(" in gen_files["pyggml_ops_math.h"]                 # the guarded call
    assert "(* const fn_expm1)(struct ggml_context *, struct ggml_tensor *) = ggml_expm1;" \
        in gen_files["pyggml_ops.c"]                                            # the drift guard


@needs_sources
@pytest.mark.parametrize("name, old, new, what", [
    ("reshape_1d", "int64_t ne0", "int ne0", "narrowed"),
    ("rope_ext", "int n_dims, int mode, int n_ctx_orig, float freq_base",
     "int n_dims, int mode, float freq_base, int n_ctx_orig", "reordered"),
    ("scale", "float s", "int s", "changed"),
])
def test_a_drifted_row_fails_the_build(tmp_path, name, old, new, what):
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    proc, out = generate(tmp_path, edit_row(TABLE.read_text(), name, old, new), strict=True)
    assert proc.returncode == 0, proc.stderr
    cc = subprocess.run(["cc", "-c", "-std=gnu11", "-Werror=incompatible-pointer-types",
                         "-Wno-deprecated-declarations", f"-I{out}", f"-I{ROOT / 'pyggml' / 'csrc'}",
                         f"-I{HEADER.parent}", str(out / "pyggml_ops.c"), "-o", os.devnull],
                        capture_output=True, text=True)
    assert cc.returncode != 0, f"a {what} parameter of {name} compiled"
    assert f"fn_{name}" in cc.stderr and "incompatible-pointer-types" in cc.stderr
    # against another ggml (not strict), the row is not bound but reported
    proc, out = generate(tmp_path, edit_row(TABLE.read_text(), name, old, new))
    ns = {}
    exec((out / "_optable.py").read_text(), ns)
    row = next(r for r in ns["OPS"] if r["name"] == name)
    assert not row["available"] and "pyggml binds" in row["reason"]


@needs_sources
def test_the_pinned_table_compiles_clean(tmp_path):
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    proc, out = generate(tmp_path, TABLE.read_text(), strict=True)
    assert proc.returncode == 0, proc.stderr
    cc = subprocess.run(["cc", "-c", "-std=gnu11", "-Werror=incompatible-pointer-types",
                         "-Wno-deprecated-declarations", f"-I{out}", f"-I{ROOT / 'pyggml' / 'csrc'}",
                         f"-I{HEADER.parent}", str(out / "pyggml_ops.c"), "-o", os.devnull],
                        capture_output=True, text=True)
    assert cc.returncode == 0, cc.stderr


@needs_sources
@pytest.mark.parametrize("bad, match", [
    ("add | 0.9.4 | ADD | tensor a, tensor b |  |", "expected 6 columns"),
    ("add | 0.9 | ADD | tensor a, tensor b |  | x", "since must be a release"),
    ("add | 0.9.4 | ADD_THING! | tensor a, tensor b |  | x", "makes"),
    ("add | 0.9.4 | ADD | tensor a, tensor a |  | x", "parameter names must be unique"),
    ("add | 0.9.4 | ADD | tensor a, tensor b | fast | x", "unknown flags"),
    ("add | 0.9.4 | ADD | tensor a, void * b |  | x", "cannot pass"),
    ("add | 0.9.4 | ADD | tensor a, tensor b | check=no_such_check | x", "no such function"),
    ("add | 0.9.4 | ADD | tensor a, tensor b | check=Bad-Name | x", "unknown flags"),
])
def test_bad_rows_are_refused_by_the_generator(tmp_path, bad, match):
    proc, _ = generate(tmp_path, "[arith]\n" + bad + "\n")
    assert proc.returncode == 2 and match in proc.stderr
