/* Kernel rules for the [train] family: CROSS_ENTROPY_LOSS, OPT_STEP_ADAMW, OPT_STEP_SGD.
 * Each rule cites the ggml-cpu function whose assertions, type switch and silent
 * assumptions it mirrors. */
#include "rules.h"

/* A kernel that walks the rows of x as row r at r*nb[1] (r over ggml_nrows) reads the
 * right rows only if dims 2 and 3 are packed over rows: nb[2] = nb[1]*ne[1] when
 * ne[2] > 1, nb[3] = nb[1]*ne[1]*ne[2] when ne[3] > 1 (ggml_is_contiguous is not
 * enough: it ignores the stride of a dim of size 1, the walk does not). */
static int rows_walkable(const struct ggml_tensor * x) {
    return (x->ne[2] <= 1 || x->nb[2] == x->nb[1] * (size_t) x->ne[1]) &&
           (x->ne[3] <= 1 || x->nb[3] == x->nb[1] * (size_t) (x->ne[1] * x->ne[2]));
}

#define NEED_WALKABLE(x, name, why)                                                              \
    do {                                                                                         \
        if (!rows_walkable(x))                                                                   \
            return pg_refuse(why, "%s: the kernel walks its rows with nb[1] only, so dims 2 and 3 " \
                             "must be packed over rows; got ne=(%lld, %lld, %lld, %lld) "         \
                             "nb=(%zu, %zu, %zu, %zu)", name,                                    \
                             (long long) (x)->ne[0], (long long) (x)->ne[1],                     \
                             (long long) (x)->ne[2], (long long) (x)->ne[3],                     \
                             (x)->nb[0], (x)->nb[1], (x)->nb[2], (x)->nb[3]);                    \
    } while (0)

/* ops.cpp ggml_compute_forward_cross_entropy_loss_f32: src0 (logits) and src1 (labels)
 * F32 with nb[0] the element size (asserted), the same shape (the builder); rows read
 * at i1*nb[1]; the result a scalar of src0's type, so F32. The work buffer
 * (nth + nth*ne0 floats) is what ggml_graph_plan reserves. */
static int rule_cross_entropy_loss(const struct ggml_tensor * t, pg_why * why) {
    const struct ggml_tensor * a = t->src[0];
    const struct ggml_tensor * b = t->src[1];
    PG_NEED_SRC(t, 0, why);
    PG_NEED_SRC(t, 1, why);
    PG_NEED_TYPE(a, "the logits (src0)", a->type == GGML_TYPE_F32, why);
    PG_NEED_TYPE(b, "the labels (src1)", b->type == GGML_TYPE_F32, why);
    PG_NEED_ROWS(a, "the logits (src0)", why);
    PG_NEED_ROWS(b, "the labels (src1)", why);
    NEED_WALKABLE(a, "the logits (src0)", why);
    NEED_WALKABLE(b, "the labels (src1)", why);
    return PYGGML_OK;
}

/* x is read (and written) at the byte offsets of ref's rows: every dim of size > 1 must
 * have ref's stride, and x's rows must be contiguous */
static int same_layout(const struct ggml_tensor * x, const struct ggml_tensor * ref) {
    if (x->ne[0] > 1 && x->nb[0] != ggml_type_size(x->type)) {
        return 0;
    }
    for (int d = 1; d < 4; d++) {
        if (x->ne[d] > 1 && x->nb[d] != ref->nb[d]) {
            return 0;
        }
    }
    return 1;
}

static int need_opt_operand(const struct ggml_tensor * x, const struct ggml_tensor * w, const char * name,
                            pg_why * why) {
    if (x->type != GGML_TYPE_F32) {
        return pg_refuse_type(why, "the CPU kernel reads %s as F32, got %s", name, pg_type(x));
    }
    if (!same_layout(x, w)) {
        return pg_refuse(why, "%s must be laid out like the parameter (the kernel reads it at the parameter's "
                         "offsets): nb=(%zu, %zu, %zu, %zu), the parameter's nb=(%zu, %zu, %zu, %zu)", name,
                         x->nb[0], x->nb[1], x->nb[2], x->nb[3], w->nb[0], w->nb[1], w->nb[2], w->nb[3]);
    }
    return PYGGML_OK;
}

/* the builder asserts F32 and n elements */
static int need_hyperparams(const struct ggml_tensor * p, int64_t n, const char * name, pg_why * why) {
    if (!ggml_is_contiguous(p)) {
        return pg_refuse(why, "%s must be contiguous (the kernel reads its %lld floats in a row)", name,
                         (long long) n);
    }
    return PYGGML_OK;
}

/* ops.cpp ggml_compute_forward_opt_step_adamw_f32: the parameter (src0) F32, nb00 the
 * element size (asserted); the gradient, m and v (src1..3) are read and written as
 * float at the parameter's row offsets (i01*nb01 + i02*nb02 + i03*nb03); the 7
 * hyper-parameters (src4) read as a float array. */
static int rule_opt_step_adamw(const struct ggml_tensor * t, pg_why * why) {
    for (int i = 0; i < 5; i++) {
        PG_NEED_SRC(t, i, why);
    }
    const struct ggml_tensor * w = t->src[0];
    PG_NEED_TYPE(w, "the parameter (src0)", w->type == GGML_TYPE_F32, why);
    PG_NEED_ROWS(w, "the parameter (src0)", why);
    static const char * names[] = {"", "the gradient (src1)", "m (src2)", "v (src3)"};
    for (int i = 1; i < 4; i++) {
        int rc = need_opt_operand(t->src[i], w, names[i], why);
        if (rc != PYGGML_OK) {
            return rc;
        }
    }
    return need_hyperparams(t->src[4], 7, "adamw_params (src4)", why);
}

/* ops.cpp ggml_compute_forward_opt_step_sgd_f32: as AdamW with the gradient only and 2
 * hyper-parameters (alpha, weight decay). */
static int rule_opt_step_sgd(const struct ggml_tensor * t, pg_why * why) {
    for (int i = 0; i < 3; i++) {
        PG_NEED_SRC(t, i, why);
    }
    const struct ggml_tensor * w = t->src[0];
    PG_NEED_TYPE(w, "the parameter (src0)", w->type == GGML_TYPE_F32, why);
    PG_NEED_ROWS(w, "the parameter (src0)", why);
    int rc = need_opt_operand(t->src[1], w, "the gradient (src1)", why);
    if (rc != PYGGML_OK) {
        return rc;
    }
    return need_hyperparams(t->src[2], 2, "sgd_params (src2)", why);
}

const pg_named_rule pg_rules_train[] = {
    {"CROSS_ENTROPY_LOSS", rule_cross_entropy_loss},
    {"OPT_STEP_ADAMW", rule_opt_step_adamw},
    {"OPT_STEP_SGD", rule_opt_step_sgd},
    {NULL, NULL},
};
