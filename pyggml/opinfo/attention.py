"""OpInfos of the [attention] family: diag_mask, soft_max(_ext), rope (every mode),
flash_attn_ext, get_rel_pos, add_rel_pos.

The references are float64 NumPy written from ggml's documented semantics (ggml.h), in
numpy order (shape = ne reversed):

* masks broadcast by tiling: the mask's head i2 is ``i2 % mask.ne2``, its batch
  ``i3 % mask.ne3``; its rows may be padded (``mask.ne1 >= n_rows``), only the first
  rows are used;
* ALiBi (``max_bias > 0``): head h of ``H`` (a.ne2 for soft_max, q.ne2 for flash
  attention) scales the mask by ``m0**(h+1)`` for ``h < n``, ``m1**(2(h-n)+1)`` after,
  with ``n = 2**floor(log2 H)``, ``m0 = 2**(-max_bias/n)``, ``m1 = 2**(-max_bias/2/n)``
  (Press et al.'s slopes, extended to head counts that are not powers of 2);
* RoPE: positions from b (one per a.ne2 token; four per token, t/h/w/e, for the
  multi modes, laid out ``b[k*ne2 + i2]``); pair i of a row turns by
  ``theta_i = p * freq_base**(-2i/n_dims) / c[i]`` (YaRN-corrected), its elements
  ``(2i, 2i+1)`` (NORMAL), ``(i, i + n_dims/2)`` (NEOX, MROPE, IMROPE) or
  ``(i, i + n_dims)`` (VISION, where n_dims = ne0/2 and every element turns); elements
  past n_dims are copied;
* flash attention: query head h uses k head ``h // (H / H_k)`` and v head
  ``h // (H / H_v)`` (grouped, as ggml_mul_mat broadcasts; not the tiling of
  ``ggml_repeat``); fully masked rows give 0; the result is permuted:
  [DV, H, N, ne3] in ggml order.
"""

from __future__ import annotations

import math

import numpy as np

from pyggml._core import Type
from pyggml.opinfo import Arg, OpInfo, Sample
from pyggml.opinfo._common import (ROPE_IMROPE, ROPE_MROPE, ROPE_NEOX, ROPE_NORMAL, ROPE_VISION, SLOW_TO_QUANTIZE, SLOW_WHY,
                                   normal, quantized_but, rope_ndims0_defect, unsampled)

F32 = np.float32
NEG_INF = -np.inf



def _f(x) -> float:
    """A float parameter as ggml stores it (float32 op_params)."""
    return float(F32(x))


def _as4(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    return x.reshape((1,) * (4 - x.ndim) + x.shape)


def _tile_idx(n: int, m: int) -> np.ndarray:
    """Indices of a dim of size m broadcast to n by tiling (ggml's i % m)."""
    return np.arange(n) % m


def alibi_slopes(n_head: int, max_bias: float) -> np.ndarray:
    """ALiBi slope of each head (1.0 each when max_bias <= 0)."""
    if max_bias <= 0 or n_head == 0:
        return np.ones(n_head)
    n = 2 ** int(math.floor(math.log2(n_head)))
    m0 = 2.0 ** (-max_bias / n)
    m1 = 2.0 ** (-max_bias / 2.0 / n)
    h = np.arange(n_head)
    return np.where(h < n, m0 ** (h + 1.0), m1 ** (2.0 * (h - n) + 1.0))


# --- diag_mask ----------------------------------------------------------------------------------

def _ref_diag_mask(value):
    def ref(a, n_past):
        a = np.asarray(a, np.float64)
        out = _as4(a).copy()
        i1 = np.arange(out.shape[2])[:, None]
        i0 = np.arange(out.shape[3])[None, :]
        out[:, :, i0 > n_past + i1] = value                # hide i0 > n_past + i1
        return out.reshape(a.shape)
    return ref


def _diag_mask_samples(rng, t):
    for shape, n_past in (((4, 6), 0), ((4, 6), 2), ((3, 3), 0), ((2, 3, 5), 1), ((2, 2, 3, 4), 0),
                          ((5, 4), 0), ((4, 6), 9), ((1, 1), 0), ((7,), 3)):
        yield Sample((Arg(normal(rng, shape), t), n_past), f"{shape} n_past={n_past}")


# --- soft_max -----------------------------------------------------------------------------------

def _softmax_rows(x: np.ndarray) -> np.ndarray:
    mx = np.max(x, axis=-1, keepdims=True)
    e = np.exp(x - mx)
    return e / np.sum(e, axis=-1, keepdims=True)


def _ref_soft_max(a):
    return _softmax_rows(np.asarray(a, np.float64))


def _ref_soft_max_ext(a, mask, scale, max_bias, sinks=None):
    """``sinks`` (soft_max_add_sinks): one more logit per head, raw (not scaled, no slope),
    that takes its share of each row's sum and has no output."""
    a = np.asarray(a, np.float64)
    x = _as4(a) * _f(scale)
    n3, n2, n1, _ = x.shape
    if mask is not None:
        m = _as4(mask)[:, :, :n1, :]                      # padded rows: the first n1
        m = m[_tile_idx(n3, m.shape[0])][:, _tile_idx(n2, m.shape[1])]
        x = x + alibi_slopes(n2, _f(max_bias))[None, :, None, None] * m
    if sinks is None:
        return _softmax_rows(x).reshape(a.shape)
    sk = np.asarray(sinks, np.float64).reshape(-1)[:n2][None, :, None, None]
    mx = np.maximum(np.max(x, axis=-1, keepdims=True), sk)
    e = np.exp(x - mx)
    return (e / (np.sum(e, axis=-1, keepdims=True) + np.exp(sk - mx))).reshape(a.shape)


def _soft_max_samples(rng, t):
    for shape in ((7,), (3, 5), (2, 1, 4), (2, 3, 1, 5), (1, 1), (4, 33)):
        yield Sample((Arg(normal(rng, shape), t),), f"{shape}")
    yield Sample((Arg(normal(rng, (3, 6), scale=40.0), t),), "large logits (3, 6)")


def _causal(n1: int, n0: int, past: int = 0) -> np.ndarray:
    i1 = np.arange(n1)[:, None]
    i0 = np.arange(n0)[None, :]
    return np.where(i0 > past + i1, NEG_INF, 0.0)


def _soft_max_ext_samples(rng, t):
    # (a shape, mask shape or None, scale, max_bias, mask type, causal); a = (ne3, ne2, ne1, ne0)
    cases = [
        ((2, 3, 5), None, 0.5, 0.0, None, False),
        ((2, 3, 5), (3, 5), 1.0, 0.0, Type.F32, False),
        ((1, 4, 3, 6), (1, 1, 3, 6), 0.25, 0.0, Type.F16, True),
        ((2, 4, 3, 6), (1, 2, 5, 6), 0.7, 0.0, Type.F32, True),         # mask rows padded, heads tiled
        ((2, 2, 3, 5), (2, 1, 3, 5), 1.5, 0.0, Type.F16, False),         # mask per batch, broadcast heads
        ((1, 1, 1, 9), (1, 1, 1, 9), -0.5, 0.0, Type.F32, False),        # negative scale
        ((1, 4, 3, 6), (1, 1, 4, 6), 0.5, 8.0, Type.F32, True),          # ALiBi, 4 heads
        ((1, 3, 2, 5), (1, 1, 2, 5), 1.0, 8.0, Type.F16, False),         # ALiBi, 3 heads (m1 branch)
        ((2, 6, 2, 4), (1, 3, 2, 4), 0.3, 4.0, Type.F32, True),          # ALiBi, 6 heads, mask heads tiled
        ((3, 5), (4, 5), 1.0, 2.0, Type.F16, False),                      # ALiBi, one head: slope 2**-max_bias
    ]
    for ashape, mshape, scale, max_bias, mtype, causal in cases:
        a = normal(rng, ashape)
        mask = None
        if mshape is not None:
            m = normal(rng, mshape)
            if causal:
                m = m + _causal(mshape[-2], mshape[-1])
            mask = Arg(m, mtype, param=False)
        yield Sample((Arg(a, t), mask, scale, max_bias),
                     f"{ashape} mask {mshape} {mtype.name if mtype else ''} scale={scale} max_bias={max_bias}")


# --- rope ---------------------------------------------------------------------------------------

def _yarn_corr_dims(n_dims, n_ctx_orig, base, beta_fast, beta_slow):
    def corr_dim(n_rot):
        return n_dims * math.log(n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))
    lo = max(0.0, math.floor(corr_dim(beta_fast)))
    hi = min(n_dims - 1.0, math.ceil(corr_dim(beta_slow)))
    return lo, hi


def rope_reference(a, pos, c, n_dims, sections, mode, n_ctx_orig=0, freq_base=10000.0, freq_scale=1.0,
                   ext_factor=0.0, attn_factor=1.0, beta_fast=0.0, beta_slow=0.0, inverse=False):
    """RoPE of a (numpy order, ne0 last) in float64, from ggml.h's description of the op."""
    a = np.asarray(a, np.float64)
    x = _as4(a)
    ne2 = x.shape[1]
    base, fs, ext, attn = _f(freq_base), _f(freq_scale), _f(ext_factor), _f(attn_factor)
    vision = mode == ROPE_VISION
    n_pairs = n_dims if vision else n_dims // 2
    i = np.arange(n_pairs)
    pos = np.asarray(pos, np.float64).reshape(-1)
    if mode & ROPE_MROPE:
        s0, s1, s2, s3 = sections
        sector = i % (s0 + s1 + s2 + s3)
        if mode == ROPE_IMROPE:                            # interleaved t, h, w, t, h, w, ...
            which = np.where((sector % 3 == 1) & (sector < 3 * s1), 1,
                             np.where((sector % 3 == 2) & (sector < 3 * s2), 2,
                                      np.where((sector % 3 == 0) & (sector < 3 * s0), 0, 3)))
        else:                                              # t section, then h, w, e
            which = np.where(sector < s0, 0, np.where(sector < s0 + s1, 1, np.where(sector < s0 + s1 + s2, 2, 3)))
        if vision:                                         # each section counts its own dims
            start = np.array([0, s0, s0 + s1, s0 + s1 + s2])
            expo = sector - start[which]
        else:
            expo = i
        p = pos.reshape(4, ne2)[which, :].T                # (ne2, n_pairs)
    else:
        expo = i
        p = pos[:, None]
    theta_ext = p * (base ** (-2.0 / n_dims)) ** expo if n_dims else np.zeros((ne2, 0))
    if c is not None:
        theta_ext = theta_ext / np.asarray(c, np.float64).reshape(-1)[:n_pairs]
    theta = fs * theta_ext
    mscale = attn
    if ext != 0.0:
        lo, hi = _yarn_corr_dims(n_dims, n_ctx_orig, base, _f(beta_fast), _f(beta_slow))
        ramp = 1.0 - np.clip((i - lo) / max(0.001, hi - lo), 0.0, 1.0)
        mix = ramp * ext
        theta = theta * (1 - mix) + theta_ext * mix
        mscale = attn * (1.0 + 0.1 * math.log(1.0 / fs))
    cos = (np.cos(theta) * mscale)[None, :, None, :]
    sin = (np.sin(theta) * mscale)[None, :, None, :] * (-1.0 if inverse else 1.0)
    if mode == ROPE_NORMAL:
        i0, i1 = 2 * i, 2 * i + 1
    elif vision:
        i0, i1 = i, i + n_dims
    else:
        i0, i1 = i, i + n_dims // 2
    out = x.copy()
    x0, x1 = x[..., i0], x[..., i1]
    out[..., i0] = x0 * cos - x1 * sin
    out[..., i1] = x0 * sin + x1 * cos
    return out.reshape(a.shape)


def _ref_rope(a, b, n_dims, mode):
    return rope_reference(a, b, None, n_dims, None, mode)


def _ref_rope_ext(a, b, c, n_dims, mode, *yarn):
    return rope_reference(a, b, c, n_dims, None, mode, *yarn)


def _ref_rope_multi(a, b, c, n_dims, sections, mode, *yarn):
    return rope_reference(a, b, c, n_dims, sections, mode, *yarn)


def _ref_rope_custom(a, b, n_dims, mode, *yarn):
    return rope_reference(a, b, None, n_dims, None, mode, *yarn)


def _positions(rng, n):
    return rng.integers(-8, 40, size=n).astype(np.int32)


def _pos(rng, n):
    return Arg(_positions(rng, n), Type.I32, param=False)


def _rope_shapes():
    """(a shape, n_dims, mode, layout); a = (ne3, ne2 tokens, ne1 heads, ne0)."""
    return [((3, 2, 8), 8, ROPE_NORMAL, "contiguous"),
            ((3, 2, 8), 4, ROPE_NORMAL, "contiguous"),
            ((4, 3, 6), 6, ROPE_NEOX, "contiguous"),
            ((2, 3, 2, 10), 6, ROPE_NEOX, "contiguous"),
            ((2, 3, 2, 10), 10, ROPE_NORMAL, "contiguous"),
            ((1, 1, 4), 4, ROPE_NEOX, "contiguous"),
            ((3, 2, 8), 0, ROPE_NORMAL, "contiguous"),
            ((3, 2, 8), 8, ROPE_NEOX, "strided"),
            ((1, 3, 4, 8), 4, ROPE_NORMAL, "permuted")]


def _rope_a(rng, t, shape, layout):
    perm = (0, 2, 1, 3) if layout == "permuted" else (0, 1, 2, 3)
    return Arg(normal(rng, shape), t, layout, perm)


def _rope_samples(rng, t):
    for shape, n_dims, mode, layout in _rope_shapes():
        ne2 = _as4(np.zeros(shape)).shape[1]
        yield Sample((_rope_a(rng, t, shape, layout), _pos(rng, ne2), n_dims, mode),
                     f"{shape} n_dims={n_dims} mode={mode} {layout}", rope_ndims0_defect() if n_dims == 0 else "")
    yield Sample((Arg(normal(rng, (3, 4, 5)), t), _pos(rng, 3), 2, ROPE_NORMAL), "odd ne0 = 5",
                 defect="rope-odd-ne0")


# YaRN settings: (n_ctx_orig, freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow)
_PLAIN = (0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0)
_YARN = (64, 10000.0, 0.25, 1.0, 1.0, 32.0, 1.0)
_SCALED = (128, 500.0, 0.5, 0.0, 0.8, 32.0, 1.0)
_YARN_PART = (32, 1000.0, 0.125, 0.5, 1.2, 16.0, 2.0)


def _rope_ext_samples(rng, t):
    for (shape, n_dims, mode, layout), yarn in zip(_rope_shapes()[:8], (_PLAIN, _YARN, _SCALED, _YARN_PART) * 2):
        ne2 = _as4(np.zeros(shape)).shape[1]
        yield Sample((_rope_a(rng, t, shape, layout), _pos(rng, ne2), None, n_dims, mode) + yarn,
                     f"{shape} n_dims={n_dims} mode={mode} {layout} yarn={yarn}",
                     rope_ndims0_defect() if n_dims == 0 else "")
    for mode in (ROPE_NORMAL, ROPE_NEOX):
        for n_dims, yarn in ((8, _YARN), (4, _SCALED)):
            c = Arg(rng.uniform(0.5, 4.0, 4), Type.F32, param=False)     # ne0/2 factors
            yield Sample((Arg(normal(rng, (3, 2, 8)), t), _pos(rng, 3), c, n_dims, mode) + yarn,
                         f"freq factors n_dims={n_dims} mode={mode}")
    c = Arg(rng.uniform(0.5, 4.0, 2), Type.F32, param=False)             # n_dims/2 < ne0/2
    yield Sample((Arg(normal(rng, (3, 2, 8)), t), _pos(rng, 3), c, 4, ROPE_NEOX) + _PLAIN,
                 "freq factors for n_dims/2 pairs only", defect="rope-freq-factors-oob")


def _rope_custom_samples(rng, t):
    for s in _rope_ext_samples(rng, t):
        if s.args[2] is None:
            yield Sample(s.args[:2] + s.args[3:], s.name, s.defect)


def _rope_multi_samples(rng, t):
    # (a shape, n_dims, sections, mode, c, yarn)
    cases = [((3, 2, 16), 16, (2, 3, 3, 0), ROPE_MROPE, False, _PLAIN),
             ((3, 2, 16), 12, (2, 2, 2, 0), ROPE_MROPE, False, _YARN),
             ((2, 2, 12), 8, (1, 1, 1, 1), ROPE_MROPE, True, _SCALED),     # e section, cycling sectors
             ((3, 2, 16), 16, (3, 3, 2, 0), ROPE_IMROPE, False, _PLAIN),
             ((3, 2, 16), 12, (2, 2, 2, 0), ROPE_IMROPE, True, _YARN_PART),
             ((2, 3, 12), 12, (1, 2, 2, 1), ROPE_IMROPE, False, _PLAIN),
             ((3, 2, 16), 8, (2, 2, 0, 0), ROPE_VISION, False, _PLAIN),
             ((2, 2, 16), 8, (3, 1, 0, 0), ROPE_VISION, True, _SCALED),
             ((2, 2, 8), 4, (0, 2, 2, 0), ROPE_VISION, False, _PLAIN),     # empty t section first
             ((2, 2, 8), 8, (0, 0, 0, 0), ROPE_NEOX, False, _PLAIN),        # not a multi mode: sections unused
             ((3, 2, 8), 6, (1, 1, 1, 0), ROPE_NORMAL, True, _YARN)]
    for shape, n_dims, sections, mode, with_c, yarn in cases:
        ne2 = shape[-3]
        npos = 4 * ne2 if mode & ROPE_MROPE else ne2
        c = Arg(rng.uniform(0.5, 4.0, shape[-1] // 2), Type.F32, param=False) if with_c else None
        yield Sample((Arg(normal(rng, shape), t), _pos(rng, npos), c, n_dims, sections, mode) + yarn,
                     f"{shape} n_dims={n_dims} sections={sections} mode={mode} c={with_c}")
    yield Sample((Arg(normal(rng, (2, 2, 8)), t), _pos(rng, 8), None, 4, (2, 0, 2, 0), ROPE_VISION) + _PLAIN,
                 "VISION, the w section after an empty h section", defect="rope-vision-section-reset")
    c = Arg(rng.uniform(0.5, 4.0, 4), Type.F32, param=False)               # VISION: n_dims/2 factors
    yield Sample((Arg(normal(rng, (2, 2, 16)), t), _pos(rng, 8), c, 8, (2, 2, 0, 0), ROPE_VISION) + _PLAIN,
                 "VISION with n_dims/2 freq factors", defect="rope-freq-factors-oob")


# --- flash_attn_ext -----------------------------------------------------------------------------

def flash_attn_reference(q, k, v, mask, scale, max_bias, logit_softcap, sinks=None):
    """softmax(softcap(scale*q.k) + slope*mask) @ v per query head, float64, in
    ggml's permuted result layout: numpy (ne3, N, H, DV). ``sinks``
    (flash_attn_ext_add_sinks): one more logit per query head, raw, with no value."""
    q4, k4, v4 = _as4(q), _as4(k), _as4(v)
    B, H, N, _ = q4.shape
    M = k4.shape[2]
    kh = k4[:, np.arange(H) // (H // k4.shape[1])]
    vh = v4[:, np.arange(H) // (H // v4.shape[1]), :M]
    s = (q4 @ kh.swapaxes(-1, -2)) * _f(scale)            # (B, H, N, M)
    cap = _f(logit_softcap)
    if cap != 0.0:
        s = cap * np.tanh(s / cap)
    if mask is not None:
        m = _as4(mask)[:, :, :N, :M]
        m = m[_tile_idx(B, m.shape[0])][:, _tile_idx(H, m.shape[1])]
        s = s + alibi_slopes(H, _f(max_bias))[None, :, None, None] * m
    mx = np.max(s, axis=-1, keepdims=True) if M else np.zeros(s.shape[:-1] + (1,))
    sk = None
    if sinks is not None:
        sk = np.asarray(sinks, np.float64).reshape(-1)[:H][None, :, None, None]
        mx = np.maximum(mx, sk)
    dead = ~np.isfinite(mx)
    p = np.exp(s - np.where(dead, 0.0, mx))
    den = np.sum(p, axis=-1, keepdims=True)
    if sk is not None:
        den = den + np.exp(sk - mx)
    o = (p @ vh) / np.where(den == 0, 1.0, den)
    o = np.where(dead | (den == 0), 0.0, o)
    return o.transpose(0, 2, 1, 3)


def _fa_case(rng, t, qs, ks, vs, ms=None, scale=None, max_bias=0.0, softcap=0.0, causal=False,
             q_layout="contiguous", kv_layout="contiguous", vt=None, name="", dead_row=False):
    q = normal(rng, qs)
    k = normal(rng, ks)
    v = normal(rng, vs)
    mask = None
    if ms is not None:
        m = normal(rng, ms)
        if causal:
            m = m + _causal(ms[-2], ms[-1], past=ks[-2] - qs[-2])
        if dead_row:
            m[..., 0, :] = NEG_INF
        mask = Arg(m, Type.F16, param=False)
    qperm = (0, 2, 1, 3) if q_layout == "permuted" else (0, 1, 2, 3)
    scale = 1.0 / math.sqrt(qs[-1]) if scale is None else scale
    return Sample((Arg(q, Type.F32, q_layout, qperm, param=False),
                   Arg(k, t, kv_layout, param=False), Arg(v, vt or t, kv_layout, param=False),
                   mask, scale, max_bias, softcap), name)


def _fa_samples(rng, t):
    d = t.blck_size if t.is_quantized else 8  # head sizes: whole blocks of quantized K/V
    e = t.blck_size if t.is_quantized else 6
    yield _fa_case(rng, t, (1, 2, 3, d), (1, 2, 5, d), (1, 2, 5, d), name="2 heads, no mask")
    yield _fa_case(rng, t, (1, 4, 3, d), (1, 2, 5, d), (1, 2, 5, e), name="GQA 4 q heads on 2, DV != DK")
    yield _fa_case(rng, t, (1, 4, 3, d), (1, 1, 5, d), (1, 2, 5, d), name="k 1 head, v 2 heads")
    yield _fa_case(rng, t, (1, 2, 3, d), (1, 2, 5, d), (1, 2, 5, d), ms=(1, 1, 4, 5), causal=True,
                   name="causal F16 mask, rows padded, broadcast over heads")
    yield _fa_case(rng, t, (2, 2, 3, d), (2, 1, 6, d), (2, 1, 6, d), ms=(1, 2, 3, 8), scale=0.3,
                   name="batch 2, mask per head, broadcast over batch, mask wider than n_kv")
    yield _fa_case(rng, t, (1, 3, 2, d), (1, 3, 4, d), (1, 3, 4, d), ms=(1, 1, 2, 4), max_bias=8.0,
                   name="ALiBi, 3 heads")
    yield _fa_case(rng, t, (1, 4, 2, d), (1, 2, 4, d), (1, 2, 4, d), ms=(1, 4, 2, 4), max_bias=4.0, causal=True,
                   name="ALiBi, 4 heads, causal")
    yield _fa_case(rng, t, (1, 2, 3, d), (1, 2, 5, d), (1, 2, 5, d), scale=1.5 / math.sqrt(d), softcap=2.0,
                   name="logit_softcap")
    yield _fa_case(rng, t, (1, 2, 3, d), (1, 2, 5, d), (1, 2, 5, d), ms=(1, 1, 3, 5), dead_row=True,
                   name="a fully masked row gives 0")
    yield _fa_case(rng, t, (1, 2, 3, d), (1, 2, 5, d), (1, 2, 5, d), q_layout="permuted",
                   name="q permuted (0, 2, 1, 3)")
    if not t.is_quantized:
        yield _fa_case(rng, t, (1, 2, 3, d), (1, 2, 5, d), (1, 2, 5, d), kv_layout="strided",
                       name="k, v strided rows")
    yield _fa_case(rng, t, (1, 1, 1, d), (1, 1, 1, d), (1, 1, 1, d), name="one query, one key")
    yield _fa_case(rng, t, (3, d), (4, d), (4, e), ms=(3, 4), causal=True, name="2-d q, k, v: one head")
    if t in (Type.F32, Type.F16):
        # the tiled path (q rows >= GGML_FA_TILE_Q = 64, F32/F16 K = V type, DV a multiple of the SIMD width)
        yield _fa_case(rng, t, (1, 1, 64, 16), (1, 1, 8, 16), (1, 1, 8, 16), ms=(1, 1, 64, 8), causal=True,
                       name="tiled path: 64 queries")
    if t == Type.F32:
        # the split-KV decode path (one query, >= 512 keys); F16 K/V is left out: the one-chunk
        # kernel accumulates an F16 V in F16, whose error grows with n_kv (NMSE ~1e-5 at 512 keys;
        # tests/test_rules_attention.py bounds it separately); the F16 samples here have <= 8 keys
        yield _fa_case(rng, t, (1, 2, 1, 4), (1, 1, 512, 4), (1, 1, 512, 4), ms=(1, 1, 1, 512),
                       name="split-KV path: 512 keys")
    if t == Type.F16:
        yield _fa_case(rng, t, (1, 2, 3, 8), (1, 2, 5, 8), (1, 2, 5, 8), vt=Type.F32, name="K F16, V F32")


# --- get_rel_pos / add_rel_pos ------------------------------------------------------------------

def _ref_get_rel_pos(a, qh, kh):
    a = np.asarray(a)
    q = np.arange(qh)[:, None]
    k = np.arange(kh)[None, :]
    return a[q - k + kh - 1]                               # (qh, kh, C)


def _get_rel_pos_samples(rng, t):
    for qh, C in ((3, 4), (1, 5), (4, 1), (5, 6)):
        yield Sample((Arg(normal(rng, (2 * qh - 1, C)), t, param=False), qh, qh), f"qh=kh={qh} C={C}")
    yield Sample((Arg(normal(rng, (5, 4)), Type.BF16, param=False), 3, 3), "BF16 table",
                 defect="get-rel-pos-bf16")


def _ref_add_rel_pos(a, pw, ph):
    a = np.asarray(a, np.float64)
    BH, qh, qw, W = pw.shape
    x = a.reshape(BH, qh, qw, W, W)                        # keys (k_h, k_w), k_h slower
    return (x + ph[..., :, None] + pw[..., None, :]).reshape(a.shape)


def _add_rel_pos_samples(rng, t):
    for BH, qh, qw, W in ((2, 3, 2, 3), (1, 2, 2, 2), (3, 1, 1, 1), (1, 2, 4, 4)):
        a = normal(rng, (BH, qh * qw, W * W))
        yield Sample((Arg(a, t), Arg(normal(rng, (BH, qh, qw, W)), param=False),
                      Arg(normal(rng, (BH, qh, qw, W)), param=False)), f"BH={BH} q={qh}x{qw} W={W}")
    yield Sample((Arg(normal(rng, (2, 2, 4, 4)), t), Arg(normal(rng, (2, 2, 2, 2)), param=False),
                  Arg(normal(rng, (2, 2, 2, 2)), param=False)), "a.ne3 = 2", defect="add-rel-pos-ne3")


# --- the registry -------------------------------------------------------------------------------

_DIAG_INF_NOTE = ("no gradient check: the masked entries are -inf, so sum(result * c) is infinite and central "
                  "differences are undefined; its backward is diag_mask_zero, checked there")
# quantized K and V: q rounded to K's vec_dot type, Q8_0 (32-blocks) or Q8_K (256-blocks, coarser)
_FA_QUANT = quantized_but(*SLOW_TO_QUANTIZE)
_FA_TOL = {Type.F32: 1e-7, Type.F16: 2e-6, Type.BF16: 5e-5,
           **{q: 1e-3 if q.blck_size >= 256 else 3e-4 for q in _FA_QUANT}}
_FA_NOTE = ("the CPU kernel rounds q to K's vec_dot type (F16, BF16, Q8_0) for the dot products, and with F16 V "
            "accumulates softmax*V in F16 on its one-chunk path (< 64 query rows); worst NMSE over 300 seeds: "
            "F32 1.8e-12, F16 4.8e-7, BF16 1.2e-5, Q8_0 8.0e-5; over 60 seeds, quantized K and V: 1.2e-4 "
            "(Q1_0) for the block types under 256, 4.7e-4 (IQ3_XXS) for the 256-blocks, whose q is rounded "
            "to Q8_K. The F16 split-KV sample (512 keys, NMSE up to "
            "~8e-5) is bounded in tests/test_rules_attention.py instead")
_ROPE_TYPES = (Type.F32, Type.F16)

OPINFOS = [
    OpInfo("diag_mask_inf", ref=_ref_diag_mask(NEG_INF), samples=_diag_mask_samples, note=_DIAG_INF_NOTE),
    OpInfo("diag_mask_inf_inplace", ref=_ref_diag_mask(NEG_INF), samples=_diag_mask_samples),
    OpInfo("diag_mask_zero", ref=_ref_diag_mask(0.0), samples=_diag_mask_samples, grad=True),
    OpInfo("diag_mask_zero_inplace", ref=_ref_diag_mask(0.0), samples=_diag_mask_samples),
    OpInfo("soft_max", ref=_ref_soft_max, samples=_soft_max_samples, grad=True),
    OpInfo("soft_max_inplace", ref=_ref_soft_max, samples=_soft_max_samples),
    OpInfo("soft_max_ext", ref=_ref_soft_max_ext, samples=_soft_max_ext_samples, grad=True),
    OpInfo("soft_max_ext_inplace", ref=_ref_soft_max_ext, samples=_soft_max_ext_samples),
    OpInfo("rope", ref=_ref_rope, samples=_rope_samples, types=_ROPE_TYPES, grad=True),
    OpInfo("rope_inplace", ref=_ref_rope, samples=_rope_samples, types=_ROPE_TYPES),
    OpInfo("rope_ext", ref=_ref_rope_ext, samples=_rope_ext_samples, types=_ROPE_TYPES, grad=True),
    OpInfo("rope_ext_inplace", ref=_ref_rope_ext, samples=_rope_ext_samples, types=_ROPE_TYPES),
    OpInfo("rope_multi", ref=_ref_rope_multi, samples=_rope_multi_samples, types=_ROPE_TYPES, grad=True),
    OpInfo("rope_multi_inplace", ref=_ref_rope_multi, samples=_rope_multi_samples, types=_ROPE_TYPES),
    OpInfo("rope_custom", ref=_ref_rope_custom, samples=_rope_custom_samples, types=_ROPE_TYPES, grad=True),
    OpInfo("rope_custom_inplace", ref=_ref_rope_custom, samples=_rope_custom_samples, types=_ROPE_TYPES),
    OpInfo("flash_attn_ext", ref=flash_attn_reference, samples=_fa_samples,
           types=(Type.F32, Type.F16, Type.BF16) + _FA_QUANT, tol=_FA_TOL, note=_FA_NOTE,
           unsampled=unsampled(SLOW_TO_QUANTIZE, SLOW_WHY)),
    OpInfo("get_rel_pos", ref=_ref_get_rel_pos, samples=_get_rel_pos_samples, types=(Type.F16,), exact=True),
    OpInfo("add_rel_pos", ref=_ref_add_rel_pos, samples=_add_rel_pos_samples),
    OpInfo("add_rel_pos_inplace", ref=_ref_add_rel_pos, samples=_add_rel_pos_samples),
]
