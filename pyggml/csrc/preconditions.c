/* Kernel preconditions: the framework (the op -> rule table) and the shared predicates.
 * The rules themselves live in rules_*.c, one file per op family, and are listed in
 * rules.h. See preconditions.h for how a rule is written. */
#include "preconditions.h"

#include <pthread.h>
#include <string.h>

#include "rules.h"
#include "pyggml_kernels.h"

/* why's words from fmt, and the outcome rc */
static int say(pg_why * why, int rc, const char * fmt, va_list ap) {
    if (why->cap > 0) {
        vsnprintf(why->buf, why->cap, fmt, ap);
    }
    return rc;
}

int pg_refuse(pg_why * why, const char * fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int rc = say(why, PYGGML_REFUSED, fmt, ap);
    va_end(ap);
    return rc;
}

int pg_refuse_type(pg_why * why, const char * fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int rc = say(why, PYGGML_REFUSED_TYPE, fmt, ap);
    va_end(ap);
    return rc;
}

int pg_lacks(pg_why * why, const char * fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int rc = say(why, PYGGML_LACKS, fmt, ap);
    va_end(ap);
    return rc;
}

int pg_no_backward(pg_why * why, const char * fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int rc = say(why, PYGGML_NO_BACKWARD, fmt, ap);
    va_end(ap);
    return rc;
}

int pg_kernel_aborts(pg_why * why, int rc) {
    why->aborts = 1;
    return rc;
}

int pg_rows_contiguous(const struct ggml_tensor * t) {
    return t->nb[0] == ggml_type_size(t->type);
}

int pg_contiguous(const struct ggml_tensor * t) {
    /* ggml_is_contiguous ignores the strides of dimensions of size 1, but kernels
     * assert nb[0] == ggml_type_size(type) regardless */
    return ggml_is_contiguous(t) && pg_rows_contiguous(t);
}

int pg_is_float(enum ggml_type type) {
    return type == GGML_TYPE_F32 || type == GGML_TYPE_F16 || type == GGML_TYPE_BF16;
}

/* The quantized types the CPU kernels' "any quantized src0" switches list (add_q_f32,
 * add1_q_f32, get_rows, out_prod, ...): those ggml can turn back into floats. Q8_1 and
 * Q8_K, the other side of a dot product only, have no to_float: those switches abort. */
int pg_is_dequantizable(enum ggml_type type) {
    return ggml_is_quantized(type) && ggml_get_type_traits(type)->to_float != NULL;
}

int pg_has_cpu_from_float(enum ggml_type type) {
    return pyggml_type_has_cpu_from_float((int) type);
}

const char * pg_type(const struct ggml_tensor * t) {
    return t == NULL ? "NULL" : ggml_type_name(t->type);
}

/* --- shared rules: kernel templates that ops of several families instantiate --------------- */

/* unary-ops.cpp unary_op/apply_unary_op: F32, F16, BF16 alike, or F16/BF16 -> F32;
 * src0 and dst rows contiguous */
int pg_rule_unary(const struct ggml_tensor * t, pg_why * why) {
    const struct ggml_tensor * a = t->src[0];
    PG_NEED_SRC(t, 0, why);
    if (ggml_is_empty(t)) {
        return PYGGML_OK;          /* ggml_compute_forward skips empty nodes */
    }
    int ok = (a->type == t->type && pg_is_float(a->type)) ||
             (t->type == GGML_TYPE_F32 && (a->type == GGML_TYPE_F16 || a->type == GGML_TYPE_BF16));
    if (!ok) {
        return pg_refuse_type(why, "the CPU kernel does not take src0 %s with result %s", pg_type(a), pg_type(t));
    }
    PG_NEED_ROWS(a, "src0", why);
    PG_NEED_ROWS(t, "the result", why);
    return PYGGML_OK;
}

/* --- the op -> rule table, built from the linked ggml's op names --------------------------- */

#define MAX_OPS 256

static pg_rule op_rules[MAX_OPS];
static pg_rule unary_rules[MAX_OPS];
static pg_rule glu_rules[MAX_OPS];
static int op_unary = -1, op_glu = -1;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static int initialized;
static int rules_enabled = 1;

static const pg_named_rule * const tables[] = {PG_RULE_TABLES, NULL};
static const char * const families[] = {PG_RULE_FAMILIES, NULL};   /* tables[k] is rules_<families[k]>.c's */

int pyggml_rule_entry(int i, const char ** family, const char ** name) {
    for (int k = 0; tables[k] != NULL; k++) {
        for (const pg_named_rule * r = tables[k]; r->name != NULL; r++) {
            if (i-- == 0) {
                *family = families[k];
                *name = r->name;
                return 1;
            }
        }
    }
    return 0;
}

/* "ADD", "UNARY:RELU" or "GLU:SWIGLU" -> the slot of the linked ggml's op of that name */
static pg_rule * slot_of(const char * name) {
    const char * colon = strchr(name, ':');
    if (colon == NULL) {
        for (int i = 0; i < GGML_OP_COUNT && i < MAX_OPS; i++) {
            if (strcmp(ggml_op_name((enum ggml_op) i), name) == 0) {
                return &op_rules[i];
            }
        }
    } else if (strncmp(name, "UNARY:", 6) == 0) {
        for (int i = 0; i < GGML_UNARY_OP_COUNT && i < MAX_OPS; i++) {
            if (strcmp(ggml_unary_op_name((enum ggml_unary_op) i), colon + 1) == 0) {
                return &unary_rules[i];
            }
        }
    } else if (strncmp(name, "GLU:", 4) == 0) {
        for (int i = 0; i < GGML_GLU_OP_COUNT && i < MAX_OPS; i++) {
            if (strcmp(ggml_glu_op_name((enum ggml_glu_op) i), colon + 1) == 0) {
                return &glu_rules[i];
            }
        }
    }
    return NULL;     /* an op this ggml does not have */
}

/* Ops whose CPU kernel in the built tree is not the one their rule was written against
 * (pyggml/_kernels.py, generated pyggml_kernels.h): a node their rule lets through is
 * UNCHECKED, not OK, so its graph runs through the fenced, forked proof before it computes
 * here. A build without kernel source to fingerprint (a prebuilt ggml: pyggml_kernels_known()
 * is 0) trusts no kernel: every op is untrusted, so every graph is proven before its
 * first compute. A rule's refusals stand, except those marked as standing for the old
 * kernel's abort (pg_kernel_aborts): there the proof decides too. The proof answers Ctrl-C at
 * once (it runs on a worker thread) and copes with any graph size (csrc/guarded.c). */
static unsigned char untrusted[MAX_OPS];
static const char * const changed_kernels[] = {PG_KERNELS_CHANGED};
/* ops trusted by a review of another release's kernel (kernels.txt `OP DIGEST RELEASE`):
 * trusted to their rules as that release's kernels (kernel_release) */
static int reviewed_in[MAX_OPS];   /* the release (PG_RELEASE) of that review; 0: none */
static const char * const reviewed_kernels[] = {PG_KERNELS_REVIEWED};
static const int reviewed_releases[] = {PG_KERNELS_REVIEWED_IN};

static void init(void) {
    for (int i = 0; i < GGML_OP_COUNT && i < MAX_OPS; i++) {
        const char * name = ggml_op_name((enum ggml_op) i);
        if (strcmp(name, "UNARY") == 0) {
            op_unary = i;
        } else if (strcmp(name, "GLU") == 0) {
            op_glu = i;
        }
        untrusted[i] = !PG_KERNELS_KNOWN;
        for (int k = 0; PG_KERNELS_KNOWN && changed_kernels[k] != NULL; k++) {
            if (strcmp(changed_kernels[k], name) == 0) {
                untrusted[i] = 1;
            }
        }
        for (int k = 0; PG_KERNELS_KNOWN && reviewed_kernels[k] != NULL; k++) {
            if (strcmp(reviewed_kernels[k], name) == 0) {
                reviewed_in[i] = reviewed_releases[k];
            }
        }
    }
    for (int k = 0; tables[k] != NULL; k++) {
        for (const pg_named_rule * r = tables[k]; r->name != NULL; r++) {
            pg_rule * slot = slot_of(r->name);
            if (slot != NULL) {
                *slot = r->rule;
            }
        }
    }
}

void pyggml_checks_init(void) {
    pthread_once(&init_once, init);
    __atomic_store_n(&initialized, 1, __ATOMIC_RELEASE);
}

static inline void ensure_init(void) {
    if (!__atomic_load_n(&initialized, __ATOMIC_ACQUIRE)) {
        pyggml_checks_init();
    }
}

static pg_rule rule_for(int op, int sub_op) {
    if (op < 0 || op >= GGML_OP_COUNT || op >= MAX_OPS) {
        return NULL;
    }
    if (op == op_unary) {
        return sub_op >= 0 && sub_op < GGML_UNARY_OP_COUNT && sub_op < MAX_OPS ? unary_rules[sub_op] : NULL;
    }
    if (op == op_glu) {
        return sub_op >= 0 && sub_op < GGML_GLU_OP_COUNT && sub_op < MAX_OPS ? glu_rules[sub_op] : NULL;
    }
    return op_rules[op];
}

int pyggml_op_is_checked(int op, int sub_op) {
    ensure_init();
    return rule_for(op, sub_op) != NULL;
}

int pyggml_kernels_known(void) {
    return PG_KERNELS_KNOWN;
}

int pyggml_kernel_untrusted(int op) {
    ensure_init();
    return op >= 0 && op < GGML_OP_COUNT && op < MAX_OPS ? __atomic_load_n(&untrusted[op], __ATOMIC_RELAXED) : 1;
}

int pyggml_kernel_reviewed(int op) {
    ensure_init();
    return op >= 0 && op < GGML_OP_COUNT && op < MAX_OPS ? __atomic_load_n(&reviewed_in[op], __ATOMIC_RELAXED) : 0;
}

int pyggml_kernels_pinned_release(void) {
    return PG_KERNELS_PINNED_RELEASE;
}

/* the release whose kernel op's is (PG_RELEASE): a review's, or the pinned prints' for a
 * trusted kernel not reviewed; 0 for an untrusted one (or where the pinned release is unknown) */
static int kernel_release(int op) {
    ensure_init();
    if (op < 0 || op >= GGML_OP_COUNT || op >= MAX_OPS || __atomic_load_n(&untrusted[op], __ATOMIC_RELAXED)) {
        return 0;
    }
    int in = __atomic_load_n(&reviewed_in[op], __ATOMIC_RELAXED);
    return in > 0 ? in : PG_KERNELS_PINNED_RELEASE;
}

int pg_kernel_since(int op, int release) {
    int rel = kernel_release(op);
    return rel > 0 && rel >= release;
}

int pg_kernel_before(int op, int release) {
    int rel = kernel_release(op);
    return rel > 0 && rel < release;
}

int pyggml_kernel_release(int op) {
    return kernel_release(op);
}

int pyggml_kernel_set_reviewed(int op, int release) {
    ensure_init();
    if (op < 0 || op >= GGML_OP_COUNT || op >= MAX_OPS || release < 0) {
        return -1;
    }
    return __atomic_exchange_n(&reviewed_in[op], release, __ATOMIC_RELAXED);
}

int pyggml_kernel_set_untrusted(int op, int flag) {
    ensure_init();
    if (op < 0 || op >= GGML_OP_COUNT || op >= MAX_OPS) {
        return -1;
    }
    return __atomic_exchange_n(&untrusted[op], (unsigned char) (flag != 0), __ATOMIC_RELAXED);
}

/* --- what every node must be, whatever its op --------------------------------------------- */

/* ggml's builders compute a result's ne from their arguments without checking them (pad:
 * ne + lp + rp; interpolate, repeat_4d, im2col_back: ne as given; timestep_embedding:
 * dim), and ggml_new_tensor_impl sizes it in size_t without checking either: a negative ne
 * or a count past int64 makes a tensor whose byte count wraps (0 bytes for 2**64, a huge
 * one for -1), which a pool context refuses only by accident (the reservation fails) and a
 * no_alloc context keeps, for a kernel to loop over or a backend buffer to under-allocate.
 * Every node passes here before its op's rule, whatever made it (a builder, the backward
 * pass, a graph) and whether or not its op has a rule; only the switch that turns the
 * rules off for tests (pyggml_checks_set_enabled) turns this off too. */
#define PG_I64_MAX ((uint64_t) INT64_MAX)

/* a*b for a, b <= INT64_MAX: 0 when it exceeds INT64_MAX */
static int mul_fits(uint64_t a, uint64_t b, uint64_t * out) {
    if (a != 0 && b > PG_I64_MAX / a) {
        return 0;
    }
    *out = a * b;
    return 1;
}

#define NE_FMT "ne=(%lld, %lld, %lld, %lld) nb=(%zu, %zu, %zu, %zu)"
#define NE_ARGS(t) (long long) (t)->ne[0], (long long) (t)->ne[1], (long long) (t)->ne[2], (long long) (t)->ne[3], \
                   (t)->nb[0], (t)->nb[1], (t)->nb[2], (t)->nb[3]

static int check_shape(const struct ggml_tensor * t, pg_why * why) {
    const char * op = ggml_op_desc(t);
    for (int i = 0; i < GGML_MAX_DIMS; i++) {
        if (t->ne[i] < 0) {
            return pg_refuse(why, "the %s result has ne[%d] = %lld: a dimension cannot be negative (" NE_FMT ")",
                             op, i, (long long) t->ne[i], NE_ARGS(t));
        }
    }
    if (t->type < 0 || t->type >= GGML_TYPE_COUNT || ggml_blck_size(t->type) <= 0) {
        return pg_refuse_type(why, "the %s result has no valid ggml type (%d)", op, (int) t->type);
    }
    uint64_t n = 1;
    for (int i = 0; i < GGML_MAX_DIMS; i++) {
        if (!mul_fits(n, (uint64_t) t->ne[i], &n)) {
            return pg_refuse(why, "the %s result has more elements than int64 holds (ne[%d] = %lld takes the count "
                             "past 2**63 - 1; " NE_FMT ")", op, i, (long long) t->ne[i], NE_ARGS(t));
        }
    }
    if (n == 0) {
        return PYGGML_OK;        /* no data: nothing to size, no kernel runs on it */
    }
    /* what ggml_new_tensor_impl allocates: ggml_row_size(type, ne0) * ne1 * ne2 * ne3 (a
     * partial block counted whole: the view rules refuse rows of part of a block) */
    const uint64_t blck = (uint64_t) ggml_blck_size(t->type);
    uint64_t bytes = 0;
    if (!mul_fits(((uint64_t) t->ne[0] + blck - 1) / blck, ggml_type_size(t->type), &bytes)) {
        return pg_refuse(why, "the %s result's rows of ne[0] = %lld %s elements take more bytes than int64 holds ("
                         NE_FMT ")", op, (long long) t->ne[0], ggml_type_name(t->type), NE_ARGS(t));
    }
    for (int i = 1; i < GGML_MAX_DIMS; i++) {
        if (!mul_fits(bytes, (uint64_t) t->ne[i], &bytes)) {
            return pg_refuse(why, "the %s result takes more bytes than int64 holds (%s, ne[%d] = %lld takes the "
                             "byte count past 2**63 - 1; " NE_FMT ")", op, ggml_type_name(t->type), i,
                             (long long) t->ne[i], NE_ARGS(t));
        }
    }
    /* the bytes its strides reach, as ggml_nbytes counts them (a view or permutation can
     * reach further than its element count), from its offset in its source */
    uint64_t span = 0;
    for (int i = 0; i < GGML_MAX_DIMS; i++) {
        if (t->nb[i] > PG_I64_MAX) {
            goto too_far;
        }
    }
    if (blck == 1) {     /* ggml_nbytes: type size + sum (ne[i] - 1) * nb[i] */
        span = ggml_type_size(t->type);
        uint64_t reach = 0;
        if (!mul_fits((uint64_t) t->ne[0] - 1, t->nb[0], &reach) || reach > PG_I64_MAX - span) {
            goto too_far;
        }
        span += reach;
    } else {             /* ne[0] * nb[0] / block size + sum over i >= 1 */
        if (!mul_fits(((uint64_t) t->ne[0] + blck - 1) / blck, t->nb[0], &span)) {
            goto too_far;
        }
    }
    for (int i = 1; i < GGML_MAX_DIMS; i++) {
        uint64_t reach = 0;
        if (!mul_fits((uint64_t) t->ne[i] - 1, t->nb[i], &reach) || reach > PG_I64_MAX - span) {
            goto too_far;
        }
        span += reach;
    }
    if (t->view_offs > PG_I64_MAX - span) {
        goto too_far;
    }
    return PYGGML_OK;
too_far:
    return pg_refuse(why, "the %s result's strides reach past byte 2**63 - 1 (offset %zu, " NE_FMT ")", op,
                     t->view_offs, NE_ARGS(t));
}

int pyggml_check_node(const struct ggml_tensor * t, pyggml_status * st) {
    pg_why why = {st->msg, sizeof st->msg, NULL, 0};
    ensure_init();
    pyggml_status_clear(st);
    if (!__atomic_load_n(&rules_enabled, __ATOMIC_RELAXED)) {
        return st->code = PYGGML_UNCHECKED;
    }
    int rc = check_shape(t, &why);      /* first, whatever the op: see check_shape */
    if (rc == PYGGML_OK) {
        /* the unary/glu sub-op is op_params[0] (ggml_get_unary_op, ggml_get_glu_op) */
        pg_rule rule = rule_for((int) t->op, t->op_params[0]);
        if (rule == NULL) {
            return st->code = PYGGML_UNCHECKED;
        }
        if (ggml_is_empty(t)) {
            return PYGGML_OK;           /* ggml_compute_forward skips a node with no elements */
        }
        rc = rule(t, &why);
        if (__atomic_load_n(&untrusted[t->op], __ATOMIC_RELAXED)) {
            if (rc == PYGGML_OK) {
                return st->code = PYGGML_UNCHECKED;     /* its kernel changed: the rule is not enough */
            }
            if (why.aborts && why.defect == NULL) {     /* nor its refusal of what the old kernel aborted on */
                pyggml_status_clear(st);
                return st->code = PYGGML_UNCHECKED;
            }
        }
    }
    if (rc == PYGGML_REFUSED || rc == PYGGML_REFUSED_TYPE || rc == PYGGML_LACKS) {
        st->node = t;
        if (why.defect != NULL) {
            st->defect = why.defect;
            rc = PYGGML_DEFECT;
        }
    }
    return st->code = rc;
}

int pg_rules_enabled(void) {
    return __atomic_load_n(&rules_enabled, __ATOMIC_RELAXED);
}

int pyggml_checks_enabled(void) {
    return pg_rules_enabled();
}

/* defects of the kernels that a probe measured absent in the linked ggml (a fixed or
 * patched release): the rules that refuse them let their nodes through */
static int fab_batch_gqa_fixed = 0;

int pg_fab_batch_gqa_fixed(void) {
    return __atomic_load_n(&fab_batch_gqa_fixed, __ATOMIC_RELAXED);
}

void pyggml_set_fab_batch_gqa_fixed(int fixed) {
    __atomic_store_n(&fab_batch_gqa_fixed, fixed != 0, __ATOMIC_RELAXED);
}

int pyggml_checks_set_enabled(int enabled) {
    return __atomic_exchange_n(&rules_enabled, enabled != 0, __ATOMIC_RELAXED);
}
