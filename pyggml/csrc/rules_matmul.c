/* Kernel rules for the [matmul] family: MUL_MAT, MUL_MAT_ID and OUT_PROD. Each rule cites
 * the ggml-cpu function whose assertions, type switch and silent assumptions it mirrors; what the builders assert already (ggml_mul_mat_id:
 * I32 ids, shapes; ggml_out_prod: shapes, an F32 result) is not repeated. */
#include "rules.h"

#include <stdlib.h>

/* ggml 0.25.3's tiled K-quant path (ggml-cpu/tiled/tiled.cpp, MUL_MAT and MUL_MAT_ID): taken
 * on x86 AVX builds for src0 of these types, from 8 src1 rows on (per expert for MUL_MAT_ID;
 * any number with GGML_CPU_TILED_MM_FORCE=1), unless GGML_CPU_TILED_MM=0 (read once by ggml,
 * so not trusted here: the rules assume the path is on, and on every ISA). With a Q8_K src1
 * (src0's vec_dot type, used in place) it finds row r of the flattened dims 1..3 at r*nb[1]:
 * batches not packed after one another are read from the wrong rows (defect
 * mul-mat-tiled-q8k-batches; its intended check, ggml_tiled_supported's !contiguous, is
 * never reached: the type switch returns first). */
static int tiled_src0(enum ggml_type t) {
    switch (t) {
        case GGML_TYPE_Q6_K: case GGML_TYPE_Q5_K: case GGML_TYPE_Q4_K: case GGML_TYPE_Q3_K: case GGML_TYPE_Q2_K:
        case GGML_TYPE_IQ4_XS: case GGML_TYPE_IQ2_XXS: case GGML_TYPE_IQ2_XS: case GGML_TYPE_IQ2_S:
        case GGML_TYPE_IQ3_XXS: case GGML_TYPE_IQ3_S: case GGML_TYPE_IQ1_S: case GGML_TYPE_IQ1_M:
            return 1;
        default:
            return 0;
    }
}

static int tiled_q8k_misread(const struct ggml_tensor * t, int64_t rows) {
    const struct ggml_tensor * a = t->src[0], * b = t->src[1];
    if (!pg_kernel_since((int) t->op, PG_RELEASE(0, 25, 3)) || !tiled_src0(a->type) || b->type != GGML_TYPE_Q8_K) {
        return 0;
    }
    const char * force = getenv("GGML_CPU_TILED_MM_FORCE");
    if (rows < 8 && !(force != NULL && atoi(force) == 1)) {
        return 0;
    }
    return (b->ne[2] > 1 && b->nb[2] != b->nb[1] * (size_t) b->ne[1]) ||
           (b->ne[3] > 1 && b->nb[3] != b->nb[1] * (size_t) (b->ne[1] * b->ne[2]));
}

static int refuse_tiled_q8k(const struct ggml_tensor * t, pg_why * why) {
    const struct ggml_tensor * b = t->src[1];
    why->defect = PG_DEFECT_MUL_MAT_TILED_Q8K_BATCHES;
    return pg_refuse(why, "a q8_K src1 whose batches are not packed (nb=(%zu, %zu, %zu, %zu) for ne=(%lld, %lld, "
                     "%lld, %lld)) with a %s src0: the CPU kernel's tiled path reads row r of dims 1..3 at r*nb[1], "
                     "the wrong rows; use cont() on a float src1", b->nb[0], b->nb[1], b->nb[2], b->nb[3],
                     (long long) b->ne[0], (long long) b->ne[1], (long long) b->ne[2], (long long) b->ne[3],
                     pg_type(t->src[0]));
}

/* ggml-cpu.c ggml_compute_forward_mul_mat_id: a vec_dot for src0's type; src1 F32 (then
 * converted to the vec_dot type in the work buffer: GGML_ASSERT(src1->type == F32)) or
 * already of that type; nb00 and nb10 the element size (asserted); the result's
 * strides (asserted) are those of the new tensor the builder makes.
 *
 * What a rule cannot check: the expert ids are data (src2, I32, any strides). The
 * kernel's `assert(i02 >= 0 && i02 < n_as)` is compiled out: an id outside [0, n_as)
 * indexes matrix_row_counts[] and matrix_rows[] (the work buffer) out of bounds, and
 * ids written by another node of the graph (argsort, top_k) exist only at compute time.
 * (The one shape where no id can be valid, n_as = 0 experts, has an empty src0, which
 * pyggml does not compute.) From 0.25.3, the tiled path (above) reads a Q8_K src1's token
 * t at t*ne[1]*nb[1]; refused unless fewer than 8 rows are routed in all (the per-expert
 * count is data). */
static int rule_mul_mat_id(const struct ggml_tensor * t, pg_why * why) {
    const struct ggml_tensor * as = t->src[0];
    const struct ggml_tensor * b = t->src[1];
    PG_NEED_SRC(t, 0, why);
    PG_NEED_SRC(t, 1, why);
    PG_NEED_SRC(t, 2, why);
    if (ggml_nelements(t) == 0) {
        return PYGGML_OK;        /* ggml_compute_forward skips an empty result */
    }
    const struct ggml_type_traits_cpu * tr = ggml_get_type_traits_cpu(as->type);
    if (tr == NULL || tr->vec_dot == NULL) {
        return pg_refuse_type(why, "the CPU kernel has no dot product for the experts (src0) of type %s",
                              pg_type(as));
    }
    if (b->type != GGML_TYPE_F32 && b->type != tr->vec_dot_type) {
        return pg_refuse_type(why, "src1 must be F32 or %s (the vec_dot type of src0's %s), got %s",
                              ggml_type_name(tr->vec_dot_type), pg_type(as), pg_type(b));
    }
    PG_NEED_ROWS(as, "src0", why);
    PG_NEED_ROWS(b, "src1", why);
    const struct ggml_tensor * ids = t->src[2];
    if (tiled_q8k_misread(t, ids->ne[0] * ids->ne[1])) {
        return refuse_tiled_q8k(t, why);
    }
    return PYGGML_OK;
}

/* ops.cpp ggml_compute_forward_out_prod: src0 F32 (out_prod_f32: src0 broadcast over dims
 * 2 and 3), F16 (out_prod_f16_f32) or one of the quantized types of its switch
 * (out_prod_q_f32: every quantized type with a CPU vec_dot, not Q8_1 or Q8_K); the F16
 * and quantized kernels assert ne02 == ne12 and ne03 == ne13 (no broadcasting). src1 is
 * read as float in all three (asserted in the F32 kernel, silently assumed in the
 * others: an F16 src1 is read past its end); any strides. nb00 the element size and the
 * result F32 (asserted). The work buffer (ne0 + a cache line floats per thread) fits
 * ggml_graph_plan's ne00 floats per task + a cache line per thread. */
static int rule_out_prod(const struct ggml_tensor * t, pg_why * why) {
    const struct ggml_tensor * a = t->src[0];
    const struct ggml_tensor * b = t->src[1];
    PG_NEED_SRC(t, 0, why);
    PG_NEED_SRC(t, 1, why);
    if (ggml_nelements(t) == 0) {
        return PYGGML_OK;        /* ggml_compute_forward skips an empty result */
    }
    enum ggml_type ta = a->type;
    int quant = pg_is_dequantizable(ta);
    if (!(ta == GGML_TYPE_F32 || ta == GGML_TYPE_F16 || quant)) {
        return pg_refuse_type(why, "the CPU kernel does not take src0 of type %s (it takes F32, F16 and "
                              "the quantized types with a CPU dot product)", pg_type(a));
    }
    if (b->type != GGML_TYPE_F32) {
        return pg_refuse_type(why, "src1 must be F32 (every out_prod kernel reads it as float), got %s",
                              pg_type(b));
    }
    PG_NEED_ROWS(a, "src0", why);
    if (ta != GGML_TYPE_F32 && (a->ne[2] != b->ne[2] || a->ne[3] != b->ne[3])) {
        return pg_refuse(why, "a %s src0 cannot be broadcast (the kernel asserts ne02 == ne12 and ne03 == ne13): "
                         "src0 ne=(%lld, %lld, %lld, %lld), src1 ne=(%lld, %lld, %lld, %lld)", pg_type(a),
                         (long long) a->ne[0], (long long) a->ne[1], (long long) a->ne[2], (long long) a->ne[3],
                         (long long) b->ne[0], (long long) b->ne[1], (long long) b->ne[2], (long long) b->ne[3]);
    }
    return PYGGML_OK;
}

/* ggml-cpu.c ggml_compute_forward_mul_mat with op_params[1] = GGML_HINT_SRC0_IS_HADAMARD
 * (ggml_mul_mat_set_hint; 0.17.0 on), unless use_ref: ops.cpp ggml_compute_forward_fwht
 * instead, before the tiled path and every assert of the product. It takes src0 for the
 * normalized Hadamard matrix and never reads it: each src1 row (at nb11, nb12, nb13, its
 * elements contiguous: the product's own check) gets its fast Walsh-Hadamard transform
 * scaled by 1/sqrt(n), n = ne10, written as n floats from the result row's start (nb1, nb2,
 * nb3). It aborts on a src1 not F32 (0.20.2; F32 or F16 from 0.25.3: fwht_impl<ggml_fp16_t>)
 * and on n not a power of 2; n floats into a row of ne0 = ne01 write past the row where
 * ne01 < n and leave its end unwritten where ne01 > n, so src0 must be square. The rule
 * checks the product too (use_ref, or the hint cleared, takes that path). */
#define PG_HINT_SRC0_IS_HADAMARD 1      /* GGML_HINT_SRC0_IS_HADAMARD: ggml 0.9.4's header lacks the enum */
static int rule_hadamard_hint(const struct ggml_tensor * t, pg_why * why) {
    const struct ggml_tensor * a = t->src[0], * b = t->src[1];
    if (((const int32_t *) t->op_params)[1] != PG_HINT_SRC0_IS_HADAMARD) {
        return PYGGML_OK;
    }
    const int f16 = pg_kernel_since((int) t->op, PG_RELEASE(0, 25, 3));
    if (b->type != GGML_TYPE_F32 && !(f16 && b->type == GGML_TYPE_F16)) {
        return pg_kernel_aborts(why, pg_refuse_type(why, "with the Hadamard hint the CPU kernel (fwht) takes src1 %s, "
                                                     "got %s", f16 ? "F32 or F16" : "F32 only", pg_type(b)));
    }
    const int64_t n = b->ne[0];
    if ((n & (n - 1)) != 0) {
        return pg_kernel_aborts(why, pg_refuse(why, "with the Hadamard hint the CPU kernel (fwht) needs ne10 = %lld "
                                               "to be a power of 2", (long long) n));
    }
    if (a->ne[1] != n) {
        return pg_refuse(why, "with the Hadamard hint src0 must be square: the CPU kernel (fwht) writes ne10 = %lld "
                         "floats to each result row of ne01 = %lld (%s)", (long long) n, (long long) a->ne[1],
                         a->ne[1] < n ? "past its end" : "leaving the rest unwritten");
    }
    return PYGGML_OK;
}

/* ggml-cpu.c ggml_compute_forward_mul_mat: src0 rows contiguous and not transposed, a
 * vec_dot for src0's type; src1 F32 or src0's vec_dot_type (supports_op), rows
 * contiguous; dst F32 with nb0 <= nb1 <= nb2 <= nb3. From 0.25.3 an F16 or BF16 src1 is
 * widened to F32 rows where the vec_dot type is F32 (an F32 src0), and the tiled path
 * (above) misreads a Q8_K src1 with unpacked batches. */
static int rule_mul_mat(const struct ggml_tensor * t, pg_why * why) {
    const struct ggml_tensor * a = t->src[0];
    const struct ggml_tensor * b = t->src[1];
    PG_NEED_SRC(t, 0, why);
    PG_NEED_SRC(t, 1, why);
    const struct ggml_type_traits_cpu * tr = ggml_get_type_traits_cpu(a->type);
    if (tr == NULL || tr->vec_dot == NULL) {
        return pg_refuse_type(why, "the CPU kernel has no dot product for src0 of type %s", pg_type(a));
    }
    const int widened = tr->vec_dot_type == GGML_TYPE_F32 && (b->type == GGML_TYPE_F16 || b->type == GGML_TYPE_BF16) &&
                        pg_kernel_since((int) t->op, PG_RELEASE(0, 25, 3));
    if (b->type != GGML_TYPE_F32 && b->type != tr->vec_dot_type && !widened) {   /* GGML_ASSERT(src1->type == F32) */
        return pg_kernel_aborts(why, pg_refuse_type(why, "src1 must be F32 or %s (the vec_dot type of src0's %s), "
                                                     "got %s", ggml_type_name(tr->vec_dot_type), pg_type(a),
                                                     pg_type(b)));
    }
    if (ggml_is_transposed(a)) {
        return pg_refuse(why, "src0 must not be transposed (nb[0] > nb[1]); use cont()");
    }
    PG_NEED_ROWS(a, "src0", why);
    PG_NEED_ROWS(b, "src1", why);
    if (!(t->nb[0] == sizeof(float) && t->nb[0] <= t->nb[1] && t->nb[1] <= t->nb[2] && t->nb[2] <= t->nb[3])) {
        return pg_refuse(why, "the result must be F32 with increasing strides");
    }
    if (tiled_q8k_misread(t, b->ne[1])) {
        return refuse_tiled_q8k(t, why);
    }
    return rule_hadamard_hint(t, why);
}

const pg_named_rule pg_rules_matmul[] = {
    {"MUL_MAT_ID", rule_mul_mat_id},
    {"OUT_PROD", rule_out_prod},
    {"MUL_MAT", rule_mul_mat},
    {NULL, NULL},
};
