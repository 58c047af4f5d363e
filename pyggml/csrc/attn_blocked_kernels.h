/* attn_blocked_kernels.h: the inner kernels of pyggml's blocked attention backward (see
 * attn_blocked.c): their types, the tile sizes, and the pick of the fastest set the CPU has
 * (attn_blocked_kernels.c: portable C, AVX2+FMA, AVX-512). Internal to libpyggml_rt. */
#pragma once

#include <stddef.h>
#include <stdint.h>

/* Tile sizes.  BC must be a multiple of 16 (S/dP tile row stride, vector width). */
#ifndef PGAB_BR
#define PGAB_BR 64
#endif
#ifndef PGAB_BC
#define PGAB_BC 64
#endif

typedef int64_t i64;

static inline i64 rup(i64 x, i64 m) { return (x + m - 1) / m * m; }
static inline i64 imin(i64 a, i64 b) { return a < b ? a : b; }
static inline i64 imax(i64 a, i64 b) { return a > b ? a : b; }
/* ------------------------------------------------------------------------------------------ */
/* kernels: C[m x n] (+)= A[m x k] B[k x n]; A(i,p) = A[i*rsa + p*csa]; B row-major (ldb), C row-major
 * (ldc).  n is a multiple of 8.  acc = 0: C is overwritten. */
typedef void (*pgab_gemm_fn)(i64 m, i64 n, i64 k, const float *A, ptrdiff_t rsa, ptrdiff_t csa,
                             const float *B, ptrdiff_t ldb, float *C, ptrdiff_t ldc, int acc);

/* Backward tile pass over rows r < nr, columns c < ncols (multiple of 8) of S and dP (stride ld):
 * S <- P = exp(S*scale - lse_r) (0 where column c >= nvis(r)), dP <- scale * P (dP - delta_r).
 * nvis(r) = masked ? clamp(diag + r + 1, 0, bc) : bc. */
typedef void (*pgab_tile_bwd_fn)(i64 nr, i64 ncols, float *S, float *dP, ptrdiff_t ld,
                                 const float *lse, const float *delta, i64 diag, i64 bc, int masked,
                                 float scale);

/* Forward statistics tile pass: online update of m, l, u for rows r < nr (see top comment). */
typedef void (*pgab_tile_stats_fn)(i64 nr, i64 ncols, const float *S, const float *dP, ptrdiff_t ld,
                                   i64 diag, i64 bc, int masked, float scale, float *m, float *l,
                                   float *u);

static inline i64 nvis_of(i64 r, i64 diag, i64 bc, int masked) {
    return masked ? imax(0, imin(bc, diag + r + 1)) : bc;
}

typedef struct {
    pgab_gemm_fn gemm;
    pgab_tile_bwd_fn tile_bwd;
    pgab_tile_stats_fn tile_stats;
} pgab_kernels;

/* the kernels of the path in use (pyggml_attn_bwd_set_isa chooses; default the best the CPU has) */
pgab_kernels pgab_pick_kernels(void);
