/* Guarded calls into ggml-alloc: the graph allocator asserts on what it cannot place
 * (see pyggml_rt.h, the abort guard). */
#include "pyggml_rt.h"

#include "ggml-alloc.h"

int pyggml_try_gallocr_alloc_graph(pyggml_guard * g, ggml_gallocr_t galloc, struct ggml_cgraph * graph, int * ok) {
    pyggml_guard_enter(g);
    if (setjmp(g->env) == 0) {
        *ok = ggml_gallocr_alloc_graph(galloc, graph);
        pyggml_guard_leave(g);
        return 1;
    }
    return 0;
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

int pyggml_opt_dry_run(pyggml_opt_probe * probe, double timeout_s, char * msg, size_t cap, int * how) {
    return pyggml_dry_run(opt_probe, probe, timeout_s, msg, cap, how);
}
