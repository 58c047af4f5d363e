/* attn_blocked_kernels.c: the blocked attention backward's inner kernels (GEMM on a tile, the
 * backward and statistics tile passes) in portable C, AVX2+FMA and AVX-512, and the dispatch
 * between them. The algorithm they serve is described at the top of attn_blocked.c. */
#include "attn_blocked.h"
#include "attn_blocked_kernels.h"

#include <math.h>
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

pgab_kernels pgab_pick_kernels(void) {
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

/* ------------------------------------- FMA peak ------------------------------------------- */
/* The ceiling the kernels above are measured against (scripts/bench_flash_attn_back.py): one
 * core's rate of fused multiply-adds on a path's vector width, from independent chains (more of
 * them than the FMA latency times the pipes on any x86 core seen here: 4 cycles x 2 pipes), each
 * acc = acc * m + a, which converges (|m| < 1) and never meets a subnormal. The accumulators are
 * written to a volatile sink so the compiler keeps the loop. */
#if PGAB_X86
static volatile float g_fma_sink;

#define PGAB_FMA_CHAINS_AVX2 12
static PGAB_AVX2 double fma_loop_avx2(long iters) {
    __m256 acc[PGAB_FMA_CHAINS_AVX2];
    const __m256 m = _mm256_set1_ps(0.999999f), a = _mm256_set1_ps(1e-3f);
    for (int c = 0; c < PGAB_FMA_CHAINS_AVX2; c++) acc[c] = _mm256_set1_ps((float)c);
    for (long i = 0; i < iters; i++) {
#pragma GCC unroll 12
        for (int c = 0; c < PGAB_FMA_CHAINS_AVX2; c++) acc[c] = _mm256_fmadd_ps(acc[c], m, a);
    }
    __m256 s = acc[0];
    for (int c = 1; c < PGAB_FMA_CHAINS_AVX2; c++) s = _mm256_add_ps(s, acc[c]);
    g_fma_sink = _mm256_cvtss_f32(s);
    return 2.0 * 8 * PGAB_FMA_CHAINS_AVX2 * (double)iters;
}

#define PGAB_FMA_CHAINS_AVX512 24
static PGAB_AVX512 double fma_loop_avx512(long iters) {
    __m512 acc[PGAB_FMA_CHAINS_AVX512];
    const __m512 m = _mm512_set1_ps(0.999999f), a = _mm512_set1_ps(1e-3f);
    for (int c = 0; c < PGAB_FMA_CHAINS_AVX512; c++) acc[c] = _mm512_set1_ps((float)c);
    for (long i = 0; i < iters; i++) {
#pragma GCC unroll 24
        for (int c = 0; c < PGAB_FMA_CHAINS_AVX512; c++) acc[c] = _mm512_fmadd_ps(acc[c], m, a);
    }
    __m512 s = acc[0];
    for (int c = 1; c < PGAB_FMA_CHAINS_AVX512; c++) s = _mm512_add_ps(s, acc[c]);
    g_fma_sink = _mm512_reduce_add_ps(s);
    return 2.0 * 16 * PGAB_FMA_CHAINS_AVX512 * (double)iters;
}
#endif

double pyggml_attn_fma_flops(int isa, long iters) {
#if PGAB_X86
    if (iters < 0) return -1.0;
    if (isa == 0) isa = isa_in_use();
    if (isa == 3 && cpu_has_avx512()) return fma_loop_avx512(iters);
    if (isa == 2 && cpu_has_avx2()) return fma_loop_avx2(iters);
#endif
    return -1.0;
}

/* The five products of one tile step of the backward with saved statistics (S = Q KT,
 * dP = dO VT, dV += P^T dO, dK += dS^T Q, dQ += dS K: key_block's calls, one 64 x 64 tile,
 * head size D), ``iters`` times on buffers of its own (288 KB at D = 128, 160 KB at D = 64:
 * in L2, the two 64 x 64 tiles in L1),
 * with the kernels in use. Returns the nominal flops done (10 Br Bc D a step, as the
 * benchmarks count them), or -1 (D outside 1..1024, iters < 0, no memory). */
static volatile float g_tile_sink;

double pyggml_attn_tile_flops(int D, long iters) {
    if (D < 1 || D > 1024 || iters < 0) return -1.0;
    const i64 Dp = rup(D, 8), br = PGAB_BR, bc = PGAB_BC;
    const i64 o_dop = br * Dp, o_kt = 2 * br * Dp, o_vt = o_kt + D * bc, o_kp = o_vt + D * bc;
    const i64 o_s = o_kp + bc * Dp, o_dp = o_s + br * bc, o_dka = o_dp + br * bc, o_dva = o_dka + bc * Dp;
    const i64 o_dqp = o_dva + bc * Dp, total = o_dqp + br * Dp;
    float *buf = aligned_alloc(64, (size_t)rup(total * (i64)sizeof(float), 64));
    if (buf == NULL) return -1.0;
    for (i64 i = 0; i < total; i++) buf[i] = 0.01f * (float)(1 + i % 7);
    const pgab_kernels kr = pgab_pick_kernels();
    for (long it = 0; it < iters; it++) {
        kr.gemm(br, bc, D, buf, Dp, 1, buf + o_kt, bc, buf + o_s, bc, 0);
        kr.gemm(br, bc, D, buf + o_dop, Dp, 1, buf + o_vt, bc, buf + o_dp, bc, 0);
        kr.gemm(bc, Dp, br, buf + o_s, 1, bc, buf + o_dop, Dp, buf + o_dva, Dp, 1);
        kr.gemm(bc, Dp, br, buf + o_dp, 1, bc, buf, Dp, buf + o_dka, Dp, 1);
        kr.gemm(br, Dp, bc, buf + o_dp, bc, 1, buf + o_kp, Dp, buf + o_dqp, Dp, 1);
    }
    g_tile_sink = buf[o_dqp] + buf[o_dka] + buf[o_dva];
    free(buf);
    return 10.0 * (double)(br * bc) * D * (double)iters;
}
