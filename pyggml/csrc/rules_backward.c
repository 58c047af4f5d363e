/* Kernel rules for the [backward] family: the gradient ops that ggml's autodiff
 * (ggml_compute_backward in ggml.c) inserts into graphs, also bound as builders:
 * REPEAT_BACK, SILU_BACK, RMS_NORM_BACK, GET_ROWS_BACK, SOFT_MAX_BACK, ROPE_BACK,
 * IM2COL_BACK, POOL_2D_BACK, CROSS_ENTROPY_LOSS_BACK, and FLASH_ATTN_BACK. Each rule cites the ggml-cpu function whose assertions, type switch and
 * silent assumptions it mirrors. Most of these builders check nothing: the rules carry
 * the shape and type contracts the kernels rely on; what a builder does assert, or
 * makes true of the result it creates (its type, contiguity, shape), is not repeated. */
#include "rules.h"

#include <limits.h>
#include <string.h>

/* A kernel that walks the rows of x as row r at r*nb[1] (r over ggml_nrows) reads the
 * right rows only if dims 2 and 3 are packed over rows: nb[2] = nb[1]*ne[1] when
 * ne[2] > 1, nb[3] = nb[1]*ne[1]*ne[2] when ne[3] > 1 (ggml_is_contiguous is not
 * enough: it ignores the stride of a dim of size 1, the walk does not). */
static int rows_walkable(const struct ggml_tensor * x) {
    return (x->ne[2] <= 1 || x->nb[2] == x->nb[1] * (size_t) x->ne[1]) &&
           (x->ne[3] <= 1 || x->nb[3] == x->nb[1] * (size_t) (x->ne[1] * x->ne[2]));
}

/* rows whose elements are read one after the other (a row of one element has no stride) */
static int rows_packed(const struct ggml_tensor * x) {
    return x->ne[0] <= 1 || x->nb[0] == ggml_type_size(x->type);
}

static int refuse_layout(pg_why * why, const char * name, const char * need, const struct ggml_tensor * x) {
    return pg_refuse(why, "%s must %s; got ne=(%lld, %lld, %lld, %lld) nb=(%zu, %zu, %zu, %zu)", name, need,
                     (long long) x->ne[0], (long long) x->ne[1], (long long) x->ne[2], (long long) x->ne[3],
                     x->nb[0], x->nb[1], x->nb[2], x->nb[3]);
}

#define NEED_WALKABLE(x, name, why)                                                              \
    do {                                                                                         \
        if (!rows_packed(x) || !rows_walkable(x))                                                \
            return refuse_layout(why, name, "have contiguous rows with dims 2 and 3 packed over " \
                                 "rows (the kernel walks rows with nb[1] only)", x);             \
    } while (0)

#define NEED_GGML_CONTIGUOUS(x, name, why)                                                       \
    do {                                                                                         \
        if (!ggml_is_contiguous(x))                                                              \
            return refuse_layout(why, name, "be contiguous", x);                                 \
    } while (0)

#define NEED_SAME_SHAPE(x, y, xn, yn, why)                                                       \
    do {                                                                                         \
        if (!ggml_are_same_shape(x, y))                                                          \
            return pg_refuse(why, "%s ne=(%lld, %lld, %lld, %lld) and %s ne=(%lld, %lld, %lld, %lld) " \
                             "must have the same shape", xn, (long long) (x)->ne[0],             \
                             (long long) (x)->ne[1], (long long) (x)->ne[2], (long long) (x)->ne[3], \
                             yn, (long long) (y)->ne[0], (long long) (y)->ne[1],                 \
                             (long long) (y)->ne[2], (long long) (y)->ne[3]);                    \
    } while (0)

/* ops.cpp ggml_compute_forward_repeat_back_f32: F32 only (the switch); nb0 and nb00 the
 * element size (asserted); other strides of src0 and the result any. */
static int rule_repeat_back(const struct ggml_tensor * t, pg_why * why) {
    const struct ggml_tensor * a = t->src[0];
    PG_NEED_SRC(t, 0, why);
    if (ggml_nelements(t) == 0) {
        return PYGGML_OK;
    }
    PG_NEED_TYPE(a, "src0", a->type == GGML_TYPE_F32, why);
    PG_NEED_ROWS(a, "src0", why);
    return PYGGML_OK;
}

/* ops.cpp ggml_compute_forward_silu_back_f32/_f16: dy (src0) F32 or F16; x (src1) and the
 * result read and written as that same type; x, dy and the result of one shape (asserts
 * compiled out: nrows and ne0 come from x, so a larger x writes past the result); rows
 * walked with nb[1] (ggml_is_contiguous_1, asserted in debug builds only). */
static int rule_silu_back(const struct ggml_tensor * t, pg_why * why) {
    const struct ggml_tensor * dy = t->src[0];
    const struct ggml_tensor * x = t->src[1];
    PG_NEED_SRC(t, 0, why);
    PG_NEED_SRC(t, 1, why);
    PG_NEED_TYPE(dy, "dy (src0)", dy->type == GGML_TYPE_F32 || dy->type == GGML_TYPE_F16, why);
    if (x->type != dy->type) {
        return pg_refuse_type(why, "x (src1) must have dy's type %s (the kernel reads it as such), got %s",
                              pg_type(dy), pg_type(x));
    }
    NEED_SAME_SHAPE(dy, x, "dy (src0)", "x (src1)", why);
    if (ggml_nelements(t) == 0) {
        return PYGGML_OK;
    }
    NEED_WALKABLE(dy, "dy (src0)", why);
    NEED_WALKABLE(x, "x (src1)", why);
    return PYGGML_OK;
}

/* ops.cpp ggml_compute_forward_rms_norm_back_f32: dy (src0) F32 (the switch), x (src1)
 * read as float; one shape and nb[0] the element size for both (asserted); any other
 * strides. */
static int rule_rms_norm_back(const struct ggml_tensor * t, pg_why * why) {
    const struct ggml_tensor * dy = t->src[0];
    const struct ggml_tensor * x = t->src[1];
    PG_NEED_SRC(t, 0, why);
    PG_NEED_SRC(t, 1, why);
    PG_NEED_TYPE(dy, "dy (src0)", dy->type == GGML_TYPE_F32, why);
    PG_NEED_TYPE(x, "x (src1)", x->type == GGML_TYPE_F32, why);
    NEED_SAME_SHAPE(dy, x, "dy (src0)", "x (src1)", why);
    PG_NEED_ROWS(dy, "dy (src0)", why);
    PG_NEED_ROWS(x, "x (src1)", why);
    return PYGGML_OK;
}

/* ops.cpp ggml_compute_forward_get_rows_back_f32/_f32_f16: src0 (the rows) F32 or F16 with
 * nb[0] the element size (asserted); the result F32 and contiguous (asserted); the
 * indices (src1, I32) read as a flat array, one row of src0 per index (row i at
 * i*nb[1]: src0 needs as many rows). GET_ROWS reads the same indices through their
 * strides, and autodiff hands GET_ROWS_BACK GET_ROWS's indices as they are: strided
 * ones are an upstream defect (get-rows-back-strided-index). The index values are data,
 * checked right before the node runs (indices.c). */
static int rule_get_rows_back(const struct ggml_tensor * t, pg_why * why) {
    const struct ggml_tensor * a = t->src[0];
    const struct ggml_tensor * ids = t->src[1];
    PG_NEED_SRC(t, 0, why);
    PG_NEED_SRC(t, 1, why);
    PG_NEED_TYPE(a, "src0", a->type == GGML_TYPE_F32 || a->type == GGML_TYPE_F16, why);
    if (ggml_nelements(t) == 0) {
        return PYGGML_OK;
    }
    PG_NEED_ROWS(a, "src0", why);
    if (!rows_packed(ids) || !ggml_is_contiguous(ids)) {
        why->defect = PG_DEFECT_GET_ROWS_BACK_STRIDED_INDEX;
        return refuse_layout(why, "the indices (src1)", "be contiguous (the kernel reads them as a flat array, "
                             "where GET_ROWS honours their strides)", ids);
    }
    if (a->ne[1] < ggml_nelements(ids)) {
        return pg_refuse(why, "src0 must have a row per index: %lld indices, src0 "
                         "ne=(%lld, %lld, %lld, %lld)", (long long) ggml_nelements(ids), (long long) a->ne[0],
                         (long long) a->ne[1], (long long) a->ne[2], (long long) a->ne[3]);
    }
    return PYGGML_OK;
}

/* ops.cpp ggml_compute_forward_soft_max_ext_back_f32: dy (src0) F32 (the switch), y
 * (src1) read as float (supports_op: both F32); src0, src1 and the result contiguous and
 * of one shape, max_bias == 0 (all asserted); rows walked with nb[1]. */
static int rule_soft_max_back(const struct ggml_tensor * t, pg_why * why) {
    const struct ggml_tensor * dy = t->src[0];
    const struct ggml_tensor * y = t->src[1];
    PG_NEED_SRC(t, 0, why);
    PG_NEED_SRC(t, 1, why);
    PG_NEED_TYPE(dy, "dy (src0)", dy->type == GGML_TYPE_F32, why);
    PG_NEED_TYPE(y, "y (src1)", y->type == GGML_TYPE_F32, why);
    float max_bias;
    memcpy(&max_bias, (const float *) t->op_params + 1, sizeof(float));
    if (max_bias != 0.0f) {
        return pg_refuse(why, "the CPU kernel needs max_bias == 0 (no ALiBi), got %g", (double) max_bias);
    }
    NEED_SAME_SHAPE(y, t, "y (src1)", "the result", why);
    NEED_GGML_CONTIGUOUS(dy, "dy (src0)", why);
    NEED_GGML_CONTIGUOUS(y, "y (src1)", why);
    NEED_WALKABLE(dy, "dy (src0)", why);
    NEED_WALKABLE(y, "y (src1)", why);
    return PYGGML_OK;
}

/* ROPE_BACK runs ROPE's kernel (rope_flt with forward = false): pg_rule_rope
 * (rules_attention.c) is its rule too. */

/* ops.cpp ggml_compute_forward_im2col_back_f32: src0 (the gradient of im2col's columns)
 * F32 and src1 (the kernel, for its KW and KH only) F32 or F16 (asserted); the result
 * F32 with contiguous rows. src0 is read as the flat [N, OH, OW, IC*KH*KW] array of
 * im2col's result (OW = src0 ne1; OH = src0 ne2 in 2-D, 1 in 1-D); N and IC come from
 * the result (ne3, ne2 in 2-D; ne2, ne1 in 1-D, where ne3 is never written). Strides s0
 * (and s1 in 2-D) are divisors. */
static int rule_im2col_back(const struct ggml_tensor * t, pg_why * why) {
    const struct ggml_tensor * g = t->src[0];
    const struct ggml_tensor * k = t->src[1];
    PG_NEED_SRC(t, 0, why);
    PG_NEED_SRC(t, 1, why);
    PG_NEED_TYPE(g, "the columns' gradient (src0)", g->type == GGML_TYPE_F32, why);
    PG_NEED_TYPE(k, "the kernel (src1)", k->type == GGML_TYPE_F32 || k->type == GGML_TYPE_F16, why);
    if (ggml_nelements(t) == 0) {
        return PYGGML_OK;
    }
    const int32_t s0 = t->op_params[0], s1 = t->op_params[1];
    const int is_2D = t->op_params[6] == 1;
    if (s0 == 0 || (is_2D && s1 == 0)) {
        return pg_refuse(why, "the strides must be nonzero (the kernel divides by them), got s0=%d s1=%d", s0, s1);
    }
    const int64_t N = is_2D ? t->ne[3] : t->ne[2];
    const int64_t IC = is_2D ? t->ne[2] : t->ne[1];
    const int64_t KH = is_2D ? k->ne[1] : 1;
    const int64_t KW = k->ne[0];
    if (!is_2D && t->ne[3] != 1) {
        return pg_refuse(why, "1-D: the result's ne3 must be 1 (the kernel never writes ne3 > 0), got %lld",
                         (long long) t->ne[3]);
    }
    NEED_GGML_CONTIGUOUS(g, "the columns' gradient (src0)", why);
    if (g->ne[0] != IC * KH * KW || (is_2D ? g->ne[3] != N : (g->ne[2] != N || g->ne[3] != 1))) {
        return pg_refuse(why, "src0 must have im2col's result shape (IC*KH*KW = %lld, OW, %s): got ne=(%lld, %lld, "
                         "%lld, %lld)", (long long) (IC * KH * KW), is_2D ? "OH, N" : "N, 1",
                         (long long) g->ne[0], (long long) g->ne[1], (long long) g->ne[2], (long long) g->ne[3]);
    }
    if ((is_2D ? t->nb[3] : t->nb[2]) > INT_MAX || (is_2D ? t->nb[2] : t->nb[1]) > INT_MAX) {
        return pg_refuse(why, "the result's image and channel strides must fit the kernel's int offsets");
    }
    return PYGGML_OK;
}

/* ops.cpp ggml_compute_forward_pool_2d_back: op MAX or AVG (else GGML_ASSERT(false), but
 * pyggml's OpPool takes no other value); the result (F32 from the builder) zeroed and
 * walked plane by plane; the gradient (src0) read as a flat F32 array of planes of its
 * ne0 x ne1, one per plane of the result; MAX reads the forward input (src1) at the result's offsets and as the result's
 * type, F32: an F16 forward input (which ggml_pool_2d takes) is read past its end, an
 * upstream defect. */
static int rule_pool_2d_back(const struct ggml_tensor * t, pg_why * why) {
    const struct ggml_tensor * g = t->src[0];
    const struct ggml_tensor * af = t->src[1];
    PG_NEED_SRC(t, 0, why);
    PG_NEED_SRC(t, 1, why);
    const int op = t->op_params[0];      /* MAX or AVG: pyggml's OpPool has no other value */
    PG_NEED_TYPE(g, "the gradient (src0)", g->type == GGML_TYPE_F32, why);
    if (op == GGML_OP_POOL_MAX) {
        if (af->type == GGML_TYPE_F16) {
            why->defect = PG_DEFECT_POOL_2D_BACK_F16_OOB;
            return pg_refuse(why, "MAX reads the forward input as the result's type (F32), and it is F16: the "
                             "kernel would read past it");
        }
        PG_NEED_TYPE(af, "the forward input (src1)", af->type == GGML_TYPE_F32, why);
    }
    if (ggml_nelements(t) == 0 || g->ne[0] * g->ne[1] == 0) {
        return PYGGML_OK;
    }
    NEED_GGML_CONTIGUOUS(g, "the gradient (src0)", why);
    if (g->ne[2] * g->ne[3] < t->ne[2] * t->ne[3]) {
        return pg_refuse(why, "the gradient (src0) has %lld planes, the result %lld: the kernel reads one per "
                         "plane of the result", (long long) (g->ne[2] * g->ne[3]), (long long) (t->ne[2] * t->ne[3]));
    }
    if (op == GGML_OP_POOL_MAX) {
        NEED_GGML_CONTIGUOUS(af, "the forward input (src1), read at the result's offsets,", why);
    }
    return PYGGML_OK;
}

/* ops.cpp ggml_compute_forward_cross_entropy_loss_back_f32: dy (src0, a scalar) F32 (the
 * switch); the logits and labels (src1, src2) read as float and the result (src1's
 * type) written as float; the result, src1, src2 and dy contiguous, src1, src2 and the
 * result of one shape (asserted); rows walked with nb[1]. */
static int rule_cross_entropy_loss_back(const struct ggml_tensor * t, pg_why * why) {
    const struct ggml_tensor * dy = t->src[0];
    const struct ggml_tensor * a = t->src[1];
    const struct ggml_tensor * b = t->src[2];
    PG_NEED_SRC(t, 0, why);
    PG_NEED_SRC(t, 1, why);
    PG_NEED_SRC(t, 2, why);
    PG_NEED_TYPE(dy, "dy (src0)", dy->type == GGML_TYPE_F32, why);
    PG_NEED_TYPE(a, "the logits (src1)", a->type == GGML_TYPE_F32, why);
    PG_NEED_TYPE(b, "the labels (src2)", b->type == GGML_TYPE_F32, why);
    NEED_GGML_CONTIGUOUS(a, "the logits (src1)", why);
    NEED_GGML_CONTIGUOUS(b, "the labels (src2)", why);
    NEED_WALKABLE(a, "the logits (src1)", why);
    NEED_WALKABLE(b, "the labels (src2)", why);
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
        why->defect = PG_DEFECT_FAB_BATCH_GQA_OOB;
        return pg_refuse(why, "ne3=%lld > 1 with kvne2=%lld < ne2=%lld: the kernel strides grad_k and grad_v "
                         "over ne3 with q's ne2 and writes past its result",
                         (long long) q->ne[3], (long long) k->ne[2], (long long) q->ne[2]);
    }
    return PYGGML_OK;
}

const pg_named_rule pg_rules_backward[] = {
    {"REPEAT_BACK", rule_repeat_back},
    {"SILU_BACK", rule_silu_back},
    {"RMS_NORM_BACK", rule_rms_norm_back},
    {"GET_ROWS_BACK", rule_get_rows_back},
    {"SOFT_MAX_BACK", rule_soft_max_back},
    {"ROPE_BACK", pg_rule_rope},
    {"IM2COL_BACK", rule_im2col_back},
    {"POOL_2D_BACK", rule_pool_2d_back},
    {"CROSS_ENTROPY_LOSS_BACK", rule_cross_entropy_loss_back},
    {"FLASH_ATTN_BACK", rule_flash_attn_back},
    {NULL, NULL},
};
