/* Kernel rules for the [arith] family: ADD, SUB, MUL, DIV (pg_rule_binary, which
 * other families may reuse), SCALE, ADD_ID, ADD1, ACC, CLAMP, FILL. Each cites the ggml-cpu/ops.cpp function it mirrors. */
#include "rules.h"

/* ggml_compute_forward_add_id_f32: all F32 but ids (I32); rows of src0, src1 and dst
 * contiguous. (The row indices are data: checked when the graph computes.) */
static int rule_add_id(const struct ggml_tensor * t, pg_why * why) {
    PG_NEED_SRC(t, 0, why);
    PG_NEED_SRC(t, 1, why);
    PG_NEED_SRC(t, 2, why);
    const struct ggml_tensor * a = t->src[0], * b = t->src[1], * ids = t->src[2];
    PG_NEED_TYPE(t, "the result", t->type == GGML_TYPE_F32, why);
    PG_NEED_TYPE(a, "src0", a->type == GGML_TYPE_F32, why);
    PG_NEED_TYPE(b, "src1", b->type == GGML_TYPE_F32, why);
    PG_NEED_TYPE(ids, "the ids (src2)", ids->type == GGML_TYPE_I32, why);
    PG_NEED_ROWS(a, "src0", why);
    PG_NEED_ROWS(b, "src1", why);
    PG_NEED_ROWS(t, "the result", why);
    return PYGGML_OK;
}

/* ggml_compute_forward_add1: src0 F32 (add1_f32 reads the scalar as float), F16 or BF16
 * (with a scalar of the same type or F32), or quantized with a to_float (add1_q_f32, whose
 * switch aborts on Q8_1 and Q8_K: F32 scalar, result
 * of src0's type); element rows contiguous. add1_q_f32 addresses the rows of dst with
 * i3*nb0 where i3*nb3 belongs: with ne3 > 1 it writes batches over each other. */
static int rule_add1(const struct ggml_tensor * t, pg_why * why) {
    PG_NEED_SRC(t, 0, why);
    PG_NEED_SRC(t, 1, why);
    const struct ggml_tensor * a = t->src[0], * b = t->src[1];
    enum ggml_type ta = a->type, tb = b->type;
    if (ta == GGML_TYPE_F32) {
        PG_NEED_TYPE(b, "the scalar (src1) of an F32 src0", tb == GGML_TYPE_F32, why);
    } else if (ta == GGML_TYPE_F16 || ta == GGML_TYPE_BF16) {
        PG_NEED_TYPE(b, "the scalar (src1)", tb == ta || tb == GGML_TYPE_F32, why);
    } else if (pg_is_dequantizable(ta)) {
        PG_NEED_TYPE(b, "the scalar (src1) of a quantized src0", tb == GGML_TYPE_F32, why);
        PG_NEED_TYPE(t, "the result (src0's type)", t->type == ta, why);
        if (!pg_has_cpu_from_float(ta)) {
            why->defect = PG_DEFECT_ADD_Q_NO_FROM_FLOAT;
            return pg_refuse(why, "a %s src0: add1_q_f32 writes the sum back with the type's CPU from_float, "
                             "which %s does not have (a call through NULL)", pg_type(a), pg_type(a));
        }
        if (!(t->nb[0] <= t->nb[1] && t->nb[1] <= t->nb[2] && t->nb[2] <= t->nb[3])) {
            return pg_refuse(why, "the result's strides must increase");
        }
        if (t->ne[3] > 1) {
            why->defect = PG_DEFECT_ADD1_QUANTIZED_BATCH;
            return pg_refuse(why, "a quantized src0 with ne3=%lld > 1: the kernel writes batch i3 at "
                             "i3*nb0 instead of i3*nb3 (batches overwrite each other)", (long long) t->ne[3]);
        }
    } else {
        return pg_refuse_type(why, "the CPU kernel does not take src0 of type %s", pg_type(a));
    }
    PG_NEED_ROWS(a, "src0", why);
    PG_NEED_ROWS(t, "the result", why);
    return PYGGML_OK;
}

/* ggml_compute_forward_acc_f32: F32 only. It views dst (and src0) with the byte strides
 * and offset of op_params[0..3] (int32 as stored by ggml_acc; sizes above 2^31 arrive
 * truncated) and adds src1's rows there. Its own bound check asserts that the *start*
 * of the last element is inside dst: the element itself may end up to 3 bytes past it
 * (a known defect). pyggml requires whole, aligned float elements inside dst. */
static int rule_acc(const struct ggml_tensor * t, pg_why * why) {
    PG_NEED_SRC(t, 0, why);
    PG_NEED_SRC(t, 1, why);
    const struct ggml_tensor * a = t->src[0], * b = t->src[1];
    PG_NEED_TYPE(a, "src0", a->type == GGML_TYPE_F32, why);
    PG_NEED_TYPE(b, "src1", b->type == GGML_TYPE_F32, why);
    PG_NEED_CONTIGUOUS(a, "src0", why);
    PG_NEED_CONTIGUOUS(t, "the result", why);
    PG_NEED_ROWS(b, "src1", why);
    int64_t nb[4] = {4, t->op_params[0], t->op_params[1], t->op_params[2]};
    int64_t offset = t->op_params[3];
    if (offset < 0 || nb[1] < 0 || nb[2] < 0 || nb[3] < 0) {
        return pg_refuse(why, "nb1=%lld, nb2=%lld, nb3=%lld and offset=%lld must be >= 0 and < 2^31 "
                         "(ggml stores them as int32)", (long long) nb[1], (long long) nb[2],
                         (long long) nb[3], (long long) offset);
    }
    if (ggml_nelements(b) == 0) {
        return PYGGML_OK;
    }
    int64_t last = offset;          /* where the last element starts */
    for (int i = 0; i < 4; i++) {
        last += (b->ne[i] - 1) * nb[i];
    }
    const int64_t size = (int64_t) ggml_nbytes(t);
    if (last < size && last + 4 > size) {
        why->defect = PG_DEFECT_ACC_BOUNDS_CHECK;
        return pg_refuse(why, "the last element of src1 starts at byte %lld of a %lld-byte result and "
                         "ends past it: ggml's bound check looks at its start only", (long long) last,
                         (long long) size);
    }
    if (last + 4 > size) {
        return pg_refuse(why, "src1 (ne=(%lld, %lld, %lld, %lld)) placed at offset %lld with strides (%lld, %lld, "
                         "%lld) reaches byte %lld of a %lld-byte result", (long long) b->ne[0], (long long) b->ne[1],
                         (long long) b->ne[2], (long long) b->ne[3], (long long) offset, (long long) nb[1],
                         (long long) nb[2], (long long) nb[3], (long long) (last + 4), (long long) size);
    }
    /* pyggml's policy, as for views: whole, aligned elements */
    if (offset % 4 || nb[1] % 4 || nb[2] % 4 || nb[3] % 4) {
        return pg_refuse(why, "nb1=%lld, nb2=%lld, nb3=%lld and offset=%lld must be multiples of 4 (F32)",
                         (long long) nb[1], (long long) nb[2], (long long) nb[3], (long long) offset);
    }
    return PYGGML_OK;
}

/* ggml_compute_forward_clamp: F32 or F16; rows of src0 and dst contiguous */
static int rule_clamp(const struct ggml_tensor * t, pg_why * why) {
    PG_NEED_SRC(t, 0, why);
    const struct ggml_tensor * a = t->src[0];
    PG_NEED_TYPE(a, "src0", a->type == GGML_TYPE_F32 || a->type == GGML_TYPE_F16, why);
    PG_NEED_ROWS(a, "src0", why);
    PG_NEED_ROWS(t, "the result", why);
    return PYGGML_OK;
}

/* ggml_compute_forward_fill: F32 or F16 (the builder asserts a contiguous src0) */
static int rule_fill(const struct ggml_tensor * t, pg_why * why) {
    PG_NEED_TYPE(t, "the result", t->type == GGML_TYPE_F32 || t->type == GGML_TYPE_F16, why);
    PG_NEED_ROWS(t, "the result", why);
    return PYGGML_OK;
}

/* binary-ops.cpp binary_op/apply_binary_op (ADD, SUB, MUL, DIV of non-quantized a):
 * the type triples it instantiates, dst and src0 rows contiguous; src1 any stride.
 * ops.cpp ggml_compute_forward_add: a quantized src0 goes to add_q_f32 (same shapes,
 * src1 F32, dst of src0's type or F32) where the switch lists it (not Q8_1, Q8_K). */
int pg_rule_binary(const struct ggml_tensor * t, pg_why * why) {
    const struct ggml_tensor * a = t->src[0];
    const struct ggml_tensor * b = t->src[1];
    PG_NEED_SRC(t, 0, why);
    PG_NEED_SRC(t, 1, why);
    enum ggml_type ta = a->type, tb = b->type, td = t->type;
    if (t->op == GGML_OP_ADD && ggml_is_quantized(ta)) {
        /* ggml_compute_forward_add_q_f32, for the types its switch lists (Q8_1 and Q8_K
         * reach GGML_ABORT("fatal error")) */
        if (!pg_is_dequantizable(ta)) {
            return pg_refuse_type(why, "the CPU kernel has no add for a quantized src0 of type %s (no "
                                  "to_float)", pg_type(a));
        }
        if (!ggml_are_same_shape(a, b) || !ggml_are_same_shape(a, t)) {
            return pg_refuse(why, "a quantized src0 (%s) needs src1 and the result of its shape", pg_type(a));
        }
        if (tb != GGML_TYPE_F32 || (td != ta && td != GGML_TYPE_F32)) {
            return pg_refuse_type(why, "a quantized src0 (%s) needs an F32 src1 and a result of its own type "
                             "or F32, got src1 %s, result %s", pg_type(a), pg_type(b), pg_type(t));
        }
        if (!pg_has_cpu_from_float(td)) {
            why->defect = PG_DEFECT_ADD_Q_NO_FROM_FLOAT;
            return pg_refuse(why, "a %s result: add_q_f32 has no CPU from_float for it and copies ne0*nb0 = "
                             "%lld bytes of F32 sums into each %zu-byte row instead (past the row)", pg_type(t),
                             (long long) (t->ne[0] * (int64_t) t->nb[0]), ggml_row_size(t->type, t->ne[0]));
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

/* ops.cpp ggml_compute_forward_scale_f32: F32 (the switch's only case: GGML_ABORT for any
 * other type); src0 and dst contiguous; it walks rows with nb[1] only, so dims of size 1
 * must not carry odd strides (ggml_is_padded_1d). Since 0.25.3 the switch has a BF16 case,
 * ggml_compute_forward_scale_bf16, with the same asserts and the same walk over rows. */
static int rule_scale(const struct ggml_tensor * t, pg_why * why) {
    const struct ggml_tensor * a = t->src[0];
    PG_NEED_SRC(t, 0, why);
    int bf16 = a->type == GGML_TYPE_BF16 && pg_kernel_since((int) t->op, PG_RELEASE(0, 25, 3));
    if (a->type != GGML_TYPE_F32 && !bf16) {
        return pg_kernel_aborts(why, pg_refuse_type(why, "the CPU kernel does not take src0 of type %s", pg_type(a)));
    }
    PG_NEED_CONTIGUOUS(a, "src0", why);
    PG_NEED_CONTIGUOUS(t, "the result", why);
    if (!(a->nb[2] == a->nb[1] * a->ne[1] && a->nb[3] == a->nb[2] * a->ne[2])) {
        return pg_refuse(why, "src0 must have packed rows (nb[2] = nb[1]*ne[1], nb[3] = nb[2]*ne[2]): the "
                         "kernel walks rows with nb[1] only; got nb=(%zu, %zu, %zu, %zu)",
                         a->nb[0], a->nb[1], a->nb[2], a->nb[3]);
    }
    return PYGGML_OK;
}

const pg_named_rule pg_rules_arith[] = {
    {"ADD_ID", rule_add_id},
    {"ADD1", rule_add1},
    {"ACC", rule_acc},
    {"CLAMP", rule_clamp},
    {"FILL", rule_fill},
    {"ADD", pg_rule_binary},
    {"SUB", pg_rule_binary},
    {"MUL", pg_rule_binary},
    {"DIV", pg_rule_binary},
    {"SCALE", rule_scale},
    {NULL, NULL},
};
