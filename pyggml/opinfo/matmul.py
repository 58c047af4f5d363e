"""OpInfos of the [matmul] family: mul_mat, mul_mat_id, out_prod.

ggml's matrix product broadcasts ``a`` over dims 2 and 3 by *grouping*, not tiling:
b's matrix i2 uses a's matrix ``i2 // (b.ne2 / a.ne2)`` (ggml-cpu's ``i02 = i12 / r2``,
the GQA head mapping), and the same for dim 3. out_prod broadcasts the same way.
"""

from __future__ import annotations

import numpy as np

from pyggml._core import Type
from pyggml.opinfo import Arg, OpInfo, Sample
from pyggml.opinfo._common import SLOW_TO_QUANTIZE, SLOW_WHY, normal, quantized_but, uniform, unsampled

# quantized types sampled for mul_mat, mul_mat_id and out_prod: every one with a to_float
# but the few whose quantization takes seconds to start (SLOW_TO_QUANTIZE: one dedicated test
# in tests/test_opinfo.py). The harness quantizes each Arg once and hands the reference the
# very bits the tensor holds, so a quantization that is not idempotent does not matter.
QUANT = quantized_but(*SLOW_TO_QUANTIZE)
# the type b may already have (src0's vec_dot type), where pyggml can make it: ggml's
# quantize has no Q8_1 or Q8_K rows (ggml_quantize_chunk), so those b are always F32
VEC_DOT = {Type.F16: Type.F16, Type.BF16: Type.BF16, Type.Q4_0: Type.Q8_0, Type.Q8_0: Type.Q8_0}
# test-backend-ops' NMSE bound for MUL_MAT (an F32 b is quantized to Q8_* first)
QUANT_TOL = 5e-4


def _group(a: np.ndarray, shape) -> np.ndarray:
    """a (numpy order, dims -3 and -4 the batch dims) repeated to the batch dims of
    ``shape`` by grouping: batch i of the result is a's batch i // r."""
    a = a.reshape((1,) * (4 - a.ndim) + a.shape)
    shape = (1,) * (4 - len(shape)) + tuple(shape)
    r3, r2 = shape[0] // a.shape[0], shape[1] // a.shape[1]
    return np.repeat(np.repeat(a, r3, axis=0), r2, axis=1)


def ref_mul_mat(a, b):
    """out[..., n, m] = sum_k a[g(..), m, k] * b[..., n, k]"""
    nd = max(a.ndim, b.ndim, 2)
    b4 = b.reshape((1,) * (4 - b.ndim) + b.shape)
    out = b4 @ np.swapaxes(_group(a, b4.shape), -1, -2)
    return out.reshape(out.shape[4 - nd:])


def _mul_mat_samples(rng, t):
    btypes = (Type.F32,) + ((VEC_DOT[t],) if t in VEC_DOT else ())
    if t.is_quantized:
        # b is rounded to Q8_* by ggml, the reference does not round it: many outputs, or
        # values that do not cancel (single outputs; the 256-blocks, whose Q8_K rounding
        # is coarser), keep the NMSE of that rounding steady
        K = 64 if t.blck_size == 32 else 256
        M = 4 if K == 64 else 2
        gen = normal if K == 64 else (lambda rng, shape: normal(rng, shape) + 2.0)
        for bt in btypes:
            yield Sample((Arg(gen(rng, (M, K)), t), Arg(gen(rng, (3, K)), bt)), f"({M},{K}) x (3,{K}) b {bt.name}")
        yield Sample((Arg(uniform(rng, (2, 1, K), 0.5, 1.5), t), Arg(uniform(rng, (2, 2, 1, K), 0.5, 1.5))),
                     "broadcast dims 2 and 3, M=N=1")
        B3 = 3 if K == 64 else 1
        yield Sample((Arg(gen(rng, (2, M, K)), t), Arg(gen(rng, (B3, 2, 2, K)), Type.F32, "permuted", (0, 2, 1, 3))),
                     "b permuted (dims 1, 2)")
        yield from _blas_sized(rng, t, K, gen)
        return
    # the first three F32 samples are the gradient check's (contiguous; no dim-3 broadcast)
    for bt in btypes:
        yield Sample((Arg(normal(rng, (3, 5)), t), Arg(normal(rng, (4, 5)), bt)), f"(3,5) x (4,5) b {bt.name}")
    yield Sample((Arg(normal(rng, (2, 3, 6)), t), Arg(normal(rng, (2, 4, 6)))), "batched")
    yield Sample((Arg(normal(rng, (2, 3, 6)), t), Arg(normal(rng, (4, 2, 6)))), "a grouped over dim 2 (GQA)")
    yield Sample((Arg(uniform(rng, (1, 7), 0.5, 1.5), t), Arg(uniform(rng, (1, 7), 0.5, 1.5))), "M=N=1, odd K")
    yield Sample((Arg(normal(rng, (3, 1)), t), Arg(normal(rng, (2, 1)))), "K=1")
    yield Sample((Arg(normal(rng, (1, 2, 3, 4)), t), Arg(normal(rng, (2, 4, 2, 4)))), "broadcast dims 2 and 3")
    yield Sample((Arg(normal(rng, (2, 3, 5)), t), Arg(normal(rng, (3, 2, 2, 5)), t, "permuted", (0, 2, 1, 3))),
                 "b permuted (dims 1, 2), same type")
    yield Sample((Arg(normal(rng, (2, 3, 5)), t), Arg(normal(rng, (3, 2, 2, 5)), Type.F32, "permuted", (0, 2, 1, 3))),
                 "b permuted (dims 1, 2), F32")
    yield Sample((Arg(normal(rng, (3, 2, 5)), t, "permuted", (0, 2, 1, 3)), Arg(normal(rng, (3, 4, 5)))),
                 "a permuted (dims 1, 2)")
    yield Sample((Arg(normal(rng, (2, 3, 5)), t, "strided"), Arg(normal(rng, (2, 4, 5)), t, "strided")),
                 "a and b strided")
    yield from _blas_sized(rng, t, 64, normal)


def _blas_sized(rng, t, K, gen):
    """Products of at least 32 in each of M, N and K: the ones ggml's BLAS backend takes
    (smaller ones it leaves to the CPU), so a BLAS build's ``backend:BLAS`` path has
    matrix products to compute."""
    yield Sample((Arg(gen(rng, (40, K)), t), Arg(gen(rng, (36, K)))), f"BLAS-sized (40,{K}) x (36,{K})")
    if not t.is_quantized:
        yield Sample((Arg(gen(rng, (2, 33, K)), t), Arg(gen(rng, (2, 2, 32, K)))),
                     "BLAS-sized, broadcast dims 2 and 3")


def ref_mul_mat_id(a, b, ids):
    """a [K, M, E], b [K, nb, T], ids [U, T] (ggml ne): out[t, e] = a[ids[t, e]] @ b[t, e % nb]"""
    T, U = ids.shape
    out = np.zeros((T, U, a.shape[1]))
    for t_ in range(T):
        for e in range(U):
            out[t_, e] = a[ids[t_, e]] @ b[t_, e % b.shape[1]]
    return out


def _mul_mat_id_samples(rng, t):
    K = t.blck_size if t.is_quantized else 5          # one block per row
    # 256-blocks: values that do not cancel, as in mul_mat (b's Q8_K rounding is coarser)
    gen = (lambda rng, shape: normal(rng, shape) + 2.0) if K >= 256 else normal
    E, M, T, U = 4, 3, 3, 2
    ids = rng.integers(0, E, size=(T, U)).astype(np.int32)
    btypes = (Type.F32,) + ((VEC_DOT[t],) if t in VEC_DOT else ())
    for bt in btypes:
        yield Sample((Arg(gen(rng, (E, M, K)), t), Arg(gen(rng, (T, U, K)), bt), Arg(ids, Type.I32)),
                     f"{T} tokens x {U} of {E} experts, b {bt.name}")
    yield Sample((Arg(gen(rng, (E, M, K)), t), Arg(gen(rng, (T, 1, K))), Arg(ids, Type.I32)),
                 "b broadcast over the experts used")
    yield Sample((Arg(gen(rng, (E, M, K)), t), Arg(gen(rng, (T, U, K)), Type.F32, "permuted", (0, 2, 1, 3)),
                  Arg(ids, Type.I32, "transposed")), "b permuted, ids transposed")
    same = np.full((T, U), 2, np.int32)
    yield Sample((Arg(gen(rng, (E, M, K)), t), Arg(gen(rng, (T, U, K))), Arg(same, Type.I32)),
                 "every slot the same expert")


def ref_out_prod(a, b):
    """a [n0, K, a2, a3], b [m0, K, b2, b3] (ggml ne) -> [n0, m0, b2, b3]:
    out[..., j, i] = sum_k a[g(..), k, i] * b[..., k, j]"""
    nd = max(a.ndim, b.ndim, 2)
    b4 = b.reshape((1,) * (4 - b.ndim) + b.shape)
    out = np.swapaxes(b4, -1, -2) @ _group(a, b4.shape)
    return out.reshape(out.shape[4 - nd:])


def _out_prod_samples(rng, t):
    n0 = t.blck_size if t.is_quantized else 3         # one block per row
    yield Sample((Arg(normal(rng, (4, n0)), t), Arg(normal(rng, (4, 5)))), f"({n0}, K=4) x (5, K=4)")
    yield Sample((Arg(normal(rng, (2, 3, n0)), t), Arg(normal(rng, (2, 3, 2)))), "batched")
    yield Sample((Arg(normal(rng, (1, n0)), t), Arg(normal(rng, (1, 1)))), "K=1, m0=1")
    yield Sample((Arg(normal(rng, (2, 4, n0)), t), Arg(normal(rng, (2, 4, 5)), Type.F32, "transposed")),
                 "b transposed (as ggml's mul_mat backward makes it)")
    if t == Type.F32:
        yield Sample((Arg(normal(rng, (2, 3, n0)), t), Arg(normal(rng, (4, 3, 2)))), "a grouped over dim 2")
        yield Sample((Arg(normal(rng, (1, 2, 3, n0)), t), Arg(normal(rng, (2, 4, 3, 5)))), "broadcast dims 2 and 3")
        yield Sample((Arg(normal(rng, (2, 3, n0)), t, "strided"), Arg(normal(rng, (2, 3, 4)), Type.F32, "permuted",
                                                                        (0, 2, 1, 3))), "a strided, b permuted")


OPINFOS = [
    OpInfo("mul_mat", ref=ref_mul_mat, samples=_mul_mat_samples,
           types=(Type.F32, Type.F16, Type.BF16) + QUANT, grad=True, unsampled=unsampled(SLOW_TO_QUANTIZE, SLOW_WHY),
           tol={Type.F16: 1e-6, Type.BF16: 1e-4, **{q: QUANT_TOL for q in QUANT}},
           note="an F32 b is converted to a's vec_dot type before the dot products (F16, BF16, Q8_0/Q8_1/Q8_K), "
                "which the reference (exact products of the stored a and b) does not: measured NMSE up to "
                "2.2e-7 (F16), 3.5e-5 (BF16) over 150 seeds, 2.0e-4 (quantized a, worst of 20 types, MXFP4: b rounded "
                "to Q8_*) over 100 seeds, hence 1e-4 for "
                "BF16 and test-backend-ops' MUL_MAT bound 5e-4 for quantized a; gradient samples avoid "
                "broadcasting over dim 3 (ggml's backward aborts there: see tests/test_rules_matmul.py)"),
    OpInfo("mul_mat_id", ref=ref_mul_mat_id, samples=_mul_mat_id_samples,
           types=(Type.F32, Type.F16, Type.BF16) + QUANT, unsampled=unsampled(SLOW_TO_QUANTIZE, SLOW_WHY),
           tol={Type.F16: 1e-6, Type.BF16: 1e-4, **{q: QUANT_TOL for q in QUANT}},
           note="an F32 b is converted to the experts' vec_dot type as in mul_mat (measured NMSE up to 2.2e-7 "
                "F16, 8.3e-6 BF16 over 40 seeds, 2.5e-4 over 150 seeds for the worst of 20 quantized types, "
                "IQ4_NL; BF16 gets mul_mat's 1e-4); the ids are data: the rule cannot check that they are in "
                "[0, n_expert)"),
    OpInfo("out_prod", ref=ref_out_prod, samples=_out_prod_samples, types=(Type.F32, Type.F16) + QUANT,
           unsampled=unsampled(SLOW_TO_QUANTIZE, SLOW_WHY)),
]
