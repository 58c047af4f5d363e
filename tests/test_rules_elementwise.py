"""Both sides of the kernel rules of the [math], [activation] and [glu] families
(pyggml/csrc/rules_math.c, rules_activation.c, rules_glu.c).

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
from pyggml import GluOp, Type, UnaryOp
from pyggml.opinfo.activation import UNARY_REFS
from pyggml.opinfo.harness import kernel_verdict, rules_disabled

# unary ops on unary-ops.cpp's unary_op template (pg_rule_unary)
TEMPLATE_UNARY = ("ABS", "SGN", "NEG", "STEP", "TANH", "ELU", "RELU", "SIGMOID", "HARDSWISH", "HARDSIGMOID",
                  "EXP", "EXPM1", "SOFTPLUS", "FLOOR", "CEIL", "ROUND", "TRUNC")
# unary ops with kernels of their own in ops.cpp (F32 and F16 only)
OWN_KERNEL_UNARY = ("GELU", "GELU_ERF", "GELU_QUICK", "SILU")
PLAIN_OPS = ("log", "sin", "cos")                # GGML_OPs on the same template, builders assert nothing
GLU_F32_F16 = ("REGLU", "GEGLU", "SWIGLU", "GEGLU_ERF", "GEGLU_QUICK")


def _have(enum, name):
    return hasattr(enum, name)


def _f32(ctx, shape, seed=0):
    return ctx.from_numpy(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def _bf16(ctx, shape):
    return ctx.from_numpy(np.zeros(shape, np.uint16), type=Type.BF16)


def _column(ctx, n=4, dtype=np.float32):
    """ne = (1, n), nb[0] = 4n bytes: the transpose of one row. ggml_is_contiguous_rows (and so
    the builder ggml_unary_impl) takes it: a row of one element."""
    x = (np.arange(n, dtype=np.float64) - 1.5).reshape(1, n).astype(dtype)
    return pyggml.transpose(ctx, ctx.from_numpy(x))


def _transposed(ctx, rows=4, cols=6):
    return pyggml.transpose(ctx, _f32(ctx, (rows, cols)))


def _dims12_swapped(ctx):
    """rows contiguous, dims 1 and 2 swapped: not ggml_is_contiguous_1"""
    return pyggml.permute(ctx, _f32(ctx, (2, 3, 4, 6)), 0, 2, 1, 3)


def _compute(ctx, t, n_threads=1):
    g = pyggml.Graph(ctx, 64)
    g.build_forward_expand(t)
    g.compute(n_threads)
    return t.numpy().astype(np.float64)


def _refused(build, exc, match):
    """pyggml refuses the node at the op call, with exc; the kernel itself, rules off: its verdict"""
    with pyggml.Context(16 << 20) as ctx:
        with pytest.raises(exc, match=match):
            build(ctx)
    return kernel_verdict(build)


# --- [math]: LOG, SIN, COS and the UNARY ops of the unary_op template (pg_rule_unary) ------------

@pytest.mark.parametrize("op", PLAIN_OPS)
def test_plain_op_refuses_rows_that_are_not_contiguous(op):
    # the builders of LOG/SIN/COS assert nothing; apply_unary_op GGML_ASSERTs nb00 == sizeof(src0_t)
    verdict = _refused(lambda ctx: getattr(pyggml, op)(ctx, _transposed(ctx)),
                       pyggml.KernelPreconditionError, "contiguous rows")
    assert verdict == "abort"


@pytest.mark.parametrize("op", PLAIN_OPS + ("exp", "abs", "floor"))
@pytest.mark.parametrize("typ", ["Q8_0", "I32"])
def test_template_op_refuses_types(op, typ):
    def build(ctx):
        if typ == "I32":
            a = ctx.from_numpy(np.arange(8, dtype=np.int32).reshape(2, 4))
        else:
            a = ctx.new_tensor(Type.Q8_0, (32, 2, 1, 1))
        return getattr(pyggml, op)(ctx, a)
    assert _refused(build, pyggml.GGMLTypeError, "does not take src0") == "abort"


@pytest.mark.parametrize("op", [o for o in TEMPLATE_UNARY if _have(UnaryOp, o)])
def test_template_unary_refuses_a_column_with_its_stride(op):
    # ne0 = 1 passes ggml_is_contiguous_rows and the builder; apply_unary_op still asserts nb00
    verdict = _refused(lambda ctx: pyggml.unary(ctx, _column(ctx), getattr(UnaryOp, op)),
                       pyggml.KernelPreconditionError, "contiguous rows")
    assert verdict == "abort"


def test_template_unary_inplace_column_refused_too():
    verdict = _refused(lambda ctx: pyggml.neg_inplace(ctx, _column(ctx)), pyggml.KernelPreconditionError,
                       "contiguous rows")
    assert verdict == "abort"


# --- [activation]: GELU, GELU_ERF, GELU_QUICK, SILU (own kernels, F32/F16) ---------------------

@pytest.mark.parametrize("op", [o for o in OWN_KERNEL_UNARY if _have(UnaryOp, o)])
def test_gelu_like_refuse_bf16(op):
    # ggml_compute_forward_gelu & co switch on src0's type: F32, F16, else GGML_ABORT
    verdict = _refused(lambda ctx: pyggml.unary(ctx, _bf16(ctx, (3, 8)), getattr(UnaryOp, op)),
                       pyggml.GGMLTypeError, "takes F32 or F16")
    assert verdict == "abort"


@pytest.mark.parametrize("fn", ["gelu", "silu_inplace"])
def test_gelu_like_refuse_quantized(fn):
    verdict = _refused(lambda ctx: getattr(pyggml, fn)(ctx, ctx.new_tensor(Type.Q8_0, (32, 2, 1, 1))),
                       pyggml.GGMLTypeError, "takes F32 or F16")
    assert verdict == "abort"


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


def test_leaky_relu_refuses_bf16():
    verdict = _refused(lambda ctx: pyggml.leaky_relu(ctx, _bf16(ctx, (3, 8)), 0.1, False), pyggml.GGMLTypeError,
                       "takes F32 or F16")
    assert verdict == "abort"


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


# --- [glu] -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("op", [o for o in GLU_F32_F16 if _have(GluOp, o)])
@pytest.mark.parametrize("split", [False, True])
def test_glu_refuses_bf16(op, split):
    def build(ctx):
        a = _bf16(ctx, (3, 8))
        if split:
            return pyggml.glu_split(ctx, a, _bf16(ctx, (3, 8)), getattr(GluOp, op))
        return pyggml.glu(ctx, a, getattr(GluOp, op), False)
    assert _refused(build, pyggml.GGMLTypeError, "takes F32 or F16") == "abort"


def test_glu_refuses_quantized():
    verdict = _refused(lambda ctx: pyggml.swiglu(ctx, ctx.new_tensor(Type.Q8_0, (64, 2, 1, 1))),
                       pyggml.GGMLTypeError, "takes F32 or F16")
    assert verdict == "abort"


@pytest.mark.skipif(not _have(GluOp, "SWIGLU_OAI"), reason="this ggml has no SWIGLU_OAI")
@pytest.mark.parametrize("split", [False, True])
def test_swiglu_oai_refuses_f16(split):
    def build(ctx):
        a = ctx.from_numpy(np.ones((3, 8), np.float16))
        return pyggml.swiglu_oai(ctx, a, ctx.from_numpy(np.ones((3, 8), np.float16)) if split else None, 1.702, 7.0)
    assert _refused(build, pyggml.GGMLTypeError, "F32 only") == "abort"


def test_glu_layouts_the_builder_refuses():
    # what the kernels GGML_ASSERT (ggml_is_contiguous_1, same shape and type) the builder
    # asserts first: no rule is needed for it
    with pyggml.Context(1 << 20) as ctx:
        with pytest.raises(pyggml.GGMLAbort):
            pyggml.swiglu(ctx, _dims12_swapped(ctx))
        with pytest.raises(pyggml.GGMLAbort):
            pyggml.swiglu_split(ctx, _f32(ctx, (3, 8)), ctx.from_numpy(np.ones((3, 8), np.float16)))


# --- upstream discrepancies that depend on values (no rule can refuse them) -----------------------

def _unary_values(fn, x, dtype=np.float32):
    with pyggml.Context(1 << 20) as ctx:
        return _compute(ctx, fn(ctx, ctx.from_numpy(np.asarray(x, dtype))))


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


def test_expm1_loses_relative_precision_near_zero():
    """Proposed defect expm1-cancellation: op_expm1 is expf(x) - 1.0f, not expm1f (ELU uses
    expm1f): for |x| = 1e-7 the result is 19% off, for |x| <= 3e-8 it is 0."""
    x = np.array([1e-7, -1e-7, 3e-8, 1e-5], np.float32)
    out = _unary_values(pyggml.expm1, x)
    rel = np.abs(out - np.expm1(x.astype(np.float64))) / np.abs(np.expm1(x.astype(np.float64)))
    assert rel[:3].max() > 0.1 and rel[3] > 1e-3, rel
    elu = _unary_values(pyggml.elu, -np.abs(x))
    assert np.allclose(elu, np.expm1(-np.abs(x).astype(np.float64)), rtol=1e-6)


def test_softplus_underflows_for_negative_inputs():
    """Proposed defect softplus-underflow: op_softplus is logf(1 + expf(x)), which is 0 for
    x <= -17 (want ~e^x: 100% off), 17% off at -15, 4e-4 at -10."""
    x = np.array([-20.0, -30.0, -10.0], np.float32)
    out = _unary_values(pyggml.softplus, x)
    want = np.logaddexp(0.0, x.astype(np.float64))
    assert out[0] == 0.0 and out[1] == 0.0
    assert abs(out[2] - want[2]) / want[2] > 1e-4


def test_gelu_erf_left_tail_cancels():
    """0.5x(1 + erff(x/sqrt 2)) cancels for x << 0: 4% off at x = -5, 57% at -5.5, 0 below -5.6
    (want x*Phi(x), e.g. -5.9e-9 at -6). Absolute errors stay < 1e-7: noted, not a defect record."""
    out = _unary_values(pyggml.gelu_erf, [-5.0, -6.0])
    want = [-5.0 * 0.5 * math.erfc(5.0 / math.sqrt(2.0)), -6.0 * 0.5 * math.erfc(6.0 / math.sqrt(2.0))]
    assert abs(out[0] - want[0]) / abs(want[0]) > 0.01
    assert out[1] == 0.0 and abs(out[1] - want[1]) < 1e-7
