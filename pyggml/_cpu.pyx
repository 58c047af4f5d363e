# cython: language_level=3, embedsignature=True
"""pyggml._cpu: the CPU executor: plan, work buffer, threadpool, compute.

``Graph.compute`` hands the graph to the installed executor; this module installs
:class:`CpuExecutor` at import. A ggml backend (``ggml_backend_graph_compute``)
is another executor behind the same seam.
"""

cimport cython
from libc.stdint cimport int64_t, uint8_t

from pyggml._ggml cimport *
from pyggml._rt cimport *
from pyggml._core cimport Storage, index_arg, raise_aborted
from pyggml._graph cimport Executor, Graph

import os

from pyggml import _graph
from pyggml.errors import ArgumentError, ComputeError, GGMLAbort, GraphBusyError, UpstreamDefect


cdef int _default_threads():
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1

cdef int _DEFAULT_N_THREADS = _default_threads()
DEFAULT_N_THREADS = _DEFAULT_N_THREADS
cdef int MAX_N_THREADS = 512   # GGML_MAX_N_THREADS in ggml-cpu (not in a public header)

cdef extern from "pyggml_config.h":
    const char * PYGGML_OPENMP_FLAG


# --- a cached threadpool ----------------------------------------------------------
# ggml_graph_compute with no threadpool makes and frees one on every call. With
# OpenMP (pyggml's own builds) a threadpool holds no threads, only per-thread state,
# so pyggml keeps one and lends it to one compute at a time (the GIL guards the
# flag); a concurrent compute gets NULL, ggml's disposable pool. A system ggml may
# be built without OpenMP, where a threadpool owns spinning threads: there pyggml
# never caches.

cdef ggml_threadpool * _tp = NULL
cdef int _tp_threads = 0
cdef bint _tp_busy = False
cdef bint _tp_allowed = PYGGML_OPENMP_FLAG.decode().upper() in ("ON", "1", "TRUE", "YES")


cdef ggml_threadpool * _threadpool_acquire(int n_threads):
    global _tp, _tp_threads, _tp_busy
    cdef ggml_threadpool_params params
    if not _tp_allowed or _tp_busy:
        return NULL
    if _tp == NULL or _tp_threads < n_threads:
        if _tp != NULL:
            ggml_threadpool_free(_tp)
            _tp = NULL
        params = ggml_threadpool_params_default(n_threads)
        _tp = ggml_threadpool_new(&params)
        if _tp == NULL:
            return NULL
        _tp_threads = n_threads
    _tp_busy = True
    return _tp


cdef void _threadpool_release(ggml_threadpool * tp):
    global _tp_busy
    if tp != NULL:
        _tp_busy = False


def _threadpool_busy():
    """Is the cached threadpool lent to a compute? (for tests: a refused compute must
    not leave it lent)"""
    return bool(_tp_busy)


def _free_threadpool():
    global _tp, _tp_threads
    if _tp != NULL and not _tp_busy:
        ggml_threadpool_free(_tp)
        _tp = NULL
        _tp_threads = 0

import atexit
atexit.register(_free_threadpool)


# --- the forked proof ------------------------------------------------------------

cdef double PROOF_TIMEOUT_S = 600.0
# graphs whose nodes hold at most this many elements in all compute with the GIL held
# (a microsecond or so of work: less than releasing and re-taking the GIL costs)
cdef int64_t SMALL_GRAPH_ELEMS = 4096


cdef ggml_cplan _plan(Graph graph, int n_threads, ggml_threadpool * tp) except *:
    """ggml_graph_plan, which asserts on some nodes' types, under the abort guard."""
    cdef pyggml_guard g
    cdef ggml_cplan plan
    if not pyggml_try_graph_plan(&g, graph.ptr, n_threads, tp, &plan):
        raise_aborted(&g, "compute: ggml_graph_plan", "")
    return plan


cdef int _prove(Graph graph) except -1:
    """Compute once in a forked child, on one thread, with every tensor in guarded
    memory, before computing for real.

    For graphs holding an op pyggml has no kernel rule for yet: kernel assertions and
    out-of-bounds accesses depend on shapes and strides, not on values, so one clean
    run in a child proves the graph. An abort there becomes GGMLAbort here; a kernel
    reading or writing past a tensor (a guard page, or damaged canary bytes) becomes
    UpstreamDefect ("kernel-out-of-bounds"). Retried on EINTR, the child reaped.
    """
    cdef char msg[4096]
    cdef int how = 0, rc
    cdef size_t min_work = _fab_work_size(graph, 1)
    with nogil:
        rc = pyggml_prove_graph(graph.ptr, min_work, PROOF_TIMEOUT_S, msg, sizeof(msg), &how)
    if rc < 0:
        raise OSError("compute: the forked proof could not run (fork or pipe failed)")
    if rc != PYGGML_DRY_OK:
        text = msg.decode("utf-8", "replace").strip()
        if rc == PYGGML_DRY_EXIT and how in (PYGGML_EXIT_GUARD, PYGGML_EXIT_OVERRUN):
            raise UpstreamDefect(f"compute: {text}", "kernel-out-of-bounds")
        why = {PYGGML_DRY_SIGNAL: f"signal {how}", PYGGML_DRY_EXIT: f"exit {how}",
               PYGGML_DRY_TIMEOUT: f"timed out after {PROOF_TIMEOUT_S:.0f} s"}[rc]
        raise GGMLAbort(f"compute: ggml would abort ({why}): {text or 'no message'}", text)
    graph._unproven = False
    return 0


def prove(Graph graph not None):
    """prove(graph): run the guarded proof now (a forked child computes the graph with
    every tensor between guard pages), whatever the graph's nodes; raise what it finds:
    GGMLAbort for an abort, UpstreamDefect 'kernel-out-of-bounds' for an access past a
    tensor. For tests of the kernel rules (with the rules disabled)."""
    graph._check()
    _prove(graph)


cdef size_t _fab_work_size(Graph graph, int n_threads):
    # Upstream defect (pyggml.defects "fab-work-size"): for FLASH_ATTN_BACK,
    # ggml_graph_plan reserves 4*max(D, Mup)*n_tasks floats (+ a cache line per
    # thread), but the kernel gives thread ith the floats from
    # ith*2*(max(D, Mup) + CACHE_LINE_SIZE_F32): with D < 8 and M <= 4 and 3 or more
    # threads it reads and writes past the plan's buffer. pyggml owns the work
    # buffer, so it sizes it for the kernel (cache lines up to 256 bytes, Mup
    # rounded to 64).
    if graph._fab_mxdm == 0:
        return 0
    return 4 * 2 * <size_t>n_threads * <size_t>(graph._fab_mxdm + 64)


cdef int _need_threads(object n_threads) except -1:
    if n_threads is None:
        return _DEFAULT_N_THREADS
    if type(n_threads) is int and 1 <= n_threads <= MAX_N_THREADS:
        return n_threads
    n = index_arg(n_threads, "n_threads", "compute")
    if not 1 <= n <= MAX_N_THREADS:
        raise ArgumentError(f"n_threads must be in [1, {MAX_N_THREADS}], got {n}")
    return n


@cython.final
cdef class CpuExecutor(Executor):
    """Computes graphs with ggml's CPU backend (``ggml_graph_plan`` +
    ``ggml_graph_compute``); pyggml allocates the work buffer."""

    cdef object work(self, Graph graph, object n_threads, bint plan_only):
        """Bytes of work buffer ``compute(n_threads)`` allocates: what ``ggml_graph_plan``
        asks for (``plan_only``), or more where a kernel is known to use more."""
        graph._check()
        cdef int n = _need_threads(n_threads)
        cdef size_t planned = _plan(graph, n, NULL).work_size
        return planned if plan_only else max(planned, _fab_work_size(graph, n))

    cdef int run(self, Graph graph, object n_threads) except -1:
        graph._check()
        cdef int n = _need_threads(n_threads)
        if graph._unallocated is not None:
            raise ArgumentError("compute: the graph has tensors without data (from a no_alloc context, "
                                "or empty: ggml gives those none)")
        if graph._busy:
            raise GraphBusyError("compute: this graph is already being computed in another thread")
        # from here until the end, no other thread may compute or change the graph
        graph._busy = True
        cdef ggml_threadpool * tp = NULL
        cdef ggml_cplan plan
        cdef size_t work_size
        cdef Storage work = None
        cdef ggml_status status
        # keep every storage the graph touches alive while the GIL is released
        # (another thread may close a context meanwhile)
        cdef object keep = graph._keep_alive()
        try:
            if graph._unproven:
                _prove(graph)
            # a cached threadpool saves creating one per compute; one compute at a time uses it
            tp = _threadpool_acquire(n)
            plan = _plan(graph, n, tp)
            work_size = max(plan.work_size, _fab_work_size(graph, n))
            if work_size > 0:
                work = Storage(work_size)
                plan.work_data = <uint8_t *>work.ptr
            if graph._node_elems <= SMALL_GRAPH_ELEMS:
                # releasing and taking back the GIL costs more than such a graph takes
                status = ggml_graph_compute(graph.ptr, &plan)
            else:
                with nogil:
                    status = ggml_graph_compute(graph.ptr, &plan)
        finally:
            _threadpool_release(tp)
            graph._busy = False
        if status != GGML_STATUS_SUCCESS:
            name = ggml_status_to_string(status).decode()
            raise ComputeError(f"ggml_graph_compute failed: {name}", name)
        return 0


_graph._set_default_executor(CpuExecutor())
