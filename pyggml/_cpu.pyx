# cython: language_level=3
"""pyggml._cpu: the CPU executor: plan, work buffer, threadpool, compute.

``Graph.compute`` hands the graph to the installed executor; this module installs
:class:`CpuExecutor` at import. A ggml backend (``ggml_backend_graph_compute``)
is another executor behind the same seam.
"""

cimport cython
from cpython.ref cimport PyObject, Py_DECREF, Py_INCREF
from cpython.exc cimport PyErr_CheckSignals, PyErr_WriteUnraisable
from cpython.long cimport PyLong_AsLongAndOverflow
from libc.stdint cimport int64_t, uint8_t
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy, memset

from pyggml._ggml cimport *
from pyggml._ggml_backend cimport ggml_backend_t, ggml_backend_cpu_set_abort_callback
from pyggml._rt cimport *
from pyggml._core cimport Storage, arg_float, index_arg, raise_aborted, raise_status
from pyggml._graph cimport Executor, Graph

import os

from pyggml import _graph
from pyggml.errors import (ArgumentError, ComputeError, GGMLAbort, GGMLVersionError, GraphBusyError, UnsafeForkError,
                           UpstreamDefect)


cdef int _default_threads() except -1:
    """ggml's threads per compute when the caller gives none: PYGGML_NUM_THREADS (read once,
    at import) or the cores this process may run on. Several processes computing at once
    (pytest-xdist's workers, a server's) each take every core by default; without OpenMP,
    ggml's threads spin at every barrier, and a thread waiting for a descheduled one
    wastes its whole time slice (the digits classifier's training: 9.5 s alone, 59 s
    beside another process of 2 threads on 2 cores, ggml 0.17.0's prebuilt library)."""
    v = os.environ.get("PYGGML_NUM_THREADS", "").strip()
    if v:
        try:
            n = int(v)
        except ValueError:
            n = 0
        if not 1 <= n <= 512:
            raise ArgumentError(f"PYGGML_NUM_THREADS: a number of threads in [1, 512], not {v!r}")
        return n
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1

cdef int _DEFAULT_N_THREADS = _default_threads()
DEFAULT_N_THREADS = _DEFAULT_N_THREADS
cdef int MAX_N_THREADS = 512   # GGML_MAX_N_THREADS in ggml-cpu (not in a public header)

cdef extern from "pyggml_config.h":
    const char * PYGGML_OPENMP_FLAG

cdef extern from "asan_hooks.h" nogil:
    int pg_asan_enabled()

# An ASan build holds the GIL across every dry run's fork (a proof's, the optimizer's):
# ASan's allocator keeps the locks another thread held at fork() locked in the child,
# which then hangs in its first malloc until the proof's time limit (pyggml_rt.h,
# pyggml_set_fork_hooks). glibc's malloc resets its locks in the child: no hook there.
cdef extern from *:
    """
    static int pyggml_fork_take_gil(void) { return (int) PyGILState_Ensure(); }
    static void pyggml_fork_give_gil(int held) { PyGILState_Release((PyGILState_STATE) held); }
    """
    int pyggml_fork_take_gil() noexcept nogil
    void pyggml_fork_give_gil(int held) noexcept nogil

if pg_asan_enabled():
    pyggml_set_fork_hooks(pyggml_fork_take_gil, pyggml_fork_give_gil)


# --- a cached threadpool ----------------------------------------------------------
# ggml_graph_compute with no threadpool makes and frees one on every call. With
# OpenMP (pyggml's own builds) a threadpool holds no threads, only per-thread state,
# so pyggml keeps one and lends it to one compute at a time (the GIL guards the
# flag); a concurrent compute gets NULL, ggml's disposable pool. A system ggml may
# be built without OpenMP, where a threadpool owns spinning threads: there pyggml
# never caches. Whether a system ggml uses OpenMP is seen from the libraries loaded.

cdef ggml_threadpool * _tp = NULL
cdef int _tp_threads = 0
cdef bint _tp_busy = False
cdef str _omp_flag = PYGGML_OPENMP_FLAG.decode().upper()
cdef bint _tp_allowed = (_omp_flag in ("ON", "1", "TRUE", "YES") or
                         (_omp_flag == "UNKNOWN" and pyggml_openmp_loaded() != 0))
OPENMP = bool(_tp_allowed)      # the ggml computing here uses OpenMP


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

def _drain_workers():
    """At exit: wait (10 s at most) for the workers of interrupted computes to finish the
    node they are in and give back what they hold, before the interpreter finalizes (a
    worker that then asked for the GIL would be ended where it stands)."""
    with nogil:
        pyggml_async_drain(10000)


import atexit
atexit.register(_free_threadpool)
atexit.register(_drain_workers)     # first: atexit runs the last registered first


# --- the forked proof ------------------------------------------------------------

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


cdef struct _ProofTask:
    ggml_cgraph * graph
    size_t min_work
    double timeout_s
    pyggml_status status


cdef void _proof_task(void * p, const int * abort) noexcept nogil:
    cdef _ProofTask * t = <_ProofTask *>p
    pyggml_prove_graph(t.graph, t.min_work, t.timeout_s, abort, &t.status)


@cython.final
cdef class _Proof:
    """A proof's arguments and outcome, alive until its worker is done with them."""
    cdef _ProofTask t


# --- the proof's time limit ----------------------------------------------------------
# A kernel that never returns (a hang upstream, as ROPE's with n_dims = 0 after v0.20.2)
# costs each proof this long before it becomes a KernelTimeout. The ceiling is the C
# runtime's PYGGML_PROOF_TIMEOUT_S; a process may lower it (PYGGML_PROOF_LIMIT, read once
# at import, or set_proof_timeout), as CI does against releases whose kernels may spin.

cdef double _proof_limit = PYGGML_PROOF_TIMEOUT_S


cdef double _timeout_arg(object seconds, str where) except -1:
    cdef double s = arg_float(seconds, "timeout", where)
    if not (0 < s <= PYGGML_PROOF_TIMEOUT_S):
        raise ArgumentError(f"{where}: timeout must be in (0, {PYGGML_PROOF_TIMEOUT_S:g}] s, not {seconds!r}")
    return s


cdef double proof_limit() noexcept:
    return _proof_limit


def proof_timeout():
    """proof_timeout() -> float: the seconds a forked proof's child may run before it is
    killed and the compute raises KernelTimeout (default 600, the most allowed;
    ``PYGGML_PROOF_LIMIT`` in the environment at import, or set_proof_timeout)."""
    return _proof_limit


def set_proof_timeout(seconds):
    """set_proof_timeout(seconds) -> float: set the proof's time limit for this process
    (every proof from now on: Graph.compute's, a backend's, the optimizer's dry run);
    returns the previous limit. ``seconds`` must be in (0, 600]."""
    global _proof_limit
    cdef double s = _timeout_arg(seconds, "set_proof_timeout"), was = _proof_limit
    _proof_limit = s
    return was


def _proof_limit_from_environment():
    v = os.environ.get("PYGGML_PROOF_LIMIT", "").strip()
    if v:
        try:
            seconds = float(v)
        except ValueError:
            raise ArgumentError(f"PYGGML_PROOF_LIMIT: not a number of seconds: {v!r}") from None
        set_proof_timeout(seconds)


_proof_limit_from_environment()


# --- proofs kept ---------------------------------------------------------------------
# A proof's outcome follows the graph's structure (csrc/guarded.c: pyggml_graph_signature),
# so a graph whose structure this process proved already is not proven again: a prebuilt
# ggml, whose kernels pyggml cannot fingerprint, proves every graph, and most graphs of a
# program (a loop's, a test suite's) repeat one another's. Only clean proofs are kept; a
# graph with an index op is proven every time (its kernels follow values); _cpu.prove()
# proves every time unless its caller passes kept=True (the parity probe does; the defect
# probes and the rule tests do not). The signatures kept are bounded in bytes: past the
# bound they are forgotten, all at once.

cdef dict _proven = {}
cdef Py_ssize_t _proven_bytes = 0
cdef Py_ssize_t _PROVEN_MAX_BYTES = 64 << 20
cdef Py_ssize_t _proofs_run = 0, _proofs_kept = 0


cdef bytes _signature(Graph graph):
    cdef size_t n = 0
    cdef uint8_t * p = pyggml_graph_signature(graph.ptr, &n)
    if p == NULL:
        return None              # out of memory: prove, and keep nothing
    try:
        return (<char *> p)[:n]
    finally:
        free(p)


cdef void _keep_proof(bytes key):
    global _proven_bytes
    if key is None or len(key) > _PROVEN_MAX_BYTES // 4:
        return
    if _proven_bytes + len(key) > _PROVEN_MAX_BYTES:
        _proven.clear()
        _proven_bytes = 0
    _proven[key] = None
    _proven_bytes += len(key)


def _graph_signature(Graph graph not None):
    """_graph_signature(graph) -> bytes  (testing): what a proof of ``graph`` depends on."""
    graph._check()
    return _signature(graph)


def _proof_counts():
    """_proof_counts() -> (run, kept_hits)  (testing): proofs this process ran, and graphs
    that a kept proof of the same structure let through without one."""
    return _proofs_run, _proofs_kept


cdef int _prove(Graph graph, double timeout_s=-1, bint kept=True) except -1:
    """Compute once in a forked child, on one thread, with every tensor in guarded
    memory, before computing for real.

    For graphs holding an op pyggml has no kernel rule for yet (or whose kernel is not the
    one its rule was written against): kernel assertions and out-of-bounds accesses depend
    on shapes and strides, not on values, so one clean run in a child proves the graph. An
    abort there becomes GGMLAbort here; a kernel reading or writing past a tensor (a guard
    page, or damaged canary bytes) becomes UpstreamDefect ("kernel-out-of-bounds"); a
    child past timeout_s is killed (KernelTimeout).

    The child is forked and waited for by a worker thread (run_interruptibly), so that
    Ctrl-C reaches the caller within one wait slice: the worker then kills the child and
    reaps it (within 20 ms: csrc/dry_run.c) on its own.
    """
    cdef pyggml_status st
    cdef size_t min_work
    cdef double limit
    cdef bytes key = None
    global _proof_tainted, _proofs_run, _proofs_kept
    if kept and not graph._index_ops:
        key = _signature(graph)
        if key is not None and key in _proven:
            _proofs_kept += 1
            graph._unproven = False
            return 0
    _proofs_run += 1
    if _proof_here:
        min_work = _fab_work_size(graph, 1)
        limit = timeout_s if timeout_s > 0 else _proof_limit
        with nogil:
            pyggml_guarded_compute_here(graph.ptr, min_work, limit, &st)
        if st.code != PYGGML_OK:
            _proof_tainted = True
        raise_status(&st, "compute")
        _keep_proof(key)
        graph._unproven = False
        return 0
    cdef _Proof proof = _Proof.__new__(_Proof)
    proof.t.graph = graph.ptr
    proof.t.min_work = _fab_work_size(graph, 1)
    proof.t.timeout_s = timeout_s if timeout_s > 0 else _proof_limit
    pyggml_status_clear(&proof.t.status)
    cdef pyggml_async spec
    memset(&spec, 0, sizeof(spec))
    spec.task = _proof_task
    spec.task_arg = &proof.t
    # the graph is only read by the child (a copy of this process): keep it alive all the same
    run_interruptibly(&spec, NULL, NULL, NULL, 0, None, (proof, graph), None, NULL)
    raise_status(&proof.t.status, "compute")
    _keep_proof(key)
    graph._unproven = False
    return 0


# --- proofs in this process (a parity sweep's disposable worker) -----------------------
# A sweep's worker proves thousands of graphs, and a fork per proof was most of a sweep's
# time. A process that can be let go after a finding proves in itself instead
# (csrc/guarded.c, pyggml_guarded_compute_here): same guard pages and canaries, same
# exceptions; an abort, a fault or the time limit jumps back out of the kernel, after which
# the process's state is not to be trusted (proof_state_tainted), and its owner replaces it.

cdef bint _proof_here = False
cdef bint _proof_tainted = False


def _set_proof_in_process(enabled):
    """_set_proof_in_process(enabled) -> bool  (for a disposable process only: a parity worker)

    Prove graphs in this process instead of in a forked child; returns the previous
    setting. After a proof that found anything, _proof_state_tainted() is True: a kernel
    was abandoned part way, and the process should exit."""
    global _proof_here
    was = _proof_here
    _proof_here = bool(enabled)
    return was


def _proof_state_tainted():
    """_proof_state_tainted() -> bool: an in-process proof found something (an abort, a
    fault, an access past a tensor, the time limit) since this process started."""
    return _proof_tainted


def prove(Graph graph not None, timeout=None, kept=False):
    """prove(graph, timeout=None, kept=False): run the guarded proof now (a forked child
    computes the graph with every tensor between guard pages), whatever the graph's nodes;
    raise what it finds: GGMLAbort for an abort, UpstreamDefect 'kernel-out-of-bounds' for
    an access past a tensor, KernelTimeout when the child runs past ``timeout`` seconds
    (default: proof_timeout()). For tests of the kernel rules (with the rules disabled),
    the defect probes, and the parity sweep's probe of each case, which passes ``kept``:
    a graph whose structure this process proved clean then passes without a new proof."""
    graph._check()
    _prove(graph, _proof_limit if timeout is None else _timeout_arg(timeout, "prove"), bool(kept))


def _compute_without_proof(Graph graph not None, n_threads=1):
    """_compute_without_proof(graph, n_threads=1)  (testing only: it can crash the process)

    Compute without the guarded proof a graph with unchecked nodes would get: for the
    sanitizer tests, which let a known overrun happen under AddressSanitizer."""
    graph._unproven = False
    graph.compute(n_threads)


cdef size_t _fab_work_size(Graph graph, int n_threads):
    # Upstream defect (pyggml.defects "fab-work-size"): FLASH_ATTN_BACK's kernel touches
    # more work buffer than ggml_graph_plan reserves for small heads on 3 or more
    # threads. pyggml owns the work buffer, so it sizes it for the kernel
    # (csrc/fab_work.cpp, the one place that computes it).
    if graph._fab_nodes == 0:
        return 0
    return pyggml_graph_fab_work_bytes(graph.ptr, n_threads)


def fab_work_bytes(D, M, n_threads):
    """fab_work_bytes(D, M, n_threads) -> int: bytes of work buffer FLASH_ATTN_BACK's F32
    CPU kernel touches for head size ``D`` and ``M`` keys on ``n_threads`` threads
    (csrc/fab_work.cpp: what Graph.compute allocates, and what the "fab-work-size" probe
    compares ggml_graph_plan's figure with)."""
    cdef int64_t d = index_arg(D, "D", "fab_work_bytes"), m = index_arg(M, "M", "fab_work_bytes")
    cdef int64_t n = index_arg(n_threads, "n_threads", "fab_work_bytes")
    if d < 1 or m < 1 or not 1 <= n <= MAX_N_THREADS:
        raise ArgumentError(f"fab_work_bytes: D and M must be >= 1 and n_threads in [1, {MAX_N_THREADS}], "
                            f"got {d}, {m}, {n}")
    return pyggml_fab_work_bytes(d, m, <int>n)


cdef int _need_threads(object n_threads) except -1:
    cdef long n = 0
    cdef int overflow = 0
    if n_threads is None:
        return 1 if _forked_after_omp else _DEFAULT_N_THREADS
    if type(n_threads) is int:
        # C, no Python int made or compared (most computes pass a small int)
        n = PyLong_AsLongAndOverflow(n_threads, &overflow)
    if type(n_threads) is int and overflow == 0 and 1 <= n <= MAX_N_THREADS:
        pass
    else:
        v = index_arg(n_threads, "n_threads", "compute")
        if not 1 <= v <= MAX_N_THREADS:
            raise ArgumentError(f"n_threads must be in [1, {MAX_N_THREADS}], got {v}")
        n = v
    if n > 1 and _forked_after_omp:
        raise UnsafeForkError(f"compute: n_threads={n} in a process forked after OpenMP threads ran in its "
                              f"parent: libgomp cannot start threads here (it would hang). Compute with "
                              f"n_threads=1 (the default in such a child), or start processes with "
                              f"multiprocessing's 'spawn' or 'forkserver' method.")
    return n


# --- computing: inline, or on a worker thread so Ctrl-C is prompt -----------------------

# Graphs whose operands add up to at least this many elements compute on a worker thread
# (pyggml_async): the caller waits in 50 ms slices, so a KeyboardInterrupt (or any
# signal handler's exception) reaches Python within 50 ms even inside one long node;
# ggml then stops after the node it is in, and the graph stays busy until it has.
# Smaller graphs compute on the calling thread (a worker costs ~20 us to start).
cdef int64_t ASYNC_MIN_ELEMS = 1 << 20
cdef int WAIT_SLICE_MS = 50


cdef bint wants_async(Graph graph) noexcept:
    """Whether a compute of ``graph`` runs on a worker thread (Ctrl-C within 50 ms)."""
    return graph._node_elems >= ASYNC_MIN_ELEMS


cdef extern from *:
    int __atomic_sub_fetch(int * ptr, int val, int memorder) nogil
    int __ATOMIC_ACQ_REL


cdef struct _Async:
    pyggml_async a
    ggml_cplan plan
    ggml_threadpool * tp
    int refs            # the caller and the worker each hold one; the last frees
    PyObject * keep     # (graph or None, what the compute holds, on_cleanup or None)
    int n_cpu           # CPU backends whose abort callback points at a
    ggml_backend_t cpu[16]


cdef void _async_release(_Async * st) noexcept nogil:
    if __atomic_sub_fetch(&st.refs, 1, __ATOMIC_ACQ_REL) == 0:
        free(st)


cdef int _async_cleanup(_Async * st) except -1:
    """Give everything back (once: see pyggml_async_handoff): the CPU backends' abort
    callbacks, the graph's busy flag, the threadpool, then the caller's on_cleanup (which
    releases the backends' locks)."""
    cdef int i
    keep = <object>st.keep
    for i in range(st.n_cpu):
        ggml_backend_cpu_set_abort_callback(st.cpu[i], NULL, NULL)
    if keep[0] is not None:
        (<Graph>keep[0])._set_busy(False)
    _threadpool_release(st.tp)
    Py_DECREF(keep)
    if keep[2] is not None:
        keep[2]()
    return 0


cdef void _async_cleanup_unraisable(_Async * st) noexcept with gil:
    try:
        _async_cleanup(st)
    except BaseException as e:
        PyErr_WriteUnraisable(e)


cdef void _async_done(void * p, int cleanup) noexcept nogil:
    """On the worker, after the compute: clean up if the caller gave up waiting. Without
    the clean-up it takes no GIL (pyggml_async_start may be waiting for it with the GIL
    held), hence the GIL-taking part in a function of its own: Cython takes the GIL on
    the way out of a function that has a Python variable."""
    cdef _Async * st = <_Async *>p
    if cleanup:
        _async_cleanup_unraisable(st)
    _async_release(st)


cdef int _compute_async(Graph graph, ggml_cplan plan, ggml_threadpool * tp, object keep,
                        pyggml_status * result) except -1:
    """The CPU executor's compute on a worker thread (run_interruptibly)."""
    cdef pyggml_async spec
    memset(&spec, 0, sizeof(spec))
    spec.graph = graph.ptr
    spec.checked = graph._index_ops > 0
    return run_interruptibly(&spec, &plan, tp, NULL, 0, graph, keep, None, result)


cdef int run_interruptibly(pyggml_async * spec, ggml_cplan * plan, ggml_threadpool * tp,
                           ggml_backend_t * cpu, int n_cpu, Graph graph, object keep,
                           object on_cleanup, pyggml_status * result) except -1:
    """Run what ``spec`` says (a graph with a plan, a backend's compute, or a task) on a
    worker thread, and wait for it in WAIT_SLICE_MS slices, so that Ctrl-C (any signal
    handler's exception) reaches the caller at once: then ggml is told to stop after the
    node it is in (the plan's abort callback, or the abort callback of the ``n_cpu`` CPU
    backends ``cpu``), and the worker, when it is done, gives everything back itself:
    the graph stays busy, the backends locked, ``keep`` alive, until it has. Without an
    exception the caller gives them back here, on_cleanup included. A compute's outcome
    goes to ``result`` (when not NULL) for the caller to raise (raise_status)."""
    cdef _Async * st = <_Async *>calloc(1, sizeof(_Async))
    if st == NULL:
        raise MemoryError()
    cdef tuple held = (graph, keep, on_cleanup)
    cdef int i
    memcpy(&st.a, spec, sizeof(pyggml_async))
    if plan != NULL:
        st.plan = plan[0]
        st.a.plan = &st.plan
    st.tp = tp
    st.refs = 2
    st.keep = <PyObject *>held
    Py_INCREF(held)
    st.a.on_done = _async_done
    st.a.on_done_arg = st
    st.n_cpu = min(n_cpu, 16)
    for i in range(st.n_cpu):
        st.cpu[i] = cpu[i]
        ggml_backend_cpu_set_abort_callback(cpu[i], pyggml_async_aborted, &st.a)
    cdef int rc = pyggml_async_start(&st.a), done = 0
    if rc != 0:
        for i in range(st.n_cpu):
            ggml_backend_cpu_set_abort_callback(cpu[i], NULL, NULL)
        Py_DECREF(held)
        free(st)
        raise OSError(rc, "compute: cannot start a worker thread")
    try:
        while not done:
            with nogil:
                done = pyggml_async_wait(&st.a, WAIT_SLICE_MS)
            if not done:
                PyErr_CheckSignals()       # raises what a signal handler raised (Ctrl-C)
        if result != NULL:
            result[0] = st.a.result
    except BaseException:
        if not done:
            pyggml_async_abort(&st.a)     # ggml stops after the current node
        raise
    finally:
        if pyggml_async_handoff(&st.a):   # the worker is past its compute: clean up here
            _async_cleanup(st)
        _async_release(st)
    return 0


# --- fork safety ---------------------------------------------------------------------
# libgomp cannot start threads in a child forked after OpenMP threads ran in its
# parent: a multi-threaded compute there would hang for ever. pyggml notices the fork
# (os.register_at_fork) and computes on one thread by default in such a child; an
# explicit n_threads > 1 there raises instead of hanging.
cdef bint _omp_threads_ran = False
cdef bint _forked_after_omp = False


def _after_fork_in_child():
    global _forked_after_omp, _tp, _tp_threads, _tp_busy
    _forked_after_omp = _forked_after_omp or (_omp_threads_ran and _tp_allowed)
    _tp = NULL          # the parent's (the memory stays: it is not this process's to free)
    _tp_threads = 0
    _tp_busy = False

os.register_at_fork(after_in_child=_after_fork_in_child)


cdef int _last_n_threads = 0


cdef void note_threads(int n) noexcept:
    """A compute on ``n`` threads is about to run (any executor): a child forked after it
    must not start OpenMP threads."""
    global _omp_threads_ran, _last_n_threads
    _last_n_threads = n
    if n > 1:
        _omp_threads_ran = True


def _last_threads():
    """_last_threads() -> int  (testing): the thread count of this process's last compute."""
    return _last_n_threads


def _forked_after_threads():
    """True in a process forked after a multi-threaded (OpenMP) compute in its parent."""
    return bool(_forked_after_omp)


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

    cdef int run(self, Graph graph, object n_threads, bint use_ref) except -1:
        graph._check()
        cdef int n = _need_threads(n_threads)
        if use_ref and not PYGGML_HAVE_USE_REF:
            raise GGMLVersionError(f"compute: use_ref needs ggml_cplan.use_ref, which ggml {c_ggml_version().decode()} "
                                   f"lacks")
        graph._ready("compute")
        # from here until the end, no other thread may compute or change the graph
        graph._take("compute")
        cdef ggml_threadpool * tp = NULL
        cdef ggml_cplan plan
        cdef size_t work_size
        cdef Storage work = None
        cdef ggml_status status
        cdef bint handed = False        # the worker thread owns busy and tp
        cdef pyggml_status result
        cdef object keep = None
        pyggml_status_clear(&result)
        try:
            # every storage the graph touches stays alive while the GIL is released
            # (another thread may close a context meanwhile)
            keep = graph._hold()
            if graph._index_ops:
                # indices out of range are refused before anything runs, the proof included
                pyggml_check_ready_indices(graph.ptr, &result)
                raise_status(&result, "compute")
            if graph._unproven:
                _prove(graph)
            # a cached threadpool saves creating one per compute; one compute at a time uses it
            tp = _threadpool_acquire(n)
            plan = _plan(graph, n, tp)
            pyggml_plan_use_ref(&plan, use_ref)
            work_size = max(plan.work_size, _fab_work_size(graph, n))
            if work_size > 0:
                work = Storage(work_size)
                plan.work_data = <uint8_t *>work.ptr
            graph._check_threads(n, "compute")
            note_threads(n)
            if wants_async(graph):
                handed = True
                _compute_async(graph, plan, tp, (keep, work), &result)
            elif graph._index_ops:
                # index ops: their indices are checked right before each runs
                with nogil:
                    pyggml_compute_checked(graph.ptr, &plan, &result)
            elif graph._node_elems <= SMALL_GRAPH_ELEMS:
                # releasing and taking back the GIL costs more than such a graph takes
                pyggml_status_from_ggml(&result, ggml_graph_compute(graph.ptr, &plan))
            else:
                with nogil:
                    status = ggml_graph_compute(graph.ptr, &plan)
                pyggml_status_from_ggml(&result, status)
        finally:
            if not handed:
                _threadpool_release(tp)
                graph._set_busy(False)
        return raise_status(&result, "compute")


def cpu_features():
    """cpu_features() -> dict: the instruction sets this build's ggml-cpu was compiled
    for (``ggml_cpu_has_*``: what its kernels use, not what the CPU could do)."""
    return {
        "sse3": bool(ggml_cpu_has_sse3()),
        "ssse3": bool(ggml_cpu_has_ssse3()),
        "avx": bool(ggml_cpu_has_avx()),
        "avx_vnni": bool(ggml_cpu_has_avx_vnni()),
        "avx2": bool(ggml_cpu_has_avx2()),
        "bmi2": bool(ggml_cpu_has_bmi2()),
        "f16c": bool(ggml_cpu_has_f16c()),
        "fma": bool(ggml_cpu_has_fma()),
        "avx512": bool(ggml_cpu_has_avx512()),
        "avx512_vbmi": bool(ggml_cpu_has_avx512_vbmi()),
        "avx512_vnni": bool(ggml_cpu_has_avx512_vnni()),
        "avx512_bf16": bool(ggml_cpu_has_avx512_bf16()),
        "amx_int8": bool(ggml_cpu_has_amx_int8()),
        "neon": bool(ggml_cpu_has_neon()),
        "arm_fma": bool(ggml_cpu_has_arm_fma()),
        "fp16_va": bool(ggml_cpu_has_fp16_va()),
        "dotprod": bool(ggml_cpu_has_dotprod()),
        "matmul_int8": bool(ggml_cpu_has_matmul_int8()),
        "sve": bool(ggml_cpu_has_sve()),
        "llamafile": bool(ggml_cpu_has_llamafile()),
    }


_graph._set_default_executor(CpuExecutor())
