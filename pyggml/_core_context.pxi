# Included by _core.pyx: the Context.

cdef inline uint64_t _pad(uint64_t x):
    return (x + GGML_MEM_ALIGN - 1) // GGML_MEM_ALIGN * GGML_MEM_ALIGN


cdef frozenset _NO_DEPS = frozenset()     # most contexts never reference another


@cython.final
cdef class Context:
    """Context(mem_size, no_alloc=False)

    A ggml context: a memory pool of ``mem_size`` bytes that holds tensors (their
    headers and, unless ``no_alloc``, their data) and graphs.

    Parameters
    ----------
    mem_size : int
        Pool size in bytes, > 0. Each tensor takes ``ggml_tensor_overhead()``
        bytes plus its data padded to ``MEM_ALIGN``; a graph takes
        ``Graph.overhead(size)``.
    no_alloc : bool
        Create tensors without data (shape inference only); such graphs cannot
        be computed.

    Notes
    -----
    A Context is a context manager; ``close()`` frees the ggml_context. Tensors
    of a closed context raise :class:`~pyggml.ContextClosedError`; numpy views taken
    before stay valid, and so do tensors of other contexts made from its tensors.
    """

    def __cinit__(self, mem_size, no_alloc=False):
        self.ptr = NULL
        mem_size = index_arg(mem_size, "mem_size", "Context")
        if mem_size <= 0:
            raise ArgumentError(f"mem_size must be > 0 bytes, got {mem_size}")
        if mem_size > (1 << 62):
            raise ContextFullError(f"mem_size={mem_size} bytes is too large")
        cdef bint c_no_alloc = arg_bool(no_alloc, "no_alloc", "Context")
        self.pool = Storage.__new__(Storage)
        self.pool._alloc(mem_size)
        self._asan_end = mem_size
        pg_asan_reserve(self.pool.ptr, 0, 0, mem_size, &self._asan_end)     # ASan builds: all poisoned
        cdef ggml_init_params params
        params.mem_size = mem_size
        params.mem_buffer = self.pool.ptr
        params.no_alloc = c_no_alloc
        self.ptr = ggml_init(params)
        self._base = <uintptr_t>self.pool.ptr
        self.mem_size = mem_size
        self.no_alloc = c_no_alloc
        self._deps = _NO_DEPS
        self._dep_pools = _NO_DEPS

    def __dealloc__(self):
        if self.ptr != NULL:
            ggml_free(self.ptr)
            self.ptr = NULL

    def close(self):
        """Free the ggml_context (idempotent). Tensors of this context raise afterwards.

        The pool itself is freed when nothing points into it any more: numpy views
        of its tensors, and open contexts whose tensors were made from them, keep it.
        """
        if self.ptr != NULL:
            ggml_free(self.ptr)
            self.ptr = NULL
        self.pool = None
        self._deps = _NO_DEPS
        self._dep_pools = _NO_DEPS
        self._borrowed = None

    @property
    def closed(self):
        return self.ptr == NULL

    def __enter__(self):
        need_open(self, "Context")
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        if self.ptr == NULL:
            return "<pyggml.Context closed>"
        return f"<pyggml.Context used={self.used_mem} mem_size={self.mem_size} no_alloc={bool(self.no_alloc)}>"

    @property
    def used_mem(self):
        """Bytes of the pool in use (``ggml_used_mem``)."""
        need_open(self)
        return ggml_used_mem(self.ptr)

    cdef int _reserve(self, uint64_t nbytes, str what) except -1:
        """Raise ContextFullError unless ``nbytes`` more bytes of objects fit the pool."""
        need_open(self)
        cdef uint64_t used = ggml_used_mem(self.ptr)
        if used + nbytes > self.mem_size:
            raise ContextFullError(f"{what} needs {nbytes} bytes but the context has {self.mem_size - used} "
                                   f"of {self.mem_size} free")
        # ASan builds: exactly the bytes the allocation takes become addressable
        pg_asan_reserve(self.pool.ptr, used, nbytes, self.mem_size, &self._asan_end)
        return 0

    cdef int _depend_on(self, Context other) except -1:
        """Tensors of this context now point into ``other`` (and what it depends on)."""
        if other is self:
            return 0
        if self._deps is _NO_DEPS:
            self._deps = set()
        if self._dep_pools is _NO_DEPS:
            self._dep_pools = set()
        self._deps.add(other)
        self._deps.update(other._deps)
        self._deps.discard(self)
        if other.pool is not None:
            self._dep_pools.add(other.pool)
        self._dep_pools.update(other._dep_pools)
        return 0

    cdef int _add_storage(self, Storage s) except -1:
        """Tensors of this context now (also) point into ``s`` (a backend buffer): it
        lives while the context is open, and while views of those tensors do."""
        if self._dep_pools is _NO_DEPS:
            self._dep_pools = set()
        self._dep_pools.add(s)
        self._n_buffers += 1
        return 0

    cdef int _drop_storage(self, Storage s) except -1:
        """Tensors of this context no longer use ``s`` (a graph allocation replaced)."""
        if self._dep_pools is not _NO_DEPS:
            self._dep_pools.discard(s)
        return 0

    cdef Tensor _adopt(self, ggml_tensor * p, tuple srcs):
        """Wrap a tensor this context just created from the tensors ``srcs`` (None allowed)."""
        cdef Tensor s
        for s in srcs:
            if s is not None and s.ctx is not self:
                self._depend_on(s.ctx)
        return wrap(self, p)

    cdef Storage _storage_of(self, const void * data, size_t nbytes):
        """The storage (this context's or a dependency's) holding ``nbytes`` at ``data``."""
        cdef Storage pool
        if self.pool is not None and self.pool.contains(data, nbytes):
            return self.pool
        for pool in self._dep_pools:
            if pool.contains(data, nbytes):
                return pool
        return None

    cdef bint _holds(self, const void * p):
        # address comparison only: valid after close(), when the pool may be gone
        cdef uintptr_t a = <uintptr_t>p
        return a >= self._base and a - self._base < self.mem_size

    cdef Context _owner_of(self, const void * p):
        """The context (this one or a dependency) whose pool holds the tensor at ``p``."""
        cdef Context c
        if self._holds(p):
            return self
        for c in self._deps:
            if c._holds(p):
                return c
        return None

    def new_tensor(self, type, ne):
        """new_tensor(type, ne) -> Tensor

        A new tensor of ``type`` with ``ne`` elements per dimension, in ggml order
        (fastest first, 1 to 4 values; ``ne[0]`` a multiple of the type's block
        size). Its data is uninitialised.
        """
        need_open(self)      # before the arguments: a closed context is the first thing to say
        cdef ggml_type typ = arg_type(type)
        cdef int64_t cne[4]
        cdef int n = _need_ne_c(ne, cne)
        cdef int64_t data = _data_nbytes(typ, cne)
        self._reserve(_OBJECT_SIZE + _pad(sizeof(ggml_tensor) + (0 if self.no_alloc else <uint64_t>data)),
                      "new_tensor")
        return wrap_rank(self, ggml_new_tensor(self.ptr, typ, n, cne), n)

    def _align_next_data(self, size_t alignment=64):
        """_align_next_data(alignment=64)  (private: for pyggml's own contexts)

        Pad the pool with a small work buffer (``ggml_new_buffer``) so that the data
        of the next tensor made in this context starts at a multiple of
        ``alignment`` bytes. ggml aligns objects to GGML_MEM_ALIGN only; the
        FLASH_ATTN_BACK kernel runs up to 30 % slower when its result straddles
        cache lines (measured: scripts/bench_flash_attn_back.py).
        """
        need_open(self)
        if alignment == 0 or alignment & (alignment - 1) or alignment % GGML_MEM_ALIGN:
            raise ArgumentError(f"alignment must be a power of two multiple of {GGML_MEM_ALIGN}, got {alignment}")
        cdef uintptr_t next_data = (self._base + ggml_used_mem(self.ptr) + _OBJECT_SIZE
                                    + _pad(sizeof(ggml_tensor)))
        cdef size_t miss = (alignment - next_data % alignment) % alignment
        if miss == 0:
            return
        # the buffer object adds _OBJECT_SIZE + nbytes (nbytes a multiple of GGML_MEM_ALIGN)
        cdef size_t nbytes = (miss + alignment - _OBJECT_SIZE % alignment) % alignment
        if nbytes == 0:
            nbytes = alignment
        self._reserve(_OBJECT_SIZE + _pad(nbytes), "_align_next_data")
        ggml_new_buffer(self.ptr, nbytes)

    def _borrow_numpy(self, array):
        """_borrow_numpy(array) -> Tensor  (private: for pyggml's own zero-copy inputs)

        A tensor of this no_alloc context whose data is ``array``'s memory (C-contiguous,
        aligned, 1 to 4 dims). The context keeps the array alive until it is deallocated.
        The tensor must only be read by the graphs it feeds: pyggml's callers never
        write into borrowed memory. ``numpy()`` on it raises (the memory is not a pool's).
        """
        need_open(self)
        if not self.no_alloc:
            raise ArgumentError("_borrow_numpy: needs a no_alloc context")
        if type(array) is not np.ndarray:
            raise GGMLTypeError(f"_borrow_numpy: array must be a numpy.ndarray, not {type(array).__name__}")
        cdef cnp.ndarray arr = array
        if not (arr.flags.c_contiguous and arr.flags.aligned and arr.flags.writeable):
            # writeable too: an op such as cpy could write into the tensor, and writing
            # to read-only memory (a mapped file, a bytes buffer) would crash
            raise ArgumentError("_borrow_numpy: array must be C-contiguous, aligned and writeable")
        typ = _TYPE_OF_DTYPE.get(arr.dtype)
        if typ is None:
            raise GGMLTypeError(f"_borrow_numpy: dtype {arr.dtype} has no ggml type")
        if not 1 <= arr.ndim <= GGML_MAX_DIMS or arr.size == 0:
            raise ArgumentError(f"_borrow_numpy: array must have 1 to {GGML_MAX_DIMS} dims and elements")
        cdef Tensor t = self.new_tensor(typ, array.shape[::-1])
        t.ptr.data = cnp.PyArray_DATA(arr)
        if self._borrowed is None:
            self._borrowed = []
        self._borrowed.append(arr)
        return t

    def from_dlpack(self, x, type=None):
        """from_dlpack(x, type=None) -> Tensor

        :meth:`from_numpy` of ``np.from_dlpack(x)``: a tensor of this context holding a copy
        of any DLPack producer's host array (a torch or jax CPU tensor, a numpy array). The
        context's memory is its own, so the values are copied in; to hand a pyggml tensor
        out without a copy, the other way round, ``torch.from_dlpack(t)``.
        """
        need_open(self)
        if not hasattr(x, "__dlpack__"):
            raise GGMLTypeError(f"from_dlpack: {x.__class__.__name__} is not a DLPack producer (no __dlpack__)")
        try:
            arr = np.from_dlpack(x)
        except (BufferError, TypeError, ValueError, RuntimeError) as e:
            raise ExportError(f"from_dlpack: numpy cannot take this {x.__class__.__name__}: {e}") from None
        return self.from_numpy(arr, type)

    def from_numpy(self, array, type=None):
        """from_numpy(array, type=None) -> Tensor

        A new tensor holding a copy of ``array``; ``ne`` is its shape reversed (1 to 4
        dims).

        * ``type=None``: the ggml type of the array's dtype (float32, float16, float64,
          int8/16/32/64; any byte order).
        * ``type=`` a quantized :class:`Type`: ``array`` is ``uint8`` in ggml's block
          layout, rows along the last axis (as :func:`pyggml.quantize` returns); the
          tensor has ``ne[0] = row bytes / type_size * blck_size``.
        * ``type=Type.BF16``: ``array`` is ``uint16`` bfloat16 bits.
        """
        need_open(self)
        if self.no_alloc:
            raise ArgumentError("from_numpy: the context was created with no_alloc=True")
        cdef cnp.ndarray arr
        # (`type` is the parameter here, as in C: no builtin type() in this method)
        if isinstance(array, np.ndarray):
            arr = <cnp.ndarray>array
        else:
            try:
                arr = np.asarray(array)
            except Exception as e:
                raise GGMLTypeError(f"from_numpy: array must be array-like, not "
                                    f"{array.__class__.__name__} ({e})") from None
            if arr.dtype == object:
                raise GGMLTypeError(f"from_numpy: array must be numeric, not {array.__class__.__name__} "
                                    f"of Python objects")
        cdef int nd = cnp.PyArray_NDIM(arr), i
        cdef int rank = nd
        if not 0 <= nd <= GGML_MAX_DIMS:
            raise ArgumentError(f"from_numpy: array must have 0 to {GGML_MAX_DIMS} dimensions, got {nd}")
        if nd == 0:                     # a 0-d array: one element, ne = (1, 1, 1, 1), rank 0
            if type is not None:
                raise ArgumentError("from_numpy: a 0-d array has no rows of blocks; give a 1-d array with type=")
            arr = arr.reshape(1)
            nd = 1
        cdef int typ = _ggml_type_of_npy(cnp.PyArray_TYPE(arr)) if type is None else -1
        cdef int64_t ne[4]
        cdef cnp.npy_intp * dims = cnp.PyArray_DIMS(arr)
        if typ >= 0:
            for i in range(4):
                ne[i] = dims[nd - 1 - i] if i < nd else 1
        elif type is None:
            raise GGMLTypeError(f"from_numpy: dtype {arr.dtype} has no ggml type; supported: "
                                + ", ".join(str(d) for d in _TYPE_OF_DTYPE)
                                + " (or pass type= for quantized blocks or BF16 bits)")
        else:
            typ = arg_type(type)
            shape = _block_shape(<object>arr, Type(typ))
            for i in range(4):
                ne[i] = shape[nd - 1 - i] if i < nd else 1
        cdef int64_t data = _data_nbytes(<ggml_type>typ, ne)
        self._reserve(_OBJECT_SIZE + _pad(sizeof(ggml_tensor) + <uint64_t>data), "from_numpy")
        cdef Tensor t = wrap_rank(self, ggml_new_tensor(self.ptr, <ggml_type>typ, nd, ne), rank)
        if cnp.PyArray_IS_C_CONTIGUOUS(arr) and cnp.PyArray_ISNOTSWAPPED(arr) and cnp.PyArray_NBYTES(arr) == data:
            if data:     # the common case: one memcpy, no numpy machinery
                memcpy(t.ptr.data, cnp.PyArray_DATA(arr), data)
        elif data:
            dst = t._raw_view()
            np.copyto(dst, arr.reshape(dst.shape), casting="equiv")
        return t


cdef inline int _ggml_type_of_npy(int typenum):
    """The ggml type of a numpy type number (native or not: the byte order is handled
    by the copy), or -1."""
    if typenum == cnp.NPY_FLOAT32:
        return GGML_TYPE_F32
    if typenum == cnp.NPY_FLOAT16:
        return GGML_TYPE_F16
    if typenum == cnp.NPY_FLOAT64:
        return GGML_TYPE_F64
    if typenum == cnp.NPY_INT8:
        return GGML_TYPE_I8
    if typenum == cnp.NPY_INT16:
        return GGML_TYPE_I16
    if typenum == cnp.NPY_INT32:
        return GGML_TYPE_I32
    if typenum == cnp.NPY_INT64:
        return GGML_TYPE_I64
    return -1


cdef tuple _block_shape(object arr, object typ):
    """The element shape of a tensor of quantized (or BF16) ``typ`` whose bytes ``arr`` holds."""
    if typ == Type.BF16:
        if arr.dtype != np.uint16:
            raise GGMLTypeError(f"from_numpy: type=BF16 takes uint16 bits, not {arr.dtype}")
        return arr.shape
    if not typ.is_quantized:
        if arr.dtype != typ.numpy_dtype:
            raise GGMLTypeError(f"from_numpy: type={typ.name} takes {typ.numpy_dtype} data, not {arr.dtype}")
        return arr.shape
    if arr.dtype != np.uint8:
        raise GGMLTypeError(f"from_numpy: type={typ.name} takes uint8 blocks, not {arr.dtype}")
    row_bytes = arr.shape[-1]
    if row_bytes % typ.type_size:
        raise ArgumentError(f"from_numpy: rows of {row_bytes} bytes are not whole {typ.name} blocks "
                            f"of {typ.type_size} bytes")
    return arr.shape[:-1] + (row_bytes // typ.type_size * typ.blck_size,)
