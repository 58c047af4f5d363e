# cython: language_level=3
# The Backend and the Scheduler, for the training module (pyggml._opt) to cimport.

from pyggml._ggml cimport ggml_cgraph, ggml_status
from pyggml._ggml_backend cimport ggml_backend_t, ggml_backend_sched_t
from pyggml._graph cimport Executor, Graph


cdef class Backend(Executor):
    cdef ggml_backend_t ptr
    cdef readonly str name
    cdef bint is_cpu
    cdef readonly bint host     # its buffers are host memory (numpy views; the CPU proof can read them)
    cdef object _n_threads
    cdef bint _use_ref
    cdef int _users             # schedulers over this backend: it cannot be freed while they live
    cdef object _lock           # a threading.Lock: one compute at a time (lock_backends)
    cdef bint _poisoned         # ggml's C++ threw in a compute: the backend's state is unusable
    cdef str _poison_note       # why, where it is not the C++ exception (None)
    cdef object remote          # an RPC backend's pyggml._core.Remote (its server), or None
    cdef void _free(self) noexcept
    cdef int _start_rpc(self, str name, object endpoint, object timeout) except -1
    cdef int _need_open(self) except -1
    cdef int _prepare(self, Graph graph, int n) except -1
    cdef int _set_threads(self, int n) except -1
    cdef int _check_supported(self, Graph graph) except -1


cdef class Scheduler:
    cdef ggml_backend_sched_t ptr       # ggml-opt's (an Optimizer's); graphs get their own
    cdef readonly tuple backends
    cdef Backend cpu
    cdef size_t graph_size
    cdef object _current                # the _SchedAllocation of the last alloc_graph
    cdef object _history                # its allocations still placing tensors (_History)
    cdef int _check_nodes(self, Graph graph) except -1


# one compute at a time per backend (pyggml._opt's epochs take the same locks)
cdef int lock_backends(tuple backends, str what) except -1
cdef void unlock_backends(tuple backends) noexcept
cdef void set_callback_holds(object holds) noexcept
