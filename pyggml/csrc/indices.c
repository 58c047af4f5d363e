/* Index data: ops that read positions from a tensor's values (rows to gather or
 * scatter, experts, states). Their kernels assert the range (GET_ROWS) or do not check
 * it at all (SET_ROWS, ADD_ID, MUL_MAT_ID, SSM_SCAN read or write out of bounds), and
 * no rule can see values before they exist. The executor (pyggml._cpu) checks each such
 * node's indices just before the node computes. See pyggml_rt.h. */
#include "preconditions.h"

#include <stdlib.h>
#include <string.h>

typedef struct index_op {
    const char * op;
    int src;                    /* the source holding the indices */
    int bound_src;              /* the tensor whose dim `bound_dim` they index; -1: the result */
    int bound_dim;
    const char * what;
} index_op;

static const index_op INDEX_OPS[] = {
    /* ops.cpp ggml_compute_forward_get_rows_*: rows of src0 (asserted) */
    {"GET_ROWS", 1, 0, 1, "rows of src0"},
    /* ops.cpp ggml_compute_forward_get_rows_back_*: rows of the result (unchecked) */
    {"GET_ROWS_BACK", 1, -1, 1, "rows of the result"},
    /* ops.cpp ggml_compute_forward_set_rows: rows of the result, a view of a (unchecked) */
    {"SET_ROWS", 1, -1, 1, "rows of the destination"},
    /* ops.cpp ggml_compute_forward_add_id_f32: rows of src1 (unchecked) */
    {"ADD_ID", 2, 1, 1, "rows of b"},
    /* ggml-cpu.c ggml_compute_forward_mul_mat_id: experts, dim 2 of src0 (unchecked) */
    {"MUL_MAT_ID", 2, 0, 2, "experts (dim 2 of as)"},
    /* ops.cpp ggml_compute_forward_ssm_scan_f32: states, dim 3 of src0 (unchecked) */
    {"SSM_SCAN", 6, 0, 3, "states (dim 3 of s)"},
    {NULL, 0, 0, 0, NULL},
};

static const index_op * find(const struct ggml_tensor * t) {
    const char * name = ggml_op_name(t->op);
    for (const index_op * o = INDEX_OPS; o->op != NULL; o++) {
        if (strcmp(o->op, name) == 0) {
            return o;
        }
    }
    return NULL;
}

struct ggml_tensor * pyggml_index_tensor(const struct ggml_tensor * t) {
    const index_op * o = find(t);
    return o == NULL ? NULL : t->src[o->src];
}

int pyggml_check_indices(const struct ggml_tensor * t, pyggml_status * st) {
    const index_op * o = find(t);
    pyggml_status_clear(st);
    if (o == NULL || t->src[o->src] == NULL) {
        return PYGGML_OK;
    }
    const struct ggml_tensor * idx = t->src[o->src];
    const struct ggml_tensor * of = o->bound_src < 0 ? t : t->src[o->bound_src];
    if (of == NULL || idx->data == NULL) {
        return PYGGML_OK;
    }
    const int64_t bound = of->ne[o->bound_dim];
    if (idx->type != GGML_TYPE_I32 && idx->type != GGML_TYPE_I64) {
        return PYGGML_OK;       /* the node's rule refuses other types */
    }
    for (int64_t i3 = 0; i3 < idx->ne[3]; i3++) {
        for (int64_t i2 = 0; i2 < idx->ne[2]; i2++) {
            for (int64_t i1 = 0; i1 < idx->ne[1]; i1++) {
                for (int64_t i0 = 0; i0 < idx->ne[0]; i0++) {
                    const char * p = (const char *) idx->data + i0 * idx->nb[0] + i1 * idx->nb[1] +
                                     i2 * idx->nb[2] + i3 * idx->nb[3];
                    int64_t v = idx->type == GGML_TYPE_I32 ? (int64_t) *(const int32_t *) p : *(const int64_t *) p;
                    if (v < 0 || v >= bound) {
                        return pyggml_status_set(st, PYGGML_BAD_INDEX, 0, NULL, t,
                                                 "%s: index %lld at (%lld, %lld, %lld, %lld) of src%d is outside "
                                                 "the %lld %s", ggml_op_name(t->op), (long long) v, (long long) i0,
                                                 (long long) i1, (long long) i2, (long long) i3, o->src,
                                                 (long long) bound, o->what);
                    }
                }
            }
        }
    }
    return PYGGML_OK;
}

/* --- computing a graph whose index ops are checked just before they run --------------- */

#include "ggml-cpu.h"
#include "pyggml_config.h"

static int produced_in_graph(struct ggml_cgraph * graph, int upto, const struct ggml_tensor * t) {
    const struct ggml_tensor * base = t->view_src != NULL ? t->view_src : t;
    for (int i = 0; i < upto; i++) {
        const struct ggml_tensor * n = ggml_graph_node(graph, i);
        const struct ggml_tensor * nb = n->view_src != NULL ? n->view_src : n;
        if (nb == base && n->op != GGML_OP_NONE) {
            return 1;
        }
    }
    return 0;
}

int pyggml_check_ready_indices(struct ggml_cgraph * graph, pyggml_status * st) {
    const int n = ggml_graph_n_nodes(graph);
    pyggml_status_clear(st);
    for (int i = 0; i < n; i++) {
        struct ggml_tensor * t = ggml_graph_node(graph, i);
        struct ggml_tensor * idx = pyggml_index_tensor(t);
        if (idx != NULL && !produced_in_graph(graph, i, idx) && pyggml_check_indices(t, st) != PYGGML_OK) {
            return st->code;
        }
    }
    return PYGGML_OK;
}

static enum ggml_status compute_cplan(struct ggml_cgraph * graph, void * plan) {
    return ggml_graph_compute(graph, (struct ggml_cplan *) plan);
}

int pyggml_compute_checked(struct ggml_cgraph * graph, struct ggml_cplan * plan, pyggml_status * st) {
    return pyggml_compute_checked_with(graph, compute_cplan, plan, st);
}

int pyggml_compute_checked_with(struct ggml_cgraph * graph, pyggml_compute_fn compute, void * arg,
                                pyggml_status * st) {
    const int n = ggml_graph_n_nodes(graph);
    int late = 0;
    pyggml_status_clear(st);
    /* indices that exist before the graph runs: check them all first */
    for (int i = 0; i < n; i++) {
        struct ggml_tensor * t = ggml_graph_node(graph, i);
        struct ggml_tensor * idx = pyggml_index_tensor(t);
        if (idx == NULL) {
            continue;
        }
        if (produced_in_graph(graph, i, idx)) {
            late++;
        } else if (pyggml_check_indices(t, st) != PYGGML_OK) {
            return st->code;
        }
    }
    if (late == 0) {
        return pyggml_status_from_ggml(st, compute(graph, arg));
    }
#if PYGGML_HAVE_COMPUTE_FLAG
    /* indices the graph computes: run it in segments that end before each such node
     * (nodes outside the segment lose GGML_TENSOR_FLAG_COMPUTE, which ggml skips), and
     * check the node's indices in between */
    int32_t * flags = malloc(sizeof(int32_t) * (size_t) (n > 0 ? n : 1));
    if (flags == NULL) {
        return pyggml_status_set(st, PYGGML_OUT_OF_MEMORY, 0, NULL, NULL, "no memory for the graph's %d flags", n);
    }
    for (int i = 0; i < n; i++) {
        flags[i] = ggml_graph_node(graph, i)->flags;
    }
    int start = 0;
    while (start < n && st->code == PYGGML_OK) {
        int end = start + 1;
        while (end < n) {
            struct ggml_tensor * t = ggml_graph_node(graph, end);
            struct ggml_tensor * idx = pyggml_index_tensor(t);
            if (idx != NULL && produced_in_graph(graph, end, idx)) {
                break;
            }
            end++;
        }
        for (int i = 0; i < n; i++) {
            struct ggml_tensor * t = ggml_graph_node(graph, i);
            t->flags = (i >= start && i < end) ? flags[i] : (flags[i] & ~GGML_TENSOR_FLAG_COMPUTE);
        }
        if (pyggml_status_from_ggml(st, compute(graph, arg)) == PYGGML_OK && end < n) {
            pyggml_check_indices(ggml_graph_node(graph, end), st);
        }
        start = end;
    }
    for (int i = 0; i < n; i++) {
        ggml_graph_node(graph, i)->flags = flags[i];
    }
    free(flags);
    return st->code;
#else
    return pyggml_status_set(st, PYGGML_NO_SEGMENTS, 0, NULL, NULL,
                             "this ggml has no GGML_TENSOR_FLAG_COMPUTE: pyggml cannot check the indices a graph "
                             "computes before the node that reads them (ggml >= 0.13 can)");
#endif
}
