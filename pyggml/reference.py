"""An independent float64 NumPy reference for attention and its gradients.

Written from the formula, not from ggml's kernel::

    S = scale * Q K^T  (+ causal mask)      scale = 1 / sqrt(D)
    P = softmax(S)  over keys
    O = P V

Layout as in PyTorch: q and d ``(..., H, N, D)``, k and v ``(..., KVH, M, D)``.
Query head h attends with kv head ``kv_head(h)``: ``h % KVH`` (``"tile"``, what
ggml's FLASH_ATTN_BACK kernel and ``ggml_repeat`` do) or ``h // (H // KVH)``
(``"group"``, what ``torch``'s ``enable_gqa`` and ggml's ``mul_mat`` broadcast do).
With ``masked``, key j is hidden from query i when ``j > (M - N) + i``.
"""

from __future__ import annotations

import numpy as np

from pyggml.errors import ArgumentError

__all__ = ["attention_forward", "attention_backward", "kv_heads", "nmse"]


def kv_heads(H: int, KVH: int, mapping: str = "tile") -> np.ndarray:
    """The kv head that each of the ``H`` query heads uses."""
    if H % KVH:
        raise ArgumentError(f"H={H} must be a multiple of KVH={KVH}")
    h = np.arange(H)
    if mapping == "tile":
        return h % KVH
    if mapping == "group":
        return h // (H // KVH)
    raise ArgumentError(f"mapping must be 'tile' or 'group', not {mapping!r}")


def _causal(N: int, M: int) -> np.ndarray:
    i = np.arange(N)[:, None]
    j = np.arange(M)[None, :]
    return j > (M - N) + i            # True where hidden


def _forward(q, k, v, masked, mapping, scale=None):
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    H, KVH = q.shape[-3], k.shape[-3]
    idx = kv_heads(H, KVH, mapping)
    kh, vh = k[..., idx, :, :], v[..., idx, :, :]
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else float(scale)
    s = scale * (q @ kh.swapaxes(-1, -2))                 # (..., H, N, M)
    if masked:
        s = np.where(_causal(q.shape[-2], k.shape[-2]), -np.inf, s)
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    return p, kh, vh, scale, idx


def _lift(*xs):
    # 2-D (N, D) inputs are one head
    if np.ndim(xs[0]) == 2:
        return tuple(np.asarray(x)[None] for x in xs), True
    return xs, False


def attention_forward(q, k, v, *, masked=False, mapping="tile", scale=None):
    """O = softmax(scale * Q K^T + mask) V in float64, shaped like q (``scale``:
    1/sqrt(D) unless given)."""
    (q, k, v), two_d = _lift(q, k, v)
    p, _, vh, _, _ = _forward(q, k, v, masked, mapping, scale)
    o = p @ vh
    return o[0] if two_d else o


def attention_backward(q, k, v, d, *, masked=False, mapping="tile", scale=None):
    """(dq, dk, dv): the gradients of ``sum(O * d)`` in float64 (``scale``: 1/sqrt(D)
    unless given)."""
    (q, k, v, d), two_d = _lift(q, k, v, d)
    if two_d:
        return tuple(g[0] for g in attention_backward(q, k, v, d, masked=masked, mapping=mapping, scale=scale))
    p, kh, vh, scale, idx = _forward(q, k, v, masked, mapping, scale)
    q64, d64 = np.asarray(q, np.float64), np.asarray(d, np.float64)
    dv_h = p.swapaxes(-1, -2) @ d64                        # (..., H, M, D)
    dp = d64 @ vh.swapaxes(-1, -2)                         # (..., H, N, M)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True)) * scale
    dq = ds @ kh
    dk_h = ds.swapaxes(-1, -2) @ q64
    KVH = np.asarray(k).shape[-3]
    dk = np.zeros(np.shape(k), np.float64)
    dv = np.zeros(np.shape(v), np.float64)
    for h, g in enumerate(idx):      # each kv head sums the query heads that use it
        dk[..., g, :, :] += dk_h[..., h, :, :]
        dv[..., g, :, :] += dv_h[..., h, :, :]
    assert dk.shape[-3] == KVH
    return dq, dk, dv


def nmse(a, b) -> float:
    """sum((a - b)^2) / sum(b^2), ggml test-backend-ops' metric (b the reference)."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    den = float(np.sum(b * b))
    num = float(np.sum((a - b) ** 2))
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / den
