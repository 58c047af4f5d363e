"""Both sides of the kernel rules of the [math] family (pyggml/csrc/rules_math.c): LOG, SIN,
COS and the UNARY ops of unary-ops.cpp's unary_op template (pg_rule_unary).

For each refusal clause: pyggml refuses the node at the op call with the right class,
and the same node with the rules off shows what the CPU kernel really does (an abort).
The accepted side is the opinfo samples (tests/test_opinfo.py), which compute and compare
every layout and type the rules let through. Last, measurements of upstream discrepancies
no rule can refuse (they depend on values).
"""

import numpy as np
import pytest

import pyggml
from pyggml import Type, UnaryOp
from rules_helpers import (column as _column, have as _have, refused_verdict as _refused,
                          transposed_f32 as _transposed, unary_values as _unary_values)

# the [math] unary ops on unary-ops.cpp's unary_op template (pg_rule_unary); the [activation]
# ones are in tests/test_rules_activation.py
TEMPLATE_UNARY = ("ABS", "SGN", "NEG", "STEP", "EXP", "EXPM1", "SOFTPLUS", "FLOOR", "CEIL", "ROUND", "TRUNC")
PLAIN_OPS = ("log", "sin", "cos")                # GGML_OPs on the same template, builders assert nothing


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


# --- upstream discrepancies that depend on values (no rule can refuse them) -----------------------

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
