/* Kernel rules for the [recurrent] family: SSM_CONV, SSM_SCAN, RWKV_WKV6, RWKV_WKV7,
 * GATED_LINEAR_ATTN, GATED_DELTA_NET, SOLVE_TRI, LIGHTNING_INDEXER, DSV4_HC_COMB,
 * DSV4_HC_PRE, DSV4_HC_POST. Each rule cites the ggml-cpu/ops.cpp function whose type
 * switch, assertions and indexing it mirrors, and checks only what the builder in ggml.c
 * lets through.
 *
 * Data is not checked: SSM_SCAN reads its initial states at s + ids[i]*nb[3] with ids
 * read at compute time; a rule sees the node before its ids are (or may still be) written,
 * so it checks ids' type, shape and stride, never its values (an id outside [0, s->ne[3])
 * reads outside s). */
#include "rules.h"

#include <string.h>

/* the sources [first, first + n) are F32: the kernels dispatch on src0's type only and
 * read every other source as float (a 4-byte I32 passes their nb[0] asserts and is read as
 * floats; F16/BF16 abort there) */
static int need_f32(const struct ggml_tensor * t, int first, int n, const char * const * names, pg_why * why) {
    for (int i = first; i < first + n; i++) {
        PG_NEED_SRC(t, i, why);
        if (t->src[i]->type != GGML_TYPE_F32) {
            return pg_refuse_type(why, "the CPU kernel takes %s (src%d) as F32 only, got %s", names[i - first], i,
                                  pg_type(t->src[i]));
        }
    }
    return PYGGML_OK;
}

#define NEED_F32(t, first, n, why, ...)                                                          \
    do {                                                                                         \
        static const char * const names_[] = {__VA_ARGS__};                                      \
        int rc_ = need_f32(t, first, n, names_, why);                                           \
        if (rc_ != PYGGML_OK)                                                                    \
            return rc_;                                                                          \
    } while (0)

#define NE4(x) (long long) (x)->ne[0], (long long) (x)->ne[1], (long long) (x)->ne[2], (long long) (x)->ne[3]

/* the recurrences with no token to run leave the result's state part unwritten (the loop
 * over tokens is the only writer): refused as an upstream defect while the result has
 * states to write */
static int zero_tokens(const struct ggml_tensor * t, int64_t n_tokens, pg_why * why) {
    if (n_tokens == 0 && ggml_nelements(t) > 0) {
        why->defect = PG_DEFECT_RECURRENT_ZERO_TOKENS_STATE;
        return pg_refuse(why, "with 0 tokens the CPU kernel never writes the result's %lld state values (they "
                         "should be the input states)", (long long) ggml_nelements(t));
    }
    return PYGGML_OK;
}

/* ops.cpp ggml_compute_forward_ssm_conv_f32: sx (src0) and c (src1) F32; it asserts
 * sx->nb[0] == c->nb[0] == 4 and sx->nb[1] == sx->ne[0]*4, and walks c's rows as
 * c[i0 + i1*d_conv] (packed rows, not asserted: other strides read the wrong weights) */
static int rule_ssm_conv(const struct ggml_tensor * t, pg_why * why) {
    if (ggml_is_empty(t)) {
        return PYGGML_OK;     /* ggml_compute_forward skips an empty result */
    }
    NEED_F32(t, 0, 2, why, "sx", "c");
    const struct ggml_tensor * sx = t->src[0], * c = t->src[1];
    if (sx->nb[0] != sizeof(float) || sx->nb[1] != sx->ne[0] * sizeof(float)) {
        return pg_refuse(why, "sx (src0) must have packed rows (nb[0] = 4, nb[1] = 4*ne[0] = %zu): the kernel "
                         "slides its window along them; got nb=(%zu, %zu, %zu, %zu)",
                         (size_t) sx->ne[0] * sizeof(float), sx->nb[0], sx->nb[1], sx->nb[2], sx->nb[3]);
    }
    if (c->nb[0] != sizeof(float) || (c->ne[1] > 1 && c->nb[1] != c->ne[0] * sizeof(float))) {
        return pg_refuse(why, "c (src1) must have packed rows (nb[0] = 4, nb[1] = 4*ne[0] = %zu): the kernel "
                         "reads it as one block; got nb=(%zu, %zu)",
                         (size_t) c->ne[0] * sizeof(float), c->nb[0], c->nb[1]);
    }
    return PYGGML_OK;
}

/* ops.cpp ggml_compute_forward_ssm_scan_f32: s, x, dt, A, B, C F32; it asserts nb[0] == 4
 * for all of them and for ids (ggml_is_contiguous, which the builder asks of s, dt and A,
 * ignores nb[0] where ne[0] == 1, e.g. Mamba-2's A [1, n_head]), and n_head % n_group == 0
 * (n_group = B->ne[1]; 0 divides by zero). ids' values: see the top of this file.
 * The K state snapshots (op_params[0]) after the outputs: slot 0 is the state after the
 * last token, slot k (1 <= k < K) is copied after token n_seq_tokens - 1 - k, the only
 * write to it. With K > n_seq_tokens (x->ne[2], the tokens of each sequence) slots
 * n_seq_tokens .. K-1 of every sequence are never written: the result keeps whatever its
 * memory held. */
static int rule_ssm_scan(const struct ggml_tensor * t, pg_why * why) {
    if (ggml_is_empty(t)) {
        return PYGGML_OK;     /* ggml_compute_forward skips an empty result */
    }
    NEED_F32(t, 0, 6, why, "s", "x", "dt", "A", "B", "C");
    PG_NEED_SRC(t, 6, why);
    static const char * const names[] = {"s (src0)", "x (src1)", "dt (src2)", "A (src3)", "B (src4)",
                                         "C (src5)", "ids (src6)"};
    for (int i = 0; i < 7; i++) {
        const struct ggml_tensor * x = t->src[i];
        if (x->nb[0] != ggml_type_size(x->type)) {
            return pg_refuse(why, "%s must have nb[0] = %zu (the kernel asserts it), got nb[0] = %zu", names[i],
                             ggml_type_size(x->type), x->nb[0]);
        }
    }
    const int64_t nh = t->src[1]->ne[1], ng = t->src[4]->ne[1];
    if (ng < 1 || nh % ng != 0) {
        return pg_refuse(why, "n_head = %lld (x->ne[1]) must be a multiple of n_group = %lld (B->ne[1])",
                         (long long) nh, (long long) ng);
    }
    const int64_t nt = t->src[1]->ne[2], K = t->op_params[0];
    const int rc = zero_tokens(t, nt, why);
    if (rc != PYGGML_OK) {
        return rc;
    }
    if (K > nt) {
        return pg_refuse(why, "K = %lld state snapshots need at least K tokens per sequence, got n_seq_tokens = "
                         "%lld (x->ne[2]): the kernel writes slot k after token n_seq_tokens - 1 - k and leaves "
                         "slots %lld..%lld unwritten", (long long) K, (long long) nt, (long long) nt,
                         (long long) (K - 1));
    }
    return PYGGML_OK;
}

int64_t pyggml_thread_heads(const struct ggml_tensor * t) {
    if ((t->op == GGML_OP_RWKV_WKV6 || t->op == GGML_OP_GATED_LINEAR_ATTN || t->op == GGML_OP_RWKV_WKV7) &&
        t->src[0] != NULL) {
        return t->src[0]->ne[1];        /* k (r for RWKV_WKV7): [S, H, n_tokens] */
    }
    return 0;
}

/* RWKV_WKV6, GATED_LINEAR_ATTN and RWKV_WKV7 (ops.cpp ggml_compute_forward_rwkv_wkv6_f32,
 * _gla_f32, _rwkv_wkv7_f32) share the walk over tokens: seq = t / (T / n_seqs), n_seqs =
 * state->ne[1]. The builders do not ask T to be a multiple of n_seqs: otherwise the last
 * tokens land in a state block past the result (and read past state), and T < n_seqs
 * divides by zero. */
static int tokens_per_seq(const struct ggml_tensor * t, int64_t T, const struct ggml_tensor * state, pg_why * why) {
    const int64_t n_seqs = state->ne[1];
    if (T > 0 && (n_seqs < 1 || T % n_seqs != 0)) {
        why->defect = PG_DEFECT_WKV_TOKENS_PER_SEQ_OOB;
        return pg_refuse(why, "n_tokens = %lld must be a multiple of n_seqs = %lld (state->ne[1]): the kernel "
                         "gives each sequence n_tokens / n_seqs tokens and writes the rest past its result",
                         (long long) T, (long long) n_seqs);
    }
    return zero_tokens(t, T, why);
}

/* ops.cpp ggml_compute_forward_rwkv_wkv6_f32: k, v, r, tf, td, state F32 (flat float
 * arrays; the builder asks them contiguous); tf, the per-head bonus u, is read as
 * tf[h*S + i] for h < H, i < S and its shape is not checked by the builder */
static int rule_rwkv_wkv6(const struct ggml_tensor * t, pg_why * why) {
    if (ggml_is_empty(t)) {
        return PYGGML_OK;     /* ggml_compute_forward skips an empty result */
    }
    NEED_F32(t, 0, 6, why, "k", "v", "r", "tf", "td", "state");
    const struct ggml_tensor * k = t->src[0], * tf = t->src[3];
    if (ggml_nelements(tf) != k->ne[0] * k->ne[1]) {
        return pg_refuse(why, "tf (src3) must hold S*H = %lld values (its [S, H] per-head bonus), got "
                         "ne=(%lld, %lld, %lld, %lld): the kernel reads the first S*H only",
                         (long long) (k->ne[0] * k->ne[1]), NE4(tf));
    }
    return tokens_per_seq(t, t->src[1]->ne[2], t->src[5], why);
}

/* ops.cpp ggml_compute_forward_gla_f32: k, v, q, g, state F32 */
static int rule_gla(const struct ggml_tensor * t, pg_why * why) {
    if (ggml_is_empty(t)) {
        return PYGGML_OK;     /* ggml_compute_forward skips an empty result */
    }
    NEED_F32(t, 0, 5, why, "k", "v", "q", "g", "state");
    return tokens_per_seq(t, t->src[1]->ne[2], t->src[4], why);
}

/* GGML_F32_STEP of the SIMD mapping ggml-cpu was built with (simd-mappings.h, in its
 * order), where the WKV7 kernel takes its SIMD path; 0 where it runs the scalar loop
 * (SVE, RISC-V vectors, no SIMD). LoongArch has no ggml_cpu_has_* query: read as 0. */
static int wkv7_simd_step(void) {
    if (ggml_cpu_has_sve() || ggml_cpu_has_riscv_v()) {
        return 0;
    }
    if (ggml_cpu_has_neon()) {
        return ggml_cpu_has_arm_fma() ? 16 : 0;
    }
    if (ggml_cpu_has_avx512()) {
        return 64;
    }
    if (ggml_cpu_has_avx() || ggml_cpu_has_vsx()) {
        return 32;
    }
    if (ggml_cpu_has_wasm_simd()) {
        return 16;
    }
    if (ggml_cpu_has_sse3() || ggml_cpu_has_vxe()) {
        return 32;
    }
    return 0;
}

/* ops.cpp ggml_compute_forward_rwkv_wkv7_f32: r, w, k, v, a, b, state F32; r is read as
 * r[t*C + h*S + j] like the others but its shape is not checked by the builder; the SIMD
 * path walks a head in whole GGML_F32_STEP blocks ("There shouldn't be left-overs"), so a
 * head size that is not a multiple reads and writes past the head, and past the result
 * for the last one */
static int rule_rwkv_wkv7(const struct ggml_tensor * t, pg_why * why) {
    if (ggml_is_empty(t)) {
        return PYGGML_OK;     /* ggml_compute_forward skips an empty result */
    }
    NEED_F32(t, 0, 7, why, "r", "w", "k", "v", "a", "b", "state");
    const struct ggml_tensor * r = t->src[0], * k = t->src[2];
    if (r->ne[0] != k->ne[0] || r->ne[1] != k->ne[1] || r->ne[2] != k->ne[2]) {
        return pg_refuse(why, "r (src0) must have k's shape [S, H, n_tokens] = (%lld, %lld, %lld), got "
                         "ne=(%lld, %lld, %lld, %lld)", (long long) k->ne[0], (long long) k->ne[1],
                         (long long) k->ne[2], NE4(r));
    }
    const int step = wkv7_simd_step();
    const int64_t S = k->ne[0];
    if (step > 0 && S % step != 0) {
        why->defect = PG_DEFECT_WKV7_SIMD_TAIL_OOB;
        return pg_refuse(why, "head size S = %lld is not a multiple of %d (GGML_F32_STEP of this build): the "
                         "kernel's SIMD loop reads and writes whole blocks of %d past each head",
                         (long long) S, step, step);
    }
    return tokens_per_seq(t, t->src[3]->ne[2], t->src[6], why);
}

/* ops.cpp ggml_compute_forward_gated_delta_net_one_chunk: the builder checks v, g[0],
 * beta[0] and state; the kernel also reads q and k rows of S_v floats (S_k == S_v, ggml.h)
 * for each of v's n_tokens, q/k head iv1 % H_k (H_k = 0 divides by zero) and q/k sequence
 * iv3 / (n_seqs / n_seqs_k) (not a divisor: past q, k; more q/k sequences than v's divides
 * by zero), and g and beta at [*, iv1, t, iv3] by their strides */
static int rule_gated_delta_net(const struct ggml_tensor * t, pg_why * why) {
    if (ggml_is_empty(t)) {
        return PYGGML_OK;     /* ggml_compute_forward skips an empty result */
    }
    for (int i = 0; i < 6; i++) {
        PG_NEED_SRC(t, i, why);
    }
    const struct ggml_tensor * v = t->src[2];
    const int64_t S_v = v->ne[0], H = v->ne[1], n_tokens = v->ne[2], n_seqs = v->ne[3];
    static const char * const qk[] = {"q (src0)", "k (src1)"};
    for (int i = 0; i < 2; i++) {
        const struct ggml_tensor * x = t->src[i];
        if (x->ne[0] != S_v || x->ne[2] != n_tokens) {
            return pg_refuse(why, "%s must have S_v = %lld values per row and n_tokens = %lld tokens "
                             "(ne[0], ne[2]) like v, got ne=(%lld, %lld, %lld, %lld)", qk[i], (long long) S_v,
                             (long long) n_tokens, NE4(x));
        }
        if (x->ne[1] < 1) {
            return pg_refuse(why, "%s has no heads (ne[1] = 0) for v's %lld", qk[i], (long long) H);
        }
        if (n_seqs > 0 && (x->ne[3] < 1 || n_seqs % x->ne[3] != 0)) {
            return pg_refuse(why, "%s sequences (ne[3] = %lld) must divide v's n_seqs = %lld", qk[i],
                             (long long) x->ne[3], (long long) n_seqs);
        }
    }
    static const char * const gb[] = {"g (src3)", "beta (src4)"};
    for (int i = 0; i < 2; i++) {
        const struct ggml_tensor * x = t->src[3 + i];
        if (x->ne[1] != H || x->ne[2] != n_tokens || x->ne[3] != n_seqs) {
            return pg_refuse(why, "%s must have v's heads, tokens and sequences (ne[1..3] = %lld, %lld, %lld), "
                             "got ne=(%lld, %lld, %lld, %lld)", gb[i], (long long) H, (long long) n_tokens,
                             (long long) n_seqs, NE4(x));
        }
    }
    return PYGGML_OK;
}

/* ops.cpp ggml_compute_forward_lightning_indexer: the builder fixes q and weights F32, the
 * mask F16 and the shapes; the kernel asserts nb[0] == type size for q, k, weights and
 * mask, and converts k's rows with its type's to_float (F32 read directly; no to_float
 * aborts). A block type's to_float converts whole blocks only: a row (a view) of part of a
 * block leaves the tail of the converted row unwritten. */
static int rule_lightning_indexer(const struct ggml_tensor * t, pg_why * why) {
    if (ggml_is_empty(t)) {
        return PYGGML_OK;     /* ggml_compute_forward skips an empty result */
    }
    for (int i = 0; i < 4; i++) {
        PG_NEED_SRC(t, i, why);
    }
    const struct ggml_tensor * k = t->src[1];
    if (k->type != GGML_TYPE_F32 && ggml_get_type_traits(k->type)->to_float == NULL) {
        return pg_refuse_type(why, "the CPU kernel cannot convert k (src1) of type %s to F32", pg_type(k));
    }
    PG_NEED_ROWS(t->src[0], "q (src0)", why);
    PG_NEED_ROWS(k, "k (src1)", why);
    PG_NEED_ROWS(t->src[2], "weights (src2)", why);
    PG_NEED_ROWS(t->src[3], "the mask (src3)", why);
    if (k->ne[0] % ggml_blck_size(k->type) != 0) {
        return pg_refuse(why, "k (src1) rows of %lld values must hold whole %s blocks of %lld",
                         (long long) k->ne[0], pg_type(k), (long long) ggml_blck_size(k->type));
    }
    return PYGGML_OK;
}

/* SOLVE_TRI (ops.cpp ggml_compute_forward_solve_tri_f32) and the DSV4_HC ops
 * (ggml_compute_forward_dsv4_hc_{comb,pre,post}_f32): the builders assert every type and
 * shape these kernels rely on (solve_tri also contiguity; the dsv4 kernels address every
 * element through its strides); nothing is left for a rule */
static int rule_builder_suffices(const struct ggml_tensor * t, pg_why * why) {
    (void) t;
    (void) why;
    return PYGGML_OK;
}

const pg_named_rule pg_rules_recurrent[] = {
    {"SSM_CONV", rule_ssm_conv},
    {"SSM_SCAN", rule_ssm_scan},
    {"RWKV_WKV6", rule_rwkv_wkv6},
    {"GATED_LINEAR_ATTN", rule_gla},
    {"RWKV_WKV7", rule_rwkv_wkv7},
    {"GATED_DELTA_NET", rule_gated_delta_net},
    {"SOLVE_TRI", rule_builder_suffices},
    {"LIGHTNING_INDEXER", rule_lightning_indexer},
    {"DSV4_HC_COMB", rule_builder_suffices},
    {"DSV4_HC_PRE", rule_builder_suffices},
    {"DSV4_HC_POST", rule_builder_suffices},
    {NULL, NULL},
};
