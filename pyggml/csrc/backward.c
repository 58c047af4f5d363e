/* Known defects of ggml's backward pass (ggml_compute_backward in ggml.c), checked on a
 * forward graph before pyggml builds its backward pass: pyggml refuses a backward pass
 * that ggml would get wrong, naming the defect (pyggml.defects), rather than hand back
 * a wrong gradient. Which tensors need a gradient is worked out as
 * ggml_build_backward_expand does. See pyggml_rt.h. */
#include "preconditions.h"

#include <string.h>

#include "ptrset.h"

static int same_shape(const struct ggml_tensor * a, const struct ggml_tensor * b) {
    return a->ne[0] == b->ne[0] && a->ne[1] == b->ne[1] && a->ne[2] == b->ne[2] && a->ne[3] == b->ne[3];
}

static int op_is(const struct ggml_tensor * t, const char * name) {
    return strcmp(ggml_op_name(t->op), name) == 0;
}

/* the sources ggml_build_backward_expand does not differentiate through */
static int ignored_src(const struct ggml_tensor * t, int j) {
    if (j == 0 && (op_is(t, "IM2COL") || op_is(t, "IM2COL_BACK"))) {
        return 1;
    }
    if (j == 0 && op_is(t, "UNARY")) {
        const char * u = ggml_unary_op_name((enum ggml_unary_op) t->op_params[0]);
        return strcmp(u, "SGN") == 0 || strcmp(u, "STEP") == 0;
    }
    if (j == 1 && (op_is(t, "CPY") || op_is(t, "GET_ROWS") || op_is(t, "GET_ROWS_BACK") || op_is(t, "ROPE"))) {
        return 1;
    }
    return 0;
}

/* The cases of ggml_compute_backward (ggml.c) and the sources each gives a gradient (bit j:
 * src j), read off its switch in 0.20.2 and 0.25.3 (the same there). An op without a case
 * reaches its default, GGML_ABORT; so do the unary and GLU ops without one. WIN_PART and
 * WIN_UNPART are not here although the switch names them: they fall through into UNARY's
 * case, whose ggml_get_unary_op asserts the op is UNARY. `asserted`:
 * the sources a case asserts need no gradient (SOFT_MAX's mask, ROPE's frequency factors,
 * CROSS_ENTROPY_LOSS's labels). Any other source that needs a gradient and gets none from
 * the case is dereferenced as a NULL gradient by the shape assertions after the switch
 * (a crash), unless a later node gave it one: check_given. Names, not enum values, so
 * that one source builds against a release that lacks an op. */
typedef struct backward_case {
    const char * op;
    const char * sub;      /* the unary / GLU op, or NULL */
    int sources;
    int asserted;
} backward_case;

static const backward_case backward_cases[] = {
    {"NONE", NULL, 0, 0}, {"DUP", NULL, 1, 0}, {"ADD", NULL, 3, 0}, {"ADD1", NULL, 3, 0}, {"ACC", NULL, 3, 0},
    {"SUB", NULL, 3, 0}, {"MUL", NULL, 3, 0}, {"DIV", NULL, 3, 0}, {"SQR", NULL, 1, 0}, {"SQRT", NULL, 1, 0},
    {"LOG", NULL, 1, 0}, {"SIN", NULL, 1, 0}, {"COS", NULL, 1, 0}, {"SUM", NULL, 1, 0}, {"SUM_ROWS", NULL, 1, 0},
    {"MEAN", NULL, 1, 0}, {"REPEAT", NULL, 1, 0}, {"REPEAT_BACK", NULL, 1, 0}, {"RMS_NORM", NULL, 1, 0},
    {"MUL_MAT", NULL, 3, 0}, {"SCALE", NULL, 1, 0}, {"SET", NULL, 3, 0}, {"CPY", NULL, 1, 0}, {"CONT", NULL, 1, 0},
    {"RESHAPE", NULL, 1, 0}, {"VIEW", NULL, 1, 0}, {"PERMUTE", NULL, 1, 0}, {"TRANSPOSE", NULL, 1, 0},
    {"GET_ROWS", NULL, 1, 0}, {"DIAG_MASK_INF", NULL, 1, 0}, {"DIAG_MASK_ZERO", NULL, 1, 0},
    {"SOFT_MAX", NULL, 1, 2}, {"ROPE", NULL, 1, 4}, {"IM2COL", NULL, 2, 0}, {"POOL_2D", NULL, 1, 0},
    {"CROSS_ENTROPY_LOSS", NULL, 1, 2},
    {"UNARY", "ABS", 1, 0}, {"UNARY", "SGN", 0, 0}, {"UNARY", "NEG", 1, 0}, {"UNARY", "STEP", 0, 0},
    {"UNARY", "RELU", 1, 0}, {"UNARY", "SILU", 1, 0}, {"UNARY", "EXP", 1, 0}, {"UNARY", "EXPM1", 1, 0},
    {"UNARY", "SOFTPLUS", 1, 0}, {"GLU", "SWIGLU", 3, 0},
};

static const backward_case * find_case(const char * op, const char * sub) {
    for (size_t i = 0; i < sizeof backward_cases / sizeof backward_cases[0]; i++) {
        const backward_case * c = &backward_cases[i];
        if (strcmp(c->op, op) == 0 && (c->sub == NULL || (sub != NULL && strcmp(c->sub, sub) == 0))) {
            return c;
        }
    }
    return NULL;
}

int pyggml_backward_sources(const char * op, const char * sub) {
    const backward_case * c = find_case(op, sub);
    return c != NULL ? c->sources : -1;
}

static const char * sub_name(const struct ggml_tensor * t) {
    if (op_is(t, "UNARY")) {
        return ggml_unary_op_name((enum ggml_unary_op) t->op_params[0]);
    }
    if (op_is(t, "GLU")) {
        return ggml_glu_op_name((enum ggml_glu_op) t->op_params[0]);
    }
    return NULL;
}

static void node_op(const struct ggml_tensor * t, char * op, size_t cap) {
    const char * sub = sub_name(t);
    snprintf(op, cap, "%s%s%s", ggml_op_name(t->op), sub != NULL ? ":" : "", sub != NULL ? sub : "");
}

/* A node the backward pass reaches with a gradient (needs: which of its sources need one,
 * ignored or not): PYGGML_OK, or PYGGML_NO_BACKWARD where ggml_compute_backward would
 * abort in its switch. */
static int check_has_backward(const struct ggml_tensor * t, int i, const int * needs, pg_why * why) {
    char op[96];
    node_op(t, op, sizeof op);
    const backward_case * c = find_case(ggml_op_name(t->op), sub_name(t));
    if (c == NULL) {
        return pg_no_backward(why, "node %d '%s' (%s): ggml's backward pass has no gradient for %s (ggml_compute_backward "
                              "would abort; pyggml.differentiable says which ops have one)", i, t->name, op, op);
    }
    if (op_is(t, "GLU") && t->src[1] == NULL && needs[0]) {
        return pg_no_backward(why, "node %d '%s' (%s) of one tensor: ggml's backward pass differentiates the split form "
                              "only (swiglu_split), and would abort", i, t->name, op);
    }
    for (int j = 0; j < GGML_MAX_SRC; j++) {
        if (needs[j] && (c->asserted & (1 << j))) {
            return pg_no_backward(why, "node %d '%s' (%s): ggml's backward pass has no gradient for its src%d, which "
                                  "depends on a parameter, and asserts so (it would abort)", i, t->name, op, j);
        }
    }
    return PYGGML_OK;
}

static int ptrset_has(pg_ptrset * s, const void * p) {
    int added = pg_ptrset_add(s, (uintptr_t) p);
    if (added == 1) {
        pg_ptrset_discard(s, (uintptr_t) p);
    }
    return added == 0;
}

/* Whether two of the elements that strides nb (over ne, elements of elsize bytes) reach
 * share bytes: the dims taken by increasing stride, each must step past the span of
 * the ones before it. Exact for the layouts views make (strides that nest). */
static int strides_overlap(const int64_t ne[4], const size_t nb[4], size_t elsize) {
    int order[4], k = 0;
    for (int d = 0; d < 4; d++) {
        if (ne[d] > 1) {
            int j = k++;
            while (j > 0 && nb[order[j - 1]] > nb[d]) {
                order[j] = order[j - 1];
                j--;
            }
            order[j] = d;
        }
    }
    size_t span = elsize;
    for (int i = 0; i < k; i++) {
        if (nb[order[i]] < span) {
            return 1;
        }
        span += nb[order[i]] * (size_t) (ne[order[i]] - 1);
    }
    return 0;
}

int pyggml_check_backward(struct ggml_cgraph * graph, pyggml_status * st) {
    pg_why why = {st->msg, sizeof st->msg, NULL, 0};
    pg_ptrset needs = {0};      /* tensors whose gradient is needed (params and what they feed) */
    pg_ptrset has = {0};        /* nodes that get a gradient (a loss, or what feeds one) */
    int rc = PYGGML_OK;
    pyggml_status_clear(st);
    if (!pg_rules_enabled()) {
        return PYGGML_OK;
    }
    int n = ggml_graph_n_nodes(graph);
    /* backwards from the losses: which nodes ggml_compute_backward will see a gradient of */
    for (int i = n - 1; i >= 0; i--) {
        struct ggml_tensor * t = ggml_graph_node(graph, i);
        if (!(t->flags & GGML_TENSOR_FLAG_LOSS) && !ptrset_has(&has, t)) {
            continue;
        }
        pg_ptrset_add(&has, (uintptr_t) t);
        for (int j = 0; j < GGML_MAX_SRC; j++) {
            if (t->src[j] != NULL && !ignored_src(t, j)) {
                pg_ptrset_add(&has, (uintptr_t) t->src[j]);
            }
        }
    }
    for (int i = 0; i < n && rc == PYGGML_OK; i++) {
        struct ggml_tensor * t = ggml_graph_node(graph, i);
        if (t->type == GGML_TYPE_I32) {
            continue;
        }
        int need = (t->flags & GGML_TENSOR_FLAG_PARAM) || (t->flags & GGML_TENSOR_FLAG_LOSS);
        int src_needs[GGML_MAX_SRC] = {0};      /* the sources that make this node need a gradient */
        int raw_needs[GGML_MAX_SRC] = {0};      /* ignored by that or not: ggml_compute_backward's */
        for (int j = 0; j < GGML_MAX_SRC; j++) {
            struct ggml_tensor * s = t->src[j];
            raw_needs[j] = s != NULL && ptrset_has(&needs, s);
            if (raw_needs[j] && !ignored_src(t, j)) {
                src_needs[j] = 1;
                need = 1;
            }
        }
        if (!need) {
            continue;
        }
        /* ggml_build_backward_expand asserts these of every node that needs a gradient */
        for (int j = 0; j < GGML_MAX_SRC; j++) {
            if (src_needs[j]) {   /* the first such source only: ggml stops there */
                if (t->src[j]->type != GGML_TYPE_F32 && t->src[j]->type != GGML_TYPE_F16) {
                    rc = pg_refuse_type(&why, "node %d '%s' (%s): its src%d is %s; ggml's backward pass "
                                        "differentiates F32 and F16 tensors only", i, t->name,
                                        ggml_op_name(t->op), j, ggml_type_name(t->src[j]->type));
                    st->node = t;
                }
                break;
            }
        }
        if (rc == PYGGML_OK && t->view_src != NULL && !op_is(t, "CPY") && !op_is(t, "SET_ROWS") && !op_is(t, "VIEW") &&
            !op_is(t, "RESHAPE") && !op_is(t, "PERMUTE") && !op_is(t, "TRANSPOSE")) {
            rc = pg_no_backward(&why, "node %d '%s' (%s) is in place (a view of its source's memory): ggml's backward "
                             "pass takes no in-place ops and would abort; use the op's out-of-place form", i,
                             t->name, ggml_op_name(t->op));
            st->node = t;
        }
        if (rc != PYGGML_OK) {
            break;
        }
        pg_ptrset_add(&needs, (uintptr_t) t);
        if (!ptrset_has(&has, t)) {
            continue;           /* no gradient flows back through this node */
        }
        rc = check_has_backward(t, i, raw_needs, &why);
        if (rc != PYGGML_OK) {
            st->node = t;
            break;
        }
        /* ggml.c, case GGML_OP_ADD1: the gradient of the scalar b is ggml_mean(grad), not its sum */
        if (op_is(t, "ADD1") && src_needs[1]) {
            why.defect = PG_DEFECT_ADD1_GRAD_MEAN;
            rc = pg_refuse(&why, "node %d (ADD1): ggml's backward pass gives the scalar b the mean of the "
                           "output gradient where the sum belongs (wrong by a factor of %lld)", i,
                           (long long) ggml_nelements(t));
        }
        /* ggml.c, cases GGML_OP_SUB / GGML_OP_DIV: the gradient of a broadcast b is not reduced */
        if ((op_is(t, "SUB") || op_is(t, "DIV")) && src_needs[1] && !same_shape(t->src[0], t->src[1])) {
            why.defect = PG_DEFECT_SUB_DIV_BROADCAST_GRAD;
            rc = pg_refuse(&why, "node %d (%s): ggml's backward pass cannot differentiate a broadcast b "
                           "(b ne=(%lld, %lld, %lld, %lld) against a ne=(%lld, %lld, %lld, %lld)): it would abort",
                           i, ggml_op_name(t->op), (long long) t->src[1]->ne[0], (long long) t->src[1]->ne[1],
                           (long long) t->src[1]->ne[2], (long long) t->src[1]->ne[3],
                           (long long) t->src[0]->ne[0], (long long) t->src[0]->ne[1],
                           (long long) t->src[0]->ne[2], (long long) t->src[0]->ne[3]);
        }
        /* ggml.c, case GGML_OP_SOFT_MAX: the gradient goes through ggml_soft_max_ext_back with the
         * forward's max_bias, and its CPU kernel asserts max_bias == 0 */
        if (op_is(t, "SOFT_MAX") && src_needs[0]) {
            float max_bias;
            memcpy(&max_bias, (const float *) t->op_params + 1, sizeof max_bias);
            if (max_bias != 0.0f) {
                why.defect = PG_DEFECT_SOFT_MAX_ALIBI_GRAD;
                rc = pg_refuse(&why, "node %d (SOFT_MAX) with max_bias=%g (ALiBi): ggml's backward pass builds a "
                               "SOFT_MAX_BACK whose CPU kernel asserts max_bias == 0", i, (double) max_bias);
            }
        }
        /* ggml.c, case GGML_OP_MUL_MAT: a's gradient, out_prod(b, grad), is summed back over a
         * broadcast a by a 4-d view that asserts b has ne[3] == 1 */
        if (op_is(t, "MUL_MAT") && src_needs[0] && t->src[1]->ne[3] > 1 &&
            (t->src[0]->ne[2] != t->src[1]->ne[2] || t->src[0]->ne[3] != t->src[1]->ne[3])) {
            why.defect = PG_DEFECT_MUL_MAT_BROADCAST_GRAD;
            rc = pg_refuse(&why, "node %d (MUL_MAT) of a broadcast a (ne2, ne3 = %lld, %lld) by b (%lld, %lld): "
                           "ggml's backward pass asserts b's ne[3] == 1 for a's gradient and would abort", i,
                           (long long) t->src[0]->ne[2], (long long) t->src[0]->ne[3],
                           (long long) t->src[1]->ne[2], (long long) t->src[1]->ne[3]);
        }
        /* ggml.c, cases GGML_OP_VIEW and GGML_OP_SET: the gradient goes through ACC (or a view
         * of the gradient) with the view's strides; when they make elements overlap, ACC
         * writes instead of adding, and SET's b gets the gradient of elements it overwrote */
        if ((op_is(t, "VIEW") && src_needs[0]) || (op_is(t, "SET") && src_needs[1])) {
            const int is_set = op_is(t, "SET");
            const struct ggml_tensor * v = is_set ? t->src[1] : t;
            const int32_t * p = (const int32_t *) t->op_params;
            const size_t nb[4] = {ggml_type_size(t->type), is_set ? (size_t) p[0] : t->nb[1],
                                  is_set ? (size_t) p[1] : t->nb[2], is_set ? (size_t) p[2] : t->nb[3]};
            if (ggml_blck_size(t->type) == 1 && strides_overlap(v->ne, nb, nb[0])) {
                why.defect = PG_DEFECT_VIEW_GRAD_OVERLAP;
                rc = pg_refuse(&why, "node %d (%s) whose strides (%zu, %zu, %zu, %zu) over ne=(%lld, %lld, %lld, "
                               "%lld) reach some elements twice: ggml's backward pass would overwrite their "
                               "gradients where it should add them", i, ggml_op_name(t->op), nb[0], nb[1], nb[2],
                               nb[3], (long long) v->ne[0], (long long) v->ne[1], (long long) v->ne[2],
                               (long long) v->ne[3]);
            }
        }
        /* ggml.c, case GGML_OP_ROPE: the gradient is ggml_rope_ext_back / ggml_rope_multi_back
         * with the forward's parameters read one by one, all but the offset of the rotated block
         * (op_params[15], ggml_rope_set_offset): it rotates the gradient's first n_dims
         * elements back, not the block the forward rotated */
        if (op_is(t, "ROPE") && src_needs[0] && ((const int32_t *) t->op_params)[15] != 0) {
            why.defect = PG_DEFECT_ROPE_OFFSET_GRAD;
            rc = pg_refuse(&why, "node %d (ROPE) rotates the block at offset %d (ggml_rope_set_offset): ggml's "
                           "backward pass builds its ROPE_BACK without the offset, and would rotate the wrong "
                           "elements of the gradient", i, (int) ((const int32_t *) t->op_params)[15]);
        }
        /* ggml.c, case GGML_OP_MEAN: ggml_add1_or_set of a [1, ne1, ne2, ne3] gradient: when src0
         * already has a gradient (from a later node, the backward pass runs in reverse), that is
         * ggml_add1 of a non-scalar, which asserts */
        if (op_is(t, "MEAN") && src_needs[0] && ggml_nelements(t) > 1) {
            for (int k = i + 1; k < n && rc == PYGGML_OK; k++) {
                struct ggml_tensor * u = ggml_graph_node(graph, k);
                if (!ptrset_has(&has, u)) {
                    continue;
                }
                for (int j = 0; j < GGML_MAX_SRC; j++) {
                    if (u->src[j] == t->src[0] && !ignored_src(u, j)) {
                        why.defect = PG_DEFECT_MEAN_GRAD_ACCUMULATE;
                        rc = pg_refuse(&why, "node %d (MEAN) of a tensor that node %d (%s) also uses: ggml's "
                                       "backward pass would add the mean's gradient with ggml_add1, which takes "
                                       "a scalar only, and abort", i, k, ggml_op_name(u->op));
                        break;
                    }
                }
            }
        }
    }
    /* ggml_compute_backward runs from the last node to the first, and after its switch
     * asserts the shape of the gradient of every source that needs one: where neither the
     * node's case nor a later node gave that source a gradient, the gradient is NULL and
     * the assertion dereferences it */
    pg_ptrset given = {0};
    for (int i = n - 1; i >= 0 && rc == PYGGML_OK; i--) {
        struct ggml_tensor * t = ggml_graph_node(graph, i);
        if (!ptrset_has(&needs, t) || !ptrset_has(&has, t)) {
            continue;
        }
        const backward_case * c = find_case(ggml_op_name(t->op), sub_name(t));
        for (int j = 0; j < GGML_MAX_SRC && c != NULL; j++) {
            struct ggml_tensor * s = t->src[j];
            if (s == NULL || !ptrset_has(&needs, s)) {
                continue;
            }
            if (c->sources & (1 << j)) {
                pg_ptrset_add(&given, (uintptr_t) s);
            } else if (!ptrset_has(&given, s)) {
                char op[96];
                node_op(t, op, sizeof op);
                rc = pg_no_backward(&why, "node %d '%s' (%s): ggml's backward pass gives its src%d ('%s') no gradient, "
                                    "though that source needs one (it is a parameter or depends on one) and no "
                                    "later node gives it one: ggml would read a NULL gradient (a crash)", i, t->name,
                                    op, j, s->name);
                st->node = t;
                break;
            }
        }
    }
    pg_ptrset_free(&given);
    pg_ptrset_free(&needs);
    pg_ptrset_free(&has);
    if (rc != PYGGML_OK) {
        st->defect = why.defect;
        rc = why.defect != NULL ? PYGGML_DEFECT : rc;
    }
    return st->code = rc;
}
