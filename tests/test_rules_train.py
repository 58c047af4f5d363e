"""Both sides of the kernel rules of the [train] family (pyggml/csrc/rules_train.c).

For every refusal clause: pyggml refuses the node at the op call with the right class,
and the same node with the rules off makes the CPU kernel fail: it aborts, or reads or
writes out of bounds (the guarded proof, harness.kernel_verdict), or, where the kernel
silently computes garbage, it computes the wrong values (shown against the reference of
pyggml.opinfo). The accepted side is the OpInfo samples (tests/test_opinfo.py).

Also here: evidence for the upstream discrepancy of cross_entropy_loss's gradient (see the
module's end).
"""

import numpy as np
import pytest

import pyggml
from pyggml import Type
from pyggml.opinfo import Arg, Sample, registry
from pyggml.opinfo.harness import grad_check
from pyggml.opinfo.train import ref_cross_entropy_loss
from rules_helpers import (F16, KPE, TYPE_ERR, compute_unchecked, refused_and_kernel_fails, rnd, strided_vector, t_, tr,
                           unwalkable)


def param(ctx, x, typ=Type.F32):
    t = t_(ctx, x, typ)
    pyggml.set_param(t)
    return t


# --- refusals the kernel backs with an abort or an out-of-bounds access ---------------------

def _ce(a, b):
    return lambda ctx: pyggml.cross_entropy_loss(ctx, a(ctx), b(ctx))


def _adamw(w_type=Type.F32, g_type=Type.F32, m_type=Type.F32, v_type=Type.F32):
    def build(ctx):
        w = param(ctx, rnd((4, 8)), w_type)
        return pyggml.opt_step_adamw(ctx, w, t_(ctx, rnd((4, 8)), g_type), t_(ctx, rnd((4, 8)), m_type),
                                     t_(ctx, np.abs(rnd((4, 8))), v_type), t_(ctx, np.full(7, 0.5)))
    return build


def _sgd(w_type=Type.F32, g_type=Type.F32):
    def build(ctx):
        w = param(ctx, rnd((4, 8)), w_type)
        return pyggml.opt_step_sgd(ctx, w, t_(ctx, rnd((4, 8)), g_type), t_(ctx, [0.1, 0.0]))
    return build


CASES = [
    # name, build, exception, message, defect id
    # CROSS_ENTROPY_LOSS
    ("cross_entropy_loss: F16 logits", _ce(lambda c: t_(c, rnd((4, 8)), F16), lambda c: t_(c, rnd((4, 8)), F16)),
     TYPE_ERR, "logits .src0. of type f16", ""),
    ("cross_entropy_loss: F16 labels", _ce(lambda c: t_(c, rnd((4, 8))), lambda c: t_(c, rnd((4, 8)), F16)),
     TYPE_ERR, "labels .src1. of type f16", ""),
    ("cross_entropy_loss: logits transposed", _ce(lambda c: tr(c, rnd((4, 8))), lambda c: t_(c, rnd((4, 8)))),
     KPE, "logits .src0. must have contiguous rows", ""),
    ("cross_entropy_loss: labels transposed", _ce(lambda c: t_(c, rnd((4, 8))), lambda c: tr(c, rnd((4, 8)))),
     KPE, "labels .src1. must have contiguous rows", ""),
    ("cross_entropy_loss: logits permuted (rows not nb1 apart)",
     _ce(lambda c: pyggml.permute(c, t_(c, rnd((4, 2, 8))), 0, 2, 1, 3), lambda c: t_(c, rnd((2, 4, 8)))),
     KPE, "walks its rows with nb.1. only", ""),
    ("cross_entropy_loss: labels permuted (rows not nb1 apart)",
     _ce(lambda c: t_(c, rnd((2, 4, 8))), lambda c: pyggml.permute(c, t_(c, rnd((4, 2, 8))), 0, 2, 1, 3)),
     KPE, "labels .src1.: the kernel walks its rows", ""),
    # OPT_STEP_ADAMW, OPT_STEP_SGD
    ("opt_step_adamw: F16 parameter", _adamw(w_type=F16), TYPE_ERR, "parameter .src0. of type f16", ""),
    ("opt_step_adamw: F16 gradient", _adamw(g_type=F16), TYPE_ERR, "reads the gradient .src1. as F32", ""),
    ("opt_step_adamw: F16 m", _adamw(m_type=F16), TYPE_ERR, "reads m .src2. as F32", ""),
    ("opt_step_adamw: F16 v", _adamw(v_type=F16), TYPE_ERR, "reads v .src3. as F32", ""),
    ("opt_step_sgd: F16 parameter", _sgd(w_type=F16), TYPE_ERR, "parameter .src0. of type f16", ""),
    ("opt_step_sgd: F16 gradient", _sgd(g_type=F16), TYPE_ERR, "reads the gradient .src1. as F32", ""),
]


@pytest.mark.parametrize("name, build, exc, match, defect", CASES, ids=[c[0] for c in CASES])
def test_rule_refuses_what_the_kernel_fails_on(name, build, exc, match, defect):
    refused_and_kernel_fails(build, exc, match, defect)


# --- refusals where the kernel runs clean and computes the wrong values ---------------------

def test_cross_entropy_loss_unwalkable_logits_give_a_wrong_loss():
    a, b = rnd((2, 1, 3), 1), np.full((2, 1, 3), 1 / 3)

    def build(ctx):
        return pyggml.cross_entropy_loss(ctx, unwalkable(ctx, a), t_(ctx, b))
    with pyggml.Context(1 << 20) as ctx, pytest.raises(KPE, match="walks its rows with nb.1. only"):
        build(ctx)
    got = compute_unchecked(build)
    assert not np.allclose(got, ref_cross_entropy_loss(a.astype(np.float64), b), rtol=1e-3)


ADAMW = [0.1, 0.9, 0.999, 1e-8, 0.0, 10.0, 1000.0]


def _adamw_from_zero_moments(w, g, p):
    alpha, beta1, beta2, eps, wd, beta1h, beta2h = p
    m, v = (1 - beta1) * g, (1 - beta2) * g * g
    return w * (1 - alpha * wd) - alpha * m * beta1h / (np.sqrt(v * beta2h) + eps)


@pytest.mark.parametrize("op", ["adamw", "sgd"])
def test_opt_step_reads_the_gradient_at_the_parameters_offsets(op):
    w, g = rnd((3, 4), 2), rnd((3, 4), 3)

    def build(ctx):
        wt = param(ctx, w)
        base = t_(ctx, np.concatenate([g, np.full((3, 4), 50.0)], axis=1))          # rows 8 floats apart
        gt = pyggml.view_2d(ctx, base, 4, 3, base.nb[1], 0)
        if op == "sgd":
            return pyggml.opt_step_sgd(ctx, wt, gt, t_(ctx, [0.1, 0.0]))
        return pyggml.opt_step_adamw(ctx, wt, gt, t_(ctx, np.zeros((3, 4))), t_(ctx, np.zeros((3, 4))),
                                     t_(ctx, ADAMW))
    with pyggml.Context(1 << 20) as ctx, pytest.raises(KPE, match="laid out like the parameter"):
        build(ctx)
    got = compute_unchecked(build)
    read_g = np.concatenate([g, np.full((3, 4), 50.0)], axis=1).reshape(-1)[:12].reshape(3, 4)   # what it read
    if op == "sgd":
        want, wrong = w - 0.1 * g, w - 0.1 * read_g
    else:
        want, wrong = _adamw_from_zero_moments(w, g, ADAMW), _adamw_from_zero_moments(w, read_g, ADAMW)
    assert not np.allclose(got, want, rtol=1e-3)
    np.testing.assert_allclose(got, wrong, rtol=1e-5)


@pytest.mark.parametrize("op", ["adamw", "sgd"])
def test_opt_step_reads_its_hyperparameters_as_an_array(op):
    w, g = rnd((2, 3), 4), rnd((2, 3), 5)

    def build(ctx):
        wt = param(ctx, w)
        if op == "sgd":
            return pyggml.opt_step_sgd(ctx, wt, t_(ctx, g), strided_vector(ctx, [0.1, 0.0]))
        return pyggml.opt_step_adamw(ctx, wt, t_(ctx, g), t_(ctx, np.zeros((2, 3))), t_(ctx, np.zeros((2, 3))),
                                     strided_vector(ctx, ADAMW))
    with pyggml.Context(1 << 20) as ctx, pytest.raises(KPE, match="must be contiguous .the kernel reads its"):
        build(ctx)
    got = compute_unchecked(build)
    want = w - 0.1 * g if op == "sgd" else _adamw_from_zero_moments(w, g, ADAMW)
    assert not np.allclose(got, want, rtol=1e-3)
    if op == "sgd":      # it read alpha = 0.1 and wd = 99 (the filler between the two)
        np.testing.assert_allclose(got, w * (1 - 0.1 * 99) - 0.1 * g, rtol=1e-5)


# --- upstream discrepancies ------------------------------------------------------------------

def test_upstream_cross_entropy_gradient_assumes_labels_sum_to_one():
    # ops.cpp ggml_compute_forward_cross_entropy_loss_back computes (softmax(a) - b)/rows, the
    # gradient of the forward kernel's -sum(b * log_softmax(a))/rows only when each row of b
    # sums to 1 (defect "cross-entropy-grad-label-sum")
    info = registry()["cross_entropy_loss"]
    rng = np.random.default_rng(17)
    labels = rng.uniform(0.0, 1.0, (3, 5))
    s = Sample((Arg(rng.standard_normal((3, 5))), Arg(labels, param=False)))
    assert grad_check(info, s)[0] > 1e-2
    s = Sample((Arg(rng.standard_normal((3, 5))), Arg(labels / labels.sum(-1, keepdims=True), param=False)))
    assert grad_check(info, s)[0] < 1e-6
