# cython: language_level=3
"""pyggml._gguf: GGUF files read by ggml's own reader (gguf.h), their tensors zero-copy.

``read(path)`` runs ``gguf_init_from_file`` (no_alloc: the header, the metadata and the
tensor descriptions, no data) through pyggml's C runtime (``csrc/gguf_io.c``: under the
abort guard, C++ exceptions caught, ggml's log captured for the error message), checks
that every tensor's data lies inside the file, maps the file into memory and places the
tensors of a ``no_alloc`` :class:`~pyggml.Context` on the mapping through a ggml CPU
buffer (``ggml_backend_cpu_buffer_from_ptr``): no weight is copied. The mapping is an
:class:`~pyggml._core.Allocation` like every backend buffer: the context holds it while it
is open, numpy views of its tensors hold it after, and when it goes the tensors it placed
lose their data (docs/ownership.md). The mapping is private: writing to a tensor changes
this process's copy of the page, never the file. The Pythonic object is
:class:`pyggml.gguf.GGUFFile`.
"""

cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdlib cimport free, malloc
from libc.errno cimport errno
from libc.stdint cimport int64_t, uint64_t, uintptr_t
from posix.mman cimport MAP_FAILED, MAP_PRIVATE, PROT_READ, PROT_WRITE, mmap, munmap

from pyggml._ggml cimport *
from pyggml._ggml_backend cimport ggml_backend_buffer_free, ggml_backend_buffer_t, ggml_backend_cpu_buffer_from_ptr
from pyggml._ggml_gguf cimport *
from pyggml._rt cimport *
from pyggml._core cimport Allocation, Context, Tensor, raise_status

import os

import numpy as np

from pyggml.errors import ArgumentError, GGUFError, InternalError

__all__ = ["TYPES", "read", "write"]

# GGUF's value types by name (gguf.h's enum gguf_type): what GGUFFile.types says of each key
TYPES = {"uint8": GGUF_TYPE_UINT8, "int8": GGUF_TYPE_INT8, "uint16": GGUF_TYPE_UINT16, "int16": GGUF_TYPE_INT16,
         "uint32": GGUF_TYPE_UINT32, "int32": GGUF_TYPE_INT32, "float32": GGUF_TYPE_FLOAT32, "bool": GGUF_TYPE_BOOL,
         "string": GGUF_TYPE_STRING, "array": GGUF_TYPE_ARRAY, "uint64": GGUF_TYPE_UINT64, "int64": GGUF_TYPE_INT64,
         "float64": GGUF_TYPE_FLOAT64}
_TYPE_NAMES = {v: k for k, v in TYPES.items()}


@cython.final
@cython.no_gc_clear
cdef class _Mapping(Allocation):
    """A GGUF file mapped into memory (MAP_PRIVATE) and the ggml CPU buffer over it."""
    cdef void * base
    cdef size_t size
    cdef ggml_backend_buffer_t buf

    def __dealloc__(self):
        self.release()              # the tensors it placed lose their data first
        if self.buf != NULL:
            ggml_backend_buffer_free(self.buf)      # a buffer from a pointer frees no memory
            self.buf = NULL
        if self.base != NULL:
            munmap(self.base, self.size)
            self.base = NULL


# gguf_type -> numpy dtype of an array's elements (GGUF is little-endian)
_DTYPES = {
    GGUF_TYPE_UINT8: np.dtype("<u1"), GGUF_TYPE_INT8: np.dtype("<i1"),
    GGUF_TYPE_UINT16: np.dtype("<u2"), GGUF_TYPE_INT16: np.dtype("<i2"),
    GGUF_TYPE_UINT32: np.dtype("<u4"), GGUF_TYPE_INT32: np.dtype("<i4"),
    GGUF_TYPE_UINT64: np.dtype("<u8"), GGUF_TYPE_INT64: np.dtype("<i8"),
    GGUF_TYPE_FLOAT32: np.dtype("<f4"), GGUF_TYPE_FLOAT64: np.dtype("<f8"),
    GGUF_TYPE_BOOL: np.dtype("bool"),
}


cdef object _text(const char * s):
    """A GGUF string: str when it is UTF-8 (as the format says), else its bytes."""
    cdef bytes b = s
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return b


cdef object _value(gguf_context * g, int64_t i):
    """The value of key ``i``: a Python scalar, a str, a list of str, or a numpy array."""
    cdef gguf_type t = gguf_get_kv_type(g, i)
    cdef gguf_type at
    cdef size_t n, j
    cdef const void * data
    if t == GGUF_TYPE_ARRAY:
        at = gguf_get_arr_type(g, i)
        n = gguf_get_arr_n(g, i)
        if at == GGUF_TYPE_STRING:
            return [_text(gguf_get_arr_str(g, i, j)) for j in range(n)]
        dtype = _DTYPES.get(at)
        if dtype is None:
            raise InternalError(f"gguf: key {_text(gguf_get_key(g, i))!r} is an array of GGUF type {at}, which "
                                f"ggml's reader should have refused (please report)")
        data = gguf_get_arr_data(g, i)
        raw = PyBytes_FromStringAndSize(<const char *>data, <Py_ssize_t>(n * dtype.itemsize)) if n else b""
        return np.frombuffer(raw, dtype).copy()
    if t == GGUF_TYPE_STRING:
        return _text(gguf_get_val_str(g, i))
    if t == GGUF_TYPE_UINT8:
        return gguf_get_val_u8(g, i)
    if t == GGUF_TYPE_INT8:
        return gguf_get_val_i8(g, i)
    if t == GGUF_TYPE_UINT16:
        return gguf_get_val_u16(g, i)
    if t == GGUF_TYPE_INT16:
        return gguf_get_val_i16(g, i)
    if t == GGUF_TYPE_UINT32:
        return gguf_get_val_u32(g, i)
    if t == GGUF_TYPE_INT32:
        return gguf_get_val_i32(g, i)
    if t == GGUF_TYPE_UINT64:
        return gguf_get_val_u64(g, i)
    if t == GGUF_TYPE_INT64:
        return gguf_get_val_i64(g, i)
    if t == GGUF_TYPE_FLOAT32:
        return gguf_get_val_f32(g, i)
    if t == GGUF_TYPE_FLOAT64:
        return gguf_get_val_f64(g, i)
    if t == GGUF_TYPE_BOOL:
        return bool(gguf_get_val_bool(g, i))
    raise InternalError(f"gguf: key {_text(gguf_get_key(g, i))!r} has GGUF type {t}, which ggml's reader should "
                        f"have refused (please report)")


cdef str _type_of(gguf_context * g, int64_t i):
    """A key's GGUF type by name: "uint32", ..., "array[float32]"."""
    cdef gguf_type t = gguf_get_kv_type(g, i)
    if t == GGUF_TYPE_ARRAY:
        return f"array[{_TYPE_NAMES.get(gguf_get_arr_type(g, i), '?')}]"
    return _TYPE_NAMES.get(t, "?")


cdef tuple _describe(gguf_context * g, ggml_context * meta, str where):
    """(version, alignment, data_offset, metadata, types, [(name, type, ne, offset, nbytes)])."""
    cdef int64_t i, n_kv = gguf_get_n_kv(g), n_t = gguf_get_n_tensors(g)
    cdef ggml_tensor * t
    cdef const char * name
    metadata = {}
    types = {}
    for i in range(n_kv):
        key = _text(gguf_get_key(g, i))
        metadata[key] = _value(g, i)
        types[key] = _type_of(g, i)
    tensors = []
    for i in range(n_t):
        name = gguf_get_tensor_name(g, i)
        t = ggml_get_tensor(meta, name)
        if t == NULL:
            raise InternalError(f"{where}: ggml's reader lists tensor {_text(name)!r} but made no description "
                                f"of it (please report)")
        rank = ggml_n_dims(t)
        if not isinstance(_text(name), str):
            raise GGUFError(f"{where}: tensor {_text(name)!r}'s name is not UTF-8, as GGUF's strings must be")
        tensors.append((_text(name), <int>gguf_get_tensor_type(g, i), tuple(t.ne[k] for k in range(rank)),
                        gguf_get_tensor_offset(g, i), ggml_nbytes(t)))
    return gguf_get_version(g), gguf_get_alignment(g), gguf_get_data_offset(g), metadata, types, tensors


def read(path):
    """read(path) -> (version, alignment, data_offset, metadata, types, ctx, tensors, file_size)

    ``tensors``: {name: Tensor} in the file's order, zero-copy over a private mapping of
    the file, in ``ctx`` (a no_alloc Context). Raises GGUFError for a file ggml's reader
    refuses or whose tensor data lies past its end, GGMLAbort if the reader would abort,
    OSError when the file cannot be opened or mapped."""
    fspath = os.fspath(path)
    where = f"gguf.load({fspath!r})"
    cdef bytes cpath = os.fsencode(fspath)
    cdef int fd = os.open(cpath, os.O_RDONLY)       # OSError (FileNotFoundError, ...) as open() raises
    cdef gguf_context * g = NULL
    cdef ggml_context * meta = NULL
    cdef pyggml_status st
    cdef const char * c = cpath
    try:
        file_size = os.fstat(fd).st_size
        with nogil:
            pyggml_gguf_open(c, &g, &meta, &st)
        raise_status(&st, where)
        try:
            version, alignment, data_offset, metadata, types, infos = _describe(g, meta, where)
        finally:
            gguf_free(g)
            ggml_free(meta)
        for name, typ, ne, offset, nbytes in infos:
            end = data_offset + offset + nbytes
            if end > file_size:
                raise GGUFError(f"{where}: tensor {name!r} ({nbytes} bytes at offset {data_offset + offset}) ends "
                                f"at byte {end}, past the end of the file ({file_size} bytes): the file is "
                                f"truncated or its offsets are wrong")
        ctx = Context((len(infos) + 1) * ggml_tensor_overhead(), no_alloc=True)
        tensors = {}
        if infos:
            tensors = _place(fd, file_size, data_offset, infos, ctx)
        return version, alignment, data_offset, metadata, types, ctx, tensors, file_size
    finally:
        os.close(fd)


cdef dict _place(int fd, size_t file_size, size_t data_offset, list infos, Context ctx):
    """Map the file and place the tensors of ``infos`` on it, in ``ctx``."""
    cdef _Mapping m = _Mapping.__new__(_Mapping)
    cdef void * base
    cdef Tensor t
    cdef size_t at
    with nogil:
        base = mmap(NULL, file_size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0)
    if base == MAP_FAILED:
        raise OSError(errno, f"gguf.load: cannot map the file ({file_size} bytes) into memory: {os.strerror(errno)}")
    m.base = base
    m.size = file_size
    m.buf = ggml_backend_cpu_buffer_from_ptr(base, file_size)
    if m.buf == NULL:
        raise MemoryError("gguf.load: ggml could not make a CPU buffer over the mapping")
    tensors = {}
    before = []
    for name, typ, ne, offset, nbytes in infos:
        t = ctx.new_tensor(typ, ne)
        t.name = name
        at = data_offset + offset
        t.ptr.data = <char *>base + at
        t.ptr.buffer = m.buf
        before.append(<uintptr_t>t.ptr)
        tensors[name] = t
    m.record(before, (ctx.pool,))
    ctx._add_storage(m.storage(m.buf))
    return tensors


def write(path, list kvs, list tensors):
    """write(path, kvs, tensors): a GGUF file through ggml's writer. ``kvs``: [(key, type,
    arr_type, value)] checked by pyggml.gguf.save (a scalar's value as its little-endian
    bytes, a string's and each array string's UTF-8 bytes without NUL, a numeric array's
    bytes); ``tensors``: Tensors, named, contiguous, with data."""
    fspath = os.fspath(path)
    where = f"gguf.save({fspath!r})"
    cdef bytes cpath = os.fsencode(fspath)
    cdef Py_ssize_t n_kv = len(kvs), n_t = len(tensors), i, j
    cdef pyggml_gguf_kv * ckv = <pyggml_gguf_kv *>malloc(max(n_kv, 1) * sizeof(pyggml_gguf_kv))
    cdef ggml_tensor ** ct = <ggml_tensor **>malloc(max(n_t, 1) * sizeof(ggml_tensor *))
    cdef const char ** strs
    cdef list keep = []             # the bytes the C arrays point into
    cdef list arrays = []           # the string pointer arrays
    cdef pyggml_status st
    cdef Tensor t
    cdef const char * c = cpath
    if ckv == NULL or ct == NULL:
        free(ckv)
        free(ct)
        raise MemoryError()
    try:
        for i, (key, typ, arr_type, value) in enumerate(kvs):
            k = key.encode("utf-8")
            keep.append(k)
            ckv[i].key = PyBytes_AS_STRING(k)
            ckv[i].type = typ
            ckv[i].arr_type = arr_type
            ckv[i].data = NULL
            ckv[i].strs = NULL
            ckv[i].n = 0
            if typ == GGUF_TYPE_ARRAY and arr_type == GGUF_TYPE_STRING:
                strs = <const char **>malloc(max(len(value), 1) * sizeof(char *))
                if strs == NULL:
                    raise MemoryError()
                arrays.append(<uintptr_t>strs)
                for j, v in enumerate(value):
                    keep.append(v)
                    strs[j] = PyBytes_AS_STRING(v)
                ckv[i].strs = strs
                ckv[i].n = len(value)
            else:
                keep.append(value)
                ckv[i].data = PyBytes_AS_STRING(value)
                if typ == GGUF_TYPE_ARRAY:
                    ckv[i].n = len(value) // _DTYPES[arr_type].itemsize
        for i in range(n_t):
            t = tensors[i]
            t._check()                      # its context open
            if t.ptr.data == NULL:
                raise ArgumentError(f"{where}: tensor {t.name!r} has no data (allocate it first)")
            if not ggml_is_contiguous(t.ptr):
                raise ArgumentError(f"{where}: tensor {t.name!r} is not contiguous (ggml writes a tensor's "
                                    f"bytes as they lie; pyggml.cont() makes a contiguous copy)")
            ct[i] = t.ptr
        with nogil:
            pyggml_gguf_write(ckv, n_kv, ct, n_t, c, &st)
        raise_status(&st, where)
    finally:
        for a in arrays:
            free(<void *><uintptr_t>a)
        free(ckv)
        free(ct)

