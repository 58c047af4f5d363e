"""Both sides of the kernel rules of the [glu] family (pyggml/csrc/rules_glu.c).

For each refusal clause: pyggml refuses the node at the op call with the right class,
and the same node with the rules off shows what the CPU kernel really does (an abort).
The accepted side is the opinfo samples (tests/test_opinfo.py), which compute and compare
every layout and type the rules let through; the layouts ggml's builders already refuse
are checked here too.
"""

import numpy as np
import pytest

import pyggml
from pyggml import GluOp, Type
from pyggml.opinfo.glu import ACTS, halves, ref_swiglu_oai
from pyggml.opinfo.harness import read
from rules_helpers import (dims12_swapped as _dims12_swapped, f32_randn as _f32, have as _have,
                          refused_where_kernel_aborts, rnd, t_)

GLU_F32_F16 = ("REGLU", "GEGLU", "SWIGLU", "GEGLU_ERF", "GEGLU_QUICK")
BF16_TOL = dict(rtol=2e-2, atol=2e-2)      # BF16 in and out: 8 bits of mantissa, rounded twice


def _bf16_values(ctx, shape, seed):
    """a BF16 tensor of N(0, 1) values, and those values as stored (float64)"""
    t = t_(ctx, rnd(shape, seed), Type.BF16)
    return t, read(t)


@pytest.mark.parametrize("op", [o for o in GLU_F32_F16 if _have(GluOp, o)])
@pytest.mark.parametrize("split", [False, True])
def test_glu_of_bf16_is_refused_where_the_kernel_aborts(op, split):
    # 0.20.2's kernel's type switch takes F32 and F16 (GGML_ABORT otherwise); ggml 0.25.3's
    # takes BF16 (reviewed: the rule takes it there); where the kernel changed unreviewed, the
    # proof decides; what it computes is checked against the float64 reference
    seen = {}

    def build(ctx):
        a, seen["a"] = _bf16_values(ctx, (3, 8), 0)
        if split:
            b, seen["b"] = _bf16_values(ctx, (3, 8), 1)
            return pyggml.glu_split(ctx, a, b, getattr(GluOp, op))
        return pyggml.glu(ctx, a, getattr(GluOp, op), False)
    out = refused_where_kernel_aborts(build, pyggml.GGMLTypeError, "takes F32 or F16", "GLU", since="0.25.3")
    if out is not None:
        x, g = (seen["a"], seen["b"]) if split else halves(seen["a"], False)
        np.testing.assert_allclose(out, ACTS[op](x) * g, **BF16_TOL)


def test_glu_of_a_quantized_tensor_is_refused_where_the_kernel_aborts():
    def build(ctx):
        return pyggml.swiglu(ctx, t_(ctx, rnd((2, 64)), Type.Q8_0))
    out = refused_where_kernel_aborts(build, pyggml.GGMLTypeError, "CPU kernel takes F32, F16|CPU kernel takes F32 or F16", "GLU")
    assert out is None, "a GLU kernel that computes Q8_0: review the GLU rule and its OpInfo"


@pytest.mark.skipif(not _have(GluOp, "SWIGLU_OAI"), reason="this ggml has no SWIGLU_OAI")
@pytest.mark.parametrize("split", [False, True])
def test_swiglu_oai_of_f16_is_refused_where_the_kernel_aborts(split):
    x = rnd((3, 8)).astype(np.float16)
    g = rnd((3, 8), 1).astype(np.float16)

    def build(ctx):
        return pyggml.swiglu_oai(ctx, ctx.from_numpy(x), ctx.from_numpy(g) if split else None, 1.702, 7.0)
    out = refused_where_kernel_aborts(build, pyggml.GGMLTypeError, "F32 only", "GLU")
    if out is not None:
        xx, gg = (x, g) if split else halves(x, False)
        want = ref_swiglu_oai(xx.astype(np.float64), gg.astype(np.float64), 1.702, 7.0)
        np.testing.assert_allclose(out, want, rtol=5e-3, atol=5e-3)


def test_glu_layouts_the_builder_refuses():
    # what the kernels GGML_ASSERT (ggml_is_contiguous_1, same shape and type) the builder
    # asserts first: no rule is needed for it
    with pyggml.Context(1 << 20) as ctx:
        with pytest.raises(pyggml.GGMLAbort):
            pyggml.swiglu(ctx, _dims12_swapped(ctx))
        with pytest.raises(pyggml.GGMLAbort):
            pyggml.swiglu_split(ctx, _f32(ctx, (3, 8)), ctx.from_numpy(np.ones((3, 8), np.float16)))


@pytest.mark.skipif(not hasattr(pyggml, "swiglu_clamp") or not _have(GluOp, "SWIGLU_CLAMP"),
                    reason="this ggml has no SWIGLU_CLAMP (ggml 0.25.3 on)")
@pytest.mark.parametrize("typ", [Type.BF16, Type.Q8_0])
def test_swiglu_clamp_of_a_type_but_f32_f16_is_refused_where_the_kernel_aborts(typ):
    # ops.cpp ggml_compute_forward_swiglu_clamp: F32, F16, else GGML_ABORT (no BF16 case)
    def build(ctx):
        return pyggml.swiglu_clamp(ctx, t_(ctx, rnd((2, 64)), typ), None, 7.0)
    out = refused_where_kernel_aborts(build, pyggml.GGMLTypeError, "takes F32 or F16", "GLU")
    assert out is None, "a SWIGLU_CLAMP kernel that computes this type: review its rule and OpInfo"

