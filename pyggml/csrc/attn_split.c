/* Split and head mode of the blocked attention backward (see THREADING in attn_blocked.c):
 * the two ways its threads share query heads when there are too few (batch, kv head) pairs
 * to give each thread whole ones, both of which need the threads to meet (a barrier in
 * pyggml_attn_bwd_run; in the graph node, the line between two nodes), and the graph
 * node's two parts. */
#define _POSIX_C_SOURCE 200809L
#include "attn_blocked_impl.h"

#include <string.h>

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

/* Split mode, after the row statistics: the key chunks thread ith owns, each chunk's dQ into
 * its partial of parts (chunks x N x Dp), its key blocks' dK/dV into dkd/dvd */
static void split_chunks(const pyggml_attn_bwd *a, const pgab_geom *g, const pgab_kernels *kr, float *tw,
                         const float *lse, const float *dl, float *parts, float *dkd, float *dvd, int add, int ith,
                         int nth) {
    const float *qp = tw + g->o_qp, *dop = tw + g->o_dop;
    const size_t part = (size_t)(g->N * g->Dp);
    for (i64 c = 0; c < g->chunks; c++) {
        if (!owns_chunk(a, g, c, ith, nth)) continue;
        float *dqp = parts + (size_t)c * part;
        memset(dqp, 0, part * sizeof(float));
        for (i64 j0 = chunk_start(g, c); j0 < imin(chunk_start(g, c + 1), g->M); j0 += PGAB_BC)
            if (!pgab_cancelled(a)) pgab_key_block(a, g, kr, tw, qp, dop, lse, dl, dqp, j0, dkd, dvd, add);
    }
}

/* Split mode: dQ rows [i0, i1) of head bh = ((partial_0 + partial_1) + ...) in chunk order */
static void split_reduce_dq(const pyggml_attn_bwd *a, const pgab_geom *g, const float *parts, i64 bh, i64 i0,
                            i64 i1) {
    const i64 D = g->D, Dp = g->Dp;
    const size_t part = (size_t)(g->N * Dp);
    float *dq = a->dq + bh * g->N * D;
    for (i64 i = i0; i < i1; i++) {
        memcpy(dq + i * D, parts + i * Dp, (size_t)D * sizeof(float));
        for (i64 c = 1; c < g->chunks; c++) {
            const float *p = parts + (size_t)c * part + i * Dp;
            for (i64 d = 0; d < D; d++) dq[i * D + d] += p[d];
        }
    }
}

/* Backward of query head (b, h) by all nth threads together (split mode): the row statistics
 * split by query blocks, the key blocks by chunks, each chunk's dQ in a partial of its own,
 * then dQ = ((partial_0 + partial_1) + ...) split by rows.  Every thread reaches every
 * barrier (a cancelled run skips work, never a barrier). */
static void split_head(const pyggml_attn_bwd *a, const pgab_geom *g, const pgab_kernels *kr, float *tw,
                       float *shared, i64 b, i64 h, float *dkd, float *dvd, int add, int ith, int nth,
                       pyggml_barrier_fn barrier, void *barrier_ctx) {
    const i64 D = g->D, Dp = g->Dp, N = g->N;
    const i64 bh = b * a->H + h;
    float *qp = tw + g->o_qp, *dop = tw + g->o_dop;
    float *lse = shared, *dl = shared + rup(N, 16), *parts = shared + 2 * rup(N, 16);

    pgab_pad_rows(qp, a->q + bh * N * D, N, D, Dp);
    pgab_pad_rows(dop, a->d + bh * N * D, N, D, Dp);
    for (i64 i0 = (i64)ith * PGAB_BR; i0 < N; i0 += (i64)nth * PGAB_BR)
        if (!pgab_cancelled(a)) pgab_stats_block(a, g, kr, tw, qp, dop, bh, i0, lse, dl, tw + g->o_dk);
    meet(barrier, barrier_ctx);
    split_chunks(a, g, kr, tw, lse, dl, parts, dkd, dvd, add, ith, nth);
    meet(barrier, barrier_ctx);
    split_reduce_dq(a, g, parts, bh, N * ith / nth, N * (ith + 1) / nth);
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
/* ... its first phase: the query chunks thread ith owns, dQ rows written, dK/dV partials
 * into shared (chunks x 2 x Mp x Dp) */
static void split_qchunks(const pyggml_attn_bwd *a, const pgab_geom *g, const pgab_kernels *kr, float *tw,
                          float *shared, i64 bh, int ith, int nth) {
    const i64 D = g->D, Dp = g->Dp, N = g->N;
    float *qp = tw + g->o_qp, *dop = tw + g->o_dop, *dqp = tw + g->o_dqp;
    const size_t part = (size_t)(g->Mp * Dp);
    float *dq = a->dq + bh * N * D;

    pgab_pad_rows(qp, a->q + bh * N * D, N, D, Dp);
    pgab_pad_rows(dop, a->d + bh * N * D, N, D, Dp);
    for (i64 c = 0; c < g->chunks; c++) {
        if (!owns_qchunk(a, g, c, ith, nth)) continue;
        float *pk = shared + (size_t)(2 * c) * part, *pv = pk + part;
        memset(pk, 0, 2 * part * sizeof(float));
        for (i64 i0 = qchunk_start(g, c); i0 < imin(qchunk_start(g, c + 1), N); i0 += PGAB_BR) {
            if (pgab_cancelled(a)) break;
            const i64 br = imin(PGAB_BR, N - i0);
            memset(dqp + i0 * Dp, 0, (size_t)(br * Dp) * sizeof(float));
            pgab_panel_query_block(a, g, kr, tw, i0, pk, pv);
            for (i64 i = i0; i < i0 + br; i++) memcpy(dq + i * D, dqp + i * Dp, (size_t)D * sizeof(float));
        }
    }
}

/* ... its second: dK/dV rows [j0, j1) = ((partial_0 + partial_1) + ...) in chunk order,
 * written (add == 0) or added */
static void split_reduce_dkdv(const pgab_geom *g, const float *shared, float *dk, float *dv, int add, i64 j0,
                              i64 j1) {
    const i64 D = g->D, Dp = g->Dp;
    const size_t part = (size_t)(g->Mp * Dp);
    for (i64 j = j0; j < j1; j++) {
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
}

static void split_head_panels(const pyggml_attn_bwd *a, const pgab_geom *g, const pgab_kernels *kr, float *tw,
                              float *shared, i64 b, i64 h, float *dkd, float *dvd, int add, int ith, int nth,
                              pyggml_barrier_fn barrier, void *barrier_ctx) {
    split_qchunks(a, g, kr, tw, shared, b * a->H + h, ith, nth);
    meet(barrier, barrier_ctx);
    split_reduce_dkdv(g, shared, dkd, dvd, add, g->M * ith / nth, g->M * (ith + 1) / nth);
    meet(barrier, barrier_ctx);              /* the shared buffers are the next head's */
}

/* split mode: every (batch, kv head) pair and every head of its group in order, each by all
 * threads together */
void pgab_run_split(const pyggml_attn_bwd *a, const pgab_geom *g, const pgab_kernels *kr, float *tw,
                      float *shared, int ith, int nth, pyggml_barrier_fn barrier, void *barrier_ctx) {
    const i64 B = a->B, KVH = a->KVH, G = g->G, M = g->M, D = g->D;
    for (i64 u = 0; u < B * KVH; u++) {
        const i64 b = u / KVH, c = u % KVH;
        pgab_prep_kv(a, g, tw, b, c);
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

/* ----------------------------------- head mode -------------------------------------------- */

/* head mode, before the barrier: thread ith's share of the (b, h) pairs; head g=0 of a group
 * writes its dK/dV, the others their partials */
void pgab_run_heads(const pyggml_attn_bwd *a, const pgab_geom *g, const pgab_kernels *kr, float *tw,
                      float *partial, int ith, int nth) {
    const i64 H = a->H, KVH = a->KVH, G = g->G, M = g->M, D = g->D;
    const size_t psz = (size_t)(M * D);
    const i64 U = a->B * H;
    const i64 u0 = U * ith / nth, u1 = U * (ith + 1) / nth;
    i64 prepared = -1;
    for (i64 u = u0; u < u1; u++) {
        const i64 b = u / H, h = u % H;
        const i64 c = a->grouping ? h / G : h % KVH;
        const i64 gi = a->grouping ? h % G : h / KVH;
        const i64 pc = b * KVH + c;
        if (pc != prepared) {
            pgab_prep_kv(a, g, tw, b, c);
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
        pgab_head_pass(a, g, kr, tw, b, h, dk, dv, 0);
    }
}

/* head mode, after it: the fixed-order reduction, rows of all kv heads split over the threads */
void pgab_reduce_heads(const pyggml_attn_bwd *a, const pgab_geom *g, const float *partial, int ith, int nth) {
    const i64 KVH = a->KVH, G = g->G, M = g->M, D = g->D;
    const size_t psz = (size_t)(M * D);
    const i64 R = a->B * KVH * M;
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

/* ------------------------------- the graph node's two parts --------------------------------- */
/* A ggml custom op has no barrier, but ggml's threads meet between two nodes: the node
 * (attn_node.c) is then two, the first doing what the threads of _run do before their
 * barrier, the second what they do after it, with the shared buffers in a scratch after
 * dq, dk and dv in the first node's result (each head of split mode a region of its own,
 * the buffers being used once).  The same float operations in the same order as _run. */

/* floats of a split-mode head's region of the scratch */
/* HEADS: the first node's thread 0 says in the scratch's first float whether its threads
 * ran head mode (1) or group mode (0), so that the second reduces exactly when the first
 * left partials, whatever thread count ggml gives each (the partials follow, at a cache line) */
#define HEADS_MARK 16

static size_t split_region(const pgab_geom *g) {
    return (size_t)rup(g->panel ? g->chunks * 2 * g->Mp * g->Dp : g->chunks * g->N * g->Dp, 16);
}

int pyggml_attn_bwd_node_plan(const pyggml_attn_bwd *a, int panels, int64_t *scratch) {
    pgab_geom g;
    pgab_geom_init(&g, a, 1, panels);
    *scratch = 0;
    if (g.split) {
        if (!g.panel && !(a->lse && a->o))
            return PYGGML_ATTN_NODE_ONE;    /* statistics recomputed without panels: one thread */
        *scratch = (int64_t)split_region(&g) * a->B * a->H;
        return PYGGML_ATTN_NODE_SPLIT;
    }
    if (a->H > a->KVH && a->B * a->KVH < PGAB_SPLIT_HEADS) {
        *scratch = HEADS_MARK + 2 * a->B * (a->H - a->KVH) * a->M * a->D;
        return PYGGML_ATTN_NODE_HEADS;
    }
    return PYGGML_ATTN_NODE_ONE;
}

size_t pyggml_attn_bwd_node_work_size(const pyggml_attn_bwd *a, int panels, int layout) {
    pgab_geom g;
    pgab_geom_init(&g, a, 1, panels);
    return ((layout == PYGGML_ATTN_NODE_ONE ? g.per_thread + g.shared : g.per_thread)) * sizeof(float) + 64;
}

void pyggml_attn_bwd_node_first(const pyggml_attn_bwd *a, int panels, int layout, float *scratch, int ith, int nth,
                                void *thread_work) {
    pgab_geom g;
    pgab_geom_init(&g, a, nth, panels);
    const pgab_kernels kr = pgab_pick_kernels();
    float *tw = (float *)thread_work;
    if (layout == PYGGML_ATTN_NODE_ONE) {
        if (g.split) {              /* one thread takes the heads, the others nothing */
            if (ith == 0) pgab_run_split(a, &g, &kr, tw, tw + g.per_thread, 0, 1, NULL, NULL);
        } else {
            pgab_run_groups(a, &g, &kr, tw, ith, nth);
        }
        return;
    }
    if (layout == PYGGML_ATTN_NODE_HEADS) {
        if (ith == 0) scratch[0] = g.partial > 0 ? 1.0f : 0.0f;
        if (g.partial > 0)
            pgab_run_heads(a, &g, &kr, tw, scratch + HEADS_MARK, ith, nth);
        else
            pgab_run_groups(a, &g, &kr, tw, ith, nth);
        return;
    }
    const i64 B = a->B, KVH = a->KVH, G = g.G, M = g.M, D = g.D, N = g.N, Dp = g.Dp;
    const size_t region = split_region(&g);
    for (i64 u = 0; u < B * KVH; u++) {
        const i64 b = u / KVH, c = u % KVH;
        pgab_prep_kv(a, &g, tw, b, c);
        float *dk = a->dk + u * M * D, *dv = a->dv + u * M * D;
        for (i64 gi = 0; gi < G; gi++) {
            const i64 h = a->grouping ? c * G + gi : gi * KVH + c;
            const i64 bh = b * a->H + h;
            float *shared = scratch + (size_t)bh * region;
            if (g.panel) {
                split_qchunks(a, &g, &kr, tw, shared, bh, ith, nth);
                continue;
            }
            /* each thread the statistics of every row (saved: dot products), in its scratch */
            float *lse = tw + g.o_lse, *dl = tw + g.o_dl;
            pgab_pad_rows(tw + g.o_qp, a->q + bh * N * D, N, D, Dp);
            pgab_pad_rows(tw + g.o_dop, a->d + bh * N * D, N, D, Dp);
            for (i64 i0 = 0; i0 < N; i0 += PGAB_BR)
                pgab_stats_block(a, &g, &kr, tw, tw + g.o_qp, tw + g.o_dop, bh, i0, lse, dl, tw + g.o_dk);
            split_chunks(a, &g, &kr, tw, lse, dl, shared, dk, dv, gi > 0, ith, nth);
        }
    }
}

void pyggml_attn_bwd_node_second(const pyggml_attn_bwd *a, int panels, int layout, const float *scratch, int ith,
                                 int nth) {
    pgab_geom g;
    pgab_geom_init(&g, a, nth, panels);
    if (layout == PYGGML_ATTN_NODE_HEADS) {
        if (scratch[0] == 1.0f) pgab_reduce_heads(a, &g, scratch + HEADS_MARK, ith, nth);
        return;
    }
    if (layout != PYGGML_ATTN_NODE_SPLIT) return;
    const i64 B = a->B, KVH = a->KVH, G = g.G, M = g.M, D = g.D, N = g.N;
    const size_t region = split_region(&g);
    for (i64 u = 0; u < B * KVH; u++) {
        const i64 b = u / KVH, c = u % KVH;
        float *dk = a->dk + u * M * D, *dv = a->dv + u * M * D;
        for (i64 gi = 0; gi < G; gi++) {
            const i64 h = a->grouping ? c * G + gi : gi * KVH + c;
            const i64 bh = b * a->H + h;
            if (g.panel)
                split_reduce_dkdv(&g, scratch + (size_t)bh * region, dk, dv, gi > 0, M * ith / nth,
                                  M * (ith + 1) / nth);
            else
                split_reduce_dq(a, &g, scratch + (size_t)bh * region, bh, N * ith / nth, N * (ith + 1) / nth);
        }
    }
}
