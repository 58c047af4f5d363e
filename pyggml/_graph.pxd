# cython: language_level=3
# The Graph and its tensor-address set, for the executors (_cpu) to cimport.

from libc.stdint cimport int64_t, uint64_t, uintptr_t

from pyggml._ggml cimport ggml_cgraph, ggml_tensor
from pyggml._core cimport Context


cdef extern from "ptrset.h" nogil:
    ctypedef struct pg_ptrset:
        size_t n
    void pg_ptrset_free(pg_ptrset * s)
    int pg_ptrset_add(pg_ptrset * s, uintptr_t key)
    int pg_ptrset_contains(const pg_ptrset * s, uintptr_t key)
    void pg_ptrset_discard(pg_ptrset * s, uintptr_t key)


cdef class Executor:
    """Computes graphs: the CPU executor (pyggml._cpu) today, a ggml backend tomorrow."""
    cdef int run(self, Graph graph, object n_threads, bint use_ref) except -1
    cdef object work(self, Graph graph, object n_threads, bint plan_only)


cdef class Graph:
    cdef ggml_cgraph * ptr
    cdef readonly Context ctx
    cdef readonly size_t size
    cdef readonly bint grads
    cdef pg_ptrset _seen    # tensors (addresses) already in the graph
    cdef set _ctxs          # contexts whose tensors the graph reaches, beyond ctx
                            # (None while there are none: the common case stays cheap)
    cdef set _pools         # the pools of every context it reaches: alive while the graph is
    cdef uint64_t _epoch    # pyggml._core.placement_epoch() when _unallocated was last found None
    cdef int _n_nodes, _n_leafs
    cdef object _unallocated  # first tensor without data, or None
    cdef int _fab_nodes       # FLASH_ATTN_BACK nodes (their work buffer: pyggml_graph_fab_work_bytes)
    cdef bint _busy           # a thread computes or changes the graph
    cdef int64_t _node_elems  # the largest operand of each node, summed: a measure of a compute's size
    cdef int _index_ops       # nodes that read positions from a tensor's values (get_rows, ...)
    cdef int64_t _thread_heads  # the fewest heads of a node whose kernel splits heads over threads (0: none)
    cdef int _unchecked       # nodes whose op pyggml has no kernel rule for
    cdef bint _unproven       # ... and the graph changed since a forked proof last passed
    cdef object __weakref__   # a scheduler's allocation refers to its graph weakly

    cdef void _set_busy(self, bint busy) noexcept
    cdef int _check(self) except -1
    cdef int _check_idle(self) except -1
    cdef bint _still_unallocated(self)
    cdef int _ready(self, str what) except -1
    cdef int _take(self, str what) except -1
    cdef int _check_threads(self, int n, str what) except -1
    cdef int _add_contexts(self, Context c) except -1
    cdef object _hold(self)
    cdef object _tensor(self, ggml_tensor * p)
    cdef void _forget(self, ggml_tensor ** buf, size_t cap, size_t n_added)
    cdef uint64_t _dry_backward(self, Context ctx) except? 0
    cdef int _track_new_nodes(self, int first) except -1


# a tensor of a graph some thread is computing now (its memory must not be released)
cdef bint tensor_in_use(const ggml_tensor * t) noexcept
