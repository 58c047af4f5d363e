/* attn_blocked_impl.h: what attn_blocked.c (the geometry, the head pass, group mode, the
 * driver) and attn_split.c (split and head mode, the graph node's two parts) share of the
 * blocked attention backward. Internal to libpyggml_rt. */
#pragma once

#include "attn_blocked.h"
#include "attn_blocked_kernels.h"

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

/* the geometry of a run on nth threads, with the statistics sweep's panels on or off */
void pgab_geom_init(pgab_geom *g, const pyggml_attn_bwd *a, int nth, int panels);

static inline int pgab_cancelled(const pyggml_attn_bwd *a) {
    return a->cancel != NULL && __atomic_load_n(a->cancel, __ATOMIC_RELAXED) != 0;
}

/* the head pass and its steps (attn_blocked.c) */
void pgab_prep_kv(const pyggml_attn_bwd *a, const pgab_geom *g, float *tw, i64 b, i64 c);
void pgab_pad_rows(float *dst, const float *src, i64 n, i64 D, i64 Dp);
void pgab_stats_block(const pyggml_attn_bwd *a, const pgab_geom *g, const pgab_kernels *kr, const float *tw,
                      const float *qp, const float *dop, i64 bh, i64 i0, float *lse, float *dl, float *l);
void pgab_key_block(const pyggml_attn_bwd *a, const pgab_geom *g, const pgab_kernels *kr, float *tw,
                    const float *qp, const float *dop, const float *lse, const float *dl, float *dqp, i64 j0,
                    float *dkd, float *dvd, int add);
void pgab_panel_query_block(const pyggml_attn_bwd *a, const pgab_geom *g, const pgab_kernels *kr, float *tw,
                            i64 i0, float *dka, float *dva);
void pgab_head_pass(const pyggml_attn_bwd *a, const pgab_geom *g, const pgab_kernels *kr, float *tw,
                    i64 b, i64 h, float *dkd, float *dvd, int add);
void pgab_run_groups(const pyggml_attn_bwd *a, const pgab_geom *g, const pgab_kernels *kr, float *tw,
                     int ith, int nth);

/* the modes whose threads meet (attn_split.c) */
void pgab_run_split(const pyggml_attn_bwd *a, const pgab_geom *g, const pgab_kernels *kr, float *tw,
                    float *shared, int ith, int nth, pyggml_barrier_fn barrier, void *barrier_ctx);
void pgab_run_heads(const pyggml_attn_bwd *a, const pgab_geom *g, const pgab_kernels *kr, float *tw,
                    float *partial, int ith, int nth);
void pgab_reduce_heads(const pyggml_attn_bwd *a, const pgab_geom *g, const float *partial, int ith, int nth);
