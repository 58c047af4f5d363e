/* Kernel rules for the [conv] family: IM2COL, IM2COL_3D, COL2IM_1D, CONV_2D, CONV_3D,
 * CONV_2D_DW, CONV_TRANSPOSE_1D, CONV_TRANSPOSE_2D, POOL_1D, POOL_2D, UPSCALE,
 * TIMESTEP_EMBEDDING. The composite builders (conv_1d, conv_2d, conv_2d_dw, conv_3d, ...)
 * add MUL_MAT, RESHAPE, PERMUTE and CONT nodes: the rules of
 * their own families (rules_matmul.c, rules_layout.c) check those.
 *
 * Each rule cites the ggml-cpu/ops.cpp function it mirrors. Strides, paddings and
 * dilations of any sign are safe where a kernel bounds-checks every input coordinate
 * (im2col, conv_2d, conv_3d, conv_2d_dw, pool): the result is the op's formula with
 * zeros (pool: nothing) outside the input, and those are not refused. A stride of 0
 * never reaches a rule there: the builders divide by it (SIGFPE, GGMLAbort). */
#include "rules.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>

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
 * batches of the result stay zero (upstream defect). 0.25.3's kernel loops over the
 * batches (b's nb[3] and the result's nb[3], its work buffer sized for all of them): the
 * defect is gone there, the rest is unchanged. */
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
    if (b->ne[3] > 1 && !pg_kernel_since((int) t->op, PG_RELEASE(0, 25, 3))) {
        why->defect = PG_DEFECT_CONV_TRANSPOSE_2D_BATCH;
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
            why->defect = PG_DEFECT_POOL_2D_FRACTIONAL_PADDING;
            return pg_refuse(why, "the result has %lld outputs along dim %d, the kernel's whole padding p%d = %d "
                             "gives %lld: ggml_pool_2d sized it with a fractional padding, which the kernel "
                             "truncates (padding the start by %d, the end by the rest)", (long long) t->ne[d],
                             d, d, p, (long long) n, p);
        }
    }
    return PYGGML_OK;
}

/* --- UPSCALE: the kernel's float32 source indices, checked in bounded time ------------------
 *
 * ggml_compute_forward_upscale_f32 maps result index i of an axis to source index
 * (int64) (i / sf), in float32, with sf = (float) n / n_src (align corners, dims 0 and 1
 * only, both > 1: (float) (n-1) / (n_src-1)). The exact index is floor(i * num / den),
 * num/den = n_src/n (align: (n_src-1)/(n-1)). Both are nondecreasing in i. The rule finds
 * the first i < n where they differ without looping over the n result indices (the loop it
 * replaces took 1.8 s for a resize to 2**30 rows, with the GIL held, and years for 2**60):
 *
 *  - n, n_src <= 2**23 (every i, n, n_src exact in float32; i/sf < 2**23): the kernel's
 *    index is floor(v + h/2), v = i/sf exactly, h the float32 spacing at v (rounding to
 *    nearest, ties included, never moves floor() past an integer other than by reaching
 *    it, because h <= 1/2 divides 1). So on each binade of v, kernel and exact index are
 *    both floor((a*i + b)/m) for integers a, b, m, and their difference is 0 or 1 (0 or
 *    -1) on either side of the one point where v + h/2 - i*num/den changes sign: the
 *    number of wrong indices in any range is a difference of two floor sums (Euclid's
 *    algorithm, O(log) steps), and the first one a binary search over such counts.
 *  - larger axes: every index where n <= 2**16; else every run of equal exact index (its
 *    first and last result index; the kernel's index is nondecreasing) where there are at
 *    most 2**16 runs; an exact power-of-two ratio (n == n_src too) in closed form (i / sf
 *    is exact: the index is wrong only where float32 rounds i, from 2**24 + 1 on); else
 *    the first and last 2**16 indices, and a resize none of these settles is refused as
 *    unverified.
 * tests/test_rules_conv.py checks the first index against a brute-force float32 count. */

#define PG_UPSCALE_CAP ((int64_t) 1 << 16)
#define PG_F32_EXACT ((int64_t) 1 << 23)

typedef struct {
    int64_t n, n_src;      /* result and source extent of the axis */
    uint64_t num, den;     /* exact index floor(i * num / den) */
    float sf;              /* the kernel's scale */
} pg_axis;

static pg_axis axis_of(int64_t n, int64_t n_src, int align) {
    pg_axis ax = {n, n_src, (uint64_t) n_src, (uint64_t) n, (float) n / n_src};
    if (align && n > 1 && n_src > 1) {
        ax.sf = (float) (n - 1) / (n_src - 1);
        ax.num = (uint64_t) (n_src - 1);
        ax.den = (uint64_t) (n - 1);
    }
    return ax;
}

static int64_t kernel_index(const pg_axis * ax, int64_t i) {
    return (int64_t) (i / ax->sf);       /* the kernel's expression, in float32 */
}

#if !defined(__SIZEOF_INT128__)
#error "the UPSCALE rule needs unsigned __int128 (a 64-bit GCC or Clang)"
#endif
typedef unsigned __int128 pg_u128;

static int64_t exact_index(const pg_axis * ax, int64_t i) {
    return (int64_t) ((pg_u128) (uint64_t) i * ax->num / ax->den);
}

/* sum over j in [0, cnt) of floor((a*j + b) / m), modulo 2**128 (the caller's sums are
 * small; a, b, m and every a*cnt + b stay below 2**120 for the inputs below) */
static pg_u128 floor_sum(pg_u128 cnt, pg_u128 m, pg_u128 a, pg_u128 b) {
    pg_u128 ans = 0;
    while (cnt > 0) {
        if (a >= m) {
            const pg_u128 tri = (cnt % 2 == 0) ? (cnt / 2) * (cnt - 1) : cnt * ((cnt - 1) / 2);
            ans += tri * (a / m);
            a %= m;
        }
        if (b >= m) {
            ans += cnt * (b / m);
            b %= m;
        }
        const pg_u128 y = a * cnt + b;
        if (y < m) {
            break;
        }
        cnt = y / m;
        b = y % m;
        const pg_u128 t = m;
        m = a;
        a = t;
    }
    return ans;
}

/* one piece of the n, n_src <= 2**23 analysis: on [lo, hi) the kernel's index is
 * floor((qa*i + qb)/qm) and differs from floor(i*num/den) by sign (+1 or -1) or 0 */
typedef struct {
    pg_u128 qa, qb, qm;
    int sign;
} pg_piece;

static int64_t wrong_in(const pg_axis * ax, const pg_piece * p, int64_t lo, int64_t hi) {
    if (hi <= lo) {
        return 0;
    }
    const pg_u128 cnt = (pg_u128) (hi - lo);
    const pg_u128 q = floor_sum(cnt, p->qm, p->qa, p->qa * (pg_u128) lo + p->qb);
    const pg_u128 e = floor_sum(cnt, ax->den, ax->num, (pg_u128) ax->num * (pg_u128) lo);
    return (int64_t) (p->sign > 0 ? q - e : e - q);
}

/* the first i in [lo, hi) where the kernel's index is wrong, or -1 */
static int64_t first_wrong_in(const pg_axis * ax, const pg_piece * p, int64_t lo, int64_t hi) {
    if (wrong_in(ax, p, lo, hi) <= 0) {
        return -1;
    }
    while (hi - lo > 1) {          /* invariant: [lo, hi) holds a wrong index */
        const int64_t mid = lo + (hi - lo) / 2;
        if (wrong_in(ax, p, lo, mid) > 0) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    return lo;
}

/* ceil(s * 2**k) for s >= 1, capped at 2**62 */
static int64_t ceil_pow2(uint64_t s, int k) {
    if (k >= 0) {
        return k > 62 || s > ((uint64_t) 1 << (62 - k)) ? (int64_t) 1 << 62 : (int64_t) (s << k);
    }
    if (-k >= 64) {
        return 1;
    }
    return (int64_t) ((s >> -k) + ((s & (((uint64_t) 1 << -k) - 1)) != 0));
}

static int64_t first_wrong_small(const pg_axis * ax) {
    /* sf = S * 2**e, S odd */
    int e2 = 0;
    const float m = frexpf(ax->sf, &e2);              /* sf = m * 2**e2, m in [0.5, 1) */
    uint64_t S = (uint64_t) ldexpf(m, 24);
    int e = e2 - 24;
    while ((S & 1) == 0) {
        S >>= 1;
        e++;
    }
    /* 1/sf = cn/cd; r - 1/sf = D / (den*cd), r = num/den */
    const pg_u128 cn = (pg_u128) 1 << (e < 0 ? -e : 0);
    const pg_u128 cd = (pg_u128) S << (e > 0 ? e : 0);
    const pg_u128 lhs = (pg_u128) ax->num * cd, rhs = (pg_u128) ax->den * cn;
    for (int b = -64; b < 24; b++) {                  /* v = i/sf in [2**b, 2**(b+1)) */
        int64_t lo = ceil_pow2(S, e + b), hi = ceil_pow2(S, e + b + 1);
        lo = lo < 1 ? 1 : lo;
        hi = hi > ax->n ? ax->n : hi;
        if (lo >= hi) {
            continue;
        }
        /* kernel index floor(i/sf + 2**(b-24)) = floor((i*2**(P-e) + S*2**(P+b-24)) / (S*2**P)) */
        int P = 24 - b;
        P = P < e ? e : P;
        P = P < 0 ? 0 : P;
        pg_piece p = {(pg_u128) 1 << (P - e), (pg_u128) S << (P + b - 24), (pg_u128) S << P, 1};
        /* i <= split: v + h/2 >= i*num/den (kernel index >= exact); past it, <= */
        int64_t split = INT64_MAX - 1;
        if (lhs > rhs) {
            const pg_u128 q = (pg_u128) ax->den * cd / ((lhs - rhs) << (24 - b));
            split = q > (pg_u128) INT64_MAX - 1 ? INT64_MAX - 1 : (int64_t) q;
        }
        const int64_t mid = split + 1 < lo ? lo : (split + 1 > hi ? hi : split + 1);
        int64_t i = first_wrong_in(ax, &p, lo, mid);
        if (i >= 0) {
            return i;
        }
        p.sign = -1;
        i = first_wrong_in(ax, &p, mid, hi);
        if (i >= 0) {
            return i;
        }
    }
    return -1;
}

/* the first i in [lo, hi) (hi - lo <= a cap) where the kernel's index is wrong, or -1;
 * the exact index stepped with 64-bit remainders */
static int64_t first_wrong_scan(const pg_axis * ax, int64_t lo, int64_t hi) {
    if (lo >= hi) {
        return -1;
    }
    const uint64_t qn = ax->num / ax->den, rn = ax->num % ax->den;
    const pg_u128 x = (pg_u128) (uint64_t) lo * ax->num;
    uint64_t want = (uint64_t) (x / ax->den), rem = (uint64_t) (x % ax->den);
    for (int64_t i = lo; i < hi; i++) {
        if (kernel_index(ax, i) != (int64_t) want) {
            return i;
        }
        want += qn;
        if (rem >= ax->den - rn) {
            want += 1;
            rem -= ax->den - rn;
        } else {
            rem += rn;
        }
    }
    return -1;
}

/* the first wrong index, over the runs of equal exact index k = 0 .. K (K + 1 runs):
 * run k is [ceil(k*den/num), ceil((k+1)*den/num)) */
static int64_t first_wrong_runs(const pg_axis * ax, uint64_t K) {
    /* ceil(k*den/num) = floor((k*den + num - 1) / num), stepped */
    const uint64_t qd = ax->den / ax->num, rd = ax->den % ax->num;
    uint64_t start = (ax->num - 1) / ax->num, rem = (ax->num - 1) % ax->num;    /* k = 0 */
    for (uint64_t k = 0; k <= K; k++) {
        uint64_t next = start + qd, nrem = rem;
        if (nrem >= ax->num - rd) {
            next += 1;
            nrem -= ax->num - rd;
        } else {
            nrem += rd;
        }
        const int64_t lo = (int64_t) start;
        const int64_t last = (int64_t) (next < (uint64_t) ax->n ? next : (uint64_t) ax->n) - 1;
        if (lo <= last) {
            if (kernel_index(ax, lo) != (int64_t) k) {
                return lo;
            }
            if (kernel_index(ax, last) != (int64_t) k) {
                int64_t a = lo, b = last;       /* kernel(a) == k < kernel(b): find the first > k */
                while (b - a > 1) {
                    const int64_t mid = a + (b - a) / 2;
                    if (kernel_index(ax, mid) != (int64_t) k) {
                        b = mid;
                    } else {
                        a = mid;
                    }
                }
                return b;
            }
        }
        start = next;
        rem = nrem;
    }
    return -1;
}

/* The first result index the kernel maps to a wrong source index, -1 if none; -2 if
 * pyggml cannot tell in bounded time (none of the indices it looked at is wrong). */
static int64_t nearest_first_wrong(const pg_axis * ax) {
    if (ax->n <= 1) {
        return -1;                    /* index 0 maps to 0 */
    }
    if (ax->n <= PG_F32_EXACT && ax->n_src <= PG_F32_EXACT) {
        return first_wrong_small(ax);
    }
    const uint64_t K = (uint64_t) exact_index(ax, ax->n - 1);
    int t = 0;
    if (frexpf(ax->sf, &t) == 0.5f) {     /* sf = 2**(t-1) */
        t -= 1;
        const int exact = t >= 0 ? t < 64 && (pg_u128) ax->num << t == ax->den
                                 : -t < 64 && (pg_u128) ax->den << -t == ax->num;
        const int64_t first = ((int64_t) 1 << 24) + 1;      /* the first integer float32 rounds */
        /* an exact power-of-two ratio: i / sf is exact, and so is the index while i is */
        if (exact && ax->n <= first) {
            return -1;
        }
        /* sf = 2**t <= 1: the index i * 2**-t is whole, wrong exactly where float32 rounds i */
        if (exact && t <= 0) {
            return kernel_index(ax, first) != exact_index(ax, first) ? first : -1;
        }
    }
    if (ax->n <= PG_UPSCALE_CAP) {
        return first_wrong_scan(ax, 0, ax->n);
    }
    if (K < (uint64_t) PG_UPSCALE_CAP) {
        return first_wrong_runs(ax, K);
    }
    int64_t i = first_wrong_scan(ax, 0, PG_UPSCALE_CAP);
    if (i < 0) {
        i = first_wrong_scan(ax, ax->n - PG_UPSCALE_CAP, ax->n);
    }
    return i >= 0 ? i : -2;
}

/* ggml_compute_forward_upscale_f32, bilinear with ANTIALIAS and ALIGN_CORNERS (pixel offset
 * 0) along one axis: the taps of result i are [x - support, x + support) cut at
 * (int64) (x + support), which leaves out the tap floor(x + support) although its
 * triangle weight is positive. */
static int antialias_drops_tap_at(int64_t i, float sf, float support, float invscale, int64_t n_src) {
    const float x = (float) i / sf;
    const int64_t hi = (int64_t) (x + support);
    if (hi < 0 || hi >= n_src) {
        return 0;
    }
    float d = ((float) hi - x) * invscale;
    d = d < 0 ? -d : d;
    return 1.0f - d > 0.0f;
}

/* The first result index whose window drops a tap, -1 if none, -2 if pyggml cannot tell
 * in bounded time. Every index up to 2 * 2**16 results; beyond, the first and last 2**16
 * (most resizes drop a tap at index 0 or 1: an upscale from n_src >= 2 at 1, a downscale
 * by a ratio that is not whole at 0), and in closed form n == n_src <= 2**24 (sf = support
 * = invscale = 1, x = i exactly: hi - x = 1, a weight of 0) and n_src == 1 (no tap below
 * x + support >= 1); sizes none of these settles are unverified. */
static int64_t antialias_first_drop(int64_t n, int64_t n_src) {
    if (n_src <= 1) {
        return -1;     /* x + support >= 1 = n_src: every window stops short of the source's end */
    }
    float sf = (float) n / n_src;
    if (n > 1 && n_src > 1) {
        sf = (float) (n - 1) / (n_src - 1);
    }
    const float support = 1.0f / sf > 1.0f ? 1.0f / sf : 1.0f;
    const float invscale = 1.0f / support;
    const int64_t head = n <= 2 * PG_UPSCALE_CAP ? n : PG_UPSCALE_CAP;
    for (int64_t i = 0; i < head; i++) {
        if (antialias_drops_tap_at(i, sf, support, invscale, n_src)) {
            return i;
        }
    }
    if (head == n) {
        return -1;
    }
    for (int64_t i = n - PG_UPSCALE_CAP; i < n; i++) {
        if (antialias_drops_tap_at(i, sf, support, invscale, n_src)) {
            return i;
        }
    }
    return n == n_src && n <= ((int64_t) 1 << 24) ? -1 : -2;
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
        const int nearest = d >= 2 || (mode & 0xFF) == PG_SCALE_MODE_NEAREST;
        if (!nearest) {
            continue;
        }
        const pg_axis ax = axis_of(t->ne[d], a->ne[d], d < 2 && align);
        const int64_t i = nearest_first_wrong(&ax);
        if (i == -2) {
            why->defect = PG_DEFECT_UPSCALE_NEAREST_INDEX_ROUNDING;
            return pg_refuse(why, "dim %d resized %lld -> %lld: pyggml cannot check in bounded time that the kernel's "
                             "float32 source index (i / (n/n_src)) is right for every result index of so large an "
                             "axis (none of those it checked is wrong)", d, (long long) a->ne[d], (long long) t->ne[d]);
        }
        if (i >= 0) {
            const int64_t got = kernel_index(&ax, i);
            why->defect = PG_DEFECT_UPSCALE_NEAREST_INDEX_ROUNDING;
            if (got >= a->ne[d]) {
                return pg_refuse(why, "dim %d resized %lld -> %lld: the kernel maps result index %lld to source index "
                                 "%lld (i / (n/n_src) rounded in float32), past the source's last, %lld", d,
                                 (long long) a->ne[d], (long long) t->ne[d], (long long) i, (long long) got,
                                 (long long) (a->ne[d] - 1));
            }
            const int64_t want = exact_index(&ax, i);
            return pg_refuse(why, "dim %d resized %lld -> %lld: the kernel maps result index %lld to source index "
                             "%lld (i / (n/n_src) rounded in float32), not %lld", d, (long long) a->ne[d],
                             (long long) t->ne[d], (long long) i, (long long) got, (long long) want);
        }
    }
    if ((mode & 0xFF) == PG_SCALE_MODE_BILINEAR && (mode & PG_SCALE_FLAG_ANTIALIAS) && align) {
        for (int d = 0; d < 2; d++) {
            const int64_t i = antialias_first_drop(t->ne[d], a->ne[d]);
            if (i == -2) {
                why->defect = PG_DEFECT_UPSCALE_ANTIALIAS_ALIGN_CORNERS;
                return pg_refuse(why, "antialiased bilinear with aligned corners, dim %d resized %lld -> %lld: pyggml "
                                 "cannot check in bounded time that no window of so large an axis drops a tap (none "
                                 "of those it checked does)", d, (long long) a->ne[d], (long long) t->ne[d]);
            }
            if (i >= 0) {
                why->defect = PG_DEFECT_UPSCALE_ANTIALIAS_ALIGN_CORNERS;
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
