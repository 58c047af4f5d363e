"""Both sides of the kernel rules of the [activation] family (pyggml/csrc/rules_activation.c):
the activation UNARY ops of the unary_op template, GELU, GELU_ERF, GELU_QUICK and SILU (own
kernels), XIELU and LEAKY_RELU.

For each refusal clause: pyggml refuses the node at the op call with the right class,
and the same node with the rules off shows what the CPU kernel really does (an abort,
an access out of bounds, or wrong values). The accepted side is the opinfo samples
(tests/test_opinfo.py), which compute and compare every layout and type the rules let
through; a few edges the rules must not refuse are checked here too. Last, measurements
of upstream discrepancies no rule can refuse (they depend on values).
"""

import math

import numpy as np
import pytest

import pyggml
from pyggml import Type, UnaryOp
from pyggml.opinfo.activation import UNARY_REFS
from pyggml.opinfo.harness import read, rules_disabled
from rules_helpers import (column as _column, compute_f64 as _compute, dims12_swapped as _dims12_swapped,
                          have as _have, refused_verdict as _refused, refused_where_kernel_aborts, rnd, t_,
                          transposed_f32 as _transposed, unary_values as _unary_values)

# the [activation] unary ops on unary-ops.cpp's unary_op template (pg_rule_unary); the [math]
# ones are in tests/test_rules_math.py
TEMPLATE_UNARY = ("TANH", "ELU", "RELU", "SIGMOID", "HARDSWISH", "HARDSIGMOID")
# unary ops with kernels of their own in ops.cpp (F32 and F16 only)
OWN_KERNEL_UNARY = ("GELU", "GELU_ERF", "GELU_QUICK", "SILU")


# --- TANH, ELU, RELU, SIGMOID, HARDSWISH, HARDSIGMOID: the unary_op template (pg_rule_unary) ----

@pytest.mark.parametrize("op", [o for o in TEMPLATE_UNARY if _have(UnaryOp, o)])
def test_template_unary_refuses_a_column_with_its_stride(op):
    # ne0 = 1 passes ggml_is_contiguous_rows and the builder; apply_unary_op still asserts nb00
    verdict = _refused(lambda ctx: pyggml.unary(ctx, _column(ctx), getattr(UnaryOp, op)),
                       pyggml.KernelPreconditionError, "contiguous rows")
    assert verdict == "abort"


# --- [activation]: GELU, GELU_ERF, GELU_QUICK, SILU (own kernels, F32/F16) ---------------------

BF16_TOL = dict(rtol=2e-2, atol=2e-2)      # BF16 in and out: 8 bits of mantissa, rounded twice


@pytest.mark.parametrize("op", [o for o in OWN_KERNEL_UNARY if _have(UnaryOp, o)])
def test_gelu_like_of_bf16_is_refused_where_the_kernel_aborts(op):
    # ggml_compute_forward_gelu & co switch on src0's type: F32, F16, else GGML_ABORT; ggml
    # 0.25.3's kernel takes BF16 (reviewed: the rule takes it there); where the kernel changed
    # unreviewed, the proof decides; the values computed are checked
    seen = {}

    def build(ctx):
        a = t_(ctx, rnd((3, 8)), Type.BF16)
        seen["a"] = read(a)
        return pyggml.unary(ctx, a, getattr(UnaryOp, op))
    out = refused_where_kernel_aborts(build, pyggml.GGMLTypeError, "takes F32 or F16", "UNARY", since="0.25.3")
    if out is not None:
        np.testing.assert_allclose(out, UNARY_REFS[op](seen["a"]), **BF16_TOL)


@pytest.mark.parametrize("fn", ["gelu", "silu_inplace"])
def test_gelu_like_of_a_quantized_tensor_is_refused_where_the_kernel_aborts(fn):
    out = refused_where_kernel_aborts(lambda ctx: getattr(pyggml, fn)(ctx, t_(ctx, rnd((2, 32)), Type.Q8_0)),
                                      pyggml.GGMLTypeError, "takes F32 or F16", "UNARY")
    assert out is None, "a GELU/SILU kernel that computes Q8_0: review its rule and OpInfo"


@pytest.mark.parametrize("op", [o for o in OWN_KERNEL_UNARY if _have(UnaryOp, o)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_gelu_like_take_a_column_the_template_refuses(op, dtype):
    # not a false refusal: their kernels read the one element of each row at its address
    x = (np.arange(4) - 1.5).astype(dtype)
    with pyggml.Context(1 << 20) as ctx:
        out = _compute(ctx, pyggml.unary(ctx, _column(ctx, 4, dtype), getattr(UnaryOp, op)))
    ref = UNARY_REFS[op](x.astype(np.float64))
    assert np.allclose(out.reshape(-1), ref, rtol=2e-3, atol=1e-3)


# --- [activation]: XIELU (unary_op_functor) ------------------------------------------------------

def _xielu(ctx, a):
    return pyggml.xielu(ctx, a, 0.8, 0.8, 0.5, -1e-6)


def test_xielu_refuses_types():
    verdict = _refused(lambda ctx: _xielu(ctx, ctx.new_tensor(Type.Q8_0, (32, 2, 1, 1))), pyggml.GGMLTypeError,
                       "does not take src0")
    assert verdict == "abort"


def test_xielu_refuses_rows_that_are_not_contiguous():
    # ggml_xielu asserts no layout (it is not ggml_unary_impl); the functor asserts nb00
    verdict = _refused(lambda ctx: _xielu(ctx, _transposed(ctx)), pyggml.KernelPreconditionError,
                       "contiguous rows")
    assert verdict == "abort"


def test_xielu_refuses_a_column_with_its_stride():
    verdict = _refused(lambda ctx: _xielu(ctx, _column(ctx)), pyggml.KernelPreconditionError, "contiguous rows")
    assert verdict == "abort"


def test_xielu_refuses_what_is_not_contiguous_1():
    # rows contiguous, dims 1 and 2 swapped: apply_unary_op_functor asserts ggml_is_contiguous_1
    verdict = _refused(lambda ctx: _xielu(ctx, _dims12_swapped(ctx)), pyggml.KernelPreconditionError,
                       r"contiguous over dims 1\.\.3")
    assert verdict == "abort"


# --- [activation]: LEAKY_RELU ---------------------------------------------------------------------

def _ref_leaky(x, s):
    return np.where(x > 0, x, np.float32(s) * x)


def test_leaky_relu_of_bf16_is_refused_where_the_kernel_aborts():
    seen = {}

    def build(ctx):
        a = t_(ctx, rnd((3, 8)), Type.BF16)
        seen["a"] = read(a)
        return pyggml.leaky_relu(ctx, a, 0.1, False)
    out = refused_where_kernel_aborts(build, pyggml.GGMLTypeError, "takes F32 or F16", "LEAKY_RELU")
    if out is not None:
        np.testing.assert_allclose(out, _ref_leaky(seen["a"], 0.1), **BF16_TOL)


def test_leaky_relu_refuses_permuted_dims_out_of_bounds():
    # dims 1, 2 swapped: the kernel walks row i at i*nb[1] (nb[1] = 4 rows here) and runs past a
    verdict = _refused(lambda ctx: pyggml.leaky_relu(ctx, _dims12_swapped(ctx), 0.1, True),
                       pyggml.KernelPreconditionError, r"contiguous over dims 1\.\.3")
    assert verdict == "out-of-bounds"
    verdict = _refused(lambda ctx: pyggml.leaky_relu(ctx, _dims12_swapped(ctx), 0.1, False),
                       pyggml.KernelPreconditionError, r"contiguous over dims 1\.\.3")
    assert verdict == "out-of-bounds"


def test_leaky_relu_refuses_transposed_rows_wrong_values():
    # the builder asserts no layout; the kernel reads each row's elements contiguously from
    # its start: inside a, but the wrong elements
    x = np.random.default_rng(3).standard_normal((4, 6)).astype(np.float32)
    _refused(lambda ctx: pyggml.leaky_relu(ctx, pyggml.transpose(ctx, ctx.from_numpy(x)), 0.1, False),
             pyggml.KernelPreconditionError, r"contiguous over dims 1\.\.3")
    with rules_disabled(), pyggml.Context(1 << 20) as ctx:
        out = _compute(ctx, pyggml.leaky_relu(ctx, pyggml.transpose(ctx, ctx.from_numpy(x)), 0.1, False))
    want = _ref_leaky(x.T.astype(np.float64), 0.1)
    assert out.shape == want.shape
    assert not np.allclose(out, want)


def test_leaky_relu_strided_rows_and_column_accepted():
    # ggml_is_contiguous_1 layouts the kernel walks right: not refused
    x = np.random.default_rng(4).standard_normal((3, 10)).astype(np.float32)
    with pyggml.Context(1 << 20) as ctx:
        base = ctx.from_numpy(x)
        v = pyggml.view_2d(ctx, base, 5, 3, base.nb[1], 0)                 # rows of a wider tensor
        out = _compute(ctx, pyggml.leaky_relu(ctx, v, -0.5, False))
        col = _compute(ctx, pyggml.leaky_relu(ctx, _column(ctx), 0.25, True))
    assert np.allclose(out, _ref_leaky(x[:, :5].astype(np.float64), -0.5))
    assert np.allclose(col.reshape(-1), _ref_leaky(np.arange(4) - 1.5, 0.25))


# --- upstream discrepancies that depend on values (no rule can refuse them) -----------------------

def test_gelu_quick_f32_table_overflows_past_f16_range():
    """Proposed defect gelu-quick-f32-table-overflow: ggml_vec_gelu_quick_f32 (and geglu_quick's)
    looks every F32 x up in the F16 table without the +-10 clamp ggml_vec_gelu_f32 has, so
    |x| > 65504 rounds to +-inf: gelu_quick(7e4) is inf (want 7e4), gelu_quick(-7e4) NaN (want -0)."""
    x = [7e4, -7e4, 1e5, 10.0]
    out = _unary_values(pyggml.gelu_quick, x)
    assert math.isinf(out[0]) and math.isnan(out[1]) and math.isinf(out[2]), out
    assert out[3] == pytest.approx(10.0, rel=1e-3)
    gated = _unary_values(pyggml.geglu_quick, [7e4, -7e4, 1.0, 1.0])
    assert math.isinf(gated[0]) and math.isnan(gated[1]), gated
    # GELU's F32 kernel clamps: finite
    assert np.all(np.isfinite(_unary_values(pyggml.gelu, x)))


def test_gelu_erf_left_tail_cancels():
    """0.5x(1 + erff(x/sqrt 2)) cancels for x << 0: 4% off at x = -5, 57% at -5.5, 0 below -5.6
    (want x*Phi(x), e.g. -5.9e-9 at -6). Absolute errors stay < 1e-7: noted, not a defect record."""
    out = _unary_values(pyggml.gelu_erf, [-5.0, -6.0])
    want = [-5.0 * 0.5 * math.erfc(5.0 / math.sqrt(2.0)), -6.0 * 0.5 * math.erfc(6.0 / math.sqrt(2.0))]
    assert abs(out[0] - want[0]) / abs(want[0]) > 0.01
    assert out[1] == 0.0 and abs(out[1] - want[1]) < 1e-7
