"""Kernel trust (issue 24): each op's CPU kernel is fingerprinted in the tree being built
(pyggml/_kernels.py) and compared with the print pyggml's rules were written against
(pyggml/kernels.txt); an op whose kernel differs is not trusted to its rule."""

import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from sources import built_from_the_pin, load_script, load_source, read_lock

import pyggml
from pyggml import _core
from pyggml.opinfo._common import kernel_before, kernel_since

ROOT = Path(__file__).resolve().parent.parent
CPU = ROOT / "vendor" / "ggml" / "src" / "ggml-cpu"
kern = load_source("pyggml/_kernels.py", "pyggml_kernels_under_test")

needs_tree = pytest.mark.skipif(not (CPU / "ggml-cpu.c").is_file(), reason="vendor/ggml is not populated")


@pytest.fixture
def cpu_copy(tmp_path):
    if not (CPU / "ggml-cpu.c").is_file():
        pytest.skip("vendor/ggml is not populated")
    dst = tmp_path / "ggml-cpu"
    dst.mkdir()
    for name in kern.OP_LEVEL:
        shutil.copy(CPU / name, dst / name)
    return dst


@needs_tree
def test_the_pinned_prints_are_the_vendored_tree_s():
    if not built_from_the_pin():
        pytest.skip("the rules' prints are of the pinned release")
    want = kern.read_prints(str(ROOT / "pyggml" / "kernels.txt"))
    got = kern.fingerprints(str(CPU))
    assert got == want
    assert len(got) > 90 and "ROPE" in got and "UNARY" in got and "COUNT" not in got


def _dispatch_callee(cpu, op):
    """The function ggml-cpu.c's dispatch calls for ``op`` (found, not named here)."""
    text = kern.strip((cpu / "ggml-cpu.c").read_text())
    block = kern.case_blocks(text)[op][0]
    return kern._CALL.findall(block)[0]


def _edit_function(cpu, name, edit):
    """Apply ``edit`` to the first definition of ``name`` in the op-level sources."""
    for f in kern.OP_LEVEL:
        path = cpu / f
        text = path.read_text()
        i = text.find(f" {name}(")
        while i >= 0:
            brace = text.find("{", i)
            semi = text.find(";", i)
            if brace >= 0 and (semi < 0 or brace < semi):
                path.write_text(text[:brace + 1] + edit + text[brace + 1:])
                return f
            i = text.find(f" {name}(", i + 1)
    raise AssertionError(f"{name} not found")


def test_a_changed_kernel_changes_its_op_s_print_only(cpu_copy):
    before = kern.fingerprints(str(cpu_copy))
    callee = _dispatch_callee(cpu_copy, "ROPE")
    _edit_function(cpu_copy, callee, "\n    if (0) { return; }\n")
    after = kern.fingerprints(str(cpu_copy))
    assert kern.changed(before, after) == ["ROPE"]


def test_a_function_deeper_in_the_kernel_counts_too(cpu_copy):
    before = kern.fingerprints(str(cpu_copy))
    text = kern.strip(" ".join((cpu_copy / f).read_text() for f in kern.OP_LEVEL))
    defs = kern.functions(text)
    first = _dispatch_callee(cpu_copy, "SOFT_MAX")
    deeper = [c for c in kern._CALL.findall(defs[first]) if c in defs and c != first][0]
    _edit_function(cpu_copy, deeper, "\n    (void) 0;\n")
    changed = kern.changed(before, kern.fingerprints(str(cpu_copy)))
    assert "SOFT_MAX" in changed and "ADD" not in changed


def test_comments_and_whitespace_do_not_count(cpu_copy):
    before = kern.fingerprints(str(cpu_copy))
    callee = _dispatch_callee(cpu_copy, "ROPE")
    _edit_function(cpu_copy, callee, "\n\n    // a comment\n    /* and\n another */   \n")
    assert kern.fingerprints(str(cpu_copy)) == before


def test_the_dispatch_block_counts(cpu_copy):
    before = kern.fingerprints(str(cpu_copy))
    path = cpu_copy / "ggml-cpu.c"
    text = path.read_text()
    i = text.index("case GGML_OP_SQR:")
    path.write_text(text[:i] + "case GGML_OP_SQR: (void) 0;" + text[i + len("case GGML_OP_SQR:"):])
    assert "SQR" in kern.changed(before, kern.fingerprints(str(cpu_copy)))


def test_new_and_removed_ops_are_changed():
    assert kern.changed({"A": "1", "B": "2"}, {"A": "1", "C": "3"}) == ["B", "C"]


def test_a_reviewed_print_of_another_release_is_trusted_too(tmp_path):
    prints = tmp_path / "kernels.txt"
    prints.write_text("# header\nA 1\nB 2\n")
    assert kern.review(str(prints), ["B"], {"A": "1", "B": "9"}, "0.25.3") == ["B 9 0.25.3\n"]
    assert kern.review(str(prints), ["B"], {"B": "9"}, "0.25.3") == []          # once
    with pytest.raises(KeyError, match="C"):
        kern.review(str(prints), ["C"], {"B": "9"}, "0.25.3")
    assert kern.read_prints(str(prints)) == {"A": "1", "B": "2"}                # the pinned ones
    accepted = kern.read_accepted(str(prints))
    assert accepted == {"A": {"1"}, "B": {"2", "9"}}
    assert kern.changed(accepted, {"A": "1", "B": "9"}) == []                   # the reviewed release
    assert kern.changed(accepted, {"A": "1", "B": "2"}) == []                   # the pinned one
    assert kern.changed(accepted, {"A": "1", "B": "8"}) == ["B"]                # any other


def test_rewriting_the_pinned_prints_keeps_the_reviewed_ones(tmp_path, cpu_copy):
    prints = tmp_path / "kernels.txt"
    prints.write_text("ROPE 00 0.25.3\nADD 11\n")
    tree = tmp_path / "tree"
    (tree / "src").mkdir(parents=True)
    cpu_copy.rename(tree / "src" / "ggml-cpu")
    with pytest.raises(SystemExit):                 # the release the prints are of is not optional
        kern.main(["--tree", str(tree), "--expected", str(prints), "--write"])
    assert kern.main(["--tree", str(tree), "--expected", str(prints), "--write", "--release", "0.20.2"]) == 0
    text = prints.read_text()
    assert text.startswith(kern.HEADER) and text.endswith("ROPE 00 0.25.3\n") and "ADD 11\n" not in text
    assert kern.read_pinned_release(str(prints)) == "0.20.2"
    assert kern.read_prints(str(prints)) == kern.fingerprints(str(tree / "src" / "ggml-cpu"))


def test_moving_the_pin_keeps_the_old_release_s_kernels_as_its_own(tmp_path, cpu_copy):
    """--write for another release: the old pinned prints that differ become lines of the
    old release (a build of it trusts them still), a review now pinned is dropped (it is
    the pin's print), other reviews and the comments stay."""
    tree = tmp_path / "tree"
    (tree / "src").mkdir(parents=True)
    cpu_copy.rename(tree / "src" / "ggml-cpu")
    got = kern.fingerprints(str(tree / "src" / "ggml-cpu"))
    prints = tmp_path / "kernels.txt"
    prints.write_text(f"pinned 0.20.2\nADD {got['ADD']}\nROPE 11\nGLU 22\n# ROPE reviewed: fine\n"
                      f"ROPE {got['ROPE']} 0.25.3\nGLU 33 0.24.0\n")
    assert kern.main(["--tree", str(tree), "--expected", str(prints), "--write", "--release", "0.25.3"]) == 0
    assert kern.read_pinned_release(str(prints)) == "0.25.3" and kern.read_prints(str(prints)) == got
    tail = prints.read_text().split(f"{sorted(got)[-1]} {got[sorted(got)[-1]]}\n", 1)[1]
    assert tail == ("# The kernels of 0.20.2, pinned before 0.25.3: the rules were written against them.\n"
                    "GLU 22 0.20.2\nROPE 11 0.20.2\n# ROPE reviewed: fine\nGLU 33 0.24.0\n")
    assert kern.review_releases(str(prints))[("ROPE", "11")] == "0.20.2"
    # writing the same release again changes nothing
    before = prints.read_text()
    assert kern.main(["--tree", str(tree), "--expected", str(prints), "--write", "--release", "0.25.3"]) == 0
    assert prints.read_text() == before


def test_the_diff_a_review_reads_shows_the_changed_statements(cpu_copy, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(cpu_copy, old)
    callee = _dispatch_callee(cpu_copy, "ROPE")
    _edit_function(cpu_copy, callee, "\n    GGML_ASSERT(dst->ne[0] > 0);\n")
    d = kern.kernel_diff("ROPE", str(old), str(cpu_copy))
    assert "+GGML_ASSERT(dst->ne[0] > 0);" in d.splitlines()
    assert [ln for ln in d.splitlines() if ln[:1] in "+-" and ln[:3] not in ("+++", "---")] == \
        ["+GGML_ASSERT(dst->ne[0] > 0);"]
    assert kern.kernel_diff("ADD", str(old), str(cpu_copy)) == ""


def test_the_reviewed_prints_name_their_release():
    for op, digest, release in kern._lines(str(ROOT / "pyggml" / "kernels.txt")):
        assert len(digest) == 64 and (release == "" or re.fullmatch(r"\d+\.\d+\.\d+", release)), (op, release)


def test_the_header_says_what_is_known():
    h = kern.gen_header(["ROPE", "UNARY"], "/t")
    assert "#define PG_KERNELS_KNOWN 1" in h and '#define PG_KERNELS_CHANGED "ROPE", "UNARY", NULL' in h
    assert "#define PG_KERNELS_CHANGED NULL" in kern.gen_header([], "/t")
    assert "#define PG_KERNELS_REVIEWED NULL" in kern.gen_header([], "/t")
    h = kern.gen_header(None, "")
    assert "#define PG_KERNELS_KNOWN 0" in h and "#define PG_KERNELS_CHANGED NULL" in h
    assert "#define PG_KERNELS_REVIEWED NULL" in h


def test_the_pinned_prints_are_of_the_pinned_release():
    lock = (ROOT / "vendor" / "ggml.lock").read_text()
    version = re.search(r"^version = (\S+)$", lock, re.M).group(1)
    assert kern.read_pinned_release(str(ROOT / "pyggml" / "kernels.txt")) == version
    h = kern.gen_header([], "/t", {}, "0.20.2")
    assert "#define PG_KERNELS_PINNED_RELEASE 20002" in h
    assert "#define PG_KERNELS_PINNED_RELEASE 0" in kern.gen_header(None, "")


def test_a_review_names_a_release_the_rules_can_compare():
    assert kern.release_number("0.25.3") == 25003 and kern.release_number("v1.2.10") == 1002010
    assert kern.release_number("0.25.3") > kern.release_number("0.20.12")
    with pytest.raises(ValueError, match="not a release"):
        kern.release_number("master")


def test_a_review_of_something_not_a_release_is_refused(tmp_path):
    prints = tmp_path / "kernels.txt"
    prints.write_text("A 1\n")
    with pytest.raises(ValueError, match="not a release"):
        kern.review(str(prints), ["A"], {"A": "9"}, "tip")
    assert prints.read_text() == "A 1\n"


def test_the_header_gives_each_reviewed_kernel_its_release(tmp_path):
    h = kern.gen_header(["ROPE"], "/t", {"SCALE": "0.25.3", "GLU": "0.26.0"})
    assert '#define PG_KERNELS_REVIEWED "GLU", "SCALE", NULL' in h
    assert "#define PG_KERNELS_REVIEWED_IN 26000, 25003, 0" in h
    assert "#define PG_KERNELS_REVIEWED_IN 0" in kern.gen_header(None, "")
    prints = tmp_path / "kernels.txt"
    prints.write_text("A 1\nB 2\nB 9 0.25.3\n")
    assert kern.review_releases(str(prints)) == {("B", "9"): "0.25.3"}


def test_a_clause_for_the_newer_kernels_follows_the_review_s_release():
    """pg_kernel_since: SCALE's rule takes BF16 where SCALE's kernel is one a review of
    0.25.3 or later accepted (that release added the BF16 kernel), and refuses it, as the
    older kernels' abort, elsewhere. Its other clauses hold for the BF16 kernel too."""
    def scale_bf16(ctx, shape=(3, 8)):
        return pyggml.scale(ctx, ctx.from_numpy(np.zeros(shape, np.uint16), type=pyggml.Type.BF16), 2.0)
    was_untrusted = _core._set_kernel_untrusted(pyggml.Op.SCALE, False)     # (a prebuilt ggml trusts none)
    was = _core._set_kernel_reviewed(pyggml.Op.SCALE, "0.25.3")
    try:
        assert _core.kernel_trust()["reviewed_in"]["SCALE"] == "0.25.3"
        with pyggml.Context(1 << 20) as ctx:
            g = pyggml.Graph(ctx, 8)
            g.build_forward_expand(scale_bf16(ctx))          # taken: not refused, not unchecked
            assert g.unchecked_ops == 0
            a = ctx.from_numpy(np.zeros((4, 16), np.uint16), type=pyggml.Type.BF16)
            gaps = pyggml.view_2d(ctx, a, 8, 4, 32, 0)     # rows of 8 of 16: not contiguous
            with pytest.raises(pyggml.KernelPreconditionError, match="contiguous"):
                pyggml.scale(ctx, gaps, 2.0)
        _core._set_kernel_reviewed(pyggml.Op.SCALE, "0.24.0")     # a review before the BF16 kernel
        with pyggml.Context(1 << 20) as ctx:
            with pytest.raises(pyggml.GGMLTypeError, match="SCALE node refused"):
                scale_bf16(ctx)
    finally:
        _core._set_kernel_reviewed(pyggml.Op.SCALE, was)
        _core._set_kernel_untrusted(pyggml.Op.SCALE, was_untrusted)
    if was is None:
        with pyggml.Context(1 << 20) as ctx:
            assert "SCALE" not in _core.kernel_trust()["reviewed_in"]
            if kernel_since("SCALE", "0.25.3"):         # the pinned kernel is 0.25.3's or later
                scale_bf16(ctx)
            elif "SCALE" not in _core.kernel_trust()["untrusted"]:
                with pytest.raises(pyggml.GGMLTypeError, match="SCALE node refused"):
                    scale_bf16(ctx)
    with pytest.raises(pyggml.ArgumentError, match="like 0.25.3"):
        _core._set_kernel_reviewed(pyggml.Op.SCALE, "tip")
    with pytest.raises(pyggml.ArgumentError, match="no op"):
        _core._set_kernel_reviewed(10_000, "0.25.3")


def test_a_reviewed_kernel_is_trusted_but_not_pinned():
    # (a print of another release reviewed: trusted to the rules, yet that release's kernel,
    # whose clauses for a range of releases (pg_kernel_since/before) still apply)
    pinned, accepted = {"A": "1", "B": "2", "C": "3"}, {"A": {"1"}, "B": {"2", "9"}, "C": {"3"}}
    got = {"A": "1", "B": "9", "C": "7"}
    assert kern.reviewed(pinned, accepted, got) == ["B"]
    assert kern.changed(accepted, got) == ["C"]


def test_this_build_reports_its_kernel_trust():
    trust = _core.kernel_trust()
    assert pyggml.build_info()["kernels"] == trust
    src = pyggml.build_info()["ggml_source"]
    if src.startswith("system:"):       # no kernel source: unknown, so no kernel trusted
        assert trust["known"] is False
        assert len(trust["untrusted"]) == len(pyggml.Op) and "MUL_MAT" in trust["untrusted"]
    elif built_from_the_pin():
        assert trust == {"known": True, "untrusted": [], "reviewed": [], "reviewed_in": {},
                         "pinned_release": read_lock()["version"]}
    elif "pypi:libggml-python==0.20.2.post1 " in src and "patched by" not in src:
        # the pin before: its kernels that differ from the pinned ones are its own lines
        olds = {op for op, _, release in kern._lines(str(ROOT / "pyggml" / "kernels.txt")) if release == "0.20.2"}
        assert len(olds) == 15 and {"ROPE", "MUL_MAT", "GLU"} <= olds
        assert {**trust, "reviewed": sorted(trust["reviewed"])} == {
            "known": True, "untrusted": [], "reviewed": sorted(olds), "reviewed_in": {op: "0.20.2" for op in olds},
            "pinned_release": "0.25.3"}


def test_an_untrusted_op_s_graph_is_proven_before_it_computes():
    """The rule passes the node, but the op's kernel is not the one it was written
    against: the node reads as unchecked, and the graph runs the forked proof first."""
    was = _core._set_kernel_untrusted(pyggml.Op.ADD, True)
    try:
        assert "ADD" in _core.kernel_trust()["untrusted"]
        with pyggml.Context(1 << 20) as ctx:
            a = ctx.from_numpy(np.arange(6, dtype=np.float32))
            b = ctx.from_numpy(np.ones(6, dtype=np.float32))
            g = pyggml.Graph(ctx)
            c = pyggml.add(ctx, a, b)
            g.build_forward_expand(c)
            assert g.unchecked_ops == 1
            g.compute(1)
            np.testing.assert_array_equal(c.numpy(), np.arange(6) + 1)
            # a node the rule refuses for silent harm stays refused (ADD's kernel would read the
            # Q8_0 b as floats: not an abort the proof could see)
            q8 = ctx.new_tensor(pyggml.Type.Q8_0, (32, 2))
            with pytest.raises(pyggml.GGMLTypeError, match="ADD node refused"):
                pyggml.add(ctx, ctx.new_tensor(pyggml.Type.F32, (32, 2)), q8)
    finally:
        _core._set_kernel_untrusted(pyggml.Op.ADD, was)
    assert "ADD" not in _core.kernel_trust()["untrusted"] or was
    with pytest.raises(pyggml.ArgumentError, match="no op"):
        _core._set_kernel_untrusted(10_000, True)


def _add_graph(ctx, n, *, offset=0, op=pyggml.add, rows=None):
    a = ctx.from_numpy(np.arange(n + offset, dtype=np.float32))
    if offset:
        a = pyggml.view_1d(ctx, a, n, 4 * offset)
    if rows is not None:
        a = pyggml.get_rows(ctx, pyggml.reshape_2d(ctx, a, 1, n), ctx.from_numpy(np.asarray(rows, np.int32)))
        a = pyggml.reshape_1d(ctx, a, len(rows))
    c = op(ctx, a, ctx.from_numpy(np.ones(a.nelements, dtype=np.float32)))
    g = pyggml.Graph(ctx)
    g.build_forward_expand(c)
    return g, c


def test_the_signature_of_a_proof_is_the_graphs_structure_not_its_data_or_addresses():
    from pyggml import _cpu
    with pyggml.Context(1 << 20) as ctx, pyggml.Context(1 << 20) as other:
        base = _cpu._graph_signature(_add_graph(ctx, 37)[0])
        assert _cpu._graph_signature(_add_graph(other, 37)[0]) == base      # other memory, other values
        for changed in (_add_graph(ctx, 38)[0], _add_graph(ctx, 37, offset=1)[0],
                        _add_graph(ctx, 37, op=pyggml.mul)[0], _add_graph(ctx, 37, op=pyggml.sub)[0]):
            assert _cpu._graph_signature(changed) != base
        # op parameters: the same op and shapes, another scale
        x = ctx.from_numpy(np.ones(8, np.float32))
        sigs = set()
        for s in (1.0, 2.0, 2.0):
            g = pyggml.Graph(ctx)
            g.build_forward_expand(pyggml.scale(ctx, x, s))
            sigs.add(_cpu._graph_signature(g))
        assert len(sigs) == 2


def test_a_graph_whose_structure_was_proven_is_not_proven_again():
    """A prebuilt ggml proves every graph: one proof per structure, not per graph."""
    from pyggml import _cpu
    was = _core._set_kernel_untrusted(pyggml.Op.ADD, True)
    try:
        def run(n, **kw):
            with pyggml.Context(1 << 20) as ctx:
                g, c = _add_graph(ctx, n, **kw)
                before = _cpu._proof_counts()
                g.compute(1)
                after = _cpu._proof_counts()
                return c.numpy().copy(), after[0] - before[0], after[1] - before[1]

        n = 41 + os.getpid() % 1000          # a size no other test of this process proved
        got, ran, kept = run(n)
        assert (ran, kept) == (1, 0) and np.array_equal(got, np.arange(n) + 1)
        got, ran, kept = run(n)
        assert (ran, kept) == (0, 1) and np.array_equal(got, np.arange(n) + 1)
        assert run(n + 1)[1:] == (1, 0)
        assert run(n, offset=3)[1:] == (1, 0)
        assert run(n, offset=3)[1:] == (0, 1)
        # a graph with an index op is proven every time: its kernels follow the indices
        assert run(n, rows=[2, 0, 1])[1:] == (1, 0)
        assert run(n, rows=[2, 0, 1])[1:] == (1, 0)
        # _cpu.prove (the defect probes' and the rule tests') always proves
        with pyggml.Context(1 << 20) as ctx:
            g, _ = _add_graph(ctx, n)
            before = _cpu._proof_counts()[0]
            _cpu.prove(g)
            assert _cpu._proof_counts()[0] == before + 1
    finally:
        _core._set_kernel_untrusted(pyggml.Op.ADD, was)


def _set_untrusted(ops):
    """mark each of ``ops`` changed; returns what to restore"""
    return {op: _core._set_kernel_untrusted(getattr(pyggml.Op, op), True) for op in ops}


def _restore(was):
    for op, flag in was.items():
        _core._set_kernel_untrusted(getattr(pyggml.Op, op), flag)


def test_a_refusal_that_stands_for_an_abort_goes_to_the_proof_where_the_kernel_changed():
    """pg_kernel_aborts: SWIGLU_OAI's refusal of F16 stands for its kernel's GGML_ABORT
    (F32 only, in every release measured). Where GLU's kernel changed, the node builds
    (unchecked) and the graph's proof decides; on a kernel that aborts the proof sees it, and the compute raises it with ggml's
    own message, the process alive. A refusal of silent harm (LEAKY_RELU's rows read out
    of bounds) and a known defect's refusal (SET one element past its destination) stand
    whatever the kernel."""
    trusted_glu = "GLU" not in _core.kernel_trust()["untrusted"]
    was = _set_untrusted(["GLU", "LEAKY_RELU", "SET"])
    try:
        with pyggml.Context(1 << 20) as ctx:
            a = ctx.from_numpy(np.zeros((3, 8), np.float16))
            t = pyggml.swiglu_oai(ctx, a, None, 1.702, 7.0)     # not refused at the call
            g = pyggml.Graph(ctx, 8)
            g.build_forward_expand(t)
            assert g.unchecked_ops == 1
            if trusted_glu:
                with pytest.raises(pyggml.GGMLAbort, match="fatal error") as e:
                    g.compute(1)
                assert not isinstance(e.value, pyggml.UpstreamDefect)
            swapped = pyggml.permute(ctx, ctx.from_numpy(np.zeros((2, 3, 4, 6), np.float32)), 0, 2, 1, 3)
            with pytest.raises(pyggml.KernelPreconditionError, match=r"contiguous over dims 1\.\.3"):
                pyggml.leaky_relu(ctx, swapped, 0.1, False)
            with pytest.raises(pyggml.UpstreamDefect, match="past src0") as d:
                pyggml.set_1d(ctx, ctx.from_numpy(np.zeros(1024, np.float32)),
                              ctx.from_numpy(np.ones(1, np.float32)), 4096)
            assert d.value.defect == "set-bounds-off-by-one"
    finally:
        _restore(was)
    with pyggml.Context(1 << 20) as ctx:       # and the kernel trusted again: refused at the call
        a = ctx.from_numpy(np.zeros((3, 8), np.float16))
        if trusted_glu:
            with pytest.raises(pyggml.GGMLTypeError, match="takes F32 only"):
                pyggml.swiglu_oai(ctx, a, None, 1.702, 7.0)


def test_the_sweep_and_the_matrix_say_which_kernels_are_untrusted(monkeypatch, capsys):
    from pyggml.parity import store
    assert store.build_identity()["untrusted_kernels"] == (
        _core.kernel_trust()["untrusted"] if _core.kernel_trust()["known"]
        else "unknown: a prebuilt ggml, no kernel trusted (every graph proven)")
    report = load_script("ci_report")
    ops = {"wrapped": ["GGML_OP_ADD"], "not_wrapped": {}}
    builders = {"bound": ["add"], "not_bound": {}, "header_only": []}
    rows = [dict(spec="vendored", ggml_version="0.20.2", ops=ops, builders=builders,
                 kernels={"known": True, "untrusted": []}),
            dict(spec="sdist:x==1", ggml_version="0.25.3", ops=ops, builders=builders,
                 kernels={"known": True, "untrusted": ["ROPE", "UNARY"], "reviewed": ["SCALE"]}),
            dict(spec="pypi:libggml-python==0.17.0", ggml_version="0.17.0", ops=ops, builders=builders,
                 kernels={"known": False, "untrusted": []})]
    text = report.op_changes(rows)
    assert "sdist:x==1: kernels not trusted to their rules (graphs proven in a forked child): ROPE, UNARY" in text
    assert "sdist:x==1: changed kernels trusted by a rule review (pyggml/kernels.txt): SCALE" in text
    assert "pypi:libggml-python==0.17.0: kernels unknown (a prebuilt ggml: no kernel source to fingerprint); " \
           "no kernel trusted: every graph proven in a forked child" in text
    assert "vendored: kernels" not in text


def _slow_graph(ctx):
    """Four 1536^3 products: seconds of one thread, far past the limits the tests set."""
    a = ctx.from_numpy(np.ones((1536, 1536), np.float32))
    t = a
    for _ in range(4):
        t = pyggml.mul_mat(ctx, a, t)
    g = pyggml.Graph(ctx, 16)
    g.build_forward_expand(t)
    return g


def test_a_proof_that_runs_past_its_time_is_a_kernel_timeout():
    """The proof's child is killed at its limit; the error is a KernelTimeout (a GGMLAbort)
    carrying the limit, not a hang of the caller."""
    import time
    with pyggml.Context(256 << 20) as ctx:
        g = _slow_graph(ctx)
        t0 = time.monotonic()
        with pytest.raises(pyggml.KernelTimeout, match="did not finish in the proof's") as e:
            pyggml._cpu.prove(g, 0.001)
        assert time.monotonic() - t0 < 5
        assert isinstance(e.value, pyggml.GGMLAbort)
        for bad in (0, -1, 1e9):
            with pytest.raises(pyggml.ArgumentError, match="timeout must be in"):
                pyggml._cpu.prove(g, bad)


def test_the_proof_time_limit_is_set_per_process_and_every_proof_keeps_it():
    """set_proof_timeout lowers the limit of every proof from then on (Graph.compute's
    own, not only prove's); the error carries the limit, also under a second."""
    import time
    was = pyggml.proof_timeout()
    assert 0 < was <= 600
    trusted = not _core._set_kernel_untrusted(pyggml.Op.MUL_MAT, True)   # as a changed kernel: proven
    try:
        ctx = pyggml.Context(256 << 20)
        g = _slow_graph(ctx)
    finally:
        _core._set_kernel_untrusted(pyggml.Op.MUL_MAT, not trusted)
    with ctx:
        assert pyggml.set_proof_timeout(0.05) == was
        try:
            assert pyggml.proof_timeout() == pytest.approx(0.05)
            t0 = time.monotonic()
            with pytest.raises(pyggml.KernelTimeout, match=r"did not finish in the proof's 0\.05 s") as e:
                g.compute(1)
            assert time.monotonic() - t0 < 5
            assert e.value.seconds == pytest.approx(0.05)
        finally:
            assert pyggml.set_proof_timeout(was) == pytest.approx(0.05)
    for bad in (0, -1, 600.5, float("nan")):
        with pytest.raises(pyggml.ArgumentError, match=r"set_proof_timeout: timeout must be in \(0, 600\] s"):
            pyggml.set_proof_timeout(bad)
    with pytest.raises(pyggml.GGMLTypeError, match="set_proof_timeout: timeout must be a real number"):
        pyggml.set_proof_timeout("1")
    assert pyggml.proof_timeout() == was


@pytest.mark.parametrize("value, want", [("0.25", "0.25"), (" 30 ", "30.0"), ("600", "600.0"),
                                         ("soon", "ArgumentError: PYGGML_PROOF_LIMIT: not a number of seconds"),
                                         ("0", "ArgumentError: set_proof_timeout: timeout must be in (0, 600]"),
                                         ("601", "ArgumentError: set_proof_timeout: timeout must be in (0, 600]")])
def test_the_proof_time_limit_comes_from_the_environment_at_import(value, want):
    import subprocess
    import sys
    env = {**os.environ, "PYGGML_PROOF_LIMIT": value}
    proc = subprocess.run([sys.executable, "-c", "import pyggml; print(pyggml.proof_timeout())"],
                          capture_output=True, text=True, env=env, cwd="/", timeout=120)
    assert want in (proc.stdout if proc.returncode == 0 else proc.stderr), (proc.stdout, proc.stderr)
    assert (proc.returncode == 0) == (not want.startswith("ArgumentError")), proc.stderr


def test_rope_with_no_rotated_dims_is_refused_where_the_kernel_changed():
    """rope-ndims0-hang: 0.20.2's kernel (and older ones) copies the row for n_dims = 0
    (allowed); a later ROPE kernel (upstream's rewritten tail copy) never returns there, nor
    may an unknown one: refused."""
    from pyggml import defects
    x = np.arange(8, dtype=np.float32).reshape(1, 1, 8)
    with pyggml.Context(1 << 20) as ctx:
        a, pos = ctx.from_numpy(x), ctx.from_numpy(np.zeros(1, np.int32))
        if kernel_before("ROPE", "0.20.3"):
            r = pyggml.rope(ctx, a, pos, 0, 0)
            g = pyggml.Graph(ctx, 8)
            g.build_forward_expand(r)
            g.compute(1)
            np.testing.assert_array_equal(r.numpy().reshape(x.shape), x)      # nothing rotated: a copy
            assert defects.get("rope-ndims0-hang").run_probe() == "ok"
        elif "ROPE" not in _core.kernel_trust()["untrusted"]:         # a later release's, trusted
            with pytest.raises(pyggml.UpstreamDefect, match="n_dims = 0 with this ggml's rope kernel"):
                pyggml.rope(ctx, a, pos, 0, 0)
        was = _core._set_kernel_untrusted(pyggml.Op.ROPE, True)
        try:
            with pytest.raises(pyggml.UpstreamDefect, match="n_dims = 0 with this ggml's rope kernel") as e:
                pyggml.rope(ctx, a, pos, 0, 0)
            assert e.value.defect == "rope-ndims0-hang"
            pyggml.rope(ctx, a, pos, 2, 0)                       # rotating dims is not refused
        finally:
            _core._set_kernel_untrusted(pyggml.Op.ROPE, was)
        # by release (pg_kernel_before): a kernel of 0.20.2 or before copies, a later one hangs
        if "ROPE" not in _core.kernel_trust()["untrusted"]:
            was = _core._set_kernel_reviewed(pyggml.Op.ROPE, "0.25.3")
            try:
                with pytest.raises(pyggml.UpstreamDefect, match="n_dims = 0"):
                    pyggml.rope(ctx, a, pos, 0, 0)
                _core._set_kernel_reviewed(pyggml.Op.ROPE, "0.17.0")
                pyggml.rope(ctx, a, pos, 0, 0)                   # an older release's kernel: not refused
            finally:
                _core._set_kernel_reviewed(pyggml.Op.ROPE, was)
