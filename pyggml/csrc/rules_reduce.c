/* Kernel rules for the [reduce] family: SUM, MEAN, SUM_ROWS, CUMSUM, ARGMAX, COUNT_EQUAL,
 * ARGSORT, TOP_K. Each rule cites the ggml-cpu function
 * (ggml-cpu/ops.cpp) whose assertions and type switch it mirrors.
 *
 * ggml_compute_forward (ggml-cpu.c) skips a node whose result is empty, so a rule
 * accepts an empty result before anything else: no kernel runs on it. */
#include "rules.h"

#include <stdint.h>

/* the kernel reads row i (of ggml_nrows) at i*nb[1]: dims 2 and 3 must continue dim 1's
 * stride (a dim of size 1 is never stepped, its stride does not matter) */
static int rows_packed(const struct ggml_tensor * a) {
    return (a->ne[2] == 1 || a->nb[2] == (size_t) a->ne[1] * a->nb[1]) &&
           (a->ne[3] == 1 || a->nb[3] == (size_t) (a->ne[1] * a->ne[2]) * a->nb[1]);
}

#define PG_NEED_PACKED(x, name, why)                                                             \
    do {                                                                                         \
        if (!rows_packed(x))                                                                     \
            return pg_refuse(why, "%s must have packed rows (the kernel steps row i at i*nb[1]: "  \
                             "nb[2] = nb[1]*ne[1], nb[3] = nb[2]*ne[2]); got ne=(%lld, %lld, %lld, " \
                             "%lld) nb=(%zu, %zu, %zu, %zu); use cont()", name,                  \
                             (long long) (x)->ne[0], (long long) (x)->ne[1], (long long) (x)->ne[2], \
                             (long long) (x)->ne[3], (x)->nb[0], (x)->nb[1], (x)->nb[2], (x)->nb[3]); \
    } while (0)

/* ops.cpp ggml_compute_forward_sum_rows_f32: F32 only (the builder makes the result of
 * src0's type); GGML_ASSERTs src0 and dst rows contiguous; dims 1..3 any stride */
static int rule_sum_rows(const struct ggml_tensor * t, pg_why * why) {
    const struct ggml_tensor * a = t->src[0];
    PG_NEED_SRC(t, 0, why);
    if (ggml_is_empty(t)) {
        return PYGGML_OK;
    }
    PG_NEED_TYPE(a, "src0", a->type == GGML_TYPE_F32 && t->type == GGML_TYPE_F32, why);
    PG_NEED_ROWS(a, "src0", why);
    PG_NEED_ROWS(t, "the result", why);
    return PYGGML_OK;
}

/* ops.cpp ggml_compute_forward_cumsum_f32: F32 only; GGML_ASSERTs src0 and dst rows
 * contiguous and equal shapes; dims 1..3 any stride */
static int rule_cumsum(const struct ggml_tensor * t, pg_why * why) {
    const struct ggml_tensor * a = t->src[0];
    PG_NEED_SRC(t, 0, why);
    if (ggml_is_empty(t)) {
        return PYGGML_OK;
    }
    PG_NEED_TYPE(a, "src0", a->type == GGML_TYPE_F32 && t->type == GGML_TYPE_F32, why);
    if (!ggml_are_same_shape(a, t)) {
        return pg_refuse(why, "src0 and the result must have the same shape");
    }
    PG_NEED_ROWS(a, "src0", why);
    PG_NEED_ROWS(t, "the result", why);
    return PYGGML_OK;
}

/* ops.cpp ggml_compute_forward_argmax_f32: F32 only; reads each row of ne[0] floats from
 * i1*nb[1] (its assert on src0->nb[0] is compiled out in release builds: other strides
 * read the wrong elements, or past src0); the builder asserts a matrix */
static int rule_argmax(const struct ggml_tensor * t, pg_why * why) {
    const struct ggml_tensor * a = t->src[0];
    PG_NEED_SRC(t, 0, why);
    if (ggml_is_empty(t)) {
        return PYGGML_OK;
    }
    PG_NEED_TYPE(a, "src0", a->type == GGML_TYPE_F32, why);
    PG_NEED_TYPE(t, "the result", t->type == GGML_TYPE_I32, why);
    PG_NEED_ROWS(a, "src0", why);
    PG_NEED_ROWS(t, "the result", why);
    if (a->ne[2] != 1 || a->ne[3] != 1 || a->ne[1] != t->ne[0]) {
        return pg_refuse(why, "src0 must be a matrix of ne[1] = %lld rows", (long long) t->ne[0]);
    }
    return PYGGML_OK;
}

/* ops.cpp ggml_compute_forward_count_equal_i32: GGML_ASSERTs I32 sources of one shape and
 * an I64 scalar result; elements read at any stride. Its row index is wrong for 3-D and
 * 4-D tensors: i02 = (ir - i03*ne03)/ne01 and i01 = ir - i03*ne03 - i02*ne02, where
 * i03*ne02*ne01 and i02*ne01 belong. The rows it visits are the right ones exactly when
 * (ne03 == 1 or ne03 == ne01*ne02) and (ne02 == 1 or ne02 == ne01); otherwise it counts
 * some rows twice, skips others, or reads before or past the sources. */
static int rule_count_equal(const struct ggml_tensor * t, pg_why * why) {
    const struct ggml_tensor * a = t->src[0];
    const struct ggml_tensor * b = t->src[1];
    PG_NEED_SRC(t, 0, why);
    PG_NEED_SRC(t, 1, why);
    if (a->type != GGML_TYPE_I32 || b->type != GGML_TYPE_I32 || t->type != GGML_TYPE_I64) {
        return pg_refuse_type(why, "the CPU kernel takes I32 src0 and src1 into an I64 result, got %s, %s "
                              "into %s", pg_type(a), pg_type(b), pg_type(t));
    }
    if (!ggml_are_same_shape(a, b) || ggml_nelements(t) != 1) {
        return pg_refuse(why, "src0 and src1 must have the same shape, the result one element");
    }
    const int64_t ne1 = a->ne[1], ne2 = a->ne[2], ne3 = a->ne[3];
    if (ggml_nelements(a) == 0) {
        return PYGGML_OK;
    }
    if (!((ne3 == 1 || ne3 == ne1 * ne2) && (ne2 == 1 || ne2 == ne1))) {
        why->defect = PG_DEFECT_COUNT_EQUAL_ROW_INDEX;
        return pg_refuse(why, "ne=(%lld, %lld, %lld, %lld): the kernel's row index is wrong for this shape "
                         "(it counts some rows twice, skips others, or reads outside the sources); "
                         "reshape contiguous sources to 2-D first", (long long) a->ne[0], (long long) ne1,
                         (long long) ne2, (long long) ne3);
    }
    return PYGGML_OK;
}

/* ops.cpp ggml_compute_forward_argsort_f32: F32 only; reads row i at src0 + i*nb01 as
 * contiguous floats (packed rows); GGML_ASSERTs dst->nb[0] == 4 (an I32 result);
 * GGML_ABORTs on a sort order other than ASC/DESC (op_params[0]) */
static int rule_argsort(const struct ggml_tensor * t, pg_why * why) {
    const struct ggml_tensor * a = t->src[0];
    PG_NEED_SRC(t, 0, why);
    if (ggml_is_empty(t)) {
        return PYGGML_OK;
    }
    PG_NEED_TYPE(a, "src0", a->type == GGML_TYPE_F32, why);
    PG_NEED_TYPE(t, "the result", t->type == GGML_TYPE_I32, why);
    const int32_t order = t->op_params[0];
    if (order != GGML_SORT_ORDER_ASC && order != GGML_SORT_ORDER_DESC) {
        return pg_refuse(why, "sort order %d is neither ASC (%d) nor DESC (%d)", (int) order,
                         (int) GGML_SORT_ORDER_ASC, (int) GGML_SORT_ORDER_DESC);
    }
    if (!ggml_are_same_shape(a, t)) {
        return pg_refuse(why, "src0 and the result must have the same shape");
    }
    PG_NEED_ROWS(a, "src0", why);
    PG_NEED_PACKED(a, "src0", why);
    PG_NEED_CONTIGUOUS(t, "the result", why);
    return PYGGML_OK;
}

/* ops.cpp ggml_compute_forward_top_k_f32: F32 only; reads row i at src0 + i*nb01 as
 * contiguous floats (packed rows); k = dst->ne[0] in [0, ne00] (std::partial_sort over a
 * row of ne00 indices); GGML_ASSERTs dst->nb[0] == 4; ggml_graph_plan reserves ne00 ints
 * per thread (the kernel's per-thread offset of CACHE_LINE_SIZE_F32 more falls within the
 * plan's CACHE_LINE_SIZE*n_threads padding) */
static int rule_top_k(const struct ggml_tensor * t, pg_why * why) {
    const struct ggml_tensor * a = t->src[0];
    PG_NEED_SRC(t, 0, why);
    if (t->ne[0] < 0 || t->ne[0] > a->ne[0]) {
        return pg_refuse(why, "k = %lld must be in [0, %lld] (src0's ne[0])", (long long) t->ne[0],
                         (long long) a->ne[0]);
    }
    if (ggml_is_empty(t)) {
        return PYGGML_OK;
    }
    PG_NEED_TYPE(a, "src0", a->type == GGML_TYPE_F32, why);
    PG_NEED_TYPE(t, "the result", t->type == GGML_TYPE_I32, why);
    if (t->ne[1] != a->ne[1] || t->ne[2] != a->ne[2] || t->ne[3] != a->ne[3]) {
        return pg_refuse(why, "the result must have src0's rows");
    }
    PG_NEED_ROWS(a, "src0", why);
    PG_NEED_PACKED(a, "src0", why);
    PG_NEED_CONTIGUOUS(t, "the result", why);
    return PYGGML_OK;
}

/* ops.cpp ggml_compute_forward_sum: F32, F16, BF16; rows read contiguously (an
 * assert compiled out in release builds: other strides give wrong sums) */
static int rule_sum(const struct ggml_tensor * t, pg_why * why) {
    const struct ggml_tensor * a = t->src[0];
    PG_NEED_SRC(t, 0, why);
    PG_NEED_TYPE(a, "src0", pg_is_float(a->type), why);
    PG_NEED_ROWS(a, "src0", why);
    return PYGGML_OK;
}

/* ops.cpp ggml_compute_forward_mean: F32; rows read contiguously */
static int rule_mean(const struct ggml_tensor * t, pg_why * why) {
    const struct ggml_tensor * a = t->src[0];
    PG_NEED_SRC(t, 0, why);
    PG_NEED_TYPE(a, "src0", a->type == GGML_TYPE_F32, why);
    PG_NEED_ROWS(a, "src0", why);
    return PYGGML_OK;
}

const pg_named_rule pg_rules_reduce[] = {
    {"SUM_ROWS", rule_sum_rows},
    {"CUMSUM", rule_cumsum},
    {"ARGMAX", rule_argmax},
    {"COUNT_EQUAL", rule_count_equal},
    {"ARGSORT", rule_argsort},
    {"TOP_K", rule_top_k},
    {"SUM", rule_sum},
    {"MEAN", rule_mean},
    {NULL, NULL},
};
