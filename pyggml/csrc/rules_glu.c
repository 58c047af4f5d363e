/* Kernel rules for the [glu] family (GGML_OP_GLU).
 *
 * ops.cpp ggml_compute_forward_glu -> reglu / geglu / swiglu / geglu_erf / geglu_quick:
 * a switch on src0's type that takes F32 and F16 (GGML_ABORT otherwise, BF16 too);
 * swiglu_oai takes F32 only. The kernels GGML_ASSERT what the builder ggml_glu_impl
 * already asserts (src0, src1 and the result ggml_is_contiguous_1, src1 of src0's shape
 * and type) and walk ggml_nrows(src0) rows as row i at i*nb[1]: the asserted layout.
 * Without src1, each row's halves are [0, ne0/2) and [ne0/2, 2*(ne0/2)) (an odd row's
 * last element is not read). The result has src0's type (the builder's).
 * Since 0.25.3 the five switches have a BF16 case (glu_bf16_rows: the same asserts and walk);
 * swiglu_oai still takes F32 only. 0.25.3's swiglu_clamp takes F32 and F16 (GGML_ABORT
 * otherwise), with the same asserts and walk; no BF16 case. */
#include "rules.h"

static int glu_types(const struct ggml_tensor * t, pg_why * why, int f16_too, int bf16_too) {
    const struct ggml_tensor * a = t->src[0];
    PG_NEED_SRC(t, 0, why);
    int ok = a->type == GGML_TYPE_F32 || (f16_too && a->type == GGML_TYPE_F16) ||
             (bf16_too && a->type == GGML_TYPE_BF16);
    if (!ok || t->type != a->type) {
        return pg_kernel_aborts(why, pg_refuse_type(why, "the CPU kernel takes %s (with a result of the same "
                                                     "type), got src0 %s, result %s", !f16_too ? "F32 only" :
                                                     bf16_too ? "F32, F16 or BF16" : "F32 or F16",
                                                     pg_type(a), pg_type(t)));
    }
    return PYGGML_OK;
}

/* REGLU, GEGLU, SWIGLU, GEGLU_ERF, GEGLU_QUICK */
static int rule_glu(const struct ggml_tensor * t, pg_why * why) {
    return glu_types(t, why, 1, pg_kernel_since((int) t->op, PG_RELEASE(0, 25, 3)));
}

/* ops.cpp ggml_compute_forward_swiglu_clamp (0.25.3): F32 and F16 */
static int rule_swiglu_clamp(const struct ggml_tensor * t, pg_why * why) {
    return glu_types(t, why, 1, 0);
}

/* ops.cpp ggml_compute_forward_swiglu_oai: F32 only */
static int rule_swiglu_oai(const struct ggml_tensor * t, pg_why * why) {
    return glu_types(t, why, 0, 0);
}

const pg_named_rule pg_rules_glu[] = {
    {"GLU:REGLU", rule_glu},
    {"GLU:GEGLU", rule_glu},
    {"GLU:SWIGLU", rule_glu},
    {"GLU:GEGLU_ERF", rule_glu},
    {"GLU:GEGLU_QUICK", rule_glu},
    {"GLU:SWIGLU_OAI", rule_swiglu_oai},
    {"GLU:SWIGLU_CLAMP", rule_swiglu_clamp},    /* a ggml without it: the entry binds to nothing */
    {NULL, NULL},
};
