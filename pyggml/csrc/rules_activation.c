/* Kernel rules for the [activation] family: the activation UNARY ops and LEAKY_RELU.
 *
 * TANH, ELU, RELU, SIGMOID, HARDSWISH, HARDSIGMOID: unary-ops.cpp unary_op<op>, the
 * template pg_rule_unary mirrors (see rules_math.c). The others have kernels of their
 * own, each checked below. */
#include "rules.h"

/* ops.cpp ggml_compute_forward_gelu / gelu_erf / gelu_quick / silu: a switch on src0's
 * type that takes F32 and F16 only (GGML_ABORT otherwise: BF16 too, which the
 * unary_op template would take), with a result of src0's type (the builder's). Rows are
 * walked with all four strides and elements read contiguously: the assert of
 * ggml_is_contiguous_rows(src0) is compiled out, but the builder ggml_unary_impl asserts
 * it, and a row of one element with any nb[0] is read right (nothing to refuse there,
 * unlike the unary_op template). Since 0.25.3 the four switches have a BF16 case,
 * ggml_compute_forward_unary_bf16_rows: the F16 kernels' walk over rows, for BF16. */
static int rule_gelu_like(const struct ggml_tensor * t, pg_why * why) {
    const struct ggml_tensor * a = t->src[0];
    PG_NEED_SRC(t, 0, why);
    const int bf16 = pg_kernel_since((int) t->op, PG_RELEASE(0, 25, 3));
    if (!(a->type == GGML_TYPE_F32 || a->type == GGML_TYPE_F16 || (bf16 && a->type == GGML_TYPE_BF16)) ||
        t->type != a->type) {
        return pg_kernel_aborts(why, pg_refuse_type(why, "the CPU kernel takes F32 or F16%s (with a result of "
                                                     "the same type), got src0 %s, result %s",
                                                     bf16 ? " or BF16" : "", pg_type(a), pg_type(t)));
    }
    return PYGGML_OK;
}

/* unary-ops.cpp ggml_compute_forward_xielu -> unary_op_functor: the types of the
 * unary_op template (pg_rule_unary), and apply_unary_op_functor GGML_ASSERTs
 * ggml_is_contiguous_1 of src0 and of the result (rows contiguous, dims 2 and 3 packed
 * over dim 1) although it walks rows with all four strides. The builder ggml_xielu
 * asserts no layout. An empty node is not computed. */
static int rule_xielu(const struct ggml_tensor * t, pg_why * why) {
    const struct ggml_tensor * a = t->src[0];
    int rc = pg_rule_unary(t, why);
    if (rc != PYGGML_OK || ggml_nelements(t) == 0) {
        return rc;
    }
    if (!ggml_is_contiguous_1(a) || !ggml_is_contiguous_1(t)) {
        const struct ggml_tensor * x = ggml_is_contiguous_1(a) ? t : a;
        return pg_refuse(why, "%s must be contiguous over dims 1..3 (ggml_is_contiguous_1, asserted by the "
                         "kernel): got ne=(%lld, %lld, %lld, %lld) nb=(%zu, %zu, %zu, %zu)",
                         x == a ? "src0" : "the result", (long long) x->ne[0], (long long) x->ne[1],
                         (long long) x->ne[2], (long long) x->ne[3], x->nb[0], x->nb[1], x->nb[2], x->nb[3]);
    }
    return PYGGML_OK;
}

/* ops.cpp ggml_compute_forward_leaky_relu: F32 or F16 (GGML_ABORT otherwise), a result
 * of src0's type. One thread walks ggml_nrows(src0) rows as row i at i*nb[1] of src0
 * and of the result, elements contiguous: its asserts of ggml_is_contiguous_1 (src0 and
 * result) are compiled out and the builder checks no layout, so any other layout reads
 * (and, in place, writes) the wrong elements, or past the tensor. ggml_is_contiguous_1 is
 * exactly the layout that walk reads right. An empty node is not computed. */
static int rule_leaky_relu(const struct ggml_tensor * t, pg_why * why) {
    const struct ggml_tensor * a = t->src[0];
    PG_NEED_SRC(t, 0, why);
    if (!(a->type == GGML_TYPE_F32 || a->type == GGML_TYPE_F16) || t->type != a->type) {
        return pg_kernel_aborts(why, pg_refuse_type(why, "the CPU kernel takes F32 or F16 (with a result of "
                                                     "the same type), got src0 %s, result %s", pg_type(a),
                                                     pg_type(t)));
    }
    if (ggml_nelements(t) == 0) {
        return PYGGML_OK;
    }
    if (!ggml_is_contiguous_1(a) || !ggml_is_contiguous_1(t)) {
        const struct ggml_tensor * x = ggml_is_contiguous_1(a) ? t : a;
        return pg_refuse(why, "%s must be contiguous over dims 1..3 (ggml_is_contiguous_1): the kernel walks "
                         "its rows as row i at i*nb[1] with contiguous elements; got ne=(%lld, %lld, %lld, %lld) "
                         "nb=(%zu, %zu, %zu, %zu); use cont()",
                         x == a ? "src0" : "the result", (long long) x->ne[0], (long long) x->ne[1],
                         (long long) x->ne[2], (long long) x->ne[3], x->nb[0], x->nb[1], x->nb[2], x->nb[3]);
    }
    return PYGGML_OK;
}

const pg_named_rule pg_rules_activation[] = {
    {"UNARY:TANH", pg_rule_unary},
    {"UNARY:ELU", pg_rule_unary},
    {"UNARY:RELU", pg_rule_unary},
    {"UNARY:SIGMOID", pg_rule_unary},
    {"UNARY:HARDSWISH", pg_rule_unary},
    {"UNARY:HARDSIGMOID", pg_rule_unary},
    {"UNARY:GELU", rule_gelu_like},
    {"UNARY:GELU_ERF", rule_gelu_like},
    {"UNARY:GELU_QUICK", rule_gelu_like},
    {"UNARY:SILU", rule_gelu_like},
    {"UNARY:XIELU", rule_xielu},
    {"LEAKY_RELU", rule_leaky_relu},
    {NULL, NULL},
};
