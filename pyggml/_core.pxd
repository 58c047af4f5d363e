# cython: language_level=3
# The cdef classes and C-level helpers of pyggml._core, for the other Cython modules
# (the generated op modules, _graph, _cpu, _fab) to cimport.

from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t, uintptr_t

from pyggml._ggml cimport ggml_context, ggml_tensor, ggml_type
from pyggml._rt cimport pyggml_guard, pyggml_remote_fn, pyggml_status


cdef class Storage:
    """Memory that tensors point into: a context's host pool, or a backend buffer
    (``buffer``: freed with it). Numpy views of tensors use the Storage that holds their
    data as ``base``."""
    cdef void * ptr
    cdef readonly size_t size
    cdef void * buffer          # ggml_backend_buffer_t this Storage owns, or NULL
    cdef readonly bint host     # the CPU can read ptr (a pool, or a host buffer)
    cdef object owner           # not None: the memory is owner's (an Allocation), freed with it
    cdef size_t buffer_key      # the backend buffer an owner's Storage lies in (its address), or 0
    cdef object __weakref__
    cdef bint contains(self, const void * p, size_t nbytes)
    cdef int _alloc(self, size_t size) except -1


cdef struct pyggml_placed:
    ggml_tensor * t         # a tensor an Allocation placed ...
    void * buffer           # ... in this buffer: cleared only while it still points there


cdef class Allocation:
    """Backend memory pyggml got from ggml and the tensors ggml placed in it (_core.pyx)."""
    cdef pyggml_placed * placed
    cdef size_t n_placed
    cdef set buffers            # addresses of the ggml_backend_buffer_t it owns
    cdef list pools             # the pools of the contexts its tensors live in
    cdef dict _storages         # buffer address -> weak reference to its Storage
    cdef object __weakref__
    cdef int record(self, list before, object pools) except -1
    cdef int _adopt(self, ggml_tensor * t, list pools) except -1
    cdef Storage storage(self, const void * buffer)
    cdef size_t release(self, set keep=*) except? 0


cdef Allocation allocation_of(const void * buffer)
cdef bint any_allocations()
cdef uint64_t placement_epoch()


cdef class Context:
    cdef ggml_context * ptr
    cdef Storage pool
    cdef readonly size_t mem_size
    cdef readonly bint no_alloc
    cdef uintptr_t _base    # the pool's address, kept after close() to identify tensors
    cdef size_t _asan_end   # ASan builds: the end of the pool's addressable bytes
    cdef object _deps       # other contexts whose tensors tensors of this one reference
    cdef object _dep_pools  # their storages, kept alive while this context is open
    cdef list _borrowed     # numpy arrays whose memory tensors of this context use
    cdef object __weakref__

    cdef int _reserve(self, uint64_t nbytes, str what) except -1
    cdef Tensor _adopt(self, ggml_tensor * p, tuple srcs)
    cdef int _depend_on(self, Context other) except -1
    cdef int _add_storage(self, Storage s) except -1
    cdef int _drop_storage(self, Storage s) except -1
    cdef readonly int _n_buffers  # backend storages added: their graphs' memory is checked at compute
    cdef Storage _storage_of(self, const void * data, size_t nbytes)
    cdef bint _holds(self, const void * p)
    cdef Context _owner_of(self, const void * p)


cdef class Tensor:
    cdef ggml_tensor * ptr
    cdef readonly Context ctx
    cdef int _check(self) except -1
    cdef object _view(self, int nd)
    cdef object _raw_view(self)
    cdef object _related(self, ggml_tensor * p)
    cdef Storage _whole(self, str what)
    cdef Storage _data_storage(self, size_t span)
    cdef tuple _layout(self)
    cdef object _exported(self, str what)


# --- shared helpers --------------------------------------------------------------------
cdef Tensor wrap(Context ctx, ggml_tensor * p)
cdef Tensor wrap_rank(Context ctx, ggml_tensor * p, int rank)
cdef int need_open(Context ctx, str arg=*) except -1

# arguments of the generated op wrappers: check and convert, or raise naming the argument
cdef object arg_instance(object v, type cls, str arg, str op)
cdef Context arg_context(object ctx, str op)
cdef Tensor arg_tensor(object t, str arg, str op)
cdef Tensor arg_tensor_or_none(object t, str arg, str op)
cdef int32_t arg_int32(object v, str arg, str op) except? -1
cdef int64_t arg_int64(object v, str arg, str op) except? -1
cdef uint32_t arg_uint32(object v, str arg, str op) except? 0xFFFFFFFF
cdef size_t arg_size(object v, str arg, str op) except? 0xFFFFFFFFFFFFFFFF
cdef size_t arg_size_i32(object v, str arg, str op) except? 0xFFFFFFFFFFFFFFFF
cdef int64_t arg_int64_i32(object v, str arg, str op) except? -1
cdef float arg_float(object v, str arg, str op) except? -1.0
cdef int arg_bool(object v, str arg, str op) except -1
cdef int arg_enum(object v, object enum_class, str arg, str op) except? -1
cdef int arg_int32_array(object v, int * out, int n, str arg, str op) except -1
cdef int arg_int64_array(object v, int64_t * out, int n, str arg, str op) except -1
cdef ggml_type arg_type(object typ, str arg=*) except? <ggml_type>-1

# the two-step op call: the builder runs first in a scratch context (where an abort, a
# kernel refusal or a too-small context are found), then for real in ctx
cdef ggml_context * op_scratch(Context ctx) except NULL
cdef int op_check(Context ctx, ggml_tensor * r, pyggml_guard * g, str op) except -1
cdef int op_fail(Context ctx, ggml_tensor * r, pyggml_guard * g, str op, tuple names, tuple tensors) except -1
cdef int op_lost(pyggml_guard * g, str op) except -1
cdef object version_error(str op, str reason)
cdef int raise_aborted(pyggml_guard * g, str where, str detail) except -1
cdef str guard_logged(const pyggml_guard * g)
cdef int raise_status(pyggml_status * st, str where, str detail=*, tuple names=*, tuple tensors=*) except -1
cdef int deprecated(str op) except -1
cdef int check_node(const ggml_tensor * node, str where) except -1
cdef int check_node_named(const ggml_tensor * node, str where, tuple names, tuple tensors) except -1
cdef str describe(const ggml_tensor * t)
cdef object index_arg(object v, str arg, str op)
cdef str short_message(str msg)
cdef uint64_t tensor_bytes(const ggml_tensor * t, bint no_alloc) except? 0


# calls that may reach an RPC server (_core_remote.pxi)
cdef class Remote:
    cdef readonly str endpoint
    cdef public double timeout
    cdef readonly object dead
    cdef public int devices     # the server's device count, from the handshake (0: not asked yet)
    cdef int need_alive(self, str what) except -1
    cdef bint accepts(self)

cdef Remote remote_for(str endpoint)
cdef Remote remote_of_buffer(const void * buffer)
cdef void * remote_call(Remote r, pyggml_remote_fn fn, void * arg, size_t size, void * owned, object keep,
                        str what, bint quiet=*) except? NULL
cdef void free_backend_buffer(void * buffer) noexcept
cdef int raise_remote_aborted(Remote r, pyggml_guard * g, str where) except -1
