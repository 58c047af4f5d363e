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
 *     - group mode (always when barrier == NULL): a (b, kv head) pair; its heads are processed
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
 *       Without a barrier (the graph node) one thread does it all, the same way.
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

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------- geometry ------------------------------------------- */
typedef struct {
    i64 D, Dp, N, M, Mp, G;
    /* offsets (floats) into a thread's scratch */
    size_t o_kt, o_vt, o_kp, o_qp, o_dop, o_dqp, o_lse, o_dl, o_s, o_dp, o_dk, o_dv;
    int panel;           /* a head pass keeps a query block's S and dP rows (see PANELS) */
    size_t o_ps, o_pdp, o_dka, o_dva;   /* panel mode: the panels, the head's dK/dV sums */
    size_t per_thread;   /* floats, multiple of 16 */
    size_t partial;      /* floats of the shared head-mode partial buffer (0 if head mode impossible) */
    int split;           /* split mode (few heads: see THREADING) */
    i64 chunks;          /* split mode: key chunks, each with a dQ partial of its own */
    size_t shared;       /* split mode: floats of lse, delta and the dQ partials, shared */
} pgab_geom;

/* split mode: fewer query heads than this in all (B H), whatever the thread count */
#define PGAB_SPLIT_HEADS 4
/* split mode: key chunks per head (fewer where there are fewer key blocks) */
#define PGAB_KCHUNKS 8

static int g_panels = 1;    /* pyggml_attn_bwd_set_panels */

int pyggml_attn_bwd_set_panels(int on) {
    const int was = g_panels;
    g_panels = on != 0;
    return was;
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

static void geom_init(pgab_geom *g, const pyggml_attn_bwd *a, int nth) {
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
    g->panel = g_panels && !(a->lse && a->o);
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

size_t pyggml_attn_bwd_work_size(const pyggml_attn_bwd *a, int n_threads) {
    if (n_threads < 1) n_threads = 1;
    pgab_geom g;
    geom_init(&g, a, n_threads);
    return (g.per_thread * (size_t)n_threads + rup((i64)g.partial, 16) + g.shared) * sizeof(float) + 64;
}

/* ------------------------------------- head pass ------------------------------------------ */

/* transpose/pad kv head (b, c) into the thread scratch */
static void prep_kv(const pyggml_attn_bwd *a, const pgab_geom *g, float *tw, i64 b, i64 c) {
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

static void pad_rows(float *dst, const float *src, i64 n, i64 D, i64 Dp) {
    for (i64 i = 0; i < n; i++) {
        memcpy(dst + i * Dp, src + i * D, (size_t)D * sizeof(float));
        for (i64 d = D; d < Dp; d++) dst[i * Dp + d] = 0.0f;
    }
}

static inline int cancelled(const pyggml_attn_bwd *a) {
    return a->cancel != NULL && __atomic_load_n(a->cancel, __ATOMIC_RELAXED) != 0;
}

/* Row statistics of the query block at i0 (lse_i and delta_i, see 1. above) into lse, dl.
 * l: Br floats of scratch. */
static void stats_block(const pyggml_attn_bwd *a, const pgab_geom *g, const pgab_kernels *kr, const float *tw,
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
static void key_block(const pyggml_attn_bwd *a, const pgab_geom *g, const pgab_kernels *kr, float *tw,
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
static void panel_query_block(const pyggml_attn_bwd *a, const pgab_geom *g, const pgab_kernels *kr, float *tw,
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

    pad_rows(qp, a->q + bh * N * D, N, D, Dp);
    pad_rows(dop, a->d + bh * N * D, N, D, Dp);
    memset(dqp, 0, (size_t)(N * Dp) * sizeof(float));
    memset(dka, 0, (size_t)(g->Mp * Dp) * sizeof(float));
    memset(dva, 0, (size_t)(g->Mp * Dp) * sizeof(float));
    for (i64 i0 = 0; i0 < N; i0 += PGAB_BR) {
        if (cancelled(a)) return;
        panel_query_block(a, g, kr, tw, i0, dka, dva);
    }
    for (i64 j0 = 0; j0 < M; j0 += PGAB_BC) store_key_block(g, j0, dka + j0 * Dp, dva + j0 * Dp, dkd, dvd, add);
    float *dq = a->dq + bh * N * D;
    for (i64 i = 0; i < N; i++) memcpy(dq + i * D, dqp + i * Dp, (size_t)D * sizeof(float));
}

/* Backward of query head (b, h) against the kv head prepared in tw, on one thread.  dK/dV of
 * the head are written to dkd/dvd ([M][D]) when add == 0, added to them when add != 0. */
static void head_pass(const pyggml_attn_bwd *a, const pgab_geom *g, const pgab_kernels *kr, float *tw,
                      i64 b, i64 h, float *dkd, float *dvd, int add) {
    const i64 D = g->D, Dp = g->Dp, N = g->N, M = g->M;
    const i64 bh = b * a->H + h;
    float *qp = tw + g->o_qp, *dop = tw + g->o_dop, *dqp = tw + g->o_dqp;
    float *lse = tw + g->o_lse, *dl = tw + g->o_dl;

    if (g->panel) {
        head_pass_panels(a, g, kr, tw, b, h, dkd, dvd, add);
        return;
    }
    pad_rows(qp, a->q + bh * N * D, N, D, Dp);
    pad_rows(dop, a->d + bh * N * D, N, D, Dp);
    memset(dqp, 0, (size_t)(N * Dp) * sizeof(float));
    for (i64 i0 = 0; i0 < N; i0 += PGAB_BR) {
        if (cancelled(a)) return;
        stats_block(a, g, kr, tw, qp, dop, bh, i0, lse, dl, tw + g->o_dk);   /* dK's buffer is free now */
    }
    for (i64 j0 = 0; j0 < M; j0 += PGAB_BC) {
        if (cancelled(a)) return;
        key_block(a, g, kr, tw, qp, dop, lse, dl, dqp, j0, dkd, dvd, add);
    }
    float *dq = a->dq + bh * N * D;
    for (i64 i = 0; i < N; i++) memcpy(dq + i * D, dqp + i * Dp, (size_t)D * sizeof(float));
}

/* ----------------------------------- split mode ------------------------------------------- */

/* Key chunk c of n covers the key blocks [nkb c / n, nkb (c + 1) / n) */
static i64 chunk_start(const pgab_geom *g, i64 c) {
    const i64 nkb = g->Mp / PGAB_BC;
    return nkb * c / g->chunks * PGAB_BC;
}

/* Whether thread ith of nth owns chunk ``chunk`` of n: longest work first onto the
 * least-loaded thread, the same list on every thread; the owner of a chunk changes nothing
 * in the numbers (its partials are summed in chunk order). */
static int lpt_owns(const i64 *work, i64 n, i64 chunk, int ith, int nth) {
    i64 load[64];
    int order[PGAB_KCHUNKS];
    if (nth > 64) nth = 64;
    for (i64 c = 0; c < n; c++) order[c] = (int)c;
    for (i64 x = 1; x < n; x++)              /* insertion sort: work descending, index ascending */
        for (i64 y = x; y > 0 && work[order[y]] > work[order[y - 1]]; y--) {
            const int t = order[y];
            order[y] = order[y - 1];
            order[y - 1] = t;
        }
    for (int t = 0; t < nth; t++) load[t] = 0;
    for (i64 x = 0; x < n; x++) {
        int best = 0;
        for (int t = 1; t < nth; t++)
            if (load[t] < load[best]) best = t;
        load[best] += work[order[x]] + 1;
        if (order[x] == chunk) return best == ith;
    }
    return 0;
}

/* The key chunks thread ith computes (work: the query rows each key block meets) */
static int owns_chunk(const pyggml_attn_bwd *a, const pgab_geom *g, i64 chunk, int ith, int nth) {
    i64 work[PGAB_KCHUNKS];
    const i64 off = g->M - g->N;
    for (i64 c = 0; c < g->chunks; c++) {
        work[c] = 0;
        for (i64 j0 = chunk_start(g, c); j0 < chunk_start(g, c + 1); j0 += PGAB_BC)
            work[c] += a->masked ? g->N - imin(g->N, imax(0, j0 - off)) : g->N;
    }
    return lpt_owns(work, g->chunks, chunk, ith, nth);
}

static void meet(pyggml_barrier_fn barrier, void *ctx) {
    if (barrier != NULL) barrier(ctx);
}

/* Backward of query head (b, h) by all nth threads together (split mode): the row statistics
 * split by query blocks, the key blocks by chunks, each chunk's dQ in a partial of its own,
 * then dQ = ((partial_0 + partial_1) + ...) split by rows.  Every thread reaches every
 * barrier (a cancelled run skips work, never a barrier). */
static void split_head(const pyggml_attn_bwd *a, const pgab_geom *g, const pgab_kernels *kr, float *tw,
                       float *shared, i64 b, i64 h, float *dkd, float *dvd, int add, int ith, int nth,
                       pyggml_barrier_fn barrier, void *barrier_ctx) {
    const i64 D = g->D, Dp = g->Dp, N = g->N, M = g->M;
    const i64 bh = b * a->H + h;
    float *qp = tw + g->o_qp, *dop = tw + g->o_dop;
    float *lse = shared, *dl = shared + rup(N, 16), *parts = shared + 2 * rup(N, 16);
    const size_t part = (size_t)(N * Dp);

    pad_rows(qp, a->q + bh * N * D, N, D, Dp);
    pad_rows(dop, a->d + bh * N * D, N, D, Dp);
    for (i64 i0 = (i64)ith * PGAB_BR; i0 < N; i0 += (i64)nth * PGAB_BR)
        if (!cancelled(a)) stats_block(a, g, kr, tw, qp, dop, bh, i0, lse, dl, tw + g->o_dk);
    meet(barrier, barrier_ctx);
    for (i64 c = 0; c < g->chunks; c++) {
        if (!owns_chunk(a, g, c, ith, nth)) continue;
        float *dqp = parts + (size_t)c * part;
        memset(dqp, 0, part * sizeof(float));
        for (i64 j0 = chunk_start(g, c); j0 < imin(chunk_start(g, c + 1), M); j0 += PGAB_BC)
            if (!cancelled(a)) key_block(a, g, kr, tw, qp, dop, lse, dl, dqp, j0, dkd, dvd, add);
    }
    meet(barrier, barrier_ctx);
    float *dq = a->dq + bh * N * D;
    for (i64 i = N * ith / nth; i < N * (ith + 1) / nth; i++) {
        memcpy(dq + i * D, parts + i * Dp, (size_t)D * sizeof(float));
        for (i64 c = 1; c < g->chunks; c++) {
            const float *p = parts + (size_t)c * part + i * Dp;
            for (i64 d = 0; d < D; d++) dq[i * D + d] += p[d];
        }
    }
    meet(barrier, barrier_ctx);              /* the shared buffers are the next head's */
}

/* Query chunk c of n covers the query blocks [nqb c / n, nqb (c + 1) / n) */
static i64 qchunk_start(const pgab_geom *g, i64 c) {
    const i64 nqb = rup(g->N, PGAB_BR) / PGAB_BR;
    return nqb * c / g->chunks * PGAB_BR;
}

/* owns_chunk for query chunks (split mode with panels): work, the keys each query block
 * meets */
static int owns_qchunk(const pyggml_attn_bwd *a, const pgab_geom *g, i64 chunk, int ith, int nth) {
    i64 work[PGAB_KCHUNKS];
    const i64 off = g->M - g->N;
    for (i64 c = 0; c < g->chunks; c++) {
        work[c] = 0;
        for (i64 i0 = qchunk_start(g, c); i0 < imin(qchunk_start(g, c + 1), g->N); i0 += PGAB_BR)
            work[c] += a->masked ? imin(g->M, off + i0 + imin(PGAB_BR, g->N - i0)) : g->M;
    }
    return lpt_owns(work, g->chunks, chunk, ith, nth);
}

/* Split mode without saved statistics (PANELS): the query blocks of head (b, h) in fixed
 * chunks, each owned by one thread, which computes its blocks' statistics and backward over
 * the kept tiles, writes their dQ rows (complete: a query block meets every key block on one
 * thread) and sums dK/dV into the chunk's own partials; after a barrier dK/dV =
 * ((partial_0 + partial_1) + ...) in chunk order, written or added, split by rows.  The
 * chunks depend on the shape only, so one thread computes the same partials and sums them
 * the same way. */
static void split_head_panels(const pyggml_attn_bwd *a, const pgab_geom *g, const pgab_kernels *kr, float *tw,
                              float *shared, i64 b, i64 h, float *dkd, float *dvd, int add, int ith, int nth,
                              pyggml_barrier_fn barrier, void *barrier_ctx) {
    const i64 D = g->D, Dp = g->Dp, N = g->N, M = g->M;
    const i64 bh = b * a->H + h;
    float *qp = tw + g->o_qp, *dop = tw + g->o_dop, *dqp = tw + g->o_dqp;
    const size_t part = (size_t)(g->Mp * Dp);
    float *dq = a->dq + bh * N * D;

    pad_rows(qp, a->q + bh * N * D, N, D, Dp);
    pad_rows(dop, a->d + bh * N * D, N, D, Dp);
    for (i64 c = 0; c < g->chunks; c++) {
        if (!owns_qchunk(a, g, c, ith, nth)) continue;
        float *pk = shared + (size_t)(2 * c) * part, *pv = pk + part;
        memset(pk, 0, 2 * part * sizeof(float));
        for (i64 i0 = qchunk_start(g, c); i0 < imin(qchunk_start(g, c + 1), N); i0 += PGAB_BR) {
            if (cancelled(a)) break;
            const i64 br = imin(PGAB_BR, N - i0);
            memset(dqp + i0 * Dp, 0, (size_t)(br * Dp) * sizeof(float));
            panel_query_block(a, g, kr, tw, i0, pk, pv);
            for (i64 i = i0; i < i0 + br; i++) memcpy(dq + i * D, dqp + i * Dp, (size_t)D * sizeof(float));
        }
    }
    meet(barrier, barrier_ctx);
    float *dk = dkd, *dv = dvd;
    for (i64 j = M * ith / nth; j < M * (ith + 1) / nth; j++) {
        for (i64 d = 0; d < D; d++) {
            float sk = shared[j * Dp + d], sv = shared[part + j * Dp + d];
            for (i64 c = 1; c < g->chunks; c++) {
                sk += shared[(size_t)(2 * c) * part + j * Dp + d];
                sv += shared[(size_t)(2 * c + 1) * part + j * Dp + d];
            }
            if (add) {
                dk[j * D + d] += sk;
                dv[j * D + d] += sv;
            } else {
                dk[j * D + d] = sk;
                dv[j * D + d] = sv;
            }
        }
    }
    meet(barrier, barrier_ctx);              /* the shared buffers are the next head's */
}

/* split mode: every (batch, kv head) pair and every head of its group in order, each by all
 * threads together */
static void run_split(const pyggml_attn_bwd *a, const pgab_geom *g, const pgab_kernels *kr, float *tw,
                      float *shared, int ith, int nth, pyggml_barrier_fn barrier, void *barrier_ctx) {
    const i64 B = a->B, KVH = a->KVH, G = g->G, M = g->M, D = g->D;
    for (i64 u = 0; u < B * KVH; u++) {
        const i64 b = u / KVH, c = u % KVH;
        prep_kv(a, g, tw, b, c);
        float *dk = a->dk + u * M * D, *dv = a->dv + u * M * D;
        for (i64 gi = 0; gi < G; gi++) {
            const i64 h = a->grouping ? c * G + gi : gi * KVH + c;
            if (g->panel)
                split_head_panels(a, g, kr, tw, shared, b, h, dk, dv, gi > 0, ith, nth, barrier, barrier_ctx);
            else
                split_head(a, g, kr, tw, shared, b, h, dk, dv, gi > 0, ith, nth, barrier, barrier_ctx);
        }
    }
}

/* --------------------------------------- driver ------------------------------------------- */

/* group mode: thread ith of nth takes the (batch, kv head) pairs u = ith, ith + nth, ...
 * and, for each, every query head of its group in order: it alone writes their dK, dV
 * and dQ rows (no reduction across threads). */
static void run_groups(const pyggml_attn_bwd *a, const pgab_geom *g, const pgab_kernels *kr, float *tw,
                       int ith, int nth) {
    const i64 B = a->B, KVH = a->KVH, G = g->G, M = g->M, D = g->D;
    for (i64 u = ith; u < B * KVH; u += nth) {
        const i64 b = u / KVH, c = u % KVH;
        prep_kv(a, g, tw, b, c);
        float *dk = a->dk + u * M * D, *dv = a->dv + u * M * D;
        for (i64 gi = 0; gi < G; gi++) {
            const i64 h = a->grouping ? c * G + gi : gi * KVH + c;
            head_pass(a, g, kr, tw, b, h, dk, dv, gi > 0);
        }
    }
}

size_t pyggml_attn_bwd_thread_work_size(const pyggml_attn_bwd *a) {
    pgab_geom g;
    geom_init(&g, a, 1);
    return (g.per_thread + g.shared) * sizeof(float) + 64;
}

void pyggml_attn_bwd_run_alone(const pyggml_attn_bwd *a, int ith, int nth, void *thread_work) {
    pgab_geom g;
    geom_init(&g, a, nth);
    const pgab_kernels kr = pgab_pick_kernels();
    if (g.split) {                  /* no barrier: one thread takes the heads, the others nothing */
        if (ith == 0) run_split(a, &g, &kr, (float *)thread_work, (float *)thread_work + g.per_thread, 0, 1, NULL, NULL);
        return;
    }
    run_groups(a, &g, &kr, (float *)thread_work, ith, nth);
}

void pyggml_attn_bwd_run(const pyggml_attn_bwd *a, int ith, int nth, void *work,
                         pyggml_barrier_fn barrier, void *barrier_ctx) {
    pgab_geom g;
    geom_init(&g, a, nth);
    const pgab_kernels kr = pgab_pick_kernels();
    float *tw = (float *)work + (size_t)ith * g.per_thread;
    const i64 B = a->B, H = a->H, KVH = a->KVH, G = g.G, M = g.M, D = g.D;
    const int head_mode = barrier != NULL && g.partial > 0;

    if (g.split) {
        if (barrier != NULL || nth == 1)
            run_split(a, &g, &kr, tw, (float *)work + (size_t)nth * g.per_thread, ith, nth, barrier, barrier_ctx);
        else if (ith == 0)          /* no barrier: thread 0 alone, with the shared buffers */
            run_split(a, &g, &kr, tw, (float *)work + (size_t)nth * g.per_thread, 0, 1, NULL, NULL);
        return;
    }
    if (!head_mode) {
        run_groups(a, &g, &kr, tw, ith, nth);
        return;
    }

    /* head mode */
    float *partial = (float *)work + (size_t)nth * g.per_thread;
    const size_t psz = (size_t)(M * D);
    const i64 U = B * H;
    const i64 u0 = U * ith / nth, u1 = U * (ith + 1) / nth;
    i64 prepared = -1;
    for (i64 u = u0; u < u1; u++) {
        const i64 b = u / H, h = u % H;
        const i64 c = a->grouping ? h / G : h % KVH;
        const i64 gi = a->grouping ? h % G : h / KVH;
        const i64 pc = b * KVH + c;
        if (pc != prepared) {
            prep_kv(a, &g, tw, b, c);
            prepared = pc;
        }
        float *dk, *dv;
        if (gi == 0) {
            dk = a->dk + pc * M * D;
            dv = a->dv + pc * M * D;
        } else {
            dk = partial + (size_t)(2 * (pc * (G - 1) + gi - 1)) * psz;
            dv = dk + psz;
        }
        head_pass(a, &g, &kr, tw, b, h, dk, dv, 0);
    }
    barrier(barrier_ctx);
    /* fixed-order reduction, rows of all kv heads split over the threads */
    const i64 R = B * KVH * M;
    const i64 r0 = R * ith / nth, r1 = R * (ith + 1) / nth;
    for (i64 r = r0; r < r1; r++) {
        const i64 pc = r / M, j = r % M;
        float *dk = a->dk + r * D, *dv = a->dv + r * D;
        for (i64 gi = 1; gi < G; gi++) {
            const float *pk = partial + (size_t)(2 * (pc * (G - 1) + gi - 1)) * psz + j * D;
            const float *pv = pk + psz;
            for (i64 d = 0; d < D; d++) {
                dk[d] += pk[d];
                dv[d] += pv[d];
            }
        }
    }
}
