# cython: language_level=3, boundscheck=False, wraparound=False, embedsignature=True
"""Thin Cython wrapper over ggml: Context, Tensor, Graph and the ops.

ggml has no error codes: a failed ``GGML_ASSERT`` aborts the process. So every
function here checks, before it calls C, what ggml (and its CPU kernels) would
assert, and raises a Python exception that names the argument and the values.
The checks live in the ``_need_*`` helpers below, one helper per rule.

Ownership
---------
* A :class:`Context` allocates its memory pool itself (a :class:`_Pool`) and
  hands it to ``ggml_init``. ``close()`` frees the ``ggml_context``; the pool
  lives on while any numpy view of a tensor (whose ``base`` is the pool) does.
* A :class:`Tensor` holds its Context; once that Context is closed every use
  of the Tensor raises ``ValueError``.
* When an op in context A uses a tensor of context B, A records B (and B's own
  dependencies): a Graph computes only while every context it reaches is open,
  and keeps their pools alive while it computes without the GIL.
"""

cimport cython
from cpython.bytes cimport PyBytes_AsString
from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t, uintptr_t
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.signal cimport SIG_DFL, SIGABRT, SIGBUS, SIGFPE, SIGILL, SIGSEGV, signal
from libc.string cimport memcpy, memset, strlen

cimport numpy as cnp

from pyggml._ggml cimport *

import os
from enum import IntEnum

import numpy as np

cnp.import_array()

cdef extern from "stdlib.h" nogil:
    int posix_memalign(void ** memptr, size_t alignment, size_t size)

cdef extern from "pyggml_config.h":
    const char * PYGGML_GGML_ORIGIN
    const char * PYGGML_GGML_CMAKE_VERSION
    const char * PYGGML_NATIVE_FLAG
    const char * PYGGML_OPENMP_FLAG


# --- constants read from the compiled headers -------------------------------

MEM_ALIGN = GGML_MEM_ALIGN
MAX_DIMS = GGML_MAX_DIMS
MAX_NAME = GGML_MAX_NAME
DEFAULT_GRAPH_SIZE = GGML_DEFAULT_GRAPH_SIZE

# Pools are GGML_MEM_ALIGN-aligned (ggml_init asserts it) and start on a cache line,
# so where a tensor's data lands (and how fast kernels stream it) does not depend
# on what malloc returned.
cdef size_t _POOL_ALIGN = 64 if GGML_MEM_ALIGN <= 64 else GGML_MEM_ALIGN
# Bytes ggml puts in front of every object in a context (sizeof(struct ggml_object)),
# from the library itself: ggml_tensor_overhead() = object header + sizeof(ggml_tensor).
cdef size_t _OBJECT_SIZE = ggml_tensor_overhead() - sizeof(ggml_tensor)
cdef int64_t _INT64_MAX = 0x7FFFFFFFFFFFFFFF


cdef inline ggml_type _ctype(object t):
    cdef int v = t
    return <ggml_type>v


class Type(IntEnum):
    """ggml tensor types (``enum ggml_type``); values come from the compiled header."""
    F32 = GGML_TYPE_F32
    F16 = GGML_TYPE_F16
    Q4_0 = GGML_TYPE_Q4_0
    Q4_1 = GGML_TYPE_Q4_1
    Q5_0 = GGML_TYPE_Q5_0
    Q5_1 = GGML_TYPE_Q5_1
    Q8_0 = GGML_TYPE_Q8_0
    I8 = GGML_TYPE_I8
    I16 = GGML_TYPE_I16
    I32 = GGML_TYPE_I32
    I64 = GGML_TYPE_I64
    F64 = GGML_TYPE_F64
    BF16 = GGML_TYPE_BF16

    @property
    def numpy_dtype(self):
        """The numpy dtype of one element, or None (quantized types).

        BF16 maps to ``uint16``: numpy has no bfloat16, so the view shows the raw bits.
        """
        return _NUMPY_DTYPE.get(self)

    @property
    def type_size(self):
        """Bytes per block (``ggml_type_size``)."""
        return ggml_type_size(_ctype(self))

    @property
    def blck_size(self):
        """Elements per block (``ggml_blck_size``)."""
        return ggml_blck_size(_ctype(self))


_NUMPY_DTYPE = {
    Type.F32: np.dtype(np.float32), Type.F16: np.dtype(np.float16),
    Type.F64: np.dtype(np.float64), Type.I8: np.dtype(np.int8),
    Type.I16: np.dtype(np.int16), Type.I32: np.dtype(np.int32),
    Type.I64: np.dtype(np.int64), Type.BF16: np.dtype(np.uint16),
}
# BF16 is not reachable from a numpy dtype: uint16 bits are not bfloat16 numbers.
_TYPE_OF_DTYPE = {dt: t for t, dt in _NUMPY_DTYPE.items() if t != Type.BF16}

cdef frozenset _TYPE_VALUES = frozenset(int(t) for t in Type)
cdef dict _NPY_TYPENUM = {t: dt.num for t, dt in _NUMPY_DTYPE.items()}

# Type sets for the checks, as bit masks over ggml_type (GGML_TYPE_COUNT < 64).
cdef inline uint64_t _bit(ggml_type t):
    return (<uint64_t>1) << <int>t

cdef uint64_t _F32 = _bit(GGML_TYPE_F32)
cdef uint64_t _FLOATS = _F32 | _bit(GGML_TYPE_F16) | _bit(GGML_TYPE_BF16)
cdef uint64_t _REPEAT_TYPES = _FLOATS | _bit(GGML_TYPE_I32) | _bit(GGML_TYPE_I16)
assert GGML_TYPE_COUNT <= 64


def ggml_version():
    """ggml_version() -> str: the version string of the linked ggml."""
    return c_ggml_version().decode()


def build_info():
    """build_info() -> dict: how this pyggml was built.

    Keys: ``ggml_version``, ``ggml_commit``, ``ggml_source`` (``pypi:...`` or
    ``src:PATH`` for a vendored build, ``system:CONFIG_DIR`` for an installed
    ggml), ``mem_align``, ``native`` and ``openmp`` (None for a system ggml),
    ``features`` (the compile-time feature checks).
    """
    return {
        "ggml_version": c_ggml_version().decode(),
        "ggml_commit": ggml_commit().decode(),
        "ggml_source": PYGGML_GGML_ORIGIN.decode(),
        "mem_align": GGML_MEM_ALIGN,
        "native": _flag(PYGGML_NATIVE_FLAG),
        "openmp": _flag(PYGGML_OPENMP_FLAG),
        "features": {
            "ggml_version": bool(PYGGML_HAVE_GGML_VERSION),
            "abort_callback": bool(PYGGML_HAVE_ABORT_CALLBACK),
            "flash_attn_back": bool(PYGGML_HAVE_FLASH_ATTN_BACK),
        },
    }


cdef object _flag(const char * value):
    v = value.decode().upper()
    if v == "UNKNOWN":
        return None          # a system ggml: pyggml did not build it
    return v in ("ON", "1", "TRUE", "YES")


# --- the memory pool ---------------------------------------------------------

@cython.final
cdef class _Pool:
    """Memory owned by pyggml and lent to a ggml_context. Numpy views use it as base."""
    cdef void * ptr
    cdef readonly size_t size
    cdef object __weakref__

    def __cinit__(self, size_t size):
        self.ptr = NULL
        if posix_memalign(&self.ptr, _POOL_ALIGN, size if size else 1) != 0:
            self.ptr = NULL
        if self.ptr == NULL:
            raise MemoryError(f"cannot allocate a {size}-byte memory pool")
        self.size = size

    def __dealloc__(self):
        free(self.ptr)
        self.ptr = NULL

    cdef inline bint contains(self, const void * p, size_t nbytes):
        cdef uintptr_t a = <uintptr_t>self.ptr
        cdef uintptr_t b = <uintptr_t>p
        return b >= a and b - a <= self.size and nbytes <= self.size - (b - a)


# --- checks: one helper per rule ----------------------------------------------

cdef inline Tensor _need_tensor(object t, str arg):
    """The argument must be a live Tensor."""
    if type(t) is not Tensor:
        raise TypeError(f"{arg} must be a pyggml.Tensor, not {type(t).__name__}")
    (<Tensor>t)._check()
    return <Tensor>t


cdef inline _need_open(Context ctx, str arg="ctx"):
    if ctx is None:
        raise TypeError(f"{arg} must be a pyggml.Context, not None")
    if ctx.ptr == NULL:
        raise ValueError(f"{arg}: the context is closed")


cdef inline int _need_type(Tensor t, str arg, str op, uint64_t types) except -1:
    if not (types >> <int>t.ptr.type) & 1:
        names = ", ".join(x.name for x in Type if (types >> int(x)) & 1)
        raise TypeError(f"{op}: {arg} has type {Type(t.ptr.type).name}; supported: {names}")
    return 0


cdef _need_rows_contiguous(Tensor t, str arg, str op):
    # the CPU kernels assert nb[0] == ggml_type_size(type)
    if t.ptr.nb[0] != ggml_type_size(t.ptr.type):
        raise ValueError(f"{op}: {arg} must have contiguous rows (nb[0] == {ggml_type_size(t.ptr.type)}), "
                         f"got nb={t.nb}")


cdef _need_contiguous(Tensor t, str arg, str op):
    # ggml_is_contiguous ignores the strides of dimensions of size 1, but the CPU
    # kernels assert nb[0] == ggml_type_size(type) regardless (found by fuzzing)
    if not ggml_is_contiguous(t.ptr) or t.ptr.nb[0] != ggml_type_size(t.ptr.type):
        raise ValueError(f"{op}: {arg} must be contiguous, got ne={t.ne} nb={t.nb} (use cont())")


cdef _need_padded_1d(Tensor t, str arg, str op):
    # ggml_is_padded_1d (static in ggml.c), which ggml_scale asserts
    cdef const ggml_tensor * p = t.ptr
    if not (p.nb[0] == ggml_type_size(p.type) and p.nb[2] == p.nb[1] * p.ne[1]
            and p.nb[3] == p.nb[2] * p.ne[2]):
        raise ValueError(f"{op}: {arg} must have packed rows (nb[0] = type size, nb[2] = nb[1]*ne[1], "
                         f"nb[3] = nb[2]*ne[2]), got ne={t.ne} nb={t.nb} (use cont())")


cdef bint _can_repeat(const ggml_tensor * t0, const ggml_tensor * t1):
    # ggml_can_repeat, including its empty-tensor rule (and no division by zero)
    cdef int i
    if ggml_nelements(t0) == 0:
        return ggml_nelements(t1) == 0
    for i in range(GGML_MAX_DIMS):
        if t1.ne[i] % t0.ne[i] != 0:
            return False
    return True


cdef _need_can_repeat(Tensor a, Tensor b, str arg_a, str arg_b, str op):
    if not _can_repeat(a.ptr, b.ptr):
        raise ValueError(f"{op}: {arg_a} (ne={a.ne}) cannot be broadcast to {arg_b} (ne={b.ne}): "
                         f"each {arg_b}.ne[i] must be a multiple of {arg_a}.ne[i]")


cdef _need_same_nelements(Tensor a, Tensor b, str op):
    if ggml_nelements(a.ptr) != ggml_nelements(b.ptr):
        raise ValueError(f"{op}: a has {ggml_nelements(a.ptr)} elements (ne={a.ne}), "
                         f"b has {ggml_nelements(b.ptr)} (ne={b.ne})")


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
            raise TypeError(f"{arg} must be a sequence of ints, not {type(ne).__name__}") from None
    cdef Py_ssize_t n = len(vals), i
    if not 1 <= n <= GGML_MAX_DIMS:
        raise ValueError(f"{arg} must have 1 to {GGML_MAX_DIMS} values (ggml order, fastest first), got {n}")
    cdef int64_t total = 1, x
    for i in range(GGML_MAX_DIMS):
        out[i] = 1
    for i in range(n):
        v = vals[i]
        if type(v) is not int:
            if isinstance(v, bool) or not hasattr(v, "__index__"):
                raise TypeError(f"{arg}[{i}] must be an int, not {type(v).__name__}")
            v = v.__index__()
        try:
            x = v
        except OverflowError:
            raise ValueError(f"{arg}[{i}]={v} does not fit int64") from None
        if x < 0:
            raise ValueError(f"{arg}[{i}] must be >= 0, got {v}")
        if x != 0 and total > _INT64_MAX // x:
            raise ValueError(f"{arg}={vals} has more elements than int64 holds")
        total *= x
        out[i] = x
    return <int>n


cdef tuple _need_ne(object ne, str arg="ne"):
    cdef int64_t c[4]
    cdef int n = _need_ne_c(ne, c, arg)
    return tuple(c[i] for i in range(n))


cdef int64_t _data_nbytes(ggml_type typ, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3) except -1:
    """Bytes of data of a tensor of that type and ne, as ggml_new_tensor_impl computes them."""
    cdef int64_t blck = ggml_blck_size(typ)
    if ne0 % blck != 0:
        raise ValueError(f"ne[0]={ne0} must be a multiple of the block size {blck} of type {Type(typ).name}")
    cdef int64_t total = (ne0 // blck) * <int64_t>ggml_type_size(typ)
    cdef int64_t rest[3]
    cdef int64_t x
    cdef int i
    rest[0] = ne1; rest[1] = ne2; rest[2] = ne3
    for i in range(3):
        x = rest[i]
        if x != 0 and total > (_INT64_MAX >> 1) // x:
            raise ValueError(f"a tensor of type {Type(typ).name} with ne=({ne0}, {ne1}, {ne2}, {ne3}) "
                             f"would need more bytes than a context can hold")
        total *= x
    return total


cdef int _need_int32(object v, str arg, long lo=-2147483648) except? -1:
    if isinstance(v, bool) or not hasattr(v, "__index__"):
        raise TypeError(f"{arg} must be an int, not {type(v).__name__}")
    v = v.__index__()
    if not lo <= v <= 2147483647:
        raise ValueError(f"{arg} must be in [{lo}, 2147483647], got {v}")
    return v


# --- Context -----------------------------------------------------------------

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

    A Context is a context manager; ``close()`` frees the ggml_context. Tensors
    of a closed context raise ``ValueError``; numpy views taken before stay valid.
    """
    cdef ggml_context * ptr
    cdef _Pool pool
    cdef readonly size_t mem_size
    cdef readonly bint no_alloc
    cdef uintptr_t _base    # the pool's address, kept after close() to identify tensors
    cdef object _deps       # other contexts that tensors of this one reference (a set,
                            # or the shared empty frozenset until there is one)
    cdef object _dep_pools  # their pools: kept alive even if those contexts are closed,
                            # since tensors here point into them
    cdef list _borrowed     # numpy arrays whose memory tensors of this context use

    def __cinit__(self, mem_size, bint no_alloc=False):
        self.ptr = NULL
        if type(mem_size) is not int:
            if isinstance(mem_size, bool) or not hasattr(mem_size, "__index__"):
                raise TypeError(f"mem_size must be an int (bytes), not {type(mem_size).__name__}")
            mem_size = mem_size.__index__()
        if mem_size <= 0:
            raise ValueError(f"mem_size must be > 0 bytes, got {mem_size}")
        if mem_size > (1 << 62):
            raise MemoryError(f"mem_size={mem_size} bytes is too large")
        self.pool = _Pool(mem_size)
        cdef ggml_init_params params
        params.mem_size = mem_size
        params.mem_buffer = self.pool.ptr
        params.no_alloc = no_alloc
        self.ptr = ggml_init(params)
        self._base = <uintptr_t>self.pool.ptr
        self.mem_size = mem_size
        self.no_alloc = no_alloc
        self._deps = _NO_DEPS
        self._dep_pools = _NO_DEPS

    def __dealloc__(self):
        if self.ptr != NULL:
            ggml_free(self.ptr)
            self.ptr = NULL

    def close(self):
        """Free the ggml_context (idempotent). Tensors of this context raise afterwards."""
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
        _need_open(self, "Context")
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
        _need_open(self)
        return ggml_used_mem(self.ptr)

    cdef int _reserve_tensor(self, int64_t data_nbytes, str what) except -1:
        """Raise MemoryError unless a new tensor fits: its header, plus ``data_nbytes``
        unless the context is no_alloc (ggml_new_tensor_impl + ggml_new_object's rule)."""
        return self._reserve_object(sizeof(ggml_tensor) + (0 if self.no_alloc else <uint64_t>data_nbytes), what)

    cdef int _reserve_object(self, uint64_t size, str what) except -1:
        """Raise MemoryError unless a new object of ``size`` bytes fits (ggml_new_object's rule)."""
        _need_open(self)
        cdef uint64_t need = _OBJECT_SIZE + (size + GGML_MEM_ALIGN - 1) // GGML_MEM_ALIGN * GGML_MEM_ALIGN
        cdef uint64_t used = ggml_used_mem(self.ptr)
        if used + need > self.mem_size:
            raise MemoryError(f"{what} needs {need} bytes but the context has {self.mem_size - used} "
                              f"of {self.mem_size} free")
        return 0

    cdef Tensor _adopt(self, ggml_tensor * p, tuple srcs):
        """Wrap a tensor this context just created from the tensors ``srcs``."""
        cdef Tensor s
        for s in srcs:
            if s.ctx is not self:
                if self._deps is _NO_DEPS:
                    self._deps = set()
                    self._dep_pools = set()
                self._deps.add(s.ctx)
                self._deps.update(s.ctx._deps)
                self._dep_pools.add(s.ctx.pool)
                self._dep_pools.update(s.ctx._dep_pools)
        return _wrap(self, p)

    cdef _Pool _pool_of(self, const void * data, size_t nbytes):
        """The pool (this context's or a dependency's) holding ``nbytes`` at ``data``."""
        cdef _Pool pool
        if self.pool is not None and self.pool.contains(data, nbytes):
            return self.pool
        for pool in self._dep_pools:
            if pool.contains(data, nbytes):
                return pool
        return None

    cdef inline bint _holds(self, const void * p):
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

        A new tensor of ``type`` with ``ne`` elements per dimension, in ggml
        order (fastest first, 1 to 4 values). Its data is uninitialised.
        """
        _need_open(self)      # before the arguments: a closed context is the first thing to say
        cdef ggml_type typ = _need_type_arg(type)
        cdef int64_t cne[4]
        cdef int n = _need_ne_c(ne, cne)
        self._reserve_tensor(_data_nbytes(typ, cne[0], cne[1], cne[2], cne[3]), "new_tensor")
        return _wrap(self, ggml_new_tensor(self.ptr, typ, n, cne))

    def _align_next_data(self, size_t alignment=64):
        """_align_next_data(alignment=64)  (private: for pyggml's own contexts)

        Pad the pool with a small work buffer (``ggml_new_buffer``) so that the data
        of the next tensor made in this context starts at a multiple of
        ``alignment`` bytes. ggml aligns objects to GGML_MEM_ALIGN only; the
        FLASH_ATTN_BACK kernel runs up to 30 % slower when its result straddles
        cache lines (measured: scripts/bench_flash_attn_back.py).
        """
        _need_open(self)
        if alignment == 0 or alignment & (alignment - 1) or alignment % GGML_MEM_ALIGN:
            raise ValueError(f"alignment must be a power of two multiple of {GGML_MEM_ALIGN}, got {alignment}")
        cdef uintptr_t next_data = (self._base + ggml_used_mem(self.ptr) + _OBJECT_SIZE
                                    + (sizeof(ggml_tensor) + GGML_MEM_ALIGN - 1) // GGML_MEM_ALIGN * GGML_MEM_ALIGN)
        cdef size_t miss = (alignment - next_data % alignment) % alignment
        if miss == 0:
            return
        # the buffer object adds _OBJECT_SIZE + nbytes (nbytes a multiple of GGML_MEM_ALIGN)
        cdef size_t nbytes = (miss + alignment - _OBJECT_SIZE % alignment) % alignment
        if nbytes == 0:
            nbytes = alignment
        self._reserve_object(nbytes, "_align_next_data")
        ggml_new_buffer(self.ptr, nbytes)

    def _borrow_numpy(self, array):
        """_borrow_numpy(array) -> Tensor  (private: for pyggml's own zero-copy inputs)

        A tensor of this no_alloc context whose data is ``array``'s memory (C-contiguous,
        aligned, 1 to 4 dims). The context keeps the array alive until it is deallocated.
        The tensor must only be read by the graphs it feeds: pyggml's callers never
        write into borrowed memory. ``numpy()`` on it raises (the memory is not a pool's).
        """
        _need_open(self)
        if not self.no_alloc:
            raise ValueError("_borrow_numpy: needs a no_alloc context")
        if type(array) is not np.ndarray:
            raise TypeError(f"_borrow_numpy: array must be a numpy.ndarray, not {type(array).__name__}")
        cdef cnp.ndarray arr = array
        if not (arr.flags.c_contiguous and arr.flags.aligned and arr.flags.writeable):
            # writeable too: an op such as cpy could write into the tensor, and writing
            # to read-only memory (a mapped file, a bytes buffer) would crash
            raise ValueError("_borrow_numpy: array must be C-contiguous, aligned and writeable")
        typ = _TYPE_OF_DTYPE.get(arr.dtype)
        if typ is None:
            raise TypeError(f"_borrow_numpy: dtype {arr.dtype} has no ggml type")
        if not 1 <= arr.ndim <= GGML_MAX_DIMS or arr.size == 0:
            raise ValueError(f"_borrow_numpy: array must have 1 to {GGML_MAX_DIMS} dims and elements")
        cdef Tensor t = self.new_tensor(typ, array.shape[::-1])
        t.ptr.data = cnp.PyArray_DATA(arr)
        if self._borrowed is None:
            self._borrowed = []
        self._borrowed.append(arr)
        return t

    def from_numpy(self, array):
        """from_numpy(array) -> Tensor

        A new tensor holding a copy of ``array`` (1 to 4 dims, a dtype with a
        ggml type: float32, float16, float64, int8/16/32/64). ``ne`` is the
        array's shape reversed.
        """
        _need_open(self)
        arr = np.asarray(array)
        dt = arr.dtype.newbyteorder("=") if arr.dtype.byteorder not in "=|" else arr.dtype
        typ = _TYPE_OF_DTYPE.get(dt)
        if typ is None:
            raise TypeError(f"from_numpy: dtype {arr.dtype} has no ggml type; supported: "
                            + ", ".join(str(d) for d in _TYPE_OF_DTYPE))
        if not 1 <= arr.ndim <= GGML_MAX_DIMS:
            raise ValueError(f"from_numpy: array must have 1 to {GGML_MAX_DIMS} dimensions, got {arr.ndim}")
        if self.no_alloc:
            raise ValueError("from_numpy: the context was created with no_alloc=True")
        cdef Tensor t = self.new_tensor(typ, array.shape[::-1])
        np.copyto(t._view(arr.ndim), arr, casting="no" if dt == arr.dtype else "equiv")
        return t


cdef ggml_type _need_type_arg(object typ) except? GGML_TYPE_COUNT:
    if type(typ) is not Type:
        if isinstance(typ, bool) or not hasattr(typ, "__index__"):
            raise TypeError(f"type must be a pyggml.Type, not {type(typ).__name__}")
        if typ.__index__() not in _TYPE_VALUES:
            raise ValueError(f"type={typ!r} is not a ggml type pyggml supports")
    return _ctype(typ)


# --- Tensor ------------------------------------------------------------------

cdef inline int _shape_ndims(const ggml_tensor * p):
    # ggml_n_dims counts up to the last dimension > 1; a 0 beyond it must stay
    cdef int i, n = ggml_n_dims(p)
    for i in range(n, GGML_MAX_DIMS):
        if p.ne[i] == 0:
            n = i + 1
    return n


cdef inline Tensor _wrap(Context ctx, ggml_tensor * p):
    cdef Tensor t = Tensor.__new__(Tensor)
    t.ptr = p
    t.ctx = ctx
    return t


@cython.final
@cython.freelist(64)
@cython.no_gc   # holds only its Context, which never refers back to a Tensor: no cycles
cdef class Tensor:
    """A ggml tensor in a :class:`Context`. Made by ``Context.new_tensor``,
    ``Context.from_numpy`` and the ops; not constructed directly.

    ``ne``/``nb`` are ggml order (fastest first; elements / bytes);
    ``shape`` is numpy order.
    """
    cdef ggml_tensor * ptr
    cdef readonly Context ctx

    def __init__(self):
        raise TypeError("Tensors are made by Context.new_tensor, Context.from_numpy or an op")

    cdef inline int _check(self) except -1:
        if self.ctx.ptr == NULL:
            raise ValueError("tensor used after its context was closed")
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
        """numpy-order shape: ``ne[:n_dims]`` reversed (and any dimension of 0 kept,
        which ``ggml_n_dims`` ignores, so an empty tensor has an empty shape)."""
        self._check()
        cdef int n = _shape_ndims(self.ptr)
        return tuple(self.ptr.ne[i] for i in range(n - 1, -1, -1))

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
            raise TypeError(f"name must be a str, not {type(value).__name__}")
        b = value.encode()
        if len(b) >= GGML_MAX_NAME or b"\0" in b:
            raise ValueError(f"name must be at most {GGML_MAX_NAME - 1} UTF-8 bytes without NUL, got {len(b)}")
        ggml_set_name(self.ptr, PyBytes_AsString(b))

    @property
    def op(self):
        """The op that makes this tensor, as ggml names it (``ggml_op_name``), e.g. ``"ADD"``."""
        self._check()
        return ggml_op_name(self.ptr.op).decode()

    @property
    def op_params(self):
        """The first ``GGML_MAX_OP_PARAMS // 4`` int32 op parameters."""
        self._check()
        return tuple(self.ptr.op_params[i] for i in range(GGML_MAX_OP_PARAMS // 4))

    @property
    def flags(self):
        self._check()
        return self.ptr.flags

    @property
    def src(self):
        """The source tensors (``src[0..]`` up to the last non-NULL)."""
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
            raise RuntimeError("source tensor belongs to no context pyggml knows")
        return _wrap(owner, p)

    @property
    def data_ptr(self):
        """Address of the tensor's data (0 for no data)."""
        self._check()
        return <uintptr_t>self.ptr.data

    cdef object _view(self, int nd):
        """Zero-copy ndarray over the data with the first ``nd`` ggml dims (numpy order)."""
        self._check()
        cdef ggml_tensor * p = self.ptr
        typenum = _NPY_TYPENUM.get(p.type)
        if typenum is None:
            raise TypeError(f"numpy: type {Type(p.type).name} has no numpy dtype (quantized blocks)")
        if ggml_nelements(p) == 0:
            # nothing to share; ggml gives empty tensors no data pointer
            return np.empty(tuple(p.ne[i] for i in range(nd - 1, -1, -1)), dtype=_NUMPY_DTYPE[Type(p.type)])
        if p.data == NULL:
            raise ValueError("numpy: the tensor has no data (its context was created with no_alloc=True)")
        cdef cnp.npy_intp dims[4]
        cdef cnp.npy_intp strides[4]
        cdef int i
        cdef size_t span = ggml_type_size(p.type)
        for i in range(nd):
            dims[nd - 1 - i] = p.ne[i]
            strides[nd - 1 - i] = p.nb[i]
            if p.ne[i] == 0:
                span = 0
        if span:
            for i in range(GGML_MAX_DIMS):
                span += (p.ne[i] - 1) * p.nb[i]
        cdef _Pool pool = self.ctx._pool_of(p.data, span)
        if pool is None:
            raise ValueError("numpy: the tensor's data lies outside the memory of its contexts")
        arr = cnp.PyArray_New(np.ndarray, nd, dims, typenum, strides, p.data,
                              ggml_type_size(p.type), cnp.NPY_ARRAY_WRITEABLE, None)
        cnp.set_array_base(arr, pool)
        return arr

    def numpy(self):
        """numpy() -> ndarray

        A zero-copy, writable view of the tensor's data, shaped ``self.shape``
        with strides ``nb`` reversed. Its ``base`` keeps the memory alive, also
        after the context is closed. BF16 data is shown as ``uint16`` bits.
        """
        self._check()
        return self._view(_shape_ndims(self.ptr))


# --- ops -----------------------------------------------------------------------
# One function per ggml op, named as in C without the prefix, ctx first.

cdef inline Tensor _dup_result(Context ctx, Tensor a, str op):
    """Check room for a new tensor shaped like ``a`` (ggml_dup_tensor)."""
    ctx._reserve_tensor(_data_nbytes(a.ptr.type, a.ptr.ne[0], a.ptr.ne[1], a.ptr.ne[2], a.ptr.ne[3]), op)
    return a


cdef inline _view_result(Context ctx, str op):
    """Check room for a view (a tensor header, no data)."""
    ctx._reserve_tensor(0, op)


cdef Tensor _binary(Context ctx, object a_, object b_, str op):
    cdef Tensor a = _need_tensor(a_, "a"), b = _need_tensor(b_, "b")
    _need_type(a, "a", op, _F32)
    _need_type(b, "b", op, _F32)
    _need_rows_contiguous(a, "a", op)
    _need_rows_contiguous(b, "b", op)
    _need_can_repeat(b, a, "b", "a", op)
    _dup_result(ctx, a, op)
    return a


def add(Context ctx not None, a, b):
    """add(ctx, a, b) -> Tensor: a + b, b broadcast to a's shape. F32."""
    _binary(ctx, a, b, "add")
    return ctx._adopt(ggml_add(ctx.ptr, (<Tensor>a).ptr, (<Tensor>b).ptr), (a, b))


def sub(Context ctx not None, a, b):
    """sub(ctx, a, b) -> Tensor: a - b, b broadcast to a's shape. F32."""
    _binary(ctx, a, b, "sub")
    return ctx._adopt(ggml_sub(ctx.ptr, (<Tensor>a).ptr, (<Tensor>b).ptr), (a, b))


def mul(Context ctx not None, a, b):
    """mul(ctx, a, b) -> Tensor: a * b elementwise, b broadcast to a's shape. F32."""
    _binary(ctx, a, b, "mul")
    return ctx._adopt(ggml_mul(ctx.ptr, (<Tensor>a).ptr, (<Tensor>b).ptr), (a, b))


def div(Context ctx not None, a, b):
    """div(ctx, a, b) -> Tensor: a / b elementwise, b broadcast to a's shape. F32."""
    _binary(ctx, a, b, "div")
    return ctx._adopt(ggml_div(ctx.ptr, (<Tensor>a).ptr, (<Tensor>b).ptr), (a, b))


cdef Tensor _unary(Context ctx, object a_, str op, bint contiguous=False):
    cdef Tensor a = _need_tensor(a_, "a")
    _need_type(a, "a", op, _F32)
    if contiguous:
        _need_contiguous(a, "a", op)
    else:
        _need_rows_contiguous(a, "a", op)
    _dup_result(ctx, a, op)
    return a


def scale(Context ctx not None, a, float s):
    """scale(ctx, a, s) -> Tensor: a * s. F32, contiguous."""
    _unary(ctx, a, "scale", True)
    _need_padded_1d(a, "a", "scale")
    return ctx._adopt(ggml_scale(ctx.ptr, (<Tensor>a).ptr, s), (a,))


def sqr(Context ctx not None, a):
    """sqr(ctx, a) -> Tensor: a * a. F32."""
    _unary(ctx, a, "sqr")
    return ctx._adopt(ggml_sqr(ctx.ptr, (<Tensor>a).ptr), (a,))


def sqrt(Context ctx not None, a):
    """sqrt(ctx, a) -> Tensor: elementwise square root. F32."""
    _unary(ctx, a, "sqrt")
    return ctx._adopt(ggml_sqrt(ctx.ptr, (<Tensor>a).ptr), (a,))


def soft_max(Context ctx not None, a):
    """soft_max(ctx, a) -> Tensor: softmax along ne[0] (numpy's last axis). F32, contiguous."""
    _unary(ctx, a, "soft_max", True)
    return ctx._adopt(ggml_soft_max(ctx.ptr, (<Tensor>a).ptr), (a,))


def diag_mask_inf(Context ctx not None, a, n_past):
    """diag_mask_inf(ctx, a, n_past) -> Tensor

    Sets element (row i, column j) to -inf where ``j > n_past + i``. F32, contiguous, n_past >= 0.
    """
    cdef int n = _need_int32(n_past, "n_past", 0)
    _unary(ctx, a, "diag_mask_inf", True)
    return ctx._adopt(ggml_diag_mask_inf(ctx.ptr, (<Tensor>a).ptr, n), (a,))


def sum(Context ctx not None, a):
    """sum(ctx, a) -> Tensor: the sum of all elements, a 1-element tensor of a's type. F32, F16, BF16."""
    cdef Tensor t = _need_tensor(a, "a")
    _need_type(t, "a", "sum", _FLOATS)
    _need_rows_contiguous(t, "a", "sum")
    ctx._reserve_tensor(_data_nbytes(t.ptr.type, 1, 1, 1, 1), "sum")
    return ctx._adopt(ggml_sum(ctx.ptr, t.ptr), (a,))


def mean(Context ctx not None, a):
    """mean(ctx, a) -> Tensor: the mean of each row (along ne[0]); ne = (1, ne1, ne2, ne3). F32."""
    cdef Tensor t = _need_tensor(a, "a")
    _need_type(t, "a", "mean", _F32)
    _need_rows_contiguous(t, "a", "mean")
    ctx._reserve_tensor(_data_nbytes(GGML_TYPE_F32, 1, t.ptr.ne[1], t.ptr.ne[2], t.ptr.ne[3]), "mean")
    return ctx._adopt(ggml_mean(ctx.ptr, t.ptr), (a,))


def repeat(Context ctx not None, a, b):
    """repeat(ctx, a, b) -> Tensor: a tiled to b's shape (each b.ne[i] a multiple of a.ne[i])."""
    cdef Tensor ta = _need_tensor(a, "a"), tb = _need_tensor(b, "b")
    _need_type(ta, "a", "repeat", _REPEAT_TYPES)
    _need_rows_contiguous(ta, "a", "repeat")
    _need_can_repeat(ta, tb, "a", "b", "repeat")
    ctx._reserve_tensor(_data_nbytes(ta.ptr.type, tb.ptr.ne[0], tb.ptr.ne[1], tb.ptr.ne[2], tb.ptr.ne[3]), "repeat")
    return ctx._adopt(ggml_repeat(ctx.ptr, ta.ptr, tb.ptr), (a, b))


def mul_mat(Context ctx not None, a, b):
    """mul_mat(ctx, a, b) -> Tensor

    ggml's matrix product: ``result[i3,i2,i1,i0] = sum_k a[.., i0, k] * b[.., i1, k]``,
    i.e. in numpy terms ``b @ a.T`` per batch, a broadcast over b's batch dims.
    Result ne = (a.ne[1], b.ne[1], b.ne[2], b.ne[3]), F32.
    a: F32, F16 or BF16, not transposed; b: F32; a.ne[0] == b.ne[0];
    b.ne[2] and b.ne[3] multiples of a.ne[2] and a.ne[3].
    """
    cdef Tensor ta = _need_tensor(a, "a"), tb = _need_tensor(b, "b")
    _need_type(ta, "a", "mul_mat", _FLOATS)
    _need_type(tb, "b", "mul_mat", _F32)
    if ta.ptr.ne[0] != tb.ptr.ne[0]:
        raise ValueError(f"mul_mat: a.ne[0]={ta.ptr.ne[0]} must equal b.ne[0]={tb.ptr.ne[0]}")
    for i in (2, 3):
        if ta.ptr.ne[i] == 0 or tb.ptr.ne[i] % ta.ptr.ne[i] != 0:
            raise ValueError(f"mul_mat: b.ne[{i}]={tb.ptr.ne[i]} must be a multiple of a.ne[{i}]={ta.ptr.ne[i]}")
    if ggml_is_transposed(ta.ptr):
        raise ValueError(f"mul_mat: a must not be transposed (nb[0] > nb[1]), got nb={ta.nb}; use cont()")
    _need_rows_contiguous(ta, "a", "mul_mat")
    _need_rows_contiguous(tb, "b", "mul_mat")
    ctx._reserve_tensor(_data_nbytes(GGML_TYPE_F32, ta.ptr.ne[1], tb.ptr.ne[1], tb.ptr.ne[2], tb.ptr.ne[3]), "mul_mat")
    return ctx._adopt(ggml_mul_mat(ctx.ptr, ta.ptr, tb.ptr), (a, b))


def transpose(Context ctx not None, a):
    """transpose(ctx, a) -> Tensor: a view with dims 0 and 1 swapped."""
    _need_tensor(a, "a")
    _view_result(ctx, "transpose")
    return ctx._adopt(ggml_transpose(ctx.ptr, (<Tensor>a).ptr), (a,))


def permute(Context ctx not None, a, axis0, axis1, axis2, axis3):
    """permute(ctx, a, axis0, axis1, axis2, axis3) -> Tensor

    A view where source dim i becomes dim ``axis_i`` (ggml order); the axes are
    a permutation of 0..3.
    """
    _need_tensor(a, "a")
    axes = [_need_int32(x, f"axis{i}") for i, x in enumerate((axis0, axis1, axis2, axis3))]
    if sorted(axes) != [0, 1, 2, 3]:
        raise ValueError(f"permute: axes {tuple(axes)} must be a permutation of (0, 1, 2, 3)")
    _view_result(ctx, "permute")
    return ctx._adopt(ggml_permute(ctx.ptr, (<Tensor>a).ptr, axes[0], axes[1], axes[2], axes[3]), (a,))


def reshape(Context ctx not None, a, b):
    """reshape(ctx, a, b) -> Tensor: a view of contiguous a with b's ne."""
    cdef Tensor ta = _need_tensor(a, "a"), tb = _need_tensor(b, "b")
    _need_contiguous(ta, "a", "reshape")
    _need_same_nelements(ta, tb, "reshape")
    _view_result(ctx, "reshape")
    return ctx._adopt(ggml_reshape(ctx.ptr, ta.ptr, tb.ptr), (a, b))


cdef Tensor _reshape_nd(Context ctx, object a, tuple ne):
    cdef Tensor ta = _need_tensor(a, "a")
    ne = _need_ne(ne)
    _need_contiguous(ta, "a", "reshape")
    n = 1
    for v in ne:
        n *= v
    if n != ggml_nelements(ta.ptr):
        raise ValueError(f"reshape: a has {ggml_nelements(ta.ptr)} elements (ne={ta.ne}), new ne={ne} has {n}")
    _view_result(ctx, "reshape")
    ne = ne + (1,) * (4 - len(ne))
    # ggml_reshape_4d gives 4 dims; ggml_n_dims ignores trailing ones, so this matches reshape_1d..3d
    return ctx._adopt(ggml_reshape_4d(ctx.ptr, ta.ptr, ne[0], ne[1], ne[2], ne[3]), (a,))


def reshape_1d(Context ctx not None, a, ne0):
    """reshape_1d(ctx, a, ne0) -> Tensor"""
    return _reshape_nd(ctx, a, (ne0,))


def reshape_2d(Context ctx not None, a, ne0, ne1):
    """reshape_2d(ctx, a, ne0, ne1) -> Tensor"""
    return _reshape_nd(ctx, a, (ne0, ne1))


def reshape_3d(Context ctx not None, a, ne0, ne1, ne2):
    """reshape_3d(ctx, a, ne0, ne1, ne2) -> Tensor"""
    return _reshape_nd(ctx, a, (ne0, ne1, ne2))


def reshape_4d(Context ctx not None, a, ne0, ne1, ne2, ne3):
    """reshape_4d(ctx, a, ne0, ne1, ne2, ne3) -> Tensor"""
    return _reshape_nd(ctx, a, (ne0, ne1, ne2, ne3))


cdef Tensor _view_nd(Context ctx, object a, tuple ne, tuple nb, object offset):
    """ggml_view_Nd with strides nb (bytes, for dims 1..) at byte ``offset``.

    ggml checks only that a contiguous block of the view's size fits; pyggml also
    checks that the last element the strides reach lies inside ``a``'s base
    tensor, so no view (and no numpy array over it) reaches foreign memory.
    """
    cdef Tensor ta = _need_tensor(a, "a")
    ne = _need_ne(ne)
    if isinstance(offset, bool) or not hasattr(offset, "__index__"):
        raise TypeError(f"offset must be an int (bytes), not {type(offset).__name__}")
    offset = offset.__index__()
    if offset < 0:
        raise ValueError(f"offset must be >= 0 bytes, got {offset}")
    for i, v in enumerate(nb):
        if isinstance(v, bool) or not hasattr(v, "__index__") or v.__index__() < 0:
            raise ValueError(f"nb{i + 1} must be an int >= 0 (bytes), got {v!r}")
    nb = tuple(v.__index__() for v in nb)
    cdef ggml_type typ = ta.ptr.type
    if ggml_is_quantized(typ):
        raise TypeError(f"view: type {Type(typ).name} is quantized; pyggml views only plain types")
    tsize = ggml_type_size(typ)
    full_nb = (tsize,) + nb
    # ggml's defaults for the unspecified strides: contiguous continuation
    while len(full_nb) < 4:
        k = len(full_nb)
        full_nb = full_nb + (full_nb[k - 1] * ne[k - 1] if k - 1 < len(ne) else full_nb[k - 1],)
    ne4 = ne + (1,) * (4 - len(ne))
    cdef ggml_tensor * base = ta.ptr.view_src if ta.ptr.view_src != NULL else ta.ptr
    base_offs = ta.ptr.view_offs if ta.ptr.view_src != NULL else 0
    base_nbytes = ggml_nbytes(base)
    data_size = tsize
    for v in ne:
        data_size *= v
    if base_offs + offset + data_size > base_nbytes:
        raise ValueError(f"view: {data_size} bytes at offset {offset} exceed a's data "
                         f"({base_nbytes - base_offs} bytes from a's start)")
    if data_size:
        last = offset + tsize
        for n, st in zip(ne4, full_nb):
            last += (n - 1) * st
        if base_offs + last > base_nbytes:
            raise ValueError(f"view: ne={ne} with nb={full_nb} reaches byte {last} past a's start, "
                             f"beyond its data ({base_nbytes - base_offs} bytes)")
    _view_result(ctx, "view")
    cdef Tensor r = ctx._adopt(ggml_view_4d(ctx.ptr, ta.ptr, ne4[0], ne4[1], ne4[2], ne4[3],
                                            full_nb[1], full_nb[2], full_nb[3], offset), (a,))
    return r


def view_1d(Context ctx not None, a, ne0, offset):
    """view_1d(ctx, a, ne0, offset) -> Tensor: ne0 elements of a from byte ``offset``."""
    return _view_nd(ctx, a, (ne0,), (), offset)


def view_2d(Context ctx not None, a, ne0, ne1, nb1, offset):
    """view_2d(ctx, a, ne0, ne1, nb1, offset) -> Tensor (strides in bytes)"""
    return _view_nd(ctx, a, (ne0, ne1), (nb1,), offset)


def view_3d(Context ctx not None, a, ne0, ne1, ne2, nb1, nb2, offset):
    """view_3d(ctx, a, ne0, ne1, ne2, nb1, nb2, offset) -> Tensor (strides in bytes)"""
    return _view_nd(ctx, a, (ne0, ne1, ne2), (nb1, nb2), offset)


def view_4d(Context ctx not None, a, ne0, ne1, ne2, ne3, nb1, nb2, nb3, offset):
    """view_4d(ctx, a, ne0, ne1, ne2, ne3, nb1, nb2, nb3, offset) -> Tensor (strides in bytes)"""
    return _view_nd(ctx, a, (ne0, ne1, ne2, ne3), (nb1, nb2, nb3), offset)


cdef uint64_t _DUP_TYPES = _FLOATS


def cont(Context ctx not None, a):
    """cont(ctx, a) -> Tensor: a contiguous copy of a. F32, F16, BF16."""
    cdef Tensor t = _need_tensor(a, "a")
    _need_type(t, "a", "cont", _DUP_TYPES)
    _dup_result(ctx, t, "cont")
    return ctx._adopt(ggml_cont(ctx.ptr, t.ptr), (a,))


def cpy(Context ctx not None, a, b):
    """cpy(ctx, a, b) -> Tensor

    Copies a into b (converting between F32, F16 and BF16); returns a view of b
    that, when computed, performs the copy. a and b must have the same number of elements.
    """
    cdef Tensor ta = _need_tensor(a, "a"), tb = _need_tensor(b, "b")
    _need_type(ta, "a", "cpy", _DUP_TYPES)
    _need_type(tb, "b", "cpy", _DUP_TYPES)
    _need_same_nelements(ta, tb, "cpy")
    _view_result(ctx, "cpy")
    return ctx._adopt(ggml_cpy(ctx.ptr, ta.ptr, tb.ptr), (a, b))


# --- autodiff ---------------------------------------------------------------------

def set_param(t):
    """set_param(t): mark ``t`` as a parameter: graphs with grads compute its gradient.

    ``t`` must be made by new_tensor/from_numpy (op NONE), F32 or F16, and be marked
    before the graph that uses it is expanded.
    """
    cdef Tensor tensor = _need_tensor(t, "t")
    if tensor.ptr.op != GGML_OP_NONE:
        raise ValueError(f"set_param: t must be an input tensor (op NONE), not the result of {tensor.op}")
    _need_type(tensor, "t", "set_param", _F32 | _bit(GGML_TYPE_F16))
    ggml_set_param(tensor.ptr)


def set_loss(t):
    """set_loss(t): mark the scalar F32 tensor ``t`` as a loss (its gradient starts at 1)."""
    cdef Tensor tensor = _need_tensor(t, "t")
    _need_type(tensor, "t", "set_loss", _F32)
    if ggml_nelements(tensor.ptr) != 1:
        raise ValueError(f"set_loss: t must be a scalar (1 element), got ne={tensor.ne}")
    ggml_set_loss(tensor.ptr)


cdef struct _backward_args:
    ggml_context * ctx
    ggml_cgraph * graph

cdef void _backward_call(void * arg) noexcept nogil:
    cdef _backward_args * a = <_backward_args *>arg
    ggml_build_backward_expand(a.ctx, a.graph, NULL)


cdef struct _compute_args:
    ggml_cgraph * graph
    ggml_cplan * plan

cdef void _compute_call(void * arg) noexcept nogil:
    cdef _compute_args * a = <_compute_args *>arg
    ggml_graph_compute(a.graph, a.plan)


# --- flash_attn_back ------------------------------------------------------------
# Upstream's ggml_flash_attn_back() begins with GGML_ABORT since 2024-05-23, but the
# CPU kernel for GGML_OP_FLASH_ATTN_BACK still runs. pyggml builds the node as the
# seed (upstream's builder before the abort) did; every GGML_ASSERT of the seed and
# every precondition of the kernel is checked here first.

cdef inline object _pad(object x, object n):
    # GGML_PAD(x, n), in Python ints: no overflow
    return (x + n - 1) // n * n


def flash_attn_back_offsets(q, k, v):
    """flash_attn_back_offsets(q, k, v) -> (offs_q, offs_k, offs_v, end)

    Byte offsets of grad_q, grad_k and grad_v in the result of
    :func:`flash_attn_back`, and its padded end, as the seed computes them:
    each gradient is ``nelements * 4`` bytes, padded to ``GGML_MEM_ALIGN``.
    """
    cdef Tensor tq = _need_tensor(q, "q"), tk = _need_tensor(k, "k"), tv = _need_tensor(v, "v")
    cdef size_t tsize = ggml_type_size(GGML_TYPE_F32)
    offs_q = 0
    offs_k = offs_q + _pad(ggml_nelements(tq.ptr) * tsize, GGML_MEM_ALIGN)
    offs_v = offs_k + _pad(ggml_nelements(tk.ptr) * tsize, GGML_MEM_ALIGN)
    end = offs_v + _pad(ggml_nelements(tv.ptr) * tsize, GGML_MEM_ALIGN)
    return offs_q, offs_k, offs_v, end


UPSTREAM_DEFECT_FAB_BATCH_GQA = (
    "upstream ggml defect: the FLASH_ATTN_BACK CPU kernel strides grad_k and grad_v "
    "over ne3 with q's ne2 (nbgk3 = nb0*nek0*nek1*neq2, nbgv3 likewise) instead of "
    "k's, so with ne3 > 1 and kvne2 < ne2 it writes past its result tensor")


cdef int _need_flash_attn_back(Tensor q, Tensor k, Tensor v, Tensor d, bint probe=False) except -1:
    """The seed's GGML_ASSERTs, then the kernel's own preconditions (``probe``: all but
    the known defect, for _probe_fab_batch_gqa_oob)."""
    cdef str op = "flash_attn_back"
    D, N, M = q.ptr.ne[0], q.ptr.ne[1], k.ptr.ne[1]
    ne2, ne3, kvne2 = q.ptr.ne[2], q.ptr.ne[3], k.ptr.ne[2]
    for arg, t in (("q", q), ("k", k), ("v", v), ("d", d)):
        _need_type(t, arg, op, _F32)      # the kernel reads all four as float
        if ggml_nelements(t.ptr) == 0:
            raise ValueError(f"{op}: {arg} is empty (ne={t.ne})")
    # seed: GGML_ASSERT(ggml_can_mul_mat(k, q))
    if k.ptr.ne[0] != q.ptr.ne[0]:
        raise ValueError(f"{op}: k.ne[0]={k.ptr.ne[0]} must equal q.ne[0]=D={D}")
    if q.ptr.ne[2] % k.ptr.ne[2] != 0:
        raise ValueError(f"{op}: q.ne[2]=ne2={ne2} must be a multiple of k.ne[2]=kvne2={kvne2}")
    if q.ptr.ne[3] % k.ptr.ne[3] != 0 or k.ptr.ne[3] != ne3:
        raise ValueError(f"{op}: k.ne[3]={k.ptr.ne[3]} must equal q.ne[3]=ne3={ne3}")
    checks = (
        ("v.ne[0]", v.ptr.ne[0], "M", M), ("v.ne[1]", v.ptr.ne[1], "D", D),
        ("d.ne[0]", d.ptr.ne[0], "D", D), ("d.ne[1]", d.ptr.ne[1], "N", N),
        ("v.ne[2]", v.ptr.ne[2], "kvne2", kvne2), ("v.ne[3]", v.ptr.ne[3], "ne3", ne3),
        ("d.ne[2]", d.ptr.ne[2], "ne2", ne2), ("d.ne[3]", d.ptr.ne[3], "ne3", ne3),
    )
    for name, got, want_name, want in checks:
        if got != want:
            raise ValueError(f"{op}: {name}={got} must equal {want_name}={want} "
                             f"(q [D,N,ne2,ne3]={q.ne}, k [D,M,kvne2,ne3]={k.ne}, "
                             f"v [M,D,kvne2,ne3]={v.ne}, d [D,N,ne2,ne3]={d.ne})")
    # the kernel: P = M - N >= 0, rows of q, k, v contiguous
    if M < N:
        raise ValueError(f"{op}: M={M} keys must be >= N={N} queries (the kernel asserts P = M - N >= 0)")
    for arg, t in (("q", q), ("k", k), ("v", v)):
        _need_rows_contiguous(t, arg, op)
    # the kernel indexes with int: keep every count it loops over within int32
    for name, val in (("D", D), ("N", N), ("M", M), ("ne2", ne2), ("kvne2*ne3", kvne2 * ne3)):
        if val > 2147483647 // 2:
            raise ValueError(f"{op}: {name}={val} is too large for the kernel's int indices")
    if ne3 > 1 and kvne2 < ne2 and not probe:
        raise ValueError(f"{op}: refused for ne3={ne3} > 1 with kvne2={kvne2} < ne2={ne2}: "
                         f"{UPSTREAM_DEFECT_FAB_BATCH_GQA}. Build one node per ne3 slice "
                         f"(pyggml.attention_backward does).")
    return 0


def flash_attn_back(Context ctx not None, q, k, v, d, masked):
    """flash_attn_back(ctx, q, k, v, d, masked) -> Tensor

    The seed's ``ggml_flash_attn_back``: a GGML_OP_FLASH_ATTN_BACK node whose
    result packs grad_q, grad_k and grad_v (see :func:`flash_attn_back_offsets`).

    Shapes, ggml order: q ``[D,N,ne2,ne3]``, k ``[D,M,kvne2,ne3]``,
    v ``[M,D,kvne2,ne3]`` (transposed), d ``[D,N,ne2,ne3]`` (the gradient of
    the attention output). All F32; rows of q, k, v contiguous; ``M >= N``;
    ``ne2 % kvne2 == 0``, query head h using kv head ``h % kvne2``.
    ``masked``: key j is hidden from query i when ``j > (M - N) + i``.

    The result is a 1-D F32 tensor of ``(end + 3) // 4`` elements with
    ``op_params[0] = masked`` and ``src[0..3] = q, k, v, d``. Raises ValueError
    for ne3 > 1 with kvne2 < ne2 (an upstream kernel defect, see
    ``UPSTREAM_DEFECT_FAB_BATCH_GQA``).
    """
    if not PYGGML_HAVE_FLASH_ATTN_BACK:
        raise NotImplementedError(f"flash_attn_back: ggml {c_ggml_version().decode()} has no GGML_OP_FLASH_ATTN_BACK")
    cdef Tensor tq = _need_tensor(q, "q"), tk = _need_tensor(k, "k")
    cdef Tensor tv = _need_tensor(v, "v"), td = _need_tensor(d, "d")
    if type(masked) is not bool and masked not in (0, 1):
        raise TypeError(f"flash_attn_back: masked must be a bool, not {masked!r}")
    _need_flash_attn_back(tq, tk, tv, td)
    return _fab_node(ctx, tq, tk, tv, td, masked, 0)


cdef Tensor _fab_node(Context ctx, Tensor tq, Tensor tk, Tensor tv, Tensor td, bint masked, int64_t extra):
    """The seed's node; ``extra`` elements of padding only for the defect probe."""
    offs_q, offs_k, offs_v, end = flash_attn_back_offsets(tq, tk, tv)
    cdef size_t tsize = ggml_type_size(GGML_TYPE_F32)
    cdef int64_t ne[1]
    ne[0] = (end + tsize - 1) // tsize + extra
    ctx._reserve_tensor(_data_nbytes(GGML_TYPE_F32, ne[0], 1, 1, 1), "flash_attn_back")
    cdef ggml_tensor * result = ggml_new_tensor(ctx.ptr, GGML_TYPE_F32, 1, ne)
    result.op_params[0] = 1 if masked else 0      # ggml_set_op_params(result, &masked_i, 4)
    result.op = GGML_OP_FLASH_ATTN_BACK
    result.src[0] = tq.ptr
    result.src[1] = tk.ptr
    result.src[2] = tv.ptr
    result.src[3] = td.ptr
    return ctx._adopt(result, (tq, tk, tv, td))


def _probe_fab_batch_gqa_oob():
    """_probe_fab_batch_gqa_oob() -> int or None  (private: evidence for the parity report)

    Does this ggml's FLASH_ATTN_BACK kernel still write past its result for
    ne3 > 1 with kvne2 < ne2 (``UPSTREAM_DEFECT_FAB_BATCH_GQA``)? Builds the
    seed's node for D=16, N=M=6, ne2=4, kvne2=2, ne3=2 (where upstream segfaults)
    but with its result padded by as many bytes again, far more than the
    kernel's overrun, so the probe stays in bounds; computes it; returns the
    bytes of padding the kernel wrote (0: fixed).
    """
    if not PYGGML_HAVE_FLASH_ATTN_BACK:
        return None
    cdef int D = 16, N = 6, M = 6, ne2 = 4, kvne2 = 2, ne3 = 2
    rng = np.random.default_rng(0)
    with Context(1 << 20) as ctx:
        tq = ctx.from_numpy(rng.standard_normal((ne3, ne2, N, D), dtype=np.float32))
        tk = ctx.from_numpy(rng.standard_normal((ne3, kvne2, M, D), dtype=np.float32))
        tv = ctx.from_numpy(rng.standard_normal((ne3, kvne2, D, M), dtype=np.float32))
        td = ctx.from_numpy(rng.standard_normal((ne3, ne2, N, D), dtype=np.float32))
        _need_flash_attn_back(tq, tk, tv, td, True)
        end = flash_attn_back_offsets(tq, tk, tv)[3]
        r = _fab_node(ctx, tq, tk, tv, td, False, end // 4)
        g = Graph(ctx, 16)
        g.build_forward_expand(r)
        g.compute(1)
        return int(np.count_nonzero(r.numpy()[end // 4:])) * 4


# --- a set of tensor addresses ---------------------------------------------------

cdef inline size_t _ptr_hash(uintptr_t key) nogil:
    return <size_t>((key >> 4) * <uintptr_t>0x9E3779B97F4A7C15)


@cython.final
cdef class _PtrSet:
    """Open-addressing set of non-NULL addresses (linear probing), for graph traversal.

    A Python set of ints would allocate an int object per address; graphs are
    built in hot loops, so the traversal stays in C.
    """
    cdef uintptr_t * table
    cdef size_t cap, n
    cdef uintptr_t small[16]    # the first table, inside the object: small graphs never malloc

    def __dealloc__(self):
        if self.table != self.small:
            free(self.table)

    cdef int _resize(self, size_t cap) except -1:
        cdef uintptr_t * old = self.table
        cdef size_t old_cap = self.cap, i
        cdef uintptr_t * new
        if old == NULL and cap <= 16:
            new = self.small
            memset(new, 0, cap * sizeof(uintptr_t))
        else:
            new = <uintptr_t *>calloc(cap, sizeof(uintptr_t))
        if new == NULL:
            raise MemoryError()
        self.table = new
        self.cap = cap
        self.n = 0
        for i in range(old_cap):
            if old[i]:
                self.add(old[i])
        if old != self.small:
            free(old)
        return 0

    cdef bint contains(self, uintptr_t key):
        if self.cap == 0:
            return False
        cdef size_t mask = self.cap - 1, i = _ptr_hash(key) & mask
        while self.table[i]:
            if self.table[i] == key:
                return True
            i = (i + 1) & mask
        return False

    cdef int add(self, uintptr_t key) except -1:
        """Insert ``key``; return 1 if it was new, 0 if present."""
        if (self.n + 1) * 2 > self.cap:
            self._resize(16 if self.cap == 0 else self.cap * 2)
        cdef size_t mask = self.cap - 1, i = _ptr_hash(key) & mask
        while self.table[i]:
            if self.table[i] == key:
                return 0
            i = (i + 1) & mask
        self.table[i] = key
        self.n += 1
        return 1

    cdef void discard(self, uintptr_t key):
        """Remove ``key`` if present (backward-shift deletion keeps probe chains intact)."""
        if self.cap == 0:
            return
        cdef size_t mask = self.cap - 1, i = _ptr_hash(key) & mask, j, k
        while self.table[i] != key:
            if not self.table[i]:
                return
            i = (i + 1) & mask
        self.table[i] = 0
        self.n -= 1
        j = i
        while True:
            j = (j + 1) & mask
            if not self.table[j]:
                return
            k = _ptr_hash(self.table[j]) & mask
            # move table[j] back to i unless its home k lies cyclically in (i, j]
            if (i < j and (k <= i or k > j)) or (i > j and k <= i and k > j):
                self.table[i] = self.table[j]
                self.table[j] = 0
                i = j


# --- running a ggml call in a forked child first ------------------------------------
# Some ggml calls build many tensors from rules too involved to re-check in Python
# (ggml_build_backward_expand: one rule per op, asserts deep inside). pyggml runs
# such a call first in a forked child, on a copy-on-write copy of the process: if
# ggml aborts there, the parent raises with ggml's own message; if it succeeds,
# the parent makes the same, deterministic call for real.

cdef extern from "<unistd.h>" nogil:
    ctypedef int pid_t
    pid_t fork()
    int pipe(int * fds)
    ssize_t write(int fd, const void * buf, size_t n)
    ssize_t read(int fd, void * buf, size_t n)
    int close(int fd)
    int dup2(int oldfd, int newfd)
    void _exit(int status)

cdef extern from "<sys/wait.h>" nogil:
    pid_t waitpid(pid_t pid, int * status, int options)
    bint WIFEXITED(int status)
    int WEXITSTATUS(int status)
    bint WIFSIGNALED(int status)
    int WTERMSIG(int status)

ctypedef void (*_guarded_fn)(void * arg) noexcept nogil

cdef int _child_fd = -1

cdef void _child_abort_cb(const char * msg) noexcept nogil:
    write(_child_fd, msg, strlen(msg))
    write(_child_fd, b"\n", 1)

cdef void _child_log_cb(ggml_log_level level, const char * text, void * user_data) noexcept nogil:
    write(_child_fd, text, strlen(text))


cdef int _dry_run(_guarded_fn fn, void * arg, str what) except -1:
    """Run fn(arg) in a forked child; raise MemoryError/ValueError if ggml aborts there."""
    cdef int fds[2]
    cdef int status = 0
    cdef pid_t pid
    cdef char buf[4096]
    cdef ssize_t n
    if pipe(fds) != 0:
        raise OSError("pipe() failed")
    pid = fork()
    if pid < 0:
        close(fds[0]); close(fds[1])
        raise OSError("fork() failed")
    if pid == 0:                       # the child: C only, then _exit
        global _child_fd
        close(fds[0])
        _child_fd = fds[1]
        dup2(fds[1], 2)
        # the parent's fatal-signal handlers (faulthandler) would report the
        # child's expected abort as a crash of the interpreter
        signal(SIGABRT, SIG_DFL)
        signal(SIGSEGV, SIG_DFL)
        signal(SIGBUS, SIG_DFL)
        signal(SIGFPE, SIG_DFL)
        signal(SIGILL, SIG_DFL)
        ggml_set_abort_callback(_child_abort_cb)
        ggml_log_set(_child_log_cb, NULL)
        fn(arg)
        _exit(0)
    close(fds[1])
    chunks = []
    while True:
        with nogil:
            n = read(fds[0], buf, sizeof(buf))
        if n <= 0:
            break
        chunks.append(buf[:n])
    close(fds[0])
    with nogil:
        waitpid(pid, &status, 0)
    if WIFEXITED(status) and WEXITSTATUS(status) == 0:
        return 0
    msg = b"".join(chunks).decode("utf-8", "replace").strip()
    if "not enough space in the context's memory pool" in msg:
        raise MemoryError(f"{what}: the context is too small for what ggml would create ({msg})")
    if "cgraph->size" in msg:
        raise ValueError(f"{what}: the graph is too small for the nodes ggml would add ({msg})")
    sig = f"signal {WTERMSIG(status)}" if WIFSIGNALED(status) else f"exit {WEXITSTATUS(status)}"
    raise ValueError(f"{what}: ggml would abort ({sig}): {msg or 'no message'}")


# --- a cached threadpool ----------------------------------------------------------
# ggml_graph_compute with no threadpool makes and frees one on every call. With
# OpenMP (pyggml's own builds) a threadpool holds no threads, only per-thread
# state, so pyggml keeps one and lends it to one compute at a time (the GIL
# guards the flag); a concurrent compute gets NULL, ggml's disposable pool. A
# system ggml may be built without OpenMP, where a threadpool owns spinning
# threads: there pyggml never caches.

cdef ggml_threadpool * _tp = NULL
cdef int _tp_threads = 0
cdef bint _tp_busy = False
cdef bint _tp_allowed = PYGGML_OPENMP_FLAG.decode().upper() in ("ON", "1", "TRUE", "YES")


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


def _free_threadpool():
    global _tp, _tp_threads
    if _tp != NULL and not _tp_busy:
        ggml_threadpool_free(_tp)
        _tp = NULL
        _tp_threads = 0

import atexit
atexit.register(_free_threadpool)


# --- Graph ----------------------------------------------------------------------

cdef int _default_threads():
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1

cdef int _DEFAULT_N_THREADS = _default_threads()
DEFAULT_N_THREADS = _DEFAULT_N_THREADS
cdef int MAX_N_THREADS = 512   # GGML_MAX_N_THREADS in ggml-cpu (not in a public header)


@cython.final
cdef class Graph:
    """Graph(ctx, size=DEFAULT_GRAPH_SIZE, grads=False)

    A computation graph (``ggml_new_graph_custom``) allocated in ``ctx``, with
    room for ``size`` nodes and ``size`` leafs.
    """
    cdef ggml_cgraph * ptr
    cdef readonly Context ctx
    cdef readonly size_t size
    cdef readonly bint grads
    cdef _PtrSet _seen      # tensors (addresses) already in the graph
    cdef set _ctxs          # contexts whose tensors the graph reaches, beyond ctx
                            # (None while there are none: the common case stays cheap)
    cdef int _n_nodes, _n_leafs
    cdef object _unallocated  # first tensor without data, or None
    cdef int64_t _fab_mxdm    # largest max(D, M rounded up) over FLASH_ATTN_BACK nodes
    cdef bint _busy
    cdef bint _has_backward   # build_backward_expand ran: ggml added ops pyggml does not check
    cdef bint _unproven       # ... and the graph changed since a compute last succeeded

    def __cinit__(self, Context ctx not None, size=GGML_DEFAULT_GRAPH_SIZE, bint grads=False):
        self.ptr = NULL
        _need_open(ctx)
        if type(size) is not int:
            if isinstance(size, bool) or not hasattr(size, "__index__"):
                raise TypeError(f"size must be an int, not {type(size).__name__}")
            size = size.__index__()
        cdef long long lsize
        try:
            lsize = size
        except OverflowError:
            lsize = -1
        if not 1 <= lsize <= (1 << 30):
            raise ValueError(f"size must be in [1, 2**30], got {size}")
        cdef size_t csize = <size_t>lsize
        cdef size_t need = ggml_graph_overhead_custom(csize, grads)
        cdef size_t used = ggml_used_mem(ctx.ptr)
        if used + need > ctx.mem_size:
            raise MemoryError(f"Graph(size={size}) needs {need} bytes but the context has "
                              f"{ctx.mem_size - used} of {ctx.mem_size} free")
        self.ptr = ggml_new_graph_custom(ctx.ptr, csize, grads)
        self.ctx = ctx
        self.size = csize
        self.grads = grads
        self._seen = _PtrSet()
        self._ctxs = None
        self._n_nodes = 0
        self._n_leafs = 0
        self._unallocated = None

    @staticmethod
    def overhead(size=GGML_DEFAULT_GRAPH_SIZE, bint grads=False):
        """Bytes a Graph of ``size`` takes in its context (``ggml_graph_overhead_custom``)."""
        return ggml_graph_overhead_custom(size, grads)

    cdef int _check(self) except -1:
        cdef Context c
        if self.ctx.ptr == NULL:
            raise ValueError("graph used after a context it uses was closed")
        if self._ctxs is not None:
            for c in self._ctxs:
                if c.ptr == NULL:
                    raise ValueError("graph used after a context it uses was closed")
        return 0

    cdef int _add_contexts(self, Context c) except -1:
        """The graph now reaches tensors of ``c`` (and of what ``c`` depends on)."""
        if c is not self.ctx:
            if self._ctxs is None:
                self._ctxs = set()
            self._ctxs.add(c)
        if c._deps:
            if self._ctxs is None:
                self._ctxs = set()
            self._ctxs.update(<set>c._deps)
            self._ctxs.discard(self.ctx)
        return 0

    cdef int _check_idle(self) except -1:
        # a graph must not change while another thread computes it
        if self._busy:
            raise RuntimeError("the graph is being computed in another thread")
        return self._check()

    def build_forward_expand(self, t):
        """build_forward_expand(t): add ``t`` and everything it depends on to the graph.

        Raises ValueError, and leaves the graph as it was, when the new nodes or
        leafs would not fit its ``size`` (ggml would abort).
        """
        self._check_idle()
        cdef Tensor tensor = _need_tensor(t, "t")
        cdef Context dep
        for dep in tensor.ctx._deps:
            if dep.ptr == NULL:
                raise ValueError("build_forward_expand: t depends on a tensor whose context was closed")
        cdef int new_nodes = 0, new_leafs = 0, i
        cdef size_t sp = 0, cap = 64, n_added = 0
        cdef ggml_tensor * p
        cdef ggml_tensor * unallocated = NULL
        cdef int64_t fab_mxdm = 0
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
                if not self._seen.add(<uintptr_t>p):
                    continue
                if sp + n_added + GGML_MAX_SRC + 1 > cap:
                    if buf == local:
                        grown = <ggml_tensor **>malloc(2 * cap * sizeof(ggml_tensor *))
                        if grown != NULL:
                            memcpy(grown, local, cap * sizeof(ggml_tensor *))
                    else:
                        grown = <ggml_tensor **>realloc(buf, 2 * cap * sizeof(ggml_tensor *))
                    if grown == NULL:
                        self._seen.discard(<uintptr_t>p)
                        for i in range(<int>n_added):
                            self._seen.discard(<uintptr_t>buf[cap - 1 - i])
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
                if p.data == NULL and unallocated == NULL:
                    unallocated = p
                if p.op == GGML_OP_FLASH_ATTN_BACK and p.src[0] != NULL and p.src[1] != NULL:
                    fab_mxdm = max(fab_mxdm, p.src[0].ne[0], (p.src[1].ne[1] + 63) // 64 * 64)
                for i in range(GGML_MAX_SRC):
                    if p.src[i] != NULL:
                        buf[sp] = p.src[i]
                        sp += 1
            if self._n_nodes + new_nodes > <int>self.size or self._n_leafs + new_leafs > <int>self.size:
                for i in range(<int>n_added):
                    self._seen.discard(<uintptr_t>buf[cap - 1 - i])
                raise ValueError(f"build_forward_expand: the graph would hold {self._n_nodes + new_nodes} nodes "
                                 f"and {self._n_leafs + new_leafs} leafs; its size is {self.size}")
        finally:
            if buf != local:
                free(buf)
        ggml_build_forward_expand(self.ptr, tensor.ptr)
        if self._has_backward and new_nodes:
            self._unproven = True
        self._n_nodes += new_nodes
        self._n_leafs += new_leafs
        if unallocated != NULL and self._unallocated is None:
            self._unallocated = <uintptr_t>unallocated
        self._fab_mxdm = max(self._fab_mxdm, fab_mxdm)
        self._add_contexts(tensor.ctx)

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

    cdef object _tensor(self, ggml_tensor * p):
        cdef Context c
        if self.ctx._holds(p):
            return _wrap(self.ctx, p)
        if self._ctxs is not None:
            for c in self._ctxs:
                if c._holds(p):
                    return _wrap(c, p)
        raise RuntimeError("graph node belongs to no context pyggml knows")

    cdef size_t _fab_work_size(self, int n_threads):
        # Upstream defect: for FLASH_ATTN_BACK, ggml_graph_plan reserves
        # 4*max(D, Mup)*n_tasks floats (+ a cache line per thread), but the kernel
        # gives thread ith the floats from ith*2*(max(D, Mup) + CACHE_LINE_SIZE_F32):
        # with D < 8 and M <= 4 and 3 or more threads it reads and writes past the
        # plan's buffer. pyggml owns the work buffer, so it sizes it for the kernel
        # (cache lines up to 256 bytes, Mup rounded to 64); tests/test_flash_attn_back.py
        # shows the plan's shortfall.
        if self._fab_mxdm == 0:
            return 0
        return 4 * 2 * <size_t>n_threads * <size_t>(self._fab_mxdm + 64)

    def build_backward_expand(self, Context ctx=None):
        """build_backward_expand(ctx=None)

        ``ggml_build_backward_expand(ctx, graph, NULL)``: add the backward pass
        of every loss (``set_loss``) with respect to every parameter
        (``set_param``) to this graph (made with ``grads=True``), creating the
        gradient tensors in ``ctx`` (default: the graph's context). Then
        initialise the gradients as ``ggml_graph_reset`` does (loss gradient 1,
        accumulators 0), so a compute gives the gradients at once.

        ggml aborts on many conditions here (ops without a backward, context or
        graph too small, ...); pyggml first runs the call in a forked child and
        raises ValueError or MemoryError with ggml's message if it aborts there.
        """
        self._check_idle()
        if ctx is None:
            ctx = self.ctx
        _need_open(ctx)
        if not self.grads:
            raise ValueError("build_backward_expand: the graph was made without gradients; use Graph(ctx, size, grads=True)")
        cdef int i, n = ggml_graph_n_nodes(self.ptr)
        cdef bint any_param = False, any_loss = False
        cdef ggml_tensor * p
        for i in range(n):
            p = ggml_graph_node(self.ptr, i)
            any_param = any_param or (p.flags & GGML_TENSOR_FLAG_PARAM) != 0
            any_loss = any_loss or (p.flags & GGML_TENSOR_FLAG_LOSS) != 0
        if not any_param:
            raise ValueError("build_backward_expand: no parameter among the graph's nodes; "
                             "call set_param on inputs before build_forward_expand")
        if not any_loss:
            raise ValueError("build_backward_expand: no loss among the graph's nodes; call set_loss on a scalar output")
        if ctx.no_alloc:
            raise ValueError("build_backward_expand: ctx is no_alloc; gradients need memory")
        if self._unallocated is not None:
            raise ValueError("build_backward_expand: the graph has tensors without data (from a no_alloc context, or empty: ggml gives those none)")
        cdef _backward_args args
        args.ctx = ctx.ptr
        args.graph = self.ptr
        _dry_run(_backward_call, &args, "build_backward_expand")
        ggml_build_backward_expand(ctx.ptr, self.ptr, NULL)
        self._add_contexts(ctx)
        self._track_new_nodes(n)
        ggml_graph_reset(self.ptr)
        self._has_backward = True
        self._unproven = True

    cdef int _track_new_nodes(self, int first) except -1:
        """Account for nodes ggml added from index ``first`` on (and their leafs)."""
        cdef int i, j, n = ggml_graph_n_nodes(self.ptr)
        cdef ggml_tensor * p
        cdef ggml_tensor * s
        cdef list stack = []
        for i in range(first, n):
            stack.append(<uintptr_t>ggml_graph_node(self.ptr, i))
        while stack:
            p = <ggml_tensor *><uintptr_t>stack.pop()
            if not self._seen.add(<uintptr_t>p):
                continue
            if p.op == GGML_OP_NONE and not (p.flags & GGML_TENSOR_FLAG_PARAM):
                self._n_leafs += 1
            else:
                self._n_nodes += 1
            for j in range(GGML_MAX_SRC):
                s = p.src[j]
                if s != NULL:
                    stack.append(<uintptr_t>s)
        return 0

    def reset(self):
        """reset(): ``ggml_graph_reset``: loss gradients to 1, other gradients to 0."""
        self._check_idle()
        if not self.grads:
            raise ValueError("reset: the graph was made without gradients")
        if self._unallocated is not None:
            raise ValueError("reset: the graph has tensors without data (from a no_alloc context, or empty: ggml gives those none)")
        ggml_graph_reset(self.ptr)

    def grad(self, t):
        """grad(t) -> Tensor or None: the gradient of the losses with respect to ``t``
        (``ggml_graph_get_grad``), None if the graph has none for it."""
        self._check()
        cdef Tensor tensor = _need_tensor(t, "t")
        cdef ggml_tensor * g = ggml_graph_get_grad(self.ptr, tensor.ptr)
        if g == NULL:
            return None
        return self._tensor(g)

    cdef int _prove(self) except -1:
        """Compute once in a forked child, on one thread, before computing for real.

        The backward pass is made of ops pyggml does not build itself (OUT_PROD,
        REPEAT_BACK, ACC, SOFT_MAX_BACK, ...), whose CPU kernels assert on layouts
        (found by fuzzing: e.g. REPEAT_BACK of a permuted gradient). Kernel asserts
        depend on shapes and strides, not on values, so one successful run in a
        child proves the graph; an abort there becomes a ValueError here.
        """
        cdef ggml_cplan plan = ggml_graph_plan(self.ptr, 1, NULL)
        cdef size_t work_size = max(plan.work_size, self._fab_work_size(1))
        cdef _Pool work = _Pool(work_size) if work_size else None
        if work is not None:
            plan.work_data = <uint8_t *>work.ptr
        cdef _compute_args args
        args.graph = self.ptr
        args.plan = &plan
        _dry_run(_compute_call, &args, "compute")
        self._unproven = False
        return 0

    def work_size(self, n_threads):
        """work_size(n_threads) -> int

        Bytes of work buffer ``compute(n_threads)`` allocates: what
        ``ggml_graph_plan`` asks for, or more where a kernel is known to use more.
        """
        self._check()
        cdef int n = _need_int32(n_threads, "n_threads", 1)
        return max(ggml_graph_plan(self.ptr, n, NULL).work_size, self._fab_work_size(n))

    def _plan_work_size(self, n_threads):
        """Bytes ``ggml_graph_plan`` alone asks for (to show upstream's shortfall)."""
        self._check()
        return ggml_graph_plan(self.ptr, _need_int32(n_threads, "n_threads", 1), NULL).work_size

    def compute(self, n_threads=None):
        """compute(n_threads=None)

        Compute the graph on the CPU with ``n_threads`` threads (default: the
        CPUs this process may use), the GIL released. The work buffer is
        allocated by pyggml (``ggml_graph_plan``), not taken from the context.
        Raises RuntimeError when ggml reports a non-success status.
        """
        self._check()
        cdef int n
        if n_threads is None:
            n = _DEFAULT_N_THREADS
        elif type(n_threads) is int and 1 <= n_threads <= MAX_N_THREADS:
            n = n_threads
        else:
            n = _need_int32(n_threads, "n_threads", 1)
            if n > MAX_N_THREADS:
                raise ValueError(f"n_threads must be in [1, {MAX_N_THREADS}], got {n}")
        if self._unallocated is not None:
            raise ValueError("compute: the graph has tensors without data (from a no_alloc context, or empty: ggml gives those none)")
        if self._busy:
            raise RuntimeError("compute: this graph is already being computed in another thread")
        # keep every pool the graph touches alive while the GIL is released
        # (another thread may close a context meanwhile)
        cdef object keep
        cdef Context c
        if self._ctxs is None:
            keep = self.ctx.pool
        else:
            keep = [self.ctx.pool]
            for c in self._ctxs:
                keep.append(c.pool)
        # a cached threadpool saves creating one per compute; one compute at a time uses it
        cdef ggml_threadpool * tp = _threadpool_acquire(n)
        cdef ggml_cplan plan = ggml_graph_plan(self.ptr, n, tp)
        cdef size_t work_size = max(plan.work_size, self._fab_work_size(n))
        cdef _Pool work = None
        if work_size > 0:
            work = _Pool(work_size)
            plan.work_data = <uint8_t *>work.ptr
        if self._unproven:
            self._prove()
        cdef ggml_status status
        self._busy = True
        try:
            with nogil:
                status = ggml_graph_compute(self.ptr, &plan)
        finally:
            self._busy = False
            _threadpool_release(tp)
        if status != GGML_STATUS_SUCCESS:
            raise RuntimeError(f"ggml_graph_compute failed: {ggml_status_to_string(status).decode()}")
