# cython: language_level=3
# The CPU executor's checks, for the backend executor (pyggml._backend) to share: one
# place for each of them.

from pyggml._ggml cimport ggml_cplan, ggml_threadpool
from pyggml._graph cimport Graph

cdef ggml_cplan _plan(Graph graph, int n_threads, ggml_threadpool * tp) except *
cdef int _prove(Graph graph) except -1
cdef int _need_threads(object n_threads) except -1
cdef int _raise_checked(int rc, const char * msg) except -1
