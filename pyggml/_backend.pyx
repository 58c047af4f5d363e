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
from libc.stdint cimport uintptr_t

from pyggml._ggml cimport *
from pyggml._ggml_backend cimport *
from pyggml._rt cimport *
from pyggml._core cimport Context, Storage, Tensor, need_open, raise_aborted
from pyggml._graph cimport Executor, Graph
from pyggml._cpu cimport _need_threads, _plan, _prove, _raise_checked

from pyggml.errors import ArgumentError, ComputeError, GGMLVersionError, GraphBusyError, UpstreamDefect

__all__ = ["Backend", "GraphAllocator", "backends"]

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
        cdef char msg[PYGGML_MSG_CAP]
        cdef int rc, ist
        cdef ggml_status status
        cdef ggml_cplan plan
        graph._busy = True
        keep = graph._keep_alive()
        try:
            graph._check_memory(keep)
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
            elif graph._index_ops:
                # pyggml checks indices by reading them: not in device memory
                raise ArgumentError(f"compute: the graph reads positions from tensor values (get_rows, ...), "
                                    f"which pyggml cannot check on {self.name}; compute it on the CPU backend")
            if graph._index_ops:
                _raise_checked(pyggml_check_ready_indices(graph.ptr, msg, PYGGML_MSG_CAP), msg)
            if graph._unproven and self.is_cpu:
                _prove(graph)          # the CPU kernels' proof: another backend has other kernels
            if graph._index_ops:
                with nogil:
                    rc = pyggml_compute_checked_with(graph.ptr, _compute_on, self.ptr, msg, PYGGML_MSG_CAP, &ist)
                status = <ggml_status>ist
                _raise_checked(rc, msg)
            else:
                with nogil:
                    status = ggml_backend_graph_compute(self.ptr, graph.ptr)
        finally:
            graph._busy = False
        if status != GGML_STATUS_SUCCESS:
            name = ggml_status_to_string(status).decode()
            raise ComputeError(f"ggml_backend_graph_compute failed: {name}", name)
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
        if not pyggml_try_gallocr_alloc_graph(&g, alloc.ptr, graph.ptr, &ok):
            raise_aborted(&g, "alloc_graph: ggml_gallocr_alloc_graph", "")
        if not ok:
            raise MemoryError("alloc_graph: ggml_gallocr_alloc_graph could not allocate its buffer")
        # the buffers it used, and the contexts whose tensors now point into them
        cdef dict buffers = {}
        cdef int i, j, n = ggml_graph_n_nodes(graph.ptr)
        cdef ggml_tensor * p
        cdef ggml_tensor * s
        cdef Context owner
        owners = {}
        for i in range(n):
            p = ggml_graph_node(graph.ptr, i)
            for j in range(-1, GGML_MAX_SRC):
                s = p if j == -1 else p.src[j]
                if s == NULL or s.buffer == NULL:
                    continue
                key = <uintptr_t>s.buffer
                if key not in buffers:
                    buffers[key] = None
                owner = graph.ctx._owner_of(s)
                if owner is None and graph._ctxs is not None:
                    for c in graph._ctxs:
                        if (<Context>c)._holds(s):
                            owner = c
                            break
                if owner is not None:
                    owners.setdefault(key, set()).add(owner)
        # replace this allocator's previous allocation in the contexts that held it
        for c, st in self._registered:
            (<Context>c)._drop_storage(st)
        self._registered = []
        cdef Storage stor
        cdef size_t total = 0
        for key in buffers:
            stor = Storage.__new__(Storage)
            stor.owner = alloc
            stor.ptr = ggml_backend_buffer_get_base(<ggml_backend_buffer_t><uintptr_t>key)
            stor.size = ggml_backend_buffer_get_size(<ggml_backend_buffer_t><uintptr_t>key)
            stor.host = ggml_backend_buffer_is_host(<ggml_backend_buffer_t><uintptr_t>key)
            total += stor.size
            for c in owners.get(key, ()):
                if (<Context>c).ptr != NULL:
                    (<Context>c)._add_storage(stor)
                    self._registered.append((c, stor))
        self._current = alloc
        return total
