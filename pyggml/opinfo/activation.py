"""OpInfos of the [activation] family: tanh elu relu leaky_relu sigmoid gelu gelu_erf
gelu_quick silu hardswish hardsigmoid xielu, the _inplace variants, and the generic
unary / unary_inplace.

Kernels (ggml-cpu): tanh, elu, relu, sigmoid, hardswish, hardsigmoid run the unary_op
template (F32, F16, BF16); gelu, gelu_erf, gelu_quick and silu have kernels of their own
in ops.cpp (F32 and F16 only; a row of one element is read at its address, whatever its
nb[0]); xielu runs unary_op_functor (the template's types, and ggml_is_contiguous_1);
leaky_relu walks row i at i*nb[1] (F32, F16; ggml_is_contiguous_1 layouts only).

GELU is ggml's tanh approximation, 0.5x(1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))); the
F32 CPU kernel (GGML_GELU_FP16) rounds x to F16 and reads a table of F16 results for
-10 < x < 10, so its F32 results carry F16's precision. GELU_QUICK's F32 kernel does the
same for every x (GGML_GELU_QUICK_FP16), with no clamp (see the gelu_quick note).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from pyggml._core import Type, UnaryOp
from pyggml.opinfo import Arg, OpInfo, Sample
from pyggml.opinfo._common import FLOATS, bf16_if_taken, normal
from pyggml.opinfo.math import (elementwise_info, elementwise_samples, kinked, ref_round, ref_softplus,
                                ref_step, scaled, with_halves)

__all__ = ["OPINFOS", "ref_gelu", "ref_gelu_erf", "ref_gelu_quick", "ref_gelu_quick_table", "ref_gelu_table",
           "ref_silu", "ref_relu"]

F32_F16 = (Type.F32, Type.F16)
# GELU, GELU_ERF, GELU_QUICK, SILU: BF16 too where UNARY's kernel is 0.25.3's (rules_activation.c)
GELU_LIKE_TYPES = F32_F16 + bf16_if_taken("UNARY")

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_erf = np.vectorize(math.erf, otypes=[np.float64])


def ref_relu(x):
    return np.maximum(x, 0.0)


def ref_sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))          # 1 / (1 + e^-x), without overflow


def ref_gelu(x):
    """ggml's GELU: the tanh approximation (not x * Phi(x))."""
    return 0.5 * x * (1.0 + np.tanh(_SQRT_2_OVER_PI * x * (1.0 + 0.044715 * x * x)))


def ref_gelu_erf(x):
    """x * Phi(x), Phi the standard normal CDF."""
    return 0.5 * x * (1.0 + _erf(np.asarray(x, np.float64) / math.sqrt(2.0)))


def ref_gelu_quick(x):
    """x * sigmoid(1.702 x)."""
    return x * ref_sigmoid(1.702 * x)


def _f16(x):
    return np.asarray(x, np.float64).astype(np.float16).astype(np.float64)


def ref_gelu_table(x):
    """What ggml's GELU kernels compute (GGML_GELU_FP16): x rounded to F16, then GELU's
    value on that F16 x rounded to F16 (its table); the F32 kernel takes 0 for x <= -10
    and x itself for x >= 10, where the F16 table gives the same."""
    x = np.asarray(x, np.float64)
    return np.where(x >= 10.0, x, np.where(x <= -10.0, 0.0, _f16(ref_gelu(_f16(x)))))


def ref_gelu_quick_table(x):
    """What ggml's GELU_QUICK kernels compute (GGML_GELU_QUICK_FP16): the F16 table's
    value at x rounded to F16, for every x."""
    return _f16(ref_gelu_quick(_f16(x)))


def ref_silu(x):
    return x * ref_sigmoid(x)


def ref_elu(x):
    return np.where(x > 0, x, np.expm1(np.minimum(x, 0.0)))


def ref_hardsigmoid(x):
    return np.clip((x + 3.0) / 6.0, 0.0, 1.0)


def ref_hardswish(x):
    return x * ref_hardsigmoid(x)


def ref_leaky_relu(x, slope, inplace):
    return np.where(x > 0, x, np.float32(slope) * x)


def _f32(v: float) -> float:
    return float(np.float32(v))


def _softplus(v: float) -> float:
    return float(np.logaddexp(0.0, v))


def ref_xielu(x, alpha_n, alpha_p, beta, eps):
    """xIELU (ggml_xielu): alpha_p' = softplus(alpha_p), alpha_n' = beta + softplus(alpha_n);
    alpha_p' x^2 + beta x for x > 0, alpha_n' (expm1(min(x, eps)) - x) + beta x otherwise.
    The parameters are stored as F32, as ggml keeps them in op_params."""
    beta32 = _f32(beta)
    an = _f32(beta32 + _softplus(_f32(alpha_n)))
    ap = _f32(_softplus(_f32(alpha_p)))
    eps32 = _f32(eps)
    neg = an * (np.expm1(np.minimum(x, eps32)) - x) + beta32 * x
    return np.where(x > 0, ap * x * x + beta32 * x, neg)


# the ref of each unary op as the generic ggml_unary applies it (XIELU: op_params 1..4
# stay 0, so every alpha and beta is 0 and the result is 0)
UNARY_REFS = {
    "ABS": np.abs, "SGN": np.sign, "NEG": np.negative, "STEP": ref_step, "TANH": np.tanh, "ELU": ref_elu,
    "RELU": ref_relu, "SIGMOID": ref_sigmoid, "GELU": ref_gelu_table, "GELU_QUICK": ref_gelu_quick_table, "SILU": ref_silu,
    "HARDSWISH": ref_hardswish, "HARDSIGMOID": ref_hardsigmoid, "EXP": np.exp, "EXPM1": np.expm1,
    "SOFTPLUS": ref_softplus, "GELU_ERF": ref_gelu_erf, "XIELU": np.zeros_like, "FLOOR": np.floor,
    "CEIL": np.ceil, "ROUND": ref_round, "TRUNC": np.trunc,
}
# ops with their own kernel in ops.cpp: F32 and F16 only
F16_ONLY_KERNELS = {"GELU", "GELU_QUICK", "GELU_ERF", "SILU"}
# ops ggml_compute_backward differentiates (the generic samples start with these)
WITH_BACKWARD = ("RELU", "NEG", "EXP", "ABS", "SILU", "EXPM1", "SOFTPLUS", "SGN", "STEP")

_GELU_TABLE_NOTE = ("the kernels (GGML_GELU_FP16) round x to F16 and read an F16 result from ggml's table for "
                    "-10 < x < 10, F32 ones too: the reference is GELU on that grid (ref_gelu_table), and the "
                    "kernel matches it exactly but for rounding ties (14 of the 34690 F16 values in [-3.5, 4.5] "
                    "are one F16 ulp off: NMSE up to ~1e-6 for a one-element sample, where NMSE is the squared "
                    "relative error)")
_GELU_QUICK_TABLE_NOTE = ("the kernels (GGML_GELU_QUICK_FP16) round every x to F16 and read an F16 result from "
                          "ggml's table: the reference is GELU_QUICK on that grid (ref_gelu_quick_table), which "
                          "the kernel matches exactly on all 34690 F16 values in [-3.5, 4.5]; with no clamp, "
                          "|x| > 65504 becomes +-inf in F16 and the F32 result is inf (x > 0) or NaN (x < 0): "
                          "not sampled (defect gelu-quick-f32-table-overflow)")
_TAIL_NOTE = ("; ggml computes 0.5x(1 + erf(x/sqrt 2)) and 0.5x(1 + tanh(...)), which cancel for x < -3.5 "
              "(a lone F32 GELU_ERF result is 4% off at x = -5, 57% at -5.5, 0 below -5.6; absolute errors < 1e-7): "
              "samples are N(0, 2) clipped to [-3.5, 4.5]")


def left_tail_free(rng, shape):
    """N(0, 2) values kept in [-3.5, 4.5]: below -3.5 the GELUs' 1 + erf(x/sqrt 2) and
    1 + tanh(...) cancel in F32 (ggml's formulas), so a lone value there has a large
    relative error though a tiny absolute one (see the notes)."""
    return np.clip(normal(rng, shape, 2.0), -3.5, 4.5)


def _gelu_tol(note):
    return {"tol": {Type.F32: 5e-6}, "note": note + _TAIL_NOTE}


_ACT: list[tuple[str, Callable, Callable, tuple[Type, ...], bool, dict[str, Any]]] = [
    # name, reference, values, types, grad, kwargs (column: ne0 = 1 with any nb[0])
    ("tanh", np.tanh, scaled(2.0), FLOATS, False, {}),
    ("elu", ref_elu, scaled(2.0), FLOATS, False, {}),
    ("relu", ref_relu, kinked(0.0), FLOATS, True, {}),
    ("sigmoid", ref_sigmoid, scaled(3.0), FLOATS, False, {}),
    ("gelu", ref_gelu_table, left_tail_free, GELU_LIKE_TYPES, False, {"column": True, **_gelu_tol(_GELU_TABLE_NOTE)}),
    ("gelu_erf", ref_gelu_erf, left_tail_free, GELU_LIKE_TYPES, False, {"column": True, "note": _TAIL_NOTE[2:]}),
    ("gelu_quick", ref_gelu_quick_table, left_tail_free, GELU_LIKE_TYPES, False,
     {"column": True, "note": _GELU_QUICK_TABLE_NOTE + _TAIL_NOTE}),
    ("silu", ref_silu, scaled(3.0), GELU_LIKE_TYPES, True, {"column": True}),
]
_NO_INPLACE: list[tuple[str, Callable, Callable, tuple[Type, ...], bool, dict[str, Any]]] = [
    ("hardswish", ref_hardswish, kinked(-3.0, 3.0, scale=3.0), FLOATS, False, {}),
    ("hardsigmoid", ref_hardsigmoid, kinked(-3.0, 3.0, scale=3.0), FLOATS, False, {}),
]


def _gelu_edges():
    """GELU's F32 kernel switches at +-10 (0 below, x above, the table between)."""
    return [[-10.5, -10.0, -9.99, 9.99, 10.0, 10.5, 0.0, 1e-3]]


def _leaky_relu_samples(rng, t):
    slopes = (0.1, -0.5, 2.0)
    for i, s in enumerate(elementwise_samples(rng, t, kinked(0.0), permuted=False, column=True)):
        inplace = i % 2 == 1
        yield Sample(s.args + (slopes[i % 3], inplace), f"{s.name}, slope {slopes[i % 3]}"
                     f"{', in place' if inplace else ''}")


_XIELU_PARAMS = ((0.8, 0.8, 0.5, -1e-6), (-0.3, 1.5, 0.0, -0.5), (2.0, 0.1, -0.2, 1e-3))


def _xielu_samples(rng, t):
    for i, s in enumerate(elementwise_samples(rng, t, scaled(2.0), permuted=False)):
        yield Sample(s.args + _XIELU_PARAMS[i % 3], f"{s.name}, params {_XIELU_PARAMS[i % 3]}")


def _unary_gen(op: str):
    if op in ("ABS", "RELU", "SGN", "STEP"):
        return kinked(0.0)
    if op in ("HARDSWISH", "HARDSIGMOID"):
        return kinked(-3.0, 3.0, scale=3.0)
    if op in ("FLOOR", "CEIL", "ROUND", "TRUNC"):
        return with_halves
    if op.startswith("GELU"):
        return left_tail_free
    return scaled(2.0)


def _unary_order():
    rest = [op for op in UNARY_REFS if op not in WITH_BACKWARD]
    return list(WITH_BACKWARD) + rest


def _unary_samples(rng, t):
    shapes = ((3, 5), (2, 1, 4), (7,))
    for i, op in enumerate(_unary_order()):
        if not hasattr(UnaryOp, op):
            continue
        if t == Type.BF16 and op in F16_ONLY_KERNELS and Type.BF16 not in GELU_LIKE_TYPES:
            continue
        shape = shapes[i % 3]
        yield Sample((Arg(_unary_gen(op)(rng, shape), t), getattr(UnaryOp, op)), f"{op} {shape}")
    # a permuted and a strided input (rows contiguous)
    yield Sample((Arg(scaled(2.0)(rng, (2, 3, 4, 5)), t, "permuted", (0, 2, 1, 3)), UnaryOp.TANH), "TANH permuted")
    yield Sample((Arg(scaled(2.0)(rng, (3, 5)), t, "strided"), UnaryOp.SIGMOID), "SIGMOID strided rows")
    if t != Type.BF16:
        yield Sample((Arg(scaled(2.0)(rng, (4, 1)), t, "transposed"), UnaryOp.SILU), "SILU transposed column")


def _ref_unary(a, op):
    return UNARY_REFS[UnaryOp(op).name](a)


def _unary_info(name, **kw):
    return OpInfo(name, ref=_ref_unary, samples=_unary_samples, types=FLOATS,
                  tol={Type.F32: 5e-6},
                  note="GELU's kernel is within an F16 ulp of its F16-grid reference (see gelu): the loosest "
                       "of the ops sampled; BF16 samples leave out "
                       "the F32/F16-only kernels (GELU, GELU_ERF, GELU_QUICK, SILU; BF16 too from ggml 0.25.3); "
                       "UNARY:XIELU from "
                       "ggml_unary has all its parameters 0 and computes 0", **kw)


def _infos():
    for name, ref, gen, types, grad, kw in _ACT:
        extra = _gelu_edges() if name in ("gelu", "gelu_quick") else ()
        yield elementwise_info(name, ref, gen, types, grad=grad, extra=extra, **kw)
        yield elementwise_info(f"{name}_inplace", ref, gen, types, extra=extra, **kw)
    for name, ref, gen, types, grad, kw in _NO_INPLACE:
        yield elementwise_info(name, ref, gen, types, grad=grad, **kw)
    yield OpInfo("leaky_relu", ref=ref_leaky_relu, samples=_leaky_relu_samples, types=F32_F16,
                 note="no backward in ggml; layouts ggml_is_contiguous_1 only (the kernel's walk)")
    yield OpInfo("xielu", ref=ref_xielu, samples=_xielu_samples, types=FLOATS,
                 note="no backward in ggml; layouts ggml_is_contiguous_1 only (asserted by the kernel)")
    # the first F32 samples are RELU, NEG, EXP: the gradient check runs on those
    yield _unary_info("unary", grad=True)
    yield _unary_info("unary_inplace")


OPINFOS = list(_infos())
