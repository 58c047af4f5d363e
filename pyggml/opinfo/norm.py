"""OpInfos of the [norm] family: norm, rms_norm, group_norm, l2_norm and their _inplace
builders.

Shapes are numpy order: rows (ggml's ne[0]) are the last numpy axis, group_norm's
channels (ne[2]) the third from the end. The CPU kernels take F32 only. norm and l2_norm
read and write at any stride (transposed inputs sampled); rms_norm and group_norm need
contiguous rows (strided rows and permuted dims 1, 2 sampled).

Not sampled: empty tensors (pyggml computes no graph holding a tensor without data).
"""

from __future__ import annotations

import numpy as np

from pyggml.opinfo import Arg, OpInfo, Sample
from pyggml.opinfo._common import normal

_SHAPES = [(7,), (3, 5), (2, 1, 4), (2, 3, 1, 5), (1, 1), (2, 33)]


def _inputs(rng, t, transposed):
    for shape in _SHAPES:
        x = normal(rng, shape) * 2.0 + 0.5
        yield Arg(x, t), f"contiguous {shape}"
    yield Arg(normal(rng, (4, 6)) + 1.0, t, "strided"), "strided rows (4, 6)"
    yield Arg(normal(rng, (2, 3, 2, 5)), t, "permuted", (0, 2, 1, 3)), "dims 1, 2 swapped (2, 3, 2, 5)"
    if transposed:
        yield Arg(normal(rng, (5, 4)) - 1.0, t, "transposed"), "transposed (5, 4)"
        yield Arg(normal(rng, (2, 3, 1, 4)), t, "permuted", (1, 0, 3, 2)), "permuted (1, 0, 3, 2)"


def _eps_samples(eps_values, transposed):
    def samples(rng, t):
        for arg, name in _inputs(rng, t, transposed):
            for eps in eps_values:
                if eps == 0 and arg.value.shape[-1] == 1:
                    continue        # a row of one: 0/0 with eps = 0
                yield Sample((arg, eps), f"{name} eps={eps:g}")
    return samples


def _f32(v):
    return float(np.float32(v))


# --- norm, rms_norm, l2_norm -----------------------------------------------------------------

def _ref_norm(x, eps):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + _f32(eps))


def _ref_rms_norm(x, eps):
    return x / np.sqrt((x ** 2).mean(axis=-1, keepdims=True) + _f32(eps))


def _ref_l2_norm(x, eps):
    return x / np.maximum(np.sqrt((x ** 2).sum(axis=-1, keepdims=True)), _f32(eps))


def _l2_samples(rng, t):
    yield from _eps_samples((1e-6, 0.0), transposed=True)(rng, t)
    # rows whose norm is below eps: scaled by 1/eps, not normalized
    x = normal(rng, (3, 4)) * 1e-3
    x[1] = 0.0
    yield Sample((Arg(x, t), 0.5), "norm below eps (a zero row)")


# --- group_norm ------------------------------------------------------------------------------

def _ref_group_norm(x, n_groups, eps):
    """ggml's grouping: n_groups groups of ceil(C/n_groups) consecutive channels (ne[2]),
    the last ones shorter (or empty, when ceil makes fewer groups suffice); each group of
    each ne[3] slice normalized over its channels x ne[1] x ne[0] values (mean 0, variance 1,
    eps added to the variance)."""
    x4 = x.reshape((1,) * (4 - x.ndim) + x.shape)
    c = x4.shape[1]
    per = -(-c // n_groups)
    out = np.empty_like(x4)
    for start in range(0, c, per):
        g = x4[:, start:start + per]
        mu = g.mean(axis=(1, 2, 3), keepdims=True)
        var = ((g - mu) ** 2).mean(axis=(1, 2, 3), keepdims=True)
        out[:, start:start + per] = (g - mu) / np.sqrt(var + _f32(eps))
    return out.reshape(x.shape)


def _group_norm_samples(rng, t):
    cases = [((2, 4, 3, 5), 2), ((2, 4, 3, 5), 4), ((2, 4, 3, 5), 1), ((6, 2, 3), 3),
             ((1, 5, 2, 3), 2),          # groups of 3 and 2 channels
             ((1, 5, 2, 3), 4),          # ceil(5/4) = 2: groups of 2, 2, 1 (the 4th empty)
             ((1, 3, 2, 2), 7),          # more groups than channels: one channel each
             ((3, 7), 1)]                # ne[2] = 1: one group of everything per ne[3]
    for shape, g in cases:
        yield Sample((Arg(normal(rng, shape) * 2.0 + 0.5, t), g, 1e-5), f"{shape} n_groups={g}")
    yield Sample((Arg(normal(rng, (2, 4, 3, 5)), t, "strided"), 2, 1e-6), "strided rows (2, 4, 3, 5)")
    yield Sample((Arg(normal(rng, (2, 4, 3, 5)), t, "permuted", (0, 2, 1, 3)), 2, 0.0),
                 "dims 1, 2 swapped, eps=0")


OPINFOS = [
    OpInfo("norm", ref=_ref_norm, samples=_eps_samples((1e-5, 0.0), transposed=True)),
    OpInfo("norm_inplace", ref=_ref_norm, samples=_eps_samples((1e-5,), transposed=True)),
    OpInfo("rms_norm", ref=_ref_rms_norm, samples=_eps_samples((1e-6, 0.0), transposed=False), grad=True),
    OpInfo("rms_norm_inplace", ref=_ref_rms_norm, samples=_eps_samples((1e-6,), transposed=False)),
    OpInfo("group_norm", ref=_ref_group_norm, samples=_group_norm_samples),
    OpInfo("group_norm_inplace", ref=_ref_group_norm, samples=_group_norm_samples),
    OpInfo("l2_norm", ref=_ref_l2_norm, samples=_l2_samples),
    OpInfo("l2_norm_inplace", ref=_ref_l2_norm, samples=_l2_samples),
]
