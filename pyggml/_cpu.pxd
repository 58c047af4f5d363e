# cython: language_level=3
# The CPU executor's checks, for the backend executor (pyggml._backend) to share: one
# place for each of them.

from pyggml._ggml cimport ggml_cplan, ggml_status, ggml_threadpool
from pyggml._ggml_backend cimport ggml_backend_t
from pyggml._graph cimport Graph
from pyggml._rt cimport pyggml_async, pyggml_status

cdef ggml_cplan _plan(Graph graph, int n_threads, ggml_threadpool * tp) except *
cdef int _prove(Graph graph, double timeout_s=*, bint kept=*) except -1
cdef double proof_limit() noexcept
cdef int _need_threads(object n_threads) except -1
cdef void note_threads(int n) noexcept
cdef int run_interruptibly(pyggml_async * spec, ggml_cplan * plan, ggml_threadpool * tp,
                           ggml_backend_t * cpu, int n_cpu, Graph graph, object keep,
                           object on_cleanup, pyggml_status * result) except -1
cdef bint wants_async(Graph graph) noexcept
