"""The attention subject of the parity harness: its paths agree where they should, and a
path that is off is caught."""


import numpy as np
import pytest

import pyggml
from pyggml import reference
from pyggml.parity import attention as parity

SMALL = [parity.Case(8, 3, 5, 4, 2, 1, True), parity.Case(5, 4, 4, 2, 2, 2, False),
         parity.Case(16, 6, 6, 4, 2, 2, False)]     # the last one hits the upstream defect


def test_paths_agree_on_small_cases():
    rows = parity.run(SMALL, parity.available_paths(), n_threads=2)
    assert rows and all(r["ok"] for r in rows), parity.format_table(rows)
    done = [r for r in rows if not r["refused"]]
    assert all(r["nmse"] < parity.NMSE_F32 for r in done)
    assert {(r["a"], r["b"]) for r in done} >= {("kernel", "reference"), ("autodiff", "reference"),
                                                ("kernel", "autodiff")}
    # the reference is always side b
    assert all(r["a"] != "reference" for r in rows)


def test_defect_configuration_is_a_refused_row_not_a_failure():
    if not pyggml.defects.present("fab-batch-gqa-oob"):
        pytest.skip("this ggml's kernel does not overrun (a fixed or patched tree)")
    rows = parity.run(SMALL[2:], ["kernel", "autodiff", "reference"])
    kernel_rows = [r for r in rows if "kernel" in (r["a"], r["b"])]
    assert kernel_rows and all(r["refused"] and r["ok"] for r in kernel_rows)
    assert kernel_rows[0]["refused"].startswith("fab-batch-gqa-oob: ")
    other = [r for r in rows if "kernel" not in (r["a"], r["b"])]
    assert other and all(r["nmse"] is not None and r["ok"] for r in other)
    assert "refused: known upstream defect" in parity.format_table(rows)


def off_by(factor, which=0):
    def path(q, k, v, d, masked, n_threads=None):
        grads = list(parity.path_kernel(q, k, v, d, masked, n_threads))
        grads[which] = grads[which] * np.float32(factor)
        return tuple(grads)
    return path


@pytest.mark.parametrize("which", [0, 1, 2])
def test_a_gradient_scaled_by_1_001_fails_the_verdict(which):
    rows = parity.run(SMALL[:1], ["kernel", "reference"], paths_impl={"kernel": off_by(1.001, which)})
    (row,) = rows
    # NMSE of a 0.1 % scale error is 1e-6: ten times the threshold
    assert row["nmse"] == pytest.approx(1e-6, rel=0.05)
    assert not row["ok"]
    assert "FAIL" in parity.format_table(rows)


def test_the_wrong_head_mapping_is_a_finding():
    # torch's enable_gqa groups heads (h // (H/KVH)); the kernel tiles (h % KVH)
    def grouped(q, k, v, d, masked, n_threads=None):
        return reference.attention_backward(q, k, v, d, masked=masked, mapping="group")
    rows = parity.run(SMALL[:1], ["kernel", "reference"], paths_impl={"reference": grouped})
    assert not rows[0]["ok"] and rows[0]["nmse"] > 1e-3


def test_a_missing_mask_is_a_finding():
    def unmasked(q, k, v, d, masked, n_threads=None):
        return reference.attention_backward(q, k, v, d, masked=False)
    assert SMALL[0].masked
    rows = parity.run(SMALL[:1], ["kernel", "reference"], paths_impl={"reference": unmasked})
    assert not rows[0]["ok"] and rows[0]["nmse"] > 1e-3


def test_quick_sweep_is_a_subset_of_the_full_sweep():
    quick, full = parity.sweep(quick=True), parity.sweep()
    assert set(quick) <= set(full)
    assert len(quick) < len(full) / 3
    assert {c.KVH for c in full} == {2} and {c.H // c.KVH for c in full} == {1, 2, 4}
    assert {c.B for c in full} == {1, 2, 3}
