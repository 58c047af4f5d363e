"""Both sides of the kernel rules of the [recurrent] family (pyggml/csrc/rules_recurrent.c).

For every refusal: pyggml raises the right class at the op call, and the same node with
the rules off shows what the CPU kernel really does with it (kernel_verdict: "abort" or
"out-of-bounds"; or, where the kernel silently computes something else, its values next
to the reference). The accepted side is the OpInfo samples (pyggml/opinfo/recurrent.py).

Shapes here are numpy order (ggml's ne reversed). Sizes that probe a read past a tensor
are chosen so the read crosses the 16 bytes of slack the guarded proof leaves after it.
"""

import numpy as np
import pytest

import pyggml
from pyggml import Type
from pyggml.opinfo import recurrent as R
from pyggml.opinfo.harness import kernel_verdict, read, rules_disabled
from rules_helpers import refused, compute_unchecked
from conftest import needs_op  # noqa: E402

F32, F16 = np.float32, np.float16


def rand(ctx, shape, dtype=F32, scale=0.5, seed=0):
    rng = np.random.default_rng(seed + int(np.prod(shape)))
    return ctx.from_numpy((rng.standard_normal(shape) * scale).astype(dtype))


def unit(ctx, shape, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    return ctx.from_numpy((x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(F32))


def rows_strided(ctx, shape, dtype=F32):
    """shape (numpy order, >= 2 dims) whose rows are not contiguous (nb[0] > type size):
    the transpose of a tensor made with the two fastest dims swapped."""
    return pyggml.transpose(ctx, rand(ctx, tuple(shape[:-2]) + (shape[-1], shape[-2]), dtype))






def tokens_view(ctx, base, T):
    """A view of base's first T tokens (numpy axis -3, ggml ne[2]); T = 0 gives an empty
    tensor that still has data."""
    ne = list(base.ne)
    ne[2] = T
    return pyggml.view_4d(ctx, base, *ne, base.nb[1], base.nb[2], base.nb[3], 0)


# --- SSM_CONV ---------------------------------------------------------------------------


def _conv(sx=None, c=None):
    def build(ctx):
        return pyggml.ssm_conv(ctx, sx(ctx) if sx else rand(ctx, (2, 3, 6)), c(ctx) if c else rand(ctx, (3, 4)))
    return build


@pytest.mark.parametrize("which", ["sx", "c"])
def test_ssm_conv_takes_f32_only(which):
    build = _conv(**{which: lambda ctx: rand(ctx, (2, 3, 6) if which == "sx" else (3, 4), F16)})
    refused(build, pyggml.GGMLTypeError, f"{which} .src\\d. as F32 only, got f16")
    assert kernel_verdict(build) == "abort"


def test_ssm_conv_sx_rows_must_be_packed():
    def sx(ctx):
        base = rand(ctx, (2, 3, 12))
        return pyggml.view_3d(ctx, base, 6, 3, 2, base.nb[1], base.nb[2], 0)
    refused(_conv(sx=sx), pyggml.KernelPreconditionError, "sx .src0. must have packed rows")
    assert kernel_verdict(_conv(sx=sx)) == "abort"


def test_ssm_conv_c_rows_must_be_packed():
    refused(_conv(c=lambda ctx: rows_strided(ctx, (3, 4))), pyggml.KernelPreconditionError,
            "c .src1. must have packed rows")
    assert kernel_verdict(_conv(c=lambda ctx: rows_strided(ctx, (3, 4)))) == "abort"
    # rows of a strided view (nb[1] twice the row): the kernel reads c as one packed block
    sxv = np.random.default_rng(1).standard_normal((2, 3, 6))
    cv = np.random.default_rng(2).standard_normal((3, 4))

    def build(ctx):
        big = np.zeros((3, 8))
        big[:, :4] = cv
        base = ctx.from_numpy(big.astype(F32))
        return pyggml.ssm_conv(ctx, ctx.from_numpy(sxv.astype(F32)), pyggml.view_2d(ctx, base, 4, 3, base.nb[1], 0))
    refused(build, pyggml.KernelPreconditionError, "c .src1. must have packed rows")
    ref = R._ref_ssm_conv(sxv.astype(F32).astype(float), cv.astype(F32).astype(float))
    out = compute_unchecked(build)
    assert not np.allclose(out.reshape(ref.shape), ref, atol=1e-3)


# --- SSM_SCAN ---------------------------------------------------------------------------


def _scan(s_type=F32, A=None, ids=None, ng=1, nh=2, nt=3, K=1):
    def build(ctx):
        ns = 2 if nt else 1
        s = rand(ctx, (2, nh, 2, 4), s_type)
        if nt:
            x, dt = rand(ctx, (ns, nt, nh, 2)), rand(ctx, (ns, nt, nh))
            B, C = rand(ctx, (ns, nt, ng, 4), seed=1), rand(ctx, (ns, nt, ng, 4), seed=2)
        else:      # no tokens: views of 0 tokens of one sequence
            x = tokens_view(ctx, rand(ctx, (1, 1, nh, 2)), 0)
            dt = pyggml.view_3d(ctx, rand(ctx, (1, 1, nh)), nh, 0, 1, 4 * nh, 4 * nh, 0)
            B = tokens_view(ctx, rand(ctx, (1, 1, ng, 4), seed=1), 0)
            C = tokens_view(ctx, rand(ctx, (1, 1, ng, 4), seed=2), 0)
        idt = ids(ctx) if ids else ctx.from_numpy(np.arange(ns, dtype=np.int32)[::-1].copy())
        A_ = A(ctx) if A else ctx.from_numpy(-np.ones((nh, 1), F32))
        return pyggml.ssm_scan(ctx, s, x, dt, A_, B, C, idt, K)
    return build


@needs_op("ssm_scan")
def test_ssm_scan_takes_f32_only():
    refused(_scan(s_type=F16), pyggml.GGMLTypeError, "s .src0. as F32 only, got f16")
    assert kernel_verdict(_scan(s_type=F16)) == "abort"


@needs_op("ssm_scan")
def test_ssm_scan_needs_unit_element_strides():
    # Mamba-2's A [1, n_head]: contiguous for ggml_is_contiguous whatever its nb[0]
    A = lambda ctx: pyggml.transpose(ctx, ctx.from_numpy(-np.ones((1, 2), F32)))  # noqa: E731
    refused(_scan(A=A), pyggml.KernelPreconditionError, r"A \(src3\) must have nb\[0\] = 4")
    assert kernel_verdict(_scan(A=A)) == "abort"

    def ids(ctx):         # a column of a 2 x 2 matrix: ne (2, 1), nb[0] = 8
        base = ctx.from_numpy(np.array([[1, 9], [0, 9]], np.int32))
        return pyggml.transpose(ctx, pyggml.view_2d(ctx, base, 1, 2, base.nb[1], 0))
    refused(_scan(ids=ids), pyggml.KernelPreconditionError, r"ids \(src6\) must have nb\[0\] = 4")
    assert kernel_verdict(_scan(ids=ids)) == "abort"


@needs_op("ssm_scan")
@pytest.mark.parametrize("ng", [3, 0])
def test_ssm_scan_groups_must_divide_heads(ng):
    refused(_scan(ng=ng), pyggml.KernelPreconditionError, f"must be a multiple of n_group = {ng}")
    assert kernel_verdict(_scan(ng=ng)) == "abort"


@needs_op("ssm_scan")
def test_ssm_scan_with_no_tokens_is_an_upstream_defect():
    refused(_scan(nt=0), pyggml.UpstreamDefect, "with 0 tokens", "recurrent-zero-tokens-state")
    out = compute_unchecked(_scan(nt=0))
    with pyggml.Context(1 << 20) as ctx:
        s0 = rand(ctx, (2, 2, 2, 4)).numpy().copy()
    assert not np.allclose(out, s0[0].reshape(-1))      # the final state should be s[ids[0]] = s[0]


@needs_op("ssm_scan")
def test_ssm_scan_ids_values_are_data_a_rule_cannot_check():
    # what a rule sees of ids: type, shape, nb[0]; its values are read at compute time
    ids = lambda ctx: ctx.from_numpy(np.array([0, 40], np.int32))   # noqa: E731
    with pyggml.Context(1 << 20) as ctx:
        _scan(ids=ids)(ctx)                                # accepted at the op call
    assert kernel_verdict(_scan(ids=ids)) == "out-of-bounds"


@needs_op("ssm_scan")
@pytest.mark.parametrize("no_alloc", [False, True], ids=["pool", "no_alloc"])
def test_ssm_scan_more_snapshots_than_tokens(no_alloc):
    """slot k (1 <= k < K) of the K state snapshots is copied after token n_seq_tokens-1-k,
    its only write: K = 5 over 3 tokens per sequence leaves slots 3 and 4 as the memory
    was. (The issue says "K greater than the tokens": it is the tokens of each sequence,
    x->ne[2], not all of them: 2 sequences of 3 tokens hold 6.)"""
    with pyggml.Context(1 << 20, no_alloc=no_alloc) as ctx:
        s = ctx.new_tensor(Type.F32, (4, 2, 2, 2))
        x, dt = ctx.new_tensor(Type.F32, (2, 2, 3, 2)), ctx.new_tensor(Type.F32, (2, 3, 2))
        B, C = ctx.new_tensor(Type.F32, (4, 1, 3, 2)), ctx.new_tensor(Type.F32, (4, 1, 3, 2))
        A, ids = ctx.new_tensor(Type.F32, (1, 2)), ctx.new_tensor(Type.I32, (2,))
        with pytest.raises(pyggml.KernelPreconditionError,
                           match=r"ssm_scan: SSM_SCAN node refused: K = 5 state snapshots need at least K tokens "
                                 r"per sequence, got n_seq_tokens = 3 \(x->ne\[2\]\).* leaves slots 3\.\.4 "
                                 r"unwritten") as e:
            pyggml.ssm_scan(ctx, s, x, dt, A, B, C, ids, 5)
        assert not isinstance(e.value, pyggml.UpstreamDefect)
        pyggml.ssm_scan(ctx, s, x, dt, A, B, C, ids, 3)          # K = n_seq_tokens: accepted


@needs_op("ssm_scan")
def test_ssm_scan_unwritten_snapshots_keep_what_the_memory_held():
    """rules off, the result filled with NaN first: slots 0..2 hold the reference's states,
    slots 3 and 4 still NaN; K = 3 (nearby, accepted) equals the reference everywhere"""
    rng = np.random.default_rng(9)
    sv = rng.standard_normal((2, 2, 2, 4)).astype(F32)
    xv, dtv = rng.standard_normal((2, 3, 2, 2)).astype(F32), rng.standard_normal((2, 3, 2)).astype(F32)
    Bv, Cv = rng.standard_normal((2, 3, 1, 4)).astype(F32), rng.standard_normal((2, 3, 1, 4)).astype(F32)
    Av, idv = -np.ones((2, 1), F32), np.array([1, 0], np.int32)

    def run(K, unchecked):
        from contextlib import nullcontext
        with (rules_disabled() if unchecked else nullcontext()), pyggml.Context(1 << 20) as ctx:
            t = pyggml.ssm_scan(ctx, *(ctx.from_numpy(v) for v in (sv, xv, dtv, Av, Bv, Cv, idv)), K)
            t.numpy()[...] = np.nan
            g = pyggml.Graph(ctx, 16)
            g.build_forward_expand(t)
            g.compute(1)
            return read(t)

    f64 = [v.astype(np.float64) for v in (sv, xv, dtv, Av, Bv, Cv)]
    out = run(5, True)
    want = R._ref_ssm_scan(*f64, idv, 5)
    n_y = xv.size
    snaps = out[n_y:].reshape(5, -1)
    assert np.isnan(snaps[3:]).all() and not np.isnan(snaps[:3]).any()
    np.testing.assert_allclose(out[:n_y + 3 * snaps.shape[1]], want[:n_y + 3 * snaps.shape[1]], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(run(3, False), R._ref_ssm_scan(*f64, idv, 3), rtol=1e-4, atol=1e-5)


# --- RWKV_WKV6, GATED_LINEAR_ATTN, RWKV_WKV7 ----------------------------------------------


def _wkv(op, S=4, H=2, T=4, ns=2, types=None, tf=None, r_tokens=None, zero=False):
    """op's node from k/v/... of T tokens and a state of ns sequences; types: {arg index:
    numpy dtype}."""
    types = types or {}
    n_tok = {"rwkv_wkv6": 6, "gated_linear_attn": 5, "rwkv_wkv7": 7}[op]

    def build(ctx):
        args = []
        for i in range(n_tok):
            dt = types.get(i, F32)
            if (op == "rwkv_wkv6" and i == 5) or (op == "gated_linear_attn" and i == 4) or (op == "rwkv_wkv7" and i == 6):
                args.append(rand(ctx, (ns, S * S * H), dt, seed=i))
            elif op == "rwkv_wkv6" and i == 3:
                args.append(tf(ctx) if tf else rand(ctx, (H, S), dt, seed=i))
            elif op == "rwkv_wkv7" and i == 0 and r_tokens is not None:
                args.append(rand(ctx, (r_tokens, H, S), dt, seed=i))
            elif zero:
                args.append(tokens_view(ctx, rand(ctx, (1, H, S), dt, seed=i), 0))
            else:
                args.append(rand(ctx, (T, H, S), dt, seed=i))
        if op == "gated_linear_attn":
            args.append(0.5)
        return getattr(pyggml, op)(ctx, *args)
    return build


WKV_OPS = ["rwkv_wkv6", "gated_linear_attn", "rwkv_wkv7"]


def _S(op):
    return 64 if op == "rwkv_wkv7" else 4      # a head size every SIMD build of WKV7 takes


@pytest.mark.parametrize("op", WKV_OPS)
@pytest.mark.parametrize("which", [0, 1])
def test_wkv_ops_take_f32_only(op, which):
    build = _wkv(op, S=_S(op), types={which: F16})
    refused(build, pyggml.GGMLTypeError, "as F32 only, got f16")
    # src0 F16: the type switch aborts; another F16 source is read as floats, past its end
    assert kernel_verdict(build) == ("abort" if which == 0 else "out-of-bounds")


@pytest.mark.parametrize("op", WKV_OPS)
@pytest.mark.parametrize("T, ns, verdict", [(3, 2, "out-of-bounds"), (1, 2, "abort"), (2, 0, "abort")])
def test_wkv_ops_need_whole_sequences(op, T, ns, verdict):
    build = _wkv(op, S=_S(op), H=1, T=T, ns=ns)
    refused(build, pyggml.UpstreamDefect, f"n_tokens = {T} must be a multiple of n_seqs = {ns}",
            "wkv-tokens-per-seq-oob")
    assert kernel_verdict(build) == verdict


@pytest.mark.parametrize("op", WKV_OPS)
def test_wkv_ops_with_no_tokens_are_an_upstream_defect(op):
    build = _wkv(op, S=_S(op), H=1, ns=1, zero=True)
    refused(build, pyggml.UpstreamDefect, "with 0 tokens", "recurrent-zero-tokens-state")
    out = compute_unchecked(build)
    with rules_disabled(), pyggml.Context(1 << 20) as ctx:       # the state the result should hold
        state = build(ctx).src[{"rwkv_wkv6": 5, "gated_linear_attn": 4, "rwkv_wkv7": 6}[op]].numpy().copy()
    assert not np.allclose(out.reshape(-1), state.reshape(-1))


def test_wkv6_tf_must_hold_one_value_per_head_channel():
    S, H = 8, 4
    small = _wkv("rwkv_wkv6", S=S, H=H, tf=lambda ctx: rand(ctx, (1, 1)))
    refused(small, pyggml.KernelPreconditionError, r"tf \(src3\) must hold S\*H = 32 values")
    assert kernel_verdict(small) == "out-of-bounds"
    # more values than S*H: the kernel reads the first S*H, whatever the rest say
    tails = [np.zeros((2, H, S), F32), np.ones((2, H, S), F32)]
    outs = []
    for tail in tails:
        tail[0] = 0.25
        big = _wkv("rwkv_wkv6", S=S, H=H, tf=lambda ctx, tail=tail: ctx.from_numpy(tail))
        refused(big, pyggml.KernelPreconditionError, r"tf \(src3\) must hold S\*H = 32 values")
        outs.append(compute_unchecked(big))
    np.testing.assert_array_equal(outs[0], outs[1])


def test_wkv7_r_must_have_the_shape_of_k():
    build = _wkv("rwkv_wkv7", S=64, H=1, T=4, ns=2, r_tokens=2)
    refused(build, pyggml.KernelPreconditionError, r"r \(src0\) must have k's shape")
    assert kernel_verdict(build) == "out-of-bounds"


@pytest.mark.parametrize("S", [4, 32])
def test_wkv7_head_size_and_the_simd_step(S):
    build = _wkv("rwkv_wkv7", S=S, H=2, T=2, ns=1)
    try:
        with pyggml.Context(32 << 20) as ctx:
            build(ctx)
    except pyggml.UpstreamDefect as e:           # a SIMD build: the loop runs in whole steps
        assert e.defect == "wkv7-simd-tail-oob"
        assert kernel_verdict(build) == "out-of-bounds"
        return
    # a build whose WKV7 kernel runs the scalar loop: any head size is right
    info = next(i for i in R.OPINFOS if i.op == "rwkv_wkv7")
    with pyggml.Context(32 << 20) as ctx:
        args = [read(s) for s in build(ctx).src[:7]]
    args[6] = args[6].reshape(1, -1)        # the state of the one sequence (ne (S*S*H, 1))
    out = compute_unchecked(build)
    assert np.allclose(out, info.ref(*args), atol=1e-5)


# --- GATED_DELTA_NET --------------------------------------------------------------------


def _gdn(S=8, H=2, T=3, ns=1, q=None, k=None, g=None, beta=None, K=1):
    """q/k/g/beta: numpy shapes overriding the right ones."""
    def build(ctx):
        qs = q or (ns, T, H, S)
        ks = k or (ns, T, H, S)
        gs = g or (ns, T, H, 1)
        bs = beta or (ns, T, H, 1)
        return pyggml.gated_delta_net(ctx, unit(ctx, qs, 1), unit(ctx, ks, 2), rand(ctx, (ns, T, H, S), seed=3),
                                      ctx.from_numpy(-np.full(gs, 0.1, F32)), ctx.from_numpy(np.full(bs, 0.5, F32)),
                                      rand(ctx, (ns, H, S, S), seed=4), K)
    return build


@pytest.mark.parametrize("which", ["q", "k"])
@pytest.mark.parametrize("shape, match, verdict", [
    ((1, 3, 2, 4), "S_v = 8 values per row and n_tokens = 3 tokens", "out-of-bounds"),   # rows of 4 < S_v
    ((1, 2, 2, 8), "S_v = 8 values per row and n_tokens = 3 tokens", "out-of-bounds"),   # 2 tokens < 3
    ((1, 3, 0, 8), r"has no heads \(ne\[1\] = 0\)", "abort"),                             # iv1 % 0
])
def test_gated_delta_net_q_k_shapes(which, shape, match, verdict):
    build = _gdn(**{which: shape})
    refused(build, pyggml.KernelPreconditionError, f"{which} .src[01]. (must have )?{match}")
    assert kernel_verdict(build) == verdict


@pytest.mark.parametrize("which", ["q", "k"])
def test_gated_delta_net_q_k_longer_rows_are_truncated(which):
    # rows of 12 for S_v = 8: the kernel dots the first 8 values, the rest never count
    def build(tail):
        def b(ctx):
            x = np.random.default_rng(5).standard_normal((1, 3, 2, 12)).astype(F32)
            x[..., 8:] = tail
            t = _gdn()(ctx)
            srcs = list(t.src[:6])
            srcs["qk".index(which)] = ctx.from_numpy(x)
            return pyggml.gated_delta_net(ctx, *srcs, 1)
        return b
    refused(build(0.0), pyggml.KernelPreconditionError, "S_v = 8 values per row")
    np.testing.assert_array_equal(compute_unchecked(build(0.0)), compute_unchecked(build(7.0)))


@pytest.mark.parametrize("ns, q_ns, verdict", [(3, 2, "out-of-bounds"), (1, 2, "abort")])
def test_gated_delta_net_q_sequences_must_divide_v_sequences(ns, q_ns, verdict):
    build = _gdn(ns=ns, q=(q_ns, 3, 2, 8), k=(q_ns, 3, 2, 8))
    refused(build, pyggml.KernelPreconditionError, f"sequences .ne.3. = {q_ns}. must divide v's n_seqs = {ns}")
    assert kernel_verdict(build) == verdict


@pytest.mark.parametrize("which, shape", [
    ("g", (1, 8, 1, 1)),         # one head for v's 2
    ("g", (1, 2, 2, 1)),         # 2 tokens for v's 8
    ("beta", (1, 8, 1, 1)),
    ("beta", (1, 8, 2, 1)),      # one sequence for v's 2 (ns below)
])
def test_gated_delta_net_g_beta_must_match_v(which, shape):
    ns = 2 if shape == (1, 8, 2, 1) else 1
    build = _gdn(S=4, T=8, ns=ns, **{which: shape})
    refused(build, pyggml.KernelPreconditionError, f"{which} .src[34]. must have v's heads, tokens and sequences")
    assert kernel_verdict(build) == "out-of-bounds"


@pytest.mark.parametrize("K", [2**31, 2**32 + 1, -2**31 - 1])
@pytest.mark.parametrize("no_alloc", [False, True], ids=["pool", "no_alloc"])
def test_gated_delta_net_K_must_fit_its_int32_op_param(K, no_alloc):
    """ggml_gated_delta_net sizes the result with the int64 K and stores (int32_t) K for
    the kernel: 2**32 + 1 would run as K = 1 over a result sized for 2**32 + 1 snapshots,
    2**31 as K = -2**31 (the kernel's GGML_ASSERT(K >= 1), outside any guard)"""
    with pyggml.Context(1 << 20, no_alloc=no_alloc) as ctx:
        q, k, v = (ctx.new_tensor(Type.F32, (8, 2, 3, 1)) for _ in range(3))
        g, beta = ctx.new_tensor(Type.F32, (1, 2, 3, 1)), ctx.new_tensor(Type.F32, (1, 2, 3, 1))
        state = ctx.new_tensor(Type.F32, (8, 8, 2, 1))
        with pytest.raises(pyggml.ArgumentError, match=rf"gated_delta_net: K must be in \[-2\*\*31, 2\*\*31 - 1\] "
                                                       rf"\(ggml keeps it in an int32 op param\), got {K}"):
            pyggml.gated_delta_net(ctx, q, k, v, g, beta, state, K)


def test_gated_delta_net_a_K_that_fits_still_computes():
    """nearby: K = 3 snapshots over 3 tokens, against the reference"""
    build = _gdn(T=3, K=3)
    with pyggml.Context(32 << 20) as ctx:
        t = build(ctx)
        srcs = [read(s).reshape(tuple(reversed(s.ne))) for s in t.src[:6]]
        g = pyggml.Graph(ctx, 16)
        g.build_forward_expand(t)
        g.compute(1)
        out = read(t)
    want = R._ref_gated_delta_net(*srcs, 3)
    np.testing.assert_allclose(out.reshape(-1), np.asarray(want).reshape(-1), rtol=1e-4, atol=1e-5)


# --- LIGHTNING_INDEXER ------------------------------------------------------------------


_LI = [((1, 3, 2, 8), F32), ((1, 4, 1, 8), F32), ((1, 1, 3, 2), F32), ((1, 1, 3, 4), F16)]


def _li(strided=None, k=None):
    def build(ctx):
        args = []
        for i, (shape, dt) in enumerate(_LI):
            if i == 1 and k is not None:
                args.append(k(ctx))
            elif i == strided and i == 1:      # k [8, 1, 4]: its rows walk with a stride of 16 bytes
                args.append(pyggml.permute(ctx, rand(ctx, (1, 1, 8, 4), dt), 2, 0, 1, 3))
            elif i == strided:
                args.append(rows_strided(ctx, shape, dt))
            else:
                args.append(rand(ctx, shape, dt, seed=i))
        return pyggml.lightning_indexer(ctx, *args)
    return build


def test_lightning_indexer_k_needs_a_conversion_to_f32():
    build = _li(k=lambda ctx: ctx.from_numpy(np.ones((1, 4, 1, 8), np.int32)))
    refused(build, pyggml.GGMLTypeError, r"cannot convert k \(src1\) of type i32")
    assert kernel_verdict(build) == "abort"


@pytest.mark.parametrize("which, name", [(0, "q"), (1, "k"), (2, "weights"), (3, "the mask")])
def test_lightning_indexer_rows_must_be_contiguous(which, name):
    refused(_li(strided=which), pyggml.KernelPreconditionError, f"{name} .src{which}. must have contiguous rows")
    assert kernel_verdict(_li(strided=which)) == "abort"


def test_lightning_indexer_k_rows_of_part_of_a_block():
    rng = np.random.default_rng(7)
    kv = rng.standard_normal((4, 32)).astype(F32)
    qv = rng.standard_normal((1, 2, 1, 16)).astype(F32)

    def build(ctx):
        k = ctx.from_numpy(pyggml.quantize(Type.Q8_0, kv), type=Type.Q8_0)      # ne (32, 4)
        half = pyggml.view_4d(ctx, k, 16, 1, 4, 1, k.nb[1], k.nb[1], 4 * k.nb[1], 0)
        return pyggml.lightning_indexer(ctx, ctx.from_numpy(qv), half, ctx.from_numpy(np.ones((1, 1, 2, 1), F32)),
                                        ctx.from_numpy(np.zeros((1, 1, 2, 4), F16)))
    refused(build, pyggml.KernelPreconditionError, "view or reshape needs rows of whole blocks of 32")
    # to_float converts no block of a 16-value row: the kernel dots q with a row it never wrote
    kd = pyggml.dequantize(Type.Q8_0, pyggml.quantize(Type.Q8_0, kv), kv.shape)[:, :16].astype(float)
    ref = R._ref_lightning_indexer(qv.astype(float), kd[None, :, None, :], np.ones((1, 1, 2, 1)),
                                   np.zeros((1, 1, 2, 4)))
    out = compute_unchecked(build)
    assert np.abs(ref).max() > 1 and not np.allclose(out.reshape(ref.shape), ref, atol=1e-3)


def _one_head_graph(ctx, op):
    from pyggml.opinfo import registry
    s = next(x for x in registry()[op].samples(np.random.default_rng(0), Type.F32) if "H=1 " in x.name)
    from pyggml.opinfo.harness import _tensor
    args = [_tensor(ctx, a) if hasattr(a, "layout") else a for a in s.args]
    g = pyggml.Graph(ctx)
    g.build_forward_expand(getattr(pyggml, op)(ctx, *args))
    return g


@pytest.mark.parametrize("op", ["rwkv_wkv6", "gated_linear_attn", "rwkv_wkv7"])
def test_more_threads_than_heads_is_refused_where_the_probe_shows_wkv_threads_over_heads(op, monkeypatch):
    """Defect wkv-threads-over-heads (0.9.4: WKV6 and GLA hang, WKV7 computes wrong values on
    more threads than heads): where present, every executor refuses before ggml runs; on
    as many threads as heads, or where absent, the graph computes."""
    from pyggml import defects
    needs_op(op)
    really = defects.present("wkv-threads-over-heads")
    monkeypatch.setitem(defects._PRESENT, "wkv-threads-over-heads", True)
    with pyggml.Context(1 << 22) as ctx:
        g = _one_head_graph(ctx, op)
        with pytest.raises(pyggml.UpstreamDefect, match=r"1 head\(s\).*at most 1 thread") as e:
            g.compute(3)
        assert e.value.defect == "wkv-threads-over-heads"
        cpu = pyggml.Backend("CPU", n_threads=2)
        with pytest.raises(pyggml.UpstreamDefect, match="wkv-threads-over-heads|at most 1 thread"):
            cpu.graph_compute(g)
        g.compute(1)                                       # as many threads as heads
        if not really:                                     # (where ggml has it, this would hang)
            monkeypatch.setitem(defects._PRESENT, "wkv-threads-over-heads", False)
            g.compute(3)                                   # a ggml without the defect
            cpu.graph_compute(g)
        cpu.close()


def test_the_probe_of_wkv_threads_over_heads_agrees_with_the_relation_on_this_ggml():
    """The probe (RWKV_WKV7 on 1 head, 1 against 3 threads) says what the sweep's threads
    relation measures: the same bits on a ggml without the defect."""
    from pyggml import _defect_probes, defects
    needs_op("rwkv_wkv7")
    got = _defect_probes.wkv_threads_over_heads()
    assert got in ("ok", "wrong")
    assert defects.present("wkv-threads-over-heads") == (got == "wrong")
    assert (got == "wrong") == (pyggml.ggml_version() in defects.get("wkv-threads-over-heads").seen_in)
