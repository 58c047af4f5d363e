"""OpInfos of the [recurrent] family: the state-space and linear-attention recurrences
(ssm_conv, ssm_scan, rwkv_wkv6, rwkv_wkv7, gated_linear_attn, gated_delta_net), solve_tri,
lightning_indexer and the DeepSeek-V4 hyper-connection ops.

The references are written from the math each op implements, in numpy order (the
reverse of ggml's ne), one token at a time in float64. Conventions shared by the RWKV
and GLA ops: tokens [S, H, n_tokens] (numpy (T, H, S)), sequence n owning the tokens
n*T/n_seqs .. (n+1)*T/n_seqs - 1, and a state [S*S*H, n_seqs] (numpy (n_seqs, S*S*H))
holding, per head, an S x S matrix; the result [S*H, T + S*n_seqs] stacks the outputs,
then the final states in the state's layout.

None of these ops has a backward pass in ggml (ggml_compute_backward): grad=False.
"""

from __future__ import annotations

import numpy as np

from pyggml._core import Type
from pyggml.opinfo import Arg, OpInfo, Sample
from pyggml.opinfo._common import (FLOATS, SLOW_TO_QUANTIZE, SLOW_WHY, normal, quantized_but, uniform,
                                    unsampled)

# --- ssm_conv ---------------------------------------------------------------------------


def _ref_ssm_conv(sx, c):
    """sx (n_s, d_inner, d_conv - 1 + n_t), c (d_inner, d_conv) -> (n_s, n_t, d_inner): a
    causal depthwise convolution, out[s, t, d] = sum_i sx[s, d, t + i] * c[d, i]."""
    sx = sx.reshape((-1,) + sx.shape[-2:])
    d_conv = c.shape[-1]
    n_t = sx.shape[-1] - d_conv + 1
    out = np.zeros((sx.shape[0], n_t, sx.shape[1]))
    for t in range(n_t):
        out[:, t, :] = np.sum(sx[:, :, t:t + d_conv] * c[None], axis=-1)
    return out


def _ssm_conv_samples(rng, t):
    for n_s, d_inner, d_conv, n_t in ((2, 5, 4, 3), (1, 3, 4, 1), (3, 1, 2, 6), (2, 4, 1, 2), (1, 7, 3, 5)):
        sx = normal(rng, (n_s, d_inner, d_conv - 1 + n_t))
        yield Sample((Arg(sx, t), Arg(normal(rng, (d_inner, d_conv)), t)),
                     f"n_s={n_s} d_inner={d_inner} d_conv={d_conv} n_t={n_t}")
    sx = normal(rng, (4, 2 + 5))                                  # a matrix: one sequence
    yield Sample((Arg(sx, t), Arg(normal(rng, (4, 3)), t)), "2-D sx (one sequence)")


# --- ssm_scan ---------------------------------------------------------------------------


def _softplus(x):
    return np.logaddexp(0.0, x)


def _ref_ssm_scan(s, x, dt, A, B, C, ids, K):
    """Mamba's selective scan. s (slots, n_head, head_dim, d_state): initial states, seq i
    starts from s[ids[i]]; x (n_seqs, n_t, n_head, head_dim); dt (n_seqs, n_t, n_head);
    A (n_head, 1) (Mamba-2: a decay per head) or (n_head, d_state) (Mamba-1); B, C
    (n_seqs, n_t, n_group, d_state), head h using group h // (n_head / n_group).

    Per token: d = softplus(dt), state = state * exp(d * A) + B * (x * d),
    y = state . C. The 1-D result: every y (x's shape, packed), then K state snapshots of
    (n_seqs, n_head, head_dim, d_state): snapshot k is the state after token n_t - 1 - k."""
    ns, nt, nh, hd = x.shape
    ds = s.shape[-1]
    ng = B.shape[2]
    grp = np.arange(nh) // (nh // ng)
    y = np.zeros(x.shape)
    snaps = np.zeros((K, ns, nh, hd, ds))
    for i in range(ns):
        st = s[ids[i]].astype(np.float64).copy()                       # (nh, hd, ds)
        for tt in range(nt):
            d = _softplus(dt[i, tt])                                   # (nh,)
            dA = np.exp(d[:, None] * A)                                # (nh, 1) or (nh, ds)
            Bg = B[i, tt][grp]                                         # (nh, ds)
            Cg = C[i, tt][grp]
            st = st * dA[:, None, :] + Bg[:, None, :] * (x[i, tt] * d[:, None])[:, :, None]
            y[i, tt] = np.einsum("hds,hs->hd", st, Cg)
            k = nt - 1 - tt
            if k < K:
                snaps[k, i] = st
    return np.concatenate([y.reshape(-1), snaps.reshape(-1)])


def _ssm_scan_samples(rng, t):
    def make(ns, nt, nh, hd, ds, ng, slots, ids, K, mamba1=False, layout="contiguous"):
        s = normal(rng, (slots, nh, hd, ds))
        x = normal(rng, (ns, nt, nh, hd))
        dt = normal(rng, (ns, nt, nh)) * 2
        dt.reshape(-1)[0] = 25.0                                        # softplus's linear branch (> 20)
        A = uniform(rng, (nh, ds if mamba1 else 1), -1.0, -0.2)
        B = normal(rng, (ns, nt, ng, ds))
        C = normal(rng, (ns, nt, ng, ds))
        perm = (0, 1, 3, 2)                                             # tokens and sequences swapped
        return (Arg(s, t), Arg(x, t, layout, perm), Arg(dt, t), Arg(A, t), Arg(B, t, layout, perm),
                Arg(C, t, layout, perm), Arg(np.asarray(ids, np.int32), Type.I32), K)

    yield Sample(make(2, 3, 4, 3, 5, 2, 3, [2, 0], 1), "Mamba-2, 2 groups, ids [2, 0]")
    yield Sample(make(2, 4, 4, 2, 4, 4, 2, [1, 1], 3), "Mamba-2, a group per head, K=3 snapshots")
    yield Sample(make(1, 3, 2, 2, 3, 1, 1, [0], 3), "K = n_seq_tokens")
    yield Sample(make(2, 3, 3, 1, 4, 1, 2, [1, 0], 1, mamba1=True), "Mamba-1 (A per state)")
    yield Sample(make(1, 1, 1, 1, 1, 1, 1, [0], 1), "all unit")
    yield Sample(make(2, 3, 4, 2, 3, 2, 2, [0, 1], 2, layout="permuted"), "x, B, C with tokens and seqs swapped")


# --- rwkv_wkv6, gated_linear_attn, rwkv_wkv7 ------------------------------------------


def _seq_state(state, n, H, S):
    return state[n].reshape(H, S, S).astype(np.float64).copy()


def _ref_wkv6(k, v, r, tf, td, state):
    """RWKV-6: per head, a state St (key i, value j). Token t: kv = k_i v_j,
    out_j = sum_i r_i (tf_i kv_ij + St_ij), then St_ij = St_ij td_i + kv_ij."""
    T, H, S = k.shape
    ns = state.shape[0]
    out = np.zeros((T, H, S))
    new = np.zeros((ns, H, S, S))
    for n in range(ns):
        St = _seq_state(state, n, H, S)
        for t in range(n * T // ns, (n + 1) * T // ns):
            kv = k[t][:, :, None] * v[t][:, None, :]
            out[t] = np.einsum("hi,hij->hj", r[t], tf.reshape(H, S)[:, :, None] * kv + St)
            St = St * td[t][:, :, None] + kv
        new[n] = St
    return np.concatenate([out.reshape(T, H * S), new.reshape(ns * S, H * S)])


def _ref_gla(k, v, q, g, state, scale):
    """Gated linear attention: St_ij = St_ij g_i + k_i v_j, out_j = sum_i St_ij q_i scale."""
    T, H, S = k.shape
    ns = state.shape[0]
    out = np.zeros((T, H, S))
    new = np.zeros((ns, H, S, S))
    for n in range(ns):
        St = _seq_state(state, n, H, S)
        for t in range(n * T // ns, (n + 1) * T // ns):
            St = St * g[t][:, :, None] + k[t][:, :, None] * v[t][:, None, :]
            out[t] = np.einsum("hij,hi->hj", St, q[t]) * np.float32(scale)
        new[n] = St
    return np.concatenate([out.reshape(T, H * S), new.reshape(ns * S, H * S)])


def _ref_wkv7(r, w, k, v, a, b, state):
    """RWKV-7: per head, a state St (value i, key j). Token t:
    St = St diag(w) + v k^T + (St a) b^T, out = St r."""
    T, H, S = k.shape
    ns = state.shape[0]
    out = np.zeros((T, H, S))
    new = np.zeros((ns, H, S, S))
    for n in range(ns):
        St = _seq_state(state, n, H, S)
        for t in range(n * T // ns, (n + 1) * T // ns):
            sa = np.einsum("hij,hj->hi", St, a[t])
            St = St * w[t][:, None, :] + v[t][:, :, None] * k[t][:, None, :] + sa[:, :, None] * b[t][:, None, :]
            out[t] = np.einsum("hij,hj->hi", St, r[t])
        new[n] = St
    return np.concatenate([out.reshape(T, H * S), new.reshape(ns * S, H * S)])


# (S, H, tokens per sequence, n_seqs)
_WKV_SHAPES = ((4, 2, 3, 2), (3, 1, 1, 1), (1, 3, 2, 2), (5, 2, 4, 1), (8, 1, 2, 3))


def _wkv6_samples(rng, t):
    for S, H, tps, ns in _WKV_SHAPES:
        T = tps * ns
        tok = lambda: normal(rng, (T, H, S), 0.5)  # noqa: E731
        yield Sample((Arg(tok(), t), Arg(tok(), t), Arg(tok(), t), Arg(normal(rng, (H, S), 0.5), t),
                      Arg(uniform(rng, (T, H, S), 0.6, 1.0), t), Arg(normal(rng, (ns, S * S * H), 0.5), t)),
                     f"S={S} H={H} T={T} n_seqs={ns}")


def _gla_samples(rng, t):
    for S, H, tps, ns in _WKV_SHAPES:
        T = tps * ns
        tok = lambda: normal(rng, (T, H, S), 0.5)  # noqa: E731
        yield Sample((Arg(tok(), t), Arg(tok(), t), Arg(tok(), t), Arg(uniform(rng, (T, H, S), 0.6, 1.0), t),
                      Arg(normal(rng, (ns, S * S * H), 0.5), t), S ** -0.5),
                     f"S={S} H={H} T={T} n_seqs={ns}")


def _wkv7_samples(rng, t):
    # S = 64: the CPU kernel's SIMD path walks heads in blocks of GGML_F32_STEP (up to 64;
    # other head sizes are refused: defect wkv7-simd-tail-oob)
    S = 64
    for H, tps, ns in ((1, 3, 1), (2, 1, 2), (1, 2, 2)):
        T = tps * ns
        tok = lambda: normal(rng, (T, H, S), 0.2)  # noqa: E731
        kappa = normal(rng, (T, H, S))
        kappa /= np.linalg.norm(kappa, axis=-1, keepdims=True)
        yield Sample((Arg(tok(), t), Arg(uniform(rng, (T, H, S), 0.7, 1.0), t), Arg(tok(), t), Arg(tok(), t),
                      Arg(-kappa, t), Arg(kappa * uniform(rng, (T, H, 1), 0.2, 0.8), t),
                      Arg(normal(rng, (ns, S * S * H), 0.2), t)),
                     f"S={S} H={H} T={T} n_seqs={ns}")


# --- gated_delta_net ----------------------------------------------------------------------


def _ref_gated_delta_net(q, k, v, g, beta, state, K):
    """The gated delta rule. q, k (n_seqs_k, T, H_k, S); v (n_seqs, T, H, S); g (n_seqs, T,
    H, 1 or S); beta (n_seqs, T, H, 1); state (n_seqs, H, S, S) with state[n, h, j, i] =
    St[i, j] (key i, value j). Head h reads q/k head h % H_k (tiled), sequence n reads
    q/k sequence n // (n_seqs / n_seqs_k). Per token: St *= exp(g) (g per key i when it
    has S values), delta = (v - St^T k) beta, St += k delta^T, out = St^T q / sqrt(S).
    Result rows: the outputs (n_seqs, T, H, S), then K snapshots (n_seqs, H, S_j, S_i),
    snapshot m the state after token T - 1 - m."""
    ns, T, H, S = v.shape
    Hk, nsk = q.shape[2], q.shape[0]
    scale = 1.0 / np.sqrt(S)
    out = np.zeros((ns, T, H, S))
    snaps = np.zeros((K, ns, H, S, S))
    for n in range(ns):
        nk = n // (ns // nsk)
        for h in range(H):
            hk = h % Hk
            St = state[n, h].T.astype(np.float64).copy()
            for t in range(T):
                St = St * np.exp(g[n, t, h])[:, None]
                qq, kk = q[nk, t, hk], k[nk, t, hk]
                delta = (v[n, t, h] - St.T @ kk) * beta[n, t, h, 0]
                St = St + np.outer(kk, delta)
                out[n, t, h] = St.T @ qq * scale
                m = T - 1 - t
                if m < K:
                    snaps[m, n, h] = St.T
    return np.concatenate([out.reshape(-1, H * S), snaps.reshape(-1, H * S)])


def _gdn_samples(rng, t):
    def make(ns, T, H, S, Hk=None, nsk=None, kda=False, K=1, layout="contiguous"):
        Hk = Hk or H
        nsk = nsk or ns

        def unit(shape):
            x = normal(rng, shape)
            return x / np.linalg.norm(x, axis=-1, keepdims=True)     # l2-normalised, as models feed it
        perm = (0, 2, 1, 3)                                           # heads and tokens swapped
        return (Arg(unit((nsk, T, Hk, S)), t, layout, perm), Arg(unit((nsk, T, Hk, S)), t, layout, perm),
                Arg(normal(rng, (ns, T, H, S)), t, layout, perm),
                Arg(uniform(rng, (ns, T, H, S if kda else 1), -2.0, -0.01), t),
                Arg(uniform(rng, (ns, T, H, 1), 0.0, 1.0), t), Arg(normal(rng, (ns, H, S, S), 0.5), t), K)

    yield Sample(make(1, 3, 2, 4), "scalar gate")
    yield Sample(make(2, 2, 2, 5, kda=True), "KDA gate (per key), 2 seqs")
    yield Sample(make(1, 3, 4, 4, Hk=2), "H_v = 4 over H_k = 2 (tiled)")
    yield Sample(make(2, 2, 2, 3, nsk=1), "2 seqs share q, k")
    yield Sample(make(1, 4, 2, 4, K=3), "K = 3 snapshots")
    yield Sample(make(2, 3, 2, 4, K=3, kda=True), "K = n_tokens, KDA")
    yield Sample(make(2, 3, 2, 4, layout="permuted"), "q, k, v permuted (heads and tokens swapped)")
    yield Sample(make(1, 1, 1, 1), "all unit")


# --- solve_tri --------------------------------------------------------------------------


def _ref_solve_tri(a, b, left, lower, uni):
    """x with tril(a) x = b, by forward substitution (the strict upper triangle of a is
    ignored); batched over the leading dims."""
    L = np.tril(a)
    x = np.zeros(b.shape)
    n = a.shape[-1]
    for i in range(n):
        acc = np.einsum("...t,...tk->...k", L[..., i, :i], x[..., :i, :])
        x[..., i, :] = (b[..., i, :] - acc) / L[..., i, i][..., None]
    return x


def _solve_tri_samples(rng, t):
    for batch, n, k in (((), 5, 3), ((2,), 4, 1), ((2, 3), 3, 2), ((), 1, 4), ((1, 2), 6, 6), ((), 8, 5)):
        a = normal(rng, batch + (n, n), 0.3)
        d = np.arange(n)
        a[..., d, d] = np.sign(a[..., d, d] + 1e-3) * (1.0 + np.abs(a[..., d, d]))   # |diag| >= 1
        yield Sample((Arg(a, t), Arg(normal(rng, batch + (n, k)), t), True, True, False),
                     f"batch {batch} n={n} k={k} (upper triangle non-zero)")


# --- lightning_indexer ------------------------------------------------------------------


def _ref_lightning_indexer(q, k, w, mask):
    """q (ne3, n_batch, n_head, n_embd); k (ne3, n_kv, 1, n_embd); w (ne3, 1, n_batch,
    n_head); mask (ne33, 1, n_batch, n_kv), F16, broadcast over ne3 by tiling ->
    (ne3, 1, n_batch, n_kv): sum_h w[h] relu(q[h] . k) + mask."""
    q4, k4, w4, m4 = (x.reshape((1,) * (4 - x.ndim) + x.shape) for x in (q, k, w, mask))
    qk = np.einsum("sthe,ske->sthk", q4, k4[:, :, 0, :])
    score = np.einsum("sthk,sth->stk", np.maximum(qk, 0.0), w4[:, 0])
    m = np.tile(m4, (q4.shape[0] // m4.shape[0], 1, 1, 1))
    return score[:, None] + m


def _lightning_samples(rng, t):
    n_embd = max(32, t.blck_size) if t.is_quantized else 8      # k's rows: whole blocks

    def make(ne3, n_batch, n_head, n_kv, ne33=1, q_layout="contiguous", strided=False, inf=False):
        mask = np.where(rng.random((ne33, 1, n_batch, n_kv)) < 0.2, -np.inf if inf else -3.0,
                        normal(rng, (ne33, 1, n_batch, n_kv)))
        lay = "strided" if strided else "contiguous"
        return (Arg(normal(rng, (ne3, n_batch, n_head, n_embd)), Type.F32, q_layout, (0, 2, 1, 3)),
                Arg(normal(rng, (ne3, n_kv, 1, n_embd)), t), Arg(normal(rng, (ne3, 1, n_batch, n_head)), Type.F32, lay),
                Arg(mask, Type.F16, lay))

    yield Sample(make(1, 3, 4, 5), "3 queries x 4 heads x 5 keys")
    yield Sample(make(2, 2, 3, 4, ne33=1, inf=True), "2 streams, one mask, -inf entries")
    yield Sample(make(2, 2, 1, 3, ne33=2), "a mask per stream")
    yield Sample(make(1, 4, 2, 3, q_layout="permuted", strided=True), "q permuted, weights and mask strided")
    yield Sample(make(1, 1, 1, 1), "all unit")


# --- dsv4 hyper-connections ---------------------------------------------------------------

_HC = 4


def _ref_hc_comb(mixes, scale, base, eps, n_iter):
    """mixes (n_tokens, (2 + hc) hc), scale (>= 3,), base ((2 + hc) hc,) -> (n_tokens, src,
    dst): logits[src, dst] = mixes[2 hc + dst + hc src] scale[2] + base[...]; softmax over
    dst, + eps; divide by (eps + the sum over src); then n_iter - 1 times over dst and over
    src again."""
    eps = float(np.float32(eps))
    mixes = mixes.reshape(-1, mixes.shape[-1])
    lg = (mixes[:, 2 * _HC:] * scale.reshape(-1)[2] + base.reshape(-1)[2 * _HC:]).reshape(-1, _HC, _HC)
    e = np.exp(lg - lg.max(axis=2, keepdims=True))
    c = e / e.sum(axis=2, keepdims=True) + eps
    c = c / (eps + c.sum(axis=1, keepdims=True))
    for _ in range(1, n_iter):
        c = c / (eps + c.sum(axis=2, keepdims=True))
        c = c / (eps + c.sum(axis=1, keepdims=True))
    return c


def _hc_comb_samples(rng, t):
    dim = (2 + _HC) * _HC
    for n_tokens, n_iter, eps, layout in ((1, 1, 1e-6, "contiguous"), (5, 4, 1e-6, "contiguous"),
                                          (3, 20, 1e-3, "transposed"), (4, 2, 0.0, "strided")):
        mixes = normal(rng, (n_tokens, dim))
        yield Sample((Arg(mixes, t, layout), Arg(uniform(rng, (3,), 0.5, 2.0), t), Arg(normal(rng, (dim,)), t),
                      eps, n_iter), f"{n_tokens} tokens, {n_iter} iterations, eps {eps}, mixes {layout}")


def _ref_hc_pre(x, w):
    """x (n_tokens, hc, n_embd), w (n_tokens, hc) -> (n_tokens, n_embd): sum_h x w."""
    x3 = x.reshape((1,) * (3 - x.ndim) + x.shape)
    return np.einsum("the,th->te", x3, w.reshape(x3.shape[0], x3.shape[1]))


def _hc_pre_samples(rng, t):
    for T, hc, n in ((3, 4, 5), (1, 1, 1), (2, 3, 7)):
        for layout in ("contiguous", "permuted", "strided"):
            yield Sample((Arg(normal(rng, (T, hc, n)), t, layout, (1, 0, 2, 3)),
                          Arg(normal(rng, (T, hc)), t, "transposed" if layout == "permuted" else "contiguous")),
                         f"T={T} hc={hc} n_embd={n} x {layout}")


def _ref_hc_pre_gated(x, gate, scale):
    """x, gate (n_tokens, hc, n_embd) -> (n_tokens, n_embd): scale * sum_h x sigmoid(gate)."""
    x3 = x.reshape((1,) * (3 - x.ndim) + x.shape)
    g3 = gate.reshape(x3.shape)
    return float(np.float32(scale)) * np.sum(x3 / (1.0 + np.exp(-g3)), axis=1)


def _hc_pre_gated_samples(rng, t):
    for T, hc, n in ((3, 4, 5), (1, 1, 1), (2, 3, 7)):
        for layout, scale in (("contiguous", 1.0), ("permuted", 0.5), ("strided", -2.25)):
            yield Sample((Arg(normal(rng, (T, hc, n)), t, layout, (1, 0, 2, 3)),
                          Arg(normal(rng, (T, hc, n), 3.0), t, "strided" if layout == "permuted" else "contiguous"),
                          scale), f"T={T} hc={hc} n_embd={n} x {layout}, scale {scale}")


def _ref_hc_post(x, residual, post, comb):
    """x (n_tokens, n_embd), residual (n_tokens, hc, n_embd), post (n_tokens, hc), comb
    (n_tokens, src, dst) -> (n_tokens, dst, n_embd): x post[dst] + sum_src residual[src]
    comb[src, dst]."""
    T, hc, n = residual.reshape((1,) * (3 - residual.ndim) + residual.shape).shape
    x, residual, post, comb = x.reshape(T, n), residual.reshape(T, hc, n), post.reshape(T, hc), comb.reshape(T, hc, hc)
    return x[:, None, :] * post[:, :, None] + np.einsum("tse,tsd->tde", residual, comb)


def _hc_post_samples(rng, t):
    for T, hc, n in ((3, 4, 5), (1, 1, 1), (2, 3, 6)):
        for layout in ("contiguous", "permuted", "strided"):
            tr = "transposed" if layout == "permuted" else layout
            yield Sample((Arg(normal(rng, (T, n)), t, tr), Arg(normal(rng, (T, hc, n)), t, layout, (1, 0, 2, 3)),
                          Arg(normal(rng, (T, hc)), t, tr), Arg(normal(rng, (T, hc, hc)), t, layout, (1, 0, 2, 3))),
                         f"T={T} hc={hc} n_embd={n} {layout}")


OPINFOS = [
    OpInfo("ssm_conv", ref=_ref_ssm_conv, samples=_ssm_conv_samples),
    OpInfo("ssm_scan", ref=_ref_ssm_scan, samples=_ssm_scan_samples,
           note="ids values are data: out-of-range ids are not refused (no rule can see them); snapshots "
                "beyond n_seq_tokens are never written by the kernel, so samples keep K <= n_seq_tokens"),
    OpInfo("rwkv_wkv6", ref=_ref_wkv6, samples=_wkv6_samples),
    OpInfo("gated_linear_attn", ref=_ref_gla, samples=_gla_samples),
    OpInfo("rwkv_wkv7", ref=_ref_wkv7, samples=_wkv7_samples,
           note="head size 64 only: other sizes are refused on SIMD builds (defect wkv7-simd-tail-oob)"),
    OpInfo("gated_delta_net", ref=_ref_gated_delta_net, samples=_gdn_samples,
           note="snapshot slots beyond n_tokens are caller-owned (ggml.h), so samples keep K <= n_tokens"),
    OpInfo("solve_tri", ref=_ref_solve_tri, samples=_solve_tri_samples),
    OpInfo("lightning_indexer", ref=_ref_lightning_indexer, samples=_lightning_samples,
           types=FLOATS + quantized_but(*SLOW_TO_QUANTIZE), unsampled=unsampled(SLOW_TO_QUANTIZE, SLOW_WHY),
           tol={Type.F16: 1e-7, Type.BF16: 1e-7},
           note="the type is k's (q and weights are F32, the mask F16); the reference sees k as stored, so "
                "every k type is held to F32's bound"),
    OpInfo("dsv4_hc_comb", ref=_ref_hc_comb, samples=_hc_comb_samples),
    OpInfo("dsv4_hc_pre", ref=_ref_hc_pre, samples=_hc_pre_samples),
    OpInfo("dsv4_hc_pre_gated", ref=_ref_hc_pre_gated, samples=_hc_pre_gated_samples,
           note="ggml 0.25.3 on: the per-element gate of DSV4_HC_PRE"),
    OpInfo("dsv4_hc_post", ref=_ref_hc_post, samples=_hc_post_samples),
]
