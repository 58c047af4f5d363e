# cython: language_level=3
"""pyggml._backend: ggml's backends (ggml-backend.h): the device registry, a backend,
backend buffers for the tensors of a ``no_alloc`` context, graph allocation (the graph
allocator and the scheduler, _backend_alloc.pxi), and computing a graph with
``ggml_backend_graph_compute``.

A :class:`Backend` is an Executor (the seam of pyggml._graph): computing a graph on it
runs the same checks as the CPU executor first (indices in range, the guarded proof of
nodes pyggml has no kernel rule for, the work size FLASH_ATTN_BACK needs), then hands
the graph to ggml's backend with the GIL released.

Ownership (docs/ownership.md): backend memory is an :class:`~pyggml._core.Allocation`,
which clears the tensors it placed when it is released or freed, so that no tensor
points into freed memory; the contexts whose tensors it placed hold it. A Backend
computes one graph at a time (its lock: ggml's CPU backend keeps one work buffer per
backend); ``close()`` refuses while a compute, a Scheduler or an Optimizer uses it.
"""

cimport cython

import math
import re
import threading
import weakref
from libc.stdint cimport uint32_t, uintptr_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcpy, memset

from pyggml._ggml cimport *
from pyggml._ggml_backend cimport *
from pyggml._rt cimport *
from pyggml._core cimport (Allocation, Context, Remote, Storage, Tensor, allocation_of, arg_bool, arg_instance,
                          free_backend_buffer, guard_logged, need_open, raise_aborted, raise_remote_aborted,
                          raise_status, remote_call, remote_for)
from pyggml._graph cimport Executor, Graph, tensor_in_use
from pyggml._cpu cimport _need_threads, _plan, _prove, note_threads, run_interruptibly, wants_async

from pyggml.errors import (ArgumentError, ComputeError, ContextFullError, GGMLAbort, GGMLTypeError, GGMLVersionError,
                           GraphBusyError, InUseError, RPCError, UnsupportedOpError, UpstreamDefect)

__all__ = ["Backend", "GraphAllocator", "Scheduler", "backends", "compare_graph_backend", "rpc_protocol"]

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





# --- one compute at a time per backend --------------------------------------------------

# While an Optimizer's epoch calls its Python callback: (the thread it runs on, the
# backends the epoch holds). A compute on one of them from that callback would wait for
# the epoch that waits for the callback: it raises instead (set by pyggml._opt).
cdef object _callback_holds = None


cdef void set_callback_holds(object holds) noexcept:
    global _callback_holds
    _callback_holds = holds


cdef int lock_backends(tuple backends, str what) except -1:
    """Take the lock of every backend (in one order: no two callers deadlock), waiting for
    a compute on another thread to end (interruptibly); then check each is still open.
    InUseError where the caller is the callback of the epoch that holds one of them."""
    cdef Backend b
    holds = _callback_holds
    if holds is not None and holds[0] == threading.get_ident():
        for b in backends:
            if b in holds[1]:
                raise InUseError(f"{what}: Backend {b.name} is in use by the Optimizer.epoch whose callback is "
                                 f"running: compute on it after the epoch")
    taken = []
    try:
        for b in sorted(backends, key=id):
            b._lock.acquire()
            taken.append(b)
        for b in backends:
            b._need_open()
    except BaseException:
        for b in taken:
            b._lock.release()
        raise
    return 0


cdef void unlock_backends(tuple backends) noexcept:
    cdef Backend b
    for b in backends:
        b._lock.release()


cdef ggml_status _compute_on(ggml_cgraph * graph, void * backend) noexcept nogil:
    return pyggml_backend_compute_nothrow(graph, backend)


cdef int _raise_compute(pyggml_status * st, str what, tuple backends) except -1:
    """Raise a backend compute's outcome (raise_status); when ggml's C++ threw, the
    backends are unusable first (the CPU backend frees its work buffer before it fails
    to grow it: see Backend._poisoned)."""
    cdef Backend b
    detail = ""
    if st.code == PYGGML_OUT_OF_MEMORY or st.code == PYGGML_CXX_EXCEPTION:
        for b in backends:
            b._poisoned = True
        detail = (f"; the backends it used ({', '.join(x.name for x in backends)}) are not usable any more "
                  f"(ggml's CPU backend frees its work buffer before it fails to grow it)")
    return raise_status(st, what, detail)


cdef int compute_locked(Graph graph, pyggml_compute_fn compute, void * arg, bint prove, str what,
                        tuple backends, object keep) except -1:
    """The end of every backend compute (a Backend's, a Scheduler's), called with the graph
    busy and ``backends`` locked; gives both back, or has the worker thread give them back
    when the caller stops waiting (Ctrl-C): the indices that exist before the graph runs,
    the guarded proof of unchecked nodes (``prove``), then ``compute(graph, arg)`` with the
    GIL released (on a worker thread for a large graph, so Ctrl-C interrupts it within
    50 ms: ggml's CPU backends stop after the node they are in), node by node with the
    computed indices checked before each reader when the graph has index ops."""
    cdef pyggml_status result
    cdef int i, n_cpu = 0
    cdef ggml_status status
    cdef bint handed = False
    cdef pyggml_async spec
    cdef ggml_backend_t cpu[16]
    cdef Backend b
    pyggml_status_clear(&result)
    try:
        if graph._index_ops:
            pyggml_check_ready_indices(graph.ptr, &result)
            raise_status(&result, what)
        if prove:
            _prove(graph)
        remote = _remote_of(backends)
        if remote is not None:
            _compute_remote(remote, graph, compute, arg, backends, keep, what, &result)
        elif wants_async(graph):
            memset(&spec, 0, sizeof(spec))
            spec.graph = graph.ptr
            spec.compute = compute
            spec.compute_arg = arg
            spec.checked = graph._index_ops > 0
            for b in backends:
                if b.is_cpu and n_cpu < 16:
                    cpu[n_cpu] = b.ptr
                    n_cpu += 1
            handed = True        # run_interruptibly gives the graph and the locks back
            run_interruptibly(&spec, NULL, NULL, cpu, n_cpu, graph, (keep, backends),
                              lambda: unlock_backends(backends), &result)
        elif graph._index_ops:
            with nogil:
                pyggml_compute_checked_with(graph.ptr, compute, arg, &result)
        else:
            with nogil:
                status = compute(graph.ptr, arg)
            pyggml_status_from_ggml(&result, status)
    finally:
        if not handed:
            graph._set_busy(False)
            unlock_backends(backends)
    return _raise_compute(&result, what, backends)


cdef struct _RemoteCompute:
    pyggml_compute_fn compute
    void * arg
    ggml_cgraph * graph
    ggml_status status


cdef void _remote_compute(void * p) noexcept nogil:
    """The compute, then a read of one byte of its last node where that lies in a server's
    memory: ggml-rpc sends the graph and returns before the server computed it (a failure
    would show in the next call); a server computes what it receives in order, so the read
    returns when the compute is done."""
    cdef _RemoteCompute * c = <_RemoteCompute *>p
    cdef unsigned char byte
    c.status = c.compute(c.graph, c.arg)
    cdef int n = ggml_graph_n_nodes(c.graph)
    cdef ggml_tensor * last = ggml_graph_node(c.graph, n - 1) if n > 0 else NULL
    if c.status == GGML_STATUS_SUCCESS and last != NULL and last.buffer != NULL and ggml_nbytes(last) > 0 \
            and not ggml_backend_buffer_is_host(<ggml_backend_buffer_t>last.buffer):
        ggml_backend_tensor_get(last, &byte, 0, 1)


cdef Remote _remote_of(tuple backends):
    """The RPC server of the first RPC backend among ``backends``, or None."""
    cdef Backend b
    for b in backends:
        if b.remote is not None:
            return b.remote
    return None


cdef int _compute_remote(Remote remote, Graph graph, pyggml_compute_fn compute, void * arg, tuple backends,
                         object keep, str what, pyggml_status * result) except -1:
    """A compute that reaches an RPC server: through remote_call (its time limit, its
    faults, Ctrl-C). Given up, the compute may still run: the CPU backends it uses are
    not used again either."""
    cdef _RemoteCompute c
    cdef Backend b
    c.compute = compute
    c.arg = arg
    c.graph = graph.ptr
    try:
        remote_call(remote, _remote_compute, &c, sizeof(c), NULL, (graph, keep, backends), what)
    except BaseException:
        for b in backends:
            if b.remote is None:
                b._poisoned = True
                b._poison_note = (f"a compute with the RPC server at {remote.endpoint} was given up while it "
                                  f"used this backend, and may still run on it")
        raise
    pyggml_status_from_ggml(result, c.status)
    return 0


cdef int begin_compute(Graph graph, tuple backends, str what) except -1:
    """The shared prologue of a backend compute: the graph allocated and idle; then the
    backends locked and the graph busy (compute_locked gives both back)."""
    graph._ready(what)
    lock_backends(backends, what)
    try:
        graph._take(what)
    except BaseException:
        unlock_backends(backends)
        raise
    return 0


# ggml-rpc's name of a backend (ggml_backend_name): "RPC<device>[<host:port>]"
_RPC_NAME = re.compile(r"RPC([0-9]+)\[(.+)\]\Z")
from pyggml._core import DEFAULT_RPC_TIMEOUT_S


def rpc_protocol():
    """rpc_protocol() -> (major, minor, patch) of the RPC protocol of the linked ggml
    (ggml-rpc.h's RPC_PROTO_*_VERSION), or None in a build without ggml's RPC backend."""
    cdef int major, minor, patch
    if not pyggml_rpc_protocol(&major, &minor, &patch):
        return None
    return (major, minor, patch)


def _rpc_serve(str endpoint, list devices, size_t n_threads, cache_dir):
    """The RPC server (``ggml_backend_rpc_start_server``) in this process, over the
    devices named ``devices``, with the GIL released: it returns only when it could not
    start. For pyggml.rpc's server process."""
    cdef ggml_backend_dev_t devs[16]
    cdef size_t i, n = len(devices)
    if not pyggml_rpc_built():
        raise GGMLVersionError("rpc server: this pyggml was built without ggml's RPC backend")
    if not 0 < n <= 16:
        raise ArgumentError("rpc server: 1 to 16 devices")
    for i in range(n):
        devs[i] = ggml_backend_dev_by_name(devices[i].encode())
        if devs[i] == NULL:
            known = ", ".join(d["name"] for d in backends())
            raise ArgumentError(f"rpc server: no device named {devices[i]!r} (devices: {known})")
    b = endpoint.encode()
    cdef const char * ep = b
    cache = cache_dir.encode() if cache_dir is not None else None
    cdef const char * c = NULL if cache is None else <const char *>cache
    with nogil:
        pyggml_rpc_serve(ep, c, n_threads, n, <void **>devs)
    raise RPCError(f"rpc server: ggml_backend_rpc_start_server could not start at {endpoint} (is the address in "
                   f"use? ggml printed why)", endpoint)


cdef struct _RpcStart:
    char endpoint[200]
    uint32_t device
    ggml_backend_t backend


cdef void _rpc_start(void * p) noexcept nogil:
    cdef _RpcStart * s = <_RpcStart *>p
    s.backend = <ggml_backend_t>pyggml_rpc_init(s.endpoint, s.device)
    if s.backend != NULL:
        ggml_backend_get_default_buffer_type(s.backend)     # ggml-rpc asks the server once, and keeps it


cdef struct _AllocCtx:
    ggml_context * ctx
    ggml_backend_t backend
    ggml_backend_buffer_t buf


cdef void _alloc_ctx(void * p) noexcept nogil:
    cdef _AllocCtx * a = <_AllocCtx *>p
    a.buf = ggml_backend_alloc_ctx_tensors(a.ctx, a.backend)


cdef void _backend_free(void * p) noexcept nogil:
    ggml_backend_free((<ggml_backend_t *>p)[0])


cdef class Backend(Executor):
    """Backend(name="CPU", n_threads=None, *, endpoint=None, timeout=None)

    A ggml backend: ``"CPU"`` (always there), the name of a device of
    :func:`backends`, or ``"RPC"`` with ``endpoint="host:port"``: a device of a server of
    ggml's RPC backend (:mod:`pyggml.rpc`), its memory in the server's process; ``timeout``
    (seconds, default 60) bounds every call that waits for that server, after which (or
    when the server dies, or on Ctrl-C) the connection is given up and RPCError raised.
    ``n_threads``: threads per compute (default: as :meth:`pyggml.Graph.compute`), for the
    CPU backend and any other that takes a thread count (``ggml_backend_set_n_threads`` in
    its registry: the BLAS backend, whose BLAS library runs on that many). One compute runs on a backend at a time: a compute
    from another thread waits for the running one. ``host``: whether its buffers are host
    memory (the CPU and BLAS backends; not a GPU's), which :meth:`Tensor.numpy` can show."""

    def __cinit__(self, name="CPU", n_threads=None, *, endpoint=None, timeout=None):
        self.ptr = NULL
        self._lock = threading.Lock()
        self.remote = None
        if not isinstance(name, str):
            raise ArgumentError(f"Backend: name must be a str, not {type(name).__name__}")
        cdef ggml_backend_dev_t dev
        if name == "RPC" or _RPC_NAME.match(name) or endpoint is not None or timeout is not None:
            self._start_rpc(name, endpoint, timeout)
        elif name.upper() == "CPU":
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
        # (an RPC backend's buffer type was made by _start_rpc: no call reaches the server here)
        self.host = ggml_backend_buft_is_host(ggml_backend_get_default_buffer_type(self.ptr))
        self._use_ref = False
        self.n_threads = n_threads

    cdef int _start_rpc(self, str name, object endpoint, object timeout) except -1:
        """``Backend("RPC", endpoint=...)`` or ``Backend("RPC<device>[<endpoint>]")``
        (ggml-rpc's name of the backend): the server answers pyggml's handshake first
        (pyggml.rpc.handshake: reachable, the same protocol, the device exists), then
        ggml-rpc connects, on a worker (remote_call)."""
        cdef _RpcStart st
        m = _RPC_NAME.match(name)
        device = 0
        if m is not None:
            device = int(m.group(1))
            if endpoint is not None and endpoint != m.group(2):
                raise ArgumentError(f"Backend: name {name!r} names endpoint {m.group(2)!r}, and endpoint= {endpoint!r}")
            endpoint = m.group(2)
        elif name != "RPC":
            raise ArgumentError(f"Backend: endpoint= and timeout= are for an RPC backend (name 'RPC'), not {name!r}")
        if not pyggml_rpc_built():
            raise GGMLVersionError("Backend: this pyggml was built without ggml's RPC backend (PYGGML_RPC=OFF, or a "
                                   "system ggml without ggml-rpc)")
        if endpoint is None:
            raise ArgumentError("Backend: an RPC backend needs endpoint='host:port' (its server's address)")
        if not isinstance(endpoint, str):
            raise GGMLTypeError(f"Backend: endpoint must be a str 'host:port', not {type(endpoint).__name__}")
        host, sep, port = endpoint.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or len(endpoint) >= 200 \
                or any(c.isspace() or c in "[]" for c in host):
            raise ArgumentError(f"Backend: endpoint must be 'host:port' with a port in [1, 65535], got {endpoint!r}")
        if timeout is None:
            limit = DEFAULT_RPC_TIMEOUT_S
        elif isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise GGMLTypeError(f"Backend: timeout must be a number of seconds, not {type(timeout).__name__}")
        else:
            limit = float(timeout)
            if not (0 < limit < math.inf):
                raise ArgumentError(f"Backend: timeout must be a positive, finite number of seconds, got {timeout!r}")
        cdef Remote r = remote_for(endpoint)
        r.need_alive("Backend")
        from pyggml.rpc import connected, handshake
        # while this process holds ggml-rpc's connection, ggml-rpc uses it (and the server,
        # serving it, would not answer a handshake): what it said then stands
        if not connected(endpoint) or r.devices == 0:
            info = handshake(endpoint, timeout=min(limit, 10.0))
            r.devices = info["devices"]
        if device >= r.devices:
            raise ArgumentError(f"Backend: the RPC server at {endpoint} has {r.devices} device(s); there is "
                                f"no device {device}")
        r.timeout = limit
        b = endpoint.encode()
        memset(&st, 0, sizeof(st))
        memcpy(st.endpoint, <const char *>b, len(b))
        st.device = device
        remote_call(r, _rpc_start, &st, sizeof(st), NULL, None, "Backend")
        if st.backend == NULL:
            raise RPCError(f"Backend: ggml-rpc could not start a backend for {endpoint}", endpoint)
        self.ptr = st.backend
        self.remote = r
        return 0

    @property
    def endpoint(self):
        """An RPC backend's server ("host:port"); None for others."""
        return None if self.remote is None else (<Remote>self.remote).endpoint

    @property
    def timeout(self):
        """Seconds a call to an RPC backend's server may wait for it (None for others).
        The endpoint's: every Backend of one server shares it."""
        return None if self.remote is None else (<Remote>self.remote).timeout

    def __dealloc__(self):
        self._free()

    cdef void _free(self) noexcept:
        # a backend whose C++ threw mid-compute holds a freed work buffer: ggml would free
        # it again (pyggml leaks it instead)
        cdef ggml_backend_t p = self.ptr
        self.ptr = NULL
        if p == NULL or self._poisoned:
            return
        if self.remote is None:
            ggml_backend_free(p)
        elif (<Remote>self.remote).dead is None:       # else: its connection was given up, and stays
            try:
                remote_call(self.remote, _backend_free, &p, sizeof(p), NULL, None, "close", True)
            except BaseException:
                pass

    def close(self):
        """Free the backend (idempotent); buffers it allocated stay valid. Raises
        InUseError while a Scheduler uses it or a compute runs on it."""
        if self._users:
            raise InUseError(f"Backend {self.name}: a Scheduler uses it; free the scheduler first")
        if not self._lock.acquire(False):
            raise InUseError(f"Backend {self.name}: a compute runs on it (another thread, or an Optimizer's epoch); "
                             f"close it when that has returned")
        try:
            self._free()
        finally:
            self._lock.release()

    def __enter__(self):
        self._need_open()
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        state = " closed" if self.ptr == NULL else ""
        if self.remote is not None and (<Remote>self.remote).dead is not None:
            state = " given up"
        return f"<pyggml.Backend {self.name}{state}>"

    cdef int _need_open(self) except -1:
        if self.ptr == NULL:
            raise ArgumentError(f"Backend {self.name}: closed")
        if self._poisoned:
            raise ArgumentError(f"Backend {self.name}: unusable since "
                                f"{self._poison_note or 'ggml ran out of memory in a compute on it'}; make a new Backend")
        if self.remote is not None:
            (<Remote>self.remote).need_alive(f"Backend {self.name}")
        return 0

    @property
    def n_threads(self):
        """Threads per compute (the CPU and BLAS backends; None: pyggml's default)."""
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
        cdef bint use = arg_bool(on, "on", "set_use_ref")
        self._need_open()
        if not self.is_cpu:
            raise ArgumentError(f"set_use_ref: {self.name} is not the CPU backend")
        lock_backends((self,), "set_use_ref")
        try:
            if not pyggml_backend_cpu_set_use_ref(self.ptr, use):
                raise GGMLVersionError(f"set_use_ref: this ggml has no ggml_backend_cpu_set_use_ref")
        finally:
            unlock_backends((self,))
        self._use_ref = use

    def supports_op(self, node):
        """supports_op(node) -> bool: whether the backend can compute ``node``
        (``ggml_backend_supports_op``)."""
        cdef Tensor t = arg_instance(node, Tensor, 'node', 'supports_op')
        self._need_open()
        t._check()
        return bool(ggml_backend_supports_op(self.ptr, t.ptr))

    def alloc_ctx_tensors(self, ctx, weights=False):
        """alloc_ctx_tensors(ctx, weights=False) -> Storage or None

        Allocate every tensor of the ``no_alloc`` context ``ctx`` that has no data yet in
        one buffer of this backend (``ggml_backend_alloc_ctx_tensors``); None when there
        was none to allocate. ``weights``: the buffer holds a model's weights
        (``GGML_BACKEND_BUFFER_USAGE_WEIGHTS``, as llama.cpp marks its model's): ggml's
        scheduler computes the nodes that read them on this backend. The context keeps the buffer while it is open; on a host
        buffer :meth:`pyggml.Tensor.numpy` is a zero-copy view, elsewhere use
        ``get()``/``set()``."""
        cdef Context c = arg_instance(ctx, Context, 'ctx', 'alloc_ctx_tensors')
        cdef bint as_weights = arg_bool(weights, "weights", "alloc_ctx_tensors")
        self._need_open()
        need_open(c, "alloc_ctx_tensors")
        if not c.no_alloc:
            raise ArgumentError("alloc_ctx_tensors: ctx must be a no_alloc context (its tensors have pool memory)")
        # ggml gives a view the memory of its source, and aborts when that source is in
        # no backend buffer (a context pool's tensor) or not allocated
        cdef ggml_tensor * t = ggml_get_first_tensor(c.ptr)
        cdef ggml_tensor * src
        cdef list before = []
        while t != NULL:
            src = t.view_src
            if src != NULL and t.buffer == NULL and (src.buffer == NULL or src.data == NULL):
                own = c._holds(src) and src.data == NULL and src.view_src == NULL
                if not own:
                    raise ArgumentError(
                        f"alloc_ctx_tensors: tensor {t.name.decode(errors='replace')!r} is a view of "
                        f"{src.name.decode(errors='replace')!r}, which is in no backend buffer (a context pool's "
                        f"tensor, or one not allocated yet): ggml cannot place the view; make both in no_alloc "
                        f"contexts and allocate the source first")
            if t.buffer == NULL:
                before.append(<uintptr_t>t)
            t = ggml_get_next_tensor(c.ptr, t)
        cdef _BufferAllocation alloc = _BufferAllocation.__new__(_BufferAllocation)
        cdef _AllocCtx ac
        if self.remote is None:
            alloc.buf = ggml_backend_alloc_ctx_tensors(c.ptr, self.ptr)
        else:
            ac.ctx = c.ptr
            ac.backend = self.ptr
            remote_call(self.remote, _alloc_ctx, &ac, sizeof(ac), NULL, (self, c), "alloc_ctx_tensors")
            alloc.buf = ac.buf
        alloc.record(before, (c.pool,))
        if alloc.buf == NULL:
            # nothing to allocate; or ggml failed and freed what it had placed
            placed = alloc.n_placed
            alloc.release()
            if placed:
                raise ContextFullError(f"alloc_ctx_tensors: {self.name} could not allocate the tensors' buffer")
            return None
        if as_weights:
            ggml_backend_buffer_set_usage(alloc.buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
        alloc.buffers.add(<uintptr_t>alloc.buf)
        cdef Storage s = alloc.storage(alloc.buf)
        for key in alloc.buffers:
            c._add_storage(alloc.storage(<void *><uintptr_t>key))
        return s

    def graph_compute(self, graph):
        """graph_compute(graph): compute ``graph`` on this backend
        (``ggml_backend_graph_compute``), after pyggml's checks."""
        cdef Graph g = arg_instance(graph, Graph, 'graph', 'graph_compute')
        self.run(g, None, False)

    cdef int _set_threads(self, int n) except -1:
        """Threads for this backend's next computes: the CPU backend's, and any other
        whose ggml registry offers ``ggml_backend_set_n_threads`` (the BLAS backend: its
        BLAS library's threads, which ggml otherwise sets to 4 at every product); not an
        RPC backend's (its server's own)."""
        if self.is_cpu:
            ggml_backend_cpu_set_n_threads(self.ptr, n)
        elif self.remote is None:
            pyggml_backend_set_n_threads(self.ptr, n)
        return 0

    cdef int _prepare(self, Graph graph, int n) except -1:
        """This backend's checks of ``graph`` before ggml computes it (on ``n`` threads);
        called with the backend locked."""
        cdef ggml_cplan plan
        cdef void * probe
        if self.is_cpu:
            graph._check_threads(n, "compute")
            self._set_threads(n)
            # the CPU backend plans the graph itself: plan it first under the guard
            # (ggml_graph_plan asserts on some nodes), and refuse what its plan
            # would under-size (pyggml.defects "fab-work-size")
            plan = _plan(graph, n, NULL)
            fab_need = pyggml_graph_fab_work_bytes(graph.ptr, n) if graph._fab_nodes else 0
            if fab_need > plan.work_size:
                raise UpstreamDefect(
                    f"compute: the CPU backend would give FLASH_ATTN_BACK the {plan.work_size}-byte work buffer "
                    f"ggml_graph_plan asks for with {n} threads, and its kernel uses {fab_need}: "
                    f"compute this graph with Graph.compute (which sizes it) or with fewer threads",
                    "fab-work-size")
            # ggml's CPU backend grows its work buffer with new[], and frees the old one
            # first: a failure there leaves it unusable. Ask the system first.
            if plan.work_size > 0:
                probe = malloc(plan.work_size)
                if probe == NULL:
                    raise ContextFullError(f"compute: the graph needs a {plan.work_size}-byte work buffer with {n} "
                                           f"threads, more than this process can allocate")
                free(probe)
            return 0
        self._set_threads(n)
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
        cdef tuple backends = (self,)
        begin_compute(graph, backends, "compute")
        try:
            keep = graph._hold()
            self._prepare(graph, n)
            if self.is_cpu:
                note_threads(n)
        except BaseException:
            graph._set_busy(False)
            unlock_backends(backends)
            raise
        # the CPU kernels' proof: another backend has other kernels
        compute_locked(graph, _compute_on, self.ptr, graph._unproven and self.is_cpu,
                       "ggml_backend_graph_compute", backends, keep)
        return 0


include "_backend_alloc.pxi"


# --- comparing two backends -------------------------------------------------------------

cdef struct _Compare:
    ggml_backend_t b1
    ggml_backend_t b2
    pyggml_graph_cmp st
    int rc


@cython.final
cdef class _CompareState:
    """What ggml's comparison writes while it runs (freed when the worker is done)."""
    cdef _Compare c

    def __dealloc__(self):
        free(self.c.st.rows)
        self.c.st.rows = NULL


cdef ggml_status _compare_on(ggml_cgraph * graph, void * arg) noexcept nogil:
    cdef _Compare * c = <_Compare *>arg
    c.rc = pyggml_compare_graph(c.b1, c.b2, graph, &c.st)
    return GGML_STATUS_SUCCESS


def compare_graph_backend(graph, backend1, backend2, tolerance=1e-7, stop_at_first=False):
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
    w = "compare_graph_backend"
    return _compare_graph_backend(arg_instance(graph, Graph, "graph", w), arg_instance(backend1, Backend, "backend1", w),
                                  arg_instance(backend2, Backend, "backend2", w), tolerance, stop_at_first)


cdef str _why_proof(Graph graph):
    if graph._unchecked:
        return f"{graph._unchecked} nodes of ops pyggml has no kernel rule for"
    return "the linked ggml's kernels are not the ones pyggml's rules were written for"


cdef object _compare_graph_backend(Graph graph, Backend backend1, Backend backend2, tolerance, stop_at_first):
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
    if graph._unproven and not backend1.host and (backend1.is_cpu or backend2.is_cpu):
        raise ArgumentError(f"compare_graph_backend: the CPU computes this graph's nodes, which need pyggml's "
                            f"guarded proof first ({_why_proof(graph)}); the proof reads the graph in host memory, "
                            f"and it is in {backend1.name}'s: allocate it in the CPU backend's buffers and pass "
                            f"that backend as backend1")
    cdef tuple pair = (backend1, backend2)
    cdef _CompareState cs = _CompareState.__new__(_CompareState)
    cs.c.st.rows = <pyggml_node_cmp *>calloc(max(n, 1), sizeof(pyggml_node_cmp))
    if cs.c.st.rows == NULL:
        raise MemoryError()
    cs.c.st.n_rows = n
    cs.c.st.tolerance = tol
    cs.c.st.stop_at_first = bool(stop_at_first)
    cs.c.b1 = backend1.ptr
    cs.c.b2 = backend2.ptr
    cdef Backend b
    begin_compute(graph, pair, "compare_graph_backend")
    try:
        keep = graph._hold()
        for b in pair:
            if b.is_cpu:
                b._prepare(graph, _need_threads(b._n_threads))
                note_threads(_need_threads(b._n_threads))
            else:
                b._set_threads(_need_threads(b._n_threads))
                b._check_supported(graph)
    except BaseException:
        graph._set_busy(False)
        unlock_backends(pair)
        raise
    compute_locked(graph, _compare_on, &cs.c, graph._unproven and (backend1.is_cpu or backend2.is_cpu),
                   "compare_graph_backend", pair, (keep, cs))
    if cs.c.rc < 0:
        raise GGMLVersionError("compare_graph_backend: this ggml's ggml_backend_compare_graph_backend has "
                               "another signature")
    if cs.c.rc == 0:
        raise MemoryError(f"compare_graph_backend: ggml could not copy the graph to {backend2.name}")
    if cs.c.st.failed:
        raise MemoryError("compare_graph_backend: no memory to read a node's results")
    nodes = []
    for i in range(n):
        p = ggml_graph_node(graph.ptr, i)
        nodes.append({"index": i, "name": p.name.decode(errors="replace"), "op": ggml_op_desc(p).decode(),
                      "compared": bool(cs.c.st.rows[i].compared), "nmse": cs.c.st.rows[i].nmse,
                      "max_abs": cs.c.st.rows[i].max_abs, "n": int(cs.c.st.rows[i].n)})
    first = nodes[cs.c.st.first_diverging] if cs.c.st.first_diverging >= 0 else None
    return {"nodes": nodes, "first_diverging": first}
