# cython: language_level=3, embedsignature=True
"""pyggml._backend: ggml's backends (ggml-backend.h): the device registry, a backend,
backend buffers for the tensors of a ``no_alloc`` context, and computing a graph with
``ggml_backend_graph_compute``.

A :class:`Backend` is an Executor (the seam of pyggml._graph): computing a graph on it
runs the same checks as the CPU executor first (indices in range, the guarded proof of
nodes pyggml has no kernel rule for, the work size FLASH_ATTN_BACK needs), then hands
the graph to ggml's backend with the GIL released.

Ownership: a backend buffer is a :class:`~pyggml._core.Storage` that frees it; the
context whose tensors it holds keeps it while open, and numpy views of those tensors
(host buffers only) keep it after. A Backend is freed by ``close()`` or when collected;
buffers it allocated stay valid after (ggml's buffers do not reference their backend).
"""

cimport cython

import weakref
from libc.stdint cimport uintptr_t
from libc.stdlib cimport calloc, free

from pyggml._ggml cimport *
from pyggml._ggml_backend cimport *
from pyggml._rt cimport *
from pyggml._core cimport Context, Storage, Tensor, need_open, raise_aborted
from pyggml._graph cimport Executor, Graph
from pyggml._cpu cimport _need_threads, _plan, _prove, _raise_checked

from pyggml.errors import (ArgumentError, ComputeError, GGMLVersionError, GraphBusyError,
                           UnsupportedOpError, UpstreamDefect)

__all__ = ["Backend", "GraphAllocator", "Scheduler", "backends", "compare_graph_backend"]

_DEV_TYPES = {GGML_BACKEND_DEVICE_TYPE_CPU: "cpu", GGML_BACKEND_DEVICE_TYPE_GPU: "gpu",
              GGML_BACKEND_DEVICE_TYPE_ACCEL: "accel"}


def backends():
    """backends() -> list of dict: the devices of ggml's backend registry (the backends
    this ggml was built with): ``name``, ``description``, ``type`` ("cpu", "gpu",
    "accel" or "other"), ``memory_free`` and ``memory_total`` in bytes."""
    cdef size_t i, free_b, total_b
    cdef ggml_backend_dev_t dev
    out = []
    for i in range(ggml_backend_dev_count()):
        dev = ggml_backend_dev_get(i)
        free_b = total_b = 0
        ggml_backend_dev_memory(dev, &free_b, &total_b)
        out.append({"name": ggml_backend_dev_name(dev).decode(),
                    "description": ggml_backend_dev_description(dev).decode(),
                    "type": _DEV_TYPES.get(ggml_backend_dev_type_of(dev), "other"),
                    "memory_free": free_b, "memory_total": total_b})
    return out


cdef size_t _fab_need(Graph graph, int n_threads) except? 0:
    """Bytes of work buffer the graph's FLASH_ATTN_BACK nodes touch on ``n_threads``
    (exactly: pyggml.defects.fab_kernel_work_floats); 0 without such nodes."""
    if graph._fab_mxdm == 0:
        return 0
    from pyggml.defects import fab_kernel_work_floats
    cdef size_t need = 0
    cdef int i
    cdef ggml_tensor * p
    for i in range(ggml_graph_n_nodes(graph.ptr)):
        p = ggml_graph_node(graph.ptr, i)
        if p.op == GGML_OP_FLASH_ATTN_BACK:
            need = max(need, 4 * fab_kernel_work_floats(p.src[0].ne[0], p.src[1].ne[1], n_threads))
    return need


cdef ggml_status _compute_on(ggml_cgraph * graph, void * backend) noexcept nogil:
    return ggml_backend_graph_compute(<ggml_backend_t>backend, graph)


cdef int _checked_compute(Graph graph, pyggml_compute_fn compute, void * arg, bint prove, str what) except -1:
    """The end of a backend's or a scheduler's compute, after their own checks: the
    indices that exist before the graph runs, the guarded proof of unchecked nodes
    (``prove``), then ``compute(graph, arg)`` with the GIL released, node by node with
    the computed indices checked before each reader when the graph has index ops."""
    cdef char msg[PYGGML_MSG_CAP]
    cdef int rc, ist
    cdef ggml_status status
    if graph._index_ops:
        _raise_checked(pyggml_check_ready_indices(graph.ptr, msg, PYGGML_MSG_CAP), msg)
    if prove:
        _prove(graph)
    if graph._index_ops:
        with nogil:
            rc = pyggml_compute_checked_with(graph.ptr, compute, arg, msg, PYGGML_MSG_CAP, &ist)
        status = <ggml_status>ist
        _raise_checked(rc, msg)
    else:
        with nogil:
            status = compute(graph.ptr, arg)
    if status != GGML_STATUS_SUCCESS:
        name = ggml_status_to_string(status).decode()
        raise ComputeError(f"{what} failed: {name}", name)
    return 0


cdef class Backend(Executor):
    """Backend(name="CPU", n_threads=None)

    A ggml backend: ``"CPU"`` (always there), or the name of a device of
    :func:`backends`. ``n_threads`` (CPU backend): threads per compute (default: as
    :meth:`pyggml.Graph.compute`)."""

    def __cinit__(self, name="CPU", n_threads=None):
        self.ptr = NULL
        if not isinstance(name, str):
            raise ArgumentError(f"Backend: name must be a str, not {type(name).__name__}")
        cdef ggml_backend_dev_t dev
        if name.upper() == "CPU":
            self.ptr = ggml_backend_cpu_init()
        else:
            dev = ggml_backend_dev_by_name(name.encode())
            if dev == NULL:
                known = ", ".join(d["name"] for d in backends()) or "none"
                raise ArgumentError(f"Backend: no device named {name!r} in this ggml (devices: {known})")
            self.ptr = ggml_backend_dev_init(dev, NULL)
        if self.ptr == NULL:
            raise RuntimeError(f"Backend: ggml could not start the {name!r} backend")
        self.name = ggml_backend_name(self.ptr).decode()
        self.is_cpu = ggml_backend_is_cpu(self.ptr)
        self._use_ref = False
        self.n_threads = n_threads

    def __dealloc__(self):
        if self.ptr != NULL:
            ggml_backend_free(self.ptr)
            self.ptr = NULL

    def close(self):
        """Free the backend (idempotent); buffers it allocated stay valid. Refused while
        a Scheduler uses it."""
        if self._users:
            raise ArgumentError(f"Backend {self.name}: a Scheduler uses it; free the scheduler first")
        if self.ptr != NULL:
            ggml_backend_free(self.ptr)
            self.ptr = NULL

    def __enter__(self):
        self._need_open()
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"<pyggml.Backend {self.name}{' closed' if self.ptr == NULL else ''}>"

    cdef int _need_open(self) except -1:
        if self.ptr == NULL:
            raise ArgumentError(f"Backend {self.name}: closed")
        return 0

    @property
    def n_threads(self):
        """Threads per compute (CPU backend; None: pyggml's default)."""
        return self._n_threads

    @n_threads.setter
    def n_threads(self, value):
        self._need_open()
        if value is not None:
            _need_threads(value)           # the same range and fork checks as Graph.compute
        self._n_threads = value

    def set_use_ref(self, on):
        """set_use_ref(on): the CPU backend's reference implementations for every compute
        (``ggml_backend_cpu_set_use_ref``); GGMLVersionError where this ggml lacks it."""
        self._need_open()
        if not self.is_cpu:
            raise ArgumentError(f"set_use_ref: {self.name} is not the CPU backend")
        if not pyggml_backend_cpu_set_use_ref(self.ptr, bool(on)):
            raise GGMLVersionError(f"set_use_ref: this ggml has no ggml_backend_cpu_set_use_ref")
        self._use_ref = bool(on)

    def supports_op(self, Tensor node not None):
        """supports_op(node) -> bool: whether the backend can compute ``node``
        (``ggml_backend_supports_op``)."""
        self._need_open()
        node._check()
        return bool(ggml_backend_supports_op(self.ptr, node.ptr))

    def alloc_ctx_tensors(self, Context ctx not None):
        """alloc_ctx_tensors(ctx) -> Storage or None

        Allocate every tensor of the ``no_alloc`` context ``ctx`` that has no data yet in
        one buffer of this backend (``ggml_backend_alloc_ctx_tensors``); None when there
        was none to allocate. The context keeps the buffer while it is open; on a host
        buffer :meth:`pyggml.Tensor.numpy` is a zero-copy view, elsewhere use
        ``get()``/``set()``."""
        self._need_open()
        need_open(ctx, "alloc_ctx_tensors")
        if not ctx.no_alloc:
            raise ArgumentError("alloc_ctx_tensors: ctx must be a no_alloc context (its tensors have pool memory)")
        # ggml gives a view the memory of its source, and aborts when that source is in
        # no backend buffer (a context pool's tensor) or not allocated
        cdef ggml_tensor * t = ggml_get_first_tensor(ctx.ptr)
        cdef ggml_tensor * src
        while t != NULL:
            src = t.view_src
            if src != NULL and t.buffer == NULL and (src.buffer == NULL or src.data == NULL):
                own = ctx._holds(src) and src.data == NULL and src.view_src == NULL
                if not own:
                    raise ArgumentError(
                        f"alloc_ctx_tensors: tensor {t.name.decode(errors='replace')!r} is a view of "
                        f"{src.name.decode(errors='replace')!r}, which is in no backend buffer (a context pool's "
                        f"tensor, or one not allocated yet): ggml cannot place the view; make both in no_alloc "
                        f"contexts and allocate the source first")
            t = ggml_get_next_tensor(ctx.ptr, t)
        cdef ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx.ptr, self.ptr)
        if buf == NULL:
            return None
        cdef Storage s = Storage.__new__(Storage)
        s.buffer = buf
        s.ptr = ggml_backend_buffer_get_base(buf)
        s.size = ggml_backend_buffer_get_size(buf)
        s.host = ggml_backend_buffer_is_host(buf)
        ctx._add_storage(s)
        return s

    def graph_compute(self, Graph graph not None):
        """graph_compute(graph): compute ``graph`` on this backend
        (``ggml_backend_graph_compute``), after pyggml's checks."""
        self.run(graph, None, False)

    cdef int _prepare(self, Graph graph, int n) except -1:
        """This backend's checks of ``graph`` before ggml computes it (on ``n`` threads)."""
        cdef ggml_cplan plan
        if self.is_cpu:
            ggml_backend_cpu_set_n_threads(self.ptr, n)
            # the CPU backend plans the graph itself: plan it first under the guard
            # (ggml_graph_plan asserts on some nodes), and refuse what its plan
            # would under-size (pyggml.defects "fab-work-size")
            plan = _plan(graph, n, NULL)
            if _fab_need(graph, n) > plan.work_size:
                raise UpstreamDefect(
                    f"compute: the CPU backend would give FLASH_ATTN_BACK the {plan.work_size}-byte work buffer "
                    f"ggml_graph_plan asks for with {n} threads, and its kernel uses {_fab_need(graph, n)}: "
                    f"compute this graph with Graph.compute (which sizes it) or with fewer threads",
                    "fab-work-size")
            return 0
        self._check_supported(graph)
        if graph._index_ops:
            # pyggml checks indices by reading them: not in device memory
            raise ArgumentError(f"compute: the graph reads positions from tensor values (get_rows, ...), "
                                f"which pyggml cannot check on {self.name}; compute it on the CPU backend")
        return 0

    cdef int _check_supported(self, Graph graph) except -1:
        """UnsupportedOpError for the first node this backend cannot compute: ggml's
        backends other than the CPU one abort on it (the BLAS backend computes matrix
        products and layout views only)."""
        cdef int i
        cdef ggml_tensor * p
        for i in range(ggml_graph_n_nodes(graph.ptr)):
            p = ggml_graph_node(graph.ptr, i)
            if not ggml_backend_supports_op(self.ptr, p):
                op = ggml_op_desc(p).decode()
                name = p.name.decode(errors="replace")
                raise UnsupportedOpError(
                    f"compute: {self.name} cannot compute node {i} ({op} {name!r}; ggml_backend_supports_op "
                    f"is false for its types, shapes or layout): compute the graph with a Scheduler over "
                    f"[{self.name}, CPU], which gives such nodes to the CPU", op, name, self.name)
        return 0

    cdef object work(self, Graph graph, object n_threads, bint plan_only):
        raise ArgumentError("work_size: a backend sizes its own work buffer")

    cdef int run(self, Graph graph, object n_threads, bint use_ref) except -1:
        self._need_open()
        graph._check()
        if use_ref:
            raise ArgumentError("compute: use_ref on a backend is its set_use_ref()")
        cdef int n = _need_threads(n_threads if n_threads is not None else self._n_threads)
        if graph._still_unallocated():
            raise ArgumentError("compute: the graph has tensors without data (from a no_alloc context whose "
                                "tensors are not allocated in a backend buffer yet)")
        if graph._busy:
            raise GraphBusyError("compute: this graph is already being computed in another thread")
        graph._busy = True
        keep = graph._keep_alive()
        try:
            graph._check_memory(keep)
            self._prepare(graph, n)
            # the CPU kernels' proof: another backend has other kernels
            _checked_compute(graph, _compute_on, self.ptr, graph._unproven and self.is_cpu,
                             "ggml_backend_graph_compute")
        finally:
            graph._busy = False
        return 0


@cython.final
cdef class _Gallocation:
    """One ggml_gallocr and the buffers it allocated: freed when nothing uses them."""
    cdef ggml_gallocr_t ptr

    def __dealloc__(self):
        if self.ptr != NULL:
            ggml_gallocr_free(self.ptr)
            self.ptr = NULL


@cython.final
cdef class GraphAllocator:
    """GraphAllocator(backend)

    ggml's graph allocator (``ggml_gallocr``) for ``backend``'s default buffer type:
    ``alloc_graph(graph)`` gives every tensor of the graph without data memory in one
    of its buffers, reusing the memory of tensors no longer needed (ggml's liveness
    analysis: intermediate results share memory; outputs and inputs, marked with
    ``set_output``/``set_input``, keep theirs).

    Each ``alloc_graph`` is a new allocation: the tensors' contexts hold it, numpy views
    of its tensors keep it alive, and the previous allocation of this allocator is
    released from those contexts (a graph still pointing into it is refused at compute,
    never read). Allocate a graph once and compute it many times."""

    cdef readonly Backend backend
    cdef _Gallocation _current
    cdef list _registered       # [(context, storage)] of the current allocation

    def __cinit__(self, Backend backend not None):
        backend._need_open()
        self.backend = backend
        self._current = None
        self._registered = []

    def __repr__(self):
        return f"<pyggml.GraphAllocator for {self.backend.name}>"

    def alloc_graph(self, Graph graph not None):
        """alloc_graph(graph): allocate the graph's tensors that have no data
        (``ggml_gallocr_alloc_graph``). Returns the bytes allocated."""
        self.backend._need_open()
        graph._check_idle()
        cdef ggml_backend_buffer_type_t buft = ggml_backend_get_default_buffer_type(self.backend.ptr)
        cdef _Gallocation alloc = _Gallocation.__new__(_Gallocation)
        alloc.ptr = ggml_gallocr_new(buft)
        if alloc.ptr == NULL:
            raise MemoryError("alloc_graph: ggml_gallocr_new failed")
        cdef pyggml_guard g
        cdef int ok = 0
        cdef size_t total
        cdef set before = _buffers_of(graph)
        if not pyggml_try_gallocr_alloc_graph(&g, alloc.ptr, graph.ptr, &ok):
            raise_aborted(&g, "alloc_graph: ggml_gallocr_alloc_graph", "")
        if not ok:
            raise MemoryError("alloc_graph: ggml_gallocr_alloc_graph could not allocate its buffer")
        total = _register_buffers(graph, alloc, self._registered, before)
        self._current = alloc
        return total


cdef set _buffers_of(Graph graph):
    """The backend buffers the graph's tensors point into."""
    cdef set out = set()
    cdef int i, j
    cdef ggml_tensor * p
    cdef ggml_tensor * s
    for i in range(ggml_graph_n_nodes(graph.ptr)):
        p = ggml_graph_node(graph.ptr, i)
        for j in range(-1, GGML_MAX_SRC):
            s = p if j == -1 else p.src[j]
            if s != NULL and s.buffer != NULL:
                out.add(<uintptr_t>s.buffer)
    return out


# the Storages of the allocations alive (buffer address -> weak reference), so that a
# tensor an earlier allocation placed finds the Storage that keeps its buffer
_allocated = weakref.WeakValueDictionary()


cdef size_t _register_buffers(Graph graph, object owner, list registered, set before) except? 0:
    """After an allocation (``owner``: what frees its buffers when collected; ``before``:
    the buffers the graph's tensors pointed into before it; ggml's allocators leave
    such tensors where they are): every context whose tensors point into one of the
    graph's buffers holds that buffer's Storage, so that the context's tensors and
    their numpy views keep it. The previous allocation's Storages (``registered``) that
    the graph no longer points into are released from their contexts. Returns the bytes
    of the new buffers."""
    cdef int i, j, n = ggml_graph_n_nodes(graph.ptr)
    cdef ggml_tensor * p
    cdef ggml_tensor * s
    cdef Context owner_ctx
    owners = {}
    for i in range(n):
        p = ggml_graph_node(graph.ptr, i)
        for j in range(-1, GGML_MAX_SRC):
            s = p if j == -1 else p.src[j]
            if s == NULL or s.buffer == NULL:
                continue
            key = <uintptr_t>s.buffer
            ctxs = owners.setdefault(key, set())
            owner_ctx = graph.ctx._owner_of(s)
            if owner_ctx is None and graph._ctxs is not None:
                for c in graph._ctxs:
                    if (<Context>c)._holds(s):
                        owner_ctx = c
                        break
            if owner_ctx is not None:
                ctxs.add(owner_ctx)
    cdef Storage st
    kept = []
    for c, st in registered:
        if st.buffer_key in owners:
            kept.append((c, st))
        else:
            (<Context>c)._drop_storage(st)
    registered[:] = kept
    cdef size_t total = 0
    for key, ctxs in owners.items():
        if key in before:
            st = _allocated.get(key)     # an earlier allocation's, alive: hold it again
            if st is None:
                continue                 # no allocation of pyggml's (alloc_ctx_tensors), or freed
        else:
            st = Storage.__new__(Storage)
            st.owner = owner
            st.buffer_key = key
            st.ptr = ggml_backend_buffer_get_base(<ggml_backend_buffer_t><uintptr_t>key)
            st.size = ggml_backend_buffer_get_size(<ggml_backend_buffer_t><uintptr_t>key)
            st.host = ggml_backend_buffer_is_host(<ggml_backend_buffer_t><uintptr_t>key)
            total += st.size
            _allocated[key] = st
        for c in ctxs:
            if (<Context>c).ptr != NULL and not any(r is st and rc is c for rc, r in registered):
                (<Context>c)._add_storage(st)
                registered.append((c, st))
    return total


# ggml_backend_sched_new asserts n_backends <= GGML_SCHED_MAX_BACKENDS, which only
# ggml-backend.cpp defines (16 in every release pyggml builds against)
cdef int _MAX_BACKENDS = 16


@cython.final
cdef class _SchedAllocation:
    """One ggml_backend_sched that allocated a graph, and the backends it uses: freed
    when nothing points into its buffers (the Storages of the tensors' contexts)."""
    cdef ggml_backend_sched_t ptr
    cdef tuple backends
    cdef Graph graph
    cdef int n_nodes

    def __dealloc__(self):
        if self.ptr != NULL:
            _sched_free(self.ptr, self.backends)
            self.ptr = NULL


cdef void _sched_free(ggml_backend_sched_t p, tuple backends) noexcept:
    """Free a scheduler of _sched_new: its backends may be closed again."""
    cdef Backend b
    ggml_backend_sched_free(p)
    for b in backends:
        b._users -= 1


cdef ggml_backend_sched_t _sched_new(tuple backends, size_t graph_size) except NULL:
    cdef ggml_backend_t ptrs[16]
    cdef Backend b
    for i, b in enumerate(backends):
        b._need_open()
        ptrs[i] = b.ptr
    cdef ggml_backend_sched_t p = ggml_backend_sched_new(ptrs, NULL, len(backends), graph_size, False, True)
    if p == NULL:
        raise MemoryError("Scheduler: ggml_backend_sched_new failed")
    for b in backends:
        b._users += 1
    return p


cdef ggml_status _sched_compute_on(ggml_cgraph * graph, void * sched) noexcept nogil:
    return ggml_backend_sched_graph_compute(<ggml_backend_sched_t>sched, graph)


@cython.final
cdef class Scheduler:
    """Scheduler(backends, graph_size=2048)

    ``ggml_backend_sched`` over ``backends`` (a list of :class:`Backend`, the CPU
    backend last, as ggml requires): each node of a graph goes to the first backend
    that supports it (the CPU one last), and the scheduler copies tensors between them.
    ``alloc_graph(graph)`` allocates a graph's tensors in the backends' buffers;
    ``graph_compute(graph)`` computes it (allocating it first if needed). ggml-opt's
    :class:`pyggml.opt.Optimizer` trains over a Scheduler too. The backends cannot be
    closed while it, or an allocation of it, lives.

    Each ``alloc_graph`` is a new allocation, as with :class:`GraphAllocator`: the
    tensors' contexts hold it, numpy views keep it alive, and a graph still pointing
    into a replaced allocation is refused at compute."""

    def __cinit__(self, backends, graph_size=2048):
        self.ptr = NULL
        bs = tuple(backends) if not isinstance(backends, Backend) else (backends,)
        if not bs or not all(isinstance(b, Backend) for b in bs):
            raise ArgumentError("Scheduler: backends must be a non-empty list of pyggml.Backend")
        if len(bs) > _MAX_BACKENDS:
            raise ArgumentError(f"Scheduler: at most {_MAX_BACKENDS} backends")
        if len(set(map(id, bs))) != len(bs):
            raise ArgumentError("Scheduler: a backend is listed twice")
        cdef Backend b
        for b in bs:
            b._need_open()
        if not (<Backend>bs[-1]).is_cpu:
            raise ArgumentError("Scheduler: the last backend must be the CPU backend (ggml's fallback)")
        if type(graph_size) is not int or not 16 <= graph_size <= (1 << 24):
            raise ArgumentError(f"Scheduler: graph_size must be an int in [16, 2**24], got {graph_size!r}")
        self.ptr = _sched_new(bs, graph_size)
        self.backends = bs
        self.cpu = bs[-1]
        self.graph_size = graph_size
        self._current = None
        self._registered = []

    def __dealloc__(self):
        if self.ptr != NULL:
            _sched_free(self.ptr, self.backends)
            self.ptr = NULL

    def __repr__(self):
        return f"<pyggml.Scheduler over {', '.join(b.name for b in self.backends)}>"

    cdef int _check_nodes(self, Graph graph) except -1:
        """ggml's scheduler asserts when no backend supports a node (and when the graph
        has more nodes and leafs than its hash set)."""
        cdef int i
        cdef ggml_tensor * p
        cdef Backend b
        for i in range(ggml_graph_n_nodes(graph.ptr)):
            p = ggml_graph_node(graph.ptr, i)
            if not any(ggml_backend_supports_op((<Backend>b).ptr, p) for b in self.backends):
                op = ggml_op_desc(p).decode()
                name = p.name.decode(errors="replace")
                raise UnsupportedOpError(f"Scheduler: no backend of {', '.join(b.name for b in self.backends)} "
                                         f"supports node {i} ({op} {name!r})", op, name, "")
        return 0

    def alloc_graph(self, Graph graph not None):
        """alloc_graph(graph) -> int: split the graph over the backends and allocate the
        tensors that have no data (``ggml_backend_sched_alloc_graph``, in a scheduler of
        its own). Returns the bytes of the buffers the graph's tensors point into."""
        cdef Backend b
        for b in self.backends:
            b._need_open()
        graph._check_idle()
        self._check_nodes(graph)
        cdef int n_nodes = ggml_graph_n_nodes(graph.ptr)
        cdef size_t size = max(self.graph_size, 2 * <size_t>ggml_graph_size(graph.ptr) + 16)
        cdef _SchedAllocation alloc = _SchedAllocation.__new__(_SchedAllocation)
        alloc.ptr = _sched_new(self.backends, size)
        alloc.backends = self.backends
        alloc.graph = graph
        alloc.n_nodes = n_nodes
        cdef pyggml_guard g
        cdef int ok = 0
        cdef set before = _buffers_of(graph)
        if not pyggml_try_sched_alloc_graph(&g, alloc.ptr, graph.ptr, &ok):
            # the scheduler stopped midway: leave it (and the backends it names) unfreed
            alloc.ptr = NULL
            raise_aborted(&g, "alloc_graph: ggml_backend_sched_alloc_graph", "")
        if not ok:
            raise MemoryError("alloc_graph: ggml_backend_sched_alloc_graph could not allocate its buffers")
        total = _register_buffers(graph, alloc, self._registered, before)
        self._current = alloc
        return total

    @property
    def n_splits(self):
        """The splits of the last allocated graph (runs of nodes on one backend)."""
        return 0 if self._current is None else ggml_backend_sched_get_n_splits((<_SchedAllocation>self._current).ptr)

    def backend_of(self, Tensor node not None):
        """backend_of(node) -> Backend or None: the backend the last allocation gave
        ``node`` (``ggml_backend_sched_get_tensor_backend``)."""
        node._check()
        if self._current is None:
            return None
        cdef ggml_backend_t p = ggml_backend_sched_get_tensor_backend((<_SchedAllocation>self._current).ptr,
                                                                      node.ptr)
        for b in self.backends:
            if (<Backend>b).ptr == p:
                return b
        return None

    def graph_compute(self, Graph graph not None, n_threads=None):
        """graph_compute(graph, n_threads=None): compute ``graph``
        (``ggml_backend_sched_graph_compute``) with the GIL released, after pyggml's
        checks; allocates it first unless it is this scheduler's last allocated graph.
        ``n_threads``: for the CPU backends (default: each backend's own)."""
        cdef Backend b
        for b in self.backends:
            b._need_open()
        graph._check()
        cdef _SchedAllocation cur = self._current
        if cur is None or cur.graph is not graph or cur.n_nodes != ggml_graph_n_nodes(graph.ptr):
            self.alloc_graph(graph)
            cur = self._current
        if graph._busy:
            raise GraphBusyError("compute: this graph is already being computed in another thread")
        cdef int n
        graph._busy = True
        keep = graph._keep_alive()
        try:
            graph._check_memory(keep)
            for b in self.backends:
                if b.is_cpu:
                    n = _need_threads(n_threads if n_threads is not None else b._n_threads)
                    b._prepare(graph, n)
                elif graph._index_ops and not ggml_backend_buft_is_host(ggml_backend_get_default_buffer_type(b.ptr)):
                    raise ArgumentError(f"compute: the graph reads positions from tensor values (get_rows, ...), "
                                        f"which pyggml cannot check in {b.name}'s memory")
            _checked_compute(graph, _sched_compute_on, cur.ptr, graph._unproven, "ggml_backend_sched_graph_compute")
        finally:
            graph._busy = False


def compare_graph_backend(Graph graph not None, Backend backend1 not None, Backend backend2 not None,
                          tolerance=1e-7, stop_at_first=False):
    """compare_graph_backend(graph, backend1, backend2, tolerance=1e-7, stop_at_first=False) -> dict

    Node-by-node comparison of ``graph`` computed on two backends
    (``ggml_backend_compare_graph_backend``): ggml copies the graph to ``backend2``,
    then computes each node on both, in order, each from its own backend's inputs. Each
    node's result is compared, as float64, with NMSE against ``backend1``'s (the side
    the comparison is relative to). ``graph`` must be allocated in ``backend1``'s
    buffers (``alloc_ctx_tensors`` or a :class:`GraphAllocator`); it is computed in
    place. Returns ``{"nodes": [{"index", "name", "op", "compared", "nmse", "max_abs",
    "n"}], "first_diverging": node or None}``: the first node whose NMSE exceeds
    ``tolerance``. Layout-only nodes (views) and tensors of a type without a float
    conversion are listed with ``compared`` False. ``stop_at_first``: stop computing
    after the first diverging node."""
    backend1._need_open()
    backend2._need_open()
    graph._check()
    if backend1 is backend2:
        raise ArgumentError("compare_graph_backend: two different backends are needed")
    try:
        tol = float(tolerance)
    except (TypeError, ValueError):
        raise ArgumentError(f"compare_graph_backend: tolerance must be a number, got {tolerance!r}") from None
    if not tol >= 0:
        raise ArgumentError(f"compare_graph_backend: tolerance must be >= 0, got {tolerance!r}")
    if graph._still_unallocated():
        raise ArgumentError("compare_graph_backend: the graph has tensors without data: allocate it first")
    cdef int i, j, n = ggml_graph_n_nodes(graph.ptr)
    cdef ggml_tensor * p
    cdef ggml_tensor * src
    for i in range(n):
        p = ggml_graph_node(graph.ptr, i)
        for j in range(-1, GGML_MAX_SRC):
            src = p if j == -1 else p.src[j]
            if src != NULL and src.buffer == NULL:
                raise ArgumentError(
                    f"compare_graph_backend: tensor {src.name.decode(errors='replace')!r} is in a context's pool, "
                    f"not a backend buffer (ggml copies the graph buffer to buffer): allocate the graph with "
                    f"alloc_ctx_tensors or a GraphAllocator")
    if graph._index_ops:
        raise ArgumentError("compare_graph_backend: the graph reads positions from tensor values (get_rows, ...), "
                            "which pyggml checks only in Graph.compute and Backend.graph_compute")
    if graph._busy:
        raise GraphBusyError("compare_graph_backend: this graph is being computed in another thread")
    cdef Backend b
    for b in (backend1, backend2):
        if b.is_cpu:
            b._prepare(graph, _need_threads(b._n_threads))
        else:
            b._check_supported(graph)
    cdef pyggml_graph_cmp st
    st.rows = <pyggml_node_cmp *>calloc(max(n, 1), sizeof(pyggml_node_cmp))
    if st.rows == NULL:
        raise MemoryError()
    st.n_rows = n
    st.tolerance = tol
    st.stop_at_first = bool(stop_at_first)
    cdef int rc
    graph._busy = True
    keep = graph._keep_alive()
    try:
        graph._check_memory(keep)
        if graph._unproven and (backend1.is_cpu or backend2.is_cpu):
            _prove(graph)
        with nogil:
            rc = pyggml_compare_graph(backend1.ptr, backend2.ptr, graph.ptr, &st)
        if rc < 0:
            raise GGMLVersionError("compare_graph_backend: this ggml's ggml_backend_compare_graph_backend has "
                                   "another signature")
        if rc == 0:
            raise MemoryError(f"compare_graph_backend: ggml could not copy the graph to {backend2.name}")
        if st.failed:
            raise MemoryError("compare_graph_backend: no memory to read a node's results")
        nodes = []
        for i in range(n):
            p = ggml_graph_node(graph.ptr, i)
            nodes.append({"index": i, "name": p.name.decode(errors="replace"), "op": ggml_op_desc(p).decode(),
                          "compared": bool(st.rows[i].compared), "nmse": st.rows[i].nmse,
                          "max_abs": st.rows[i].max_abs, "n": int(st.rows[i].n)})
        first = nodes[st.first_diverging] if st.first_diverging >= 0 else None
    finally:
        graph._busy = False
        free(st.rows)
    return {"nodes": nodes, "first_diverging": first}
