# Included by _backend.pyx: backend memory. The buffer of alloc_ctx_tensors, the graph
# allocator (ggml_gallocr) and the scheduler (ggml_backend_sched), each allocation an
# pyggml._core.Allocation that clears what it placed when released or freed.


@cython.final
@cython.no_gc_clear
cdef class _BufferAllocation(Allocation):
    """The buffer of one ``alloc_ctx_tensors``."""
    cdef ggml_backend_buffer_t buf

    def __dealloc__(self):
        self.release()
        if self.buf != NULL:
            free_backend_buffer(self.buf)
            self.buf = NULL


@cython.final
@cython.no_gc_clear
cdef class _Gallocation(Allocation):
    """One ggml_gallocr and the buffers it allocated."""
    cdef ggml_gallocr_t ptr
    cdef Remote remote          # the RPC server of its buffers, or None

    def __dealloc__(self):
        self.release()
        cdef void * p = self.ptr
        self.ptr = NULL
        if p != NULL:
            _free_remotely(self.remote, _gallocr_free, p)


@cython.final
@cython.no_gc_clear    # its dealloc gives its backends back
cdef class _SchedAllocation(Allocation):
    """One ggml_backend_sched that allocated a graph, and the backends it uses."""
    cdef ggml_backend_sched_t ptr
    cdef tuple backends
    cdef object graph           # a weak reference: the graph's contexts hold this allocation
    cdef int n_nodes
    cdef set members            # the addresses of the graph's tensors when it was allocated

    def __dealloc__(self):
        self.release()
        if self.ptr != NULL:
            _sched_free(self.ptr, self.backends)
            self.ptr = NULL


cdef void _gallocr_free(void * p) noexcept nogil:
    ggml_gallocr_free((<ggml_gallocr_t *>p)[0])


cdef void _sched_free_call(void * p) noexcept nogil:
    ggml_backend_sched_free((<ggml_backend_sched_t *>p)[0])


cdef void _free_remotely(Remote r, pyggml_remote_fn fn, void * p) noexcept:
    """fn(&p): a free that may reach the RPC server ``r`` (None: call it here). A server
    whose connection was given up keeps what it holds (a free would wait for it)."""
    if r is None:
        fn(&p)
    elif r.dead is None:
        try:
            remote_call(r, fn, &p, sizeof(p), NULL, None, "free", True)
        except BaseException:
            pass


cdef struct _AllocGraph:
    pyggml_guard g
    void * allocator            # a ggml_gallocr_t, or a ggml_backend_sched_t (sched)
    ggml_cgraph * graph
    bint sched
    int ok
    int rc


cdef void _alloc_graph(void * p) noexcept nogil:
    cdef _AllocGraph * a = <_AllocGraph *>p
    if a.sched:
        a.rc = pyggml_try_sched_alloc_graph(&a.g, <ggml_backend_sched_t>a.allocator, a.graph, &a.ok)
    else:
        a.rc = pyggml_try_gallocr_alloc_graph(&a.g, <ggml_gallocr_t>a.allocator, a.graph, &a.ok)


cdef int _try_alloc_graph(Remote r, _AllocGraph * a, object keep) except -1:
    """ggml_gallocr_alloc_graph or ggml_backend_sched_alloc_graph under the abort guard,
    here, or through remote_call where the memory is an RPC server's (``r``)."""
    if r is None:
        _alloc_graph(a)
    else:
        remote_call(r, _alloc_graph, a, sizeof(a[0]), NULL, keep, "alloc_graph")
    return 0


cdef list _tensors_of(Graph graph):
    """The addresses of the graph's nodes, their sources and the sources of views."""
    cdef int i, j, n = ggml_graph_n_nodes(graph.ptr)
    cdef ggml_tensor * p
    cdef ggml_tensor * s
    cdef set seen = set()
    cdef list out = []
    for i in range(n):
        p = ggml_graph_node(graph.ptr, i)
        for j in range(-1, GGML_MAX_SRC + 1):
            s = p if j == -1 else (p.view_src if j == GGML_MAX_SRC else p.src[j])
            if s != NULL and <uintptr_t>s not in seen:
                seen.add(<uintptr_t>s)
                out.append(<uintptr_t>s)
    return out


cdef list _without_buffer(list tensors):
    cdef list out = []
    for key in tensors:
        if (<ggml_tensor *><uintptr_t>key).buffer == NULL:
            out.append(key)
    return out


cdef list _protect_inputs(list tensors):
    """ggml's allocators may compute a node in the memory of an input it reads (in place),
    overwriting the input: pyggml marks the inputs (set_input) outputs while it allocates,
    so their values survive every compute. Returns the tensors to unmark."""
    cdef ggml_tensor * t
    cdef list marked = []
    for key in tensors:
        t = <ggml_tensor *><uintptr_t>key
        if t.flags & GGML_TENSOR_FLAG_INPUT and not t.flags & GGML_TENSOR_FLAG_OUTPUT:
            t.flags |= GGML_TENSOR_FLAG_OUTPUT
            marked.append(key)
    return marked


cdef void _unprotect(list marked) noexcept:
    for key in marked:
        (<ggml_tensor *><uintptr_t>key).flags &= ~GGML_TENSOR_FLAG_OUTPUT


@cython.final
cdef class _History:
    """An allocator's allocations that still place tensors, and the contexts that hold
    their buffers. Allocating a graph releases every earlier allocation but for the
    tensors the new graph uses (which stay where they are, values and all): a graph whose
    tensors were released is allocated again by the next alloc_graph, never computed on
    memory it lost."""
    cdef list entries           # [(Allocation, [(Context, Storage)])]

    def __cinit__(self):
        self.entries = []

    cdef int release_for(self, list tensors) except -1:
        cdef set keep = set(tensors)
        cdef Allocation a
        cdef size_t i
        cdef ggml_tensor * t
        for a, regs in self.entries:
            # what another thread computes now must keep its memory: refuse, release nothing
            for i in range(a.n_placed):
                t = a.placed[i].t
                if t.buffer == a.placed[i].buffer and <uintptr_t>t not in keep and tensor_in_use(t):
                    raise GraphBusyError(
                        f"alloc_graph: tensor {t.name.decode(errors='replace')!r} of an earlier allocation, which "
                        f"this one releases, is in a graph another thread is computing: allocate after it returns")
        kept = []
        for a, regs in self.entries:
            if a.release(keep):
                kept.append((a, regs))
            else:
                for c, st in regs:
                    (<Context>c)._drop_storage(st)
        self.entries = kept
        return 0

    cdef int drop(self, Allocation a) except -1:
        """Release ``a`` wholly and let its contexts go of it."""
        a.release()
        kept = []
        for b, regs in self.entries:
            if b is a:
                for c, st in regs:
                    (<Context>c)._drop_storage(st)
            else:
                kept.append((b, regs))
        self.entries = kept
        return 0

    cdef size_t add(self, Allocation a, Graph graph) except? 0:
        """Every open context holding a tensor ``a`` placed holds the buffer it lies in.
        Returns the bytes of ``a``'s buffers."""
        cdef list ctxs = [graph.ctx] + list(graph._ctxs or ())
        cdef size_t i, total = 0
        cdef ggml_tensor * t
        cdef Context c
        regs = []
        held = set()
        for i in range(a.n_placed):
            t = a.placed[i].t
            if <uintptr_t>t.buffer not in a.buffers:
                continue                          # a view into another allocation's memory
            for c in ctxs:
                if c._holds(t):
                    if c.ptr != NULL and (c, <uintptr_t>t.buffer) not in held:
                        held.add((c, <uintptr_t>t.buffer))
                        st = a.storage(t.buffer)
                        c._add_storage(st)
                        regs.append((c, st))
                    break
        for key in a.buffers:
            total += ggml_backend_buffer_get_size(<ggml_backend_buffer_t><uintptr_t>key)
        if a.n_placed:
            self.entries.append((a, regs))
        return total


cdef int _after_failure(Allocation a, list before, Graph graph) except -1:
    """An allocation that failed midway: clear what it placed before raising."""
    a.record(before, graph._pools)
    a.release()
    return 0


@cython.final
cdef class GraphAllocator:
    """GraphAllocator(backend)

    ggml's graph allocator (``ggml_gallocr``) for ``backend``'s default buffer type:
    ``alloc_graph(graph)`` gives every tensor of the graph without data memory in one
    of its buffers, reusing the memory of tensors no longer needed (ggml's liveness
    analysis: intermediate results share memory; outputs and inputs, marked with
    ``set_output``/``set_input``, keep theirs; pyggml never lets a node overwrite an
    input in place).

    Each ``alloc_graph`` is a new allocation, and releases this allocator's earlier ones
    but for the tensors the new graph uses: a released tensor has no data until a graph
    holding it is allocated again (computing its graph raises until then). The tensors'
    contexts hold the allocation, numpy views of its tensors keep its memory. Allocate a
    graph once and compute it many times."""

    cdef readonly Backend backend
    cdef _History _history

    def __cinit__(self, backend):
        cdef Backend b = arg_instance(backend, Backend, "backend", "GraphAllocator")
        b._need_open()
        self.backend = b
        self._history = _History()

    def __repr__(self):
        return f"<pyggml.GraphAllocator for {self.backend.name}>"

    def alloc_graph(self, graph):
        """alloc_graph(graph) -> int: allocate the graph's tensors that have no data
        (``ggml_gallocr_alloc_graph``). Returns the bytes allocated."""
        cdef Graph gr = arg_instance(graph, Graph, 'graph', 'alloc_graph')
        self.backend._need_open()
        gr._check_idle()
        cdef list tensors = _tensors_of(gr)
        self._history.release_for(tensors)
        cdef ggml_backend_buffer_type_t buft = ggml_backend_get_default_buffer_type(self.backend.ptr)
        cdef _Gallocation alloc = _Gallocation.__new__(_Gallocation)
        alloc.ptr = ggml_gallocr_new(buft)
        if alloc.ptr == NULL:
            raise MemoryError("alloc_graph: ggml_gallocr_new failed")
        alloc.remote = self.backend.remote
        cdef _AllocGraph a
        a.allocator = alloc.ptr
        a.graph = gr.ptr
        a.sched = False
        a.ok = 0
        cdef list before = _without_buffer(tensors)
        cdef list marked = _protect_inputs(tensors)
        try:
            _try_alloc_graph(alloc.remote, &a, (self, alloc, gr))
        finally:
            _unprotect(marked)
        cdef pyggml_guard * g = &a.g
        cdef int ok = a.ok, rc = a.rc
        if not rc or not ok:
            _after_failure(alloc, before, gr)
            if not rc:
                raise_remote_aborted(alloc.remote, g, "alloc_graph: ggml_gallocr_alloc_graph")
            raise ContextFullError("alloc_graph: ggml_gallocr_alloc_graph could not allocate its buffer"
                                   + guard_logged(g))
        alloc.record(before, gr._pools)
        return self._history.add(alloc, gr)


# ggml_backend_sched_new asserts n_backends <= GGML_SCHED_MAX_BACKENDS, which only
# ggml-backend.cpp defines (16 in every release pyggml builds against)
cdef int _MAX_BACKENDS = 16


cdef void _sched_free(ggml_backend_sched_t p, tuple backends) noexcept:
    """Free a scheduler of _sched_new: its backends may be closed again."""
    cdef Backend b
    _free_remotely(_remote_of(backends), _sched_free_call, p)
    for b in backends:
        b._users -= 1


cdef ggml_backend_sched_t _sched_new(tuple backends, size_t graph_size) except NULL:
    cdef ggml_backend_t ptrs[16]
    cdef Backend b
    for i, b in enumerate(backends):
        b._need_open()
        ptrs[i] = b.ptr
    cdef ggml_backend_sched_t p = pyggml_sched_new_nothrow(ptrs, len(backends), graph_size)
    if p == NULL:
        raise ContextFullError(f"Scheduler: ggml_backend_sched_new failed for a graph of {graph_size} nodes")
    for b in backends:
        b._users += 1
    return p


cdef ggml_status _sched_compute_on(ggml_cgraph * graph, void * sched) noexcept nogil:
    return pyggml_sched_compute_nothrow(graph, sched)


@cython.final
@cython.no_gc_clear    # its dealloc gives its backends back
cdef class Scheduler:
    """Scheduler(backends, graph_size=2048)

    ``ggml_backend_sched`` over ``backends`` (a list of :class:`Backend`, the CPU
    backend last, as ggml requires): each node of a graph goes to the first backend
    that supports it (the CPU one last), and the scheduler copies tensors between them.
    ``alloc_graph(graph)`` allocates a graph's tensors in the backends' buffers;
    ``graph_compute(graph)`` computes it (allocating it first if needed). ggml-opt's
    :class:`pyggml.opt.Optimizer` trains over a Scheduler too. The backends cannot be
    closed while it, or an allocation of it, lives.

    Each ``alloc_graph`` is a new allocation, as with :class:`GraphAllocator`: it
    releases the earlier ones but for the tensors the new graph uses. Two graphs
    computed in turn (train and eval) are each allocated again when their turn comes."""

    def __cinit__(self, backends, graph_size=2048):
        self.ptr = NULL
        try:
            bs = tuple(backends) if not isinstance(backends, Backend) else (backends,)
        except TypeError:                   # not iterable
            bs = ()
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
        self._history = _History()

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

    def alloc_graph(self, graph):
        """alloc_graph(graph) -> int: split the graph over the backends and allocate the
        tensors that have no data (``ggml_backend_sched_alloc_graph``, in a scheduler of
        its own). Returns the bytes of the buffers the new allocation made."""
        cdef Graph gr = arg_instance(graph, Graph, 'graph', 'alloc_graph')
        cdef Backend b
        for b in self.backends:
            b._need_open()
        gr._check_idle()
        self._check_nodes(gr)
        cdef list tensors = _tensors_of(gr)
        cdef _History history = self._history
        history.release_for(tensors)
        self._current = None
        cdef int n_nodes = ggml_graph_n_nodes(gr.ptr)
        cdef size_t size = max(self.graph_size, 2 * <size_t>ggml_graph_size(gr.ptr) + 16)
        cdef _SchedAllocation alloc = _SchedAllocation.__new__(_SchedAllocation)
        alloc.ptr = _sched_new(self.backends, size)
        alloc.backends = self.backends
        alloc.graph = weakref.ref(gr)
        alloc.n_nodes = n_nodes
        alloc.members = set(tensors)
        cdef _AllocGraph a
        a.allocator = alloc.ptr
        a.graph = gr.ptr
        a.sched = True
        a.ok = 0
        cdef list before = _without_buffer(tensors)
        cdef list marked = _protect_inputs(tensors)
        try:
            _try_alloc_graph(_remote_of(self.backends), &a, (self, alloc, gr))
        finally:
            _unprotect(marked)
        cdef pyggml_guard * g = &a.g
        cdef int ok = a.ok, rc = a.rc
        if not rc:
            # the scheduler stopped midway: leak it (its state is unknown), let its backends go
            _after_failure(alloc, before, gr)
            alloc.ptr = NULL
            for b in self.backends:
                b._users -= 1
            raise_remote_aborted(_remote_of(self.backends), g, "alloc_graph: ggml_backend_sched_alloc_graph")
        if not ok:
            _after_failure(alloc, before, gr)
            raise ContextFullError("alloc_graph: ggml_backend_sched_alloc_graph could not allocate its buffers"
                                   + guard_logged(g))
        alloc.record(before, gr._pools)
        total = history.add(alloc, gr)
        self._current = alloc
        return total

    @property
    def n_splits(self):
        """The splits of the last allocated graph (runs of nodes on one backend)."""
        return 0 if self._current is None else ggml_backend_sched_get_n_splits((<_SchedAllocation>self._current).ptr)

    def backend_of(self, node):
        """backend_of(node) -> Backend or None: the backend the last allocation gave
        ``node`` (``ggml_backend_sched_get_tensor_backend``); None for a tensor outside
        the graph it allocated."""
        cdef Tensor t = arg_instance(node, Tensor, 'node', 'backend_of')
        t._check()
        cdef _SchedAllocation cur = self._current
        if cur is None or <uintptr_t>t.ptr not in cur.members:
            return None             # ggml would add it to the scheduler's hash set, which fills up
        cdef ggml_backend_t p = ggml_backend_sched_get_tensor_backend(cur.ptr, t.ptr)
        for b in self.backends:
            if (<Backend>b).ptr == p:
                return b
        return None

    def graph_compute(self, graph, n_threads=None):
        """graph_compute(graph, n_threads=None): compute ``graph``
        (``ggml_backend_sched_graph_compute``) with the GIL released, after pyggml's
        checks; allocates it first unless it is this scheduler's last allocated graph (a
        graph whose leafs would get fresh memory that way is refused: they would hold no
        values; allocate it, set them, then compute). ``n_threads``: for every backend that
        takes a thread count (the CPU and BLAS backends; default: each backend's own)."""
        cdef Graph g = arg_instance(graph, Graph, 'graph', 'graph_compute')
        cdef Backend b
        for b in self.backends:
            b._need_open()
        g._check()
        cdef _SchedAllocation cur = self._current
        if (cur is None or cur.graph() is not g or cur.n_nodes != ggml_graph_n_nodes(g.ptr)
                or g._still_unallocated()):
            self.alloc_graph(g)
            cur = self._current
            try:
                _need_values(cur)
            except BaseException:
                # not left current: the next graph_compute must not take garbage for values
                (<_History>self._history).drop(cur)
                self._current = None
                raise
        cdef int n, most = 1
        begin_compute(g, self.backends, "compute")
        try:
            keep = g._hold()
            for b in self.backends:
                n = _need_threads(n_threads if n_threads is not None else b._n_threads)
                if b.is_cpu:
                    b._prepare(g, n)
                    most = max(most, n)
                    continue
                b._set_threads(n)
                if g._index_ops and not ggml_backend_buft_is_host(ggml_backend_get_default_buffer_type(b.ptr)):
                    raise ArgumentError(f"compute: the graph reads positions from tensor values (get_rows, ...), "
                                        f"which pyggml cannot check in {b.name}'s memory")
            note_threads(most)
        except BaseException:
            g._set_busy(False)
            unlock_backends(self.backends)
            raise
        # the guarded proof computes the whole graph on the CPU from host memory: needed when
        # the CPU computes nodes, possible when every backend's memory is the host's
        cdef bint prove = g._unproven and _sched_cpu_nodes(cur, self.backends) > 0
        if prove and not all((<Backend>b).host for b in self.backends):
            g._set_busy(False)
            unlock_backends(self.backends)
            raise ArgumentError(f"compute: the scheduler gives the CPU nodes that need pyggml's guarded proof "
                                f"first ({_why_proof(g)}); the proof reads the graph in host memory, and parts "
                                f"of it are in {', '.join(b.name for b in self.backends if not (<Backend>b).host)}'s")
        compute_locked(g, _sched_compute_on, cur.ptr, prove, "ggml_backend_sched_graph_compute",
                       self.backends, (keep, cur))


cdef int _sched_cpu_nodes(_SchedAllocation cur, object backends):
    """How many of the allocated graph's nodes the scheduler gave a CPU backend."""
    cdef int i, n = 0
    cdef ggml_backend_t p
    cdef ggml_cgraph * gp = (<Graph>cur.graph()).ptr
    for i in range(ggml_graph_n_nodes(gp)):
        p = ggml_backend_sched_get_tensor_backend(cur.ptr, ggml_graph_node(gp, i))
        for b in backends:
            if (<Backend>b).ptr == p and (<Backend>b).is_cpu:
                n += 1
                break
    return n


cdef int _need_values(_SchedAllocation a) except -1:
    """After graph_compute allocated a graph itself: a leaf it placed holds no value."""
    cdef size_t i
    cdef ggml_tensor * t
    for i in range(a.n_placed):
        t = a.placed[i].t
        if t.op == GGML_OP_NONE and t.view_src == NULL:
            raise ArgumentError(
                f"compute: the graph was not allocated (or its allocation was released by another alloc_graph), "
                f"so graph_compute allocated it, and its leaf {t.name.decode(errors='replace')!r} got fresh memory "
                f"that holds no value: call alloc_graph(graph), set the leafs, then graph_compute")
    return 0
