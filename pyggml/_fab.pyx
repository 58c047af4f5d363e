# cython: language_level=3, embedsignature=True
"""pyggml._fab: the FLASH_ATTN_BACK node, built as the seed built it.

Upstream's ggml_flash_attn_back() begins with GGML_ABORT since commit 1a815669
(2024-05-23), but the CPU kernel for GGML_OP_FLASH_ATTN_BACK still runs. pyggml
builds the node as the seed (upstream's builder just before that commit) did. The
seed's GGML_ASSERTs are checked here; the kernel's own preconditions, including the
known batch+GQA defect, by the FLASH_ATTN_BACK rule of csrc/rules_backward.c.
"""

from libc.stdint cimport int64_t, uint8_t
from libc.string cimport memset

from pyggml._ggml cimport *
from pyggml._rt cimport *
from pyggml._core cimport Context, Storage, Tensor, arg_bool, arg_context, arg_tensor, check_node_named, need_open

import numpy as np

from pyggml.errors import ArgumentError, GGMLTypeError, GGMLVersionError


cdef inline object _pad(object x, object n):
    # GGML_PAD(x, n), in Python ints: no overflow
    return (x + n - 1) // n * n


def flash_attn_back_offsets(q, k, v):
    """flash_attn_back_offsets(q, k, v) -> (offs_q, offs_k, offs_v, end)

    Byte offsets of grad_q, grad_k and grad_v in the result of
    :func:`flash_attn_back`, and its padded end, as the seed computes them:
    each gradient is ``nelements * 4`` bytes, padded to ``GGML_MEM_ALIGN``.
    """
    cdef Tensor tq = arg_tensor(q, "q", "flash_attn_back_offsets")
    cdef Tensor tk = arg_tensor(k, "k", "flash_attn_back_offsets")
    cdef Tensor tv = arg_tensor(v, "v", "flash_attn_back_offsets")
    cdef size_t tsize = ggml_type_size(GGML_TYPE_F32)
    offs_q = 0
    offs_k = offs_q + _pad(ggml_nelements(tq.ptr) * tsize, GGML_MEM_ALIGN)
    offs_v = offs_k + _pad(ggml_nelements(tk.ptr) * tsize, GGML_MEM_ALIGN)
    end = offs_v + _pad(ggml_nelements(tv.ptr) * tsize, GGML_MEM_ALIGN)
    return offs_q, offs_k, offs_v, end


cdef int _need_seed_shapes(Tensor q, Tensor k, Tensor v, Tensor d) except -1:
    """The seed builder's GGML_ASSERTs (ggml_can_mul_mat(k, q) and the shape contract)."""
    cdef str op = "flash_attn_back"
    D, N, M = q.ptr.ne[0], q.ptr.ne[1], k.ptr.ne[1]
    ne2, ne3, kvne2 = q.ptr.ne[2], q.ptr.ne[3], k.ptr.ne[2]
    for arg, t in (("q", q), ("k", k), ("v", v), ("d", d)):
        if t.ptr.type != GGML_TYPE_F32:     # the kernel reads all four as float
            raise GGMLTypeError(f"{op}: {arg} has type {t.type.name}; supported: F32")
        if ggml_nelements(t.ptr) == 0:
            raise ArgumentError(f"{op}: {arg} is empty (ne={t.ne})")
    if k.ptr.ne[0] != q.ptr.ne[0]:
        raise ArgumentError(f"{op}: k.ne[0]={k.ptr.ne[0]} must equal q.ne[0]=D={D}")
    if q.ptr.ne[2] % k.ptr.ne[2] != 0:
        raise ArgumentError(f"{op}: q.ne[2]=ne2={ne2} must be a multiple of k.ne[2]=kvne2={kvne2}")
    if k.ptr.ne[3] != ne3:
        raise ArgumentError(f"{op}: k.ne[3]={k.ptr.ne[3]} must equal q.ne[3]=ne3={ne3}")
    checks = (
        ("v.ne[0]", v.ptr.ne[0], "M", M), ("v.ne[1]", v.ptr.ne[1], "D", D),
        ("d.ne[0]", d.ptr.ne[0], "D", D), ("d.ne[1]", d.ptr.ne[1], "N", N),
        ("v.ne[2]", v.ptr.ne[2], "kvne2", kvne2), ("v.ne[3]", v.ptr.ne[3], "ne3", ne3),
        ("d.ne[2]", d.ptr.ne[2], "ne2", ne2), ("d.ne[3]", d.ptr.ne[3], "ne3", ne3),
    )
    for name, got, want_name, want in checks:
        if got != want:
            raise ArgumentError(f"{op}: {name}={got} must equal {want_name}={want} "
                                f"(q [D,N,ne2,ne3]={q.ne}, k [D,M,kvne2,ne3]={k.ne}, "
                                f"v [M,D,kvne2,ne3]={v.ne}, d [D,N,ne2,ne3]={d.ne})")
    return 0


def flash_attn_back(ctx, q, k, v, d, masked):
    """flash_attn_back(ctx, q, k, v, d, masked) -> Tensor

    The seed's ``ggml_flash_attn_back``: a GGML_OP_FLASH_ATTN_BACK node whose
    result packs grad_q, grad_k and grad_v (see :func:`flash_attn_back_offsets`).

    Shapes, ggml order: q ``[D,N,ne2,ne3]``, k ``[D,M,kvne2,ne3]``,
    v ``[M,D,kvne2,ne3]`` (transposed), d ``[D,N,ne2,ne3]`` (the gradient of
    the attention output). All F32; rows of q, k, v contiguous; ``M >= N``;
    ``ne2 % kvne2 == 0``, query head h using kv head ``h % kvne2``.
    ``masked``: key j is hidden from query i when ``j > (M - N) + i``.

    The result is a 1-D F32 tensor of ``(end + 3) // 4`` elements with
    ``op_params[0] = masked`` and ``src[0..3] = q, k, v, d``. Raises
    UpstreamDefect for ne3 > 1 with kvne2 < ne2 (``pyggml.defects``:
    ``fab-batch-gqa-oob``), GGMLVersionError where the linked ggml has no
    GGML_OP_FLASH_ATTN_BACK.
    """
    cdef Context c = arg_context(ctx, "flash_attn_back")
    if not PYGGML_HAVE_FLASH_ATTN_BACK:
        raise GGMLVersionError(f"flash_attn_back: ggml {c_ggml_version().decode()} has no GGML_OP_FLASH_ATTN_BACK")
    cdef Tensor tq = arg_tensor(q, "q", "flash_attn_back"), tk = arg_tensor(k, "k", "flash_attn_back")
    cdef Tensor tv = arg_tensor(v, "v", "flash_attn_back"), td = arg_tensor(d, "d", "flash_attn_back")
    cdef bint cmasked = arg_bool(masked, "masked", "flash_attn_back")
    _need_seed_shapes(tq, tk, tv, td)
    # the kernel's rule, on the node as it will be, before the context is touched
    cdef ggml_tensor probe
    memset(&probe, 0, sizeof(probe))
    probe.type = GGML_TYPE_F32
    probe.ne[0] = (flash_attn_back_offsets(tq, tk, tv)[3] + 3) // 4
    probe.ne[1] = probe.ne[2] = probe.ne[3] = 1
    probe.nb[0] = 4
    probe.nb[1] = probe.nb[2] = probe.nb[3] = 4 * probe.ne[0]
    probe.op = GGML_OP_FLASH_ATTN_BACK
    probe.op_params[0] = 1 if cmasked else 0
    probe.src[0] = tq.ptr
    probe.src[1] = tk.ptr
    probe.src[2] = tv.ptr
    probe.src[3] = td.ptr
    check_node_named(&probe, "flash_attn_back", ("q", "k", "v", "d"), (tq, tk, tv, td))
    return _fab_node(c, tq, tk, tv, td, cmasked, 0)


cdef Tensor _fab_node(Context ctx, Tensor tq, Tensor tk, Tensor tv, Tensor td, bint masked, int64_t extra):
    """The seed's node; ``extra`` elements of padding only for the defect probe."""
    offs_q, offs_k, offs_v, end = flash_attn_back_offsets(tq, tk, tv)
    cdef size_t tsize = ggml_type_size(GGML_TYPE_F32)
    cdef int64_t ne[1]
    ne[0] = (end + tsize - 1) // tsize + extra
    ctx._reserve(ggml_tensor_overhead() + _pad(ne[0] * tsize, GGML_MEM_ALIGN), "flash_attn_back")
    cdef ggml_tensor * result = ggml_new_tensor(ctx.ptr, GGML_TYPE_F32, 1, ne)
    result.op_params[0] = 1 if masked else 0      # ggml_set_op_params(result, &masked_i, 4)
    result.op = GGML_OP_FLASH_ATTN_BACK
    result.src[0] = tq.ptr
    result.src[1] = tk.ptr
    result.src[2] = tv.ptr
    result.src[3] = td.ptr
    return ctx._adopt(result, (tq, tk, tv, td))


def _probe_fab_batch_gqa_oob():
    """_probe_fab_batch_gqa_oob() -> int or None  (private: the probe of the defect
    registry's ``fab-batch-gqa-oob``)

    Does this ggml's FLASH_ATTN_BACK kernel still write past its result for
    ne3 > 1 with kvne2 < ne2? Builds the seed's node for D=16, N=M=6, ne2=4,
    kvne2=2, ne3=2 (where upstream segfaults) with its result padded by as many
    bytes again, far more than the kernel's overrun, so the probe stays in
    bounds; computes it on one thread (outside pyggml's graph checks, which
    refuse this node); returns the bytes of padding the kernel wrote (0: fixed).
    """
    if not PYGGML_HAVE_FLASH_ATTN_BACK:
        return None
    cdef int D = 16, N = 6, M = 6, ne2 = 4, kvne2 = 2, ne3 = 2
    rng = np.random.default_rng(0)
    cdef Context ctx = Context(1 << 20)
    cdef Tensor r
    cdef ggml_cgraph * graph
    cdef ggml_cplan plan
    cdef Storage work = None
    try:
        tq = ctx.from_numpy(rng.standard_normal((ne3, ne2, N, D), dtype=np.float32))
        tk = ctx.from_numpy(rng.standard_normal((ne3, kvne2, M, D), dtype=np.float32))
        tv = ctx.from_numpy(rng.standard_normal((ne3, kvne2, D, M), dtype=np.float32))
        td = ctx.from_numpy(rng.standard_normal((ne3, ne2, N, D), dtype=np.float32))
        _need_seed_shapes(tq, tk, tv, td)
        end = flash_attn_back_offsets(tq, tk, tv)[3]
        r = _fab_node(ctx, tq, tk, tv, td, False, end // 4)
        r.numpy()[:] = 0
        ctx._reserve(ggml_graph_overhead_custom(16, False), "the probe's graph")
        graph = ggml_new_graph_custom(ctx.ptr, 16, False)
        ggml_build_forward_expand(graph, r.ptr)
        plan = ggml_graph_plan(graph, 1, NULL)
        # the kernel's own work layout (csrc/fab_work.cpp), not ggml_graph_plan's figure
        work = Storage(max(plan.work_size, pyggml_graph_fab_work_bytes(graph, 1)))
        plan.work_data = <uint8_t *>work.ptr
        with nogil:
            ggml_graph_compute(graph, &plan)
        return int(np.count_nonzero(r.numpy()[end // 4:])) * 4
    finally:
        ctx.close()


# Measured once, at import: a ggml whose kernel no longer writes past its result for
# batch + GQA (a fixed release, or a tree patched by scripts/patch_upstream.py) gets such
# nodes computed instead of refused. Bytes the kernel wrote past; None without the op.
FAB_BATCH_GQA_OVERRUN = _probe_fab_batch_gqa_oob()
pyggml_set_fab_batch_gqa_fixed(FAB_BATCH_GQA_OVERRUN == 0)
