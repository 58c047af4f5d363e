# Included by _core.pyx: argument checks, one helper per rule. Each converts a Python
# value to its C type or raises, naming the op and the argument. The generated op
# wrappers call them (cimported through _core.pxd) for every parameter of the table.

cdef object _as_index(object v):
    """v.__index__(), or None where v has none or it refuses (bool, a numpy array of more
    than one element: its __index__ raises TypeError)."""
    if isinstance(v, bool) or not hasattr(v, "__index__"):
        return None
    try:
        return v.__index__()
    except TypeError:
        return None


cdef object index_arg(object v, str arg, str op):
    """v as a Python int (bool refused), or GGMLTypeError."""
    if type(v) is int:
        return v
    i = _as_index(v)
    if i is None:
        raise GGMLTypeError(f"{_where(op)}{arg} must be an int, not {type(v).__name__}")
    return i


cdef inline str _where(str op):
    return f"{op}: " if op else ""


cdef object arg_instance(object v, type cls, str arg, str op):
    """v if it is a ``cls``, else GGMLTypeError: for the pyggml objects functions take.
    (A parameter typed in the signature, ``Graph graph``, would raise Cython's builtin
    TypeError instead.)"""
    if not isinstance(v, cls):
        raise GGMLTypeError(f"{_where(op)}{arg} must be a pyggml.{cls.__name__}, not {type(v).__name__}")
    return v


cdef Context arg_context(object ctx, str op):
    """An open Context (the first argument of every op wrapper). The type test is inline,
    not arg_instance's: with the class known here it compiles to a pointer comparison,
    where the generic isinstance cost an op call about 10% more."""
    if type(ctx) is not Context and not isinstance(ctx, Context):
        raise GGMLTypeError(f"{_where(op)}ctx must be a pyggml.Context, not {type(ctx).__name__}")
    need_open(<Context>ctx)
    return <Context>ctx


cdef int need_open(Context ctx, str arg="ctx") except -1:
    if ctx is None:
        raise GGMLTypeError(f"{arg} must be a pyggml.Context, not None")
    if ctx.ptr == NULL:
        raise ContextClosedError(f"{arg}: the context is closed")
    return 0


cdef Tensor arg_tensor(object t, str arg, str op):
    """A live Tensor."""
    if type(t) is not Tensor:
        raise GGMLTypeError(f"{_where(op)}{arg} must be a pyggml.Tensor, not {type(t).__name__}")
    (<Tensor>t)._check()
    return <Tensor>t


cdef Tensor arg_tensor_or_none(object t, str arg, str op):
    """A live Tensor, or None (NULL in C)."""
    if t is None:
        return None
    if type(t) is not Tensor:
        raise GGMLTypeError(f"{_where(op)}{arg} must be a pyggml.Tensor or None, not {type(t).__name__}")
    (<Tensor>t)._check()
    return <Tensor>t


cdef int32_t arg_int32(object v, str arg, str op) except? -1:
    if type(v) is int and -2147483648 <= <object>v <= 2147483647:
        return v
    v = index_arg(v, arg, op)
    if not -2147483648 <= v <= 2147483647:
        raise ArgumentError(f"{_where(op)}{arg} must be in [-2**31, 2**31 - 1] (a C int), got {v}")
    return v


cdef int64_t arg_int64(object v, str arg, str op) except? -1:
    v = index_arg(v, arg, op)
    if not -0x8000000000000000 <= v <= 0x7FFFFFFFFFFFFFFF:
        raise ArgumentError(f"{_where(op)}{arg} must fit int64, got {v}")
    return v


cdef uint32_t arg_uint32(object v, str arg, str op) except? 0xFFFFFFFF:
    v = index_arg(v, arg, op)
    if not 0 <= v <= 0xFFFFFFFF:
        raise ArgumentError(f"{_where(op)}{arg} must be in [0, 2**32 - 1] (a uint32), got {v}")
    return v


cdef size_t arg_size(object v, str arg, str op) except? 0xFFFFFFFFFFFFFFFF:
    """A byte count or stride: >= 0 and within int64 (no tensor is larger)."""
    v = index_arg(v, arg, op)
    if not 0 <= v <= 0x7FFFFFFFFFFFFFFF:
        raise ArgumentError(f"{_where(op)}{arg} must be in [0, 2**63 - 1] (bytes), got {v}")
    return v


cdef size_t arg_size_i32(object v, str arg, str op) except? 0xFFFFFFFFFFFFFFFF:
    """A byte count or stride the builder stores in an int32 op param (set, acc): a larger
    one would wrap silently."""
    v = index_arg(v, arg, op)
    if not 0 <= v <= 0x7FFFFFFF:
        raise ArgumentError(f"{_where(op)}{arg} must be in [0, 2**31 - 1] (bytes: ggml keeps it in an int32), "
                            f"got {v}")
    return v


cdef int64_t arg_int64_i32(object v, str arg, str op) except? -1:
    """An int64_t parameter the builder stores in an int32 op param ((int32_t) K in
    ggml_gated_delta_net, IC in ggml_im2col_3d) while it sizes the result with the full
    value: a larger one would wrap silently, and the kernel read another count."""
    v = index_arg(v, arg, op)
    if not -2147483648 <= v <= 2147483647:
        raise ArgumentError(f"{_where(op)}{arg} must be in [-2**31, 2**31 - 1] (ggml keeps it in an int32 op "
                            f"param), got {v}")
    return v


cdef float arg_float(object v, str arg, str op) except? -1.0:
    if type(v) is float:
        return v
    if not isinstance(v, (bool, str, bytes)) and hasattr(v, "__float__"):
        try:
            return float(v)
        except (TypeError, ValueError):     # a numpy array of more than one element
            pass
    raise GGMLTypeError(f"{_where(op)}{arg} must be a real number, not {type(v).__name__}")


cdef int arg_bool(object v, str arg, str op) except -1:
    if v is True or v is False:
        return v is True
    i = _as_index(v)
    if i in (0, 1):
        return i
    raise GGMLTypeError(f"{_where(op)}{arg} must be a bool, not {v!r}")


cdef int arg_enum(object v, object enum_class, str arg, str op) except? -1:
    if type(v) is enum_class:
        return v
    v = index_arg(v, arg, op)
    try:
        return enum_class(v)
    except ValueError:
        raise ArgumentError(f"{_where(op)}{arg}={v} is not a {enum_class.__name__} "
                            f"({', '.join(f'{m.name}={int(m)}' for m in enum_class)})") from None


cdef int arg_int32_array(object v, int * out, int n, str arg, str op) except -1:
    vals = _sequence(v, n, arg, op)
    for i in range(n):
        out[i] = arg_int32(vals[i], f"{arg}[{i}]", op)
    return 0


cdef int arg_int64_array(object v, int64_t * out, int n, str arg, str op) except -1:
    vals = _sequence(v, n, arg, op)
    for i in range(n):
        out[i] = arg_int64(vals[i], f"{arg}[{i}]", op)
    return 0


cdef tuple _sequence(object v, int n, str arg, str op):
    try:
        vals = tuple(v)
    except TypeError:
        raise GGMLTypeError(f"{_where(op)}{arg} must be a sequence of {n} ints, not {type(v).__name__}") from None
    if len(vals) != n:
        raise ArgumentError(f"{_where(op)}{arg} must have {n} values, got {len(vals)}")
    return vals


cdef ggml_type arg_type(object typ, str arg="type") except? <ggml_type>-1:
    if type(typ) is not Type:
        i = _as_index(typ)
        if i is None:
            raise GGMLTypeError(f"{arg} must be a pyggml.Type (or its int value), not {type(typ).__name__}")
        typ = i
        if typ not in _TYPE_VALUES:
            raise ArgumentError(f"{arg}={typ!r} is not a ggml type of this build")
    return <ggml_type><int>typ


cdef int _need_ne_c(object ne, int64_t * out, str arg="ne") except -1:
    """A ggml shape: 1 to GGML_MAX_DIMS ints >= 0 whose product fits int64.

    Fills ``out[0..3]`` (unused dims = 1) and returns the number of values given.
    """
    cdef tuple vals
    if type(ne) is tuple:
        vals = <tuple>ne
    else:
        try:
            vals = tuple(ne)
        except TypeError:
            raise GGMLTypeError(f"{arg} must be a sequence of ints, not {type(ne).__name__}") from None
    cdef Py_ssize_t n = len(vals), i
    if not 1 <= n <= GGML_MAX_DIMS:
        raise ArgumentError(f"{arg} must have 1 to {GGML_MAX_DIMS} values (ggml order, fastest first), got {n}")
    cdef int64_t total = 1, x
    for i in range(GGML_MAX_DIMS):
        out[i] = 1
    for i in range(n):
        v = vals[i]
        if type(v) is not int:
            v = index_arg(v, f"{arg}[{i}]", "")
        if not 0 <= v <= 0x7FFFFFFFFFFFFFFF:   # (a literal: Cython caches it as an object)
            raise ArgumentError(f"{arg}[{i}] must be in [0, 2**63 - 1], got {v}")
        x = v
        if x != 0 and total > _INT64_MAX // x:
            raise ArgumentError(f"{arg}={vals} has more elements than int64 holds")
        total *= x
        out[i] = x
    return <int>n


cdef int64_t _data_nbytes(ggml_type typ, const int64_t * ne) except -1:
    """Bytes of data ggml_new_tensor_impl allocates: ggml_row_size(type, ne[0])*ne[1]*ne[2]*ne[3],
    refused when it could not fit any context."""
    cdef int64_t blck = ggml_blck_size(typ)
    if ne[0] % blck != 0:
        raise ArgumentError(f"ne[0]={ne[0]} must be a multiple of the block size {blck} of type {Type(typ).name}")
    cdef int64_t ts = <int64_t>ggml_type_size(typ)
    if ne[0] // blck > (_INT64_MAX >> 1) // ts:      # a row alone: 2**62 floats wrapped to 0 bytes
        raise ArgumentError(f"a tensor of type {Type(typ).name} with ne=({ne[0]}, {ne[1]}, {ne[2]}, {ne[3]}) "
                            f"would need more bytes than a context can hold")
    cdef int64_t total = (ne[0] // blck) * ts
    cdef int i
    for i in range(1, 4):
        if ne[i] != 0 and total > (_INT64_MAX >> 1) // ne[i]:
            raise ArgumentError(f"a tensor of type {Type(typ).name} with ne=({ne[0]}, {ne[1]}, {ne[2]}, {ne[3]}) "
                                f"would need more bytes than a context can hold")
        total *= ne[i]
    return total
