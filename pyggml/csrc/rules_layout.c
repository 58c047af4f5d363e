/* Kernel rules for the [layout] family: concat, get_rows, set_rows, set, diag, pad,
 * pad_reflect_1d, roll, tri, arange, win_part, win_unpart, the copies DUP/CONT/CPY,
 * REPEAT, the views (VIEW, RESHAPE, PERMUTE, TRANSPOSE) and NONE, the op of a leaf.
 * Each rule cites the ggml-cpu function (ggml-cpu/ops.cpp) whose assertions, type
 * switch and silent assumptions it mirrors. */
#include "rules.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

static int64_t ne_prod(const struct ggml_tensor * t) {
    return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
}

/* nb[0] is the element (block) size, or the row holds a single element (block):
 * ggml_is_contiguous_rows, written out (older ggml releases lack it) */
static int rows_or_single(const struct ggml_tensor * t) {
    return t->ne[0] == ggml_blck_size(t->type) || pg_rows_contiguous(t);
}

/* a quantized tensor whose rows hold whole blocks, each stored contiguously */
static int whole_blocks(const struct ggml_tensor * t) {
    return t->ne[0] % ggml_blck_size(t->type) == 0;
}

#define PG_NEED_WHOLE_BLOCKS(x, name, why)                                                       \
    do {                                                                                         \
        if (!whole_blocks(x))                                                                    \
            return pg_refuse(why, "%s rows (ne[0] = %lld) must hold whole %s blocks of %lld", name, \
                             (long long) (x)->ne[0], pg_type(x), (long long) ggml_blck_size((x)->type)); \
    } while (0)

/* ---------------------------------------------------------------------------------------- */

/* ggml_compute_forward_concat: F16/BF16/I16 (concat_f16), I8 (concat_i8), F32/I32
 * (concat_f32) and every other type byte-wise (concat_any), any strides; a quantized
 * type goes to concat_any, which asserts both sources have contiguous rows of whole
 * blocks (it steps over blocks). ggml_concat checks the types, dim and extents.
 * 0.25.3's concat_any copies whole rows (memcpy of ggml_row_size) for every type it
 * takes, F64 and I64 too: it asserts contiguous rows of both sources whatever the type
 * (whole blocks: asserted for dim 0, and by ggml_row_size for the others). */
static int rule_concat(const struct ggml_tensor * t, pg_why * why) {
    PG_NEED_SRC(t, 0, why);
    PG_NEED_SRC(t, 1, why);
    const struct ggml_tensor * a = t->src[0];
    const struct ggml_tensor * b = t->src[1];
    const int dim = t->op_params[0];
    if (a->type != b->type || t->type != a->type) {
        return pg_refuse_type(why, "src0 (%s), src1 (%s) and the result (%s) must have one type",
                              pg_type(a), pg_type(b), pg_type(t));
    }
    if (dim < 0 || dim > 3) {
        return pg_refuse(why, "dim must be in [0, 3], got %d", dim);
    }
    const enum ggml_type ty = a->type;
    const int by_rows = pg_kernel_since((int) t->op, PG_RELEASE(0, 25, 3)) &&   /* concat_any copies rows */
                        !(pg_is_float(ty) || ty == GGML_TYPE_I16 || ty == GGML_TYPE_I8 || ty == GGML_TYPE_I32);
    if (by_rows && !ggml_is_quantized(ty) && (!rows_or_single(a) || !rows_or_single(b))) {
        return pg_refuse(why, "%s sources must have contiguous rows (nb[0] = %zu): the CPU kernel copies whole rows; "
                         "got src0 nb[0] = %zu, src1 nb[0] = %zu", pg_type(a), ggml_type_size(ty), a->nb[0], b->nb[0]);
    }
    if (ggml_is_quantized(ty)) {
        if (!rows_or_single(a) || !rows_or_single(b)) {
            return pg_refuse(why, "quantized sources must have contiguous rows (nb[0] = %zu), got src0 "
                             "nb[0] = %zu, src1 nb[0] = %zu", ggml_type_size(a->type), a->nb[0], b->nb[0]);
        }
        PG_NEED_WHOLE_BLOCKS(a, "src0", why);
        PG_NEED_WHOLE_BLOCKS(b, "src1", why);
    }
    return PYGGML_OK;
}

/* ggml_compute_forward_get_rows: src0 F32/I32 (copied as 4 bytes), F16, BF16, or a
 * quantized type it dequantizes (its switch lists every quantized type with a to_float:
 * q8_K, which has none, aborts); rows of src0 read contiguously (an assert compiled out
 * in release builds: other strides read the wrong memory), whole blocks per row.
 * The indices (src1, I32, any strides) come from tensor data: each must lie in
 * [0, src0->ne[1]) or the kernel aborts (GGML_ASSERT); only the case where no index can
 * be valid (src0 has no rows) is visible here. */
static int rule_get_rows(const struct ggml_tensor * t, pg_why * why) {
    PG_NEED_SRC(t, 0, why);
    PG_NEED_SRC(t, 1, why);
    const struct ggml_tensor * a = t->src[0];
    const struct ggml_tensor * ix = t->src[1];
    enum ggml_type ta = a->type;
    PG_NEED_TYPE(a, "src0", pg_is_float(ta) || ta == GGML_TYPE_I32 || pg_is_dequantizable(ta), why);
    PG_NEED_TYPE(ix, "the indices (src1)", ix->type == GGML_TYPE_I32, why);
    const enum ggml_type want = ta == GGML_TYPE_I32 ? GGML_TYPE_I32 : GGML_TYPE_F32;
    if (t->type != want || !pg_rows_contiguous(t)) {
        return pg_refuse_type(why, "the result must be %s with contiguous rows, got %s",
                              ggml_type_name(want), pg_type(t));
    }
    if (!rows_or_single(a)) {
        PG_NEED_ROWS(a, "src0", why);       /* (a row of one element, or block, may have any nb[0]) */
    }
    if (ggml_is_quantized(ta)) {
        PG_NEED_WHOLE_BLOCKS(a, "src0", why);
    }
    if (t->ne[0] != a->ne[0] || t->ne[1] != ix->ne[0] || t->ne[2] != ix->ne[1] || t->ne[3] != ix->ne[2] ||
        ix->ne[3] != 1 || a->ne[2] != ix->ne[1] || a->ne[3] != ix->ne[2]) {
        return pg_refuse(why, "the result, src0 and the indices do not have get_rows' shapes");
    }
    if (a->ne[1] == 0 && ne_prod(t) > 0) {
        return pg_refuse(why, "src0 has no rows, so every index is out of range (the kernel asserts "
                         "0 <= index < ne[1] = 0)");
    }
    return PYGGML_OK;
}

/* ggml_compute_forward_set_rows: src0 (the rows) F32 or F16, src1 (the indices) I64 or
 * I32, any strides; the result (a view of a) is written with the result type's CPU
 * from_float (F16 rows into an F16 result: memcpy): a type without one (i8/i16/i64/f64,
 * the iq2/iq3/iq1 quants) calls a NULL pointer. Rows are written and read contiguously
 * (ggml_set_rows asserts contiguous rows), whole blocks for a quantized result. The work
 * buffer (F16 rows into another type) is planned. The indices come from tensor data:
 * each must lie in [0, result ne[1]) or the kernel aborts (GGML_ASSERT): indices.c
 * checks them right before the node runs. */
static int rule_set_rows(const struct ggml_tensor * t, pg_why * why) {
    PG_NEED_SRC(t, 0, why);
    PG_NEED_SRC(t, 1, why);
    const struct ggml_tensor * src = t->src[0];
    const struct ggml_tensor * ix = t->src[1];
    PG_NEED_TYPE(src, "the rows (src0)", src->type == GGML_TYPE_F32 || src->type == GGML_TYPE_F16, why);
    PG_NEED_TYPE(ix, "the indices (src1)", ix->type == GGML_TYPE_I32 || ix->type == GGML_TYPE_I64, why);
    const int memcpy_rows = src->type == GGML_TYPE_F16 && t->type == GGML_TYPE_F16;
    if (!memcpy_rows) {
        const struct ggml_type_traits_cpu * tr = ggml_get_type_traits_cpu(t->type);
        if (tr == NULL || tr->from_float == NULL) {
            return pg_refuse_type(why, "the CPU kernel cannot write rows into a %s result (no from_float "
                                  "conversion for %s)", pg_type(t), pg_type(t));
        }
    }
    if (!rows_or_single(t) || !rows_or_single(src)) {
        return pg_refuse(why, "the result and the rows must have contiguous rows");
    }
    if (ggml_is_quantized(t->type)) {
        PG_NEED_WHOLE_BLOCKS(t, "the result", why);
    }
    if (src->ne[0] != t->ne[0] || src->ne[2] != t->ne[2] || src->ne[3] != t->ne[3] || ix->ne[0] != src->ne[1] ||
        ix->ne[1] <= 0 || ix->ne[2] <= 0 || src->ne[2] % ix->ne[1] != 0 || src->ne[3] % ix->ne[2] != 0) {
        return pg_refuse(why, "the result, the rows and the indices do not have set_rows' shapes");
    }
    /* (a result without rows is empty: ggml skips the node, and no index is read) */
    return PYGGML_OK;
}

/* ggml_compute_forward_set (set_f32 / set_i32): a of F32 or I32, a and the result
 * contiguous (asserted), b's rows contiguous (asserted nb10 == 4); b's elements are
 * copied as 4-byte words of a's type, whatever b's type (so b must have a's type). The
 * strides and offset (op_params, int32) place b in a's memory: the kernel asserts the
 * START of b's last element lies within a (offset + sum (ne_i - 1)*nb_i <= nbytes), so
 * an element at the very end is written past a (defect set-bounds-off-by-one);
 * pyggml asks for the last element's END, and, as for views, for offsets and strides
 * that are multiples of the element size (the kernel stores floats there). */
static int rule_set(const struct ggml_tensor * t, pg_why * why) {
    PG_NEED_SRC(t, 0, why);
    PG_NEED_SRC(t, 1, why);
    const struct ggml_tensor * a = t->src[0];
    const struct ggml_tensor * b = t->src[1];
    PG_NEED_TYPE(a, "src0", a->type == GGML_TYPE_F32 || a->type == GGML_TYPE_I32, why);
    if (b->type != a->type || t->type != a->type) {
        return pg_refuse_type(why, "src1 (%s) must have src0's type (%s): the kernel copies its bits as %s",
                              pg_type(b), pg_type(a), pg_type(a));
    }
    if (!ggml_is_contiguous(a) || !ggml_is_contiguous(t) || !ggml_are_same_shape(a, t)) {
        return pg_refuse(why, "src0 must be contiguous (the kernel views it as flat memory), got "
                         "nb=(%zu, %zu, %zu, %zu)", a->nb[0], a->nb[1], a->nb[2], a->nb[3]);
    }
    PG_NEED_ROWS(b, "src1", why);
    const int32_t * p = (const int32_t *) t->op_params;
    const int32_t nb[4] = {0, p[0], p[1], p[2]};      /* nb[0] is the element size */
    const int32_t offset = p[3];
    if (ne_prod(b) == 0) {
        return PYGGML_OK;
    }
    const size_t es = ggml_type_size(a->type);
    if (offset < 0 || offset % (int32_t) es != 0) {
        return pg_refuse(why, "the offset (%d bytes) must be a non-negative multiple of the %zu-byte element",
                         offset, es);
    }
    uint64_t last = (uint64_t) offset + es;
    for (int i = 1; i < 4; i++) {
        if (b->ne[i] > 1) {
            if (nb[i] < 0 || nb[i] % (int32_t) es != 0) {
                return pg_refuse(why, "nb%d (%d bytes) must be a non-negative multiple of the %zu-byte element",
                                 i, nb[i], es);
            }
            last += (uint64_t) (b->ne[i] - 1) * (uint64_t) nb[i];
        }
    }
    last += (uint64_t) (b->ne[0] - 1) * es;
    if (last > ggml_nbytes(a)) {
        /* the kernel's own check lets the last element start at nbytes: one element past a */
        const int upstream_misses = last - es <= ggml_nbytes(a);
        if (upstream_misses) {
            why->defect = PG_DEFECT_SET_BOUNDS_OFF_BY_ONE;
        }
        return pg_refuse(why, "b placed at offset %d with strides (%d, %d, %d) reaches byte %llu of src0, which "
                         "has %zu bytes%s", offset, nb[1], nb[2], nb[3], (unsigned long long) last, ggml_nbytes(a),
                         upstream_misses ? " (the kernel's bounds check lets the last element start at the "
                                           "end, and writes it past src0)" : "");
    }
    return PYGGML_OK;
}

/* ggml_compute_forward_diag_f32: F32; src0 and result rows contiguous (asserted) */
static int rule_diag(const struct ggml_tensor * t, pg_why * why) {
    PG_NEED_SRC(t, 0, why);
    const struct ggml_tensor * a = t->src[0];
    PG_NEED_TYPE(a, "src0", a->type == GGML_TYPE_F32 && t->type == GGML_TYPE_F32, why);
    PG_NEED_ROWS(a, "src0", why);
    PG_NEED_ROWS(t, "the result", why);
    if (a->ne[1] != 1 || t->ne[0] != a->ne[0] || t->ne[1] != a->ne[0] || t->ne[2] != a->ne[2] ||
        t->ne[3] != a->ne[3]) {
        return pg_refuse(why, "diag takes a row vector [n, 1, n2, n3] into [n, n, n2, n3]");
    }
    return PYGGML_OK;
}

/* ggml_compute_forward_pad_f32: F32, src0 any strides, the result written as contiguous.
 * Zero padding (op_params[8] == 0) takes any amounts (negative ones crop). Circular
 * padding reads src index ggml_wrap_around(i - lp, ne) = (i - lp + ne) % ne: a source
 * axis of extent 0 divides by zero, and a left pad lp > ne gives a negative index for
 * the first outputs (ne >= 2), a read before src0 (proposed defect
 * pad-circular-left-oob); right pads of any size wrap. */
static int rule_pad(const struct ggml_tensor * t, pg_why * why) {
    PG_NEED_SRC(t, 0, why);
    const struct ggml_tensor * a = t->src[0];
    PG_NEED_TYPE(a, "src0", a->type == GGML_TYPE_F32 && t->type == GGML_TYPE_F32, why);
    PG_NEED_CONTIGUOUS(t, "the result", why);
    const int32_t * p = (const int32_t *) t->op_params;
    for (int i = 0; i < 4; i++) {
        if (t->ne[i] != a->ne[i] + (int64_t) p[2 * i] + (int64_t) p[2 * i + 1]) {
            return pg_refuse(why, "the result's ne[%d] = %lld is not src0's %lld plus the pads %d and %d", i,
                             (long long) t->ne[i], (long long) a->ne[i], p[2 * i], p[2 * i + 1]);
        }
    }
    if (p[8] == 0 || ne_prod(t) == 0) {
        return PYGGML_OK;
    }
    for (int i = 0; i < 4; i++) {
        const int64_t n = a->ne[i], lp = p[2 * i];
        if (n == 0) {
            return pg_refuse(why, "circular padding of an empty axis (src0 ne[%d] = 0) into a non-empty result: "
                             "there is nothing to wrap (the kernel divides by 0)", i);
        }
        /* outputs k = 0 .. m-1 have k - lp + n < 0; (k - lp + n) % n is then negative
         * unless it is a multiple of n (two consecutive k cannot both be, for n >= 2) */
        const int64_t m = t->ne[i] < lp - n ? t->ne[i] : lp - n;
        if (n >= 2 && (m >= 2 || (m == 1 && (n - lp) % n != 0))) {
            why->defect = PG_DEFECT_PAD_CIRCULAR_LEFT_OOB;
            return pg_refuse(why, "circular left pad %lld on axis %d is larger than src0's extent %lld: the kernel "
                             "wraps indices with (i - lp + ne) %% ne and reads before src0",
                             (long long) lp, i, (long long) n);
        }
    }
    return PYGGML_OK;
}

/* ggml_compute_forward_pad_reflect_1d: F32 in and out; each src0 row read
 * contiguously; 0 <= p0, p1 < ne00 (ggml_pad_reflect_1d asserts them and contiguity) */
static int rule_pad_reflect_1d(const struct ggml_tensor * t, pg_why * why) {
    PG_NEED_SRC(t, 0, why);
    const struct ggml_tensor * a = t->src[0];
    PG_NEED_TYPE(a, "src0", a->type == GGML_TYPE_F32 && t->type == GGML_TYPE_F32, why);
    const int32_t p0 = t->op_params[0], p1 = t->op_params[1];
    if (p0 < 0 || p1 < 0 || p0 >= a->ne[0] || p1 >= a->ne[0]) {
        return pg_refuse(why, "the pads (%d, %d) must lie in [0, ne[0] = %lld)", p0, p1, (long long) a->ne[0]);
    }
    if (!rows_or_single(a)) {
        PG_NEED_ROWS(a, "src0", why);
    }
    PG_NEED_ROWS(t, "the result", why);
    return PYGGML_OK;
}

/* ggml_compute_forward_roll_f32: F32; rows of src0 read contiguously (ggml_roll asserts
 * it); each shift |s_i| < ne_i (ggml_roll asserts: ggml_wrap_index corrects one wrap) */
static int rule_roll(const struct ggml_tensor * t, pg_why * why) {
    PG_NEED_SRC(t, 0, why);
    const struct ggml_tensor * a = t->src[0];
    PG_NEED_TYPE(a, "src0", a->type == GGML_TYPE_F32 && t->type == GGML_TYPE_F32, why);
    PG_NEED_ROWS(a, "src0", why);
    PG_NEED_ROWS(t, "the result", why);
    for (int i = 0; i < 4; i++) {
        const int64_t s = t->op_params[i];
        if (llabs(s) >= a->ne[i] && a->ne[i] > 0) {
            return pg_refuse(why, "shift%d = %lld must be smaller in magnitude than ne[%d] = %lld", i,
                             (long long) s, i, (long long) a->ne[i]);
        }
    }
    return PYGGML_OK;
}

/* ggml_compute_forward_tri_f32: F32, src0 contiguous (asserted), the tri type in
 * 0..3 (GGML_TRI_TYPE_UPPER_DIAG, UPPER, LOWER_DIAG, LOWER; others abort) */
static int rule_tri(const struct ggml_tensor * t, pg_why * why) {
    PG_NEED_SRC(t, 0, why);
    const struct ggml_tensor * a = t->src[0];
    PG_NEED_TYPE(a, "src0", a->type == GGML_TYPE_F32 && t->type == GGML_TYPE_F32, why);
    if (!ggml_is_contiguous(a)) {
        PG_NEED_CONTIGUOUS(a, "src0", why);
    }
    if (t->op_params[0] < 0 || t->op_params[0] > 3) {
        return pg_refuse(why, "the tri type must be 0..3, got %d", t->op_params[0]);
    }
    return PYGGML_OK;
}

/* ggml_compute_forward_arange_f32: an F32 result with contiguous elements, of
 * ceil((stop - start) / step) elements (asserted) */
static int rule_arange(const struct ggml_tensor * t, pg_why * why) {
    PG_NEED_TYPE(t, "the result", t->type == GGML_TYPE_F32, why);
    PG_NEED_ROWS(t, "the result", why);
    const float * p = (const float *) t->op_params;
    const float n = ceilf((p[1] - p[0]) / p[2]);
    if (!(n >= 0.0f && n < 9.0e18f)) {
        return pg_refuse(why, "start %g, stop %g, step %g give no finite element count", p[0], p[1], p[2]);
    }
    const int64_t steps = (int64_t) n;
    if (steps != ggml_nelements(t)) {
        return pg_refuse(why, "the result has %lld elements, start/stop/step give %lld",
                         (long long) ggml_nelements(t), (long long) steps);
    }
    return PYGGML_OK;
}

/* ggml_compute_forward_win_part_f32: F32; it indexes src0 as a packed array (its
 * strides are ignored: any other layout reads the wrong elements, or past a view);
 * op_params (npx, npy, w) as ggml_win_part made them, w >= 1 */
static int rule_win_part(const struct ggml_tensor * t, pg_why * why) {
    PG_NEED_SRC(t, 0, why);
    const struct ggml_tensor * a = t->src[0];
    PG_NEED_TYPE(a, "src0", a->type == GGML_TYPE_F32 && t->type == GGML_TYPE_F32, why);
    PG_NEED_CONTIGUOUS(t, "the result", why);
    if (!ggml_is_contiguous(a)) {
        PG_NEED_CONTIGUOUS(a, "src0 (the kernel ignores its strides)", why);
    }
    const int32_t npx = t->op_params[0], npy = t->op_params[1], w = t->op_params[2];
    if (w < 1) {
        return pg_refuse(why, "the window size must be >= 1, got %d", w);
    }
    if (t->ne[0] != a->ne[0] || t->ne[1] != w || t->ne[2] != w || t->ne[3] != (int64_t) npx * npy || a->ne[3] != 1 ||
        (int64_t) npx * w < a->ne[1] || (int64_t) npy * w < a->ne[2]) {
        return pg_refuse(why, "the result [%lld, %lld, %lld, %lld] is not win_part's for src0 and w = %d",
                         (long long) t->ne[0], (long long) t->ne[1], (long long) t->ne[2], (long long) t->ne[3], w);
    }
    return PYGGML_OK;
}

/* ggml_compute_forward_win_unpart_f32: F32; it indexes src0 (the windows, [C, w, w,
 * n]) as a packed array, ignoring its strides. Output (i1, i2) reads window
 * (i2/w)*npx + i1/w, row (i2 % w, i1 % w), npx = ceil(w0/w): ggml_win_unpart checks
 * none of it, so w = 0 divides by 0 and too few or too small windows read past src0. */
static int rule_win_unpart(const struct ggml_tensor * t, pg_why * why) {
    PG_NEED_SRC(t, 0, why);
    const struct ggml_tensor * a = t->src[0];
    PG_NEED_TYPE(a, "src0", a->type == GGML_TYPE_F32 && t->type == GGML_TYPE_F32, why);
    PG_NEED_CONTIGUOUS(t, "the result", why);
    if (!ggml_is_contiguous(a)) {
        PG_NEED_CONTIGUOUS(a, "src0 (the kernel ignores its strides)", why);
    }
    const int64_t w = t->op_params[0];
    if (w < 1) {
        return pg_refuse(why, "the window size must be >= 1, got %lld", (long long) w);
    }
    if (t->ne[0] != a->ne[0]) {
        return pg_refuse(why, "the result's ne[0] (%lld) must be src0's (%lld)", (long long) t->ne[0],
                         (long long) a->ne[0]);
    }
    const int64_t w0 = t->ne[1], h0 = t->ne[2];
    if (ne_prod(t) == 0) {
        return PYGGML_OK;
    }
    const int64_t npx = (w0 + w - 1) / w;
    const int64_t windows = ((h0 - 1) / w) * npx + (w0 - 1) / w + 1;
    const int64_t rows = w0 < w ? w0 : w, cols = h0 < w ? h0 : w;
    if (a->ne[1] < rows || a->ne[2] < cols || a->ne[3] < windows) {
        return pg_refuse(why, "a %lld x %lld result from windows of %lld needs src0 of at least [C, %lld, %lld, %lld] "
                         "(windows of w x w, as win_part makes them), got [%lld, %lld, %lld, %lld]",
                         (long long) w0, (long long) h0, (long long) w, (long long) rows, (long long) cols,
                         (long long) windows, (long long) a->ne[0], (long long) a->ne[1], (long long) a->ne[2],
                         (long long) a->ne[3]);
    }
    return PYGGML_OK;
}

/* ---------------------------------------------------------------------------------------- */

/* DUP, CONT, CPY: ggml_compute_forward_dup:
 *  - same type: dup_bytes. Types of 1-element blocks: any layout. Block (quantized)
 *    types: both contiguous (memcpy), or the same shape with block rows (nb[0] = block
 *    size) copied row by row, or a non-contiguous result with block rows on both sides
 *    (copied block by block). A contiguous result of another shape from a non-contiguous
 *    source takes the branch that copies ne00 * type_size bytes per row, counting
 *    elements as blocks: qk times too much (defect cpy-quantized-reshape-oob).
 *  - F32/F16/BF16 between themselves, F32 <-> I32: dup_flt, any layout.
 *  - F16/BF16 -> I32: dup_to_q with I32's from_float, but ggml_graph_plan plans no work
 *    buffer for it (only quantized results, F16 <-> BF16, F32 <-> I32): the kernel writes
 *    its F32 row into a NULL or short buffer (defect cpy-f16-i32-work).
 *  - F32/F16/BF16 -> quantized: dup_to_q: a from_float, a contiguous result, contiguous
 *    source rows of whole blocks; its per-thread buffer holds src0 rows but the plan
 *    sizes it from the result's rows (ne00 > ne0 overruns it; defect cpy-to-q-work-size).
 *  - quantized -> F32 (CPY only): dup_from_q with the type's to_float (q8_K has none):
 *    source blocks contiguous (nb00 = block size) and whole per row (the kernel computes
 *    block addresses from element indices), result rows contiguous and of whole blocks
 *    unless the result is contiguous (asserted).
 *  - every other pair aborts. */
static int rule_dup(const struct ggml_tensor * t, pg_why * why) {
    PG_NEED_SRC(t, 0, why);
    const struct ggml_tensor * a = t->src[0];
    enum ggml_type ta = a->type, td = t->type;
    if (ggml_nelements(a) != ggml_nelements(t)) {
        return pg_refuse(why, "src0 has %lld elements, the result %lld", (long long) ggml_nelements(a),
                         (long long) ggml_nelements(t));
    }
    if (ta == td) {
        if (ggml_blck_size(ta) == 1) {
            return PYGGML_OK;
        }
        if (ggml_is_contiguous(a) && ggml_is_contiguous(t)) {
            return PYGGML_OK;       /* one memcpy */
        }
        PG_NEED_WHOLE_BLOCKS(a, "src0", why);
        PG_NEED_WHOLE_BLOCKS(t, "the result", why);
        const size_t ts = ggml_type_size(ta);
        if (ggml_are_same_shape(a, t) && a->nb[0] == ts && t->nb[0] == ts) {
            return PYGGML_OK;       /* row by row */
        }
        if (!ggml_is_contiguous(t)) {
            /* block by block, at k*nb[0]: a single block per row may have any nb[0] */
            if (!rows_or_single(a)) {
                PG_NEED_ROWS(a, "src0", why);
            }
            if (!rows_or_single(t)) {
                PG_NEED_ROWS(t, "the result", why);
            }
            return PYGGML_OK;
        }
        PG_NEED_ROWS(a, "src0", why);
        why->defect = PG_DEFECT_CPY_QUANTIZED_RESHAPE_OOB;
        return pg_refuse(why, "a non-contiguous %s src0 copied into a contiguous result of another shape: the "
                         "kernel copies ne[0] blocks per row where there are ne[0]/%lld, past the result",
                         pg_type(a), (long long) ggml_blck_size(ta));
    }
    if (pg_is_float(ta) && pg_is_float(td)) {
        return PYGGML_OK;
    }
    if ((ta == GGML_TYPE_F32 && td == GGML_TYPE_I32) || (ta == GGML_TYPE_I32 && td == GGML_TYPE_F32)) {
        return PYGGML_OK;
    }
    if ((ta == GGML_TYPE_F16 || ta == GGML_TYPE_BF16) && td == GGML_TYPE_I32) {
        why->defect = PG_DEFECT_CPY_F16_I32_WORK;
        return pg_refuse(why, "%s -> I32 goes through an F32 row in the work buffer, which ggml_graph_plan "
                         "does not reserve for this pair", pg_type(a));
    }
    if (ggml_is_quantized(ta) && td == GGML_TYPE_F32 && t->op == GGML_OP_CPY) {
        if (!pg_is_dequantizable(ta)) {
            return pg_refuse_type(why, "the CPU kernel cannot dequantize %s", pg_type(a));
        }
        if (!rows_or_single(a)) {
            PG_NEED_ROWS(a, "src0", why);       /* block addresses are (i00/qk)*nb00 */
        }
        PG_NEED_WHOLE_BLOCKS(a, "src0", why);
        PG_NEED_ROWS(t, "the result", why);     /* asserted */
        if (!whole_blocks(t) && !ggml_is_contiguous(t)) {
            return pg_refuse(why, "the result must be contiguous or have rows of whole %s blocks (%lld)",
                             pg_type(a), (long long) ggml_blck_size(ta));
        }
        return PYGGML_OK;
    }
    if (pg_is_float(ta) && ggml_is_quantized(td)) {
        const struct ggml_type_traits_cpu * tr = ggml_get_type_traits_cpu(td);
        if (tr == NULL || tr->from_float == NULL) {
            return pg_refuse_type(why, "the CPU kernel cannot quantize to %s", pg_type(t));
        }
        PG_NEED_CONTIGUOUS(t, "the (quantized) result", why);
        PG_NEED_ROWS(a, "src0", why);
        if (a->ne[0] % ggml_blck_size(td) != 0) {
            return pg_refuse(why, "src0 rows (ne[0] = %lld) must hold whole %s blocks of %lld",
                             (long long) a->ne[0], pg_type(t), (long long) ggml_blck_size(td));
        }
        if (a->ne[0] > t->ne[0]) {
            why->defect = PG_DEFECT_CPY_TO_Q_WORK_SIZE;
            return pg_refuse(why, "src0 rows (ne[0] = %lld) longer than the result's (%lld) overrun the work "
                             "buffer ggml_graph_plan sizes from the result's rows",
                             (long long) a->ne[0], (long long) t->ne[0]);
        }
        return PYGGML_OK;
    }
    return pg_refuse_type(why, "the CPU kernel does not copy %s to %s", pg_type(a), pg_type(t));
}

/* ops whose kernel does nothing (views share their source's data) */
static int rule_noop(const struct ggml_tensor * t, pg_why * why) {
    (void) t;
    (void) why;
    return PYGGML_OK;
}

/* VIEW: no kernel, but every consumer reads through it. ggml_view_impl checks only that a
 * contiguous block of the view's size fits its source; pyggml also requires that the
 * last element the strides reach lies inside the source's data (no view reaches foreign
 * memory), and that the offset and row strides are multiples of the element (block) size
 * (kernels load elements at those addresses: a misaligned float load is undefined). */
/* A quantized tensor's rows hold whole blocks: ggml_row_size asserts it, but only in
 * debug builds; ggml_nbytes (and every kernel) divides ne[0] by the block size. */
static int need_whole_blocks(const struct ggml_tensor * t, pg_why * why) {
    const int64_t qk = ggml_blck_size(t->type);
    if (qk > 1 && t->ne[0] % qk != 0) {
        return pg_refuse(why, "a %s view or reshape needs rows of whole blocks of %lld elements, got ne[0] = %lld",
                         pg_type(t), (long long) qk, (long long) t->ne[0]);
    }
    return PYGGML_OK;
}

static int rule_reshape(const struct ggml_tensor * t, pg_why * why) {
    return need_whole_blocks(t, why);
}

static int rule_view(const struct ggml_tensor * t, pg_why * why) {
    const struct ggml_tensor * base = t->view_src;
    const int blocks = need_whole_blocks(t, why);
    if (blocks != PYGGML_OK) {
        return blocks;
    }
    if (base == NULL || ggml_nelements(t) == 0) {
        return PYGGML_OK;
    }
    const size_t ts = ggml_type_size(t->type);
    if (t->view_offs % ts != 0 || t->nb[1] % ts != 0 || t->nb[2] % ts != 0 || t->nb[3] % ts != 0) {
        return pg_refuse(why, "offset %zu and strides nb=(%zu, %zu, %zu, %zu) must be multiples of the "
                         "%zu-byte %s element", t->view_offs, t->nb[0], t->nb[1], t->nb[2], t->nb[3], ts,
                         pg_type(t));
    }
    const size_t end = t->view_offs + ggml_nbytes(t);
    if (end > ggml_nbytes(base)) {
        return pg_refuse(why, "the view reaches byte %zu of its source, which has %zu bytes "
                         "(offset %zu, ne=(%lld, %lld, %lld, %lld), nb=(%zu, %zu, %zu, %zu))",
                         end, ggml_nbytes(base), t->view_offs, (long long) t->ne[0], (long long) t->ne[1],
                         (long long) t->ne[2], (long long) t->ne[3], t->nb[0], t->nb[1], t->nb[2], t->nb[3]);
    }
    return PYGGML_OK;
}

/* ops.cpp ggml_compute_forward_repeat: F32/I32 (as 4 bytes), F16/BF16/I16 (as 2 bytes);
 * the element copies read src0 rows contiguously */
static int rule_repeat(const struct ggml_tensor * t, pg_why * why) {
    const struct ggml_tensor * a = t->src[0];
    PG_NEED_SRC(t, 0, why);
    enum ggml_type ty = a->type;
    PG_NEED_TYPE(a, "src0", pg_is_float(ty) || ty == GGML_TYPE_I32 || ty == GGML_TYPE_I16, why);
    PG_NEED_ROWS(a, "src0", why);
    if (!ggml_can_repeat(a, t)) {
        return pg_refuse(why, "src0 cannot be repeated to the result's shape");
    }
    return PYGGML_OK;
}

const pg_named_rule pg_rules_layout[] = {
    {"DUP", rule_dup},
    {"CONT", rule_dup},
    {"CPY", rule_dup},
    {"CONCAT", rule_concat},
    {"GET_ROWS", rule_get_rows},
    {"SET_ROWS", rule_set_rows},
    {"SET", rule_set},
    {"DIAG", rule_diag},
    {"PAD", rule_pad},
    {"PAD_REFLECT_1D", rule_pad_reflect_1d},
    {"ROLL", rule_roll},
    {"TRI", rule_tri},
    {"ARANGE", rule_arange},
    {"WIN_PART", rule_win_part},
    {"WIN_UNPART", rule_win_unpart},
    {"NONE", rule_noop},
    {"VIEW", rule_view},
    {"RESHAPE", rule_reshape},
    {"PERMUTE", rule_noop},
    {"TRANSPOSE", rule_noop},
    {"REPEAT", rule_repeat},
    {NULL, NULL},
};
