/* Blocked (FlashAttention-2 style) attention backward on the CPU, float32.  See attn_blocked.h.
 *
 * Notation, per (batch b, query head h) with kv head c(h):
 *   S = scale * Q K^T (N x M), masked entries (j > (M-N)+i) are -inf, P = softmax_rows(S),
 *   O = P V.  Given dO:  dV = P^T dO,  dP = dO V^T,  delta_i = rowsum(dP o P)_i = dO_i . O_i,
 *   dS = P o (dP - delta),  dQ = scale dS K,  dK = scale dS^T Q;  dK, dV of a kv head are summed
 *   over the query heads that use it.
 *
 * ALGORITHM (one query head = "head pass")
 *   0. Copy Q, dO of the head into zero-padded row-major buffers (N x Dp, Dp = D rounded up to 8),
 *      so every vector kernel works on whole 8-float vectors; dQ is accumulated in a padded buffer.
 *      The kv head's K is kept both transposed (KT: D x Mp, Mp = M rounded up to Bc) and padded
 *      (Kp: M x Dp), V transposed (VT: D x Mp); KT and VT are stored per key block, [Mp/Bc][D][Bc],
 *      so a tile's B panel has a 4*Bc-byte row stride (a D x Mp layout with Mp*4 a multiple of
 *      4 KiB made every panel row fall in the same L1 set: ~15% slower).  This is done once per
 *      kv head and shared by the heads of its group.
 *   1. Row statistics lse_i and delta_i.  If lse and o are both given: delta_i = dO_i . O_i
 *      (double accumulation).  Otherwise a forward sweep per query block of Br rows over the
 *      visible key blocks: S tile = Q_blk KT_blk, dP tile = dO_blk VT_blk, and an online
 *      softmax that keeps, per row, the running max m, l = sum exp(s - m) and
 *      u = sum exp(s - m) dP  (rescaled by exp(m_old - m_new)); then lse = m + log l and
 *      delta = u / l  (= sum_j P_ij dP_ij = dO_i . O_i).  Costs 4 N M D flops, no O needed.
 *   2. Backward sweep, key block (Bc keys) outer, query block (Br queries) inner.  For each key
 *      block, dK and dV accumulators (Bc x Dp) live in a thread-local buffer; for each query
 *      block that is not fully masked:
 *         S  = Q_blk KT_blk,  dP = dO_blk VT_blk                 (two GEMMs, inner dim D)
 *         P  = exp(S*scale - lse), masked -> 0;  dS' = scale * P o (dP - delta)   (fused pass)
 *         dV_acc += P^T dO_blk,  dK_acc += dS'^T Q_blk          (inner dim = queries)
 *         dQ_blk += dS' K_blk                                   (inner dim = keys)
 *      Rows of a diagonal tile that see no key of the block are skipped, and only the visible
 *      key columns are computed.  Fully masked tiles are skipped.  After the query loop the
 *      key block's dK/dV rows are written (first head of the group) or added (other heads) to
 *      the output.  10 N M D flops (half when masked).
 *   All five products are one kernel shape, C (+)= A B with B row-major and A read with two
 *   arbitrary strides (so P^T, dS'^T are read in place, no transposes): register-blocked
 *   8 x 32 micro-kernel (16 zmm accumulators, masked loads/stores for an n % 32 tail) with
 *   AVX-512, a 6 x 16 one (12 ymm accumulators) with AVX2/FMA, chosen at run time, and a
 *   portable C version.  exp is a polynomial (Cody-Waite reduction + degree-7 Taylor, < 1 ulp
 *   measured over all floats).  The AVX-512 kernels do per element the same operations in the
 *   same order as the AVX2 ones (GEMM: c = fma(a_p, b_p, c) for p = 0, 1, ...; the row sums of
 *   the statistics pass over 8 lanes), so the two paths give identical bits; 8 x 32 was
 *   measured against 6 x 32 (same speed) and 12 x 32 (~7% slower) on Zen-class AVX-512.
 *
 * THREADING / dQ DESIGN
 *   A head pass owns its dQ (accumulated over key blocks in a fixed order), so dQ never needs a
 *   cross-thread reduction and no recompute pass.  The unit of work is
 *     - group mode (when neither of the two below): a (b, kv head) pair; its heads are processed
 *       in ascending group index g; head g=0 writes dK/dV, heads g>0 add their complete
 *       per-key-block contribution to it, so dK = ((h_0 + h_1) + h_2) + ...  No barrier needed.
 *     - head mode (barrier given, GQA, and too few (b, kv head) pairs to balance the threads):
 *       a (b, h) pair; head g=0 writes dK/dV directly, head g>0 writes its contribution to a
 *       shared partial buffer; after the barrier the threads add the partials to dK/dV, split
 *       over rows, in ascending g -- the same additions in the same order as group mode.
 *     - split mode (B H < PGAB_SPLIT_HEADS query heads in all, whatever the thread count: one
 *       head cannot be shared by group or head mode): every head is computed by all threads
 *       together, its row statistics split by query blocks, its key blocks in PGAB_KCHUNKS
 *       fixed chunks (fewer when there are fewer key blocks), each chunk owned by one thread
 *       (longest work first onto the least-loaded thread: causal chunks differ in work), with a
 *       dQ partial of its own; after a barrier dQ = ((partial_0 + partial_1) + ...) in chunk
 *       order, split by rows.  The chunks depend on the shape only, so one thread computes the
 *       same partials and sums them the same way.  dK/dV of a key block are its owner's alone.
 *       Without saved statistics (PANELS) the chunks are of query blocks instead, and the
 *       partials those of dK/dV (split_head_panels).
 *       Without a barrier (a graph node of one part) one thread does it all, the same way.
 *     - the graph node (attn_node.c), whose threads have no barrier but meet between two
 *       nodes, runs split mode, and head mode where it has fewer than 4 (b, kv head) pairs,
 *       as two nodes: the first does what the threads do before their barrier, the second
 *       the reduction after it (attn_split.c: pyggml_attn_bwd_node_first, _second).
 *   Every float operation on a given output element therefore happens in the same order
 *   regardless of the partition: results are bitwise identical for any thread count, with or
 *   without barrier, and from run to run (static partition, no atomics).
 *
 *   Without saved statistics, 1. and 2. run query block by query block instead (PANELS,
 *   panel_query_block): the S and dP tiles of the statistics sweep are kept and the backward
 *   reuses them, 10 N M D flops instead of 14.  In group and head modes with the same bits as
 *   the recomputing sweep; split mode then shares a head by fixed chunks of query blocks
 *   instead of key blocks (split_head_panels: dQ rows complete on one thread, dK/dV summed
 *   over the chunks' partials in chunk order), other bits, as deterministic.
 *
 * MEMORY: per thread  (2 D Mp + M Dp) + 3 N Dp + 2 N + 2 Br Bc + 2 Bc Dp floats, and with
 *   panels 2 Br Mp (+ 2 Mp Dp outside split mode) more; plus, only when head mode is
 *   possible, 2 B (H - KVH) M D floats shared; in split mode 2 N + chunks N Dp floats shared,
 *   with panels chunks 2 Mp Dp instead.
 */
#define _POSIX_C_SOURCE 200809L
#include "attn_blocked.h"
#include "attn_blocked_kernels.h"
#include "attn_blocked_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------- geometry ------------------------------------------- */
static int g_panels = 1;    /* pyggml_attn_bwd_set_panels */

int pyggml_attn_bwd_set_panels(int on) {
    const int was = g_panels;
    g_panels = on != 0;
    return was;
}

int pyggml_attn_bwd_panels(void) {
    return g_panels;
}

static size_t take(size_t *at, i64 nfloats) {
    const size_t o = *at;
    *at += (size_t)rup(nfloats, 16);
    return o;
}

/* head mode: only with a barrier (checked by the caller), GQA, several threads and too few
 * (b, kv head) pairs to share evenly. */
static int head_mode_possible(const pyggml_attn_bwd *a, int nth) {
    const i64 units = a->B * a->KVH;
    return nth > 1 && a->H > a->KVH && units % nth != 0 && units < 4 * (i64)nth;
}

void pgab_geom_init(pgab_geom *g, const pyggml_attn_bwd *a, int nth, int panels) {
    g->D = a->D;
    g->Dp = rup(a->D, 8);
    g->N = a->N;
    g->M = a->M;
    g->Mp = rup(a->M, PGAB_BC);
    g->G = a->H / a->KVH;
    size_t at = 0;
    g->o_kt = take(&at, g->D * g->Mp);
    g->o_vt = take(&at, g->D * g->Mp);
    g->o_kp = take(&at, g->M * g->Dp);
    g->o_qp = take(&at, g->N * g->Dp);
    g->o_dop = take(&at, g->N * g->Dp);
    g->o_dqp = take(&at, g->N * g->Dp);
    g->o_lse = take(&at, g->N);
    g->o_dl = take(&at, g->N);
    g->o_s = take(&at, PGAB_BR * PGAB_BC);
    g->o_dp = take(&at, PGAB_BR * PGAB_BC);
    g->o_dk = take(&at, PGAB_BC * g->Dp);
    g->o_dv = take(&at, PGAB_BC * g->Dp);
    g->split = a->B * a->H < PGAB_SPLIT_HEADS;
    /* panels where the statistics are recomputed (see PANELS) */
    g->panel = panels && !(a->lse && a->o);
    g->o_ps = g->o_pdp = g->o_dka = g->o_dva = 0;
    if (g->panel) {
        g->o_ps = take(&at, PGAB_BR * g->Mp);
        g->o_pdp = take(&at, PGAB_BR * g->Mp);
        if (!g->split) {    /* split mode sums dK/dV in its shared query-chunk partials */
            g->o_dka = take(&at, g->Mp * g->Dp);
            g->o_dva = take(&at, g->Mp * g->Dp);
        }
    }
    g->per_thread = at;
    if (g->split && g->panel) {
        /* query chunks, each with dK and dV partials of its own */
        g->chunks = imin(PGAB_KCHUNKS, rup(g->N, PGAB_BR) / PGAB_BR);
        g->shared = (size_t)(g->chunks * 2 * g->Mp * g->Dp);
    } else {
        g->chunks = g->split ? imin(PGAB_KCHUNKS, g->Mp / PGAB_BC) : 0;
        g->shared = g->split ? (size_t)(2 * rup(g->N, 16) + g->chunks * g->N * g->Dp) : 0;
    }
    g->partial = !g->split && head_mode_possible(a, nth) ? (size_t)(2 * a->B * (a->H - a->KVH) * a->M * a->D) : 0;
}

static void geom_init(pgab_geom *g, const pyggml_attn_bwd *a, int nth) {
    pgab_geom_init(g, a, nth, g_panels);
}

size_t pyggml_attn_bwd_work_size(const pyggml_attn_bwd *a, int n_threads) {
    if (n_threads < 1) n_threads = 1;
    pgab_geom g;
    geom_init(&g, a, n_threads);
    return (g.per_thread * (size_t)n_threads + rup((i64)g.partial, 16) + g.shared) * sizeof(float) + 64;
}

/* ------------------------------------- head pass ------------------------------------------ */

/* transpose/pad kv head (b, c) into the thread scratch */
void pgab_prep_kv(const pyggml_attn_bwd *a, const pgab_geom *g, float *tw, i64 b, i64 c) {
    const i64 D = g->D, M = g->M, Mp = g->Mp, Dp = g->Dp;
    const float *k = a->k + (b * a->KVH + c) * M * D;
    const float *v = a->v + (b * a->KVH + c) * M * D;
    float *kt = tw + g->o_kt, *vt = tw + g->o_vt, *kp = tw + g->o_kp;
    /* KT, VT are stored per key block: [M/Bc][D][Bc], so a tile's B panel has a short row
     * stride (no 4 KiB cache-set aliasing for large M); padding keys are zero. */
    for (i64 j0 = 0; j0 < Mp; j0 += PGAB_BC) {
        float *ktb = kt + j0 * D, *vtb = vt + j0 * D;
        const i64 bc = imin(PGAB_BC, M - j0);
        for (i64 t = 0; t < bc; t++)
            for (i64 d = 0; d < D; d++) {
                ktb[d * PGAB_BC + t] = k[(j0 + t) * D + d];
                vtb[d * PGAB_BC + t] = v[(j0 + t) * D + d];
            }
        for (i64 d = 0; d < D; d++)
            for (i64 t = bc; t < PGAB_BC; t++) ktb[d * PGAB_BC + t] = vtb[d * PGAB_BC + t] = 0.0f;
    }
    for (i64 j = 0; j < M; j++) {
        memcpy(kp + j * Dp, k + j * D, (size_t)D * sizeof(float));
        for (i64 d = D; d < Dp; d++) kp[j * Dp + d] = 0.0f;
    }
}

void pgab_pad_rows(float *dst, const float *src, i64 n, i64 D, i64 Dp) {
    for (i64 i = 0; i < n; i++) {
        memcpy(dst + i * Dp, src + i * D, (size_t)D * sizeof(float));
        for (i64 d = D; d < Dp; d++) dst[i * Dp + d] = 0.0f;
    }
}

/* Row statistics of the query block at i0 (lse_i and delta_i, see 1. above) into lse, dl.
 * l: Br floats of scratch. */
void pgab_stats_block(const pyggml_attn_bwd *a, const pgab_geom *g, const pgab_kernels *kr, const float *tw,
                        const float *qp, const float *dop, i64 bh, i64 i0, float *lse, float *dl, float *l) {
    const i64 D = g->D, Dp = g->Dp, N = g->N, M = g->M, off = M - N;
    const i64 br = imin(PGAB_BR, N - i0);
    if (a->lse && a->o) {
        const float *o = a->o + bh * N * D, *dd = a->d + bh * N * D;
        for (i64 i = i0; i < i0 + br; i++) {
            double s = 0.0;
            for (i64 d = 0; d < D; d++) s += (double)dd[i * D + d] * (double)o[i * D + d];
            dl[i] = (float)s;
            lse[i] = a->lse[bh * N + i];
        }
        return;
    }
    /* lse holds the running max m, dl the running u, l the running sum */
    const float *kt = tw + g->o_kt, *vt = tw + g->o_vt;
    float *S = (float *)tw + g->o_s, *dP = (float *)tw + g->o_dp;
    for (i64 r = 0; r < br; r++) {
        lse[i0 + r] = -INFINITY;
        dl[i0 + r] = 0.0f;
        l[r] = 0.0f;
    }
    const i64 jend = a->masked ? imin(M, off + i0 + br) : M;
    for (i64 j0 = 0; j0 < jend; j0 += PGAB_BC) {
        const i64 bc = imin(PGAB_BC, M - j0);
        const i64 diag = off + i0 - j0;
        const i64 ncols = rup(nvis_of(br - 1, diag, bc, a->masked), 8);
        kr->gemm(br, ncols, D, qp + i0 * Dp, Dp, 1, kt + j0 * D, PGAB_BC, S, PGAB_BC, 0);
        kr->gemm(br, ncols, D, dop + i0 * Dp, Dp, 1, vt + j0 * D, PGAB_BC, dP, PGAB_BC, 0);
        kr->tile_stats(br, ncols, S, dP, PGAB_BC, diag, bc, a->masked, a->scale, lse + i0, l, dl + i0);
    }
    for (i64 r = 0; r < br; r++) {
        lse[i0 + r] = lse[i0 + r] + logf(l[r]);
        dl[i0 + r] = dl[i0 + r] / l[r];
    }
}

/* The dK/dV rows of the key block at j0, from the accumulators dka/dva (bc x Dp), written to
 * dkd/dvd ([M][D]) when add == 0, added to them when add != 0. */
static void store_key_block(const pgab_geom *g, i64 j0, const float *dka, const float *dva, float *dkd,
                            float *dvd, int add) {
    const i64 D = g->D, Dp = g->Dp;
    const i64 bc = imin(PGAB_BC, g->M - j0);
    float *dk = dkd + j0 * D, *dv = dvd + j0 * D;
    for (i64 t = 0; t < bc; t++) {
        if (add) {
            for (i64 d = 0; d < D; d++) {
                dk[t * D + d] += dka[t * Dp + d];
                dv[t * D + d] += dva[t * Dp + d];
            }
        } else {
            memcpy(dk + t * D, dka + t * Dp, (size_t)D * sizeof(float));
            memcpy(dv + t * D, dva + t * Dp, (size_t)D * sizeof(float));
        }
    }
}

/* The backward sweep of the key block at j0 (2. above): dQ rows accumulated into dqp
 * (N x Dp), the block's dK/dV rows written to dkd/dvd ([M][D]) when add == 0, added to them
 * when add != 0. */
void pgab_key_block(const pyggml_attn_bwd *a, const pgab_geom *g, const pgab_kernels *kr, float *tw,
                      const float *qp, const float *dop, const float *lse, const float *dl, float *dqp, i64 j0,
                      float *dkd, float *dvd, int add) {
    const i64 D = g->D, Dp = g->Dp, N = g->N, M = g->M, off = M - N;
    const int masked = a->masked;
    const float *kt = tw + g->o_kt, *vt = tw + g->o_vt, *kp = tw + g->o_kp;
    float *S = tw + g->o_s, *dP = tw + g->o_dp;
    float *dka = tw + g->o_dk, *dva = tw + g->o_dv;
    const ptrdiff_t ld = PGAB_BC;
    const i64 bc = imin(PGAB_BC, M - j0);
    memset(dka, 0, (size_t)(bc * Dp) * sizeof(float));
    memset(dva, 0, (size_t)(bc * Dp) * sizeof(float));
    const i64 imin_q = masked ? imax(0, j0 - off) : 0; /* first query that sees key j0 */
    for (i64 i0 = imin_q / PGAB_BR * PGAB_BR; i0 < N; i0 += PGAB_BR) {
        const i64 br = imin(PGAB_BR, N - i0);
        const i64 rf = masked ? imax(0, j0 - off - i0) : 0; /* first row seeing any key */
        const i64 ia = i0 + rf, nr = br - rf;
        const i64 diag = off + ia - j0;
        const i64 nmax = nvis_of(nr - 1, diag, bc, masked); /* visible keys of the last row */
        const i64 ncols = rup(nmax, 8);
        kr->gemm(nr, ncols, D, qp + ia * Dp, Dp, 1, kt + j0 * D, PGAB_BC, S, ld, 0);
        kr->gemm(nr, ncols, D, dop + ia * Dp, Dp, 1, vt + j0 * D, PGAB_BC, dP, ld, 0);
        kr->tile_bwd(nr, ncols, S, dP, ld, lse + ia, dl + ia, diag, bc, masked, a->scale);
        kr->gemm(nmax, Dp, nr, S, 1, ld, dop + ia * Dp, Dp, dva, Dp, 1);
        kr->gemm(nmax, Dp, nr, dP, 1, ld, qp + ia * Dp, Dp, dka, Dp, 1);
        kr->gemm(nr, Dp, nmax, dP, ld, 1, kp + j0 * Dp, Dp, dqp + ia * Dp, Dp, 1);
    }
    store_key_block(g, j0, dka, dva, dkd, dvd, add);
}

/* PANELS (group and head modes, statistics not given): a head pass takes the query blocks in
 * order and, for each, first computes the S and dP tiles of every visible key block into two
 * panels (Br x Mp, tile after tile, each tile laid out as the S/dP buffers of key_block) while
 * it updates the row statistics (stats_block's sweep, the same calls), then runs the backward
 * over the same tiles instead of computing them again: 10 N M D flops instead of 14.  The dK
 * and dV of every key block are summed over the query blocks in ascending order (as key_block
 * does, in accumulators of the head, Mp x Dp), and dQ over the key blocks in ascending order
 * (as before), and each S/dP element comes from the same GEMM call shape (one element: the
 * same fused multiply-adds over p): the results are the bits of the recomputing sweep. */
/* One query block of PANELS: its row statistics with the S and dP tiles kept, then the
 * backward over them; dQ rows accumulated into the thread's dqp, dK/dV of key block j0 into
 * dka/dva + j0 Dp (Mp x Dp accumulators). */
void pgab_panel_query_block(const pyggml_attn_bwd *a, const pgab_geom *g, const pgab_kernels *kr, float *tw,
                              i64 i0, float *dka, float *dva) {
    const i64 D = g->D, Dp = g->Dp, N = g->N, M = g->M, off = M - N;
    const int masked = a->masked;
    const ptrdiff_t ld = PGAB_BC;
    const float *qp = tw + g->o_qp, *dop = tw + g->o_dop;
    float *dqp = tw + g->o_dqp;
    float *lse = tw + g->o_lse, *dl = tw + g->o_dl, *l = tw + g->o_dk;
    const float *kt = tw + g->o_kt, *vt = tw + g->o_vt, *kp = tw + g->o_kp;
    float *ps = tw + g->o_ps, *pdp = tw + g->o_pdp;
    const i64 br = imin(PGAB_BR, N - i0);
    /* the statistics, as stats_block computes them, keeping the tiles */
    for (i64 r = 0; r < br; r++) {
        lse[i0 + r] = -INFINITY;
        dl[i0 + r] = 0.0f;
        l[r] = 0.0f;
    }
    const i64 jend = masked ? imin(M, off + i0 + br) : M;
    for (i64 j0 = 0; j0 < jend; j0 += PGAB_BC) {
        const i64 bc = imin(PGAB_BC, M - j0);
        const i64 diag = off + i0 - j0;
        const i64 ncols = rup(nvis_of(br - 1, diag, bc, masked), 8);
        float *S = ps + j0 * PGAB_BR, *dP = pdp + j0 * PGAB_BR;
        kr->gemm(br, ncols, D, qp + i0 * Dp, Dp, 1, kt + j0 * D, PGAB_BC, S, ld, 0);
        kr->gemm(br, ncols, D, dop + i0 * Dp, Dp, 1, vt + j0 * D, PGAB_BC, dP, ld, 0);
        kr->tile_stats(br, ncols, S, dP, ld, diag, bc, masked, a->scale, lse + i0, l, dl + i0);
    }
    for (i64 r = 0; r < br; r++) {
        lse[i0 + r] = lse[i0 + r] + logf(l[r]);
        dl[i0 + r] = dl[i0 + r] / l[r];
    }
    /* the backward over the same tiles: key_block's step for this query block.  The key
     * blocks a query block meets are those of the statistics (j0 < off + i0 + br), and a
     * tile's rows from rf on are the rows key_block computes (the same elements). */
    for (i64 j0 = 0; j0 < jend; j0 += PGAB_BC) {
        const i64 bc = imin(PGAB_BC, M - j0);
        const i64 rf = masked ? imax(0, j0 - off - i0) : 0;
        const i64 ia = i0 + rf, nr = br - rf;
        const i64 diag = off + ia - j0;
        const i64 nmax = nvis_of(nr - 1, diag, bc, masked);
        const i64 ncols = rup(nmax, 8);
        float *S = ps + j0 * PGAB_BR + rf * ld, *dP = pdp + j0 * PGAB_BR + rf * ld;
        kr->tile_bwd(nr, ncols, S, dP, ld, lse + ia, dl + ia, diag, bc, masked, a->scale);
        kr->gemm(nmax, Dp, nr, S, 1, ld, dop + ia * Dp, Dp, dva + j0 * Dp, Dp, 1);
        kr->gemm(nmax, Dp, nr, dP, 1, ld, qp + ia * Dp, Dp, dka + j0 * Dp, Dp, 1);
        kr->gemm(nr, Dp, nmax, dP, ld, 1, kp + j0 * Dp, Dp, dqp + ia * Dp, Dp, 1);
    }
}

static void head_pass_panels(const pyggml_attn_bwd *a, const pgab_geom *g, const pgab_kernels *kr, float *tw,
                             i64 b, i64 h, float *dkd, float *dvd, int add) {
    const i64 D = g->D, Dp = g->Dp, N = g->N, M = g->M;
    const i64 bh = b * a->H + h;
    float *qp = tw + g->o_qp, *dop = tw + g->o_dop, *dqp = tw + g->o_dqp;
    float *dka = tw + g->o_dka, *dva = tw + g->o_dva;

    pgab_pad_rows(qp, a->q + bh * N * D, N, D, Dp);
    pgab_pad_rows(dop, a->d + bh * N * D, N, D, Dp);
    memset(dqp, 0, (size_t)(N * Dp) * sizeof(float));
    memset(dka, 0, (size_t)(g->Mp * Dp) * sizeof(float));
    memset(dva, 0, (size_t)(g->Mp * Dp) * sizeof(float));
    for (i64 i0 = 0; i0 < N; i0 += PGAB_BR) {
        if (pgab_cancelled(a)) return;
        pgab_panel_query_block(a, g, kr, tw, i0, dka, dva);
    }
    for (i64 j0 = 0; j0 < M; j0 += PGAB_BC) store_key_block(g, j0, dka + j0 * Dp, dva + j0 * Dp, dkd, dvd, add);
    float *dq = a->dq + bh * N * D;
    for (i64 i = 0; i < N; i++) memcpy(dq + i * D, dqp + i * Dp, (size_t)D * sizeof(float));
}

/* Backward of query head (b, h) against the kv head prepared in tw, on one thread.  dK/dV of
 * the head are written to dkd/dvd ([M][D]) when add == 0, added to them when add != 0. */
void pgab_head_pass(const pyggml_attn_bwd *a, const pgab_geom *g, const pgab_kernels *kr, float *tw,
                      i64 b, i64 h, float *dkd, float *dvd, int add) {
    const i64 D = g->D, Dp = g->Dp, N = g->N, M = g->M;
    const i64 bh = b * a->H + h;
    float *qp = tw + g->o_qp, *dop = tw + g->o_dop, *dqp = tw + g->o_dqp;
    float *lse = tw + g->o_lse, *dl = tw + g->o_dl;

    if (g->panel) {
        head_pass_panels(a, g, kr, tw, b, h, dkd, dvd, add);
        return;
    }
    pgab_pad_rows(qp, a->q + bh * N * D, N, D, Dp);
    pgab_pad_rows(dop, a->d + bh * N * D, N, D, Dp);
    memset(dqp, 0, (size_t)(N * Dp) * sizeof(float));
    for (i64 i0 = 0; i0 < N; i0 += PGAB_BR) {
        if (pgab_cancelled(a)) return;
        pgab_stats_block(a, g, kr, tw, qp, dop, bh, i0, lse, dl, tw + g->o_dk);   /* dK's buffer is free now */
    }
    for (i64 j0 = 0; j0 < M; j0 += PGAB_BC) {
        if (pgab_cancelled(a)) return;
        pgab_key_block(a, g, kr, tw, qp, dop, lse, dl, dqp, j0, dkd, dvd, add);
    }
    float *dq = a->dq + bh * N * D;
    for (i64 i = 0; i < N; i++) memcpy(dq + i * D, dqp + i * Dp, (size_t)D * sizeof(float));
}

/* --------------------------------------- driver ------------------------------------------- */

/* group mode: thread ith of nth takes the (batch, kv head) pairs u = ith, ith + nth, ...
 * and, for each, every query head of its group in order: it alone writes their dK, dV
 * and dQ rows (no reduction across threads). */
void pgab_run_groups(const pyggml_attn_bwd *a, const pgab_geom *g, const pgab_kernels *kr, float *tw,
                       int ith, int nth) {
    const i64 B = a->B, KVH = a->KVH, G = g->G, M = g->M, D = g->D;
    for (i64 u = ith; u < B * KVH; u += nth) {
        const i64 b = u / KVH, c = u % KVH;
        pgab_prep_kv(a, g, tw, b, c);
        float *dk = a->dk + u * M * D, *dv = a->dv + u * M * D;
        for (i64 gi = 0; gi < G; gi++) {
            const i64 h = a->grouping ? c * G + gi : gi * KVH + c;
            pgab_head_pass(a, g, kr, tw, b, h, dk, dv, gi > 0);
        }
    }
}

void pyggml_attn_bwd_run(const pyggml_attn_bwd *a, int ith, int nth, void *work,
                         pyggml_barrier_fn barrier, void *barrier_ctx) {
    pgab_geom g;
    geom_init(&g, a, nth);
    const pgab_kernels kr = pgab_pick_kernels();
    float *tw = (float *)work + (size_t)ith * g.per_thread;
    const int head_mode = barrier != NULL && g.partial > 0;

    if (g.split) {
        if (barrier != NULL || nth == 1)
            pgab_run_split(a, &g, &kr, tw, (float *)work + (size_t)nth * g.per_thread, ith, nth, barrier, barrier_ctx);
        else if (ith == 0)          /* no barrier: thread 0 alone, with the shared buffers */
            pgab_run_split(a, &g, &kr, tw, (float *)work + (size_t)nth * g.per_thread, 0, 1, NULL, NULL);
        return;
    }
    if (!head_mode) {
        pgab_run_groups(a, &g, &kr, tw, ith, nth);
        return;
    }

    float *partial = (float *)work + (size_t)nth * g.per_thread;
    pgab_run_heads(a, &g, &kr, tw, partial, ith, nth);
    barrier(barrier_ctx);
    pgab_reduce_heads(a, &g, partial, ith, nth);
}
