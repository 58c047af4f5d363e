"""The attention subject of the parity engine: its paths agree where they should, and a
path that is off is caught. Run through the one engine (pyggml.parity.check_case), as
every subject is."""


import numpy as np
import pytest

import pyggml
from pyggml import parity, reference
from pyggml.parity import attention as A
from pyggml.parity.report import format_rows
from pyggml.parity.subjects import subject

ATT = subject("attention")
SMALL = [A.Config(8, 3, 5, 4, 2, 1, True), A.Config(5, 4, 4, 2, 2, 2, False),
         A.Config(16, 6, 6, 4, 2, 2, False)]     # the last one hits the upstream defect


def rows_of(config, paths=None, n_threads=1):
    rows, _ = parity.check_case(ATT.case(config), paths, n_threads=n_threads)
    return rows


def test_paths_agree_on_small_cases():
    rows = [r for c in SMALL for r in rows_of(c, n_threads=2)]
    assert rows and all(r.verdict in ("ok", "refused") for r in rows), format_rows(rows)
    done = [r for r in rows if r.verdict == "ok"]
    assert all(r.nmse < A.NMSE_F32 for r in done)
    assert {(r.a, r.b) for r in done} >= {("ggml", "reference"), ("autodiff", "reference"), ("ggml", "autodiff"),
                                          ("blocked", "reference")}
    # the reference is always side b, and has the tighter bound
    assert all(r.a != "reference" for r in rows)
    assert all(r.tol == (A.NMSE_REF if r.b == "reference" else A.NMSE_F32) for r in rows)


def test_defect_configuration_is_a_refused_row_not_a_failure():
    if not pyggml.defects.present("fab-batch-gqa-oob"):
        pytest.skip("this ggml's kernel does not overrun (a fixed or patched tree)")
    rows = rows_of(SMALL[2], ["ggml", "autodiff", "reference"])
    kernel_rows = [r for r in rows if "ggml" in (r.a, r.b)]
    assert kernel_rows and all(r.verdict == "refused" and r.defect == "fab-batch-gqa-oob" for r in kernel_rows)
    assert kernel_rows[0].detail.startswith("fab-batch-gqa-oob: ")
    other = [r for r in rows if "ggml" not in (r.a, r.b)]
    assert other and all(r.nmse is not None and r.verdict == "ok" for r in other)


def off_by(factor, which=0):
    kernel = A.path_kernel

    def path(q, k, v, d, masked, n_threads=None):
        grads = list(kernel(q, k, v, d, masked, n_threads))
        grads[which] = grads[which] * np.float32(factor)
        return tuple(grads)
    return path


@pytest.mark.parametrize("which", [0, 1, 2])
def test_a_gradient_scaled_by_1_001_fails_the_verdict(which, monkeypatch):
    monkeypatch.setattr(A, "path_kernel", off_by(1.001, which))
    (row,) = rows_of(SMALL[0], ["ggml", "reference"])
    # NMSE of a 0.1 % scale error is 1e-6: ten times the threshold
    assert row.nmse == pytest.approx(1e-6, rel=0.05)
    assert row.verdict == "fail" and row.repro
    assert "fail" in format_rows([row])


def test_the_wrong_head_mapping_is_a_finding(monkeypatch):
    # torch's enable_gqa groups heads (h // (H/KVH)); the kernel tiles (h % KVH)
    def grouped(q, k, v, d, masked, n_threads=None):
        return reference.attention_backward(q, k, v, d, masked=masked, mapping="group")
    monkeypatch.setattr(A, "path_reference", grouped)
    (row,) = rows_of(SMALL[0], ["ggml", "reference"])
    assert row.verdict == "fail" and row.nmse > 1e-3


def test_a_missing_mask_is_a_finding(monkeypatch):
    def unmasked(q, k, v, d, masked, n_threads=None):
        return reference.attention_backward(q, k, v, d, masked=False)
    assert SMALL[0].masked
    monkeypatch.setattr(A, "path_reference", unmasked)
    (row,) = rows_of(SMALL[0], ["ggml", "reference"])
    assert row.verdict == "fail" and row.nmse > 1e-3


def test_quick_sweep_is_a_subset_of_the_full_sweep():
    quick, full = A.sweep(quick=True), A.sweep()
    assert set(quick) <= set(full)
    assert len(quick) < len(full) / 3
    assert {c.KVH for c in full} == {2} and {c.H // c.KVH for c in full} == {1, 2, 4}
    assert {c.B for c in full} == {1, 2, 3}


def test_a_case_label_is_its_configuration():
    for c in A.sweep():
        assert A.Config.from_name(c.name) == c
    # the sweep's cases keep their index in the full sweep (saved results key on it)
    quick = ATT.cases(0, quick=True)
    assert [A.sweep()[case.index].name for case in quick] == [case.label for case in quick]
    with pytest.raises(pyggml.ArgumentError, match="not an attention configuration"):
        A.Config.from_name("D8-N3")


def test_the_repro_of_a_case_reruns_it():
    (row,) = rows_of(SMALL[0], ["ggml", "reference"])
    src = ATT.repro(ATT.case(SMALL[0]))
    env: dict = {}
    exec(compile(src.replace("print(", "out = ("), "<repro>", "exec"), env)
    assert SMALL[0].name in env["out"] and "ggml~reference" in env["out"]


def test_the_torch_ops_known_without_importing_torch_are_the_table_s():
    from pyggml.parity import torch_ops
    pytest.importorskip("torch")
    assert torch_ops.OPS == set(torch_ops._table())
