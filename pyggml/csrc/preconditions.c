/* Kernel preconditions: the framework (the op -> rule table) and the shared predicates.
 * The rules themselves live in rules_*.c, one file per op family, and are listed in
 * rules.h. See preconditions.h for how a rule is written. */
#include "preconditions.h"

#include <pthread.h>
#include <string.h>

#include "rules.h"

int pg_refuse(pg_why * why, const char * fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (why->cap > 0) {
        vsnprintf(why->buf, why->cap, fmt, ap);
    }
    va_end(ap);
    return PYGGML_REFUSED;
}

int pg_refuse_type(pg_why * why, const char * fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (why->cap > 0) {
        vsnprintf(why->buf, why->cap, fmt, ap);
    }
    va_end(ap);
    return PYGGML_REFUSED_TYPE;
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

const char * pg_type(const struct ggml_tensor * t) {
    return t == NULL ? "NULL" : ggml_type_name(t->type);
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

static void init(void) {
    for (int i = 0; i < GGML_OP_COUNT && i < MAX_OPS; i++) {
        const char * name = ggml_op_name((enum ggml_op) i);
        if (strcmp(name, "UNARY") == 0) {
            op_unary = i;
        } else if (strcmp(name, "GLU") == 0) {
            op_glu = i;
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

int pyggml_check_node(const struct ggml_tensor * t, char * msg, size_t cap, const char ** defect) {
    pg_why why = {msg, cap, NULL};
    ensure_init();
    if (cap > 0) {
        msg[0] = '\0';
    }
    *defect = NULL;
    /* the unary/glu sub-op is op_params[0] (ggml_get_unary_op, ggml_get_glu_op) */
    pg_rule rule = rule_for((int) t->op, t->op_params[0]);
    if (rule == NULL || !__atomic_load_n(&rules_enabled, __ATOMIC_RELAXED)) {
        return PYGGML_UNCHECKED;
    }
    if (ggml_is_empty(t)) {
        return PYGGML_OK;       /* ggml_compute_forward skips a node with no elements */
    }
    int rc = rule(t, &why);
    *defect = why.defect;
    return rc;
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
