# Included by _core.pyx: the Tensor.

# The numpy rank. ggml keeps every tensor 4-d (ne[i] = 1 past its dimensions); numpy keeps
# the rank apart, and a (1, H) array is not an (H,) one. pyggml keeps the rank a tensor
# was given (from_numpy, new_tensor, reshape_Nd / view_Nd / cont_Nd) or derived for it (an
# op's result, when first wrapped) in the tensor's padding[0], as rank + 1: ggml zeroes
# that byte and never reads it, so 0 means none kept (tensors ggml made itself).

cdef inline int _ggml_ndims(const ggml_tensor * p):
    # ggml_n_dims counts up to the last dimension > 1; a 0 beyond it must stay
    cdef int i, n = ggml_n_dims(p)
    for i in range(n, GGML_MAX_DIMS):
        if p.ne[i] == 0:
            n = i + 1
    return n


cdef inline int _shape_ndims(const ggml_tensor * p):
    """The numpy rank: the rank kept, where it covers ggml's dimensions (the dimensions past
    ggml's are 1), else ggml's; 0 only for a one-element tensor kept so."""
    cdef int n = _ggml_ndims(p)
    cdef int kept = <int>p.padding[0] - 1
    if kept > n or (kept == 0 and n == 1 and p.ne[0] == 1):
        return kept
    return n


cdef inline void set_rank(ggml_tensor * p, int rank) noexcept:
    p.padding[0] = <char>(rank + 1)


cdef int _derived_rank(const ggml_tensor * p) noexcept:
    """The rank of an op's result: ggml's, with the unit dimensions past it that a source
    has in the same places (so a (1, H) input gives a (1, O) product and a (1, H) sum of
    rows); a result of one element that no source matches in shape is (1,)."""
    cdef int n = _ggml_ndims(p), best = n, r, d, j
    cdef const ggml_tensor * s
    cdef bint same
    if ggml_nelements(p) == 1:          # the largest rank of a one-element source, 0 too
        best = -1
        for j in range(GGML_MAX_SRC):
            s = p.src[j]
            if s != NULL and ggml_nelements(s) == 1:
                best = max(best, _shape_ndims(s))
        return best if best >= 0 else n
    for j in range(GGML_MAX_SRC):
        s = p.src[j]
        if s == NULL:
            continue
        r = _shape_ndims(s)
        if r <= best:
            continue
        same = True
        for d in range(n, r):
            if s.ne[d] != p.ne[d]:
                same = False
                break
        if same:
            best = r
    return best


cdef Tensor wrap(Context ctx, ggml_tensor * p):
    cdef Tensor t = Tensor.__new__(Tensor)
    t.ptr = p
    t.ctx = ctx
    if p.padding[0] == 0 and p.op != GGML_OP_NONE:
        set_rank(p, _derived_rank(p))
    return t


cdef Tensor wrap_rank(Context ctx, ggml_tensor * p, int rank):
    """wrap, for a tensor made with ``rank`` dimensions (new_tensor, reshape_Nd, ...)."""
    set_rank(p, rank)
    return wrap(ctx, p)


@cython.final
@cython.freelist(64)
@cython.no_gc   # holds only its Context, which never refers back to a Tensor: no cycles
cdef class Tensor:
    """A ggml tensor in a :class:`Context`. Made by ``Context.new_tensor``,
    ``Context.from_numpy`` and the ops; not constructed directly.

    ``ne``/``nb`` are ggml order (fastest first; elements / bytes);
    ``shape`` is numpy order.
    """

    def __init__(self, *args, **kwargs):
        raise GGMLTypeError("Tensors are made by Context.new_tensor, Context.from_numpy or an op")

    cdef int _check(self) except -1:
        if self.ctx.ptr == NULL:
            raise ContextClosedError("tensor used after its context was closed")
        return 0

    def __eq__(self, other):
        return type(other) is Tensor and (<Tensor>other).ptr == self.ptr

    def __hash__(self):
        return hash(<uintptr_t>self.ptr)

    def __repr__(self):
        if self.ctx.ptr == NULL:
            return "<pyggml.Tensor (context closed)>"
        return f"<pyggml.Tensor {self.name!r} {Type(self.ptr.type).name} ne={self.ne} op={self.op}>"

    @property
    def type(self):
        self._check()
        return Type(self.ptr.type)

    @property
    def ne(self):
        """Elements per dimension, ggml order (4-tuple)."""
        self._check()
        return (self.ptr.ne[0], self.ptr.ne[1], self.ptr.ne[2], self.ptr.ne[3])

    @property
    def nb(self):
        """Stride per dimension in bytes, ggml order (4-tuple)."""
        self._check()
        return (self.ptr.nb[0], self.ptr.nb[1], self.ptr.nb[2], self.ptr.nb[3])

    @property
    def n_dims(self):
        """``ggml_n_dims``: 1 + the index of the last dimension with ne > 1 (1 for scalars)."""
        self._check()
        return ggml_n_dims(self.ptr)

    @property
    def shape(self):
        """numpy-order shape: ``ne`` reversed, as many dimensions as the tensor was made
        with (an array's shape, ``len(ne)`` of new_tensor, N of reshape_Nd; an op's result:
        ggml's dimensions and the unit ones its sources have past them), and never fewer
        than ``ggml_n_dims`` (a dimension of 0 counts too)."""
        self._check()
        cdef const int64_t * ne = self.ptr.ne
        cdef int n = _shape_ndims(self.ptr)
        if n == 0:
            return ()
        if n == 1:
            return (ne[0],)
        if n == 2:
            return (ne[1], ne[0])
        if n == 3:
            return (ne[2], ne[1], ne[0])
        return (ne[3], ne[2], ne[1], ne[0])

    @property
    def nelements(self):
        self._check()
        return ggml_nelements(self.ptr)

    @property
    def nbytes(self):
        self._check()
        return ggml_nbytes(self.ptr)

    @property
    def name(self):
        self._check()
        return self.ptr.name[:strlen(self.ptr.name)].decode("utf-8", "replace")

    @name.setter
    def name(self, value):
        self._check()
        if not isinstance(value, str):
            raise GGMLTypeError(f"name must be a str, not {type(value).__name__}")
        b = value.encode()
        if len(b) >= GGML_MAX_NAME or b"\0" in b:
            raise ArgumentError(f"name must be at most {GGML_MAX_NAME - 1} UTF-8 bytes without NUL, got {len(b)}")
        ggml_set_name(self.ptr, PyBytes_AsString(b))

    @property
    def op(self):
        """The op that makes this tensor, as ggml names it (``ggml_op_name``), e.g. ``"ADD"``.
        For GGML_OP_UNARY and GGML_OP_GLU: ``"UNARY"``/``"GLU"`` (see :attr:`sub_op`)."""
        self._check()
        return ggml_op_name(self.ptr.op).decode()

    @property
    def sub_op(self):
        """For UNARY and GLU nodes, the unary or gated op's name (e.g. ``"RELU"``), else None."""
        self._check()
        if self.ptr.op == GGML_OP_UNARY:
            return ggml_unary_op_name(<ggml_unary_op>self.ptr.op_params[0]).decode()
        if self.ptr.op == GGML_OP_GLU:
            return ggml_glu_op_name(<ggml_glu_op>self.ptr.op_params[0]).decode()
        return None

    @property
    def op_params(self):
        """The ``GGML_MAX_OP_PARAMS // 4`` int32 op parameters."""
        self._check()
        return tuple(self.ptr.op_params[i] for i in range(GGML_MAX_OP_PARAMS // 4))

    @property
    def flags(self):
        self._check()
        return self.ptr.flags

    @property
    def src(self):
        """The source tensors (``src[0..]`` up to the last non-NULL; None for a NULL between)."""
        self._check()
        cdef int i, last = -1
        for i in range(GGML_MAX_SRC):
            if self.ptr.src[i] != NULL:
                last = i
        return tuple(self._related(self.ptr.src[i]) for i in range(last + 1))

    @property
    def view_src(self):
        self._check()
        return self._related(self.ptr.view_src)

    @property
    def view_offs(self):
        self._check()
        return self.ptr.view_offs

    cdef object _related(self, ggml_tensor * p):
        if p == NULL:
            return None
        cdef Context owner = self.ctx._owner_of(p)
        if owner is None:
            raise InternalError("source tensor belongs to no context pyggml knows")
        return wrap(owner, p)

    @property
    def data_ptr(self):
        """Address of the tensor's data (0 for no data)."""
        self._check()
        return <uintptr_t>self.ptr.data

    cdef object _view(self, int nd):
        """Zero-copy ndarray over the data with the first ``nd`` ggml dims (numpy order)."""
        self._check()
        cdef ggml_tensor * p = self.ptr
        typenum = _NPY_TYPENUM.get(<int>p.type)
        if typenum is None:
            raise GGMLTypeError(f"numpy: type {Type(p.type).name} has no numpy dtype (quantized blocks: "
                                f"use Tensor.blocks())")
        if ggml_nelements(p) == 0:
            # nothing to share; ggml gives empty tensors no data pointer
            return np.empty(tuple(p.ne[i] for i in range(nd - 1, -1, -1)), dtype=_NUMPY_DTYPE[Type(p.type)])
        if p.data == NULL:
            raise ArgumentError(_no_data("numpy"))
        cdef cnp.npy_intp dims[4]
        cdef cnp.npy_intp strides[4]
        cdef int i
        cdef size_t span = ggml_type_size(p.type)
        for i in range(nd):
            dims[nd - 1 - i] = p.ne[i]
            strides[nd - 1 - i] = p.nb[i]
        for i in range(GGML_MAX_DIMS):
            span += (p.ne[i] - 1) * p.nb[i]
        cdef Storage pool = self._data_storage(span)
        if pool is None:
            raise ArgumentError("numpy: the tensor's data lies outside the memory of its contexts")
        if not pool.host:
            raise ArgumentError("numpy: the tensor's data is in device memory; copy it with get() and set()")
        arr = cnp.PyArray_New(np.ndarray, nd, dims, typenum, strides, p.data,
                              ggml_type_size(p.type), cnp.NPY_ARRAY_WRITEABLE, None)
        cnp.set_array_base(arr, pool)
        return arr

    cdef Storage _data_storage(self, size_t span):
        """The Storage holding ``span`` bytes at the tensor's data, or None: a backend
        buffer's, found by the buffer's identity (an allocation pyggml holds), else a
        pool of the tensor's context or of those it depends on."""
        cdef ggml_tensor * p = self.ptr
        cdef Allocation a
        cdef Storage st
        if p.buffer != NULL:
            a = allocation_of(p.buffer)
            if a is None:
                return None
            st = a.storage(p.buffer)
            return st if st.contains(p.data, span) else None
        return self.ctx._storage_of(p.data, span)

    cdef object _raw_view(self):
        """The data as numpy sees it: numpy() for plain types, blocks() for quantized ones."""
        if ggml_is_quantized(self.ptr.type):
            return self.blocks()
        return self._view(_shape_ndims(self.ptr))

    def numpy(self):
        """numpy() -> ndarray

        A zero-copy, writable view of the tensor's data, shaped ``self.shape``
        with strides ``nb`` reversed. Its ``base`` keeps the memory alive, also
        after the context is closed. BF16 data is shown as ``uint16`` bits;
        quantized types have no numpy dtype (see :meth:`blocks`).
        """
        self._check()
        return self._view(_shape_ndims(self.ptr))

    # --- the array protocols: numpy's __array__ and DLPack, through numpy() -----------------

    cdef object _exported(self, str what):
        """numpy(), for a protocol that hands the memory to another library: refused with
        ExportError where that view would not be the tensor's values as they are."""
        self._check()
        cdef ggml_type t = self.ptr.type
        if ggml_is_quantized(t):
            raise ExportError(f"{what}: a {Type(t).name} tensor has no element dtype (its blocks() are its bytes; "
                              f"pyggml.dequantize gives F32 values)")
        if t == GGML_TYPE_BF16:
            raise ExportError(f"{what}: numpy has no BF16 dtype (numpy() shows the bits as uint16; "
                              f"cpy the tensor to F32 in a graph for its values)")
        try:
            return self.numpy()
        except ArgumentError as e:          # no data, device memory, outside its contexts
            raise ExportError(f"{what}: {e}") from None

    def __array__(self, dtype=None, copy=None):
        """``np.asarray(t)``: :meth:`numpy`, zero-copy. numpy 2's ``copy``: ``True`` copies,
        ``False`` refuses (``ValueError``) a ``dtype`` that would need a copy, ``None`` copies
        only for a ``dtype``. :class:`ExportError` for what has no numpy view."""
        arr = self._exported("np.asarray")
        if dtype is not None:
            try:
                dtype = np.dtype(dtype)
            except TypeError as e:
                raise GGMLTypeError(f"np.asarray: dtype {dtype!r} is not a numpy dtype ({e})") from None
        if copy is False and dtype is not None and dtype != arr.dtype:
            raise ArgumentError(f"np.asarray(copy=False): the tensor is {arr.dtype}; {dtype} needs a copy")
        if copy:
            return arr.astype(arr.dtype if dtype is None else dtype, copy=True)
        return arr if dtype is None else arr.astype(dtype, copy=False)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """The DLPack protocol (``torch.from_dlpack(t)``, ``np.from_dlpack(t)``): the capsule of
        :meth:`numpy`'s view, zero-copy, which keeps the memory alive after the context
        closes. Host memory only; :class:`ExportError` (a ``BufferError``) otherwise."""
        arr = self._exported("__dlpack__")
        kw = {k: v for k, v in (("max_version", max_version), ("dl_device", dl_device), ("copy", copy))
              if v is not None}
        return arr.__dlpack__(stream=stream, **kw)

    def __dlpack_device__(self):
        """``(1, 0)``: DLPack's CPU device (kDLCPU), where host memory lies."""
        self._exported("__dlpack_device__")
        return (1, 0)

    def blocks(self):
        """blocks() -> ndarray of uint8

        A zero-copy view of a quantized tensor's rows as raw bytes in ggml's block
        layout: shape ``self.shape[:-1] + (row bytes,)`` (what :func:`pyggml.quantize`
        returns). Rows must be contiguous (``nb[0]`` the block size in bytes).
        """
        self._check()
        cdef ggml_tensor * p = self.ptr
        if not ggml_is_quantized(p.type):
            raise GGMLTypeError(f"blocks: type {Type(p.type).name} is not quantized (use numpy())")
        if p.nb[0] != ggml_type_size(p.type):
            raise ArgumentError(f"blocks: rows must be contiguous, got nb={self.nb}")
        cdef int nd = _shape_ndims(p)
        cdef int64_t blck = ggml_blck_size(p.type)
        # row bytes along the last numpy axis: items are bytes, the row a run of them
        cdef cnp.npy_intp dims[4]
        cdef cnp.npy_intp strides[4]
        cdef int i
        dims[nd - 1] = p.ne[0] // blck * <int64_t>ggml_type_size(p.type)
        strides[nd - 1] = 1
        for i in range(1, nd):
            dims[nd - 1 - i] = p.ne[i]
            strides[nd - 1 - i] = p.nb[i]
        if ggml_nelements(p) == 0:
            return np.empty(tuple(dims[i] for i in range(nd)), dtype=np.uint8)
        if p.data == NULL:
            raise ArgumentError(_no_data("blocks"))
        cdef size_t span = dims[nd - 1]
        for i in range(1, GGML_MAX_DIMS):
            span += (p.ne[i] - 1) * p.nb[i]
        cdef Storage pool = self._data_storage(span)
        if pool is None:
            raise ArgumentError("blocks: the tensor's data lies outside the memory of its contexts")
        if not pool.host:
            raise ArgumentError("blocks: the tensor's data is in device memory; copy it with get() and set()")
        arr = cnp.PyArray_New(np.ndarray, nd, dims, cnp.NPY_UINT8, strides, p.data, 1,
                              cnp.NPY_ARRAY_WRITEABLE, None)
        cnp.set_array_base(arr, pool)
        return arr

    # --- explicit copies: for any memory, host or device --------------------------------

    cdef Storage _whole(self, str what):
        """The storage holding all of this (contiguous, allocated) tensor's bytes."""
        self._check()
        cdef ggml_tensor * p = self.ptr
        if not ggml_is_contiguous(p):
            raise ArgumentError(f"{what}: the tensor must be contiguous (nb={self.nb}); copy a view with cont() first")
        if p.data == NULL:
            raise ArgumentError(_no_data(what))
        cdef Storage pool = self._data_storage(ggml_nbytes(p))
        if pool is None:
            raise ArgumentError(f"{what}: the tensor's data lies outside the memory of its contexts")
        return pool

    cdef tuple _layout(self):
        if ggml_is_quantized(self.ptr.type):
            blck = ggml_blck_size(self.ptr.type)
            shape = self.shape[:-1] + (self.ptr.ne[0] // blck * ggml_type_size(self.ptr.type),)
            return shape, np.dtype(np.uint8)
        return self.shape, _NUMPY_DTYPE[Type(self.ptr.type)]

    def get(self):
        """get() -> ndarray

        A copy of the tensor's data (``ggml_backend_tensor_get`` for a tensor in a
        backend buffer): shaped ``self.shape``, or for quantized types the rows' bytes as
        :meth:`blocks` shows them. Works for device memory, where :meth:`numpy` cannot."""
        self._check()
        shape, dtype = self._layout()
        if ggml_nelements(self.ptr) == 0:
            return np.empty(shape, dtype)
        cdef Storage pool = self._whole("get")
        cdef cnp.ndarray out = np.empty(shape, dtype)
        cdef size_t n = ggml_nbytes(self.ptr)
        if <size_t>out.nbytes != n:
            raise InternalError(f"get: {out.nbytes} bytes for a tensor of {n} (please report)")
        cdef Remote r = remote_of_buffer(self.ptr.buffer)
        if r is not None:
            remote_tensor_io(r, self, cnp.PyArray_DATA(out), n, True)
        elif self.ptr.buffer != NULL:
            with nogil:
                ggml_backend_tensor_get(self.ptr, cnp.PyArray_DATA(out), 0, n)
        else:
            memcpy(cnp.PyArray_DATA(out), self.ptr.data, n)
        return out

    def set(self, array):
        """set(array): copy ``array`` into the tensor (``ggml_backend_tensor_set`` for a
        tensor in a backend buffer). ``array`` must have the tensor's shape and numpy
        dtype exactly (for quantized types, :meth:`blocks`' shape, uint8): nothing is
        converted silently."""
        self._check()
        shape, dtype = self._layout()
        if ggml_nelements(self.ptr) == 0:
            if not isinstance(array, np.ndarray) or tuple(array.shape) != tuple(shape):
                raise ArgumentError(f"set: the tensor is empty; array must be an ndarray of shape {tuple(shape)}")
            return
        cdef Storage pool = self._whole("set")
        if not isinstance(array, np.ndarray):
            raise GGMLTypeError(f"set: array must be a numpy.ndarray, not {type(array).__name__}")
        if array.dtype != dtype:
            raise GGMLTypeError(f"set: array has dtype {array.dtype}; the tensor needs {dtype}")
        if tuple(array.shape) != tuple(shape):
            raise ArgumentError(f"set: array has shape {array.shape}; the tensor needs {tuple(shape)}")
        cdef cnp.ndarray src = np.ascontiguousarray(array)
        cdef size_t n = ggml_nbytes(self.ptr)
        if <size_t>src.nbytes != n:
            raise InternalError(f"set: {src.nbytes} bytes for a tensor of {n} (please report)")
        cdef Remote r = remote_of_buffer(self.ptr.buffer)
        if r is not None:
            remote_tensor_io(r, self, cnp.PyArray_DATA(src), n, False)
        elif self.ptr.buffer != NULL:
            with nogil:
                ggml_backend_tensor_set(self.ptr, cnp.PyArray_DATA(src), 0, n)
        else:
            memcpy(self.ptr.data, cnp.PyArray_DATA(src), n)


cdef str _no_data(str what):
    return (f"{what}: the tensor has no data: a no_alloc context's tensor not allocated yet, or one whose "
            f"allocation was replaced or freed (allocate it again: Backend.alloc_ctx_tensors, "
            f"GraphAllocator.alloc_graph, Scheduler.alloc_graph)")
