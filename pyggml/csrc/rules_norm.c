/* Kernel rules for the [norm] family: NORM, RMS_NORM, GROUP_NORM, L2_NORM. Each rule
 * cites the ggml-cpu function (ggml-cpu/ops.cpp) whose assertions and type switch it
 * mirrors. All four kernels take F32 only, into a result of src0's shape.
 *
 * ggml_compute_forward (ggml-cpu.c) skips a node whose result is empty; the RMS_NORM+MUL
 * fusion (ggml_cpu_try_fuse_ops) does not, see rule_rms_norm. */
#include "rules.h"

#include <limits.h>
#include <stdint.h>
#include <string.h>

#ifndef GGML_MAX_N_THREADS
#define GGML_MAX_N_THREADS 512
#endif

static float op_param_f32(const struct ggml_tensor * t, int i) {
    float v;
    memcpy(&v, &t->op_params[i], sizeof(v));
    return v;
}

static int need_f32_same_shape(const struct ggml_tensor * t, pg_why * why) {
    const struct ggml_tensor * a = t->src[0];
    PG_NEED_TYPE(a, "src0", a->type == GGML_TYPE_F32 && t->type == GGML_TYPE_F32, why);
    if (!ggml_are_same_shape(a, t)) {
        return pg_refuse(why, "src0 and the result must have the same shape");
    }
    return PYGGML_OK;
}

/* the kernels GGML_ASSERT(eps >= 0.0f): false for a negative eps and for NaN */
static int need_eps(const struct ggml_tensor * t, pg_why * why) {
    const float eps = op_param_f32(t, 0);
    if (!(eps >= 0.0f)) {
        return pg_refuse(why, "eps must be >= 0 (the kernel asserts it), got %g", (double) eps);
    }
    return PYGGML_OK;
}

/* ops.cpp ggml_compute_forward_norm_f32: F32; GGML_ASSERTs equal shapes and eps >= 0;
 * src0 and dst at any stride (a strided path when nb[0] is not 4) */
static int rule_norm(const struct ggml_tensor * t, pg_why * why) {
    PG_NEED_SRC(t, 0, why);
    if (ggml_is_empty(t)) {
        return PYGGML_OK;
    }
    int rc = need_f32_same_shape(t, why);
    return rc != PYGGML_OK ? rc : need_eps(t, why);
}

/* ops.cpp ggml_compute_forward_rms_norm_f32: F32; GGML_ASSERTs equal shapes, src0 rows
 * contiguous and eps >= 0; copies each row into dst with memcpy (dst rows contiguous).
 * ggml_cpu_try_fuse_ops runs it fused with a following MUL (F32 src0) without skipping an
 * empty result, so for an F32 src0 the assertions hold even on an empty node. */
static int rule_rms_norm(const struct ggml_tensor * t, pg_why * why) {
    const struct ggml_tensor * a = t->src[0];
    PG_NEED_SRC(t, 0, why);
    if (ggml_is_empty(t) && a->type != GGML_TYPE_F32) {
        return PYGGML_OK;
    }
    int rc = need_f32_same_shape(t, why);
    if (rc != PYGGML_OK) {
        return rc;
    }
    PG_NEED_ROWS(a, "src0", why);
    if (ggml_is_empty(t)) {
        return need_eps(t, why);
    }
    PG_NEED_ROWS(t, "the result", why);
    return need_eps(t, why);
}

/* ops.cpp ggml_compute_forward_group_norm_f32: F32; GGML_ASSERTs equal shapes and src0
 * rows contiguous; writes dst rows contiguously. n_groups (op_params[0]) is an int divisor
 * of (n_channels + n_groups - 1) with n_channels = (int) ne[2]: 0 divides by zero
 * (SIGFPE); a negative count runs no group and leaves the result unwritten; the sum and
 * the per-thread loop `i += nth` overflow int near INT_MAX. Groups of
 * ceil(ne[2]/n_groups) channels, the last ones smaller or empty, cover every channel for
 * any n_groups >= 1. No assertion on eps (op_params[1]). */
static int rule_group_norm(const struct ggml_tensor * t, pg_why * why) {
    const struct ggml_tensor * a = t->src[0];
    PG_NEED_SRC(t, 0, why);
    if (ggml_is_empty(t)) {
        return PYGGML_OK;
    }
    int rc = need_f32_same_shape(t, why);
    if (rc != PYGGML_OK) {
        return rc;
    }
    const int32_t n_groups = t->op_params[0];
    if (n_groups < 1) {
        return pg_refuse(why, "n_groups must be >= 1, got %d", (int) n_groups);
    }
    if (a->ne[2] + (int64_t) n_groups + GGML_MAX_N_THREADS > INT_MAX) {
        return pg_refuse(why, "n_groups = %d with ne[2] = %lld channels overflows the kernel's int "
                         "arithmetic", (int) n_groups, (long long) a->ne[2]);
    }
    PG_NEED_ROWS(a, "src0", why);
    PG_NEED_ROWS(t, "the result", why);
    return PYGGML_OK;
}

/* ops.cpp ggml_compute_forward_l2_norm_f32: F32; GGML_ASSERTs equal shapes and eps >= 0;
 * src0 and dst at any stride (a strided path when nb[0] is not 4) */
static int rule_l2_norm(const struct ggml_tensor * t, pg_why * why) {
    PG_NEED_SRC(t, 0, why);
    if (ggml_is_empty(t)) {
        return PYGGML_OK;
    }
    int rc = need_f32_same_shape(t, why);
    return rc != PYGGML_OK ? rc : need_eps(t, why);
}

const pg_named_rule pg_rules_norm[] = {
    {"NORM", rule_norm},
    {"RMS_NORM", rule_rms_norm},
    {"GROUP_NORM", rule_group_norm},
    {"L2_NORM", rule_l2_norm},
    {NULL, NULL},
};
