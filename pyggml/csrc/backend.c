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
