/* Kernel rules for the core ops: views, copies, binary and unary elementwise ops,
 * reductions, repeat, mul_mat, soft_max, diag_mask, flash_attn_back.
 * Each rule cites the ggml-cpu function whose assertions and type switch it mirrors. */
#include "rules.h"

#include <string.h>

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

/* binary-ops.cpp binary_op/apply_binary_op (ADD, SUB, MUL, DIV of non-quantized a):
 * the type triples it instantiates, dst and src0 rows contiguous; src1 any stride.
 * ops.cpp ggml_compute_forward_add: a quantized src0 goes to add_q_f32 (same shapes,
 * src1 F32, dst of src0's type or F32). */
int pg_rule_binary(const struct ggml_tensor * t, pg_why * why) {
    const struct ggml_tensor * a = t->src[0];
    const struct ggml_tensor * b = t->src[1];
    PG_NEED_SRC(t, 0, why);
    PG_NEED_SRC(t, 1, why);
    enum ggml_type ta = a->type, tb = b->type, td = t->type;
    if (t->op == GGML_OP_ADD && ggml_is_quantized(ta)) {
        /* ggml_compute_forward_add_q_f32 */
        if (!ggml_are_same_shape(a, b) || !ggml_are_same_shape(a, t)) {
            return pg_refuse(why, "a quantized src0 (%s) needs src1 and the result of its shape", pg_type(a));
        }
        if (tb != GGML_TYPE_F32 || (td != ta && td != GGML_TYPE_F32)) {
            return pg_refuse_type(why, "a quantized src0 (%s) needs an F32 src1 and a result of its own type "
                             "or F32, got src1 %s, result %s", pg_type(a), pg_type(b), pg_type(t));
        }
        PG_NEED_ROWS(a, "src0", why);
        PG_NEED_ROWS(b, "src1", why);
        PG_NEED_ROWS(t, "the result", why);
        return PYGGML_OK;
    }
    int ok = (ta == tb && tb == td && pg_is_float(ta)) ||
             (tb == GGML_TYPE_F32 && (ta == GGML_TYPE_F16 || ta == GGML_TYPE_BF16) &&
              (td == ta || td == GGML_TYPE_F32));
    if (!ok) {
        return pg_refuse_type(why, "the CPU kernel does not take src0 %s, src1 %s, result %s "
                         "(it takes F32/F16/BF16 alike, or F16/BF16 with F32 src1)",
                         pg_type(a), pg_type(b), pg_type(t));
    }
    PG_NEED_ROWS(a, "src0", why);
    PG_NEED_ROWS(t, "the result", why);
    return PYGGML_OK;
}

/* unary-ops.cpp unary_op/apply_unary_op: F32, F16, BF16 alike, or F16/BF16 -> F32;
 * src0 and dst rows contiguous */
int pg_rule_unary(const struct ggml_tensor * t, pg_why * why) {
    const struct ggml_tensor * a = t->src[0];
    PG_NEED_SRC(t, 0, why);
    if (ggml_is_empty(t)) {
        return PYGGML_OK;          /* ggml_compute_forward skips empty nodes */
    }
    int ok = (a->type == t->type && pg_is_float(a->type)) ||
             (t->type == GGML_TYPE_F32 && (a->type == GGML_TYPE_F16 || a->type == GGML_TYPE_BF16));
    if (!ok) {
        return pg_refuse_type(why, "the CPU kernel does not take src0 %s with result %s", pg_type(a), pg_type(t));
    }
    PG_NEED_ROWS(a, "src0", why);
    PG_NEED_ROWS(t, "the result", why);
    return PYGGML_OK;
}

/* ops.cpp ggml_compute_forward_scale_f32: F32; src0 and dst contiguous; it walks rows
 * with nb[1] only, so dims of size 1 must not carry odd strides (ggml_is_padded_1d) */
static int rule_scale(const struct ggml_tensor * t, pg_why * why) {
    const struct ggml_tensor * a = t->src[0];
    PG_NEED_SRC(t, 0, why);
    PG_NEED_TYPE(a, "src0", a->type == GGML_TYPE_F32, why);
    PG_NEED_CONTIGUOUS(a, "src0", why);
    PG_NEED_CONTIGUOUS(t, "the result", why);
    if (!(a->nb[2] == a->nb[1] * a->ne[1] && a->nb[3] == a->nb[2] * a->ne[2])) {
        return pg_refuse(why, "src0 must have packed rows (nb[2] = nb[1]*ne[1], nb[3] = nb[2]*ne[2]): the "
                         "kernel walks rows with nb[1] only; got nb=(%zu, %zu, %zu, %zu)",
                         a->nb[0], a->nb[1], a->nb[2], a->nb[3]);
    }
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

/* ggml-cpu.c ggml_compute_forward_mul_mat: src0 rows contiguous and not transposed, a
 * vec_dot for src0's type; src1 F32 or src0's vec_dot_type (supports_op), rows
 * contiguous; dst F32 with nb0 <= nb1 <= nb2 <= nb3 */
static int rule_mul_mat(const struct ggml_tensor * t, pg_why * why) {
    const struct ggml_tensor * a = t->src[0];
    const struct ggml_tensor * b = t->src[1];
    PG_NEED_SRC(t, 0, why);
    PG_NEED_SRC(t, 1, why);
    const struct ggml_type_traits_cpu * tr = ggml_get_type_traits_cpu(a->type);
    if (tr == NULL || tr->vec_dot == NULL) {
        return pg_refuse_type(why, "the CPU kernel has no dot product for src0 of type %s", pg_type(a));
    }
    if (b->type != GGML_TYPE_F32 && b->type != tr->vec_dot_type) {
        return pg_refuse_type(why, "src1 must be F32 or %s (the vec_dot type of src0's %s), got %s",
                         ggml_type_name(tr->vec_dot_type), pg_type(a), pg_type(b));
    }
    if (ggml_is_transposed(a)) {
        return pg_refuse(why, "src0 must not be transposed (nb[0] > nb[1]); use cont()");
    }
    PG_NEED_ROWS(a, "src0", why);
    PG_NEED_ROWS(b, "src1", why);
    if (!(t->nb[0] == sizeof(float) && t->nb[0] <= t->nb[1] && t->nb[1] <= t->nb[2] && t->nb[2] <= t->nb[3])) {
        return pg_refuse(why, "the result must be F32 with increasing strides");
    }
    return PYGGML_OK;
}

/* ops.cpp ggml_compute_forward_soft_max_f32: F32 src0 and dst, contiguous (a row of one
 * element may carry any nb[0]: the kernel reads rows with nb[1]); an optional mask src1
 * of F32 or F16 with contiguous rows; optional sinks src2, F32, read as a contiguous
 * array (sk[i02]) */
static int rule_soft_max(const struct ggml_tensor * t, pg_why * why) {
    const struct ggml_tensor * a = t->src[0];
    const struct ggml_tensor * m = t->src[1];
    const struct ggml_tensor * sinks = t->src[2];
    PG_NEED_SRC(t, 0, why);
    PG_NEED_TYPE(a, "src0", a->type == GGML_TYPE_F32, why);
    if (!(ggml_is_contiguous(a) && (a->ne[0] == 1 || pg_rows_contiguous(a)))) {
        PG_NEED_CONTIGUOUS(a, "src0", why);
    }
    if (!(ggml_is_contiguous(t) && (t->ne[0] == 1 || pg_rows_contiguous(t)))) {
        PG_NEED_CONTIGUOUS(t, "the result", why);
    }
    if (m != NULL) {
        PG_NEED_TYPE(m, "the mask (src1)", m->type == GGML_TYPE_F32 || m->type == GGML_TYPE_F16, why);
        PG_NEED_ROWS(m, "the mask (src1)", why);
    }
    if (sinks != NULL) {
        PG_NEED_TYPE(sinks, "the sinks (src2)", sinks->type == GGML_TYPE_F32, why);
        PG_NEED_CONTIGUOUS(sinks, "the sinks (src2)", why);
    }
    return PYGGML_OK;
}

/* ops.cpp ggml_compute_forward_diag_mask_f32: F32, n_past >= 0 (op_params[0]); out of
 * place it memcpys a contiguous src0 into a contiguous dst; then it walks dst's rows
 * with k*nb[2] over all ne2*ne3 slices, so dims 2 and 3 must be packed (nb[3] =
 * nb[2]*ne[2]) -- unit dims with odd strides are refused too (found by fuzzing) */
static int rule_diag_mask(const struct ggml_tensor * t, pg_why * why) {
    const struct ggml_tensor * a = t->src[0];
    PG_NEED_SRC(t, 0, why);
    PG_NEED_TYPE(a, "src0", a->type == GGML_TYPE_F32, why);
    if (t->op_params[0] < 0) {
        return pg_refuse(why, "n_past must be >= 0, got %d", t->op_params[0]);
    }
    PG_NEED_ROWS(a, "src0", why);
    PG_NEED_ROWS(t, "the result", why);
    const int inplace = t->view_src != NULL;       /* ggml_diag_mask_*_inplace: a view of src0 */
    if (!inplace) {
        PG_NEED_CONTIGUOUS(a, "src0", why);
        PG_NEED_CONTIGUOUS(t, "the result", why);
    }
    if (t->ne[3] > 1 && t->nb[3] != t->nb[2] * (size_t) t->ne[2]) {
        return pg_refuse(why, "the result's dims 2 and 3 must be packed (nb[3] = nb[2]*ne[2]): the kernel walks "
                         "them with nb[2] only; got nb=(%zu, %zu, %zu, %zu)", t->nb[0], t->nb[1], t->nb[2], t->nb[3]);
    }
    return PYGGML_OK;
}

/* FLASH_ATTN_BACK's F32 CPU kernel (ggml-cpu/ops.cpp): all F32, q/k/v rows contiguous,
 * M >= N, int-sized loops; batch + GQA overruns the result (a known upstream defect) */
static int rule_flash_attn_back(const struct ggml_tensor * t, pg_why * why) {
    for (int i = 0; i < 4; i++) {
        PG_NEED_SRC(t, i, why);
        if (t->src[i]->type != GGML_TYPE_F32) {
            return pg_refuse_type(why, "src%d must be F32, got %s", i, pg_type(t->src[i]));
        }
        if (ggml_nelements(t->src[i]) == 0) {
            return pg_refuse(why, "src%d is empty", i);
        }
    }
    const struct ggml_tensor * q = t->src[0], * k = t->src[1], * v = t->src[2];
    if (k->ne[1] < q->ne[1]) {
        return pg_refuse(why, "M=%lld keys must be >= N=%lld queries (the kernel asserts P = M - N >= 0)",
                         (long long) k->ne[1], (long long) q->ne[1]);
    }
    PG_NEED_ROWS(q, "q (src0)", why);
    PG_NEED_ROWS(k, "k (src1)", why);
    PG_NEED_ROWS(v, "v (src2)", why);
    const int64_t lim = 2147483647 / 2;
    if (q->ne[0] > lim || q->ne[1] > lim || k->ne[1] > lim || q->ne[2] > lim || k->ne[2] * q->ne[3] > lim) {
        return pg_refuse(why, "shapes too large for the kernel's int indices");
    }
    if (q->ne[3] > 1 && k->ne[2] < q->ne[2] && !pg_fab_batch_gqa_fixed()) {
        why->defect = "fab-batch-gqa-oob";
        return pg_refuse(why, "ne3=%lld > 1 with kvne2=%lld < ne2=%lld: the kernel strides grad_k and grad_v "
                         "over ne3 with q's ne2 and writes past its result",
                         (long long) q->ne[3], (long long) k->ne[2], (long long) q->ne[2]);
    }
    return PYGGML_OK;
}

const pg_named_rule pg_rules_core[] = {
    {"NONE", rule_noop},
    {"VIEW", rule_view},
    {"RESHAPE", rule_reshape},
    {"PERMUTE", rule_noop},
    {"TRANSPOSE", rule_noop},
    {"ADD", pg_rule_binary},
    {"SUB", pg_rule_binary},
    {"MUL", pg_rule_binary},
    {"DIV", pg_rule_binary},
    {"SQR", pg_rule_unary},
    {"SQRT", pg_rule_unary},
    {"SCALE", rule_scale},
    {"SUM", rule_sum},
    {"MEAN", rule_mean},
    {"REPEAT", rule_repeat},
    {"MUL_MAT", rule_mul_mat},
    {"SOFT_MAX", rule_soft_max},
    {"DIAG_MASK_INF", rule_diag_mask},
    {"DIAG_MASK_ZERO", rule_diag_mask},
    {"FLASH_ATTN_BACK", rule_flash_attn_back},
    {NULL, NULL},
};
