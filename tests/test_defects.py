"""The defect registry (pyggml.defects) is the one place a defect is described: every
id the kernel rules, the backward checks, the op samples or the tests use is a record
there, and the probes run on the linked ggml."""

import re
import sys
from pathlib import Path

import pytest
from sources import load_script, load_source

import pyggml
from pyggml import defects
from pyggml.defects import release_key

ROOT = Path(__file__).resolve().parent.parent


def ids_used():
    # (the C code names defects by the symbols of the generated pyggml_defects.h: a
    # misspelt one does not compile)
    used = set()
    for path in list((ROOT / "pyggml" / "opinfo").glob("*.py")) \
            + list((ROOT / "tests").glob("test_*.py")) + list((ROOT / "pyggml").glob("_*.pyx")):
        text = path.read_text()
        used |= set(re.findall(r'(?:grad_)?defect="([a-z0-9-]+)"', text))
        used |= set(re.findall(r'defect == "([a-z0-9-]+)"', text))
        used |= set(re.findall(r'UpstreamDefect\([^)]*"([a-z0-9]+(?:-[a-z0-9]+)+)"\)', text))
    return used


@pytest.mark.skipif(not (ROOT / "pyggml" / "csrc").exists(), reason="needs the source tree")
def test_every_defect_id_in_use_has_a_record():
    known = {d.id for d in defects.DEFECTS}
    missing = ids_used() - known
    assert not missing, f"defect ids without a record in pyggml/defects.py: {sorted(missing)}"


@pytest.mark.skipif(not (ROOT / "pyggml" / "csrc").exists(), reason="needs the source tree")
def test_the_c_code_names_defects_by_their_generated_symbols():
    # the generator is a build input, not installed: load it from the source tree
    gen = load_source("pyggml/_gen_ops.py", "_gen_ops_for_test")
    defect_symbol = gen.defect_symbol
    header = gen.gen_defects_header(str(ROOT / "pyggml" / "defects.py"))
    for d in defects.DEFECTS:
        assert f'#define {defect_symbol(d.id)} "{d.id}"' in header
    assert len({defect_symbol(d.id) for d in defects.DEFECTS}) == len(defects.DEFECTS)
    literal = re.compile(r'defect\s*=\s*"')
    for path in (ROOT / "pyggml" / "csrc").glob("*.c"):
        assert not literal.search(path.read_text()), f"{path.name}: a defect id as a string literal"
    used = set()
    for path in (ROOT / "pyggml" / "csrc").glob("*.c"):
        used |= set(re.findall(r"\bPG_DEFECT_[A-Z0-9_]+", path.read_text()))
    assert used and used <= {defect_symbol(d.id) for d in defects.DEFECTS}


def test_records_are_complete():
    ids = [d.id for d in defects.DEFECTS]
    assert len(ids) == len(set(ids))
    for d in defects.DEFECTS:
        assert d.title and d.where and d.action, d.id
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)+", d.id)
    listed = pyggml.known_defects()
    assert [d["id"] for d in listed] == ids and "probe" not in listed[0]


def test_every_probe_a_record_names_is_a_function_of_the_probes_module():
    from pyggml import _defect_probes

    named = [d.probe for d in defects.DEFECTS if d.probe]
    assert len(named) >= 11
    for name in named:
        assert callable(getattr(_defect_probes, name, None)), name
    assert sorted(set(named)) == sorted(named)          # one record per probe


def test_a_record_without_a_probe_names_the_tests_that_show_it_on_the_releases_it_names():
    """seen_in is measured: without a probe, by the tests in shown_by (each runs ggml's own
    code and asserts the symptom), which run on the pinned release in every CI run; a record
    names the pinned release only with such tests, and each names a test that exists (and
    the defect)."""
    pinned = pyggml.build_info()["kernels"]["pinned_release"]
    shown = 0
    for d in defects.DEFECTS:
        for node in d.shown_by:
            path, _, name = node.partition("::")
            text = (ROOT / path).read_text() if (ROOT / path).exists() else ""
            assert re.search(rf"^def {re.escape(name)}\(", text, re.M), f"{d.id}: no test {node}"
            assert d.id in text, f"{d.id}: {path} does not name the defect"
        # (undefined behaviour is shown by the sanitizer stage, which halts on it unsuppressed)
        if not d.probe and not d.ubsan and pinned in d.seen_in and d.id != "kernel-out-of-bounds":
            assert d.shown_by, f"{d.id}: seen in {pinned} by no probe and no test"
        shown += bool(d.shown_by)
    assert shown >= 27


def test_the_registry_loads_without_pyggml():
    # scripts/sanitize.py reads the UBSan suppressions from this file before any build
    import ast

    tree = ast.parse(Path(defects.__file__).read_text())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = {n.module if isinstance(n, ast.ImportFrom) else a.name for n in top for a in n.names}
    assert names <= set(sys.stdlib_module_names) | {"__future__"}, names - set(sys.stdlib_module_names)


def test_probes_measure_the_linked_ggml():
    found = defects.probe_all()
    assert set(found) == {d.id for d in defects.DEFECTS}
    if pyggml.ggml_version() in ("0.20.2", "0.25.3") and "patched by" not in pyggml.build_info()["ggml_source"]:
        # those releases as published (a tree patched by scripts/patch_upstream.py: 0, 0)
        assert found["fab-batch-gqa-oob"] == 768
        assert found["fab-work-size"] == 64
    if pyggml.ggml_version() == "0.20.2":
        # (scripts/patch_upstream.py does not touch the add kernels)
        assert found["add-q-no-from-float"] == "abort"


def test_the_releases_a_record_names_agree_with_its_probe_here():
    """seen_in and fixed_in are measurements: on a release a record names, its probe
    measures the same again (a tree scripts/patch_upstream.py fixed measures it gone)."""
    here = pyggml.ggml_version()
    source = pyggml.build_info()["ggml_source"]
    # (a source tree's origin ends "...; patched by scripts/patch_upstream.py: ID, ID)")
    patched = set(re.findall(r"[a-z0-9]+(?:-[a-z0-9]+)+", source.partition("patched by scripts/patch_upstream.py: ")[2]))
    named = 0
    for d in defects.DEFECTS:
        if d.fixed_in:
            assert d.seen_in and all(release_key(v) < release_key(d.fixed_in) for v in d.seen_in), d.id
        found = defects.measures_defect(d.run_probe())
        if found is None:
            continue
        if d.id in patched or (d.fixed_in and release_key(here) >= release_key(d.fixed_in)):
            assert found is False, f"{d.id}: recorded fixed here ({here}), the probe measures it"
            named += 1
        elif here in d.seen_in:
            assert found is True, f"{d.id}: recorded as seen in {here}, the probe does not measure it"
            named += 1
    if here == "0.20.2":
        assert named >= 6           # every probe but rope-ndims0-hang's (0.25.3 only)


@pytest.mark.parametrize("measurement, present", [("ok", False), ("abort", True), ("out-of-bounds", True),
                                                  (0, False), (64, True), (None, None)])
def test_a_probe_that_measures_a_fixed_kernel_reads_as_absent(measurement, present):
    # a kernel-verdict probe returns "ok" once upstream fixed the defect: that is absence,
    # although bool("ok") is True
    assert defects.measures_defect(measurement) is present


def test_present_follows_the_probes_of_kernel_verdicts():
    for d in defects.DEFECTS:
        if d.probe and "kernel verdict" in d.probe_unit:
            assert defects.present(d.id) is defects.measures_defect(d.run_probe())


@pytest.mark.skipif(not (ROOT / "scripts" / "sanitize.py").exists(), reason="needs the source tree")
def test_the_sanitized_build_suppresses_exactly_the_recorded_upstream_ub(tmp_path):
    """scripts/sanitize.py hands UBSan the suppressions of the records (Defect.ubsan), one
    check at one function each, and keeps every other report fatal."""
    script = load_script("sanitize", "sanitize_for_test")
    want = [s for d in defects.DEFECTS for s in d.ubsan]
    assert want and script.ubsan_suppressions() == want
    for line in want:
        # UBSan's check names; a C identifier, not a wildcard or a file
        assert re.fullmatch(r"(alignment|shift-base|shift-exponent|signed-integer-overflow|enum):[A-Za-z_]\w*", line)
    lines = script.write_suppressions(tmp_path).read_text().splitlines()
    assert [x for x in lines if not x.startswith("#")] == want
    assert "-fno-sanitize-recover" not in script.FLAGS     # (a fatal check would ignore the suppressions)


def test_the_index_of_defects_is_what_the_records_say():
    # docs/upstream-defects-index.md is generated from the records (scripts/defects_doc.py)
    doc = load_script("defects_doc", "defects_doc_under_test")
    text = doc.render()
    assert (ROOT / "docs" / "upstream-defects-index.md").read_text() == text, \
        "run python scripts/defects_doc.py"
    for d in defects.DEFECTS:
        assert f"### `{d.id}`: {d.title}" in text
    pinned = pyggml.build_info()["kernels"]["pinned_release"]
    present = text.split(f"## Present in ggml {pinned}")[1].split("\n## ")[0]
    assert all(f"`{d.id}`" in present for d in defects.DEFECTS if pinned in d.seen_in and not d.fixed_in)
    assert "`q1-0-dot-misaligned-load`" not in present   # (UBSan, not measured in the pin)
    assert doc.main(["--check"]) == 0


def test_a_release_is_ordered_by_its_numbers_not_its_text():
    assert release_key("0.25.3") == (0, 25, 3) and release_key("0.25.3-dev") == (0, 25, 3)
    assert release_key("0.9.4") < release_key("0.17.0") < release_key("0.20.2") < release_key("0.25.3")
    assert release_key("unknown") == release_key(None) == ()
