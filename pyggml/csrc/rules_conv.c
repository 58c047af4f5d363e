/* Kernel rules for the [conv] family: IM2COL, IM2COL_3D, COL2IM_1D, CONV_2D, CONV_3D,
 * CONV_2D_DW, CONV_TRANSPOSE_1D, CONV_TRANSPOSE_2D, POOL_1D, POOL_2D, UPSCALE,
 * TIMESTEP_EMBEDDING. The composite builders (conv_1d, conv_2d, conv_2d_dw, conv_3d, ...)
 * add MUL_MAT, RESHAPE, PERMUTE and CONT nodes: rules_core.c checks those.
 *
 * Each rule cites the ggml-cpu/ops.cpp function it mirrors. Strides, paddings and
 * dilations of any sign are safe where a kernel bounds-checks every input coordinate
 * (im2col, conv_2d, conv_3d, conv_2d_dw, pool): the result is the op's formula with
 * zeros (pool: nothing) outside the input, and those are not refused. A stride of 0
 * never reaches a rule there: the builders divide by it (SIGFPE, GGMLAbort). */
#include "rules.h"

#include <limits.h>

/* ggml-cpu/ops.h GGML_IM2COL_WORK_SIZE: what ggml_graph_plan reserves for CONV_2D and
 * CONV_3D (the kernels take their patches in batches that fit it), plus the cache line
 * per thread the plan adds to any work buffer (CACHE_LINE_SIZE, 64 bytes; one thread at
 * least) */
#define PG_IM2COL_WORK_SIZE ((int64_t) 16 * 1024 * 1024)
#define PG_WORK_PAD ((int64_t) 64)

/* ggml.h enum ggml_scale_mode and ggml_scale_flag (by value: older headers lack some) */
#define PG_SCALE_MODE_NEAREST 0
#define PG_SCALE_MODE_BILINEAR 1
#define PG_SCALE_FLAG_ALIGN_CORNERS (1 << 8)
#define PG_SCALE_FLAG_ANTIALIAS (1 << 9)

static int packed_rows_after_1(const struct ggml_tensor * x) {
    /* row (i1, i2, i3) lies at (i1 + ne1*(i2 + ne2*i3)) * nb1: rows evenly spaced */
    return (x->ne[2] <= 1 || x->nb[2] == x->nb[1] * (size_t) x->ne[1]) &&
           (x->ne[3] <= 1 || x->nb[3] == x->nb[1] * (size_t) (x->ne[1] * x->ne[2]));
}

/* ggml_compute_forward_im2col: dst F32 (im2col_f32: src1 F32) or F16 (im2col_f16: src1
 * F16 or F32); src1 elements contiguous (asserted). The 2-d kernel reads pixel (iih, iiw)
 * of a channel at iih*IW + iiw: the rows of each plane must be packed (nb1 = ne0*size),
 * which nothing asserts. src0 (the kernel) gives only its shape. */
static int rule_im2col(const struct ggml_tensor * t, pg_why * why) {
    PG_NEED_SRC(t, 0, why);
    PG_NEED_SRC(t, 1, why);
    const struct ggml_tensor * b = t->src[1];
    if (t->type == GGML_TYPE_F32) {
        PG_NEED_TYPE(b, "the data (src1) of an F32 result", b->type == GGML_TYPE_F32, why);
    } else if (t->type == GGML_TYPE_F16) {
        PG_NEED_TYPE(b, "the data (src1) of an F16 result", b->type == GGML_TYPE_F32 || b->type == GGML_TYPE_F16,
                     why);
    } else {
        return pg_refuse_type(why, "the CPU kernel makes F32 or F16 columns, not %s", pg_type(t));
    }
    PG_NEED_ROWS(b, "the data (src1)", why);
    const int is_2d = t->op_params[6] == 1;
    if (is_2d && b->ne[1] > 1 && b->nb[1] != b->nb[0] * (size_t) b->ne[0]) {
        return pg_refuse(why, "the data (src1) must have packed rows (nb[1] = ne[0]*nb[0] = %zu): the 2-d kernel "
                         "reads row iih of a channel at iih*ne[0]; got nb[1] = %zu",
                         b->nb[0] * (size_t) b->ne[0], b->nb[1]);
    }
    return PYGGML_OK;
}

/* ggml_compute_forward_im2col_3d: dst F16 or F32, src1 F32 with contiguous elements (both
 * asserted); src1 is read through all its strides, src0 gives only its shape */
static int rule_im2col_3d(const struct ggml_tensor * t, pg_why * why) {
    PG_NEED_SRC(t, 0, why);
    PG_NEED_SRC(t, 1, why);
    const struct ggml_tensor * b = t->src[1];
    PG_NEED_TYPE(t, "the result", t->type == GGML_TYPE_F32 || t->type == GGML_TYPE_F16, why);
    PG_NEED_TYPE(b, "the data (src1)", b->type == GGML_TYPE_F32, why);
    PG_NEED_ROWS(b, "the data (src1)", why);
    return PYGGML_OK;
}

/* ggml_compute_forward_col2im_1d: F32, F16 or BF16 alike, src0 and dst contiguous (all
 * asserted by ggml_col2im_1d as well; s0, oc > 0 and p0 >= 0 too) */
static int rule_col2im_1d(const struct ggml_tensor * t, pg_why * why) {
    PG_NEED_SRC(t, 0, why);
    const struct ggml_tensor * a = t->src[0];
    PG_NEED_TYPE(a, "src0", pg_is_float(a->type) && t->type == a->type, why);
    PG_NEED_CONTIGUOUS(a, "src0", why);
    PG_NEED_CONTIGUOUS(t, "the result", why);
    if (t->op_params[0] <= 0 || t->op_params[1] <= 0) {
        return pg_refuse(why, "s0 = %d and oc = %d must be > 0", t->op_params[0], t->op_params[1]);
    }
    return PYGGML_OK;
}

/* ggml_compute_forward_conv_2d_impl / conv_3d_impl: takes the patches in batches that fit
 * the work buffer; a single patch (kernel elements in the kernel's type, plus one float
 * per output channel) larger than the work buffer fails its
 * GGML_ASSERT(patches_per_batch > 0) */
static int conv_patch_fits(int64_t knl_n, enum ggml_type kt, int64_t c_out, pg_why * why) {
    const int64_t space = knl_n * (int64_t) ggml_type_size(kt) + c_out * (int64_t) sizeof(float);
    if (space > PG_IM2COL_WORK_SIZE + PG_WORK_PAD) {
        return pg_refuse(why, "one patch (%lld kernel elements of %s and %lld output channels) takes %lld bytes, "
                         "more than the %lld bytes of work buffer ggml plans for the kernel (on one thread)",
                         (long long) knl_n, ggml_type_name(kt), (long long) c_out, (long long) space,
                         (long long) (PG_IM2COL_WORK_SIZE + PG_WORK_PAD));
    }
    return PYGGML_OK;
}

/* ggml_compute_forward_conv_2d_impl (CONV_2D, ggml_conv_2d_direct): the kernel src0 F32 or
 * F16 and contiguous (asserted; supports_op too); the data src1 is read as float through
 * all its strides and the result (of src1's type) written as float: both F32 */
static int rule_conv_2d(const struct ggml_tensor * t, pg_why * why) {
    PG_NEED_SRC(t, 0, why);
    PG_NEED_SRC(t, 1, why);
    const struct ggml_tensor * k = t->src[0], * b = t->src[1];
    PG_NEED_TYPE(k, "the kernel (src0)", k->type == GGML_TYPE_F32 || k->type == GGML_TYPE_F16, why);
    PG_NEED_TYPE(b, "the data (src1)", b->type == GGML_TYPE_F32, why);
    PG_NEED_TYPE(t, "the result", t->type == GGML_TYPE_F32, why);
    PG_NEED_CONTIGUOUS(k, "the kernel (src0)", why);
    return conv_patch_fits(k->ne[0] * k->ne[1] * b->ne[2], k->type, k->ne[3], why);
}

/* ggml_compute_forward_conv_3d_impl (CONV_3D, ggml_conv_3d_direct): as CONV_2D; the
 * channel counts c, n, oc of op_params[9..11] size its loops and patches (the builder
 * checks only the products c*oc and c*n: negative pairs pass it, then the kernel aborts) */
static int rule_conv_3d(const struct ggml_tensor * t, pg_why * why) {
    PG_NEED_SRC(t, 0, why);
    PG_NEED_SRC(t, 1, why);
    const struct ggml_tensor * k = t->src[0], * b = t->src[1];
    PG_NEED_TYPE(k, "the kernel (src0)", k->type == GGML_TYPE_F32 || k->type == GGML_TYPE_F16, why);
    PG_NEED_TYPE(b, "the data (src1)", b->type == GGML_TYPE_F32, why);
    PG_NEED_TYPE(t, "the result", t->type == GGML_TYPE_F32, why);
    PG_NEED_CONTIGUOUS(k, "the kernel (src0)", why);
    const int32_t c = t->op_params[9], n = t->op_params[10], oc = t->op_params[11];
    if (c < 0 || n < 0 || oc < 0) {
        return pg_refuse(why, "n_channels = %d, n_batch = %d and n_channels_out = %d must be >= 0", c, n, oc);
    }
    return conv_patch_fits(k->ne[0] * k->ne[1] * k->ne[2] * (int64_t) c, k->type, oc, why);
}

/* ggml_compute_forward_conv_2d_dw: kernel F32 or F16 (asserted); the data src1 is read and
 * the result (of src1's type) written as float: F32. Two layouts, chosen by src1:
 * - contiguous src1 (conv_2d_dw_whcn): kernel, data and result indexed as packed
 *   [KW, KH, 1, C], [W, H, C, N] and [OW, OH, C, N] (no assert: other strides misread);
 * - channels-first src1 (ggml_is_contiguous_channels, conv_2d_dw_cwhn): data, kernel and
 *   result indexed as packed permutations of [C, W, H, N], [C, KW, KH] and [C, OW, OH, N];
 *   ggml checks only the order of their strides.
 * Any other layout of src1 aborts. */
static int need_cwhn(const struct ggml_tensor * x, int64_t c, const char * name, pg_why * why) {
    const size_t ts = ggml_type_size(x->type);
    const int ok = (c <= 1 || x->nb[2] == ts) && (x->ne[0] <= 1 || x->nb[0] == ts * (size_t) c) &&
                   (x->ne[1] <= 1 || x->nb[1] == ts * (size_t) (c * x->ne[0])) &&
                   (x->ne[3] <= 1 || x->nb[3] == ts * (size_t) (c * x->ne[0] * x->ne[1]));
    if (!ok) {
        return pg_refuse(why, "%s must be a packed channels-first [C, W, H, N] permutation (nb = (%zu, %zu, %zu, "
                         "%zu) for C = %lld): the channels-first kernel indexes it so; got nb = (%zu, %zu, %zu, %zu)",
                         name, ts * (size_t) c, ts * (size_t) (c * x->ne[0]), ts,
                         ts * (size_t) (c * x->ne[0] * x->ne[1]), (long long) c, x->nb[0], x->nb[1], x->nb[2],
                         x->nb[3]);
    }
    return PYGGML_OK;
}

static int need_cwhn_kernel(const struct ggml_tensor * k, int64_t c, pg_why * why) {
    /* kernel [KW, KH, 1, C]: element (kx, ky, 0, ch) at ((ky*KW + kx)*C + ch); ggml asserts
     * nb[0] >= nb[2] && nb[1] >= nb[0] (the stride of the size-1 dim counts) */
    const size_t ts = ggml_type_size(k->type);
    if (!(k->nb[0] >= k->nb[2] && k->nb[1] >= k->nb[0])) {
        return pg_refuse(why, "with channels-first data the kernel (src0) needs nb[2] <= nb[0] <= nb[1] (the CPU "
                         "kernel asserts it); got nb = (%zu, %zu, %zu, %zu)", k->nb[0], k->nb[1], k->nb[2], k->nb[3]);
    }
    const int ok = (c <= 1 || k->nb[3] == ts) && (k->ne[0] <= 1 || k->nb[0] == ts * (size_t) c) &&
                   (k->ne[1] <= 1 || k->nb[1] == ts * (size_t) (c * k->ne[0]));
    if (!ok) {
        return pg_refuse(why, "with channels-first data the kernel (src0) must be a packed [C, KW, KH] "
                         "permutation (nb[0] = %zu, nb[1] = %zu, nb[3] = %zu); got nb = (%zu, %zu, %zu, %zu)",
                         ts * (size_t) c, ts * (size_t) (c * k->ne[0]), ts, k->nb[0], k->nb[1], k->nb[2], k->nb[3]);
    }
    return PYGGML_OK;
}

static int rule_conv_2d_dw(const struct ggml_tensor * t, pg_why * why) {
    PG_NEED_SRC(t, 0, why);
    PG_NEED_SRC(t, 1, why);
    const struct ggml_tensor * k = t->src[0], * b = t->src[1];
    PG_NEED_TYPE(k, "the kernel (src0)", k->type == GGML_TYPE_F32 || k->type == GGML_TYPE_F16, why);
    PG_NEED_TYPE(b, "the data (src1)", b->type == GGML_TYPE_F32, why);
    PG_NEED_TYPE(t, "the result", t->type == GGML_TYPE_F32, why);
    if (k->ne[3] != b->ne[2] || t->ne[3] != b->ne[3]) {
        return pg_refuse(why, "the kernel must have C = %lld channels in ne[3] and the result N = %lld in ne[3]",
                         (long long) b->ne[2], (long long) b->ne[3]);
    }
    if (ggml_is_contiguous(b)) {
        PG_NEED_CONTIGUOUS(k, "with contiguous data the kernel (src0)", why);
        PG_NEED_CONTIGUOUS(t, "with contiguous data the result", why);
        return PYGGML_OK;
    }
    if (!ggml_is_contiguous_channels(b)) {
        return pg_refuse(why, "the data (src1) must be contiguous or channels-first (nb[2] = element size < nb[0] "
                         "< nb[1]), got nb = (%zu, %zu, %zu, %zu)", b->nb[0], b->nb[1], b->nb[2], b->nb[3]);
    }
    const int64_t c = b->ne[2];
    int rc = need_cwhn(b, c, "the channels-first data (src1)", why);
    if (rc == PYGGML_OK) {
        rc = need_cwhn(t, c, "the result of channels-first data", why);
    }
    return rc == PYGGML_OK ? need_cwhn_kernel(k, c, why) : rc;
}

/* ggml_compute_forward_conv_transpose_1d_f16_f32 / _f32: kernel src0 F16 or F32, data src1
 * F32, result F32 (asserted; ggml_graph_plan aborts on other pairs); elements of both
 * contiguous (asserted). It adds input i10 at result columns i10*s0 + k: a negative s0
 * writes before the result (ggml_conv_transpose_1d checks p0 == 0, d0 == 1 only). */
static int rule_conv_transpose_1d(const struct ggml_tensor * t, pg_why * why) {
    PG_NEED_SRC(t, 0, why);
    PG_NEED_SRC(t, 1, why);
    const struct ggml_tensor * k = t->src[0], * b = t->src[1];
    PG_NEED_TYPE(k, "the kernel (src0)", k->type == GGML_TYPE_F32 || k->type == GGML_TYPE_F16, why);
    PG_NEED_TYPE(b, "the data (src1)", b->type == GGML_TYPE_F32, why);
    PG_NEED_TYPE(t, "the result", t->type == GGML_TYPE_F32, why);
    PG_NEED_ROWS(k, "the kernel (src0)", why);
    PG_NEED_ROWS(b, "the data (src1)", why);
    if (k->ne[3] != 1 || b->ne[2] != 1 || b->ne[3] != 1) {
        return pg_refuse(why, "the kernel must be 3-d and the data 2-d (ggml_graph_plan asserts it)");
    }
    if (t->op_params[0] < 0) {
        return pg_refuse(why, "s0 = %d must be >= 0: the kernel writes input i at result column i*s0 + k",
                         t->op_params[0]);
    }
    return PYGGML_OK;
}

/* ggml_compute_forward_conv_transpose_2d_impl: kernel src0 F16 or F32, data src1 F32,
 * result F32 (asserted); src0 elements contiguous (asserted) and each [KW, KH] plane read
 * packed (src[i01*ne00 + i00]: nb1 = ne0*size, not asserted); a negative stride writes
 * outside the result. The kernel computes batch 0 only: with b->ne[3] > 1 the other
 * batches of the result stay zero (upstream defect). */
static int rule_conv_transpose_2d(const struct ggml_tensor * t, pg_why * why) {
    PG_NEED_SRC(t, 0, why);
    PG_NEED_SRC(t, 1, why);
    const struct ggml_tensor * k = t->src[0], * b = t->src[1];
    PG_NEED_TYPE(k, "the kernel (src0)", k->type == GGML_TYPE_F32 || k->type == GGML_TYPE_F16, why);
    PG_NEED_TYPE(b, "the data (src1)", b->type == GGML_TYPE_F32, why);
    PG_NEED_TYPE(t, "the result", t->type == GGML_TYPE_F32, why);
    PG_NEED_ROWS(k, "the kernel (src0)", why);
    PG_NEED_ROWS(b, "the data (src1)", why);
    if (k->ne[1] > 1 && k->nb[1] != k->nb[0] * (size_t) k->ne[0]) {
        return pg_refuse(why, "the kernel (src0) must have packed rows (nb[1] = ne[0]*nb[0] = %zu): the CPU kernel "
                         "reads each [KW, KH] plane as one block; got nb[1] = %zu",
                         k->nb[0] * (size_t) k->ne[0], k->nb[1]);
    }
    if (t->op_params[0] < 0) {
        return pg_refuse(why, "stride = %d must be >= 0: the kernel writes input (i10, i11) at result "
                         "(i10*stride + kx, i11*stride + ky)", t->op_params[0]);
    }
    if (b->ne[3] > 1) {
        why->defect = "conv-transpose-2d-batch";
        return pg_refuse(why, "a batch of %lld (b->ne[3] > 1): the CPU kernel computes batch 0 only and leaves "
                         "the others zero", (long long) b->ne[3]);
    }
    return PYGGML_OK;
}

/* pooling: F32 or F16 data (the kernels assert it only in debug builds: other types are
 * read as F16); a kernel size k <= 0 has no window (max pooling gives -FLT_MAX, 2-d
 * average pooling 0/0) */
static int pool_common(const struct ggml_tensor * t, int nk, pg_why * why) {
    PG_NEED_SRC(t, 0, why);
    const struct ggml_tensor * a = t->src[0];
    PG_NEED_TYPE(a, "src0", a->type == GGML_TYPE_F32 || a->type == GGML_TYPE_F16, why);
    PG_NEED_ROWS(a, "src0", why);
    for (int i = 0; i < nk; i++) {
        if (t->op_params[1 + i] <= 0) {
            return pg_refuse(why, "the kernel size k%d = %d must be > 0", i, t->op_params[1 + i]);
        }
    }
    return PYGGML_OK;
}

/* ggml_compute_forward_pool_1d_ksp: row ir of ggml_nrows(src0) at ir*nb1 (rows evenly
 * spaced over dims 1..3) */
static int rule_pool_1d(const struct ggml_tensor * t, pg_why * why) {
    int rc = pool_common(t, 1, why);
    if (rc != PYGGML_OK) {
        return rc;
    }
    const struct ggml_tensor * a = t->src[0];
    if (!packed_rows_after_1(a)) {
        return pg_refuse(why, "src0 must have evenly spaced rows (nb[2] = nb[1]*ne[1], nb[3] = nb[2]*ne[2]): the "
                         "kernel walks its rows with nb[1] only; got nb = (%zu, %zu, %zu, %zu)",
                         a->nb[0], a->nb[1], a->nb[2], a->nb[3]);
    }
    return PYGGML_OK;
}

/* ggml_compute_forward_pool_2d: walks the [ne0, ne1] planes of src0 by nb2 until
 * ggml_nbytes(src0) is used up, and the result's planes one after the other: src0's
 * planes must be evenly spaced (nb3 = nb2*ne2) and each must fit its stride, else the
 * kernel takes a wrong number of planes (writing past the result if more) */
static int rule_pool_2d(const struct ggml_tensor * t, pg_why * why) {
    int rc = pool_common(t, 2, why);
    if (rc != PYGGML_OK) {
        return rc;
    }
    const struct ggml_tensor * a = t->src[0];
    if (ggml_nelements(a) == 0) {
        return PYGGML_OK;
    }
    const int64_t planes = a->ne[2] * a->ne[3];
    const size_t nbytes = ggml_nbytes(a);
    const size_t nb2 = a->nb[2];
    const int ok = nb2 > 0 && (int64_t) ((nbytes + nb2 - 1) / nb2) == planes &&
                   (a->ne[3] <= 1 || a->nb[3] == nb2 * (size_t) a->ne[2]);
    if (!ok) {
        return pg_refuse(why, "src0's %lld planes must be evenly spaced by nb[2] and each fit in it (the kernel "
                         "takes ceil(nbytes/nb[2]) planes of it): got ne = (%lld, %lld, %lld, %lld), "
                         "nb = (%zu, %zu, %zu, %zu)", (long long) planes, (long long) a->ne[0],
                         (long long) a->ne[1], (long long) a->ne[2], (long long) a->ne[3],
                         a->nb[0], a->nb[1], a->nb[2], a->nb[3]);
    }
    /* ggml_pool_2d takes float paddings: it sizes the result with them
     * (ggml_calc_pool_output_size, in float) but stores them as int32 op_params, which the
     * kernel uses. A fractional padding shows as a size the stored one does not give. */
    for (int d = 0; d < 2; d++) {
        const int32_t k = t->op_params[1 + d], s = t->op_params[3 + d], p = t->op_params[5 + d];
        if (s == 0) {
            continue;
        }
        const int64_t n = (int64_t) ((a->ne[d] + 2 * (float) p - k) / s + 1);
        if (n != t->ne[d]) {
            why->defect = "pool-2d-fractional-padding";
            return pg_refuse(why, "the result has %lld outputs along dim %d, the kernel's whole padding p%d = %d "
                             "gives %lld: ggml_pool_2d sized it with a fractional padding, which the kernel "
                             "truncates (padding the start by %d, the end by the rest)", (long long) t->ne[d],
                             d, d, p, (long long) n, p);
        }
    }
    return PYGGML_OK;
}

/* ggml_compute_forward_upscale_f32, nearest source index along one axis: (int64)(i / sf)
 * in float32, sf = (float) n / n_src (align corners: (float) (n-1) / (n_src-1)). Returns the
 * first result index where that differs from floor(i * n_src / n) (floor(i * (n_src-1) /
 * (n-1))), or -1. */
static int64_t nearest_rounds_wrong(int64_t n, int64_t n_src, int align, int64_t * got, int64_t * want) {
    float sf = (float) n / n_src;
    int64_t num = n_src, den = n;
    if (align && n > 1 && n_src > 1) {
        sf = (float) (n - 1) / (n_src - 1);
        num = n_src - 1;
        den = n - 1;
    }
    for (int64_t i = 0; i < n; i++) {
        if (num > 0 && i > INT64_MAX / num) {
            break;
        }
        *got = (int64_t) (i / sf);
        *want = i * num / den;
        if (*got != *want) {
            return i;
        }
    }
    return -1;
}

/* ggml_compute_forward_upscale_f32, bilinear with ANTIALIAS and ALIGN_CORNERS (pixel offset
 * 0) along one axis: the taps of result i are [x - support, x + support) cut at
 * (int64) (x + support), which leaves out the tap floor(x + support) although its
 * triangle weight is positive. Returns the first such result index, or -1. */
static int64_t antialias_drops_tap(int64_t n, int64_t n_src) {
    float sf = (float) n / n_src;
    if (n > 1 && n_src > 1) {
        sf = (float) (n - 1) / (n_src - 1);
    }
    const float support = 1.0f / sf > 1.0f ? 1.0f / sf : 1.0f;
    const float invscale = 1.0f / support;
    for (int64_t i = 0; i < n; i++) {
        const float x = (float) i / sf;
        const int64_t hi = (int64_t) (x + support);
        if (hi < 0 || hi >= n_src) {
            continue;
        }
        float d = ((float) hi - x) * invscale;
        d = d < 0 ? -d : d;
        if (1.0f - d > 0.0f) {
            return i;
        }
    }
    return -1;
}

/* ggml_compute_forward_upscale_f32: F32 (the builder asserts it); read and written through
 * all strides. Each result coordinate maps to a source index clamped (bilinear, bicubic)
 * or scaled by ne_src/ne_dst (nearest, and dims 2, 3 in every mode): a source with an
 * empty dim has no element to read for a non-empty result. Two upstream defects: the
 * nearest index rounds in float32 (14 -> 2 picks pixel 6, not 7), and antialiased bilinear
 * with aligned corners drops a tap of each window. */
static int rule_upscale(const struct ggml_tensor * t, pg_why * why) {
    PG_NEED_SRC(t, 0, why);
    const struct ggml_tensor * a = t->src[0];
    PG_NEED_TYPE(a, "src0", a->type == GGML_TYPE_F32, why);
    PG_NEED_TYPE(t, "the result", t->type == GGML_TYPE_F32, why);
    if (ggml_nelements(t) == 0) {
        return PYGGML_OK;
    }
    if (ggml_nelements(a) == 0) {
        return pg_refuse(why, "src0 is empty (ne = (%lld, %lld, %lld, %lld)) but the result is not: the kernel "
                         "would read its element 0", (long long) a->ne[0], (long long) a->ne[1],
                         (long long) a->ne[2], (long long) a->ne[3]);
    }
    const int32_t mode = t->op_params[0];
    const int align = (mode & PG_SCALE_FLAG_ALIGN_CORNERS) != 0;
    for (int d = 0; d < 4; d++) {
        int64_t got = 0, want = 0;
        const int nearest = d >= 2 || (mode & 0xFF) == PG_SCALE_MODE_NEAREST;
        const int64_t i = nearest ? nearest_rounds_wrong(t->ne[d], a->ne[d], d < 2 && align, &got, &want) : -1;
        if (i >= 0) {
            why->defect = "upscale-nearest-index-rounding";
            return pg_refuse(why, "dim %d resized %lld -> %lld: the kernel maps result index %lld to source index "
                             "%lld (i / (n/n_src) rounded in float32), not %lld", d, (long long) a->ne[d],
                             (long long) t->ne[d], (long long) i, (long long) got, (long long) want);
        }
    }
    if ((mode & 0xFF) == PG_SCALE_MODE_BILINEAR && (mode & PG_SCALE_FLAG_ANTIALIAS) && align) {
        for (int d = 0; d < 2; d++) {
            const int64_t i = antialias_drops_tap(t->ne[d], a->ne[d]);
            if (i >= 0) {
                why->defect = "upscale-antialias-align-corners";
                return pg_refuse(why, "antialiased bilinear with aligned corners, dim %d resized %lld -> %lld: the "
                                 "kernel cuts the window of result index %lld at (int) (x + support) and leaves "
                                 "out a tap of positive weight", d, (long long) a->ne[d], (long long) t->ne[d],
                                 (long long) i);
            }
        }
    }
    return PYGGML_OK;
}

/* ggml_compute_forward_timestep_embedding_f32: F32 timesteps with contiguous elements
 * (asserted); freq_j = exp(-log(max_period) * j / half): max_period <= 0 gives NaN */
static int rule_timestep_embedding(const struct ggml_tensor * t, pg_why * why) {
    PG_NEED_SRC(t, 0, why);
    const struct ggml_tensor * a = t->src[0];
    PG_NEED_TYPE(a, "the timesteps (src0)", a->type == GGML_TYPE_F32, why);
    PG_NEED_ROWS(a, "the timesteps (src0)", why);
    if (t->op_params[1] <= 0) {
        return pg_refuse(why, "max_period = %d must be > 0 (the kernel takes its logarithm)", t->op_params[1]);
    }
    return PYGGML_OK;
}

const pg_named_rule pg_rules_conv[] = {
    {"IM2COL", rule_im2col},
    {"IM2COL_3D", rule_im2col_3d},
    {"COL2IM_1D", rule_col2im_1d},
    {"CONV_2D", rule_conv_2d},
    {"CONV_3D", rule_conv_3d},
    {"CONV_2D_DW", rule_conv_2d_dw},
    {"CONV_TRANSPOSE_1D", rule_conv_transpose_1d},
    {"CONV_TRANSPOSE_2D", rule_conv_transpose_2d},
    {"POOL_1D", rule_pool_1d},
    {"POOL_2D", rule_pool_2d},
    {"UPSCALE", rule_upscale},
    {"TIMESTEP_EMBEDDING", rule_timestep_embedding},
    {NULL, NULL},
};
