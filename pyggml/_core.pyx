# cython: language_level=3
"""pyggml._core: Storage, Context, Tensor, ggml's enums, and the checks every op shares.

ggml has no error codes: a failed ``GGML_ASSERT`` aborts the process. Every entry
point checks its arguments here before it calls C, and every graph builder runs twice:
first in a scratch ``no_alloc`` context under pyggml's abort guard (csrc/guard.c),
where an assertion of the builder becomes :class:`~pyggml.GGMLAbort`, each new node
is checked against its CPU kernel's preconditions (csrc/rules_*.c) and the exact
memory the call needs is measured; then, only if all is well, for real in the
caller's context. The generated op modules (``_ops_<family>``) call the ``op_*``
helpers below; nothing else about an op is written by hand.

Ownership
---------
* A :class:`Context` allocates its pool (a :class:`Storage`) and hands it to
  ``ggml_init``. ``close()`` frees the ``ggml_context``; the pool lives on while any
  numpy view of a tensor (whose ``base`` is the pool) or any open context whose
  tensors point into it does.
* A :class:`Tensor` holds its Context; once that Context is closed every use of the
  Tensor raises :class:`~pyggml.ContextClosedError`.
* When a tensor of context A is made from tensors of context B (an op, or a backward
  pass), A records B and keeps B's pool alive: A's tensors stay valid whatever the
  order in which A and B are closed or collected.
"""

cimport cython
from cpython.bytes cimport PyBytes_AsString
from cpython.pyport cimport PY_SSIZE_T_MAX
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcpy, strlen

cimport numpy as cnp

from pyggml._ggml cimport *
from pyggml._ggml_backend cimport (ggml_backend_buffer_free, ggml_backend_buffer_get_base,
                                   ggml_backend_buffer_get_size, ggml_backend_buffer_get_type,
                                   ggml_backend_buffer_is_host, ggml_backend_buffer_t, ggml_backend_buft_name,
                                   ggml_backend_tensor_get, ggml_backend_tensor_set)
from pyggml._rt cimport *

import os
import warnings
import weakref
from enum import IntEnum

import numpy as np

from pyggml.errors import (ArgumentError, ComputeError, ContextClosedError, ContextFullError, ExportError, GGMLAbort,
                           GGMLTypeError, GGMLVersionError, GGUFError, InternalError, KernelPreconditionError,
                           KernelTimeout, RPCError, UnsupportedOpError, UpstreamDefect)

cnp.import_array()
pyggml_guard_install()
pyggml_checks_init()

include "enum_members.pxi"

cdef extern from "stdlib.h" nogil:
    int posix_memalign(void ** memptr, size_t alignment, size_t size)

cdef extern from "asan_hooks.h" nogil:
    void pg_asan_reserve(void * pool, size_t used, size_t need, size_t size, size_t * end)
    void pg_asan_release(void * pool, size_t size)
    int pg_asan_enabled()


ASAN = bool(pg_asan_enabled())    # built with AddressSanitizer (scripts/sanitize.py)

cdef extern from "ggml-cpu.h" nogil:
    int ggml_cpu_has_llamafile()

cdef extern from "pyggml_config.h":
    const char * PYGGML_GGML_ORIGIN
    const char * PYGGML_GGML_CMAKE_VERSION
    const char * PYGGML_NATIVE_FLAG
    const char * PYGGML_OPENMP_FLAG


# --- constants read from the compiled headers -------------------------------

MEM_ALIGN = GGML_MEM_ALIGN
MAX_DIMS = GGML_MAX_DIMS
MAX_NAME = GGML_MAX_NAME
MAX_SRC = GGML_MAX_SRC
DEFAULT_GRAPH_SIZE = GGML_DEFAULT_GRAPH_SIZE

# Pools start on a cache line, so where a tensor's data lands (and how fast kernels
# stream it) does not depend on what malloc returned.
cdef size_t _POOL_ALIGN = 64 if GGML_MEM_ALIGN <= 64 else GGML_MEM_ALIGN
# Bytes ggml puts in front of every object in a context (sizeof(struct ggml_object)),
# from the library itself: ggml_tensor_overhead() = object header + sizeof(ggml_tensor).
cdef size_t _OBJECT_SIZE = ggml_tensor_overhead() - sizeof(ggml_tensor)
cdef int64_t _INT64_MAX = 0x7FFFFFFFFFFFFFFF


# --- ggml's enums, members and values from the header being built ------------------

class _TypeBase(IntEnum):
    @property
    def numpy_dtype(self):
        """The numpy dtype of one element, or None (quantized types).

        BF16 maps to ``uint16``: numpy has no bfloat16, so views show the raw bits.
        """
        return _NUMPY_DTYPE.get(self)

    @property
    def type_size(self):
        """Bytes per block (``ggml_type_size``)."""
        return ggml_type_size(<ggml_type><int>self)

    @property
    def blck_size(self):
        """Elements per block (``ggml_blck_size``)."""
        return ggml_blck_size(<ggml_type><int>self)

    @property
    def is_quantized(self):
        return bool(ggml_is_quantized(<ggml_type><int>self))

    @property
    def requires_imatrix(self):
        """Whether ggml quantizes to this type only with an importance matrix
        (``ggml_quantize_requires_imatrix``; :func:`quantize`'s ``imatrix=``)."""
        return bool(ggml_quantize_requires_imatrix(<ggml_type><int>self))

    @property
    def has_cpu_from_float(self):
        """Whether the CPU backend converts F32 rows into this type (its type traits'
        ``from_float``: what CPY, SET_ROWS and a matrix product's conversion of src1 call)."""
        return bool(pyggml_type_has_cpu_from_float(<int>self))


Type = _TypeBase("Type", _TYPE_MEMBERS, module=__name__)
Type.__doc__ = "ggml tensor types (``enum ggml_type``); values come from the compiled header."
Prec = IntEnum("Prec", _PREC_MEMBERS, module=__name__)
Op = IntEnum("Op", _OP_MEMBERS, module=__name__)
UnaryOp = IntEnum("UnaryOp", _UNARYOP_MEMBERS, module=__name__)
GluOp = IntEnum("GluOp", _GLUOP_MEMBERS, module=__name__)
OpPool = IntEnum("OpPool", _OPPOOL_MEMBERS, module=__name__)
ScaleMode = IntEnum("ScaleMode", _SCALEMODE_MEMBERS, module=__name__)
ScaleFlag = IntEnum("ScaleFlag", _SCALEFLAG_MEMBERS, module=__name__)
SortOrder = IntEnum("SortOrder", _SORTORDER_MEMBERS, module=__name__)
OpHint = IntEnum("OpHint", _OPHINT_MEMBERS, module=__name__)
OpHint.__doc__ = ("hints for a MUL_MAT node (``enum ggml_op_hint``, :func:`mul_mat_set_hint`); values come "
                  "from the compiled header (none where it lacks the enum).")
TriType = IntEnum("TriType", _TRITYPE_MEMBERS, module=__name__)
RopeType = IntEnum("RopeType", _ROPETYPE_MEMBERS, module=__name__)
RopeType.__doc__ = ("rope modes (ggml.h's ``GGML_ROPE_TYPE_*`` #defines: the ``mode`` of the rope builders); "
                    "values come from the compiled header.")

_NUMPY_DTYPE = {
    Type.F32: np.dtype(np.float32), Type.F16: np.dtype(np.float16),
    Type.F64: np.dtype(np.float64), Type.I8: np.dtype(np.int8),
    Type.I16: np.dtype(np.int16), Type.I32: np.dtype(np.int32),
    Type.I64: np.dtype(np.int64), Type.BF16: np.dtype(np.uint16),
}
# BF16 is not reachable from a numpy dtype: uint16 bits are not bfloat16 numbers.
_TYPE_OF_DTYPE = {dt: t for t, dt in _NUMPY_DTYPE.items() if t != Type.BF16}
cdef dict _NPY_TYPENUM = {int(t): dt.num for t, dt in _NUMPY_DTYPE.items()}
cdef frozenset _TYPE_VALUES = frozenset(int(t) for t in Type)


def ggml_version():
    """ggml_version() -> str: the version string of the linked ggml."""
    return c_ggml_version().decode()


def tensor_overhead():
    """tensor_overhead() -> int: the bytes a tensor takes in a context besides its data
    (``ggml_tensor_overhead``): a ``no_alloc`` context of n tensors needs n times this."""
    return ggml_tensor_overhead()


def graph_overhead(size=DEFAULT_GRAPH_SIZE, grads=False):
    """graph_overhead(size=DEFAULT_GRAPH_SIZE, grads=False) -> int: the bytes a Graph of
    ``size`` nodes takes in its context (``ggml_graph_overhead_custom``)."""
    cdef size_t n = arg_size(size, "size", "graph_overhead")
    if n == 0 or n > (1 << 30):
        raise ArgumentError(f"graph_overhead: size must be in [1, 2**30], got {n}")
    return ggml_graph_overhead_custom(n, arg_bool(grads, "grads", "graph_overhead"))


def build_info():
    """build_info() -> dict: how this pyggml was built.

    Keys: ``ggml_version``, ``ggml_commit``, ``ggml_source`` (``pypi:...`` or
    ``src:PATH`` for a vendored build, ``system:CONFIG_DIR`` for an installed
    ggml), ``mem_align``, ``native`` (None for a system ggml) and ``openmp`` (for a
    system ggml: whether an OpenMP runtime is loaded), ``llamafile`` (ggml-cpu's matrix
    products through llamafile's sgemm, ``ggml_cpu_has_llamafile``),
    ``features`` (the compile-time feature checks), ``kernels`` (see
    :func:`kernel_trust`: the ops whose CPU kernel the rules were not written against).
    """
    return {
        "ggml_version": c_ggml_version().decode(),
        "ggml_commit": ggml_commit().decode(),
        "ggml_source": PYGGML_GGML_ORIGIN.decode(),
        "mem_align": GGML_MEM_ALIGN,
        "native": _flag(PYGGML_NATIVE_FLAG),
        "openmp": _flag(PYGGML_OPENMP_FLAG, pyggml_openmp_loaded() != 0),
        "llamafile": bool(ggml_cpu_has_llamafile()),
        "features": {
            "ggml_version": bool(PYGGML_HAVE_GGML_VERSION),
            "flash_attn_back": bool(PYGGML_HAVE_FLASH_ATTN_BACK),
            "use_ref": bool(PYGGML_HAVE_USE_REF),
            "rope_imrope": bool(PYGGML_HAVE_ROPE_IMROPE),
            "rpc": bool(pyggml_rpc_built()),
        },
        "kernels": kernel_trust(),
    }


cdef object _flag(const char * value, object seen=None):
    v = value.decode().upper()
    if v == "UNKNOWN":
        return seen          # a system ggml: pyggml did not build it (None: cannot tell)
    return v in ("ON", "1", "TRUE", "YES")


# --- storage -----------------------------------------------------------------------

@cython.final
cdef class Storage:
    """Storage(size)

    Memory owned by pyggml and lent to ggml: a context's pool of ``size`` bytes,
    cache-line aligned. Numpy views of tensors use the Storage holding their data as
    ``base``, so the memory outlives the context as long as a view does."""

    def __cinit__(self, size=None):
        self.ptr = NULL
        self.buffer = NULL
        self.host = True
        if size is not None:
            n = index_arg(size, "size", "Storage")
            if not 0 <= n <= PY_SSIZE_T_MAX:
                raise ArgumentError(f"Storage: size must be in [0, {PY_SSIZE_T_MAX}], got {n}")
            self._alloc(n)

    cdef int _alloc(self, size_t size) except -1:
        if posix_memalign(&self.ptr, _POOL_ALIGN, size if size else 1) != 0:
            self.ptr = NULL
        if self.ptr == NULL:
            raise MemoryError(f"cannot allocate a {size}-byte memory pool")
        self.size = size
        return 0

    def __dealloc__(self):
        if self.owner is not None:        # the owner (a graph allocation) frees the memory
            self.ptr = NULL
            return
        if self.buffer != NULL:           # a backend buffer: ggml frees its memory
            free_backend_buffer(self.buffer)
            self.buffer = NULL
            self.ptr = NULL
            return
        if self.ptr != NULL:
            pg_asan_release(self.ptr, self.size)
        free(self.ptr)
        self.ptr = NULL

    def __repr__(self):
        what = "backend buffer" if self.owner is not None or self.buffer != NULL else "pool"
        return f"<pyggml.Storage {what} of {self.size} bytes{'' if self.host else ', device memory'}>"

    cdef bint contains(self, const void * p, size_t nbytes):
        cdef uintptr_t a = <uintptr_t>self.ptr
        cdef uintptr_t b = <uintptr_t>p
        return b >= a and b - a <= self.size and nbytes <= self.size - (b - a)


# --- backend memory: who placed a tensor, and who clears it ------------------------------

# the backend buffers pyggml holds (ggml_backend_buffer_t address -> its Allocation, alive)
cdef object _allocation_of = weakref.WeakValueDictionary()
# its dict (the weak references): len() of it is C, not WeakValueDictionary.__len__ (a
# Python method: 0.17 us of each compute). A dead entry waiting for its callback counts
# until removed, so any_allocations() can only err towards the full scan.
cdef dict _allocation_refs = _allocation_of.data
cdef uint64_t _placement_epoch = 0


cdef Allocation allocation_of(const void * buffer):
    """The live Allocation owning ``buffer``, or None (a buffer pyggml does not hold)."""
    return _allocation_of.get(<uintptr_t>buffer)


cdef bint any_allocations():
    return len(_allocation_refs) > 0


cdef uint64_t placement_epoch():
    """Grows each time an Allocation clears tensors: a graph that found all its tensors
    allocated must look again."""
    return _placement_epoch


@cython.no_gc_clear    # its dealloc clears tensors in the pools it holds: they must still be there
cdef class Allocation:
    """Backend memory pyggml obtained from ggml (the buffer of ``alloc_ctx_tensors``, a
    graph allocator's or a scheduler's buffers) and the tensors ggml placed in it.

    The one rule that keeps every tensor off freed memory: when an Allocation is released
    (a newer allocation of the same allocator replaces it, an allocation fails midway) or
    freed (nothing holds it any more), every tensor it placed that still points where it
    was placed loses its ``data`` and ``buffer`` (both NULL): a later allocation places it
    again, a compute refuses it, ``get``/``numpy`` say it has no data. It holds the pools
    of the contexts those tensors live in, so clearing never writes to freed memory.
    Subclasses (pyggml._backend) free the ggml objects after ``release()``."""

    def __dealloc__(self):
        free(self.placed)
        self.placed = NULL

    cdef int record(self, list before, object pools) except -1:
        """After ggml allocated: ``before`` holds the addresses of the tensors that had no
        buffer; those with one now were placed by this allocation (``pools``: where those
        tensors live). A view placed into another live allocation's buffer is cleared by
        that one too."""
        cdef ggml_tensor * t
        cdef Allocation other
        cdef size_t cap = self.n_placed
        cdef pyggml_placed * grown
        self.pools = list(pools)
        if self.buffers is None:
            self.buffers = set()
        for key in before:
            t = <ggml_tensor *><uintptr_t>key
            if t.buffer == NULL:
                continue
            other = _allocation_of.get(<uintptr_t>t.buffer)
            if other is not None and other is not self:
                other._adopt(t, self.pools)
            else:
                self.buffers.add(<uintptr_t>t.buffer)
            if self.n_placed == cap:
                cap = 2 * cap + 16
                grown = <pyggml_placed *>realloc(self.placed, cap * sizeof(pyggml_placed))
                if grown == NULL:
                    raise MemoryError()
                self.placed = grown
            self.placed[self.n_placed].t = t
            self.placed[self.n_placed].buffer = t.buffer
            self.n_placed += 1
        for key in self.buffers:
            _allocation_of[key] = self
        return 0

    cdef int _adopt(self, ggml_tensor * t, list pools) except -1:
        """Clear ``t`` too when released: another allocation placed a view into this one's memory."""
        cdef size_t i
        for i in range(self.n_placed):
            if self.placed[i].t == t and self.placed[i].buffer == t.buffer:
                return 0                # adopted before (a graph allocated again)
        cdef pyggml_placed * grown = <pyggml_placed *>realloc(self.placed, (self.n_placed + 1) * sizeof(pyggml_placed))
        if grown == NULL:
            raise MemoryError()
        self.placed = grown
        self.placed[self.n_placed].t = t
        self.placed[self.n_placed].buffer = t.buffer
        self.n_placed += 1
        if self.pools is None:
            self.pools = []
        for p in pools:
            if not any(q is p for q in self.pools):
                self.pools.append(p)
        return 0

    cdef Storage storage(self, const void * buffer):
        """A Storage for one of this allocation's buffers (what a context holds, and a
        numpy view's base): it keeps the allocation, and so the buffer, alive."""
        cdef uintptr_t key = <uintptr_t>buffer
        if self._storages is None:
            self._storages = {}
        ref = self._storages.get(key)
        cdef Storage st = ref() if ref is not None else None
        if st is None:
            st = Storage.__new__(Storage)
            st.owner = self
            st.buffer_key = key
            st.ptr = ggml_backend_buffer_get_base(<ggml_backend_buffer_t>buffer)
            st.size = ggml_backend_buffer_get_size(<ggml_backend_buffer_t>buffer)
            st.host = ggml_backend_buffer_is_host(<ggml_backend_buffer_t>buffer)
            self._storages[key] = weakref.ref(st)
        return st

    cdef size_t release(self, set keep=None) except? 0:
        """Clear what this allocation placed, but the tensors whose addresses are in
        ``keep`` (a graph being allocated next, which uses them where they are): those stay
        placed, with their values. Returns how many stay; with none, the allocation no
        longer serves any tensor (its buffers stay until it is freed)."""
        global _placement_epoch
        cdef size_t i, kept = 0
        cdef ggml_tensor * t
        cdef bint cleared = False
        for i in range(self.n_placed):
            t = self.placed[i].t
            if t.buffer != self.placed[i].buffer:      # placed again by another since
                continue
            if keep is not None and <uintptr_t>t in keep:
                self.placed[kept] = self.placed[i]
                kept += 1
            else:
                t.data = NULL
                t.buffer = NULL
                cleared = True
        if cleared:
            _placement_epoch += 1
        self.n_placed = kept
        return kept


include "_core_args.pxi"
include "_core_context.pxi"
include "_core_tensor.pxi"
include "_core_ops.pxi"
include "_core_errors.pxi"
include "_core_quant.pxi"
include "_core_remote.pxi"
