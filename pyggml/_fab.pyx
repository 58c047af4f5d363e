# cython: language_level=3
"""pyggml._fab: what is particular to the seed's FLASH_ATTN_BACK node.

Upstream's ggml_flash_attn_back() begins with GGML_ABORT since commit 1a815669
(2024-05-23), but the CPU kernel for GGML_OP_FLASH_ATTN_BACK still runs. pyggml
builds the node as the seed (upstream's builder just before that commit) did, in C
(csrc/fab_node.c); ``pyggml.flash_attn_back`` is its generated op wrapper (the row
flash_attn_back of ops.txt, impl=pyggml), checked like every other op: the shape
contract by pyggml._prechecks, the kernel's preconditions, including the known batch +
GQA defect, by the FLASH_ATTN_BACK rule of csrc/rules_backward.c. Here: the offsets
of the three gradients in the result, and the probe of that defect.
"""

from libc.stdint cimport int64_t, uint8_t

from pyggml._ggml cimport *
from pyggml._rt cimport *
from pyggml._core cimport Context, Storage, Tensor, arg_tensor

import numpy as np


def flash_attn_back_offsets(q, k, v):
    """flash_attn_back_offsets(q, k, v) -> (offs_q, offs_k, offs_v, end)

    Byte offsets of grad_q, grad_k and grad_v in the result of
    :func:`flash_attn_back`, and its padded end, as the seed computes them:
    each gradient is ``nelements * 4`` bytes, padded to ``GGML_MEM_ALIGN``.
    """
    cdef Tensor tq = arg_tensor(q, "q", "flash_attn_back_offsets")
    cdef Tensor tk = arg_tensor(k, "k", "flash_attn_back_offsets")
    cdef Tensor tv = arg_tensor(v, "v", "flash_attn_back_offsets")
    cdef size_t offs[4]
    pyggml_flash_attn_back_offsets(tq.ptr, tk.ptr, tv.ptr, offs)
    return offs[0], offs[1], offs[2], offs[3]


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
    cdef Tensor r, tq, tk, tv, td
    cdef ggml_cgraph * graph
    cdef ggml_cplan plan
    cdef Storage work = None
    try:
        tq = ctx.from_numpy(rng.standard_normal((ne3, ne2, N, D), dtype=np.float32))
        tk = ctx.from_numpy(rng.standard_normal((ne3, kvne2, M, D), dtype=np.float32))
        tv = ctx.from_numpy(rng.standard_normal((ne3, kvne2, D, M), dtype=np.float32))
        td = ctx.from_numpy(rng.standard_normal((ne3, ne2, N, D), dtype=np.float32))
        end = flash_attn_back_offsets(tq, tk, tv)[3]
        # the node unchecked (its rule refuses it) and padded: shapes known to hold
        ctx._reserve(ggml_tensor_overhead() + 2 * end, "the probe's node")
        r = ctx._adopt(pyggml_flash_attn_back_padded(ctx.ptr, tq.ptr, tk.ptr, tv.ptr, td.ptr, False, end // 4),
                       (tq, tk, tv, td))
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
