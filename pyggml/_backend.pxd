# cython: language_level=3
# The Backend, for the training module (pyggml._opt) to cimport.

from pyggml._ggml_backend cimport ggml_backend_t
from pyggml._graph cimport Executor


cdef class Backend(Executor):
    cdef ggml_backend_t ptr
    cdef readonly str name
    cdef bint is_cpu
    cdef object _n_threads
    cdef bint _use_ref
    cdef int _users             # schedulers over this backend: it cannot be freed while they live
    cdef int _need_open(self) except -1
