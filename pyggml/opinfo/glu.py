"""OpInfos of the [glu] family: glu, reglu geglu swiglu geglu_erf geglu_quick (+ _swapped,
_split), glu_split and swiglu_oai.

ggml's gated units act(x) * g, where, for one tensor a, x and g are the two halves of
each row along ne0: x = a[..., :n], g = a[..., n:2n] with n = ne0 // 2 (swapped: the
other way round; an odd row's last element is read by neither); for a split pair, x = a
and g = b (same shape). The CPU kernels take F32 and F16 (swiglu_oai F32 only), inputs
ggml_is_contiguous_1 (asserted by the builder: rows contiguous, dims 2, 3 packed over
dim 1; the ``strided`` layout is such a view). Only SWIGLU with a split b has a backward.
GEGLU and GEGLU_QUICK share the F32 GELU tables of the activation family.
"""

from __future__ import annotations

import numpy as np

from pyggml._core import GluOp, Type
from pyggml.opinfo import Arg, OpInfo, Sample
from pyggml.opinfo._common import bf16_if_taken, normal
from pyggml.opinfo.activation import (ref_gelu, ref_gelu_erf, ref_gelu_quick, ref_relu, ref_sigmoid, ref_silu,
                                      left_tail_free)

__all__ = ["OPINFOS"]

F32_F16 = (Type.F32, Type.F16)
# REGLU, GEGLU, SWIGLU, GEGLU_ERF, GEGLU_QUICK: BF16 too where GLU's kernel is 0.25.3's (rules_glu.c)
GLU_TYPES = F32_F16 + bf16_if_taken("GLU")

ACTS = {"REGLU": ref_relu, "GEGLU": ref_gelu, "SWIGLU": ref_silu, "GEGLU_ERF": ref_gelu_erf,
        "GEGLU_QUICK": ref_gelu_quick}
# GEGLU/GEGLU_QUICK in F32 read the F16 GELU tables (activation family): F16 precision
_TABLE_TOL = {Type.F32: 5e-6, Type.F16: 2e-6}
_TABLE_NOTE = ("the F32 kernel reads ggml's F16 GELU table (GGML_GELU_FP16 / GGML_GELU_QUICK_FP16), so its "
               "results have F16's precision (as gelu / gelu_quick; NMSE measured up to 1.5e-6 over 20 seeds); "
               "the F16 kernel rounds twice (the table's F16 value, then the product): up to 5e-7 measured; "
               "gates N(0, 2) clipped to [-3.5, 4.5] (see gelu_erf's note on the left tail)")


def halves(a, swapped):
    n = a.shape[-1] // 2
    x, g = a[..., :n], a[..., n:2 * n]
    return (g, x) if swapped else (x, g)


def ref_swiglu_oai(x, g, alpha, limit):
    """gpt-oss: x' = min(x, limit), g' = clamp(g, -limit, limit); x' sigmoid(alpha x') (g' + 1)."""
    alpha, limit = float(np.float32(alpha)), float(np.float32(limit))
    xc = np.minimum(x, limit)
    gc = np.clip(g, -limit, limit)
    return xc * ref_sigmoid(alpha * xc) * (gc + 1.0)


def ref_swiglu_clamp(x, g, limit):
    """ggml 0.25.3's SWIGLU_CLAMP: x' = min(x, limit), g' = clamp(g, -limit, limit); silu(x') g'."""
    limit = float(np.float32(limit))
    xc = np.minimum(x, limit)
    return ref_silu(xc) * np.clip(g, -limit, limit)


def _gate_values(rng, shape, op):
    """the gate half bounded away from GELU's left tail; the other half N(0, 1)"""
    return left_tail_free(rng, shape) if op != "REGLU" else normal(rng, shape, 2.0)


def _fused_value(rng, shape, op):
    """a tensor whose two halves (either way round) are gate-like values"""
    return _gate_values(rng, shape, op)


# one tensor: (shape, layout), ne0 even unless said
_FUSED_SHAPES = (((3, 8), "contiguous"), ((2, 3, 6), "contiguous"), ((2, 1, 3, 4), "contiguous"),
                 ((3, 8), "strided"), ((2, 3, 10), "strided"), ((4, 2), "contiguous"),
                 ((2, 7), "contiguous"))


def _fused_samples(rng, t, op, swapped):
    for shape, layout in _FUSED_SHAPES:
        odd = " (odd ne0: the last element is read by neither half)" if shape[-1] % 2 else ""
        yield Sample((Arg(_fused_value(rng, shape, op), t, layout),), f"{layout} {shape}{odd}")


def _fused_info(name, op, swapped):
    act = ACTS[op]

    def ref(a):
        x, g = halves(a, swapped)
        return act(x) * g

    def samples(rng, t):
        return _fused_samples(rng, t, op, swapped)
    kw = {"tol": _TABLE_TOL, "note": _TABLE_NOTE} if op in ("GEGLU", "GEGLU_QUICK") else {}
    return OpInfo(name, ref=ref, samples=samples, types=GLU_TYPES, **kw)


# split pairs: (shape, layout of a, layout of b)
_SPLIT_SHAPES = (((3, 4), "contiguous", "contiguous"), ((2, 3, 5), "contiguous", "contiguous"),
                 ((2, 1, 3, 4), "contiguous", "contiguous"), ((3, 5), "strided", "contiguous"),
                 ((2, 3, 4), "contiguous", "strided"), ((4, 1), "transposed", "transposed"))


def _split_pairs(rng, t, op):
    for shape, la, lb in _SPLIT_SHAPES:
        a = Arg(_gate_values(rng, shape, op), t, la)
        b = Arg(normal(rng, shape), t, lb)
        yield (a, b), f"a {la}, b {lb} {shape}"


def _split_info(name, op):
    act = ACTS[op]

    def ref(a, b):
        if b is None:
            x, g = halves(a, False)
            return act(x) * g
        return act(a) * b

    def samples(rng, t):
        # the pairs first (the gradient check of swiglu_split takes the first three)
        for args, what in _split_pairs(rng, t, op):
            yield Sample(args, what)
        yield Sample((Arg(_fused_value(rng, (3, 8), op), t), None), "b NULL: the halves of a")
    kw = {"tol": _TABLE_TOL, "note": _TABLE_NOTE} if op in ("GEGLU", "GEGLU_QUICK") else {}
    return OpInfo(name, ref=ref, samples=samples, types=GLU_TYPES, grad=op == "SWIGLU", **kw)


def _ops(t):
    """the GluOps this build has that the CPU kernel takes for type t (SWIGLU first)"""
    order = ("SWIGLU", "REGLU", "GEGLU", "GEGLU_ERF", "GEGLU_QUICK", "SWIGLU_OAI")
    return [op for op in order if hasattr(GluOp, op) and (op != "SWIGLU_OAI" or t == Type.F32)]


def _ref_generic(x, g, op, alpha=0.0, limit=0.0):
    if op == "SWIGLU_OAI":
        # from ggml_glu / ggml_glu_split, SWIGLU_OAI's alpha and limit (op_params 2, 3) are 0
        return ref_swiglu_oai(x, g, alpha, limit)
    return ACTS[op](x) * g


def _ref_glu(a, op, swapped):
    x, g = halves(a, swapped)
    return _ref_generic(x, g, GluOp(op).name)


def _glu_samples(rng, t):
    for op in _ops(t):
        for swapped in (False, True):
            for shape, layout in (((3, 8), "contiguous"), ((2, 3, 6), "strided")):
                yield Sample((Arg(_fused_value(rng, shape, op), t, layout), getattr(GluOp, op), swapped),
                             f"{op}{' swapped' if swapped else ''} {layout} {shape}")


def _ref_glu_split(a, b, op):
    if b is None:
        return _ref_glu(a, op, False)
    return _ref_generic(a, b, GluOp(op).name)


def _glu_split_samples(rng, t):
    for op in _ops(t):
        for (a, b), what in list(_split_pairs(rng, t, op))[:3]:
            yield Sample((a, b, getattr(GluOp, op)), f"{op} {what}")
    for op in _ops(t):
        yield Sample((Arg(_fused_value(rng, (3, 8), op), t), None, getattr(GluOp, op)), f"{op} b NULL")


def _ref_swiglu_oai(a, b, alpha, limit):
    x, g = (a, b) if b is not None else halves(a, False)
    return ref_swiglu_oai(x, g, alpha, limit)


def _swiglu_oai_samples(rng, t):
    # values of scale 4 so that limits of 1.5 and 7 clip some of them
    for alpha, limit in ((1.702, 7.0), (1.0, 1.5), (0.5, 0.0)):
        yield Sample((Arg(normal(rng, (3, 6), 4.0), t), Arg(normal(rng, (3, 6), 4.0), t), alpha, limit),
                     f"split, alpha {alpha}, limit {limit}")
        yield Sample((Arg(normal(rng, (2, 3, 8), 4.0), t, "strided"), None, alpha, limit),
                     f"halves of a strided, alpha {alpha}, limit {limit}")
    yield Sample((Arg(normal(rng, (2, 1, 3, 4), 4.0), t), Arg(normal(rng, (2, 1, 3, 4), 4.0), t, "strided"),
                  1.702, np.inf), "limit inf, b strided")


def _ref_swiglu_clamp(a, b, limit):
    x, g = (a, b) if b is not None else halves(a, False)
    return ref_swiglu_clamp(x, g, limit)


def _swiglu_clamp_samples(rng, t):
    # values of scale 4 so that limits of 1.5 and 7 clip some of them
    for limit in (7.0, 1.5, 0.0):
        yield Sample((Arg(normal(rng, (3, 6), 4.0), t), Arg(normal(rng, (3, 6), 4.0), t), limit),
                     f"split, limit {limit}")
        yield Sample((Arg(normal(rng, (2, 3, 8), 4.0), t, "strided"), None, limit),
                     f"halves of a strided, limit {limit}")
    yield Sample((Arg(normal(rng, (2, 1, 3, 4), 4.0), t), Arg(normal(rng, (2, 1, 3, 4), 4.0), t, "strided"),
                  np.inf), "limit inf, b strided")


def _infos():
    yield OpInfo("glu", ref=_ref_glu, samples=_glu_samples, types=GLU_TYPES, tol=_TABLE_TOL,
                 note="every GluOp, both halves orders; " + _TABLE_NOTE + "; SWIGLU_OAI (F32 only) with alpha "
                      "and limit 0, as ggml_glu leaves them")
    for op in ("REGLU", "GEGLU", "SWIGLU", "GEGLU_ERF", "GEGLU_QUICK"):
        lower = op.lower()
        yield _fused_info(lower, op, False)
        yield _fused_info(f"{lower}_swapped", op, True)
        yield _split_info(f"{lower}_split", op)
    yield OpInfo("glu_split", ref=_ref_glu_split, samples=_glu_split_samples, types=GLU_TYPES, tol=_TABLE_TOL,
                 grad=True,
                 note="every GluOp; " + _TABLE_NOTE + "; the gradient check takes the first three samples "
                      "(SWIGLU, the only GLU ggml differentiates)")
    yield OpInfo("swiglu_oai", ref=_ref_swiglu_oai, samples=_swiglu_oai_samples, types=(Type.F32,),
                 note="F32 only (the CPU kernel's one type); no backward in ggml")
    yield OpInfo("swiglu_clamp", ref=_ref_swiglu_clamp, samples=_swiglu_clamp_samples, types=F32_F16,
                 note="ggml 0.25.3 on: F32 and F16 (the CPU kernel's types); no backward in ggml")


OPINFOS = list(_infos())
