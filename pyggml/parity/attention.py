"""The attention gradients along five independent paths: what the ``attention`` subject
of :mod:`pyggml.parity` computes (pyggml.parity.subjects.AttentionSubject runs them,
compares them and reports like every other subject).

Paths (each returns dq, dk, dv for PyTorch-layout float32 inputs), by their names in
the sweep:

``ggml``
    ggml's FLASH_ATTN_BACK CPU kernel through :func:`pyggml.flash_attn_back` (path_kernel).
``blocked``
    pyggml's own blocked kernel (csrc/attn_blocked.c), :func:`pyggml.attention_backward`.
``autodiff``
    ggml's own autodiff: the forward composed from ggml ops (repeat for GQA,
    mul_mat, scale, diag_mask_inf, soft_max, mul_mat), loss ``sum(O * d)``,
    ``build_backward_expand``, gradients read with ``Graph.grad``.
``reference``
    the float64 NumPy reference, :mod:`pyggml.reference`.
``torch``
    torch autograd on the CPU (float32), when torch is importable.

All five compute the same function: query head h uses kv head ``h % KVH`` (the
kernel's tiling; ``ggml_repeat`` tiles too; torch gets its kv heads indexed with
``h % KVH`` explicitly, since its ``enable_gqa`` groups as ``h // (H // KVH)``),
and key j is hidden from query i when ``j > (M - N) + i`` (torch gets that
bottom-right mask explicitly: its ``is_causal`` is top-left).

Tolerances (NMSE, test-backend-ops' metric): 1e-7 against the float64
reference (test-backend-ops' default). Between two float32 paths, 4e-7: if each
is within 1e-7 of the reference, the triangle inequality on the root of the
NMSE bounds their mutual NMSE by (2 * sqrt(1e-7))**2 = 4e-7.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re

import numpy as np

import pyggml
from pyggml import reference
from pyggml.errors import ArgumentError, UpstreamDefect
from pyggml.attention import flash_attn_back_grads

NMSE_REF = 1e-7
NMSE_F32 = (2 * math.sqrt(NMSE_REF)) ** 2     # 4e-7, see the module docstring


class Refused(Exception):
    """A path declines a configuration for a known upstream defect (``.defect``: its id)."""

    def __init__(self, message: str, defect: str):
        super().__init__(message)
        self.defect = defect


_NAME = re.compile(r"D(\d+)-N(\d+)-M(\d+)-H(\d+)-KVH(\d+)-B(\d+)(-masked)?")


@dataclasses.dataclass(frozen=True)
class Config:
    """One attention configuration: head size D, N queries, M keys, H query heads, KVH
    kv heads, batch B, causal mask. Its ``name`` is the parity case's label, and
    :meth:`from_name` reads it back (any configuration is a case of the subject)."""
    D: int
    N: int
    M: int
    H: int
    KVH: int
    B: int
    masked: bool

    @property
    def name(self) -> str:
        return (f"D{self.D}-N{self.N}-M{self.M}-H{self.H}-KVH{self.KVH}-B{self.B}"
                f"{'-masked' if self.masked else ''}")

    @classmethod
    def from_name(cls, name: str) -> "Config":
        m = _NAME.fullmatch(name)
        if m is None:
            raise ArgumentError(f"not an attention configuration: {name!r} (D..-N..-M..-H..-KVH..-B..[-masked])")
        D, N, M, H, KVH, B = (int(g) for g in m.groups()[:6])
        return cls(D, N, M, H, KVH, B, m.group(7) is not None)

    def inputs(self, seed: int = 0):
        rng = np.random.default_rng(seed)
        q = rng.standard_normal((self.B, self.H, self.N, self.D)).astype(np.float32)
        k = rng.standard_normal((self.B, self.KVH, self.M, self.D)).astype(np.float32)
        v = rng.standard_normal((self.B, self.KVH, self.M, self.D)).astype(np.float32)
        d = rng.standard_normal((self.B, self.H, self.N, self.D)).astype(np.float32)
        return q, k, v, d


def sweep(quick: bool = False) -> list[Config]:
    """The cases: ``quick`` is a subset that runs in seconds."""
    if quick:
        Ds, NMs, gqas, Bs = [1, 17, 64], [(1, 5), (6, 6), (4, 7)], [1, 4], [1, 2]
    else:
        Ds, NMs, gqas, Bs = [1, 3, 17, 64, 80, 128, 256], [(1, 5), (6, 6), (4, 7), (16, 24), (33, 47)], [1, 2, 4], \
            [1, 2, 3]
    return [Config(D, N, M, 2 * g, 2, B, masked)
            for D, (N, M), g, B, masked in itertools.product(Ds, NMs, gqas, Bs, (False, True))]


# --- the paths --------------------------------------------------------------------

def path_reference(q, k, v, d, masked, n_threads=None):
    return reference.attention_backward(q, k, v, d, masked=masked)


def path_blocked(q, k, v, d, masked, n_threads=None):
    return pyggml.attention_backward(q, k, v, d, masked=masked, n_threads=n_threads, kernel="blocked")


def _context_for(*arrays, extra=0):
    return pyggml.Context(sum(a.nbytes for a in arrays) * 24 + (8 << 20) + extra)


def path_kernel(q, k, v, d, masked, n_threads=None):
    B, H, N, D = q.shape
    _, KVH, M, _ = k.shape
    with _context_for(q, k, v, d) as ctx:
        tq, tk, td = ctx.from_numpy(q), ctx.from_numpy(k), ctx.from_numpy(d)
        tv = ctx.from_numpy(np.ascontiguousarray(v.swapaxes(-1, -2)))
        try:
            r = pyggml.flash_attn_back(ctx, tq, tk, tv, td, masked)
        except UpstreamDefect as e:
            raise Refused(f"{e.defect}: {e}", e.defect) from None
        graph = pyggml.Graph(ctx)
        graph.build_forward_expand(r)
        graph.compute(n_threads)
        gq, gk, gvt = (g.copy() for g in flash_attn_back_grads(r))
    return (gq.reshape(B, H, N, D), gk.reshape(B, KVH, M, D),
            gvt.reshape(B, KVH, D, M).swapaxes(-1, -2))


def attention_forward_graph(ctx, q, k, vt, masked):
    """The attention forward composed from ggml ops, ggml order throughout.

    q ``[D,N,H,B]``, k ``[D,M,KVH,B]``, vt ``[M,D,KVH,B]`` (v transposed, as the
    kernel takes it, so that every gradient ggml forms is contiguous).
    Returns O ``[D,N,H,B]``.
    """
    D, N, H, B = q.ne
    M, KVH = k.ne[1], k.ne[2]
    if H != KVH:   # GQA: tile kv heads (head h uses h % KVH), as the kernel does
        k = pyggml.repeat(ctx, k, ctx.new_tensor(pyggml.Type.F32, (D, M, H, B)))
        vt = pyggml.repeat(ctx, vt, ctx.new_tensor(pyggml.Type.F32, (M, D, H, B)))
    s = pyggml.mul_mat(ctx, k, q)                        # [M,N,H,B] = K Q^T per head
    s = pyggml.scale(ctx, s, 1.0 / math.sqrt(D))
    if masked:
        s = pyggml.diag_mask_inf(ctx, s, M - N)          # hide j > (M - N) + i
    p = pyggml.soft_max(ctx, s)
    return pyggml.mul_mat(ctx, vt, p)                    # [D,N,H,B] = P V


def path_autodiff(q, k, v, d, masked, n_threads=None):
    B, H, N, D = q.shape
    _, KVH, M, _ = k.shape
    with _context_for(q, k, v, d, extra=64 * B * H * N * M) as ctx:
        tq, tk, td = ctx.from_numpy(q), ctx.from_numpy(k), ctx.from_numpy(d)
        tvt = ctx.from_numpy(np.ascontiguousarray(v.swapaxes(-1, -2)))
        for t in (tq, tk, tvt):
            pyggml.set_param(t)
        o = attention_forward_graph(ctx, tq, tk, tvt, masked)
        loss = pyggml.sum(ctx, pyggml.mul(ctx, o, td))
        pyggml.set_loss(loss)
        graph = pyggml.Graph(ctx, 512, grads=True)
        graph.build_forward_expand(loss)
        graph.build_backward_expand()
        graph.compute(n_threads)
        gq, gk, gvt = (graph.grad(t).numpy().copy() for t in (tq, tk, tvt))
    return (gq.reshape(B, H, N, D), gk.reshape(B, KVH, M, D),
            gvt.reshape(B, KVH, D, M).swapaxes(-1, -2))


def torch_available() -> bool:
    """Whether torch is installed (found, not imported: torch_ops.available)."""
    from pyggml.parity.torch_ops import available
    return available()


def path_torch(q, k, v, d, masked, n_threads=None):
    import torch  # type: ignore[import-not-found]

    if n_threads:
        torch.set_num_threads(n_threads)
    B, H, N, D = q.shape
    KVH, M = k.shape[1], k.shape[2]
    tq, tk, tv = (torch.from_numpy(x.copy()).requires_grad_() for x in (q, k, v))
    idx = torch.arange(H) % KVH                        # the kernel's tiling, not enable_gqa's grouping
    kh, vh = tk[:, idx], tv[:, idx]
    mask = None
    if masked:                                         # bottom-right causal: j <= (M - N) + i is visible
        i = torch.arange(N)[:, None]
        j = torch.arange(M)[None, :]
        mask = j <= (M - N) + i
    out = torch.nn.functional.scaled_dot_product_attention(tq, kh, vh, attn_mask=mask)
    out.backward(torch.from_numpy(d))
    return tuple(t.grad.numpy() for t in (tq, tk, tv))
