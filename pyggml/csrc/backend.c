/* Guarded calls into ggml-alloc: the graph allocator asserts on what it cannot place
 * (see pyggml_rt.h, the abort guard). */
#include <errno.h>
#include "pyggml_rt.h"

#include "ggml-alloc.h"
#include "ggml-backend.h"

int pyggml_try_gallocr_alloc_graph(pyggml_guard * g, ggml_gallocr_t galloc, struct ggml_cgraph * graph, int * ok) {
    pyggml_guard_enter(g);
    if (setjmp(g->env) == 0) {
        *ok = ggml_gallocr_alloc_graph(galloc, graph);
        pyggml_guard_leave(g);
        return 1;
    }
    return 0;
}

int pyggml_try_sched_alloc_graph(pyggml_guard * g, ggml_backend_sched_t sched, struct ggml_cgraph * graph, int * ok) {
    pyggml_guard_enter(g);
    if (setjmp(g->env) == 0) {
        *ok = pyggml_sched_alloc_graph_nothrow(sched, graph);
        pyggml_guard_leave(g);
        return 1;
    }
    return 0;
}

/* --- threads ---------------------------------------------------------------------------- */
int pyggml_backend_set_n_threads(ggml_backend_t backend, int n_threads) {
    typedef void (*set_n_threads_fn)(ggml_backend_t, int);   /* ggml_backend_set_n_threads_t */
    ggml_backend_dev_t dev = ggml_backend_get_device(backend);
    ggml_backend_reg_t reg = dev != NULL ? ggml_backend_dev_backend_reg(dev) : NULL;
    set_n_threads_fn set =
        reg != NULL ? (set_n_threads_fn) ggml_backend_reg_get_proc_address(reg, "ggml_backend_set_n_threads") : NULL;
    if (set == NULL) {
        return 0;
    }
    set(backend, n_threads);
    return 1;
}

/* --- ggml_backend_compare_graph_backend ------------------------------------------------ */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "pyggml_config.h"

/* a contiguous tensor's values as doubles (NULL: a type or layout not compared, or no memory) */
static double * values_of(const struct ggml_tensor * t, int * oom) {
    const int64_t n = ggml_nelements(t);
    const struct ggml_type_traits * tr = ggml_get_type_traits(t->type);
    if (!ggml_is_contiguous(t) || n <= 0 || n > ((int64_t) 1 << 31)) {
        return NULL;
    }
    if (t->type != GGML_TYPE_F32 && t->type != GGML_TYPE_I32 && tr->to_float == NULL) {
        return NULL;
    }
    void * raw = malloc(ggml_nbytes(t));
    double * out = malloc((size_t) n * sizeof(double));
    float * f = t->type == GGML_TYPE_F32 || t->type == GGML_TYPE_I32 ? NULL : malloc((size_t) n * sizeof(float));
    if (raw == NULL || out == NULL || (f == NULL && t->type != GGML_TYPE_F32 && t->type != GGML_TYPE_I32)) {
        free(raw); free(out); free(f);
        *oom = 1;
        return NULL;
    }
    ggml_backend_tensor_get(t, raw, 0, ggml_nbytes(t));
    if (t->type == GGML_TYPE_F32) {
        for (int64_t i = 0; i < n; i++) out[i] = ((const float *) raw)[i];
    } else if (t->type == GGML_TYPE_I32) {
        for (int64_t i = 0; i < n; i++) out[i] = ((const int32_t *) raw)[i];
    } else {
        tr->to_float(raw, f, n);
        for (int64_t i = 0; i < n; i++) out[i] = f[i];
    }
    free(raw);
    free(f);
    return out;
}

static bool compare_node(int index, struct ggml_tensor * t1, struct ggml_tensor * t2, void * user_data) {
    pyggml_graph_cmp * st = user_data;
    if (index < 0 || index >= st->n_rows) {
        return true;
    }
    pyggml_node_cmp * r = &st->rows[index];
    r->index = index;
    int oom = 0;
    double * a = values_of(t1, &oom);
    double * b = a != NULL ? values_of(t2, &oom) : NULL;
    if (a == NULL || b == NULL) {
        free(a);
        free(b);
        st->failed |= oom;
        return !oom;
    }
    const int64_t n = ggml_nelements(t1);
    double num = 0.0, den = 0.0, mx = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(a[i]) && isnan(b[i])) {
            continue;                       /* the same non-number on both */
        }
        if (isinf(a[i]) && a[i] == b[i]) {
            continue;
        }
        const double d = b[i] - a[i];
        num += d * d;
        den += a[i] * a[i];
        mx = fabs(d) > mx || isnan(d) ? fabs(d) : mx;
    }
    free(a);
    free(b);
    r->compared = 1;
    r->n = n;
    r->nmse = den == 0.0 ? (num == 0.0 ? 0.0 : INFINITY) : num / den;
    if (isnan(num)) {
        r->nmse = INFINITY;
    }
    r->max_abs = mx;
    if (r->nmse > st->tolerance && st->first_diverging < 0) {
        st->first_diverging = index;
        return !st->stop_at_first;
    }
    return true;
}

int pyggml_compare_graph(ggml_backend_t b1, ggml_backend_t b2, struct ggml_cgraph * graph, pyggml_graph_cmp * state) {
    state->first_diverging = -1;
    state->failed = 0;
#if PYGGML_HAVE_COMPARE_GRAPH
    return ggml_backend_compare_graph_backend(b1, b2, graph, compare_node, state, NULL, 0) ? 1 : 0;
#else
    (void) b1; (void) b2; (void) graph; (void) compare_node;
    return -1;
#endif
}

/* --- ggml-opt ---------------------------------------------------------------------------- */
#include "ggml-cpu.h"
#include "ggml-opt.h"

struct ggml_opt_optimizer_params pyggml_opt_params_of(void * userdata) {
    /* ggml-opt's optimizer-parameter callback: the parameters pyggml validated and
     * stored before the epoch (userdata is a struct ggml_opt_optimizer_params *) */
    return *(const struct ggml_opt_optimizer_params *) userdata;
}

static void opt_probe(void * arg) {
    /* in the forked child: one thread (libgomp cannot start threads in a child forked
     * after OpenMP threads ran in its parent), build, allocate, one training batch */
    pyggml_opt_probe * p = arg;
    if (p->cpu != NULL) {
        ggml_backend_cpu_set_n_threads(p->cpu, 1);
    }
    ggml_opt_context_t opt = ggml_opt_init(p->params);
    ggml_opt_alloc(opt, true);
    ggml_opt_dataset_get_batch(p->dataset, ggml_opt_inputs(opt), ggml_opt_labels(opt), 0);
    ggml_opt_result_t result = ggml_opt_result_init();
    ggml_opt_eval(opt, result);
}

int pyggml_opt_dry_run(pyggml_opt_probe * probe, double timeout_s, const int * abort, pyggml_status * st) {
    int how = 0;
    const int rc = pyggml_dry_run(opt_probe, probe, timeout_s, abort, st->msg, sizeof st->msg, &how);
    return pyggml_status_from_dry_run(st, rc, rc < 0 ? errno : how, timeout_s);
}

/* --- ggml-opt over an RPC server: under the abort guard, on remote_call's worker ------------
 * The forked proof cannot reach an RPC server (a child has no ggml-rpc dispatcher thread):
 * over one, ggml-opt's calls run under the abort guard instead, on the worker thread, so that
 * an assertion of ggml-opt's is a GGMLAbort (the optimizer's state is then not to be trusted:
 * pyggml._opt gives it up). Each returns 1, or 0 when ggml aborted (g->message says how). */
int pyggml_try_opt_init(pyggml_guard * g, struct ggml_opt_params params, ggml_opt_context_t * out) {
    pyggml_guard_enter(g);
    if (setjmp(g->env) == 0) {
        *out = pyggml_opt_init_nothrow(params);
        pyggml_guard_leave(g);
        return 1;
    }
    return 0;
}

int pyggml_try_opt_epoch(pyggml_guard * g, pyggml_epoch * e) {
    pyggml_guard_enter(g);
    if (setjmp(g->env) == 0) {
        pyggml_opt_epoch_nothrow(e, NULL);
        pyggml_guard_leave(g);
        return 1;
    }
    return 0;
}

int pyggml_try_opt_reset(pyggml_guard * g, ggml_opt_context_t opt, int optimizer) {
    pyggml_guard_enter(g);
    if (setjmp(g->env) == 0) {
        ggml_opt_reset(opt, optimizer != 0);
        pyggml_guard_leave(g);
        return 1;
    }
    return 0;
}
