/* Kernel rules for the [attention] family: rope (every mode), flash_attn_ext, get_rel_pos,
 * add_rel_pos, soft_max, diag_mask.
 * Each rule cites the ggml-cpu function whose assertions, type switch and silent
 * assumptions it mirrors. */
#include "rules.h"

#include <stdint.h>
#include <string.h>

/* ggml.h's rope modes (values stable since they were introduced) */
enum {
    PG_ROPE_NORMAL = 0,
    PG_ROPE_NEOX = 2,
    PG_ROPE_MROPE = 8,
    PG_ROPE_VISION = 24,
    PG_ROPE_IMROPE = 40,
};

/* ggml_mrope_cache_init with indep_sects (VISION): each section is to count its pairs from 0
 * ("reset corresponding theta when i0 goes from one section to another"), but the resets
 * are an else-if chain on sector == start of t, h, w, e: when a section is empty, the next
 * one starts where it does, the earlier branch wins and the next section's angle is not
 * restarted. 1 when every pair gets its section-local exponent.
 *
 * In closed form (the chain replayed pair by pair took seconds for 2**30 pairs): pair i has
 * sector i % sect_dims; a non-empty section k >= 1 after an empty one is never reset, so
 * its exponent is i itself, which is right (sector - start[k]) only while i = sector and
 * start[k] = 0: the first wrong pair is start[k] (start[k] > 0) or sect_dims (the second
 * round of sectors). Every other section is reset at its start in every round. */
static int vision_sections_restart(const int32_t s[4], int32_t n_pairs) {
    const int64_t start[4] = {0, s[0], (int64_t) s[0] + s[1], (int64_t) s[0] + s[1] + s[2]};
    const int64_t sect_dims = start[3] + s[3];
    for (int k = 1; k < 4; k++) {
        if (s[k] > 0 && s[k - 1] == 0) {
            const int64_t first_wrong = start[k] > 0 ? start[k] : sect_dims;
            if (first_wrong < n_pairs) {
                return 0;
            }
        }
    }
    return 1;
}

/* ops.cpp ggml_compute_forward_rope -> ggml_compute_forward_rope_flt<T> (T = float or
 * ggml_fp16_t):
 *  - src0 F32 or F16 (GGML_ABORT otherwise); src1 (I32, a vector: the builder's) read as a
 *    contiguous int32 array (pos[i2], and pos[i2 + k*ne2] for the multi modes);
 *  - GGML_ASSERT(nb0 == nb00 == sizeof(T)): rows contiguous (dims 1..3 may be strided);
 *  - GGML_ASSERT(n_dims <= ne0), GGML_ASSERT(n_dims % 2 == 0); a negative n_dims passes
 *    both and the tail copy (i0 from n_dims) then reads and writes before each row;
 *  - the mode switch takes NORMAL, NEOX, MROPE, IMROPE, VISION, GGML_ABORT otherwise;
 *    mode & MROPE: GGML_ASSERT(sections[0] > 0 || sections[1] > 0 || sections[2] > 0) and
 *    (ggml_mrope_cache_init) GGML_ASSERT(sum of sections <= ne0); the sector is i % sum;
 *    VISION: GGML_ASSERT(n_dims == ne0/2), and each section restarts its angles, except one
 *    that follows an empty section (vision_sections_restart);
 *  - (0.25.3: the rotated block starts at op_params[15], asserted as the rule checks it;
 *    the tail copy skips that block instead of starting after it: the same elements);
 *  - freq factors src2 (F32, builder: ne0 >= n_dims/2) read as a contiguous float array,
 *    at [i0/2] for every even i0 < ne0 (ggml_rope_cache_init, ggml_mrope_cache_init);
 *  - the tail copy (non-VISION) moves elements i0, i0+1 for i0 = n_dims, n_dims+2, ... < ne0:
 *    with an odd ne0 it runs one element past every row; VISION with an odd ne0 rotates
 *    the pairs (ic, ic+n_dims) for ic <= n_dims, and the last pair reuses element n_dims;
 *  - work buffer: (ne0 + CACHE_LINE_SIZE_F32) floats per thread, what ggml_graph_plan gives
 *    (ne0 floats per task plus a cache line per thread).
 * ROPE_BACK runs the same kernel (forward = false): this rule holds for it as it is, hence
 * not static (a declaration in preconditions.h would let the [backward] family use it). */

int pg_rule_rope(const struct ggml_tensor * t, pg_why * why) {
    const struct ggml_tensor * a = t->src[0];
    const struct ggml_tensor * b = t->src[1];
    const struct ggml_tensor * c = t->src[2];
    PG_NEED_SRC(t, 0, why);
    PG_NEED_SRC(t, 1, why);
    PG_NEED_TYPE(a, "src0", a->type == GGML_TYPE_F32 || a->type == GGML_TYPE_F16, why);
    PG_NEED_ROWS(a, "src0", why);      /* the result (a's copy or view) has a's row stride */
    PG_NEED_ROWS(b, "the positions (src1)", why);

    const int32_t n_dims = t->op_params[1];
    const int32_t mode = t->op_params[2];
    int32_t sections[4];
    memcpy(sections, t->op_params + 11, sizeof sections);
    const int64_t ne0 = a->ne[0];

    if (mode != PG_ROPE_NORMAL && mode != PG_ROPE_NEOX && mode != PG_ROPE_MROPE && mode != PG_ROPE_VISION &&
        mode != PG_ROPE_IMROPE) {
        return pg_refuse(why, "mode %d is not one the CPU kernel takes (NORMAL 0, NEOX 2, MROPE 8, VISION 24, "
                         "IMROPE 40)", mode);
    }
#ifndef GGML_ROPE_TYPE_IMROPE
    /* a ggml from before IMROPE (0.9.4): its kernel tests mode & MROPE, so it takes 40
     * (binary 101000) for MROPE and rotates by other sections, silently */
    if (mode == PG_ROPE_IMROPE) {
        return pg_lacks(why, "mode 40 (IMROPE) is not in this ggml (its ggml.h has no GGML_ROPE_TYPE_IMROPE): its "
                        "rope kernel would take it for MROPE (40 & 8) and rotate by other angles");
    }
#endif
    if (n_dims < 0 || n_dims % 2 != 0 || n_dims > ne0) {
        return pg_refuse(why, "n_dims must be even and in [0, ne0 = %lld], got %d", (long long) ne0, n_dims);
    }
    /* op_params[15]: where the rotated block starts (ggml_rope_set_offset, new after 0.20.2;
     * 0 from every builder, and in a release that lacks it). A kernel that reads it
     * GGML_ASSERTs n_offs >= 0, even, n_offs + n_dims <= ne0, and 0 for VISION. */
    const int32_t n_offs = t->op_params[15];
    if (n_offs != 0 && (n_offs < 0 || n_offs % 2 != 0 || (int64_t) n_offs + n_dims > ne0 || mode == PG_ROPE_VISION)) {
        return pg_refuse(why, "the rotated block's offset (op_params[15], ggml_rope_set_offset) must be even, with "
                         "offset + n_dims <= ne0 = %lld, and 0 in VISION mode; got %d with n_dims = %d, mode %d",
                         (long long) ne0, n_offs, n_dims, mode);
    }
    /* The kernels up to 0.20.2 copy an unrotated row for n_dims = 0. Since upstream rewrote
     * the tail copy (after 0.20.2), the loop meets i0 == the rotated block's offset at once
     * and steps back by n_dims - 2 = -2 each time: it never ends. Any other ROPE kernel (a
     * later release's, even one a review trusts, or an untrusted one) is assumed to have
     * that loop; the defect's probe measures it. */
    if (n_dims == 0 && mode != PG_ROPE_VISION && ne0 > 0 && !pg_kernel_before((int) t->op, PG_RELEASE(0, 20, 3))) {
        why->defect = PG_DEFECT_ROPE_NDIMS0_HANG;
        return pg_refuse(why, "n_dims = 0 with this ggml's rope kernel (not one of 0.20.2 or before), whose tail "
                         "copy never ends then (it steps i0 back by n_dims - 2); rotate at least 2 dims, or copy "
                         "the tensor instead");
    }
    if (mode & PG_ROPE_MROPE) {
        for (int i = 0; i < 4; i++) {
            if (sections[i] < 0) {
                return pg_refuse(why, "sections must be >= 0, got (%d, %d, %d, %d)", sections[0], sections[1],
                                 sections[2], sections[3]);
            }
        }
        if (sections[0] <= 0 && sections[1] <= 0 && sections[2] <= 0) {
            return pg_refuse(why, "mode %d needs sections[0], [1] or [2] > 0 (use rope_multi), got (%d, %d, %d, %d)",
                             mode, sections[0], sections[1], sections[2], sections[3]);
        }
        const int64_t sect_dims = (int64_t) sections[0] + sections[1] + sections[2] + sections[3];
        if (sect_dims > ne0) {
            return pg_refuse(why, "the sections add up to %lld, more than ne0 = %lld", (long long) sect_dims,
                             (long long) ne0);
        }
    }
    if (mode == PG_ROPE_VISION && n_dims != ne0 / 2) {
        return pg_refuse(why, "VISION mode needs n_dims == ne0/2 = %lld, got %d", (long long) (ne0 / 2), n_dims);
    }
    if (mode == PG_ROPE_VISION && !vision_sections_restart(sections, n_dims)) {
        why->defect = PG_DEFECT_ROPE_VISION_SECTION_RESET;
        return pg_refuse(why, "VISION sections (%d, %d, %d, %d): a section after an empty one does not restart "
                         "its angles in the kernel", sections[0], sections[1], sections[2], sections[3]);
    }
    if (ne0 % 2 != 0) {
        why->defect = PG_DEFECT_ROPE_ODD_NE0;
        return pg_refuse(why, "ne0 = %lld is odd: the kernel's tail copy (or VISION's last pair) runs one element "
                         "past each row", (long long) ne0);
    }
    if (c != NULL) {
        PG_NEED_ROWS(c, "the frequency factors (src2)", why);
        if (c->ne[0] < ne0 / 2) {
            why->defect = PG_DEFECT_ROPE_FREQ_FACTORS_OOB;
            return pg_refuse(why, "the kernel reads a frequency factor for each of the ne0/2 = %lld pairs of a row "
                             "(the builder asks for n_dims/2 = %d); src2 has %lld", (long long) (ne0 / 2),
                             n_dims / 2, (long long) c->ne[0]);
        }
    }
    return PYGGML_OK;
}

/* ops.cpp ggml_compute_forward_flash_attn_ext -> _f16 -> _f16_one_chunk / _tiled /
 * split-KV + ggml_flash_attn_ext_reduce_partials:
 *  - q rows read as float (`const float * pq`, then converted to k's vec_dot_type): q F32;
 *  - k: a vec_dot for its type (called unchecked) and a from_float for its vec_dot_type
 *    (GGML_ASSERT q_to_vec_dot);
 *  - v: F32 or a to_float (GGML_ASSERT);
 *  - GGML_ASSERT rows of q, k, v contiguous;
 *  - v row ic and head iq2/(neq2/nev2) are read for ic < nek1 and every q head: v must
 *    have >= nek1 rows and a head count dividing q's (not checked by the builder);
 *  - the mask (F16, contiguous, ne2 | n_head, ne3 | ne3: the builder's) is read at row iq1
 *    for every query and column ic for every key: ne[0] >= n_kv, ne[1] >= n_batch (ggml.h
 *    says so; the builder does not check it);
 *  - sinks (src4, F32 with ne0 == n_head: ggml_flash_attn_ext_add_sinks, which pyggml does
 *    not bind; rechecked when a graph is built) read as sinks[h]: contiguous;
 *  - int row indices (ir, iq1, iq2, iq3).
 * What the builder guarantees is not repeated: DK = q.ne0 = k.ne0 (ggml_can_mul_mat; a
 * quantized k's rows are whole blocks of its vec_dot_type), the F32 [DV, H, N, ne3] result,
 * op_params[3] a ggml_prec (pyggml's flash_attn_ext_set_prec takes the enum only). The
 * work buffer: per thread DK + 2*DV + CACHE_LINE_SIZE_F32 floats (one chunk), the tiled
 * scratch, or the split-KV partials; ggml_graph_plan reserves the larger of the tiled and
 * split-KV sizes plus a cache line per thread, which covers each. */
static int rule_flash_attn_ext(const struct ggml_tensor * t, pg_why * why) {
    PG_NEED_SRC(t, 0, why);
    PG_NEED_SRC(t, 1, why);
    PG_NEED_SRC(t, 2, why);
    const struct ggml_tensor * q = t->src[0];
    const struct ggml_tensor * k = t->src[1];
    const struct ggml_tensor * v = t->src[2];
    const struct ggml_tensor * mask = t->src[3];
    const struct ggml_tensor * sinks = t->src[4];

    PG_NEED_TYPE(q, "q (src0)", q->type == GGML_TYPE_F32, why);
    const struct ggml_type_traits_cpu * kt = ggml_get_type_traits_cpu(k->type);
    if (kt == NULL || kt->vec_dot == NULL || ggml_get_type_traits_cpu(kt->vec_dot_type)->from_float == NULL) {
        return pg_refuse_type(why, "the CPU kernel has no dot product for k (src1) of type %s", pg_type(k));
    }
    if (v->type != GGML_TYPE_F32 && ggml_get_type_traits(v->type)->to_float == NULL) {
        return pg_refuse_type(why, "the CPU kernel cannot read v (src2) of type %s", pg_type(v));
    }
    PG_NEED_ROWS(q, "q (src0)", why);
    PG_NEED_ROWS(k, "k (src1)", why);
    PG_NEED_ROWS(v, "v (src2)", why);
    if (v->ne[1] < k->ne[1]) {
        return pg_refuse(why, "v (src2) has %lld rows, fewer than k's %lld keys: the kernel reads a v row per key",
                         (long long) v->ne[1], (long long) k->ne[1]);
    }
    if (v->ne[2] == 0 || q->ne[2] % v->ne[2] != 0) {
        return pg_refuse(why, "v's head count (ne[2] = %lld) must divide q's (%lld), as k's does",
                         (long long) v->ne[2], (long long) q->ne[2]);
    }
    if (mask != NULL && (mask->ne[0] < k->ne[1] || mask->ne[1] < q->ne[1])) {
        return pg_refuse(why, "the mask (src3) must be at least [n_kv = %lld, n_batch = %lld], got [%lld, %lld]: "
                         "the kernel reads a mask row per query and a column per key",
                         (long long) k->ne[1], (long long) q->ne[1], (long long) mask->ne[0],
                         (long long) mask->ne[1]);
    }
    if (sinks != NULL) {
        PG_NEED_ROWS(sinks, "the sinks (src4)", why);
    }
    if (q->ne[1] * q->ne[2] * q->ne[3] > INT32_MAX) {
        return pg_refuse(why, "too many query rows for the kernel's int indices");
    }
    return PYGGML_OK;
}

/* ops.cpp ggml_compute_forward_get_rel_pos -> _f16: src0 F16 or BF16 (copied as 2-byte
 * elements; GGML_ABORT otherwise), read as packed rows src0[pos*ne00 + i0] from its data
 * pointer (the builder checks its shape only). The builder makes an F16 result whatever
 * src0's type, so a BF16 src0 fills an F16 tensor with BF16 bits. */
static int rule_get_rel_pos(const struct ggml_tensor * t, pg_why * why) {
    const struct ggml_tensor * a = t->src[0];
    PG_NEED_SRC(t, 0, why);
    if (a->type == GGML_TYPE_BF16 && t->type != GGML_TYPE_BF16) {
        why->defect = PG_DEFECT_GET_REL_POS_BF16;
        return pg_refuse(why, "a BF16 src0 is copied bit for bit into the %s result", pg_type(t));
    }
    PG_NEED_TYPE(a, "src0", a->type == GGML_TYPE_F16, why);
    if (a->nb[0] != ggml_type_size(a->type) || (a->ne[1] > 1 && a->nb[1] != a->nb[0] * (size_t) a->ne[0])) {
        return pg_refuse(why, "src0 must have packed rows (nb[0] = %zu, nb[1] = nb[0]*ne[0]): the kernel reads "
                         "src0[pos*ne0 + i0]; got nb=(%zu, %zu)", ggml_type_size(a->type), a->nb[0], a->nb[1]);
    }
    return PYGGML_OK;
}

/* ops.cpp ggml_compute_forward_add_rel_pos -> _f32: src0 F32 (GGML_ABORT otherwise; the
 * builder asserts a, pw, ph contiguous and pw, ph F32); patches i13 < pw->ne[3] == a->ne[2]:
 * the kernel never reaches a's slices i3 >= 1 (they are copied unchanged). */
static int rule_add_rel_pos(const struct ggml_tensor * t, pg_why * why) {
    PG_NEED_SRC(t, 0, why);
    PG_NEED_SRC(t, 1, why);
    PG_NEED_SRC(t, 2, why);
    const struct ggml_tensor * a = t->src[0];
    PG_NEED_TYPE(a, "src0", a->type == GGML_TYPE_F32, why);
    if (a->ne[3] != 1) {
        why->defect = PG_DEFECT_ADD_REL_POS_NE3;
        return pg_refuse(why, "src0 has ne[3] = %lld: the kernel adds to its first ne[3] slice only",
                         (long long) a->ne[3]);
    }
    return PYGGML_OK;
}

/* ops.cpp ggml_compute_forward_soft_max_f32: F32 src0 and dst, contiguous (a row of one
 * element may carry any nb[0]: the kernel reads rows with nb[1]); an optional mask src1
 * of F32 or F16 with contiguous rows; optional sinks src2, F32, read as a contiguous
 * array (sk[i02]) */
static int rule_soft_max(const struct ggml_tensor * t, pg_why * why) {
    const struct ggml_tensor * a = t->src[0];
    const struct ggml_tensor * m = t->src[1];
    const struct ggml_tensor * sinks = t->src[2];
    PG_NEED_SRC(t, 0, why);
    PG_NEED_TYPE(a, "src0", a->type == GGML_TYPE_F32, why);
    if (!(ggml_is_contiguous(a) && (a->ne[0] == 1 || pg_rows_contiguous(a)))) {
        PG_NEED_CONTIGUOUS(a, "src0", why);
    }
    if (!(ggml_is_contiguous(t) && (t->ne[0] == 1 || pg_rows_contiguous(t)))) {
        PG_NEED_CONTIGUOUS(t, "the result", why);
    }
    if (m != NULL) {
        PG_NEED_TYPE(m, "the mask (src1)", m->type == GGML_TYPE_F32 || m->type == GGML_TYPE_F16, why);
        PG_NEED_ROWS(m, "the mask (src1)", why);
    }
    if (sinks != NULL) {
        PG_NEED_TYPE(sinks, "the sinks (src2)", sinks->type == GGML_TYPE_F32, why);
        PG_NEED_CONTIGUOUS(sinks, "the sinks (src2)", why);
    }
    return PYGGML_OK;
}

/* ops.cpp ggml_compute_forward_diag_mask_f32: F32, n_past >= 0 (op_params[0]); out of
 * place it memcpys a contiguous src0 into a contiguous dst; then it walks dst's rows
 * with k*nb[2] over all ne2*ne3 slices, so dims 2 and 3 must be packed (nb[3] =
 * nb[2]*ne[2]) -- unit dims with odd strides are refused too (found by fuzzing) */
static int rule_diag_mask(const struct ggml_tensor * t, pg_why * why) {
    const struct ggml_tensor * a = t->src[0];
    PG_NEED_SRC(t, 0, why);
    PG_NEED_TYPE(a, "src0", a->type == GGML_TYPE_F32, why);
    if (t->op_params[0] < 0) {
        return pg_refuse(why, "n_past must be >= 0, got %d", t->op_params[0]);
    }
    PG_NEED_ROWS(a, "src0", why);
    PG_NEED_ROWS(t, "the result", why);
    const int inplace = t->view_src != NULL;       /* ggml_diag_mask_*_inplace: a view of src0 */
    if (!inplace) {
        PG_NEED_CONTIGUOUS(a, "src0", why);
        PG_NEED_CONTIGUOUS(t, "the result", why);
    }
    if (t->ne[3] > 1 && t->nb[3] != t->nb[2] * (size_t) t->ne[2]) {
        return pg_refuse(why, "the result's dims 2 and 3 must be packed (nb[3] = nb[2]*ne[2]): the kernel walks "
                         "them with nb[2] only; got nb=(%zu, %zu, %zu, %zu)", t->nb[0], t->nb[1], t->nb[2], t->nb[3]);
    }
    return PYGGML_OK;
}

const pg_named_rule pg_rules_attention[] = {
    {"ROPE", pg_rule_rope},
    {"FLASH_ATTN_EXT", rule_flash_attn_ext},
    {"GET_REL_POS", rule_get_rel_pos},
    {"ADD_REL_POS", rule_add_rel_pos},
    {"SOFT_MAX", rule_soft_max},
    {"DIAG_MASK_INF", rule_diag_mask},
    {"DIAG_MASK_ZERO", rule_diag_mask},
    {NULL, NULL},
};
