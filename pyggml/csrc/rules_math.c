/* Kernel rules for the [math] family: SQR, SQRT, LOG, SIN, COS and the parameterless
 * elementwise UNARY ops (ABS, SGN, NEG, STEP, EXP, EXPM1, SOFTPLUS, FLOOR, CEIL, ROUND,
 * TRUNC).
 *
 * Every one of them is unary-ops.cpp's unary_op<op> template (ggml-cpu.c calls
 * ggml_compute_forward_log/sin/cos directly; ops.cpp ggml_compute_forward_unary
 * dispatches the UNARY ones): pg_rule_unary (preconditions.c) mirrors it (F32, F16, BF16 alike, or
 * F16/BF16 -> F32; apply_unary_op GGML_ASSERTs nb[0] == the element size of src0 and of
 * the result, also for rows of one element, which ggml_is_contiguous_rows and so the
 * builder ggml_unary_impl let through; rows are walked with all four strides).
 * The builders of LOG, SIN and COS assert nothing: their layout and type are checked
 * here only. */
#include "rules.h"

const pg_named_rule pg_rules_math[] = {
    {"SQR", pg_rule_unary},
    {"SQRT", pg_rule_unary},
    {"LOG", pg_rule_unary},
    {"SIN", pg_rule_unary},
    {"COS", pg_rule_unary},
    {"UNARY:ABS", pg_rule_unary},
    {"UNARY:SGN", pg_rule_unary},
    {"UNARY:NEG", pg_rule_unary},
    {"UNARY:STEP", pg_rule_unary},
    {"UNARY:EXP", pg_rule_unary},
    {"UNARY:EXPM1", pg_rule_unary},
    {"UNARY:SOFTPLUS", pg_rule_unary},
    {"UNARY:FLOOR", pg_rule_unary},
    {"UNARY:CEIL", pg_rule_unary},
    {"UNARY:ROUND", pg_rule_unary},
    {"UNARY:TRUNC", pg_rule_unary},
    {NULL, NULL},
};
