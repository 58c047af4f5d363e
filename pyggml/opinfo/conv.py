"""OpInfos of the [conv] family: im2col and the convolutions built on it, direct and
transposed convolutions, col2im, pooling, resizing (upscale / interpolate) and the
timestep embedding.

Shapes are numpy order (ggml's ne reversed): a 2-d kernel a [KW, KH, IC, OC] is
``(OC, IC, KH, KW)`` here, data b [W, H, IC, N] is ``(N, IC, H, W)``. The references
are written from the definitions: a convolution (ggml's, like PyTorch's, is a
cross-correlation) reads input ``o*s + k*d - p`` for output ``o`` and kernel tap ``k``,
zero outside the input; transposed convolutions scatter input ``i`` to ``i*s + k``.

Output sizes follow ggml's builders: ``(n + 2p - d(k-1) - 1) / s + 1`` with C's
truncating division, so an input one stride short of the dilated kernel still gives one
output whose window reaches past the padded input (read as zeros): see ``_osize``.

The sample type ``t`` is the type of the kernel ``a`` for convolutions (the data stays
F32 but where the F16 columns of im2col take F16 data: the other CPU kernels read it as
float), the result type for im2col, the source type for pooling and col2im.

Not sampled: empty tensors (pyggml computes no graph holding a tensor without data).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pyggml._core import OpPool, ScaleFlag, ScaleMode, Type
from pyggml.opinfo import Arg, OpInfo, Sample
from pyggml.opinfo._common import (FLOATS, QUANTIZED, SHAPE_WHY, bf16_if_taken, kernel_since, normal, uniform,
                                  unsampled)

F32, F16, BF16 = Type.F32, Type.F16, Type.BF16
KT = (F32, F16)          # kernel types of the convolutions
# the im2col convolutions multiply F32 columns by the kernel: a BF16 kernel too where MUL_MAT's
# kernel is 0.25.3's, which widens an F16/BF16 src1 for an F32 src0 (rules_matmul.c)
KT_MM = KT + bf16_if_taken("MUL_MAT")

# Convolutions through im2col: ggml's builders make F16 columns for an F32 or F16 kernel
# and mul_mat rounds the F32 kernel to F16 as well, so every product is F16 x F16 summed
# in F32 (a relative error of ~2^-11 per factor). Measured over 40 seeds of these samples:
# NMSE up to 1.3e-6 (F32 kernels) and 1.1e-6 (F16), gradients up to 2.5e-7 (20 seeds).
IM2COL_TOL = {F32: 5e-6, F16: 5e-6}
IM2COL_NOTE = ("ggml's im2col-based builders round the data and an F32 kernel to F16 (F16 columns, "
               "mul_mat's F16 dot product): NMSE measured up to 1.3e-6 over 40 seeds, gradients up to 2.5e-7")
IM2COL_GRAD: dict[str, Any] = {"grad": True, "grad_tol": 5e-6}
# the F16-kernel paths of the direct and transposed convolutions round the data to F16
# too: NMSE measured up to 3.5e-7 (conv_2d_direct) and 8.2e-6 (transposed, stride 0: every
# input summed into the same outputs), 40 seeds
DIRECT_F16 = {F16: 5e-6}
TRANSPOSED_F16 = {F16: 5e-5}


# --- shared helpers ------------------------------------------------------------------------------

def _cdiv(a: int, b: int) -> int:
    """C's integer division (truncates toward zero)"""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def _osize(n: int, k: int, s: int, p: int, d: int) -> int:
    """ggml_calc_conv_output_size: (n + 2p - d(k-1) - 1) / s + 1, truncating"""
    return _cdiv(n + 2 * p - d * (k - 1) - 1, s) + 1


def _taps(n: int, k: int, s: int, p: int, d: int):
    """input index of output o, tap j (o*s + j*d - p), clamped, and whether it is inside"""
    o = np.arange(_osize(n, k, s, p, d))[:, None]
    j = np.arange(k)[None, :]
    idx = o * s + j * d - p
    ok = (idx >= 0) & (idx < n)
    return np.clip(idx, 0, max(n - 1, 0)), ok


def _patches(x: np.ndarray, ks, ss, ps, ds) -> np.ndarray:
    """x (B, C, *spatial) -> (B, C, O1, K1, O2, K2, ...): the input each output position
    and kernel tap reads (zero outside); ks, ss, ps, ds per spatial dim, numpy order"""
    nd = len(ks)
    idx, mask = [], None
    for j in range(nd):
        i, ok = _taps(x.shape[2 + j], ks[j], ss[j], ps[j], ds[j])
        shape = [1] * (2 * nd)
        shape[2 * j], shape[2 * j + 1] = i.shape
        idx.append(i.reshape(shape))
        ok = ok.reshape(shape)
        mask = ok if mask is None else mask & ok
    return x[(slice(None), slice(None)) + tuple(idx)] * mask


def _corr(a: np.ndarray, b: np.ndarray, ss, ps, ds) -> np.ndarray:
    """cross-correlation: a (OC, IC, *K), b (N, IC, *spatial) -> (N, OC, *O)"""
    nd = a.ndim - 2
    p = _patches(b, a.shape[2:], ss, ps, ds)
    letters = "pqrstu"
    o = "".join(letters[2 * j] for j in range(nd))
    k = "".join(letters[2 * j + 1] for j in range(nd))
    ok = "".join(letters[2 * j] + letters[2 * j + 1] for j in range(nd))
    return np.einsum(f"ci{k},ni{ok}->nc{o}", a, p)


def _as4(x: np.ndarray) -> np.ndarray:
    return x.reshape((1,) * (4 - x.ndim) + x.shape)


# --- im2col ------------------------------------------------------------------------------------

def _ref_im2col(a, b, s0, s1, p0, p1, d0, d1, is_2d, dst_type):
    if is_2d:
        oc, ic, kh, kw = _as4(a).shape
        p = _patches(_as4(b), (kh, kw), (s1, s0), (p1, p0), (d1, d0))   # (N, IC, OH, KH, OW, KW)
        n, _, oh, _, ow, _ = p.shape
        return p.transpose(0, 2, 4, 1, 3, 5).reshape(n, oh, ow, ic * kh * kw)
    a3 = a.reshape((1,) * (3 - a.ndim) + a.shape)
    b3 = b.reshape((1,) * (3 - b.ndim) + b.shape)
    k = a3.shape[-1]
    p = _patches(b3, (k,), (s0,), (p0,), (d0,))                          # (N, IC, OL, K)
    n, ic, ol, _ = p.shape
    return p.transpose(0, 2, 1, 3).reshape(n, ol, ic * k)


def _im2col_samples(rng, t):
    data = (F32, F16) if t == F16 else (F32,)
    for bt in data:
        # 2-d: (kernel numpy shape, data shape, s0, s1, p0, p1, d0, d1)
        for ksh, bsh, s0, s1, p0, p1, d0, d1 in (
                ((2, 3, 3, 3), (2, 3, 6, 5), 1, 1, 0, 0, 1, 1),
                ((1, 2, 2, 3), (1, 2, 5, 7), 2, 1, 1, 0, 1, 2),
                ((1, 1, 1, 1), (2, 1, 3, 4), 1, 2, 0, 1, 1, 1),
                ((1, 2, 3, 2), (1, 2, 4, 4), 3, 2, 2, 1, 2, 1),      # padding larger than a stride
                ((1, 1, 3, 3), (1, 1, 2, 2), 2, 2, 0, 0, 1, 1),      # truncated size: one window past the input
                ((1, 1, 2, 2), (1, 1, 5, 5), 1, 1, -1, 0, 1, 1)):    # negative padding crops
            name = f"2-d {bsh} * {ksh} s=({s0},{s1}) p=({p0},{p1}) d=({d0},{d1}) b {bt.name}"
            yield Sample((Arg(normal(rng, ksh), param=False), Arg(normal(rng, bsh), bt), s0, s1, p0, p1, d0, d1,
                          True, t), name)
        # 1-d: a [K, IC, OC], b [L, IC, N]; s1, p1, d1 unused
        for ksh, bsh, s0, p0, d0 in (((2, 3, 3), (2, 3, 8), 1, 0, 1), ((1, 2, 4), (3, 2, 9), 2, 1, 2),
                                      ((1, 1, 1), (1, 1, 5), 1, 0, 1)):
            yield Sample((Arg(normal(rng, ksh), param=False), Arg(normal(rng, bsh), bt), s0, 0, p0, 0, d0, 0,
                          False, t), f"1-d {bsh} * {ksh} s={s0} p={p0} d={d0} b {bt.name}")
    # the kernel gives only its shape: any type
    yield Sample((Arg(normal(rng, (2, 2, 2, 2)), F16, param=False), Arg(normal(rng, (1, 2, 4, 4))), 1, 1, 0, 0,
                  1, 1, True, t), "2-d, an F16 kernel")
    # layouts: channels and batch swapped (2-d), strided rows (1-d)
    b = normal(rng, (2, 3, 4, 5))
    yield Sample((Arg(normal(rng, (1, 3, 2, 2)), param=False), Arg(b, F32, "permuted", (0, 1, 3, 2)),
                  1, 1, 1, 1, 1, 1, True, t), "2-d b permuted (IC and N swapped)")
    yield Sample((Arg(normal(rng, (1, 3, 3)), param=False), Arg(normal(rng, (2, 3, 7)), F32, "strided"),
                  1, 0, 1, 0, 1, 0, False, t), "1-d b strided")


def _ref_im2col_3d(a, b, ic, s0, s1, s2, p0, p1, p2, d0, d1, d2, dst_type):
    kd, kh, kw = _as4(a).shape[1:]
    b4 = _as4(b)
    n = b4.shape[0] // ic
    x = b4[:n * ic].reshape(n, ic, *b4.shape[1:])
    p = _patches(x, (kd, kh, kw), (s2, s1, s0), (p2, p1, p0), (d2, d1, d0))   # (N, IC, OD, KD, OH, KH, OW, KW)
    _, _, od, _, oh, _, ow, _ = p.shape
    return p.transpose(0, 2, 4, 6, 1, 3, 5, 7).reshape(n * od, oh, ow, ic * kd * kh * kw)


def _im2col_3d_samples(rng, t):
    for ksh, bsh, ic, st, pd, dl in (
            ((4, 2, 2, 2), (4, 3, 4, 5), 2, (1, 1, 1), (0, 0, 0), (1, 1, 1)),
            ((3, 1, 2, 3), (3, 4, 4, 3), 3, (2, 1, 2), (1, 0, 1), (1, 2, 1)),
            ((2, 2, 1, 1), (2, 2, 3, 3), 1, (1, 2, 1), (0, 1, 0), (1, 1, 1))):
        yield Sample((Arg(normal(rng, ksh), param=False), Arg(normal(rng, bsh)), ic, *st, *pd, *dl, t),
                     f"{bsh} * {ksh} IC={ic} s={st} p={pd} d={dl}")
    b = normal(rng, (2, 3, 3, 4))
    for layout, perm in (("strided", (0, 1, 2, 3)), ("permuted", (0, 2, 1, 3))):
        yield Sample((Arg(normal(rng, (2, 2, 2, 2)), param=False), Arg(b, F32, layout, perm), 2, 1, 1, 1, 0, 0, 0,
                      1, 1, 1, t), f"b {layout} (read through strides)")


# --- col2im ------------------------------------------------------------------------------------

def _ref_col2im_1d(a, s0, oc, p0):
    t_in, k_oc = a.shape
    k = k_oc // oc
    full = np.zeros((oc, (t_in - 1) * s0 + k))
    for i in range(t_in):
        full[:, i * s0:i * s0 + k] += a[i].reshape(oc, k)
    t_out = (t_in - 1) * s0 + k - 2 * p0
    return full[:, p0:p0 + t_out]


def _col2im_samples(rng, t):
    for t_in, k, oc, s0, p0 in ((6, 4, 2, 2, 1), (5, 3, 1, 1, 0), (4, 2, 3, 3, 0), (3, 5, 2, 2, 2), (1, 1, 1, 1, 0)):
        yield Sample((Arg(normal(rng, (t_in, k * oc)), t), s0, oc, p0),
                     f"T_in={t_in} K={k} OC={oc} s={s0} p={p0}")


# --- convolutions through im2col ---------------------------------------------------------------

def _ref_conv_1d(a, b, s0, p0, d0):
    b3 = b.reshape((1,) * (3 - b.ndim) + b.shape)
    return _corr(a.reshape((1,) * (3 - a.ndim) + a.shape), b3, (s0,), (p0,), (d0,))


def _conv_1d_shapes():
    # (kernel (OC, IC, K), data (N=1, IC, L), s, p, d)
    return (((3, 2, 3), (1, 2, 8), 1, 0, 1), ((2, 3, 4), (1, 3, 9), 2, 1, 1), ((4, 1, 3), (1, 1, 10), 1, 2, 2),
            ((1, 1, 1), (1, 1, 5), 1, 0, 1), ((2, 2, 5), (1, 2, 7), 3, 2, 1))


def _conv_1d_samples(rng, t):
    # N = 1 only: with N > 1 ggml_conv_1d returns its [OL, N, OC] product labelled [OL, OC, N]
    # (tests/test_rules_conv.py shows it)
    for ksh, bsh, s, p, d in _conv_1d_shapes():
        yield Sample((Arg(normal(rng, ksh), t), Arg(normal(rng, bsh)), s, p, d), f"{bsh} * {ksh} s={s} p={p} d={d}")
    yield Sample((Arg(normal(rng, (2, 3, 3)), t), Arg(normal(rng, (1, 3, 7)), F32, "strided"), 1, 1, 1),
                 "b strided (channels apart)")


def _conv_1d_ph_samples(rng, t):
    for ksh, bsh, s, _, d in _conv_1d_shapes():
        yield Sample((Arg(normal(rng, ksh), t), Arg(normal(rng, bsh)), s, d), f"{bsh} * {ksh} s={s} d={d}")


def _ref_conv_1d_ph(a, b, s, d):
    return _ref_conv_1d(a, b, s, a.shape[-1] // 2, d)


def _ref_conv_1d_dw(a, b, s0, p0, d0):
    # a [K, 1, C] (numpy (C, 1, K)), b [L, C] (numpy (C, L)): channel c by kernel c
    c, _, k = a.shape
    b2 = b.reshape(c, -1)
    p = _patches(b2[None], (k,), (s0,), (p0,), (d0,))[0]          # (C, OL, K)
    return np.einsum("ck,cok->co", a[:, 0], p)


def _conv_1d_dw_shapes():
    # (kernel (C, 1, K), data (C, L), s, p, d)
    return (((3, 1, 3), (3, 8), 1, 1, 1), ((2, 1, 4), (2, 9), 2, 0, 1), ((4, 1, 2), (4, 7), 1, 1, 3),
            ((1, 1, 1), (1, 4), 1, 0, 1))


def _conv_1d_dw_samples(rng, t):
    for ksh, bsh, s, p, d in _conv_1d_dw_shapes():
        yield Sample((Arg(normal(rng, ksh), t), Arg(normal(rng, bsh)), s, p, d), f"{bsh} * {ksh} s={s} p={p} d={d}")


def _conv_1d_dw_ph_samples(rng, t):
    for ksh, bsh, s, _, d in _conv_1d_dw_shapes():
        yield Sample((Arg(normal(rng, ksh), t), Arg(normal(rng, bsh)), s, d), f"{bsh} * {ksh} s={s} d={d}")


def _ref_conv_1d_dw_ph(a, b, s0, d0):
    return _ref_conv_1d_dw(a, b, s0, a.shape[-1] // 2, d0)


def _ref_conv_2d(a, b, s0, s1, p0, p1, d0, d1):
    return _corr(_as4(a), _as4(b), (s1, s0), (p1, p0), (d1, d0))


def _conv_2d_shapes():
    # (kernel (OC, IC, KH, KW), data (N, IC, H, W), s0, s1, p0, p1, d0, d1)
    return (((2, 2, 3, 3), (1, 2, 5, 5), 1, 1, 0, 0, 1, 1),
            ((3, 2, 2, 3), (2, 2, 5, 6), 2, 1, 1, 0, 1, 1),
            ((2, 1, 3, 2), (1, 1, 7, 6), 1, 2, 1, 1, 2, 1),
            ((1, 3, 1, 1), (2, 3, 3, 4), 1, 1, 0, 0, 1, 1),
            ((2, 2, 2, 2), (1, 2, 4, 5), 3, 2, 2, 1, 1, 2),
            ((2, 3, 3, 3), (1, 3, 2, 5), 2, 2, 0, 0, 1, 1))      # truncated height: one window past the input


def _conv_2d_samples(rng, t, f16_data=True):
    for ksh, bsh, *prm in _conv_2d_shapes():
        yield Sample((Arg(normal(rng, ksh), t), Arg(normal(rng, bsh)), *prm), f"{bsh} * {ksh} {tuple(prm)}")
    # b with channels and batch swapped in memory (im2col reads channel planes through nb)
    yield Sample((Arg(normal(rng, (2, 3, 2, 2)), t), Arg(normal(rng, (2, 3, 4, 4)), F32, "permuted", (0, 1, 3, 2)),
                  1, 1, 0, 0, 1, 1), "b permuted (IC and N swapped)")
    if t == F16 and f16_data:     # F16 columns take F16 data as well (not the direct kernel)
        yield Sample((Arg(normal(rng, (2, 2, 3, 3)), t), Arg(normal(rng, (1, 2, 5, 4)), F16), 1, 1, 1, 1, 1, 1),
                     "F16 data")


def _ref_conv_2d_sk_p0(a, b):
    kh, kw = _as4(a).shape[2:]
    return _ref_conv_2d(a, b, kw, kh, 0, 0, 1, 1)


def _ref_conv_2d_s1_ph(a, b):
    kh, kw = _as4(a).shape[2:]
    return _ref_conv_2d(a, b, 1, 1, kw // 2, kh // 2, 1, 1)


def _conv_2d_fixed_samples(rng, t):
    for ksh, bsh in (((2, 2, 2, 2), (1, 2, 4, 6)), ((3, 1, 3, 2), (2, 1, 6, 5)), ((2, 4, 1, 1), (1, 4, 3, 3)),
                     ((2, 3, 3, 3), (1, 3, 7, 5))):
        yield Sample((Arg(normal(rng, ksh), t), Arg(normal(rng, bsh))), f"{bsh} * {ksh}")


def _ref_conv_2d_dw(a, b, s0, s1, p0, p1, d0, d1):
    # a [KW, KH, 1, C] (numpy (C, 1, KH, KW)), b [W, H, C, N] (numpy (N, C, H, W))
    a4, b4 = _as4(a), _as4(b)
    p = _patches(b4, a4.shape[2:], (s1, s0), (p1, p0), (d1, d0))    # (N, C, OH, KH, OW, KW)
    return np.einsum("ckl,ncpkql->ncpq", a4[:, 0], p)


def _conv_2d_dw_shapes():
    # (kernel (C, 1, KH, KW), data (N, C, H, W), s0, s1, p0, p1, d0, d1)
    return (((3, 1, 3, 3), (1, 3, 5, 5), 1, 1, 1, 1, 1, 1),
            ((2, 1, 2, 3), (2, 2, 6, 5), 2, 1, 0, 1, 1, 1),
            ((4, 1, 3, 2), (1, 4, 7, 6), 1, 2, 1, 0, 1, 2),
            ((1, 1, 1, 1), (2, 1, 3, 2), 1, 1, 0, 0, 1, 1))


def _conv_2d_dw_samples(rng, t):
    for ksh, bsh, *prm in _conv_2d_dw_shapes():
        yield Sample((Arg(normal(rng, ksh), t), Arg(normal(rng, bsh)), *prm), f"{bsh} * {ksh} {tuple(prm)}")


def _ref_conv_3d(a, b, ic, s0, s1, s2, p0, p1, p2, d0, d1, d2):
    # a [KW, KH, KD, OC*IC] (numpy (OC*IC, KD, KH, KW), entry oc*IC + ic); b [W, H, D, N*IC]
    # (entry n*IC + ic); result [OW, OH, OD, OC*N] (entry n*OC + oc)
    a4, b4 = _as4(a), _as4(b)
    oc, n = a4.shape[0] // ic, b4.shape[0] // ic
    k = a4.reshape(oc, ic, *a4.shape[1:])
    x = b4[:n * ic].reshape(n, ic, *b4.shape[1:])
    out = _corr(k, x, (s2, s1, s0), (p2, p1, p0), (d2, d1, d0))    # (N, OC, OD, OH, OW)
    return out.reshape(n * oc, *out.shape[2:])


def _conv_3d_shapes():
    # (kernel (OC*IC, KD, KH, KW), data (N*IC, D, H, W), IC, N, OC, s, p, d) with s, p, d (w, h, d)
    return (((4, 2, 2, 2), (2, 3, 4, 4), 2, 1, 2, (1, 1, 1), (0, 0, 0), (1, 1, 1)),
            ((6, 1, 2, 3), (6, 3, 4, 5), 3, 2, 2, (2, 1, 1), (1, 0, 1), (1, 2, 1)),
            ((2, 2, 1, 2), (4, 4, 3, 3), 1, 4, 2, (1, 2, 2), (0, 1, 0), (2, 1, 1)),
            ((3, 1, 1, 1), (3, 2, 2, 2), 1, 3, 3, (1, 1, 1), (0, 0, 0), (1, 1, 1)))


def _conv_3d_samples(rng, t):
    for ksh, bsh, ic, n, oc, st, pd, dl in _conv_3d_shapes():
        yield Sample((Arg(normal(rng, ksh), t), Arg(normal(rng, bsh)), ic, *st, *pd, *dl),
                     f"{bsh} * {ksh} IC={ic} s={st} p={pd} d={dl}")
    yield Sample((Arg(normal(rng, (4, 2, 2, 2)), t), Arg(normal(rng, (2, 3, 4, 4)), F32, "permuted", (0, 2, 1, 3)),
                  2, 1, 1, 1, 0, 0, 0, 1, 1, 1), "b permuted (im2col_3d reads through strides)")


def _ref_conv_3d_direct(a, b, s0, s1, s2, p0, p1, p2, d0, d1, d2, c, n, oc):
    return _ref_conv_3d(a, b, c, s0, s1, s2, p0, p1, p2, d0, d1, d2)


def _conv_3d_direct_samples(rng, t):
    for ksh, bsh, ic, n, oc, st, pd, dl in _conv_3d_shapes():
        yield Sample((Arg(normal(rng, ksh), t), Arg(normal(rng, bsh)), *st, *pd, *dl, ic, n, oc),
                     f"{bsh} * {ksh} IC={ic} s={st} p={pd} d={dl}")
    yield Sample((Arg(normal(rng, (4, 2, 2, 2)), t), Arg(normal(rng, (2, 3, 4, 4)), F32, "permuted", (1, 0, 2, 3)),
                  1, 1, 1, 0, 0, 0, 1, 1, 1, 2, 1, 2), "b permuted (read through strides)")


# --- direct convolutions ------------------------------------------------------------------------

def _conv_2d_direct_samples(rng, t):
    yield from _conv_2d_samples(rng, t, f16_data=False)
    ksh, bsh = (2, 2, 2, 2), (1, 2, 5, 4)
    for layout in ("transposed", "strided"):
        yield Sample((Arg(normal(rng, ksh), t), Arg(normal(rng, bsh), F32, layout), 1, 1, 1, 0, 1, 1),
                     f"b {layout} (read through strides)")


def _conv_2d_dw_direct_samples(rng, t):
    yield from _conv_2d_dw_samples(rng, t)
    # channels-first (CWHN) data and kernel (laid out as test-backend-ops does): the
    # kernel's other path; the result comes back in the same layout
    for ksh, bsh, *prm in _conv_2d_dw_shapes()[:3]:
        yield Sample((Arg(normal(rng, ksh), t, "permuted", (3, 2, 0, 1)),
                      Arg(normal(rng, bsh), F32, "permuted", (2, 0, 1, 3)), *prm),
                     f"channels-first {bsh} * {ksh} {tuple(prm)}")
    c = 19                                  # more channels than a SIMD register: the vector path
    yield Sample((Arg(normal(rng, (c, 1, 2, 2)), t, "permuted", (3, 2, 0, 1)),
                  Arg(normal(rng, (1, c, 3, 4)), F32, "permuted", (2, 0, 1, 3)), 1, 1, 1, 0, 1, 1),
                 f"channels-first, {c} channels")


# --- transposed convolutions ---------------------------------------------------------------------

def _ref_conv_transpose_1d(a, b, s0, p0, d0):
    # a [K, OC, IC] (numpy (IC, OC, K)), b [L, IC] (numpy (IC, L)) -> [(L-1)*s0 + K, OC]
    ic, oc, k = a.shape
    b2 = b.reshape(ic, -1)
    n = b2.shape[1]
    out = np.zeros((oc, (n - 1) * s0 + k))
    for i in range(n):
        np.add.at(out, (slice(None), i * s0 + np.arange(k)), np.einsum("i,iok->ok", b2[:, i], a))
    return out


def _conv_transpose_1d_samples(rng, t):
    for ksh, bsh, s in (((2, 3, 3), (2, 5), 1), ((3, 2, 4), (3, 6), 2), ((1, 1, 2), (1, 4), 3),
                        ((2, 2, 3), (2, 4), 0), ((4, 1, 1), (4, 3), 2)):
        yield Sample((Arg(normal(rng, ksh), t), Arg(normal(rng, bsh)), s, 0, 1), f"{bsh} * {ksh} s={s}")
    yield Sample((Arg(normal(rng, (2, 3, 3)), t, "permuted", (0, 2, 1, 3)), Arg(normal(rng, (2, 5)), F32, "strided"),
                  2, 0, 1), "a permuted (OC and IC swapped), b strided")


def _ref_conv_transpose_2d_p0(a, b, s):
    # a [KW, KH, OC, IC] (numpy (IC, OC, KH, KW)), b [W, H, IC, N] (numpy (N, IC, H, W))
    a4, b4 = _as4(a), _as4(b)
    ic, oc, kh, kw = a4.shape
    n, _, h, w = b4.shape
    out = np.zeros((n, oc, (h - 1) * s + kh, (w - 1) * s + kw))
    rows = np.arange(h)[:, None] * s
    cols = np.arange(w)[None, :] * s
    for ky in range(kh):
        for kx in range(kw):
            contrib = np.einsum("nihw,io->nohw", b4, a4[:, :, ky, kx])
            np.add.at(out, (slice(None), slice(None), rows + ky, cols + kx), contrib)
    return out


def _conv_transpose_2d_samples(rng, t):
    for ksh, bsh, s in (((2, 3, 3, 3), (1, 2, 3, 4), 1), ((3, 2, 2, 3), (1, 3, 4, 3), 2),
                        ((1, 1, 2, 2), (1, 1, 3, 3), 3), ((2, 2, 3, 2), (1, 2, 2, 3), 0)):
        yield Sample((Arg(normal(rng, ksh), t), Arg(normal(rng, bsh)), s), f"{bsh} * {ksh} s={s}")
    yield Sample((Arg(normal(rng, (2, 3, 2, 2)), t, "permuted", (0, 1, 3, 2)),
                  Arg(normal(rng, (1, 2, 3, 3)), F32, "strided"), 2), "a permuted (OC and IC swapped), b strided")
    yield Sample((Arg(normal(rng, (2, 2, 2, 2)), t), Arg(normal(rng, (2, 2, 3, 3))), 2), "batch of 2",
                 defect="" if kernel_since("CONV_TRANSPOSE_2D", "0.25.3") else "conv-transpose-2d-batch")


# --- pooling --------------------------------------------------------------------------------------

FLT_MAX = float(np.finfo(np.float32).max)


def _pool_axis(x: np.ndarray, axis: int, k: int, s: int, p: int, n_out: int):
    """windows along axis: (values moved to the last two axes [n_out, k], inside mask)"""
    n = x.shape[axis]
    idx = np.arange(n_out)[:, None] * s - p + np.arange(k)[None, :]
    ok = (idx >= 0) & (idx < n)
    xs = np.take(np.moveaxis(x, axis, -1), np.clip(idx, 0, n - 1), axis=-1)
    return xs, ok


def _ref_pool_1d(a, op, k0, s0, p0):
    n_out = int((a.shape[-1] + 2 * p0 - k0) / s0) + 1
    xs, ok = _pool_axis(a, -1, k0, s0, p0, n_out)
    if op == OpPool.MAX:
        return np.where(ok, xs, -np.inf).max(axis=-1).clip(-FLT_MAX)
    cnt = ok.sum(axis=-1)
    return np.where(cnt > 0, np.where(ok, xs, 0).sum(axis=-1) / np.maximum(cnt, 1), 0.0)


def _pool_1d_samples(rng, t):
    for op in (OpPool.MAX, OpPool.AVG):
        for shape, k, s, p in (((3, 8), 2, 2, 0), ((2, 2, 9), 3, 2, 1), ((7,), 3, 1, 1), ((1, 2, 2, 5), 1, 1, 0),
                               ((4, 6), 4, 3, 2), ((2, 5), 2, 1, -1)):
            yield Sample((Arg(normal(rng, shape), t), op, k, s, p), f"{op.name} {shape} k={k} s={s} p={p}")


def _ref_pool_2d(a, op, k0, k1, s0, s1, p0, p1):
    a4 = _as4(a)
    h, w = a4.shape[2:]
    ow = int((w + 2 * p0 - k0) / s0) + 1
    oh = int((h + 2 * p1 - k1) / s1) + 1
    xs, okx = _pool_axis(a4, 3, k0, s0, int(p0), ow)           # (N, C, H, OW, KW)
    xs = np.moveaxis(xs, 2, -1)                                 # (N, C, OW, KW, H)
    ys, oky = _pool_axis(xs, 4, k1, s1, int(p1), oh)            # (N, C, OW, KW, OH, KH)
    ok = okx[:, :, None, None] & oky[None, None, :, :]          # (OW, KW, OH, KH)
    if op == OpPool.MAX:
        r = np.where(ok, ys, -np.inf).max(axis=(3, 5)).clip(-FLT_MAX)
    else:
        r = np.where(ok, ys, 0).sum(axis=(3, 5)) / (k0 * k1)
    return r.transpose(0, 1, 3, 2)                              # (N, C, OH, OW)


def _pool_2d_samples(rng, t):
    for op in (OpPool.MAX, OpPool.AVG):
        for shape, k, s, p in (((1, 2, 4, 4), (2, 2), (2, 2), (0, 0)), ((2, 1, 5, 6), (3, 2), (2, 1), (1, 0)),
                               ((3, 7, 5), (2, 3), (1, 2), (1, 1)), ((6, 5), (5, 6), (1, 1), (0, 0)),
                               ((2, 2, 3, 3), (1, 1), (1, 1), (0, 0)), ((1, 5, 5), (3, 3), (3, 3), (2, 2))):
            x = normal(rng, shape)         # continuous values: no ties in a max window (its gradient)
            yield Sample((Arg(x, t), op, *k, *s, *p), f"{op.name} {shape} k={k} s={s} p={p}")
        x = normal(rng, (2, 3, 4, 5))
        yield Sample((Arg(x, t, "strided"), op, 2, 2, 2, 1, 0, 1), f"{op.name} strided rows")


# --- upscale / interpolate ------------------------------------------------------------------------

# flags an older ggml lacks are 0: their samples are not drawn
ALIGN = int(ScaleFlag.__members__["ALIGN_CORNERS"]) if "ALIGN_CORNERS" in ScaleFlag.__members__ else 0
AA = int(ScaleFlag.__members__["ANTIALIAS"]) if "ANTIALIAS" in ScaleFlag.__members__ else 0


def _nearest_index(n: int, n_src: int, align: bool = False) -> np.ndarray:
    """source index of each result index: floor(i * n_src / n) (align corners: the end
    points meet, floor(i * (n_src-1) / (n-1)))"""
    i = np.arange(n)
    if align and n > 1 and n_src > 1:
        return (i * (n_src - 1)) // (n - 1)
    return (i * n_src) // n


def _scale(n: int, n_src: int, align: bool):
    """(scale n/n_src, pixel offset) of a 2-d axis"""
    if align:
        return ((n - 1) / (n_src - 1) if n > 1 and n_src > 1 else n / n_src), 0.0
    return n / n_src, 0.5


def _weights(mode: int, n: int, n_src: int) -> np.ndarray:
    """[n, n_src] interpolation matrix of one 2-d axis"""
    m = mode & 0xFF
    align = bool(mode & ALIGN)
    w = np.zeros((n, n_src))
    if m == ScaleMode.NEAREST:
        w[np.arange(n), _nearest_index(n, n_src, align)] = 1.0
        return w
    sf, po = _scale(n, n_src, align)
    for i in range(n):
        if m == ScaleMode.BILINEAR and mode & AA:
            # a triangle filter widened by the downscale factor over every source pixel
            # (centres at j + po), normalized (PyTorch's antialias)
            center = (i + po) / sf
            support = max(1.0, 1.0 / sf)
            w[i] = np.maximum(0.0, 1.0 - np.abs((np.arange(n_src) + po - center) / support))
            if w[i].sum() > 0:
                w[i] /= w[i].sum()
            continue
        x = (i + po) / sf - po
        x0 = math.floor(x)
        if m == ScaleMode.BILINEAR:
            # the two neighbours, edge-clamped, the fraction clamped to [0, 1]
            c0, c1 = min(max(x0, 0), n_src - 1), min(max(x0 + 1, 0), n_src - 1)
            dx = min(max(x - c0, 0.0), 1.0)
            w[i, c0] += 1 - dx
            w[i, c1] += dx
        else:
            # Keys' cubic convolution (a = -0.75), four neighbours edge-clamped
            a, t = -0.75, x - x0
            k1 = lambda z: ((a + 2) * z - (a + 3)) * z * z + 1          # noqa: E731  |z| <= 1
            k2 = lambda z: ((a * z - 5 * a) * z + 8 * a) * z - 4 * a    # noqa: E731  1 < |z| < 2
            for off, wt in ((-1, k2(t + 1)), (0, k1(t)), (1, k1(1 - t)), (2, k2(2 - t))):
                w[i, min(max(x0 + off, 0), n_src - 1)] += wt
    return w


def _ref_resize(a, ne, mode):
    a4 = _as4(a)
    n3, n2, n1, n0 = a4.shape
    i3 = _nearest_index(ne[3], n3)
    i2 = _nearest_index(ne[2], n2)
    wy = _weights(mode, ne[1], n1)
    wx = _weights(mode, ne[0], n0)
    x = a4[i3][:, i2]
    return np.einsum("yh,nchw,xw->ncyx", wy, x, wx)


def _nearest_rounds_wrong(n: int, n_src: int, align: bool = False) -> bool:
    """ggml maps result index i to source index (int)(i / sf) in float32 with sf = n/n_src
    in float32: True where that differs from floor(i * n_src / n) (the defect
    upscale-nearest-index-rounding)"""
    f = np.float32
    if align and n > 1 and n_src > 1:
        sf = f(f(n - 1) / f(n_src - 1))
    else:
        sf = f(f(n) / f(n_src))
    got = (np.arange(n, dtype=np.float32) / sf).astype(np.int64)
    return bool(np.any(got != _nearest_index(n, n_src, align)))


def _antialias_drops_tap(n: int, n_src: int) -> bool:
    """ggml's antialiased bilinear with aligned corners (pixel offset 0) takes the taps of
    result i up to (int)(x + support), exclusive, computed in float32: True where that
    leaves out a tap of positive weight (the defect upscale-antialias-align-corners)"""
    f = np.float32
    sf = f(f(n - 1) / f(n_src - 1)) if n > 1 and n_src > 1 else f(f(n) / f(n_src))
    support = max(f(1.0), f(f(1.0) / sf))
    for i in range(n):
        x = f(f(i) / sf)
        hi = int(f(x + support))
        if 0 <= hi < n_src and f(1.0) - abs(f(f(f(hi) - x) * f(f(1.0) / support))) > 0:
            return True
    return False


def _resize_defect(shape, ne, mode) -> str:
    s4 = (1,) * (4 - len(shape)) + tuple(shape)
    align = bool(mode & ALIGN)
    bad = _nearest_rounds_wrong(ne[3], s4[0]) or _nearest_rounds_wrong(ne[2], s4[1])
    if (mode & 0xFF) == ScaleMode.NEAREST:
        bad = bad or _nearest_rounds_wrong(ne[1], s4[2], align) or _nearest_rounds_wrong(ne[0], s4[3], align)
    if bad:
        return "upscale-nearest-index-rounding"
    if mode & AA and align and (_antialias_drops_tap(ne[0], s4[3]) or _antialias_drops_tap(ne[1], s4[2])):
        return "upscale-antialias-align-corners"
    return ""


def _ref_upscale(a, sf, mode):
    s = _as4(a).shape
    return _ref_resize(a, (s[3] * sf, s[2] * sf, s[1], s[0]), int(mode))


def _upscale_samples(rng, t):
    for mode in ScaleMode:
        for shape, sf in (((2, 3, 4), 2), ((1, 1, 3, 2), 3), ((5,), 2), ((2, 1, 2, 2), 4)):
            yield Sample((Arg(normal(rng, shape)), sf, mode), f"{mode.name} {shape} x{sf}")
    yield Sample((Arg(normal(rng, (2, 3, 4)), F32, "permuted", (1, 0, 2, 3)), 2, ScaleMode.BILINEAR),
                 "BILINEAR permuted")


def _resize_cases():
    """(source shape, result ne, mode): up, down, odd ratios, dims 2 and 3 resized, every
    mode and flag the builder takes"""
    shapes = (((2, 3, 4), (7, 5, 2, 1)), ((1, 2, 5, 6), (3, 4, 2, 1)), ((3, 4), (4, 3, 1, 1)),
              ((2, 2, 3), (3, 3, 4, 3)), ((4, 6), (2, 8, 1, 1)), ((1, 1), (3, 2, 1, 1)),
              ((3, 1, 14), (2, 3, 1, 1)))            # 14 -> 2: ggml's nearest picks pixel 6, not 7
    modes = [int(m) for m in ScaleMode] + ([int(m) | ALIGN for m in ScaleMode] if ALIGN else []) + \
        ([int(ScaleMode.BILINEAR) | AA] + ([int(ScaleMode.BILINEAR) | AA | ALIGN] if ALIGN else []) if AA else [])
    for shape, ne in shapes:
        for mode in modes:
            yield shape, ne, mode


def _mode_name(mode: int) -> str:
    s = ScaleMode(mode & 0xFF).name
    return s + ("|ALIGN_CORNERS" if mode & ALIGN else "") + ("|ANTIALIAS" if mode & AA else "")


def _interpolate_samples(rng, t):
    for shape, ne, mode in _resize_cases():
        yield Sample((Arg(normal(rng, shape)), *ne, mode), f"{_mode_name(mode)} {shape} -> {ne}",
                     defect=_resize_defect(shape, ne, mode))
    last = list(ScaleMode)[-1]                         # BICUBIC where the ggml has it
    yield Sample((Arg(normal(rng, (2, 3, 5)), F32, "transposed"), 7, 4, 2, 1, int(last)), f"{last.name} transposed")


def _upscale_ext_samples(rng, t):
    for shape, ne, mode in _resize_cases():
        if mode & ~0xFF:
            continue                                  # the enum argument takes no flags
        yield Sample((Arg(normal(rng, shape)), *ne, ScaleMode(mode)), f"{_mode_name(mode)} {shape} -> {ne}",
                     defect=_resize_defect(shape, ne, mode))


def _ref_interpolate(a, ne0, ne1, ne2, ne3, mode):
    return _ref_resize(a, (ne0, ne1, ne2, ne3), int(mode))


# --- timestep embedding ---------------------------------------------------------------------------

def _ref_timestep_embedding(ts, dim, max_period):
    half = dim // 2
    freqs = np.exp(-math.log(max_period) * np.arange(half) / half) if half else np.zeros(0)
    args = ts.reshape(-1)[:, None] * freqs[None, :]
    out = np.zeros((args.shape[0], dim))
    out[:, :half] = np.cos(args)
    out[:, half:2 * half] = np.sin(args)
    return out


def _timestep_samples(rng, t):
    for n, dim, period in ((4, 8, 10000), (3, 7, 10000), (5, 16, 100), (1, 1, 10000), (2, 2, 2)):
        yield Sample((Arg(uniform(rng, (n,), 0, 50)), dim, period), f"{n} steps dim={dim} max_period={period}")
    yield Sample((Arg(uniform(rng, (3,), 0, 1000)), 6, 10000), "timesteps up to 1000")


# --- the registry --------------------------------------------------------------------------------

OPINFOS = [
    OpInfo("im2col", ref=_ref_im2col, samples=_im2col_samples, types=(F32, F16), grad=True,
           unsampled=unsampled(QUANTIZED, SHAPE_WHY),
           note="t is the result type (F16 columns take F16 or F32 data); gradient with respect to b "
                "(IM2COL_BACK); the kernel's values do not enter"),
    OpInfo("im2col_3d", ref=_ref_im2col_3d, samples=_im2col_3d_samples, types=(F32, F16),
           unsampled=unsampled(QUANTIZED, SHAPE_WHY),
           note="t is the result type; no backward in ggml"),
    OpInfo("col2im_1d", ref=_ref_col2im_1d, samples=_col2im_samples, types=FLOATS,
           note="no backward in ggml"),
    OpInfo("conv_1d", ref=_ref_conv_1d, samples=_conv_1d_samples, types=KT_MM, tol=IM2COL_TOL,
           note=IM2COL_NOTE + "; N = 1 only (a batch comes back scrambled: tests/test_rules_conv.py)", **IM2COL_GRAD),
    OpInfo("conv_1d_ph", ref=_ref_conv_1d_ph, samples=_conv_1d_ph_samples, types=KT_MM, tol=IM2COL_TOL,
           note=IM2COL_NOTE, **IM2COL_GRAD),
    OpInfo("conv_1d_dw", ref=_ref_conv_1d_dw, samples=_conv_1d_dw_samples, types=KT_MM, tol=IM2COL_TOL,
           note=IM2COL_NOTE, **IM2COL_GRAD),
    OpInfo("conv_1d_dw_ph", ref=_ref_conv_1d_dw_ph, samples=_conv_1d_dw_ph_samples, types=KT_MM, tol=IM2COL_TOL,
           note=IM2COL_NOTE, **IM2COL_GRAD),
    OpInfo("conv_transpose_1d", ref=_ref_conv_transpose_1d, samples=_conv_transpose_1d_samples, types=KT,
           tol=TRANSPOSED_F16, note="no backward in ggml; an F16 kernel rounds the data to F16 too: NMSE measured "
                                    "up to 8.2e-6 (stride 0), hence 5e-5 for F16"),
    OpInfo("conv_2d", ref=_ref_conv_2d, samples=_conv_2d_samples, types=KT_MM, tol=IM2COL_TOL, note=IM2COL_NOTE,
           **IM2COL_GRAD),
    OpInfo("conv_3d", ref=_ref_conv_3d, samples=_conv_3d_samples, types=KT_MM, tol=IM2COL_TOL,
           note=IM2COL_NOTE + "; no backward in ggml (IM2COL_3D has none)"),
    OpInfo("conv_2d_sk_p0", ref=_ref_conv_2d_sk_p0, samples=_conv_2d_fixed_samples, types=KT_MM, tol=IM2COL_TOL,
           note=IM2COL_NOTE, **IM2COL_GRAD),
    OpInfo("conv_2d_s1_ph", ref=_ref_conv_2d_s1_ph, samples=_conv_2d_fixed_samples, types=KT_MM, tol=IM2COL_TOL,
           note=IM2COL_NOTE, **IM2COL_GRAD),
    OpInfo("conv_2d_dw", ref=_ref_conv_2d_dw, samples=_conv_2d_dw_samples,
           types=(F16, BF16) + ((F32,) if kernel_since("MUL_MAT", "0.25.3") else ()),
           tol={F32: IM2COL_TOL[F32], F16: IM2COL_TOL[F16], BF16: 1e-4},
           note="F16 and BF16 kernels only: for an F32 kernel ggml_conv_2d_dw multiplies it (mul_mat src0, F32) "
                "by F16 columns, which the CPU mul_mat does not take before ggml 0.25.3 (refused as "
                "GGMLTypeError; tests/test_rules_conv.py; 0.25.3's widens them: F32 listed there); hence no "
                "gradient check (it needs F32 parameters). BF16: the builder "
                "makes F32 columns for a BF16 kernel, which mul_mat converts to BF16 for the dot products "
                "(measured NMSE up to 7.4e-6 over 40 seeds; mul_mat's BF16 bound 1e-4)"),
    OpInfo("conv_2d_dw_direct", ref=_ref_conv_2d_dw, samples=_conv_2d_dw_direct_samples, types=KT,
           note="no backward in ggml; an F16 kernel is read as stored, the data and the sums stay F32"),
    OpInfo("conv_transpose_2d_p0", ref=_ref_conv_transpose_2d_p0, samples=_conv_transpose_2d_samples, types=KT,
           tol=TRANSPOSED_F16, note="no backward in ggml; an F16 kernel rounds the data to F16 too: NMSE measured "
                                    "up to 8.2e-6 (stride 0), hence 5e-5 for F16"),
    OpInfo("conv_2d_direct", ref=_ref_conv_2d, samples=_conv_2d_direct_samples, types=KT, tol=DIRECT_F16,
           note="no backward in ggml; an F16 kernel makes F16 patches (the data rounds to F16): NMSE measured up "
                "to 3.5e-7, hence 5e-6 for F16"),
    OpInfo("conv_3d_direct", ref=_ref_conv_3d_direct, samples=_conv_3d_direct_samples, types=KT, tol=DIRECT_F16,
           note="no backward in ggml; an F16 kernel makes F16 patches (the data rounds to F16): NMSE measured up "
                "to 1.4e-7, hence 5e-6 for F16"),
    OpInfo("pool_1d", ref=_ref_pool_1d, samples=_pool_1d_samples, types=KT,
           note="no backward in ggml; t is the source type (the result is F32); average over the taps inside "
                "the input (unlike pool_2d)"),
    OpInfo("pool_2d", ref=_ref_pool_2d, samples=_pool_2d_samples, types=KT, grad=True,
           note="t is the source type (the result is F32); average divides by k0*k1 (padding counts as zeros, "
                "unlike pool_1d); max over the taps inside"),
    OpInfo("upscale", ref=_ref_upscale, samples=_upscale_samples,
           note="F32 only (the builder asserts it); no backward in ggml"),
    OpInfo("upscale_ext", ref=_ref_interpolate, samples=_upscale_ext_samples, note="as interpolate without flags"),
    OpInfo("interpolate", ref=_ref_interpolate, samples=_interpolate_samples,
           note="F32 only; every mode with and without ALIGN_CORNERS, bilinear with ANTIALIAS"),
    OpInfo("timestep_embedding", ref=_ref_timestep_embedding, samples=_timestep_samples,
           note="no backward in ggml; float32 phases (timesteps up to 1000)"),
]
