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
from rules_helpers import (bf16_zeros as _bf16, dims12_swapped as _dims12_swapped, f32_randn as _f32,
                          have as _have, refused_verdict as _refused)

GLU_F32_F16 = ("REGLU", "GEGLU", "SWIGLU", "GEGLU_ERF", "GEGLU_QUICK")


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
