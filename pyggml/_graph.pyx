# cython: language_level=3
"""pyggml._graph: the Graph (ggml_cgraph): building it forward and backward.

Computing is the executor's job (``pyggml._cpu`` today): ``Graph.compute`` hands the
graph to it. Every node that enters a graph is checked against its CPU kernel's
preconditions (csrc/rules_*.c); a graph holding an op pyggml has no rule for yet is
proven once, in a forked child, before its first compute.
"""

cimport cython
from libc.stdint cimport int64_t, uint64_t, uintptr_t
from libc.stdlib cimport malloc, realloc
from libc.string cimport memcpy, memset

from pyggml._ggml cimport *
from pyggml._rt cimport *
from pyggml._core cimport Context, Storage, Tensor, arg_tensor, check_node, need_open, raise_status, wrap
cimport pyggml._core as _c

from pyggml.errors import (ArgumentError, ContextClosedError, ContextFullError, GGMLAbort, GGMLTypeError,
                           GraphBusyError, GraphFullError, InternalError, UpstreamDefect)
# a Python name for the defaults below, so that their text signatures resolve
from pyggml._core import DEFAULT_GRAPH_SIZE

from libc.stdlib cimport free


# ggml walks a graph recursively (ggml_visit_parents_graph): a chain of n new nodes
# needs about n frames of C stack. Beyond this many new nodes, pyggml runs the walk on
# a thread of its own with a stack sized for it (tests/test_graph.py: 200,000 nodes).
cdef size_t _DEEP = 8192
cdef size_t _FRAME_BYTES = 512          # generous: a frame of ggml_visit_parents_graph


cdef size_t _stack_for(size_t n_nodes):
    return 0 if n_nodes < _DEEP else (1 << 20) + _FRAME_BYTES * n_nodes


def _backward_sources(str op, sub=None):
    """_backward_sources(op, sub=None) -> int  (for pyggml.differentiable)

    The sources ggml's backward pass gives a gradient on a node of ``op`` (a ggml op name;
    ``sub`` the unary or GLU op's): a bit mask (bit j: src j), or -1 where it has no case."""
    cdef bytes o = op.encode()
    cdef bytes s = sub.encode() if sub is not None else b""
    return pyggml_backward_sources(o, <const char *>s if sub is not None else NULL)


cdef class Executor:
    """The seam between a graph and what computes it. Graph.compute hands the graph to
    the installed executor (pyggml._cpu.CpuExecutor); subclasses override run/work."""

    cdef int run(self, Graph graph, object n_threads, bint use_ref) except -1:
        raise NotImplementedError("Executor.run")

    cdef object work(self, Graph graph, object n_threads, bint plan_only):
        raise NotImplementedError("Executor.work")


cdef inline int64_t _work_elems(const ggml_tensor * p) noexcept:
    """A cheap measure of a node's work: its largest operand's elements."""
    cdef int64_t n = ggml_nelements(p)
    if p.src[0] != NULL and ggml_nelements(p.src[0]) > n:
        n = ggml_nelements(p.src[0])
    if p.src[1] != NULL and ggml_nelements(p.src[1]) > n:
        n = ggml_nelements(p.src[1])
    return n


cdef Executor _executor = None

# the graphs being computed now (Graph._set_busy): an allocation must not clear their tensors
cdef set _computing = set()


cdef bint tensor_in_use(const ggml_tensor * t) noexcept:
    cdef Graph g
    for g in _computing:
        if pg_ptrset_contains(&g._seen, <uintptr_t>t):
            return True
    return False


def _set_default_executor(Executor executor not None):
    """Install the executor Graph.compute uses (pyggml._cpu does, at import)."""
    global _executor
    _executor = executor


@cython.final
cdef class Graph:
    """Graph(ctx, size=DEFAULT_GRAPH_SIZE, grads=False)

    A computation graph (``ggml_new_graph_custom``) allocated in ``ctx``, with
    room for ``size`` nodes and ``size`` leafs.
    """

    def __cinit__(self, ctx, size=DEFAULT_GRAPH_SIZE, grads=False):
        self.ptr = NULL
        memset(&self._seen, 0, sizeof(self._seen))
        cdef Context c = _c.arg_context(ctx, "Graph")
        lsize = _c.index_arg(size, "size", "Graph")
        if not 1 <= lsize <= (1 << 30):
            raise ArgumentError(f"size must be in [1, 2**30], got {size}")
        cdef size_t csize = lsize
        cdef bint cgrads = _c.arg_bool(grads, "grads", "Graph")
        cdef size_t need = ggml_graph_overhead_custom(csize, cgrads)
        if ggml_used_mem(c.ptr) + need > c.mem_size:
            c._reserve(need, f"Graph(size={size})")        # raises, naming the size
        c._reserve(need, "Graph")
        self.ptr = ggml_new_graph_custom(c.ptr, csize, cgrads)
        self.ctx = c
        self.size = csize
        self.grads = cgrads
        self._ctxs = None
        self._pools = {c.pool}
        self._epoch = _c.placement_epoch()

    def __dealloc__(self):
        pg_ptrset_free(&self._seen)

    @staticmethod
    def overhead(size=DEFAULT_GRAPH_SIZE, grads=False):
        """Bytes a Graph of ``size`` takes in its context (``ggml_graph_overhead_custom``)."""
        return ggml_graph_overhead_custom(_c.index_arg(size, "size", "overhead"), bool(grads))

    cdef void _set_busy(self, bint busy) noexcept:
        """Computing (or done): the one place the busy flag changes, so that the graphs
        being computed are known (tensor_in_use)."""
        self._busy = busy
        if busy:
            _computing.add(self)
        else:
            _computing.discard(self)

    cdef int _check(self) except -1:
        cdef Context c
        if self.ctx.ptr == NULL:
            raise ContextClosedError("graph used after its context was closed")
        return 0

    cdef int _check_idle(self) except -1:
        # a graph must not change while another thread computes it
        if self._busy:
            raise GraphBusyError("the graph is being computed in another thread")
        return self._check()

    cdef int _ready(self, str what) except -1:
        """The first half of every executor's prologue (Graph.compute's, a Backend's, a
        Scheduler's, compare_graph_backend's): the graph open, every tensor with data,
        no other thread computing it. Then the executor takes what it computes with
        (backends' locks) and the graph (_take)."""
        self._check()
        if self._still_unallocated():
            raise ArgumentError(f"{what}: the graph has tensors without data (from a no_alloc context whose "
                                f"tensors are not allocated in a backend buffer yet, or whose allocation was "
                                f"replaced or freed): allocate it")
        if self._busy:
            raise GraphBusyError(f"{what}: this graph is already being computed in another thread")
        return 0

    cdef int _take(self, str what) except -1:
        """The second half: the graph busy until the executor gives it back
        (_set_busy(False)); refused if another thread took it meanwhile (while this one
        waited for a backend's lock)."""
        if self._busy:
            raise GraphBusyError(f"{what}: this graph is already being computed in another thread")
        self._set_busy(True)
        return 0

    cdef int _check_threads(self, int n, str what) except -1:
        """UpstreamDefect where ``n`` threads outnumber the heads of a node whose kernel
        splits heads over threads, on a ggml whose kernels then hang or compute wrong values
        (pyggml.defects "wkv-threads-over-heads", measured by its probe). Every executor
        calls it with the thread count it computes on."""
        if self._thread_heads == 0 or n <= self._thread_heads:
            return 0
        from pyggml.defects import present
        if present("wkv-threads-over-heads"):
            from pyggml import ggml_version
            raise UpstreamDefect(
                f"{what}: the graph has an RWKV_WKV6, GATED_LINEAR_ATTN or RWKV_WKV7 node with {self._thread_heads} "
                f"head(s), and ggml {ggml_version()}'s kernels hang (WKV6, GLA) or compute wrong values (WKV7) "
                f"on more threads than heads: compute it on at most {self._thread_heads} thread(s)",
                "wkv-threads-over-heads")
        return 0

    cdef bint _still_unallocated(self):
        """Whether a tensor of the graph still has no data (tensors of a no_alloc context
        get theirs later, from a backend buffer; an allocation released clears what it
        placed): rescanned while one had none, and after any allocation was released."""
        if self._unallocated is None and self._epoch == _c.placement_epoch():
            return False
        cdef int i, j, n = ggml_graph_n_nodes(self.ptr)
        cdef ggml_tensor * p
        cdef ggml_tensor * s
        for i in range(n):
            p = ggml_graph_node(self.ptr, i)
            for j in range(-1, GGML_MAX_SRC + 1):
                s = p if j == -1 else (p.view_src if j == GGML_MAX_SRC else p.src[j])
                if s != NULL and s.data == NULL and ggml_nelements(s) != 0:
                    self._unallocated = <uintptr_t>s
                    return True
        self._unallocated = None
        self._epoch = _c.placement_epoch()
        return False

    cdef int _add_contexts(self, Context c) except -1:
        """The graph now reaches tensors of ``c`` (and of what ``c`` depends on): it keeps
        their pools, so that closing one of them never frees a node under the graph."""
        cdef Storage st
        if c is not self.ctx:
            if self._ctxs is None:
                self._ctxs = set()
            self._ctxs.add(c)
        if c.pool is not None:
            self._pools.add(c.pool)
        if c._deps:
            if self._ctxs is None:
                self._ctxs = set()
            self._ctxs.update(<set>c._deps)
            self._ctxs.discard(self.ctx)
            for st in c._dep_pools:
                if st.owner is None and st.buffer == NULL:      # a context's pool
                    self._pools.add(st)
        return 0

    cdef object _hold(self):
        """What a compute holds while the GIL is released (another thread may close a
        context or drop an allocation meanwhile): the pools of the graph's contexts, and
        the Allocation of every backend buffer its tensors lie in, found by the buffer's
        identity. Refuses a tensor without data (its allocation was released: allocate
        again) and one in a backend buffer pyggml does not hold."""
        if not _c.any_allocations():
            return self._pools
        cdef int i, j, n = ggml_graph_n_nodes(self.ptr)
        cdef ggml_tensor * p
        cdef ggml_tensor * s
        cdef _c.Allocation a
        cdef set allocs = set()
        for i in range(n):
            p = ggml_graph_node(self.ptr, i)
            for j in range(-1, GGML_MAX_SRC + 1):
                s = p if j == -1 else (p.view_src if j == GGML_MAX_SRC else p.src[j])
                if s == NULL or s.buffer == NULL:
                    if s != NULL and s.data == NULL and ggml_nelements(s) != 0:
                        raise ArgumentError(
                            f"compute: tensor {s.name.decode(errors='replace')!r} has no data: its allocation was "
                            f"replaced or freed (a later alloc_graph of the same allocator, or its context closed), "
                            f"or it was never allocated: allocate this graph again")
                    continue
                a = _c.allocation_of(s.buffer)
                if a is None:
                    raise ArgumentError(
                        f"compute: tensor {s.name.decode(errors='replace')!r} lies in a backend buffer pyggml does "
                        f"not hold (one ggml-opt or a scheduler allocated for itself): allocate this graph with "
                        f"a GraphAllocator or a Scheduler first")
                allocs.add(a)
        return (self._pools, allocs)

    def build_forward_expand(self, t):
        """build_forward_expand(t): add ``t`` and everything it depends on to the graph,
        and mark ``t`` as an output (``ggml_set_output``): like ggml, pyggml only
        guarantees the values of outputs after compute (the CPU backend fuses some op
        pairs, RMS_NORM + MUL, and skips writing the first); see :func:`set_output`.

        Raises GraphFullError, and leaves the graph as it was, when the new nodes or
        leafs would not fit its ``size`` (ggml would abort); a node whose CPU kernel
        would not run on it raises as the op that made it would.
        """
        self._check_idle()
        cdef Tensor tensor = arg_tensor(t, "t", "build_forward_expand")
        cdef int new_nodes = 0, new_leafs = 0, i, unchecked = 0, rc, added
        cdef pyggml_status st
        cdef ggml_tensor * refused = NULL
        cdef size_t sp = 0, cap = 64, n_added = 0
        cdef ggml_tensor * p
        cdef ggml_tensor * unallocated = NULL
        cdef int64_t node_elems = 0, heads = 0, thread_heads = 0
        cdef int index_ops = 0, fab_nodes = 0
        # One buffer: the DFS stack grows from the front, the added list from the back.
        # Small graphs use the array on the C stack; larger ones move to the heap.
        cdef ggml_tensor * local[64]
        cdef ggml_tensor ** buf = local
        cdef ggml_tensor ** grown
        try:
            buf[sp] = tensor.ptr
            sp += 1
            while sp:
                sp -= 1
                p = buf[sp]
                added = pg_ptrset_add(&self._seen, <uintptr_t>p)
                if added < 0:
                    self._forget(buf, cap, n_added)
                    raise MemoryError()
                if added == 0:
                    continue
                if sp + n_added + GGML_MAX_SRC + 1 > cap:
                    if buf == local:
                        grown = <ggml_tensor **>malloc(2 * cap * sizeof(ggml_tensor *))
                        if grown != NULL:
                            memcpy(grown, local, cap * sizeof(ggml_tensor *))
                    else:
                        grown = <ggml_tensor **>realloc(buf, 2 * cap * sizeof(ggml_tensor *))
                    if grown == NULL:
                        pg_ptrset_discard(&self._seen, <uintptr_t>p)
                        self._forget(buf, cap, n_added)
                        raise MemoryError()
                    # keep the added list at the back of the larger buffer
                    for i in range(<int>n_added):
                        grown[2 * cap - 1 - i] = grown[cap - 1 - i]
                    buf = grown
                    cap *= 2
                n_added += 1
                buf[cap - n_added] = p
                if p.op == GGML_OP_NONE and not (p.flags & GGML_TENSOR_FLAG_PARAM):
                    new_leafs += 1
                else:
                    new_nodes += 1
                    node_elems += _work_elems(p)
                    if pyggml_index_tensor(p) != NULL:
                        index_ops += 1
                    heads = pyggml_thread_heads(p)
                    if heads and (thread_heads == 0 or heads < thread_heads):
                        thread_heads = heads
                    rc = pyggml_check_node(p, &st)
                    if rc == PYGGML_UNCHECKED:
                        unchecked += 1
                    elif rc != PYGGML_OK and refused == NULL:
                        refused = p
                if p.data == NULL and unallocated == NULL and ggml_nelements(p) != 0:
                    unallocated = p
                if p.op == GGML_OP_FLASH_ATTN_BACK:
                    fab_nodes += 1
                for i in range(GGML_MAX_SRC):
                    if p.src[i] != NULL:
                        buf[sp] = p.src[i]
                        sp += 1
            if refused != NULL:
                self._forget(buf, cap, n_added)
                check_node(refused, "build_forward_expand")     # raises
            if self._n_nodes + new_nodes > <int>self.size or self._n_leafs + new_leafs > <int>self.size:
                self._forget(buf, cap, n_added)
                raise GraphFullError(f"build_forward_expand: the graph would hold {self._n_nodes + new_nodes} "
                                     f"nodes and {self._n_leafs + new_leafs} leafs; its size is {self.size}")
        finally:
            if buf != local:
                free(buf)
        cdef pyggml_guard g
        rc = pyggml_try_build_forward_expand(&g, self.ptr, tensor.ptr, _stack_for(n_added))
        if rc != 1:   # counted and checked above: ggml cannot abort here
            raise InternalError(f"build_forward_expand: ggml failed after pyggml's checks (please report): "
                               f"{g.message.decode('utf-8', 'replace') if rc == 0 else f'errno {-rc}'}")
        if tensor.ptr.op != GGML_OP_NONE:
            # what the caller asked for holds its values after compute, fused or not
            ggml_set_output(tensor.ptr)
        if unchecked:
            self._unchecked += unchecked
            self._unproven = True
        self._n_nodes += new_nodes
        self._n_leafs += new_leafs
        self._node_elems += node_elems
        self._index_ops += index_ops
        if thread_heads and (self._thread_heads == 0 or thread_heads < self._thread_heads):
            self._thread_heads = thread_heads
        if unallocated != NULL and self._unallocated is None:
            self._unallocated = <uintptr_t>unallocated
        self._fab_nodes += fab_nodes
        if tensor.ctx is not self.ctx or tensor.ctx._deps:
            self._add_contexts(tensor.ctx)

    cdef void _forget(self, ggml_tensor ** buf, size_t cap, size_t n_added):
        cdef size_t i
        for i in range(n_added):
            pg_ptrset_discard(&self._seen, <uintptr_t>buf[cap - 1 - i])

    @property
    def n_nodes(self):
        self._check()
        return ggml_graph_n_nodes(self.ptr)

    @property
    def nodes(self):
        """The graph's nodes in execution order."""
        self._check()
        cdef int i, n = ggml_graph_n_nodes(self.ptr)
        return [self._tensor(ggml_graph_node(self.ptr, i)) for i in range(n)]

    @property
    def unchecked_ops(self):
        """Nodes whose op pyggml has no kernel rule for yet (the graph is proven in a
        forked child before its first compute while there are any)."""
        self._check()
        return self._unchecked

    cdef object _tensor(self, ggml_tensor * p):
        cdef Context c
        if self.ctx._holds(p):
            return wrap(self.ctx, p)
        if self._ctxs is not None:
            for c in self._ctxs:
                if c._holds(p):
                    return wrap(c, p)
        raise InternalError("graph node belongs to no context pyggml knows")

    # --- the backward pass ---------------------------------------------------------------

    def build_backward_expand(self, Context ctx=None):
        """build_backward_expand(ctx=None)

        ``ggml_build_backward_expand(ctx, graph, NULL)``: add the backward pass of every
        loss (``set_loss``) with respect to every parameter (``set_param``) to this graph
        (made with ``grads=True``), creating the gradient tensors in ``ctx`` (default: the
        graph's context). Then initialise the gradients as ``ggml_graph_reset`` does (loss
        gradient 1, accumulators 0), so a compute gives the gradients at once.

        The call runs first on a copy of the graph in a scratch context, where an abort
        of ggml (an op without a backward, ...) becomes GGMLAbort, a graph too small
        GraphFullError and a context too small ContextFullError, and every node the
        backward pass adds is checked against its CPU kernel; only then for real.
        ``ctx`` keeps the contexts of the forward graph alive: its gradients point
        into them.
        """
        self._check_idle()
        if ctx is None:
            ctx = self.ctx
        need_open(ctx)
        if not self.grads:
            raise ArgumentError("build_backward_expand: the graph was made without gradients; "
                                "use Graph(ctx, size, grads=True)")
        cdef int i, n = ggml_graph_n_nodes(self.ptr)
        cdef bint any_param = False, any_loss = False
        cdef ggml_tensor * p
        for i in range(n):
            p = ggml_graph_node(self.ptr, i)
            any_param = any_param or (p.flags & GGML_TENSOR_FLAG_PARAM) != 0
            any_loss = any_loss or (p.flags & GGML_TENSOR_FLAG_LOSS) != 0
        if not any_param:
            raise ArgumentError("build_backward_expand: no parameter among the graph's nodes; "
                                "call set_param on inputs before build_forward_expand")
        if not any_loss:
            raise ArgumentError("build_backward_expand: no loss among the graph's nodes; "
                                "call set_loss on a scalar output")
        if ctx.no_alloc:
            raise ArgumentError("build_backward_expand: ctx is no_alloc; gradients need memory")
        if self._unallocated is not None:
            raise ArgumentError("build_backward_expand: the graph has tensors without data "
                                "(from a no_alloc context, or empty: ggml gives those none)")
        cdef pyggml_status st
        pyggml_check_backward(self.ptr, &st)
        raise_status(&st, "build_backward_expand")
        cdef uint64_t need = self._dry_backward(ctx)
        ctx._reserve(need, "build_backward_expand")
        cdef pyggml_guard g
        cdef int rc = pyggml_try_build_backward_expand(&g, ctx.ptr, self.ptr, _stack_for(self.size))
        if rc != 1:
            raise InternalError(f"build_backward_expand: ggml failed after a clean scratch run (please report): "
                               f"{g.message.decode('utf-8', 'replace') if rc == 0 else f'errno {-rc}'}")
        # the gradients (in ctx) point into every context the forward graph reaches
        ctx._depend_on(self.ctx)
        if self._ctxs is not None:
            for c in list(self._ctxs):
                ctx._depend_on(c)
        self._add_contexts(ctx)
        self._track_new_nodes(n)
        ggml_graph_reset(self.ptr)

    cdef uint64_t _dry_backward(self, Context ctx) except? 0:
        """Run the backward pass on a copy of the graph in a scratch context; raise what
        the real call would hit; return the bytes the real call takes from ``ctx``."""
        cdef size_t ssize = 4 * self.size + 64
        cdef size_t n_tensors = 16 * <size_t>ggml_graph_n_nodes(self.ptr) + 256
        cdef pyggml_guard g
        cdef ggml_init_params params
        cdef ggml_context * sctx
        cdef ggml_cgraph * sgraph
        cdef ggml_tensor * t
        cdef int rc, i, n0 = ggml_graph_n_nodes(self.ptr)
        cdef uint64_t need
        for attempt in range(8):
            mem = ggml_graph_overhead_custom(ssize, True) + n_tensors * ggml_tensor_overhead()
            pool = Storage(mem)
            params.mem_size = mem
            params.mem_buffer = pool.ptr
            params.no_alloc = True
            sctx = ggml_init(params)
            try:
                sgraph = ggml_new_graph_custom(sctx, ssize, True)
                ggml_graph_cpy(self.ptr, sgraph)
                rc = pyggml_try_build_backward_expand(&g, sctx, sgraph, _stack_for(ssize))
                if rc < 0:
                    raise OSError(-rc, "build_backward_expand: cannot start a thread for a deep graph")
                full = (ggml_used_mem(sctx) + 2 * ggml_tensor_overhead() > mem
                        or ggml_graph_n_nodes(sgraph) >= <int>ssize)
                if rc == 0 and full:          # the scratch was too small: more room, again
                    ssize *= 4
                    n_tensors *= 4
                    continue
                if rc == 0:
                    _c.raise_aborted(&g, "build_backward_expand", "")
                if ggml_graph_n_nodes(sgraph) > <int>self.size:
                    raise GraphFullError(f"build_backward_expand: the graph would hold "
                                         f"{ggml_graph_n_nodes(sgraph)} nodes; its size is {self.size}")
                for i in range(n0, ggml_graph_n_nodes(sgraph)):
                    check_node(ggml_graph_node(sgraph, i), "build_backward_expand")
                need = 0
                t = ggml_get_first_tensor(sctx)
                while t != NULL:
                    need += _c.tensor_bytes(t, False)
                    t = ggml_get_next_tensor(sctx, t)
                return need
            finally:
                ggml_free(sctx)
        raise ContextFullError("build_backward_expand: the backward pass is too large to dry-run")

    cdef int _track_new_nodes(self, int first) except -1:
        """Account for nodes ggml added from index ``first`` on (and their leafs)."""
        cdef int i, j, added, n = ggml_graph_n_nodes(self.ptr)
        cdef int64_t heads
        cdef ggml_tensor * p
        cdef ggml_tensor * s
        cdef list stack = []
        for i in range(first, n):
            stack.append(<uintptr_t>ggml_graph_node(self.ptr, i))
        while stack:
            p = <ggml_tensor *><uintptr_t>stack.pop()
            added = pg_ptrset_add(&self._seen, <uintptr_t>p)
            if added < 0:
                raise MemoryError()
            if added == 0:
                continue
            if p.op == GGML_OP_NONE and not (p.flags & GGML_TENSOR_FLAG_PARAM):
                self._n_leafs += 1
            else:
                self._n_nodes += 1
                self._node_elems += _work_elems(p)
                if pyggml_index_tensor(p) != NULL:
                    self._index_ops += 1
                heads = pyggml_thread_heads(p)
                if heads and (self._thread_heads == 0 or heads < self._thread_heads):
                    self._thread_heads = heads
                if check_node(p, "build_backward_expand"):
                    self._unchecked += 1
                    self._unproven = True
            for j in range(GGML_MAX_SRC):
                s = p.src[j]
                if s != NULL:
                    stack.append(<uintptr_t>s)
        return 0

    def reset(self):
        """reset(): ``ggml_graph_reset``: loss gradients to 1, other gradients to 0."""
        self._check_idle()
        if not self.grads:
            raise ArgumentError("reset: the graph was made without gradients")
        if self._unallocated is not None:
            raise ArgumentError("reset: the graph has tensors without data (from a no_alloc context, "
                                "or empty: ggml gives those none)")
        ggml_graph_reset(self.ptr)

    def grad(self, t):
        """grad(t) -> Tensor or None: the gradient of the losses with respect to ``t``
        (``ggml_graph_get_grad``), None if the graph has none for it."""
        self._check()
        cdef Tensor tensor = arg_tensor(t, "t", "grad")
        cdef ggml_tensor * gr = ggml_graph_get_grad(self.ptr, tensor.ptr)
        if gr == NULL:
            return None
        return self._tensor(gr)

    def compute(self, n_threads=None, use_ref=False):
        """compute(n_threads=None, use_ref=False)

        Compute the graph on the CPU with ``n_threads`` threads (default: the CPUs
        this process may use), the GIL released. The work buffer is allocated by
        pyggml, not taken from the context. ``use_ref``: the CPU backend's reference
        implementations (``ggml_cplan.use_ref``: no fusion, no tiled or SIMD-only
        paths where ggml has a plain one); GGMLVersionError if the linked ggml has no
        such switch. Raises ComputeError when ggml reports a non-success status.
        """
        _executor.run(self, n_threads, use_ref)

    def to_dot(self):
        """to_dot() -> str: the graph as Graphviz DOT text (nodes, ops, types, shapes, op
        params, gradients), as ``ggml_graph_dump_dot`` shows it (pyggml.graphviz)."""
        from pyggml.graphviz import to_dot
        return to_dot(self)

    def draw(self, path, format=None):
        """draw(path, format=None): a picture of the graph (SVG, PNG, ... from the path's
        suffix), through Graphviz's ``dot`` program."""
        from pyggml.graphviz import draw
        draw(self, path, format)

    def _repr_svg_(self):
        """The graph as SVG in a notebook (None when Graphviz's ``dot`` is missing)."""
        import shutil
        if shutil.which("dot") is None:
            return None
        from pyggml.graphviz import to_svg
        return to_svg(self)

    def work_size(self, n_threads):
        """work_size(n_threads) -> int: bytes of work buffer ``compute(n_threads)`` allocates."""
        return _executor.work(self, n_threads, False)

    def _plan_work_size(self, n_threads):
        """Bytes ``ggml_graph_plan`` alone asks for (to show upstream's shortfall)."""
        return _executor.work(self, n_threads, True)
