/* Helpers for writing kernel rules (preconditions*.c). Internal to libpyggml_rt.
 *
 * A rule looks at one node (its type, ne, nb, op_params and sources) and says whether
 * the CPU kernel of its op runs on it: PYGGML_OK, or PYGGML_REFUSED with a message that
 * names the source (src0, src1, ...) and the values. Rules are written from ggml-cpu's
 * kernels (ggml-cpu/ops.cpp and friends) and each cites what it mirrors; tests check
 * both sides of every rule against a forked run of the kernel. */
#pragma once

#include <stdarg.h>
#include <stdio.h>

#include "ggml-cpu.h"
#include "pyggml_defects.h"   /* generated: PG_DEFECT_<ID> for each pyggml.defects id */
#include "pyggml_rt.h"

typedef struct pg_why {
    char * buf;
    size_t cap;
    const char * defect;   /* a pyggml.defects id when the refusal is a known upstream defect */
    int aborts;            /* the refusal stands for the kernel's own abort (pg_kernel_aborts) */
} pg_why;

typedef int (*pg_rule)(const struct ggml_tensor * t, pg_why * why);

/* 0 while tests turn the rules off (pyggml_checks_set_enabled): the backward checks too */
int pg_rules_enabled(void);
int pg_fab_batch_gqa_fixed(void);   /* the linked ggml measured free of fab-batch-gqa-oob */

int pg_refuse(pg_why * why, const char * fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* the same, for what the linked ggml lacks (a mode its ggml.h does not define, which its
 * kernel would take for another): a GGMLVersionError in Python */
int pg_lacks(pg_why * why, const char * fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* the same, for a node ggml's backward pass has no gradient for (UnsupportedOpError) */
int pg_no_backward(pg_why * why, const char * fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* the same, for a type the kernel does not take (a TypeError in Python) */
int pg_refuse_type(pg_why * why, const char * fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Marks a refusal as standing for an abort of the kernel the rule was written against (a
 * GGML_ABORT or GGML_ASSERT that kills the process, measured by the clause's test as the
 * kernel verdict "abort"), not for silent harm (a read out of bounds, a wrong value, a
 * hang): `return pg_kernel_aborts(why, pg_refuse_type(why, ...));`. Where that op's kernel
 * has changed (pyggml_kernel_untrusted), such a refusal is not kept: the node is UNCHECKED
 * and the fenced, forked proof decides, so a changed kernel that now takes it is not
 * refused falsely, and one that still aborts is refused with its own message. A refusal
 * not marked so stands whatever the kernel. */
int pg_kernel_aborts(pg_why * why, int rc);

/* A release as one number, for pg_kernel_since: PG_RELEASE(0, 25, 3) */
#define PG_RELEASE(major, minor, patch) ((major) * 1000000 + (minor) * 1000 + (patch))

/* Every trusted kernel is some release's: the pinned prints' (kernels.txt `pinned X.Y.Z`) or
 * the one a review accepted it for (`OP DIGEST RELEASE`). pg_kernel_since is 1 where op's
 * kernel is `release`'s or a later one's: for a clause that holds for the newer kernels
 * only, such as a type the new kernel takes (`if (type == BF16 && pg_kernel_since(op,
 * PG_RELEASE(0, 25, 3)))`); pg_kernel_before where it is an earlier release's: for what the
 * older kernels do (ROPE's n_dims = 0 copies the row before the rewrite that hangs). Both
 * are 0 for an untrusted kernel: there a refusal marked pg_kernel_aborts leaves the node to
 * the proof, and one that is not stands. A review of a later release checks each such
 * clause again (the kernel may have changed the other way). */
int pg_kernel_since(int op, int release);
int pg_kernel_before(int op, int release);

/* rules that several ops share because their kernels are one template: */
int pg_rule_binary(const struct ggml_tensor * t, pg_why * why);  /* rules_arith.c: binary-ops.cpp binary_op */
int pg_rule_unary(const struct ggml_tensor * t, pg_why * why);   /* preconditions.c: unary-ops.cpp unary_op */
int pg_rule_rope(const struct ggml_tensor * t, pg_why * why);    /* rules_attention.c: ops.cpp rope (ROPE_BACK too) */

/* predicates over one tensor */
int pg_rows_contiguous(const struct ggml_tensor * t);    /* nb[0] == type size */
int pg_contiguous(const struct ggml_tensor * t);         /* ggml_is_contiguous and nb[0] == type size */
int pg_is_float(enum ggml_type type);                    /* F32, F16 or BF16 */
int pg_is_dequantizable(enum ggml_type type);            /* quantized, with a to_float (not Q8_1, Q8_K) */
int pg_has_cpu_from_float(enum ggml_type type);          /* the CPU backend converts F32 rows into it */
const char * pg_type(const struct ggml_tensor * t);      /* type name, "NULL" for no tensor */

/* checks that return from the rule with a refusal; `i` is the source index (-1: the result) */
#define PG_NEED_SRC(t, i, why)                                                                   \
    do {                                                                                         \
        if ((t)->src[i] == NULL)                                                                 \
            return pg_refuse(why, "src%d is missing", i);                                        \
    } while (0)

#define PG_NEED_ROWS(x, name, why)                                                               \
    do {                                                                                         \
        if (!pg_rows_contiguous(x))                                                              \
            return pg_refuse(why, "%s must have contiguous rows (nb[0] = %zu, the size of %s), " \
                             "got nb[0] = %zu", name, ggml_type_size((x)->type), pg_type(x),    \
                             (x)->nb[0]);                                                        \
    } while (0)

#define PG_NEED_CONTIGUOUS(x, name, why)                                                         \
    do {                                                                                         \
        if (!pg_contiguous(x))                                                                   \
            return pg_refuse(why, "%s must be contiguous, got ne=(%lld, %lld, %lld, %lld) "      \
                             "nb=(%zu, %zu, %zu, %zu)", name,                                    \
                             (long long) (x)->ne[0], (long long) (x)->ne[1],                     \
                             (long long) (x)->ne[2], (long long) (x)->ne[3],                     \
                             (x)->nb[0], (x)->nb[1], (x)->nb[2], (x)->nb[3]);                    \
    } while (0)

#define PG_NEED_TYPE(x, name, cond, why)                                                         \
    do {                                                                                         \
        if (!(cond))                                                                             \
            return pg_refuse_type(why, "the CPU kernel does not take %s of type %s", name, pg_type(x)); \
    } while (0)

/* A rule table: {"ADD", rule_add}, {"UNARY:RELU", rule_unary}, ..., {NULL, NULL}. Names
 * are ggml_op_name / ggml_unary_op_name / ggml_glu_op_name of the linked ggml, so one
 * source builds against any release; rules for ops a release lacks are ignored. */
typedef struct pg_named_rule {
    const char * name;
    pg_rule rule;
} pg_named_rule;

/* the blocked attention backward node (attn_node.c), for the GGML_OP_CUSTOM rule */
int pyggml_is_attn_bwd_node(const struct ggml_tensor * t);
int pyggml_attn_bwd_check(const struct ggml_tensor * t, pg_why * why);
