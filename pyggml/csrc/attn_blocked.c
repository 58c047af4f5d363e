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
 *   Every float operation on a given output element therefore happens in the same order
 *   regardless of the partition: results are bitwise identical for any thread count, with or
 *   without barrier, and from run to run (static partition, no atomics).
 *
 * MEMORY: per thread  (2 D Mp + M Dp) + 3 N Dp + 2 N + 2 Br Bc + 2 Bc Dp floats; plus, only when
 *   head mode is possible, 2 B (H - KVH) M D floats shared.
 */
#define _POSIX_C_SOURCE 200809L
#include "attn_blocked.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>
#define PGAB_X86 1
#define PGAB_AVX2 __attribute__((target("avx2,fma")))
#define PGAB_AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma")))
#else
#define PGAB_X86 0
#endif

/* Tile sizes.  BC must be a multiple of 16 (S/dP tile row stride, vector width). */
#ifndef PGAB_BR
#define PGAB_BR 64
#endif
#ifndef PGAB_BC
#define PGAB_BC 64
#endif

typedef int64_t i64;

static i64 rup(i64 x, i64 m) { return (x + m - 1) / m * m; }
static i64 imin(i64 a, i64 b) { return a < b ? a : b; }
static i64 imax(i64 a, i64 b) { return a > b ? a : b; }

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

static i64 nvis_of(i64 r, i64 diag, i64 bc, int masked) {
    return masked ? imax(0, imin(bc, diag + r + 1)) : bc;
}

/* ---------------------------------- portable versions ------------------------------------- */

static void gemm_port(i64 m, i64 n, i64 k, const float *A, ptrdiff_t rsa, ptrdiff_t csa,
                      const float *B, ptrdiff_t ldb, float *C, ptrdiff_t ldc, int acc) {
    for (i64 j0 = 0; j0 < n; j0 += 8) {
        for (i64 i0 = 0; i0 < m; i0 += 4) {
            const i64 mr = imin(4, m - i0);
            float c[4][8];
            for (i64 r = 0; r < 4; r++)
                for (int t = 0; t < 8; t++)
                    c[r][t] = (acc && r < mr) ? C[(i0 + r) * ldc + j0 + t] : 0.0f;
            for (i64 p = 0; p < k; p++) {
                const float *b = B + p * ldb + j0;
                for (i64 r = 0; r < mr; r++) {
                    const float av = A[(i0 + r) * rsa + p * csa];
                    for (int t = 0; t < 8; t++) c[r][t] += av * b[t];
                }
            }
            for (i64 r = 0; r < mr; r++)
                for (int t = 0; t < 8; t++) C[(i0 + r) * ldc + j0 + t] = c[r][t];
        }
    }
}

static void tile_bwd_port(i64 nr, i64 ncols, float *S, float *dP, ptrdiff_t ld, const float *lse,
                          const float *delta, i64 diag, i64 bc, int masked, float scale) {
    for (i64 r = 0; r < nr; r++) {
        const i64 nv = nvis_of(r, diag, bc, masked);
        float *s = S + r * ld, *dp = dP + r * ld;
        const float L = lse[r], dl = delta[r];
        for (i64 c = 0; c < ncols; c++) {
            const float p = c < nv ? expf(s[c] * scale - L) : 0.0f;
            s[c] = p;
            dp[c] = p * (dp[c] - dl) * scale;
        }
    }
}

static void tile_stats_port(i64 nr, i64 ncols, const float *S, const float *dP, ptrdiff_t ld,
                            i64 diag, i64 bc, int masked, float scale, float *m, float *l, float *u) {
    (void)ncols;
    for (i64 r = 0; r < nr; r++) {
        const i64 nv = nvis_of(r, diag, bc, masked);
        if (nv == 0) continue;
        const float *s = S + r * ld, *dp = dP + r * ld;
        float mx = s[0] * scale;
        for (i64 c = 1; c < nv; c++) mx = fmaxf(mx, s[c] * scale);
        const float mo = m[r];
        const float mn = fmaxf(mo, mx);
        const float alpha = mo == -INFINITY ? 0.0f : expf(mo - mn);
        float sl = 0.0f, su = 0.0f;
        for (i64 c = 0; c < nv; c++) {
            const float p = expf(s[c] * scale - mn);
            sl += p;
            su += p * dp[c];
        }
        m[r] = mn;
        l[r] = l[r] * alpha + sl;
        u[r] = u[r] * alpha + su;
    }
}

/* ------------------------------------ AVX2 + FMA ------------------------------------------ */
#if PGAB_X86

/* 6 x (8*NV) micro-kernel; MR, NV are compile-time constants after inlining. */
PGAB_AVX2_INLINE void mk_avx2(const int MR, const int NV, i64 k, const float *A, ptrdiff_t rsa,
                              ptrdiff_t csa, const float *B, ptrdiff_t ldb, float *C, ptrdiff_t ldc,
                              int acc) {
    __m256 c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51;
    c00 = c01 = c10 = c11 = c20 = c21 = c30 = c31 = c40 = c41 = c50 = c51 = _mm256_setzero_ps();
    if (acc) {
#define PGAB_LD(r, v, reg) if (MR > r && NV > v) reg = _mm256_loadu_ps(C + r * ldc + 8 * v)
        PGAB_LD(0, 0, c00); PGAB_LD(0, 1, c01); PGAB_LD(1, 0, c10); PGAB_LD(1, 1, c11);
        PGAB_LD(2, 0, c20); PGAB_LD(2, 1, c21); PGAB_LD(3, 0, c30); PGAB_LD(3, 1, c31);
        PGAB_LD(4, 0, c40); PGAB_LD(4, 1, c41); PGAB_LD(5, 0, c50); PGAB_LD(5, 1, c51);
#undef PGAB_LD
    }
    const float *a0 = A, *a1 = A + rsa, *a2 = A + 2 * rsa;
    const float *a3 = A + 3 * rsa, *a4 = A + 4 * rsa, *a5 = A + 5 * rsa;
    for (i64 p = 0; p < k; p++) {
        const __m256 b0 = _mm256_loadu_ps(B);
        const __m256 b1 = NV > 1 ? _mm256_loadu_ps(B + 8) : b0;
        __m256 av;
#define PGAB_ROW(r, ar, x0, x1)                                   \
        if (MR > r) {                                             \
            av = _mm256_broadcast_ss(ar);                         \
            x0 = _mm256_fmadd_ps(av, b0, x0);                     \
            if (NV > 1) x1 = _mm256_fmadd_ps(av, b1, x1);         \
            ar += csa;                                            \
        }
        PGAB_ROW(0, a0, c00, c01)
        PGAB_ROW(1, a1, c10, c11)
        PGAB_ROW(2, a2, c20, c21)
        PGAB_ROW(3, a3, c30, c31)
        PGAB_ROW(4, a4, c40, c41)
        PGAB_ROW(5, a5, c50, c51)
#undef PGAB_ROW
        B += ldb;
    }
#define PGAB_ST(r, v, reg) if (MR > r && NV > v) _mm256_storeu_ps(C + r * ldc + 8 * v, reg)
    PGAB_ST(0, 0, c00); PGAB_ST(0, 1, c01); PGAB_ST(1, 0, c10); PGAB_ST(1, 1, c11);
    PGAB_ST(2, 0, c20); PGAB_ST(2, 1, c21); PGAB_ST(3, 0, c30); PGAB_ST(3, 1, c31);
    PGAB_ST(4, 0, c40); PGAB_ST(4, 1, c41); PGAB_ST(5, 0, c50); PGAB_ST(5, 1, c51);
#undef PGAB_ST
}

#define PGAB_MK_ROWS(NV)                                                                      \
    do {                                                                                      \
        i64 i = 0;                                                                            \
        for (; i + 6 <= m; i += 6)                                                            \
            mk_avx2(6, NV, k, A + i * rsa, rsa, csa, B + j, ldb, C + i * ldc + j, ldc, acc);  \
        switch (m - i) {                                                                      \
        case 5: mk_avx2(5, NV, k, A + i * rsa, rsa, csa, B + j, ldb, C + i * ldc + j, ldc, acc); break; \
        case 4: mk_avx2(4, NV, k, A + i * rsa, rsa, csa, B + j, ldb, C + i * ldc + j, ldc, acc); break; \
        case 3: mk_avx2(3, NV, k, A + i * rsa, rsa, csa, B + j, ldb, C + i * ldc + j, ldc, acc); break; \
        case 2: mk_avx2(2, NV, k, A + i * rsa, rsa, csa, B + j, ldb, C + i * ldc + j, ldc, acc); break; \
        case 1: mk_avx2(1, NV, k, A + i * rsa, rsa, csa, B + j, ldb, C + i * ldc + j, ldc, acc); break; \
        default: break;                                                                       \
        }                                                                                     \
    } while (0)

static PGAB_AVX2 void gemm_avx2(i64 m, i64 n, i64 k, const float *A, ptrdiff_t rsa, ptrdiff_t csa,
                                const float *B, ptrdiff_t ldb, float *C, ptrdiff_t ldc, int acc) {
    i64 j = 0;
    for (; j + 16 <= n; j += 16) PGAB_MK_ROWS(2);
    if (j < n) PGAB_MK_ROWS(1);
}

/* exp(x) for x <= 88; returns 0 for x < -87 (results there are < 1.7e-38, flushed).
 * Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, degree-7 Taylor polynomial for e^r
 * (truncation error < 6e-9 relative), scaled by 2^n through the exponent field. */
PGAB_AVX2_INLINE __m256 exp_avx2(__m256 x) {
    const __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_LT_OQ);
    x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.0f)), _mm256_set1_ps(-87.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(tiny, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

/* lanes c..c+7 visible iff c + lane < nv */
PGAB_AVX2_INLINE __m256 vis_mask(i64 c, i64 nv) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const i64 lim = nv - c; /* may be <= 0 or >= 8 */
    const int li = (int)(lim < 0 ? 0 : (lim > 8 ? 8 : lim));
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(li), lane));
}

static PGAB_AVX2 void tile_bwd_avx2(i64 nr, i64 ncols, float *S, float *dP, ptrdiff_t ld,
                                    const float *lse, const float *delta, i64 diag, i64 bc,
                                    int masked, float scale) {
    const __m256 sc = _mm256_set1_ps(scale);
    for (i64 r = 0; r < nr; r++) {
        const i64 nv = nvis_of(r, diag, bc, masked);
        float *s = S + r * ld, *dp = dP + r * ld;
        const __m256 L = _mm256_set1_ps(lse[r]), dl = _mm256_set1_ps(delta[r]);
        for (i64 c = 0; c < ncols; c += 8) {
            __m256 p = exp_avx2(_mm256_fmsub_ps(_mm256_loadu_ps(s + c), sc, L));
            if (c + 8 > nv) p = _mm256_and_ps(p, vis_mask(c, nv));
            const __m256 ds = _mm256_mul_ps(_mm256_mul_ps(p, _mm256_sub_ps(_mm256_loadu_ps(dp + c), dl)), sc);
            _mm256_storeu_ps(s + c, p);
            _mm256_storeu_ps(dp + c, ds);
        }
    }
}

PGAB_AVX2_INLINE float hsum_avx2(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

PGAB_AVX2_INLINE float hmax_avx2(__m256 v) {
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

static PGAB_AVX2 void tile_stats_avx2(i64 nr, i64 ncols, const float *S, const float *dP, ptrdiff_t ld,
                                      i64 diag, i64 bc, int masked, float scale, float *m, float *l,
                                      float *u) {
    const __m256 sc = _mm256_set1_ps(scale);
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    for (i64 r = 0; r < nr; r++) {
        const i64 nv = nvis_of(r, diag, bc, masked);
        if (nv == 0) continue;
        const float *s = S + r * ld, *dp = dP + r * ld;
        const i64 nc = imin(ncols, rup(nv, 8));
        __m256 vm = ninf;
        for (i64 c = 0; c < nc; c += 8) {
            __m256 x = _mm256_mul_ps(_mm256_loadu_ps(s + c), sc);
            if (c + 8 > nv) x = _mm256_blendv_ps(ninf, x, vis_mask(c, nv));
            vm = _mm256_max_ps(vm, x);
        }
        const float mo = m[r];
        const float mn = fmaxf(mo, hmax_avx2(vm));
        const float alpha = mo == -INFINITY ? 0.0f
                                            : _mm256_cvtss_f32(exp_avx2(_mm256_set1_ps(mo - mn)));
        const __m256 M = _mm256_set1_ps(mn);
        __m256 vl = _mm256_setzero_ps(), vu = _mm256_setzero_ps();
        for (i64 c = 0; c < nc; c += 8) {
            __m256 p = exp_avx2(_mm256_fmsub_ps(_mm256_loadu_ps(s + c), sc, M));
            if (c + 8 > nv) p = _mm256_and_ps(p, vis_mask(c, nv));
            vl = _mm256_add_ps(vl, p);
            vu = _mm256_fmadd_ps(p, _mm256_loadu_ps(dp + c), vu);
        }
        m[r] = mn;
        l[r] = l[r] * alpha + hsum_avx2(vl);
        u[r] = u[r] * alpha + hsum_avx2(vu);
    }
}
#endif /* PGAB_X86 */

/* ---------------------------------- AVX-512 (F/VL/DQ/BW) ---------------------------------- */
#if PGAB_X86
#define PGAB_AVX512 __attribute__((target("avx512f,avx512vl,avx512dq,avx512bw,fma")))
#define PGAB_AVX512_INLINE \
    static inline __attribute__((always_inline, target("avx512f,avx512vl,avx512dq,avx512bw,fma")))

/* Rows per micro-kernel call (compile-time; 8 fits the 64-row tiles exactly). */
#ifndef PGAB_MR512
#define PGAB_MR512 8
#endif

/* MR x (16*NV) micro-kernel, MR <= 12, NV in {1, 2}; when TAIL, the last vector of each row
 * covers only the columns of tmask (masked loads/stores: nothing outside is touched).
 * The k loop does, per C element, the same fused multiply-adds in the same order as mk_avx2
 * (c = fma(a_p, b_p, c), p = 0..k-1), so both paths give the same bits. */
PGAB_AVX512_INLINE void mk_avx512(const int MR, const int NV, const int TAIL, __mmask16 tmask, i64 k,
                                  const float *A, ptrdiff_t rsa, ptrdiff_t csa, const float *B,
                                  ptrdiff_t ldb, float *C, ptrdiff_t ldc, int acc) {
    __m512 c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51;
    __m512 c60, c61, c70, c71, c80, c81, c90, c91, ca0, ca1, cb0, cb1;
    c00 = c01 = c10 = c11 = c20 = c21 = c30 = c31 = c40 = c41 = c50 = c51 = _mm512_setzero_ps();
    c60 = c61 = c70 = c71 = c80 = c81 = c90 = c91 = ca0 = ca1 = cb0 = cb1 = _mm512_setzero_ps();
    /* vector v of a row is the masked one iff TAIL && v == NV - 1 */
#define PGAB_ISM(v) (TAIL && (v) == NV - 1)
    if (acc) {
#define PGAB_LD(r, v, reg)                                                                 \
        if (MR > r && NV > v)                                                              \
            reg = PGAB_ISM(v) ? _mm512_maskz_loadu_ps(tmask, C + r * ldc + 16 * v)         \
                              : _mm512_loadu_ps(C + r * ldc + 16 * v)
        PGAB_LD(0, 0, c00); PGAB_LD(0, 1, c01); PGAB_LD(1, 0, c10); PGAB_LD(1, 1, c11);
        PGAB_LD(2, 0, c20); PGAB_LD(2, 1, c21); PGAB_LD(3, 0, c30); PGAB_LD(3, 1, c31);
        PGAB_LD(4, 0, c40); PGAB_LD(4, 1, c41); PGAB_LD(5, 0, c50); PGAB_LD(5, 1, c51);
        PGAB_LD(6, 0, c60); PGAB_LD(6, 1, c61); PGAB_LD(7, 0, c70); PGAB_LD(7, 1, c71);
        PGAB_LD(8, 0, c80); PGAB_LD(8, 1, c81); PGAB_LD(9, 0, c90); PGAB_LD(9, 1, c91);
        PGAB_LD(10, 0, ca0); PGAB_LD(10, 1, ca1); PGAB_LD(11, 0, cb0); PGAB_LD(11, 1, cb1);
#undef PGAB_LD
    }
    const float *a0 = A, *a1 = A + rsa, *a2 = A + 2 * rsa, *a3 = A + 3 * rsa;
    const float *a4 = A + 4 * rsa, *a5 = A + 5 * rsa, *a6 = A + 6 * rsa, *a7 = A + 7 * rsa;
    const float *a8 = A + 8 * rsa, *a9 = A + 9 * rsa, *aa = A + 10 * rsa, *ab = A + 11 * rsa;
    for (i64 p = 0; p < k; p++) {
        const __m512 b0 = PGAB_ISM(0) ? _mm512_maskz_loadu_ps(tmask, B) : _mm512_loadu_ps(B);
        const __m512 b1 = NV > 1 ? (PGAB_ISM(1) ? _mm512_maskz_loadu_ps(tmask, B + 16)
                                                : _mm512_loadu_ps(B + 16))
                                 : b0;
        __m512 av;
#define PGAB_ROW(r, ar, x0, x1)                                   \
        if (MR > r) {                                             \
            av = _mm512_set1_ps(*ar);                             \
            x0 = _mm512_fmadd_ps(av, b0, x0);                     \
            if (NV > 1) x1 = _mm512_fmadd_ps(av, b1, x1);         \
            ar += csa;                                            \
        }
        PGAB_ROW(0, a0, c00, c01)
        PGAB_ROW(1, a1, c10, c11)
        PGAB_ROW(2, a2, c20, c21)
        PGAB_ROW(3, a3, c30, c31)
        PGAB_ROW(4, a4, c40, c41)
        PGAB_ROW(5, a5, c50, c51)
        PGAB_ROW(6, a6, c60, c61)
        PGAB_ROW(7, a7, c70, c71)
        PGAB_ROW(8, a8, c80, c81)
        PGAB_ROW(9, a9, c90, c91)
        PGAB_ROW(10, aa, ca0, ca1)
        PGAB_ROW(11, ab, cb0, cb1)
#undef PGAB_ROW
        B += ldb;
    }
#define PGAB_ST(r, v, reg)                                                                 \
    if (MR > r && NV > v) {                                                                \
        if (PGAB_ISM(v)) _mm512_mask_storeu_ps(C + r * ldc + 16 * v, tmask, reg);          \
        else _mm512_storeu_ps(C + r * ldc + 16 * v, reg);                                  \
    }
    PGAB_ST(0, 0, c00); PGAB_ST(0, 1, c01); PGAB_ST(1, 0, c10); PGAB_ST(1, 1, c11);
    PGAB_ST(2, 0, c20); PGAB_ST(2, 1, c21); PGAB_ST(3, 0, c30); PGAB_ST(3, 1, c31);
    PGAB_ST(4, 0, c40); PGAB_ST(4, 1, c41); PGAB_ST(5, 0, c50); PGAB_ST(5, 1, c51);
    PGAB_ST(6, 0, c60); PGAB_ST(6, 1, c61); PGAB_ST(7, 0, c70); PGAB_ST(7, 1, c71);
    PGAB_ST(8, 0, c80); PGAB_ST(8, 1, c81); PGAB_ST(9, 0, c90); PGAB_ST(9, 1, c91);
    PGAB_ST(10, 0, ca0); PGAB_ST(10, 1, ca1); PGAB_ST(11, 0, cb0); PGAB_ST(11, 1, cb1);
#undef PGAB_ST
#undef PGAB_ISM
}

/* all rows of one column panel: full MR-row calls, then one call for the remaining rows */
#define PGAB_MK512_CALL(R, NV, TAIL) \
    mk_avx512(R, NV, TAIL, tmask, k, A + i * rsa, rsa, csa, B + j, ldb, C + i * ldc + j, ldc, acc)
#define PGAB_MK512_ROWS(NV, TAIL)                                                             \
    do {                                                                                      \
        i64 i = 0;                                                                            \
        for (; i + PGAB_MR512 <= m; i += PGAB_MR512) PGAB_MK512_CALL(PGAB_MR512, NV, TAIL);   \
        switch (m - i) {                                                                      \
        case 11: PGAB_MK512_CALL(11, NV, TAIL); break;                                        \
        case 10: PGAB_MK512_CALL(10, NV, TAIL); break;                                        \
        case 9: PGAB_MK512_CALL(9, NV, TAIL); break;                                          \
        case 8: PGAB_MK512_CALL(8, NV, TAIL); break;                                          \
        case 7: PGAB_MK512_CALL(7, NV, TAIL); break;                                          \
        case 6: PGAB_MK512_CALL(6, NV, TAIL); break;                                          \
        case 5: PGAB_MK512_CALL(5, NV, TAIL); break;                                          \
        case 4: PGAB_MK512_CALL(4, NV, TAIL); break;                                          \
        case 3: PGAB_MK512_CALL(3, NV, TAIL); break;                                          \
        case 2: PGAB_MK512_CALL(2, NV, TAIL); break;                                          \
        case 1: PGAB_MK512_CALL(1, NV, TAIL); break;                                          \
        default: break;                                                                       \
        }                                                                                     \
    } while (0)

/* columns in panels of 32; the last n % 32 (8, 16 or 24) columns as one narrower panel */
static PGAB_AVX512 void gemm_avx512(i64 m, i64 n, i64 k, const float *A, ptrdiff_t rsa,
                                    ptrdiff_t csa, const float *B, ptrdiff_t ldb, float *C,
                                    ptrdiff_t ldc, int acc) {
    const __mmask16 tmask = 0x00ff;
    i64 j = 0;
    for (; j + 32 <= n; j += 32) PGAB_MK512_ROWS(2, 0);
    switch (n - j) {
    case 24: PGAB_MK512_ROWS(2, 1); break;
    case 16: PGAB_MK512_ROWS(1, 0); break;
    case 8: PGAB_MK512_ROWS(1, 1); break;
    default: break;
    }
}
#undef PGAB_MK512_ROWS
#undef PGAB_MK512_CALL

/* exp_avx2 on 16 lanes: the same operations, so the same bits. */
PGAB_AVX512_INLINE __m512 exp_avx512(__m512 x) {
    const __mmask16 ok = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_NLT_UQ);
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.0f)), _mm512_set1_ps(-87.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mul_ps(ok, p, _mm512_castsi512_ps(e));
}

/* lanes c..c+15 with c + lane < lim */
PGAB_AVX512_INLINE __mmask16 lanes_below(i64 c, i64 lim) {
    const i64 d = lim - c;
    return d >= 16 ? (__mmask16)0xffff : (d <= 0 ? (__mmask16)0 : (__mmask16)((1u << d) - 1u));
}

static PGAB_AVX512 void tile_bwd_avx512(i64 nr, i64 ncols, float *S, float *dP, ptrdiff_t ld,
                                        const float *lse, const float *delta, i64 diag, i64 bc,
                                        int masked, float scale) {
    const __m512 sc = _mm512_set1_ps(scale);
    for (i64 r = 0; r < nr; r++) {
        const i64 nv = nvis_of(r, diag, bc, masked);
        float *s = S + r * ld, *dp = dP + r * ld;
        const __m512 L = _mm512_set1_ps(lse[r]), dl = _mm512_set1_ps(delta[r]);
        i64 c = 0;
        for (; c + 16 <= ncols; c += 16) {
            __m512 p = exp_avx512(_mm512_fmsub_ps(_mm512_loadu_ps(s + c), sc, L));
            if (c + 16 > nv) p = _mm512_maskz_mov_ps(lanes_below(c, nv), p);
            const __m512 ds = _mm512_mul_ps(_mm512_mul_ps(p, _mm512_sub_ps(_mm512_loadu_ps(dp + c), dl)), sc);
            _mm512_storeu_ps(s + c, p);
            _mm512_storeu_ps(dp + c, ds);
        }
        if (c < ncols) { /* 8 columns left */
            const __mmask16 t = 0x00ff;
            __m512 p = exp_avx512(_mm512_fmsub_ps(_mm512_maskz_loadu_ps(t, s + c), sc, L));
            p = _mm512_maskz_mov_ps(lanes_below(c, nv), p);
            const __m512 ds = _mm512_mul_ps(_mm512_mul_ps(p, _mm512_sub_ps(_mm512_maskz_loadu_ps(t, dp + c), dl)), sc);
            _mm512_mask_storeu_ps(s + c, t, p);
            _mm512_mask_storeu_ps(dp + c, t, ds);
        }
    }
}

/* The sums run over 8 lanes in the order of tile_stats_avx2 (the low then the high half of
 * each 16-column vector), so this too gives the bits of the AVX2 path. */
static PGAB_AVX512 void tile_stats_avx512(i64 nr, i64 ncols, const float *S, const float *dP,
                                          ptrdiff_t ld, i64 diag, i64 bc, int masked, float scale,
                                          float *m, float *l, float *u) {
    const __m512 sc = _mm512_set1_ps(scale);
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    for (i64 r = 0; r < nr; r++) {
        const i64 nv = nvis_of(r, diag, bc, masked);
        if (nv == 0) continue;
        const float *s = S + r * ld, *dp = dP + r * ld;
        const i64 nc = imin(ncols, rup(nv, 8));
        __m512 vm = ninf;
        for (i64 c = 0; c < nc; c += 16) {
            const __mmask16 vis = lanes_below(c, nv);
            vm = _mm512_mask_max_ps(vm, vis, vm, _mm512_mul_ps(_mm512_maskz_loadu_ps(vis, s + c), sc));
        }
        const float mo = m[r];
        const float mn = fmaxf(mo, _mm512_reduce_max_ps(vm));
        const float alpha = mo == -INFINITY ? 0.0f
                                            : _mm512_cvtss_f32(exp_avx512(_mm512_set1_ps(mo - mn)));
        const __m512 Mv = _mm512_set1_ps(mn);
        __m256 vl = _mm256_setzero_ps(), vu = _mm256_setzero_ps();
        for (i64 c = 0; c < nc; c += 16) {
            const __mmask16 ld16 = lanes_below(c, nc);   /* loaded columns (multiple of 8) */
            const __mmask16 vis = lanes_below(c, nv);
            const __m512 p = _mm512_maskz_mov_ps(
                vis, exp_avx512(_mm512_fmsub_ps(_mm512_maskz_loadu_ps(ld16, s + c), sc, Mv)));
            const __m512 d = _mm512_maskz_loadu_ps(ld16, dp + c);
            vl = _mm256_add_ps(vl, _mm512_castps512_ps256(p));
            vu = _mm256_fmadd_ps(_mm512_castps512_ps256(p), _mm512_castps512_ps256(d), vu);
            if (c + 8 < nc) {
                const __m256 ph = _mm512_extractf32x8_ps(p, 1);
                vl = _mm256_add_ps(vl, ph);
                vu = _mm256_fmadd_ps(ph, _mm512_extractf32x8_ps(d, 1), vu);
            }
        }
        m[r] = mn;
        l[r] = l[r] * alpha + hsum_avx2(vl);
        u[r] = u[r] * alpha + hsum_avx2(vu);
    }
}
#endif /* PGAB_X86 */

/* ------------------------------------- dispatch ------------------------------------------- */
typedef struct {
    pgab_gemm_fn gemm;
    pgab_tile_bwd_fn tile_bwd;
    pgab_tile_stats_fn tile_stats;
} pgab_kernels;

/* requested path: 0 = best the CPU has, 1 = portable, 2 = AVX2+FMA, 3 = AVX-512 (each falls back
 * to the best lower path the CPU has) */
static int g_isa_request = 0;

static int cpu_has_avx2(void) {
#if PGAB_X86
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

static int cpu_has_avx512(void) {
#if PGAB_X86
    return cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw");
#else
    return 0;
#endif
}

/* the path in use: 1 portable, 2 AVX2+FMA, 3 AVX-512 */
static int isa_in_use(void) {
    const int want = g_isa_request == 0 ? 3 : g_isa_request;
    if (want >= 3 && cpu_has_avx512()) return 3;
    if (want >= 2 && cpu_has_avx2()) return 2;
    return 1;
}

static pgab_kernels pick_kernels(void) {
    pgab_kernels kr = {gemm_port, tile_bwd_port, tile_stats_port};
#if PGAB_X86
    switch (isa_in_use()) {
    case 3:
        kr.gemm = gemm_avx512;
        kr.tile_bwd = tile_bwd_avx512;
        kr.tile_stats = tile_stats_avx512;
        break;
    case 2:
        kr.gemm = gemm_avx2;
        kr.tile_bwd = tile_bwd_avx2;
        kr.tile_stats = tile_stats_avx2;
        break;
    default:
        break;
    }
#endif
    return kr;
}

int pyggml_attn_bwd_set_isa(int force) {
    g_isa_request = (force >= 1 && force <= 3) ? force : 0;
    return isa_in_use();
}

/* ------------------------------------- geometry ------------------------------------------- */
typedef struct {
    i64 D, Dp, N, M, Mp, G;
    /* offsets (floats) into a thread's scratch */
    size_t o_kt, o_vt, o_kp, o_qp, o_dop, o_dqp, o_lse, o_dl, o_s, o_dp, o_dk, o_dv;
    size_t per_thread;   /* floats, multiple of 16 */
    size_t partial;      /* floats of the shared head-mode partial buffer (0 if head mode impossible) */
} pgab_geom;

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
    g->per_thread = at;
    g->partial = head_mode_possible(a, nth) ? (size_t)(2 * a->B * (a->H - a->KVH) * a->M * a->D) : 0;
}

size_t pyggml_attn_bwd_work_size(const pyggml_attn_bwd *a, int n_threads) {
    if (n_threads < 1) n_threads = 1;
    pgab_geom g;
    geom_init(&g, a, n_threads);
    return (g.per_thread * (size_t)n_threads + rup((i64)g.partial, 16)) * sizeof(float) + 64;
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

/* Backward of query head (b, h) against the kv head prepared in tw.  dK/dV of the head are
 * written to dkd/dvd ([M][D]) when add == 0, added to them when add != 0. */
static void head_pass(const pyggml_attn_bwd *a, const pgab_geom *g, const pgab_kernels *kr, float *tw,
                      i64 b, i64 h, float *dkd, float *dvd, int add) {
    const i64 D = g->D, Dp = g->Dp, N = g->N, M = g->M;
    const i64 off = M - N;
    const int masked = a->masked;
    const float scale = a->scale;
    const i64 bh = b * a->H + h;
    float *kt = tw + g->o_kt, *vt = tw + g->o_vt, *kp = tw + g->o_kp;
    float *qp = tw + g->o_qp, *dop = tw + g->o_dop, *dqp = tw + g->o_dqp;
    float *lse = tw + g->o_lse, *dl = tw + g->o_dl;
    float *S = tw + g->o_s, *dP = tw + g->o_dp;
    float *dka = tw + g->o_dk, *dva = tw + g->o_dv;
    const ptrdiff_t ld = PGAB_BC;

    pad_rows(qp, a->q + bh * N * D, N, D, Dp);
    pad_rows(dop, a->d + bh * N * D, N, D, Dp);
    memset(dqp, 0, (size_t)(N * Dp) * sizeof(float));

    /* 1. row statistics */
    if (a->lse && a->o) {
        const float *o = a->o + bh * N * D, *dd = a->d + bh * N * D;
        for (i64 i = 0; i < N; i++) {
            double s = 0.0;
            for (i64 d = 0; d < D; d++) s += (double)dd[i * D + d] * (double)o[i * D + d];
            dl[i] = (float)s;
            lse[i] = a->lse[bh * N + i];
        }
    } else {
        /* lse holds the running max m, dl the running u; l lives in the dK accumulator
         * buffer (free at this point, >= Br floats). */
        float *l = dka;
        for (i64 i0 = 0; i0 < N; i0 += PGAB_BR) {
            const i64 br = imin(PGAB_BR, N - i0);
            for (i64 r = 0; r < br; r++) {
                lse[i0 + r] = -INFINITY;
                dl[i0 + r] = 0.0f;
                l[r] = 0.0f;
            }
            const i64 jend = masked ? imin(M, off + i0 + br) : M;
            if (cancelled(a)) return;
            for (i64 j0 = 0; j0 < jend; j0 += PGAB_BC) {
                const i64 bc = imin(PGAB_BC, M - j0);
                const i64 diag = off + i0 - j0;
                const i64 ncols = rup(nvis_of(br - 1, diag, bc, masked), 8);
                kr->gemm(br, ncols, D, qp + i0 * Dp, Dp, 1, kt + j0 * D, PGAB_BC, S, ld, 0);
                kr->gemm(br, ncols, D, dop + i0 * Dp, Dp, 1, vt + j0 * D, PGAB_BC, dP, ld, 0);
                kr->tile_stats(br, ncols, S, dP, ld, diag, bc, masked, scale, lse + i0, l, dl + i0);
            }
            for (i64 r = 0; r < br; r++) {
                lse[i0 + r] = lse[i0 + r] + logf(l[r]);
                dl[i0 + r] = dl[i0 + r] / l[r];
            }
        }
    }

    /* 2. backward sweep: key blocks outer, query blocks inner */
    for (i64 j0 = 0; j0 < M; j0 += PGAB_BC) {
        if (cancelled(a)) return;
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
            kr->tile_bwd(nr, ncols, S, dP, ld, lse + ia, dl + ia, diag, bc, masked, scale);
            kr->gemm(nmax, Dp, nr, S, 1, ld, dop + ia * Dp, Dp, dva, Dp, 1);
            kr->gemm(nmax, Dp, nr, dP, 1, ld, qp + ia * Dp, Dp, dka, Dp, 1);
            kr->gemm(nr, Dp, nmax, dP, ld, 1, kp + j0 * Dp, Dp, dqp + ia * Dp, Dp, 1);
        }
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
    float *dq = a->dq + bh * N * D;
    for (i64 i = 0; i < N; i++) memcpy(dq + i * D, dqp + i * Dp, (size_t)D * sizeof(float));
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
    return g.per_thread * sizeof(float) + 64;
}

void pyggml_attn_bwd_run_alone(const pyggml_attn_bwd *a, int ith, int nth, void *thread_work) {
    pgab_geom g;
    geom_init(&g, a, nth);
    const pgab_kernels kr = pick_kernels();
    run_groups(a, &g, &kr, (float *)thread_work, ith, nth);
}

void pyggml_attn_bwd_run(const pyggml_attn_bwd *a, int ith, int nth, void *work,
                         pyggml_barrier_fn barrier, void *barrier_ctx) {
    pgab_geom g;
    geom_init(&g, a, nth);
    const pgab_kernels kr = pick_kernels();
    float *tw = (float *)work + (size_t)ith * g.per_thread;
    const i64 B = a->B, H = a->H, KVH = a->KVH, G = g.G, M = g.M, D = g.D;
    const int head_mode = barrier != NULL && head_mode_possible(a, nth);

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

/* ------------------------------- pthread convenience driver ------------------------------- */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n, count;
    unsigned gen;
    int go, abort_run; /* start gate */
} pgab_sync;

static void pgab_barrier(void *ctx) {
    pgab_sync *s = (pgab_sync *)ctx;
    pthread_mutex_lock(&s->mu);
    const unsigned gen = s->gen;
    if (++s->count == s->n) {
        s->count = 0;
        s->gen++;
        pthread_cond_broadcast(&s->cv);
    } else {
        while (gen == s->gen) pthread_cond_wait(&s->cv, &s->mu);
    }
    pthread_mutex_unlock(&s->mu);
}

typedef struct {
    const pyggml_attn_bwd *a;
    int ith, nth;
    void *work;
    pgab_sync *sync;
} pgab_targ;

static void *pgab_thread(void *p) {
    pgab_targ *t = (pgab_targ *)p;
    pgab_sync *s = t->sync;
    pthread_mutex_lock(&s->mu);
    while (!s->go) pthread_cond_wait(&s->cv, &s->mu);
    const int ab = s->abort_run;
    pthread_mutex_unlock(&s->mu);
    if (!ab) pyggml_attn_bwd_run(t->a, t->ith, t->nth, t->work, pgab_barrier, s);
    return NULL;
}

int pyggml_attn_bwd_compute(const pyggml_attn_bwd *a, int n_threads) {
    if (!a || a->D < 1 || a->N < 1 || a->M < 1 || a->H < 1 || a->KVH < 1 || a->B < 1 ||
        a->H % a->KVH != 0 || (a->masked && a->M < a->N) || !a->q || !a->k || !a->v || !a->d ||
        !a->dq || !a->dk || !a->dv)
        return 1;
    if (n_threads < 1) n_threads = 1;
    size_t ws = pyggml_attn_bwd_work_size(a, n_threads);
    ws = (ws + 63) / 64 * 64;
    void *work = aligned_alloc(64, ws);
    pgab_targ *args = (pgab_targ *)malloc(sizeof(pgab_targ) * (size_t)n_threads);
    pthread_t *tids = (pthread_t *)malloc(sizeof(pthread_t) * (size_t)n_threads);
    if (!work || !args || !tids) {
        free(work);
        free(args);
        free(tids);
        return 2;
    }
    pgab_sync s;
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.cv, NULL);
    s.n = n_threads;
    s.count = 0;
    s.gen = 0;
    s.go = 0;
    s.abort_run = 0;
    int created = 0, rc = 0;
    for (int t = 0; t < n_threads; t++) args[t] = (pgab_targ){a, t, n_threads, work, &s};
    for (int t = 1; t < n_threads; t++) {
        if (pthread_create(&tids[t], NULL, pgab_thread, &args[t]) != 0) {
            rc = 3;
            break;
        }
        created++;
    }
    pthread_mutex_lock(&s.mu);
    s.go = 1;
    s.abort_run = rc != 0;
    pthread_cond_broadcast(&s.cv);
    pthread_mutex_unlock(&s.mu);
    if (rc == 0) pyggml_attn_bwd_run(a, 0, n_threads, work, pgab_barrier, &s);
    for (int t = 1; t <= created; t++) pthread_join(tids[t], NULL);
    pthread_cond_destroy(&s.cv);
    pthread_mutex_destroy(&s.mu);
    free(work);
    free(args);
    free(tids);
    return rc;
}
