"""pyggml's blocked attention backward (csrc/attn_blocked.c): against the float64
reference over the issue's sweep, with and without the forward's saved statistics, on
both code paths (AVX2+FMA and portable C), bitwise deterministic across runs and thread
counts, next to ggml's FLASH_ATTN_BACK kernel, and as a graph node."""

import os

import numpy as np
import pytest

import pyggml
from pyggml import Type, _attn, reference
from pyggml.errors import ArgumentError, GGMLTypeError, KernelPreconditionError

NMSE_MAX = 1e-7
D_SIZES = [1, 3, 17, 64, 80, 128, 256]
NM = [(1, 1), (7, 7), (5, 9), (33, 47), (65, 130)]
HEADS = [(4, 4, "tile"), (4, 2, "tile"), (4, 2, "group"), (3, 1, "tile")]


def make(rng, B, H, KVH, N, M, D):
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    return f(B, H, N, D), f(B, KVH, M, D), f(B, KVH, M, D), f(B, H, N, D)


def forward64(q, k, v, masked, mapping, scale=None):
    """O and the per-row log-sum-exp, in float64 (what a forward pass would save)."""
    B, H, N, D = q.shape
    KVH, M = k.shape[1], k.shape[2]
    scale = 1 / np.sqrt(D) if scale is None else scale
    idx = [h % KVH if mapping == "tile" else h // (H // KVH) for h in range(H)]
    kh, vh = k[:, idx].astype(np.float64), v[:, idx].astype(np.float64)
    s = scale * q.astype(np.float64) @ kh.swapaxes(-1, -2)
    if masked:
        s = np.where(np.arange(M)[None, :] > (M - N) + np.arange(N)[:, None], -np.inf, s)
    m = s.max(-1, keepdims=True)
    lse = (m + np.log(np.exp(s - m).sum(-1, keepdims=True)))[..., 0]
    o = np.exp(s - lse[..., None]) @ vh
    return o.astype(np.float32), lse.astype(np.float32)


def close(g, r, scale):
    """NMSE within bound; where the true gradient is exactly zero (one visible key: the
    softmax is constant), NMSE is undefined: then the values must be float32 rounding
    of the gradients' own size (``scale``: max |dv| * sqrt(D); a float32 lse and O give
    a d.O that differs from d.v in the last bits)."""
    if not np.any(r):
        return float(np.max(np.abs(g))) <= 2e-7 * scale
    return reference.nmse(g, r) <= NMSE_MAX


def test_the_fma_peak_is_measured_on_each_path_the_cpu_has():
    """pyggml._attn.fma_peak: the benchmarks' ceiling, measured. A path the CPU lacks (and the
    portable one) has none; a path it has gives a rate between 1 GFLOP/s and what 2 FMA
    pipes of its width could do at 6 GHz (a wrong flop count per round falls outside)."""
    lanes = {"avx2": 8, "avx512": 16}
    try:
        have = {name: _attn.set_isa(name) == name for name in lanes}
    finally:
        _attn.set_isa("auto")
    assert _attn.fma_peak("portable") is None
    for name, width in lanes.items():
        rate = _attn.fma_peak(name, seconds=0.05, repeat=3)
        if not have[name]:
            assert rate is None
            continue
        assert 1.0 < rate < 2 * 2 * width * 6.0, (name, rate)
    assert (_attn.fma_peak("auto", 0.05, 1) is None) == (_attn.set_isa("auto") == "portable")
    with pytest.raises(ArgumentError, match="fma_peak: isa"):
        _attn.fma_peak("sse2")
    with pytest.raises(ArgumentError, match="fma_peak: seconds"):
        _attn.fma_peak("auto", seconds=0)


def test_the_tile_rate_is_measured_on_the_path_in_use():
    """pyggml._attn.tile_rate: the kernel's five products of one tile step, in cache (the
    ceiling the benchmark puts the whole kernel against): a rate between 0.1 GFLOP/s and
    what 2 FMA pipes of 16 lanes could do at 6 GHz (a wrong flop count per step falls
    outside), on every path; bad arguments named."""
    try:
        for name in ("portable", "avx2", "avx512"):
            _attn.set_isa(name)
            for D in (8, 64, 100):
                assert 0.1 < _attn.tile_rate(D, seconds=0.02, repeat=2) < 2 * 2 * 16 * 6.0, (name, D)
    finally:
        _attn.set_isa("auto")
    for bad in (0, 1025, 64.0, "64"):
        with pytest.raises(ArgumentError, match="tile_rate: D"):
            _attn.tile_rate(bad)
    with pytest.raises(ArgumentError, match="tile_rate: seconds"):
        _attn.tile_rate(64, repeat=0)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("H, KVH, mapping", HEADS)
@pytest.mark.parametrize("N, M", NM)
@pytest.mark.parametrize("D", D_SIZES)
def test_blocked_kernel_agrees_with_float64(D, N, M, H, KVH, mapping, masked):
    rng = np.random.default_rng(D * 1000 + N * 10 + M)
    q, k, v, d = make(rng, 2, H, KVH, N, M, D)
    ref = reference.attention_backward(q, k, v, d, masked=masked, mapping=mapping)
    got = pyggml.attention_backward(q, k, v, d, masked=masked, mapping=mapping, n_threads=2)
    for name, g, r in zip("qkv", got, ref):
        assert g.shape == r.shape and g.dtype == np.float32
        assert reference.nmse(g, r) <= NMSE_MAX, f"d{name}"
    # with the forward's saved statistics: the same gradients without recomputing them
    o, lse = forward64(q, k, v, masked, mapping)
    saved = pyggml.attention_backward(q, k, v, d, masked=masked, mapping=mapping, lse=lse, o=o, n_threads=2)
    size = max(1.0, float(np.max(np.abs(ref[2])))) * np.sqrt(D)
    for name, g, r in zip("qkv", saved, ref):
        assert close(g, r, size), f"d{name} with lse"


@pytest.mark.parametrize("scale", [0.05, 1.0, 2.5])
def test_any_scale_and_more_keys_than_queries(scale):
    rng = np.random.default_rng(1)
    q, k, v, d = make(rng, 1, 2, 2, 9, 4, 16)          # M < N: fine unmasked
    ref = reference.attention_backward(q, k, v, d, scale=scale)
    got = pyggml.attention_backward(q, k, v, d, scale=scale)
    assert max(reference.nmse(g, r) for g, r in zip(got, ref)) <= NMSE_MAX
    with pytest.raises(ValueError, match="M=4 keys must be >= N=9"):
        pyggml.attention_backward(q, k, v, d, masked=True)


def test_bitwise_deterministic_across_runs_and_thread_counts():
    rng = np.random.default_rng(2)
    for B, H, KVH in [(2, 8, 2), (1, 6, 3), (3, 4, 4)]:
        q, k, v, d = make(rng, B, H, KVH, 70, 97, 40)
        first = pyggml.attention_backward(q, k, v, d, masked=True, n_threads=1)
        for n in (1, 2, 3, 4):
            for _ in range(2):
                again = pyggml.attention_backward(q, k, v, d, masked=True, n_threads=n)
                assert all(np.array_equal(a, b) for a, b in zip(first, again)), (B, H, KVH, n)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("B, H, KVH", [(1, 1, 1), (1, 2, 1), (1, 3, 3), (3, 1, 1)])
@pytest.mark.parametrize("N, M", [(200, 600), (600, 600)])
def test_few_heads_split_in_chunks_the_same_bits_on_any_thread_count(B, H, KVH, masked, N, M):
    """Fewer than 4 query heads in all (split mode): every head is shared by the threads in
    fixed chunks, with saved statistics of key blocks (each chunk with its own dQ partial),
    without them of query blocks (each with its own dK/dV partials: the kept S/dP tiles
    need a query block's every key block), summed in chunk order: exact against float64,
    the same bits on 1 to 4 threads, and as a graph node (one thread there, the same
    chunks). 600 keys or queries: 10 blocks, 8 chunks of 1 or 2."""
    rng = np.random.default_rng(B * 100 + H * 10 + KVH + N)
    q, k, v, d = make(rng, B, H, KVH, N, M, 40)
    ref = reference.attention_backward(q, k, v, d, masked=masked)
    first = pyggml.attention_backward(q, k, v, d, masked=masked, n_threads=1)
    assert all(reference.nmse(g, r) <= NMSE_MAX for g, r in zip(first, ref))
    o, lse = forward64(q, k, v, masked, "tile")
    saved = pyggml.attention_backward(q, k, v, d, masked=masked, lse=lse, o=o, n_threads=1)
    for n in (2, 3, 4):
        again = pyggml.attention_backward(q, k, v, d, masked=masked, n_threads=n)
        assert all(np.array_equal(a, b) for a, b in zip(first, again)), n
        again = pyggml.attention_backward(q, k, v, d, masked=masked, lse=lse, o=o, n_threads=n)
        assert all(np.array_equal(a, b) for a, b in zip(saved, again)), n
    with pyggml.Context(64 << 20) as ctx:
        tq, tk, tv, td = _tensors(ctx, q, k, v, d)
        grads = pyggml.attention_backward_node(ctx, tq, tk, tv, td, masked=masked)
        g = pyggml.Graph(ctx)
        for t in grads:
            g.build_forward_expand(t)
        g.compute(2)
        assert all(np.array_equal(t.numpy(), w) for t, w in zip(grads, first))


def test_where_the_helper_threads_start_changes_no_bit():
    """The numpy call starts its helper threads on the CPUs other than the caller's (Linux;
    a benchmark hook turns it off): the same bits either way, and a caller pinned to one CPU
    (no other CPU to start them on) still runs them, where it is."""
    rng = np.random.default_rng(5)
    q, k, v, d = make(rng, 1, 1, 1, 300, 300, 64)
    first = pyggml.attention_backward(q, k, v, d, masked=True, n_threads=1)
    try:
        for on in (False, True):
            assert _attn._set_start_elsewhere(on) is (not on)
            for n in (2, 3):
                again = pyggml.attention_backward(q, k, v, d, masked=True, n_threads=n)
                assert all(np.array_equal(a, b) for a, b in zip(first, again)), (on, n)
    finally:
        _attn._set_start_elsewhere(True)
    if hasattr(os, "sched_setaffinity"):
        mask = os.sched_getaffinity(0)
        try:
            os.sched_setaffinity(0, {min(mask)})
            again = pyggml.attention_backward(q, k, v, d, masked=True, n_threads=2)
            assert all(np.array_equal(a, b) for a, b in zip(first, again))
        finally:
            os.sched_setaffinity(0, mask)


def test_every_code_path_agrees_and_the_vector_paths_bit_for_bit():
    rng = np.random.default_rng(3)
    q, k, v, d = make(rng, 2, 4, 2, 33, 65, 17)
    ref = reference.attention_backward(q, k, v, d, masked=True)
    got = {}
    try:
        for name in ("portable", "avx2", "avx512"):
            used = _attn.set_isa(name)
            got[used] = pyggml.attention_backward(q, k, v, d, masked=True, n_threads=2)
    finally:
        assert _attn.set_isa("auto") in ("portable", "avx2", "avx512")
    assert "portable" in got
    for name, grads in got.items():
        assert all(reference.nmse(g, r) <= NMSE_MAX for g, r in zip(grads, ref)), name
    if "avx2" in got and "avx512" in got:      # the same float operations in the same order
        assert all(np.array_equal(a, b) for a, b in zip(got["avx2"], got["avx512"]))
    with pytest.raises(ArgumentError, match="set_isa"):
        _attn.set_isa("sse2")


@pytest.mark.parametrize("isa", ["portable", "auto"])
def test_keeping_the_statistics_tiles_gives_the_bits_of_computing_them_again(isa):
    """Without saved statistics, group and head modes keep each query block's S and dP
    tiles from the statistics sweep for the backward (10 N M D flops instead of 14): the
    same elements summed in the same order, so the bits of the sweep that computes them
    again, on every path, layout, mask and thread count (head mode: GQA, 2 or 3 threads
    over 3 or 2 kv groups), and in the graph node."""
    rng = np.random.default_rng(11)
    shapes = [(1, 4, 4, 64, 64, 64), (2, 4, 2, 70, 70, 64), (1, 6, 3, 200, 200, 128), (2, 3, 1, 65, 191, 17),
              (1, 4, 4, 5, 300, 16), (1, 8, 2, 129, 300, 72), (3, 2, 2, 33, 65, 8)]
    try:
        _attn.set_isa(isa)
        for B, H, KVH, N, M, D in shapes:
            q, k, v, d = make(rng, B, H, KVH, N, M, D)
            for masked in (False, True):
                for mapping in ("tile", "group"):
                    for n in (1, 2, 3):
                        run = lambda: pyggml.attention_backward(q, k, v, d, masked=masked, mapping=mapping,  # noqa: E731
                                                                n_threads=n)
                        assert _attn._set_panels(True)
                        kept = run()
                        assert _attn._set_panels(False)
                        again = run()
                        assert not _attn._set_panels(True)
                        assert all(np.array_equal(a, b) for a, b in zip(kept, again)), (B, H, KVH, N, M, D, masked, n)
        ref = reference.attention_backward(q, k, v, d, masked=True)
        assert all(reference.nmse(g, r) <= NMSE_MAX for g, r in zip(kept, ref))
    finally:
        _attn._set_panels(True)
        _attn.set_isa("auto")


@pytest.mark.parametrize("masked", [False, True])
def test_agrees_with_ggmls_kernel(masked):
    rng = np.random.default_rng(4)
    q, k, v, d = make(rng, 1, 4, 2, 48, 64, 64)
    blocked = pyggml.attention_backward(q, k, v, d, masked=masked)
    ggml = pyggml.attention_backward(q, k, v, d, masked=masked, kernel="ggml")
    for b, g in zip(blocked, ggml):
        assert reference.nmse(b, g) < 1e-10


def test_arguments_are_checked_before_the_kernel_runs():
    rng = np.random.default_rng(5)
    q, k, v, d = make(rng, 1, 2, 2, 4, 6, 8)
    o, lse = forward64(q, k, v, False, "tile")
    with pytest.raises(ValueError, match="lse must have q's shape without D"):
        pyggml.attention_backward(q, k, v, d, lse=lse[..., :3], o=o)
    with pytest.raises(TypeError, match="lse must be float32"):
        pyggml.attention_backward(q, k, v, d, lse=lse.astype(np.float64), o=o)
    with pytest.raises(ArgumentError, match="scale must be finite"):
        pyggml.attention_backward(q, k, v, d, scale=0.0)
    with pytest.raises(ArgumentError, match="n_threads"):
        pyggml.attention_backward(q, k, v, d, n_threads=0)
    # the thin wrapper's own checks (it never hands the kernel a bad array)
    with pytest.raises(ArgumentError, match="C-contiguous"):
        _attn.blocked_backward(np.asfortranarray(q), k, v, d, None, None, 0.5, False, 0, 1)
    with pytest.raises(GGMLTypeError, match="masked must be a bool"):
        _attn.blocked_backward(q, k, v, d, None, None, 0.5, 1, 0, 1)
    with pytest.raises(ArgumentError, match="grouping"):
        _attn.blocked_backward(q, k, v, d, None, None, 0.5, False, 2, 1)


# --- as a graph node ---------------------------------------------------------------

def _tensors(ctx, *arrays):
    return [ctx.from_numpy(np.ascontiguousarray(a)) for a in arrays]


@pytest.mark.parametrize("with_lse", [False, True])
@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_the_graph_node_gives_the_kernels_bits(n_threads, with_lse):
    rng = np.random.default_rng(6)
    q, k, v, d = make(rng, 2, 6, 2, 21, 30, 24)
    o, lse = forward64(q, k, v, True, "group", scale=0.3)
    extra = dict(lse=lse, o=o) if with_lse else {}
    want = pyggml.attention_backward(q, k, v, d, masked=True, mapping="group", scale=0.3, **extra)
    with pyggml.Context(16 << 20) as ctx:
        tq, tk, tv, td, tl, to = _tensors(ctx, q, k, v, d, lse, o)
        node_extra = dict(lse=tl, o=to) if with_lse else {}
        dq, dk, dv = pyggml.attention_backward_node(ctx, tq, tk, tv, td, masked=True, mapping="group", scale=0.3,
                                                    **node_extra)
        assert dq.ne == tq.ne and dk.ne == tk.ne and dv.ne == tv.ne
        assert dq.view_src.data_ptr == dk.view_src.data_ptr == dv.view_src.data_ptr
        assert dq.view_src.op == "CUSTOM"
        total = pyggml.sum(ctx, pyggml.add(ctx, dq, td))          # composes with other ops
        g = pyggml.Graph(ctx)
        g.build_forward_expand(total)
        g.build_forward_expand(dk)
        g.build_forward_expand(dv)
        g.compute(n_threads)
        for got, w in zip((dq, dk, dv), want):
            assert np.array_equal(got.numpy(), w)
        assert np.isclose(total.numpy()[0], float(want[0].sum(dtype=np.float64) + d.sum(dtype=np.float64)),
                          rtol=1e-4, atol=1e-3)


# (B, H, KVH, N, M): split mode (fewer than 4 query heads in all), grouped ones among
# them, and head mode (grouped queries over fewer than 4 (batch, kv head) pairs)
SHARED_HEADS = [(1, 1, 1, 300, 300), (1, 2, 1, 200, 330), (1, 3, 1, 130, 200), (1, 8, 2, 70, 90),
                (2, 6, 1, 70, 70)]


@pytest.mark.parametrize("with_lse", [False, True])
@pytest.mark.parametrize("shape", SHARED_HEADS, ids=lambda s: "x".join(map(str, s)))
def test_the_graph_node_shares_a_head_among_its_threads_with_the_kernels_bits(shape, with_lse):
    """Where the numpy call's threads meet at a barrier (split and head mode), the node is
    two: the second (an in-place view of the first) reduces what the first's threads left
    after dv. The bits of the numpy call on 1 to 4 threads, whatever the mapping and mask."""
    B, H, KVH, N, M = shape
    rng = np.random.default_rng(B * 1000 + H * 100 + KVH + N)
    q, k, v, d = make(rng, B, H, KVH, N, M, 24)
    for masked, mapping in ((True, "group"), (False, "tile")):
        o, lse = forward64(q, k, v, masked, mapping, scale=0.3)
        extra = dict(lse=lse, o=o) if with_lse else {}
        want = pyggml.attention_backward(q, k, v, d, masked=masked, mapping=mapping, scale=0.3, n_threads=1,
                                         **extra)
        with pyggml.Context(64 << 20) as ctx:
            tq, tk, tv, td, tl, to = _tensors(ctx, q, k, v, d, lse, o)
            node_extra = dict(lse=tl, o=to) if with_lse else {}
            grads = pyggml.attention_backward_node(ctx, tq, tk, tv, td, masked=masked, mapping=mapping, scale=0.3,
                                                   **node_extra)
            g = pyggml.Graph(ctx)
            for t in grads:
                g.build_forward_expand(t)
            custom = [t for t in g.nodes if t.op == "CUSTOM"]
            assert len(custom) == 2 and custom[1].view_src.data_ptr == custom[0].data_ptr
            assert custom[0].nbytes > _attn.blocked_offsets(tq, tk)[3]       # the scratch after dv
            for n in (1, 2, 3, 4):
                g.compute(n)
                for got, w in zip(grads, want):
                    assert np.array_equal(got.numpy(), w), (masked, n)


def test_the_graph_node_keeps_the_panels_setting_it_was_built_with():
    """Without saved statistics, split mode shares a head by query chunks when the
    statistics sweep keeps its panels (the default) and computes on one thread, as one node,
    when a test turns them off: the node keeps what was set when it was built."""
    rng = np.random.default_rng(8)
    q, k, v, d = make(rng, 1, 1, 1, 200, 200, 16)
    with_panels = pyggml.attention_backward(q, k, v, d, masked=True, n_threads=1)
    try:
        assert _attn._set_panels(False)
        without = pyggml.attention_backward(q, k, v, d, masked=True, n_threads=1)
        assert not all(np.array_equal(a, b) for a, b in zip(with_panels, without))   # other chunks, other bits
        with pyggml.Context(16 << 20) as ctx:
            tq, tk, tv, td = _tensors(ctx, q, k, v, d)
            one = pyggml.attention_backward_node(ctx, tq, tk, tv, td, masked=True)
            assert not _attn._set_panels(True)
            two = pyggml.attention_backward_node(ctx, tq, tk, tv, td, masked=True)
            assert _attn._set_panels(False)
            g = pyggml.Graph(ctx)
            for t in one + two:
                g.build_forward_expand(t)
            assert sum(t.op == "CUSTOM" for t in g.nodes) == 3
            g.compute(3)
            assert all(np.array_equal(t.numpy(), w) for t, w in zip(one, without))
            assert all(np.array_equal(t.numpy(), w) for t, w in zip(two, with_panels))
    finally:
        _attn._set_panels(True)


def test_the_graph_node_runs_on_the_cpu_backend_in_a_backend_buffer():
    rng = np.random.default_rng(7)
    q, k, v, d = make(rng, 1, 2, 1, 8, 8, 16)
    want = pyggml.attention_backward(q, k, v, d, masked=True)
    with pyggml.Backend("CPU", n_threads=2) as cpu, pyggml.Context(1 << 20, no_alloc=True) as ctx:
        ts = [ctx.new_tensor(Type.F32, x.shape[::-1]) for x in (q, k, v, d)]
        grads = pyggml.attention_backward_node(ctx, *ts, masked=True)
        assert cpu.supports_op(grads[0].view_src)
        cpu.alloc_ctx_tensors(ctx)
        for t, x in zip(ts, (q, k, v, d)):
            t.set(x.reshape(t.shape))
        g = pyggml.Graph(ctx)
        for t in grads:
            g.build_forward_expand(t)
        cpu.graph_compute(g)
        for t, w in zip(grads, want):
            assert np.array_equal(t.get().reshape(w.shape), w)


def test_the_graph_node_refuses_what_its_kernel_cannot_read():
    with pyggml.Context(1 << 20) as ctx:
        q, k, v, d = (ctx.new_tensor(Type.F32, (8, 4, 2, 1)) for _ in range(4))
        with pytest.raises(GGMLTypeError, match="F32"):
            pyggml.attention_backward_node(ctx, ctx.new_tensor(Type.F16, (8, 4, 2, 1)), k, v, d)
        qt = pyggml.transpose(ctx, ctx.new_tensor(Type.F32, (4, 8, 2, 1)))
        with pytest.raises(KernelPreconditionError, match="q must be contiguous"):
            pyggml.attention_backward_node(ctx, qt, k, v, d)
        short = ctx.new_tensor(Type.F32, (8, 3, 2, 1))
        with pytest.raises(KernelPreconditionError, match="masked needs M >= N"):
            pyggml.attention_backward_node(ctx, q, short, short, d, masked=True)
        with pytest.raises(ArgumentError, match="lse and o come together"):
            pyggml.attention_backward_node(ctx, q, k, v, d, lse=ctx.new_tensor(Type.F32, (4, 2, 1)))
        with pytest.raises(KernelPreconditionError, match="lse must be"):
            pyggml.attention_backward_node(ctx, q, k, v, d, lse=ctx.new_tensor(Type.F32, (5, 2, 1)), o=q)
        with pytest.raises(KernelPreconditionError, match="H a multiple of KVH"):
            three = ctx.new_tensor(Type.F32, (8, 4, 3, 1))
            pyggml.attention_backward_node(ctx, q, three, three, d)
    with pyggml.Context(1 << 20) as ctx, pyggml.Context(512) as small:
        q, k, v, d = (ctx.new_tensor(Type.F32, (8, 4, 2, 1)) for _ in range(4))
        with pytest.raises(MemoryError):
            pyggml.attention_backward_node(small, q, k, v, d)


def test_a_small_problem_defaults_to_fewer_threads():
    """Not told, the kernel gives each thread at least WORK_PER_THREAD of B*H*N*M*D (half
    of it masked): a thread's start costs more than it saves below that. Told, it uses the
    count given. The bits are the same either way."""
    from pyggml._cpu import DEFAULT_N_THREADS
    W = _attn.WORK_PER_THREAD
    assert W == 1 << 20
    assert _attn.default_threads(1, 1, 128, 128, 64, False) == 1            # 2**20: one thread's worth
    assert _attn.default_threads(1, 1, 128, 128, 64, True) == 1
    assert _attn.default_threads(1, 1, 256, 256, 64, True) == min(2, DEFAULT_N_THREADS)
    assert _attn.default_threads(1, 1, 256, 256, 64, False) == min(4, DEFAULT_N_THREADS)
    assert _attn.default_threads(1, 1, 1, 1, 1, False) == 1
    assert _attn.default_threads(8, 32, 4096, 4096, 128, True) == DEFAULT_N_THREADS
    rng = np.random.default_rng(12)
    q, k, v, d = make(rng, 1, 1, 1, 100, 100, 16)
    alone = pyggml.attention_backward(q, k, v, d, n_threads=1)
    assert all(np.array_equal(a, b) for a, b in zip(alone, pyggml.attention_backward(q, k, v, d)))
