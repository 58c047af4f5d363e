"""OpInfos of the [arith] family: add, sub, mul, div and friends, scale, clamp, fill."""

from __future__ import annotations

import numpy as np

from pyggml._core import Type
from pyggml.opinfo import Arg, OpInfo, Sample
from pyggml.opinfo._common import (CONVERT_NOTE, CONVERT_TOL, CONVERTED, FLOATS, IQ4_NL_WHY, SLOW_TO_QUANTIZE,
                                   bf16_if_taken, broadcast_pairs, normal, quantized_but, round_trip, tile_to, unary_samples,
                                   unsampled)


def _binary(rng, t, denominator=False, broadcast_grad_defect=""):
    """a (type t) and b (F32, or t) over ggml's broadcasting, and over layouts."""
    for ash, bsh in broadcast_pairs():
        b = normal(rng, bsh)
        if denominator:
            b = np.sign(b) * (np.abs(b) + 0.5)          # away from 0
        defect = broadcast_grad_defect if ash != bsh else ""
        for btype in {t, Type.F32} if t != Type.F32 else (Type.F32,):
            yield Sample((Arg(normal(rng, ash), t), Arg(b, btype)), f"{ash} by {bsh} b {btype.name}",
                         grad_defect=defect)
    a = normal(rng, (3, 5))
    b = normal(rng, (3, 5)) + (3.0 if denominator else 0.0)
    yield Sample((Arg(a, t), Arg(b, t, "transposed")), "b transposed")
    yield Sample((Arg(a, t, "strided"), Arg(b, t)), "a strided rows")


def _binary_info(name, fn, denominator=False, broadcast_grad_defect="", **kw):
    def samples(rng, t):
        return _binary(rng, t, denominator, broadcast_grad_defect)
    return OpInfo(name, ref=lambda a, b: fn(a, tile_to(b, a.shape)), samples=samples, types=FLOATS, **kw)


def _ref_add_cast(a, b, typ):
    return a + b                       # b repeated along rows only: same as tiling here


def _add_cast_samples(rng, t):
    # t is a's type. The pairs the CPU kernels take: an F16/BF16 a with an F32 b into a's
    # type or F32 (binary-ops.cpp), a quantized a of b's shape into F32 (add_q_f32)
    n = max(64, t.blck_size)            # whole blocks of a quantized a
    for rt in (Type.F32,) if t.is_quantized else (t, Type.F32):
        a = normal(rng, (3, n))
        yield Sample((Arg(a, t), Arg(normal(rng, (3, n))), rt), f"{t.name} + F32 as {rt.name}")
        if not t.is_quantized:          # the quantized kernel (add_q_f32) takes same shapes only
            yield Sample((Arg(a, t), Arg(normal(rng, (1, n))), rt), f"{t.name} + row as {rt.name}")


def _ref_add_id(a, b, ids):
    # a [n_embd, n_used, n_tokens] (ggml order); row i1 of token i2 gets b's row ids[i2, i1]
    return a + b[ids]


def _add_id_samples(rng, t):
    a = normal(rng, (4, 3, 8))                        # numpy (n_tokens, n_used, n_embd)
    b = normal(rng, (5, 8))                           # 5 rows to choose from
    ids = rng.integers(0, 5, size=(4, 3)).astype(np.int32)
    yield Sample((Arg(a, t), Arg(b, t), Arg(ids, Type.I32)), "4 tokens x 3 used of 5")


def _ref_acc(a, b, nb1, nb2, nb3, offset):
    """a copy of a, and the view of it at byte offset with byte strides nb1..3 (ggml's
    view of F32 elements) gets b added."""
    out = a.copy()
    flat = out.reshape(-1)
    ne = tuple(reversed(b.shape)) + (1,) * (4 - b.ndim)
    b4 = b.reshape((1,) * (4 - b.ndim) + b.shape)
    for i3 in range(ne[3]):
        for i2 in range(ne[2]):
            for i1 in range(ne[1]):
                start = (offset + i1 * nb1 + i2 * nb2 + i3 * nb3) // 4
                flat[start:start + ne[0]] += b4[i3, i2, i1]
    return out


def _acc_samples(rng, t):
    a = normal(rng, (4, 6))                           # ne (6, 4): rows of 24 bytes
    yield Sample((Arg(a, t), Arg(normal(rng, (2, 3)), t), 24, 48, 96, 8), "2x3 block at (2, 0)")
    yield Sample((Arg(a, t), Arg(normal(rng, (6,)), t), 24, 24, 24, 24), "row 1")
    yield Sample((Arg(a, t), Arg(normal(rng, (2, 2)), t), 48, 96, 96, 0), "every other row")


# SCALE: F32, and BF16 where its kernel is 0.25.3's (rules_arith.c)
SCALE_TYPES = (Type.F32,) + bf16_if_taken("SCALE")


def _scale_samples(rng, t):
    for s in unary_samples(rng, t, layouts=("contiguous",)):
        yield Sample(s.args + (-1.75,), s.name)


def _scale_bias_samples(rng, t):
    for s in unary_samples(rng, t, layouts=("contiguous",)):
        yield Sample(s.args + (0.5, -2.0), s.name)


def _clamp_samples(rng, t):
    for s in unary_samples(rng, t, layouts=("contiguous",)):
        yield Sample(s.args + (-0.5, 0.75), s.name)


def _fill_samples(rng, t):
    for s in unary_samples(rng, t, layouts=("contiguous",)):
        yield Sample(s.args + (3.25,), s.name)


# add_q_f32 and add1_q_f32 (a quantized a; an F32 b of a's shape, or an F32 scalar): the
# kernels dequantize a's row, add b in F32 and quantize the sum into a's type with the CPU's
# from_float. The reference forms the same F32 sum (one IEEE addition per element, as the
# kernel does) and quantizes it with ggml's own quantizer (round_trip), so the comparison is
# exact but where the CPU's quantizer is not the reference one (Q8_0: CONVERT_TOL). The same
# add_q_f32 into F32 is sampled by add_cast for every readable type but the slow ones. Into a
# type the CPU cannot write the kernels write past the result: defect add-q-no-from-float.
_ADD_Q = quantized_but(*SLOW_TO_QUANTIZE)
_INTO_Q_UNSAMPLED = unsampled((t for t in quantized_but() if t.has_cpu_from_float), IQ4_NL_WHY, sampled=CONVERTED)
_ADD_TYPES = FLOATS + CONVERTED
_ADD_TOL = CONVERT_TOL
_ADD_Q_NOTE = ("a quantized a (add_q_f32, add1_q_f32) gets an F32 b and its result is a's type: compared exactly "
               "with ggml's own quantization of the F32 sum; " + CONVERT_NOTE)


def _into_q(a, b, t):
    """the kernel's F32 sum of a's stored values and b, as ggml stores it in a's type t"""
    return round_trip(a.astype(np.float32) + np.asarray(b, np.float32), t)


def _ref_add(a, b, types):
    if Type(types[0]).is_quantized:
        return _into_q(a, b, Type(types[0]))
    return a + tile_to(b, a.shape)


def _add_samples(rng, t):
    if t.is_quantized:                  # add_q_f32 takes an F32 b of a's shape only
        yield Sample((Arg(normal(rng, (3, 256)), t), Arg(normal(rng, (3, 256)))), f"{t.name} + F32 of its shape")
        yield Sample((Arg(normal(rng, (2, 2, 512)), t), Arg(normal(rng, (2, 2, 512)))), f"{t.name} + F32, 3-d")
        return
    yield from _binary(rng, t)


def _ref_add1(a, b, types):
    if Type(types[0]).is_quantized:
        return _into_q(a, np.broadcast_to(b.reshape(-1)[0], a.shape), Type(types[0]))
    return a + b.reshape(-1)[0]


def _add1_samples(rng, t):
    if t.is_quantized:                  # (add1 of a quantized batch, ne3 > 1, is defect add1-quantized-batch)
        for shape in ((2, 256), (2, 3, 512)):
            yield Sample((Arg(normal(rng, shape), t), Arg(normal(rng, (1,)))), f"{t.name} {shape} + scalar")
        return
    for shape in ((7,), (3, 5), (2, 3, 4)):
        yield Sample((Arg(normal(rng, shape), t), Arg(normal(rng, (1,)), Type.F32 if t != Type.F32 else t)),
                     f"{shape} + scalar", grad_defect="add1-grad-mean")


OPINFOS = [
    OpInfo("add", ref=_ref_add, samples=_add_samples, types=_ADD_TYPES, tol=_ADD_TOL, typed_ref=True, grad=True,
           unsampled=_INTO_Q_UNSAMPLED, note=_ADD_Q_NOTE),
    OpInfo("add_inplace", ref=_ref_add, samples=_add_samples, types=_ADD_TYPES, tol=_ADD_TOL, typed_ref=True,
           unsampled=_INTO_Q_UNSAMPLED, note=_ADD_Q_NOTE),
    _binary_info("sub", np.subtract, grad=True, broadcast_grad_defect="sub-div-broadcast-grad"),
    _binary_info("sub_inplace", np.subtract),
    _binary_info("mul", np.multiply, grad=True),
    _binary_info("mul_inplace", np.multiply),
    _binary_info("div", np.divide, denominator=True, grad=True, broadcast_grad_defect="sub-div-broadcast-grad"),
    _binary_info("div_inplace", np.divide, denominator=True),
    OpInfo("add_cast", ref=_ref_add_cast, samples=_add_cast_samples,
           types=(Type.F16, Type.BF16) + _ADD_Q, tol={Type.F16: 1e-6, Type.BF16: 2e-5},
           note="the type is a's (ggml_add_cast asserts a quantized, F16 or BF16 a); the result of an F16/BF16 "
                "a may round to that type; a quantized a is dequantized exactly into the F32 result"),
    OpInfo("add_id", ref=_ref_add_id, samples=_add_id_samples, grad=False),
    OpInfo("add1", ref=_ref_add1, samples=_add1_samples, types=_ADD_TYPES, tol=_ADD_TOL, typed_ref=True, grad=True,
           unsampled=_INTO_Q_UNSAMPLED, note=_ADD_Q_NOTE),
    OpInfo("add1_inplace", ref=_ref_add1, samples=_add1_samples, types=_ADD_TYPES, tol=_ADD_TOL, typed_ref=True,
           unsampled=_INTO_Q_UNSAMPLED, note=_ADD_Q_NOTE),
    OpInfo("acc", ref=_ref_acc, samples=_acc_samples, grad=True),
    OpInfo("acc_inplace", ref=_ref_acc, samples=_acc_samples),
    OpInfo("scale", ref=lambda a, s: a * np.float32(s), samples=_scale_samples, grad=True, types=SCALE_TYPES),
    OpInfo("scale_inplace", ref=lambda a, s: a * np.float32(s), samples=_scale_samples, types=SCALE_TYPES),
    OpInfo("scale_bias", ref=lambda a, s, b: a * np.float32(s) + np.float32(b), samples=_scale_bias_samples,
           types=SCALE_TYPES),
    OpInfo("scale_bias_inplace", ref=lambda a, s, b: a * np.float32(s) + np.float32(b),
           samples=_scale_bias_samples, types=SCALE_TYPES),
    OpInfo("clamp", ref=lambda a, lo, hi: np.clip(a, np.float32(lo), np.float32(hi)), samples=_clamp_samples,
           types=(Type.F32, Type.F16)),
    OpInfo("clamp_inplace", ref=lambda a, lo, hi: np.clip(a, np.float32(lo), np.float32(hi)), samples=_clamp_samples,
           types=(Type.F32, Type.F16), note="ggml 0.25.3 on (clamp itself computed in place before)"),
    OpInfo("fill", ref=lambda a, c: np.full_like(a, np.float32(c)), samples=_fill_samples,
           types=(Type.F32, Type.F16)),
    OpInfo("fill_inplace", ref=lambda a, c: np.full_like(a, np.float32(c)), samples=_fill_samples,
           types=(Type.F32, Type.F16)),
]
