"""OpInfos of the [backward] family: the gradient ops ggml's autodiff inserts into graphs
(repeat_back, silu_back, rms_norm_back, get_rows_back, soft_max_ext_back, rope_*_back,
im2col_back, pool_2d_back, flash_attn_back, cross_entropy_loss_back), each checked
against the float64 gradient (or adjoint) of its forward op, written from the forward
op's semantics.
"""

from __future__ import annotations

import math

import numpy as np

from pyggml import reference
from pyggml._core import OpPool, Type
from pyggml.opinfo import Arg, OpInfo, Sample
from pyggml.opinfo._common import (QUANTIZED, ROPE_IMROPE, ROPE_MROPE, ROPE_NEOX, ROPE_NORMAL, ROPE_VISION, SHAPE_WHY,
                                   broadcast_pairs, normal, rope_ndims0_defect, shapes_unary, uniform, unsampled)

POOL_MAX, POOL_AVG = int(OpPool.MAX), int(OpPool.AVG)
FLT_MAX = float(np.finfo(np.float32).max)


def _as4(x: np.ndarray) -> np.ndarray:
    return x.reshape((1,) * (4 - x.ndim) + x.shape)


# --- repeat_back ------------------------------------------------------------------------

def ref_repeat_back(a, b):
    """the sum of the tiles of a (ggml_repeat of a b-shaped tensor) into b's shape"""
    a4, b4 = _as4(a), _as4(np.empty(b.shape))
    split = []
    for n, m in zip(a4.shape, b4.shape):
        split += [n // m, m]
    return a4.reshape(split).sum(axis=(0, 2, 4, 6)).reshape(b.shape)


def _repeat_back_samples(rng, t):
    # a is the tiled (larger) tensor, b gives the shape only (it is no source of the node)
    for ash, bsh in broadcast_pairs():
        yield Sample((Arg(normal(rng, ash), t), Arg(np.zeros(bsh), t, param=False)), f"{ash} into {bsh}")
    yield Sample((Arg(normal(rng, (2, 3, 6)), t, "strided"), Arg(np.zeros((1, 3, 2)), t, param=False)), "a strided")
    yield Sample((Arg(normal(rng, (1, 4, 2, 6)), t, "permuted", (0, 2, 1, 3)), Arg(np.zeros((1, 2, 1, 3)), t,
                                                                                   param=False)), "a permuted")


# --- silu_back ----------------------------------------------------------------------------

def ref_silu_back(dy, x):
    """dy * d silu(x)/dx = dy * s (1 + x (1 - s)), s = sigmoid(x)"""
    s = 1 / (1 + np.exp(-x))
    return dy * s * (1 + x * (1 - s))


def _silu_back_samples(rng, t):
    for shape in shapes_unary():
        yield Sample((Arg(normal(rng, shape), t), Arg(normal(rng, shape, 2.0), t)), f"{shape}")
    yield Sample((Arg(normal(rng, (2, 3, 4)), t, "strided"), Arg(normal(rng, (2, 3, 4)), t, "strided")), "strided")


# --- rms_norm_back --------------------------------------------------------------------------

def ref_rms_norm_back(dy, x, eps):
    """the gradient of y = x / sqrt(mean(x^2) + eps) along ne0, given dy"""
    eps = float(np.float32(eps))
    n = x.shape[-1]
    r = np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return dy / r - x * np.sum(dy * x, axis=-1, keepdims=True) / (n * r ** 3)


def _rms_norm_back_samples(rng, t):
    for shape, eps in (((3, 5), 1e-6), ((2, 3, 4), 1e-5), ((1, 7), 0.1), ((4, 1), 0.5), ((2, 2, 1, 3), 1e-6)):
        yield Sample((Arg(normal(rng, shape), t), Arg(normal(rng, shape), t), eps), f"{shape} eps={eps}")
    yield Sample((Arg(normal(rng, (2, 3, 4)), t, "permuted", (0, 2, 1, 3)),
                  Arg(normal(rng, (2, 3, 4)), t, "strided"), 1e-6), "dy permuted, x strided")


# --- get_rows_back --------------------------------------------------------------------------

def ref_get_rows_back(a, ids, c):
    """zeros of c's shape, then row ids[i] += a's row i (the adjoint of get_rows)"""
    out = np.zeros(c.shape)
    np.add.at(out, ids.reshape(-1), a[:ids.size])
    return out


def _get_rows_back_samples(rng, t):
    ids = np.array([2, 0, 2, 1], np.int32)
    yield Sample((Arg(normal(rng, (4, 5)), t), Arg(ids, Type.I32), Arg(np.zeros((3, 5)), Type.F32, param=False)),
                 "4 rows into 3, a repeated index")
    yield Sample((Arg(normal(rng, (4, 5)), t, "strided"), Arg(ids, Type.I32), Arg(np.zeros((6, 5)), Type.F32,
                                                                                     param=False)), "a strided")
    yield Sample((Arg(normal(rng, (5, 3)), t), Arg(np.array([1, 1], np.int32), Type.I32),
                  Arg(np.zeros((2, 3)), Type.F32, param=False)), "more rows than indices")
    yield Sample((Arg(normal(rng, (1, 1)), t), Arg(np.array([0], np.int32), Type.I32),
                  Arg(np.zeros((1, 1)), Type.F32, param=False)), "1 x 1")


# --- soft_max_ext_back ------------------------------------------------------------------------

def ref_soft_max_back(dy, y, scale, max_bias):
    """the gradient of softmax(scale * x) along ne0 given its output y and dy:
    scale * y * (dy - sum(y * dy))"""
    return float(np.float32(scale)) * y * (dy - np.sum(y * dy, axis=-1, keepdims=True))


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _soft_max_back_samples(rng, t):
    for shape, scale in (((3, 5), 1.0), ((2, 3, 4), 0.7), ((1, 7), 2.0), ((4, 1), 1.0), ((2, 1, 2, 3), 0.5)):
        yield Sample((Arg(normal(rng, shape), t), Arg(_softmax(normal(rng, shape)), t), scale, 0.0),
                     f"{shape} scale={scale}")


# --- rope_ext_back, rope_multi_back ----------------------------------------------------------

def _yarn_corr_dims(n_dims, n_ctx_orig, base, beta_fast, beta_slow):
    def corr_dim(n_rot):
        return n_dims * math.log(n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))
    return max(0.0, math.floor(corr_dim(beta_fast))), min(n_dims - 1.0, math.ceil(corr_dim(beta_slow)))


def _rope_cos_sin(theta_extrap, i, fs, ext, attn, corr):
    """YaRN: the angle and magnitude of pair i (ggml's rope_yarn)"""
    theta = fs * theta_extrap
    mscale = attn
    if ext != 0.0:
        low, high = corr
        y = (i - low) / max(0.001, high - low)
        ramp_mix = (1 - min(1.0, max(0.0, y))) * ext
        theta = theta * (1 - ramp_mix) + theta_extrap * ramp_mix
        mscale *= 1 + 0.1 * math.log(1 / fs)
    return math.cos(theta) * mscale, math.sin(theta) * mscale


def _mrope_thetas(p4, n_pairs, n_dims, sections, mode, theta_scale):
    """the base angle of each pair for positions p4 = (t, h, w, e): the section of pair i
    picks the position (MROPE: consecutive sections; IMROPE: interleaved t, h, w; VISION:
    consecutive, each section restarting its frequency index)"""
    s0, s1, s2, s3 = sections
    sect = s0 + s1 + s2 + s3
    out = np.zeros(n_pairs)
    start = [0, 0, 0, 0]          # VISION: the pair index where each section's frequency restarts
    for i in range(n_pairs):
        sector = i % sect
        if mode == ROPE_VISION:
            for k, first in enumerate((0, s0, s0 + s1, s0 + s1 + s2)):
                if sector == first:
                    start[k] = i
                    break
        if mode == ROPE_IMROPE:
            if sector % 3 == 1 and sector < 3 * s1:
                k = 1
            elif sector % 3 == 2 and sector < 3 * s2:
                k = 2
            elif sector % 3 == 0 and sector < 3 * s0:
                k = 0
            else:
                k = 3
        else:
            k = 0 if sector < s0 else 1 if sector < s0 + s1 else 2 if sector < s0 + s1 + s2 else 3
        exp = i - start[k] if mode == ROPE_VISION else i
        out[i] = p4[k] * theta_scale ** exp
    return out


def _rope(x, pos, ff, n_dims, sections, mode, n_ctx_orig, base, fs, ext, attn, beta_fast, beta_slow, sign):
    """RoPE of x (numpy order: batch, position, head, dims) by each position's angles,
    sin multiplied by ``sign`` (-1: the inverse rotation, which is rope's gradient)"""
    base, fs, ext, attn = (float(np.float32(v)) for v in (base, fs, ext, attn))
    x4 = _as4(np.asarray(x, np.float64))
    ne0, ne2 = x4.shape[3], x4.shape[1]
    n_pairs = (ne0 + 1) // 2
    theta_scale = base ** (-2.0 / n_dims) if n_dims else 0.0      # powf(base, -inf)
    corr = _yarn_corr_dims(n_dims, n_ctx_orig, base, float(np.float32(beta_fast)),
                           float(np.float32(beta_slow))) if ext != 0.0 else None
    ffv = np.ones(n_pairs) if ff is None else np.asarray(ff, np.float64).reshape(-1)
    pos = np.asarray(pos).reshape(-1)
    out = x4.copy()
    for i2 in range(ne2):
        if mode & ROPE_MROPE:
            p4 = [int(pos[i2 + k * ne2]) for k in range(4)]
            base_theta = _mrope_thetas(p4, n_pairs, n_dims, sections, mode, theta_scale)
        else:
            base_theta = int(pos[i2]) * theta_scale ** np.arange(n_pairs)
        cs = [_rope_cos_sin(base_theta[i] / ffv[i], i, fs, ext, attn, corr) for i in range(n_pairs)]
        if mode == ROPE_NORMAL:
            pairs = [(2 * i, 2 * i + 1, i) for i in range(n_dims // 2)]
        elif mode == ROPE_VISION:
            pairs = [(i, i + n_dims, i) for i in range(ne0 // 2)]
        else:
            pairs = [(i, i + n_dims // 2, i) for i in range(n_dims // 2)]
        for j0, j1, i in pairs:
            c, s = cs[i]
            s *= sign
            x0, x1 = x4[:, i2, :, j0], x4[:, i2, :, j1]
            out[:, i2, :, j0] = x0 * c - x1 * s
            out[:, i2, :, j1] = x0 * s + x1 * c
    return out.reshape(np.shape(x))


def ref_rope_ext_back(dy, pos, ff, n_dims, mode, n_ctx_orig, base, fs, ext, attn, beta_fast, beta_slow):
    """the transpose of rope_ext's rotation applied to dy (its gradient)"""
    return _rope(dy, pos, ff, n_dims, None, mode, n_ctx_orig, base, fs, ext, attn, beta_fast, beta_slow, -1.0)


def ref_rope_multi_back(dy, pos, ff, n_dims, sections, mode, n_ctx_orig, base, fs, ext, attn, beta_fast,
                        beta_slow):
    return _rope(dy, pos, ff, n_dims, tuple(sections), mode, n_ctx_orig, base, fs, ext, attn, beta_fast,
                 beta_slow, -1.0)


def _positions(rng, n):
    return Arg(rng.integers(-3, 40, size=n).astype(np.int32), Type.I32)


def _rope_ext_back_samples(rng, t):
    plain = (0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0)        # n_ctx_orig .. beta_slow: no YaRN
    yield Sample((Arg(normal(rng, (3, 2, 8)), t), _positions(rng, 3), None, 8, ROPE_NORMAL) + plain, "NORMAL")
    yield Sample((Arg(normal(rng, (3, 2, 8)), t), _positions(rng, 3), None, 4, ROPE_NEOX) + plain,
                 "NEOX, n_dims 4 of 8")
    yield Sample((Arg(normal(rng, (2, 3, 2, 6)), t), _positions(rng, 3), None, 6, ROPE_NORMAL) + plain,
                 "batch of 2")
    yield Sample((Arg(normal(rng, (2, 3, 8)), t), _positions(rng, 2), Arg(uniform(rng, (4,), 0.5, 4.0), Type.F32),
                  8, ROPE_NEOX) + plain, "freq factors")
    yield Sample((Arg(normal(rng, (3, 2, 8)), t), _positions(rng, 3), None, 8, ROPE_NEOX,
                  32, 10000.0, 0.25, 1.0, 0.9, 32.0, 1.0), "YaRN: ext_factor 1, freq_scale 1/4")
    yield Sample((Arg(normal(rng, (3, 2, 8)), t), _positions(rng, 3), None, 6, ROPE_NORMAL,
                  64, 500.0, 0.5, 0.5, 1.2, 16.0, 2.0), "YaRN partial")
    yield Sample((Arg(normal(rng, (1, 3, 2, 8)), t, "permuted", (0, 2, 1, 3)), _positions(rng, 3), None, 8,
                  ROPE_NORMAL) + plain, "dy permuted (heads and positions)")
    yield Sample((Arg(normal(rng, (3, 2, 4)), t), _positions(rng, 3), None, 0, ROPE_NORMAL) + plain, "n_dims 0",
                 rope_ndims0_defect("ROPE_BACK"))
    yield Sample((Arg(normal(rng, (3, 2, 5)), t), _positions(rng, 3), None, 4, ROPE_NORMAL) + plain,
                 "odd ne0", defect="rope-odd-ne0")
    yield Sample((Arg(normal(rng, (2, 3, 8)), t), _positions(rng, 2), Arg(uniform(rng, (2,), 0.5, 4.0), Type.F32),
                  4, ROPE_NEOX) + plain, "n_dims/2 freq factors with n_dims < ne0", defect="rope-freq-factors-oob")


def _rope_multi_back_samples(rng, t):
    plain = (0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0)
    yield Sample((Arg(normal(rng, (3, 2, 16)), t), _positions(rng, 12), None, 16, [2, 3, 3, 0], ROPE_MROPE) + plain,
                 "MROPE")
    yield Sample((Arg(normal(rng, (2, 2, 12)), t), _positions(rng, 8), None, 8, [1, 1, 2, 0], ROPE_MROPE) + plain,
                 "MROPE, n_dims 8 of 12")
    yield Sample((Arg(normal(rng, (2, 1, 16)), t), _positions(rng, 8), None, 16, [2, 2, 2, 2], ROPE_IMROPE) + plain,
                 "IMROPE")
    yield Sample((Arg(normal(rng, (3, 2, 16)), t), _positions(rng, 12), None, 8, [2, 2, 0, 0], ROPE_VISION) + plain,
                 "VISION")
    yield Sample((Arg(normal(rng, (2, 2, 16)), t), _positions(rng, 8), Arg(uniform(rng, (8,), 0.5, 2.0), Type.F32),
                  16, [3, 3, 2, 0], ROPE_MROPE, 32, 10000.0, 0.5, 1.0, 1.0, 32.0, 1.0), "MROPE, freq factors, YaRN")


# --- im2col_back ---------------------------------------------------------------------------

def ref_im2col_back(g, kernel, ne, s0, s1, p0, p1, d0, d1, is_2D):
    """the adjoint of im2col: every column entry of g added back to the input pixel it was
    read from (pixels in the padding dropped)"""
    IW = ne[0]
    if is_2D:
        IH, IC, N = ne[1], ne[2], ne[3]
        KH, KW = kernel.shape[-2], kernel.shape[-1]
        g4 = g.reshape(g.shape[-4:])                       # (N, OH, OW, IC*KH*KW)
    else:
        IH, IC, N = 1, ne[1], ne[2]
        KH, KW = 1, kernel.shape[-1]
        g4 = g.reshape((g.shape[-3], 1) + g.shape[-2:])    # (N, 1, OW, IC*KW)
        s1, p1, d1 = 1, 0, 1
    OH, OW = g4.shape[1], g4.shape[2]
    out = np.zeros((N, IC, IH, IW))
    for n in range(N):
        for oh in range(OH):
            for ow in range(OW):
                for c in range(IC):
                    for kh in range(KH):
                        ih = oh * s1 - p1 + kh * d1
                        for kw in range(KW):
                            iw = ow * s0 - p0 + kw * d0
                            if 0 <= ih < IH and 0 <= iw < IW:
                                out[n, c, ih, iw] += g4[n, oh, ow, (c * KH + kh) * KW + kw]
    return out if is_2D else out[:, :, 0, :]


def _conv_out(n, k, s, p, d):
    return (n + 2 * p - d * (k - 1) - 1) // s + 1


def _im2col_back_samples(rng, t):
    # 2-D: (IW, IH, IC, N, KW, KH, s0, s1, p0, p1, d0, d1)
    for IW, IH, IC, N, KW, KH, s0, s1, p0, p1, d0, d1, kt in (
            (4, 4, 2, 1, 2, 2, 2, 2, 0, 0, 1, 1, Type.F32),
            (5, 4, 1, 2, 3, 2, 1, 1, 1, 0, 1, 1, Type.F16),
            (5, 5, 2, 1, 2, 2, 1, 2, 1, 1, 2, 1, Type.F32)):
        OW, OH = _conv_out(IW, KW, s0, p0, d0), _conv_out(IH, KH, s1, p1, d1)
        yield Sample((Arg(normal(rng, (N, OH, OW, IC * KH * KW)), t), Arg(normal(rng, (IC, KH, KW)), kt, param=False),
                      [IW, IH, IC, N], s0, s1, p0, p1, d0, d1, True),
                     f"2-D {IC}x{IH}x{IW} kernel {KH}x{KW} s=({s0},{s1}) p=({p0},{p1}) d=({d0},{d1}) kernel {kt.name}")
    IW, IC, N, KW, s0, p0, d0 = 7, 2, 2, 3, 2, 1, 1
    OW = _conv_out(IW, KW, s0, p0, d0)
    yield Sample((Arg(normal(rng, (N, OW, IC * KW)), t), Arg(normal(rng, (IC, KW)), Type.F32, param=False),
                  [IW, IC, N, 1], s0, 0, p0, 0, d0, 0, False), "1-D, s0=2, p0=1")


# --- pool_2d_back --------------------------------------------------------------------------

def ref_pool_2d_back(g, af, op, k0, k1, s0, s1, p0, p1):
    """the gradient of pool_2d through its windows: MAX gives each window's gradient to the
    first largest input of the window, AVG spreads it over the window's cells in bounds,
    divided by k0*k1 (pool_2d's AVG divides by the whole window); p0 and p1 are ints"""
    p0, p1 = int(p0), int(p1)
    IH, IW = af.shape[-2], af.shape[-1]
    planes = af.reshape(-1, IH, IW)
    OH, OW = g.shape[-2], g.shape[-1]
    gp = g.reshape(-1, OH, OW)
    out = np.zeros(planes.shape)
    for pl in range(planes.shape[0]):
        for oy in range(OH):
            for ox in range(OW):
                iy0, ix0 = oy * s1 - p1, ox * s0 - p0
                cells = [(iy0 + ky, ix0 + kx) for ky in range(k1) for kx in range(k0)
                         if 0 <= iy0 + ky < IH and 0 <= ix0 + kx < IW]
                if op == POOL_MAX:
                    best, where = -FLT_MAX, None
                    for y, x in cells:
                        if planes[pl, y, x] > best:
                            best, where = planes[pl, y, x], (y, x)
                    if where is not None:
                        out[pl][where] += gp[pl, oy, ox]
                else:
                    for y, x in cells:
                        out[pl, y, x] += gp[pl, oy, ox] / (k0 * k1)
    return out.reshape(af.shape)


def _pool_out(n, k, s, p):
    return (n + 2 * int(p) - k) // s + 1


def _pool_2d_back_samples(rng, t):
    for op, shape, k0, k1, s0, s1, p0, p1, aft in (
            (POOL_MAX, (2, 4, 4), 2, 2, 2, 2, 0.0, 0.0, Type.F32),
            (POOL_AVG, (2, 5, 5), 3, 3, 1, 1, 1.0, 1.0, Type.F32),
            (POOL_MAX, (1, 5, 6), 3, 3, 2, 2, 1.0, 1.0, Type.F32),
            (POOL_AVG, (2, 1, 4, 3), 2, 1, 1, 1, 0.0, 0.0, Type.F32),
            (POOL_MAX, (3, 4), 2, 3, 1, 1, 0.0, 1.0, Type.F32),
            (POOL_AVG, (2, 4, 4), 2, 2, 2, 2, 0.0, 0.0, Type.F16)):
        OH, OW = _pool_out(shape[-2], k1, s1, p1), _pool_out(shape[-1], k0, s0, p0)
        g = normal(rng, shape[:-2] + (OH, OW))
        kind = "MAX" if op == POOL_MAX else "AVG"
        name = f"{kind} {shape} k=({k0},{k1}) s=({s0},{s1}) p=({p0},{p1}) input {aft.name}"
        yield Sample((Arg(g, t), Arg(normal(rng, shape), aft, param=False), op, k0, k1, s0, s1, p0, p1), name)
    shape = (2, 4, 4)
    yield Sample((Arg(normal(rng, (2, 2, 2)), t), Arg(normal(rng, shape), Type.F16, param=False), POOL_MAX,
                  2, 2, 2, 2, 0.0, 0.0), "MAX with an F16 input", defect="pool-2d-back-f16-oob")


# --- flash_attn_back ---------------------------------------------------------------------

def ref_flash_attn_back(q, k, v, d, masked):
    """grad_q, grad_k and grad_v (in v's transposed layout) of sum(attention(q, k, v) * d),
    packed as the node's result: each F32 array padded to 16 bytes"""
    dq, dk, dv = reference.attention_backward(_as4(q), _as4(k), np.swapaxes(_as4(v), -1, -2), _as4(d),
                                              masked=bool(masked))
    parts = [dq.reshape(-1), dk.reshape(-1), np.swapaxes(dv, -1, -2).reshape(-1)]
    return np.concatenate([np.pad(p, (0, -len(p) % 4)) for p in parts])


def _flash_attn_back_samples(rng, t):
    for B, H, KVH, N, M, D, masked in ((1, 2, 1, 3, 5, 4, False), (1, 1, 1, 3, 3, 3, True),
                                       (2, 1, 1, 2, 4, 5, True), (1, 4, 2, 2, 3, 2, False)):
        q, d = normal(rng, (B, H, N, D)), normal(rng, (B, H, N, D))
        k, v = normal(rng, (B, KVH, M, D)), normal(rng, (B, KVH, D, M))
        yield Sample((Arg(q, t), Arg(k, t), Arg(v, t), Arg(d, t), masked),
                     f"B={B} H={H} KVH={KVH} N={N} M={M} D={D} masked={masked}")
    q, d = normal(rng, (2, 2, 2, 3)), normal(rng, (2, 2, 2, 3))
    k, v = normal(rng, (2, 1, 3, 3)), normal(rng, (2, 1, 3, 3))
    from pyggml.defects import present
    yield Sample((Arg(q, t), Arg(k, t), Arg(v, t), Arg(d, t), False), "batch with GQA",
                 defect="fab-batch-gqa-oob" if present("fab-batch-gqa-oob") else None)


# --- cross_entropy_loss_back ----------------------------------------------------------------

def ref_cross_entropy_loss_back(dy, a, b):
    """(softmax(a) - b) * dy / rows: the gradient of cross_entropy_loss for label rows that
    sum to 1 (what ggml computes whatever the labels)"""
    rows = a.size // a.shape[-1]
    return (_softmax(a) - b) * float(dy.reshape(-1)[0]) / rows


def _cross_entropy_loss_back_samples(rng, t):
    for shape in ((3, 5), (2, 3, 4), (1, 7), (4, 1)):
        yield Sample((Arg(np.array([1.3]), t), Arg(normal(rng, shape, 2.0), t), Arg(_softmax(normal(rng, shape)), t)),
                     f"{shape}")
    yield Sample((Arg(np.array([-0.5]), t), Arg(normal(rng, (3, 4)), t), Arg(uniform(rng, (3, 4), 0.0, 1.0), t)),
                 "labels not normalized")


OPINFOS = [
    OpInfo("repeat_back", ref=ref_repeat_back, samples=_repeat_back_samples, grad=True,
           unsampled=unsampled(QUANTIZED, SHAPE_WHY)),
    OpInfo("silu_back", ref=ref_silu_back, samples=_silu_back_samples, types=(Type.F32, Type.F16)),
    OpInfo("rms_norm_back", ref=ref_rms_norm_back, samples=_rms_norm_back_samples),
    OpInfo("get_rows_back", ref=ref_get_rows_back, samples=_get_rows_back_samples, types=(Type.F32, Type.F16),
           unsampled=unsampled(QUANTIZED, SHAPE_WHY)),
    OpInfo("soft_max_ext_back", ref=ref_soft_max_back, samples=_soft_max_back_samples),
    OpInfo("soft_max_ext_back_inplace", ref=ref_soft_max_back, samples=_soft_max_back_samples),
    OpInfo("rope_ext_back", ref=ref_rope_ext_back, samples=_rope_ext_back_samples, types=(Type.F32, Type.F16)),
    OpInfo("rope_multi_back", ref=ref_rope_multi_back, samples=_rope_multi_back_samples,
           types=(Type.F32, Type.F16)),
    OpInfo("im2col_back", ref=ref_im2col_back, samples=_im2col_back_samples),
    OpInfo("pool_2d_back", ref=ref_pool_2d_back, samples=_pool_2d_back_samples),
    OpInfo("cross_entropy_loss_back", ref=ref_cross_entropy_loss_back, samples=_cross_entropy_loss_back_samples),
]

# flash_attn_back's row is impl=pyggml: its builder is pyggml's own (csrc/fab_node.c, the seed)
FLASH_ATTN_BACK = OpInfo("flash_attn_back", ref=ref_flash_attn_back, samples=_flash_attn_back_samples,
                         note="the result packs grad_q, grad_k, grad_v (v's transposed layout), each padded to "
                              "16 bytes; batch + GQA is the known defect fab-batch-gqa-oob")
OPINFOS.append(FLASH_ATTN_BACK)
