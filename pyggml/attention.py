"""Attention gradients from Python: ggml's FLASH_ATTN_BACK kernel and pyggml's own
blocked kernel (csrc/attn_blocked.c).

* :func:`flash_attn_back_grads` and :func:`flash_attn_back_grad_tensors` take the
  result of :func:`pyggml.flash_attn_back` apart, as numpy views or as ggml views.
* :func:`attention_backward` is the one-call API for numpy arrays in PyTorch layout,
  on either kernel; :func:`attention_backward_node` puts the blocked kernel in a graph.
* :func:`flash_attn_ext_backward`: the gradients of ggml's ``flash_attn_ext``.
"""

from __future__ import annotations

import numpy as np

from pyggml import _attn
from pyggml._core import MEM_ALIGN, Context, Tensor, Type
from pyggml._fab import flash_attn_back_offsets
from pyggml._ops_backward import flash_attn_back
from pyggml._graph import Graph
from pyggml._ops_layout import view_4d
from pyggml.errors import ArgumentError, GGMLTypeError, UnsupportedOpError

__all__ = ["KERNELS", "attention_backward", "attention_backward_node", "flash_attn_back_grad_tensors",
           "flash_attn_back_grads", "flash_attn_ext_backward"]

KERNELS = ("blocked", "ggml")
MAPPINGS = {"tile": 0, "group": 1}


def _fab_parts(result: Tensor):
    if not isinstance(result, Tensor):
        raise GGMLTypeError(f"result must be a pyggml.Tensor, not {type(result).__name__}")
    if result.op != "FLASH_ATTN_BACK":
        raise ArgumentError(f"result must be a FLASH_ATTN_BACK tensor (from flash_attn_back), not op {result.op}")
    q, k, v = result.src[:3]
    assert q is not None and k is not None and v is not None     # FLASH_ATTN_BACK has all four
    return (q, k, v), flash_attn_back_offsets(q, k, v)


def flash_attn_back_grads(result: Tensor):
    """flash_attn_back_grads(result) -> (grad_q, grad_k, grad_v)

    Zero-copy numpy views of the gradients packed in ``result`` (from
    :func:`pyggml.flash_attn_back`), at the offsets of
    :func:`pyggml.flash_attn_back_offsets`, shaped like q, k and v (``.shape``,
    numpy order); grad_v in v's transposed layout. Valid after the graph is
    computed; writable; they keep the memory alive.
    """
    srcs, offs = _fab_parts(result)
    data = result.numpy()                      # the whole result, float32, 1-D
    itemsize = data.itemsize
    out = []
    for t, off in zip(srcs, offs[:3]):
        start = off // itemsize
        out.append(data[start:start + t.nelements].reshape(t.shape))
    return tuple(out)


def flash_attn_back_grad_tensors(ctx: Context, result: Tensor):
    """flash_attn_back_grad_tensors(ctx, result) -> (grad_q, grad_k, grad_v)

    The same gradients as ggml view tensors (``ggml_view_4d`` of ``result`` at the
    seed's offsets, contiguous, with q's, k's and v's ne), made in ``ctx``, so
    they can feed further ops of a graph.
    """
    srcs, offs = _fab_parts(result)
    out = []
    for t, off in zip(srcs, offs[:3]):
        ne = t.ne
        nb1 = 4 * ne[0]
        out.append(view_4d(ctx, result, ne[0], ne[1], ne[2], ne[3],
                                 nb1, nb1 * ne[1], nb1 * ne[1] * ne[2], off))
    return tuple(out)


def _as_4d(name, x, ndim):
    if not isinstance(x, np.ndarray):
        raise GGMLTypeError(f"{name} must be a numpy.ndarray, not {type(x).__name__}")
    if x.dtype != np.float32:
        raise GGMLTypeError(f"{name} must be float32, not {x.dtype}")
    if x.ndim != ndim:
        raise ArgumentError(f"q, k, v and d must have the same number of dims; q has {ndim}, {name} has {x.ndim}")
    return x.reshape((1,) * (4 - ndim) + x.shape)


def attention_backward(q, k, v, d, *, masked=False, n_threads=None, kernel="blocked", scale=None, mapping="tile",
                       lse=None, o=None):
    """attention_backward(q, k, v, d, *, masked=False, n_threads=None, kernel="blocked", scale=None, mapping="tile", lse=None, o=None) -> (dq, dk, dv)

    Gradients of ``sum(O * d)`` for ``O = softmax(scale * Q K^T + mask) V``.

    Parameters
    ----------
    q, d : float32 arrays ``(B, H, N, D)``; ``(H, N, D)`` and ``(N, D)`` accepted.
    k, v : float32 arrays ``(B, KVH, M, D)`` (same number of dims as q), ``M >= N``
        when masked, ``H % KVH == 0``.
    masked : hide key j from query i when ``j > (M - N) + i`` (bottom-right causal).
    n_threads : CPU threads (default: all this process may use, fewer for a small
        problem with the blocked kernel, ``pyggml._attn.default_threads``: starting a
        thread costs more than it saves there; its results' bits do not depend on it).
    kernel : ``"blocked"`` (the default: pyggml's FlashAttention-2-style kernel,
        csrc/attn_blocked.c; memory linear in N, bitwise the same for any thread
        count) or ``"ggml"`` (ggml's FLASH_ATTN_BACK CPU kernel, the seed's op).
    scale : softmax scale (default ``1/sqrt(D)``, the only one the ggml kernel has).
    mapping : ``"tile"``: query head h uses kv head ``h % KVH`` (the ggml kernel's);
        ``"group"``: ``h // (H // KVH)`` (torch's ``enable_gqa``, flash_attn_ext's).
        The ggml kernel has only ``"tile"``.
    lse, o : the forward's per-row natural log-sum-exp of the scaled, masked scores
        ``(B, H, N)`` and its output ``O`` (like q), both or neither (blocked kernel):
        with them the kernel skips recomputing the softmax statistics.

    Returns
    -------
    dq, dk, dv shaped like q, k, v. With the blocked kernel they are new arrays. With
    the ggml kernel, dq and dk are views of ggml's result memory and dv a transposed
    view (the kernel works on v transposed, which costs one copy of v on the way in);
    for B > 1 with KVH < H, where that kernel writes out of bounds
    (``pyggml.defects``: ``fab-batch-gqa-oob``), each batch is its own node and the
    results are concatenated (one copy).
    """
    if kernel not in KERNELS:
        raise ArgumentError(f"kernel must be one of {', '.join(map(repr, KERNELS))}, not {kernel!r}")
    if mapping not in MAPPINGS:
        raise ArgumentError(f"mapping must be 'tile' or 'group', not {mapping!r}")
    if kernel == "blocked":
        return _blocked(q, k, v, d, masked, n_threads, scale, mapping, lse, o)
    D = np.shape(q)[-1] if np.ndim(q) else 0
    if scale is not None and float(scale) != float(np.float32(1.0 / np.sqrt(D))):
        raise ArgumentError(f"kernel='ggml': ggml's kernel has the scale 1/sqrt(D) only, not {scale!r} "
                         f"(use kernel='blocked')")
    if mapping != "tile":
        raise ArgumentError("kernel='ggml': ggml's kernel maps query head h to kv head h % KVH only (mapping='tile')")
    if lse is not None or o is not None:
        raise ArgumentError("kernel='ggml': ggml's kernel takes no saved statistics (lse, o)")
    q4, k4, v4, d4 = _shapes(q, k, v, d, masked=True)     # ggml's kernel needs M >= N, masked or not
    B, H, N, D = q4.shape
    KVH, M = k4.shape[1], k4.shape[2]

    # read in place when C-contiguous, aligned and writeable (pyggml lends only such memory
    # to ggml), else copied
    qc, kc, dc = (np.require(x, requirements=["C", "A", "W"]) for x in (q4, k4, d4))
    vt = np.ascontiguousarray(v4.swapaxes(-1, -2))        # (B, KVH, D, M): the kernel's v
    split = B > 1 and KVH < H
    slices = [slice(b, b + 1) for b in range(B)] if split else [slice(None)]

    tensor_overhead = Context(1 << 12, no_alloc=True)
    tensor_overhead.new_tensor(Type.F32, (1,))
    per_tensor = tensor_overhead.used_mem
    tensor_overhead.close()
    result_bytes = sum(flash_attn_back_end(qc[s], kc[s], vt[s]) for s in slices)
    graph_size = 8 * len(slices)
    inputs = Context(4 * len(slices) * per_tensor, no_alloc=True)
    # room for each result, its alignment padding (up to 64 + an object header each)
    work = Context(len(slices) * (2 * per_tensor + 128) + result_bytes + Graph.overhead(graph_size))
    try:
        graph = Graph(work, graph_size)
        results = []
        for s in slices:
            tq, tk, tv, td = (inputs._borrow_numpy(x[s]) for x in (qc, kc, vt, dc))
            work._align_next_data(64)       # cache-line aligned gradients: the kernel is faster
            r = flash_attn_back(work, tq, tk, tv, td, bool(masked))
            graph.build_forward_expand(r)
            results.append(r)
        graph.compute(n_threads)
        grads = [flash_attn_back_grads(r) for r in results]
    finally:
        work.close()
        inputs.close()

    def full(g, shape):
        return g.reshape(shape)

    if split:
        dq = np.concatenate([full(g[0], (1, H, N, D)) for g in grads])
        dk = np.concatenate([full(g[1], (1, KVH, M, D)) for g in grads])
        dvt = np.concatenate([full(g[2], (1, KVH, D, M)) for g in grads])
    else:
        dq = full(grads[0][0], (B, H, N, D))
        dk = full(grads[0][1], (B, KVH, M, D))
        dvt = full(grads[0][2], (B, KVH, D, M))
    dv = dvt.swapaxes(-1, -2)
    return dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape)


def _shapes(q, k, v, d, masked):
    """q, k, v, d as 4-d arrays, after the checks both kernels share."""
    ndim = np.ndim(q)
    if ndim not in (2, 3, 4):
        raise ArgumentError(f"q must have 2, 3 or 4 dims (N, D) / (H, N, D) / (B, H, N, D), got {ndim}")
    q4, k4, v4, d4 = (_as_4d(n, x, ndim) for n, x in (("q", q), ("k", k), ("v", v), ("d", d)))
    B, H, N, D = q4.shape
    Bk, KVH, M, Dk = k4.shape
    if k4.shape != v4.shape:
        raise ArgumentError(f"k and v must have the same shape, got {k.shape} and {v.shape}")
    if d4.shape != q4.shape:
        raise ArgumentError(f"d must have q's shape {q.shape}, got {d.shape}")
    if Bk != B or Dk != D:
        raise ArgumentError(f"k {k.shape} must match q {q.shape} in batch and head size D")
    if KVH == 0 or H % KVH:
        raise ArgumentError(f"the number of query heads H={H} must be a multiple of kv heads KVH={KVH}")
    if masked and M < N:
        raise ArgumentError(f"M={M} keys must be >= N={N} queries")
    if q4.size == 0 or k4.size == 0:
        raise ArgumentError("q, k, v and d must not be empty")
    return q4, k4, v4, d4


def _blocked(q, k, v, d, masked, n_threads, scale, mapping, lse, o):
    ndim = np.ndim(q)
    q4, k4, v4, d4 = _shapes(q, k, v, d, masked)
    if type(masked) is not bool:
        masked = bool(masked) if masked in (0, 1) else masked
    D = q4.shape[-1]
    sc = 1.0 / np.sqrt(D) if scale is None else scale
    lse4 = o4 = None
    if lse is not None or o is not None:
        if lse is None or o is None:
            raise ArgumentError("lse and o come together (the saved statistics need the forward output)")
        o4 = _as_4d("o", o, ndim)
        lse = np.asarray(lse)
        if lse.dtype != np.float32:
            raise GGMLTypeError(f"lse must be float32, not {lse.dtype}")
        if lse.shape != np.shape(q)[:-1]:
            raise ArgumentError(f"lse must have q's shape without D, {np.shape(q)[:-1]}, got {lse.shape}")
        lse4 = np.ascontiguousarray(lse.reshape(q4.shape[:-1]))
        o4 = np.ascontiguousarray(o4)
    dq, dk, dv = _attn.blocked_backward(*(np.ascontiguousarray(x) for x in (q4, k4, v4, d4)), lse4, o4, sc, masked,
                                        MAPPINGS[mapping], n_threads)
    return dq.reshape(np.shape(q)), dk.reshape(np.shape(k)), dv.reshape(np.shape(v))


def attention_backward_node(ctx: Context, q, k, v, d, *, scale=None, masked=False, mapping="tile", lse=None, o=None):
    """attention_backward_node(ctx, q, k, v, d, *, scale=None, masked=False, mapping="tile", lse=None, o=None) -> (dq, dk, dv)

    The blocked kernel of :func:`attention_backward` as a node of a ggml graph, so it
    composes with other ops (a training step's graph, the gradient of
    ``flash_attn_ext``). q, d: tensors ``[D, N, H, B]`` (ggml order), k, v
    ``[D, M, KVH, B]``, optionally lse ``[N, H, B]`` and o ``[D, N, H, B]``; all F32
    and contiguous. Returns three view tensors made in ``ctx``, shaped like q, k and
    v, of one GGML_OP_CUSTOM node that packs them (ggml's compute threads run it).
    """
    if mapping not in MAPPINGS:
        raise ArgumentError(f"mapping must be 'tile' or 'group', not {mapping!r}")
    if not isinstance(q, Tensor) or not isinstance(k, Tensor) or not isinstance(v, Tensor):
        raise GGMLTypeError("q, k and v must be pyggml.Tensor")
    sc = 1.0 / np.sqrt(q.ne[0]) if scale is None else scale
    node = _attn.blocked_backward_node(ctx, q, k, v, d, sc, bool(masked) if masked in (0, 1) else masked,
                                       MAPPINGS[mapping], lse, o)
    offs = _attn.blocked_offsets(q, k)
    out = []
    for t, off in zip((q, k, v), offs[:3]):
        ne = t.ne
        nb1 = 4 * ne[0]
        out.append(view_4d(ctx, node, ne[0], ne[1], ne[2], ne[3], nb1, nb1 * ne[1], nb1 * ne[1] * ne[2], off))
    return tuple(out)


def flash_attn_back_end(q4: np.ndarray, k4: np.ndarray, vt4: np.ndarray) -> int:
    """Bytes of the result of one flash_attn_back node over these arrays (the seed's ``end``)."""
    align = MEM_ALIGN

    def pad(x):
        return (x + align - 1) // align * align

    return pad(4 * q4.size) + pad(4 * k4.size) + pad(4 * vt4.size)


def flash_attn_ext_backward(q, k, v, d, *, scale=None, masked=False, mapping="group", mask=None, max_bias=0.0,
                            logit_softcap=0.0, n_threads=None, kernel="blocked"):
    """flash_attn_ext_backward(q, k, v, d, *, scale=None, masked=False, mapping="group", ..., kernel="blocked") -> (dq, dk, dv)

    Gradients of ``sum(O * d)`` for the attention ``ggml_flash_attn_ext`` computes,
    ``O = softmax(scale * Q K^T + mask) V`` (ggml has no backward for that op), computed
    by :func:`attention_backward`'s ``kernel``: pyggml's blocked kernel (the default;
    scale and head mapping native), or ggml's FLASH_ATTN_BACK kernel (scale met by
    scaling q and dq, the heads reordered for the group mapping).

    q, d : ``(B, H, N, D)`` (or fewer leading dims, as attention_backward); k, v :
        ``(B, KVH, M, D)``, float32 or float16 (exact in float32).
    scale : flash_attn_ext's ``scale`` (default ``1/sqrt(D)``); the kernel's fixed
        ``1/sqrt(D)`` is met by scaling q, and dq back.
    masked : the causal mask ggml's flash_attn_ext users pass (key j hidden from query
        i when ``j > (M - N) + i``).
    mapping : ``"group"`` (flash_attn_ext's: query head h uses kv head ``h // (H/KVH)``)
        or ``"tile"`` (``h % KVH``, the kernel's own): the heads are reordered for it.

    What the kernel does not cover raises UnsupportedOpError (a NotImplementedError), by
    name: an arbitrary ``mask`` array, ALiBi (``max_bias`` != 0), ``logit_softcap`` != 0,
    and a v head size other than q's.
    """
    if mask is not None:
        raise UnsupportedOpError("flash_attn_ext_backward: an arbitrary mask: the FLASH_ATTN_BACK kernel knows "
                                 "only the causal one (masked=True)", op="FLASH_ATTN_BACK")
    if max_bias != 0.0:
        raise UnsupportedOpError("flash_attn_ext_backward: ALiBi (max_bias != 0) is not covered by the "
                                 "FLASH_ATTN_BACK kernel", op="FLASH_ATTN_BACK")
    if logit_softcap != 0.0:
        raise UnsupportedOpError("flash_attn_ext_backward: logit_softcap != 0 is not covered by the "
                                 "FLASH_ATTN_BACK kernel", op="FLASH_ATTN_BACK")
    if mapping not in ("group", "tile"):
        raise ArgumentError(f"mapping must be 'group' or 'tile', not {mapping!r}")
    if kernel not in KERNELS:
        raise ArgumentError(f"kernel must be one of {', '.join(map(repr, KERNELS))}, not {kernel!r}")
    for name, x in (("q", q), ("k", k), ("v", v), ("d", d)):
        if not isinstance(x, np.ndarray):
            raise GGMLTypeError(f"{name} must be a numpy.ndarray, not {type(x).__name__}")
        if x.dtype not in (np.float32, np.float16):
            raise GGMLTypeError(f"{name} must be float32 or float16, not {x.dtype}")
        if x.ndim not in (2, 3, 4):
            raise ArgumentError(f"{name} must have 2, 3 or 4 dims, got {x.ndim}")
    q32, d32 = (np.ascontiguousarray(x, np.float32) for x in (q, d))
    k32, v32 = (np.asarray(x).astype(np.float32, copy=False) for x in (k, v))
    if np.shape(v32)[-1] != np.shape(q32)[-1]:
        raise UnsupportedOpError(f"flash_attn_ext_backward: v's head size {np.shape(v32)[-1]} differs from q's "
                                 f"{np.shape(q32)[-1]}; both kernels need them equal", op="FLASH_ATTN_BACK")
    D = q32.shape[-1]
    c = 1.0 if scale is None else float(scale) * float(np.sqrt(D))
    if not np.isfinite(c) or c == 0.0:
        raise ArgumentError(f"scale must be finite and non-zero, got {scale!r}")
    if kernel == "blocked":
        return attention_backward(q32, k32, v32, d32, masked=masked, n_threads=n_threads, scale=scale,
                                  mapping=mapping)
    heads = None
    if q32.ndim >= 3 and mapping == "group":
        H, KVH = q32.shape[-3], np.shape(k32)[-3]
        if KVH and H % KVH == 0 and KVH < H:
            g = H // KVH
            j = np.arange(H)
            heads = (j % KVH) * g + j // KVH      # kernel head j <- query head heads[j]: heads[j] // g == j % KVH
    qk = q32 * np.float32(c) if c != 1.0 else q32
    if heads is not None:
        qk, d32 = qk[..., heads, :, :], d32[..., heads, :, :]
    dq, dk, dv = attention_backward(np.ascontiguousarray(qk), k32, v32, np.ascontiguousarray(d32), masked=masked,
                                    n_threads=n_threads)
    if heads is not None:
        back = np.empty_like(dq)
        back[..., heads, :, :] = dq
        dq = back
    if c != 1.0:
        dq = dq * np.float32(c)
    return dq, dk, dv
