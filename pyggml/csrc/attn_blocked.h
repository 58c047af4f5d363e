/* Blocked (FlashAttention-2 style) scaled-dot-product attention BACKWARD on the CPU, float32.
 *
 * Computes dQ, dK, dV of  O = softmax(scale * Q K^T [+ causal mask]) V  given dO, without ever
 * materialising the N x M attention matrix: work is done on Br x Bc tiles, P is recomputed per
 * tile from the per-row log-sum-exp, and memory is linear in N and M.  See attn_blocked.c for
 * the algorithm, the threading design and the determinism guarantees.
 *
 * Results are bitwise identical for any thread count and whether or not a barrier is given
 * (on a given machine and code path).  The AVX-512 and AVX2/FMA paths do the same float
 * operations in the same order and give the same bits; the portable path differs in the last bits. */
#ifndef PYGGML_ATTN_BLOCKED_H
#define PYGGML_ATTN_BLOCKED_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* exported from libpyggml_rt (built with hidden visibility) for the extension modules */
#if defined(__GNUC__)
#define PYGGML_ATTN_API __attribute__((visibility("default")))
#else
#define PYGGML_ATTN_API
#endif

typedef struct {
    int64_t D, N, M, H, KVH, B;   /* head size, queries, keys, query heads, kv heads, batch */
    float scale;                  /* softmax scale, usually 1/sqrt(D) */
    int masked;                   /* bottom-right causal: key j hidden from query i when j > (M - N) + i  (M >= N) */
    int grouping;                 /* 0: query head h uses kv head h % KVH ; 1: h / (H / KVH) (PyTorch enable_gqa) */
    const float *q, *k, *v, *d;   /* C-contiguous: q, d: [B][H][N][D]; k, v: [B][KVH][M][D]; d = dL/dO */
    const float *lse;             /* optional [B][H][N]: log(sum_j exp(scale*q_i.k_j)) over unmasked j (natural log), or NULL */
    const float *o;               /* optional [B][H][N][D]: forward output O (needed with lse to skip the recompute), or NULL */
    float *dq, *dk, *dv;          /* outputs, C-contiguous like q, k, v; fully overwritten */
    const int *cancel;            /* optional: polled once per key block; non-zero stops every thread soon
                                     (the outputs are then incomplete), NULL never */
} pyggml_attn_bwd;
/* Preconditions (not checked by _run; _compute checks them and returns 1):
 *   D, N, M, H, KVH, B >= 1;  H % KVH == 0;  M >= N when masked;  outputs do not alias inputs.
 * lse and o are only used when BOTH are non-NULL; otherwise the row statistics are recomputed. */

typedef void (*pyggml_barrier_fn)(void *barrier_ctx);

/* Bytes of scratch the run needs for n_threads threads (caller allocates, 64-byte aligned).
 * It is an upper bound valid whether or not a barrier is passed to _run. */
PYGGML_ATTN_API size_t pyggml_attn_bwd_work_size(const pyggml_attn_bwd *a, int n_threads);

/* Thread ith of nth runs its share. All nth threads are called with the same work pointer
 * (of at least pyggml_attn_bwd_work_size(a, nth) bytes, 64-byte aligned).
 * barrier may be NULL: then every thread finishes alone (no cross-thread reduction), with
 * parallelism over (batch, kv-head) pairs.  With a barrier, grouped-query problems that have
 * fewer (batch, kv-head) pairs than threads are also split over query heads (one barrier call
 * per thread, then a fixed-order reduction of dK/dV). */
PYGGML_ATTN_API void pyggml_attn_bwd_run(const pyggml_attn_bwd *a, int ith, int nth, void *work,
                         pyggml_barrier_fn barrier, void *barrier_ctx);

/* The kernel as ggml graph nodes (attn_node.c), whose threads share no barrier but meet
 * between two nodes.  _plan says, from the shape and whether panels are on (PANELS in
 * attn_blocked.c; the node fixes it when it is built), how: ONE node (group mode, or split
 * mode on one thread where the statistics are recomputed without panels), or two, the
 * second reducing what the first left in ``scratch`` (*scratch floats, after dq, dk, dv in
 * the first node's result): SPLIT (split mode over every thread) or HEADS (head mode where
 * the thread count allows it, else group mode).  _first runs in the first node with a
 * thread_work of _node_work_size bytes (64-byte aligned), _second in the second.  The
 * same bits as _run for any thread count. */
enum { PYGGML_ATTN_NODE_ONE = 0, PYGGML_ATTN_NODE_SPLIT = 1, PYGGML_ATTN_NODE_HEADS = 2 };
PYGGML_ATTN_API int pyggml_attn_bwd_node_plan(const pyggml_attn_bwd *a, int panels, int64_t *scratch);
PYGGML_ATTN_API size_t pyggml_attn_bwd_node_work_size(const pyggml_attn_bwd *a, int panels, int layout);
PYGGML_ATTN_API void pyggml_attn_bwd_node_first(const pyggml_attn_bwd *a, int panels, int layout, float *scratch,
                                                int ith, int nth, void *thread_work);
PYGGML_ATTN_API void pyggml_attn_bwd_node_second(const pyggml_attn_bwd *a, int panels, int layout,
                                                 const float *scratch, int ith, int nth);
/* Whether panels are on now (pyggml_attn_bwd_set_panels) */
PYGGML_ATTN_API int pyggml_attn_bwd_panels(void);

/* Convenience: runs n_threads threads itself with pthreads (for tests/benchmarks).
 * 0 ok, 1 invalid arguments, 2 allocation error, 3 thread creation error. */
PYGGML_ATTN_API int pyggml_attn_bwd_compute(const pyggml_attn_bwd *a, int n_threads);

/* Testing hook: which code path the kernels use.
 *   0 = pick at run time: AVX-512 (F/VL/DQ/BW) when the CPU has it, else AVX2+FMA, else portable;
 *   1 = force the portable path;
 *   2 = force AVX2+FMA (portable if the CPU lacks it);
 *   3 = AVX-512 (falls back like 0 if the CPU lacks it).  Other values act as 0.
 * Returns the path now in use: 1 portable, 2 AVX2+FMA, 3 AVX-512.
 * Not thread-safe against concurrent runs; call it before starting any. */
PYGGML_ATTN_API int pyggml_attn_bwd_set_isa(int force);

/* Testing hook: whether group and head modes keep the statistics sweep's S and dP tiles
 * (PANELS in attn_blocked.c: 1, the default) or compute them again in the backward sweep (0),
 * which gives the same bits. Returns the previous setting. Not thread-safe against
 * concurrent runs; call it before starting any. */
PYGGML_ATTN_API int pyggml_attn_bwd_set_panels(int on);

/* Benchmark hook: whether pyggml_attn_bwd_compute starts its helper threads on the CPUs
 * other than the caller's current one (1, the default, on Linux; see start_elsewhere in
 * attn_threads.c) or where the scheduler puts them (0). The bits do not depend on it.
 * Returns the previous setting. Not thread-safe against concurrent runs. */
PYGGML_ATTN_API int pyggml_attn_bwd_set_start_elsewhere(int on);

/* Benchmark hook: runs ``iters`` rounds of independent fused multiply-adds on path ``isa``
 * (2 = AVX2+FMA, 3 = AVX-512, 0 = the path the kernels use) and returns the flops done, or -1 where this CPU (or build)
 * lacks the path. The caller times it (its thread's CPU time). */
PYGGML_ATTN_API double pyggml_attn_fma_flops(int isa, long iters);

/* Benchmark hook: runs the five products of one 64 x 64 tile step of the backward with
 * saved statistics (head size D) ``iters`` times on buffers of its own, in cache, with the
 * kernels in use, and returns the nominal flops done (10 Br Bc D a step), or -1 (D outside
 * 1..1024, iters < 0, no memory). The caller times it: the rate of the kernel's products
 * where memory does not stand in their way. */
PYGGML_ATTN_API double pyggml_attn_tile_flops(int D, long iters);

#ifdef __cplusplus
}
#endif

#endif /* PYGGML_ATTN_BLOCKED_H */
