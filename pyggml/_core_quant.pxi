# Included by _core.pyx: quantized data from Python, through ggml's own type traits.


def quantize(type, x, imatrix=None):
    """quantize(type, x, imatrix=None) -> ndarray of uint8

    ``x`` (float32, rows along the last axis, each row a whole number of the type's
    blocks) in ggml's block layout for ``type`` (``ggml_quantize_chunk``; Q8_1 and Q8_K,
    the dot-product types it leaves out, through their row quantizers): shape
    ``x.shape[:-1] + (row bytes,)``, as :meth:`Context.from_numpy` takes it with
    ``type=`` and :meth:`Tensor.blocks` shows it. F16 and BF16 give their bits as
    bytes. ``imatrix`` (float32, one weight per column) is passed on; the types that
    need one (``ggml_quantize_requires_imatrix``) raise without it.
    """
    cdef ggml_type typ = arg_type(type)
    t = Type(typ)
    if not (t.is_quantized or typ in (GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_F32)):
        raise GGMLTypeError(f"quantize: {t.name} is not a quantized, F16, BF16 or F32 type")
    cdef cnp.ndarray src = np.ascontiguousarray(x, dtype=np.float32)
    if src.ndim < 1:
        raise ArgumentError("quantize: x must have at least one dimension (rows along the last axis)")
    cdef int64_t n_per_row = src.shape[src.ndim - 1]
    cdef int64_t nrows = src.size // n_per_row if n_per_row else 0
    cdef int64_t blck = ggml_blck_size(typ)
    if n_per_row % blck:
        raise ArgumentError(f"quantize: rows of {n_per_row} values are not whole {t.name} blocks of {blck}")
    cdef cnp.ndarray im = None
    if imatrix is not None:
        im = np.ascontiguousarray(imatrix, dtype=np.float32)
        if im.ndim != 1 or im.shape[0] != n_per_row:
            raise ArgumentError(f"quantize: imatrix must hold {n_per_row} weights (one per column), "
                                f"got shape {(<object>im).shape}")
    elif ggml_quantize_requires_imatrix(typ):
        raise ArgumentError(f"quantize: {t.name} needs an importance matrix (imatrix=)")
    row_bytes = ggml_row_size(typ, n_per_row)
    out = np.empty((<object>src).shape[:-1] + (row_bytes,), dtype=np.uint8)
    if src.size == 0:
        return out
    cdef cnp.ndarray dst = out
    cdef pyggml_guard g
    cdef int ok
    cdef const float * imp = <const float *>cnp.PyArray_DATA(im) if im is not None else NULL
    cdef const float * sp = <const float *>cnp.PyArray_DATA(src)
    cdef void * dp = cnp.PyArray_DATA(dst)
    with nogil:
        ok = pyggml_try_quantize(&g, <int>typ, sp, dp, nrows, n_per_row, imp)
    if not ok:
        raise_aborted(&g, "quantize", f"; type {t.name}, {nrows} rows of {n_per_row}")
    return out


def dequantize(type, data, shape):
    """dequantize(type, data, shape) -> ndarray of float32

    The float32 values of ``data`` (uint8 in ggml's block layout for ``type``, as
    :func:`quantize` returns) with numpy ``shape``, through the type's ``to_float``
    (``ggml_get_type_traits``). F16/BF16 bits and F32 work as well.
    """
    cdef ggml_type typ = arg_type(type)
    t = Type(typ)
    cdef const ggml_type_traits * tr = ggml_get_type_traits(typ)
    if typ == GGML_TYPE_F32:
        return np.frombuffer(np.ascontiguousarray(data).view(np.uint8), dtype=np.float32).reshape(shape).copy()
    if tr == NULL or tr.to_float == NULL:
        raise GGMLTypeError(f"dequantize: ggml has no to_float for {t.name}")
    shape = tuple(int(s) for s in shape)
    if not shape or any(s < 0 for s in shape):
        raise ArgumentError(f"dequantize: shape must be one or more sizes >= 0, got {shape}")
    cdef int64_t n = 1
    for s in shape:
        n *= s
    cdef int64_t blck = tr.blck_size
    if shape[-1] % blck:
        raise ArgumentError(f"dequantize: rows of {shape[-1]} values are not whole {t.name} blocks of {blck}")
    cdef cnp.ndarray src = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    need = (n // blck) * tr.type_size if blck else 0
    if src.size != need:
        raise ArgumentError(f"dequantize: {shape} values of {t.name} take {need} bytes, got {src.size}")
    out = np.empty(shape, dtype=np.float32)
    cdef cnp.ndarray dst = out
    cdef const void * sp = cnp.PyArray_DATA(src)
    cdef float * dp = <float *>cnp.PyArray_DATA(dst)
    if n:
        with nogil:
            tr.to_float(sp, dp, n)
    return out
