# cython: language_level=3
# Raw C declarations of ggml-backend.h, ggml-alloc.h and the CPU backend's part of
# ggml-cpu.h: the parts pyggml uses. Nothing here has behaviour.

from libc.stdint cimport int64_t

from pyggml._ggml cimport ggml_abort_callback, ggml_cgraph, ggml_context, ggml_status, ggml_tensor
from pyggml._rt cimport pyggml_guard


cdef extern from "_compat.h" nogil:
    ctypedef struct ggml_backend:
        pass
    ctypedef ggml_backend * ggml_backend_t
    ctypedef struct ggml_backend_device:
        pass
    ctypedef ggml_backend_device * ggml_backend_dev_t
    ctypedef struct ggml_backend_buffer:
        pass
    ctypedef ggml_backend_buffer * ggml_backend_buffer_t

    enum ggml_backend_dev_type:
        GGML_BACKEND_DEVICE_TYPE_CPU
        GGML_BACKEND_DEVICE_TYPE_GPU
        GGML_BACKEND_DEVICE_TYPE_ACCEL

    # the device registry
    size_t ggml_backend_dev_count()
    ggml_backend_dev_t ggml_backend_dev_get(size_t index)
    ggml_backend_dev_t ggml_backend_dev_by_name(const char * name)
    const char * ggml_backend_dev_name(ggml_backend_dev_t device)
    const char * ggml_backend_dev_description(ggml_backend_dev_t device)
    int ggml_backend_dev_type_of "ggml_backend_dev_type"(ggml_backend_dev_t device)   # renamed: the enum has this name
    void ggml_backend_dev_memory(ggml_backend_dev_t device, size_t * free, size_t * total)
    ggml_backend_t ggml_backend_dev_init(ggml_backend_dev_t device, const char * params)

    # a backend
    const char * ggml_backend_name(ggml_backend_t backend)
    void ggml_backend_free(ggml_backend_t backend)
    ggml_backend_dev_t ggml_backend_get_device(ggml_backend_t backend)
    ggml_status ggml_backend_graph_compute(ggml_backend_t backend, ggml_cgraph * cgraph)
    bint ggml_backend_supports_op(ggml_backend_t backend, const ggml_tensor * op)

    # buffers
    void ggml_backend_buffer_free(ggml_backend_buffer_t buffer)
    ggml_backend_buffer_t ggml_backend_cpu_buffer_from_ptr(void * ptr, size_t size)
    void * ggml_backend_buffer_get_base(ggml_backend_buffer_t buffer)
    size_t ggml_backend_buffer_get_size(ggml_backend_buffer_t buffer)
    bint ggml_backend_buffer_is_host(ggml_backend_buffer_t buffer)
    enum:
        GGML_BACKEND_BUFFER_USAGE_WEIGHTS
    void ggml_backend_buffer_set_usage(ggml_backend_buffer_t buffer, int usage)
    void ggml_backend_tensor_set(ggml_tensor * tensor, const void * data, size_t offset, size_t size)
    void ggml_backend_tensor_get(const ggml_tensor * tensor, void * data, size_t offset, size_t size)

    # ggml-alloc.h
    ggml_backend_buffer * ggml_backend_alloc_ctx_tensors(ggml_context * ctx, ggml_backend_t backend)
    ctypedef struct ggml_backend_buffer_type:
        pass
    ctypedef ggml_backend_buffer_type * ggml_backend_buffer_type_t
    ctypedef struct ggml_gallocr:
        pass
    ctypedef ggml_gallocr * ggml_gallocr_t
    ggml_backend_buffer_type_t ggml_backend_get_default_buffer_type(ggml_backend_t backend)
    ggml_gallocr_t ggml_gallocr_new(ggml_backend_buffer_type_t buft)
    void ggml_gallocr_free(ggml_gallocr_t galloc)

    # the scheduler
    ctypedef struct ggml_backend_sched:
        pass
    ctypedef ggml_backend_sched * ggml_backend_sched_t
    ggml_backend_sched_t ggml_backend_sched_new(ggml_backend_t * backends, ggml_backend_buffer_type_t * bufts,
                                                int n_backends, size_t graph_size, bint parallel, bint op_offload)
    void ggml_backend_sched_free(ggml_backend_sched_t sched)
    ggml_status ggml_backend_sched_graph_compute(ggml_backend_sched_t sched, ggml_cgraph * graph)
    int ggml_backend_sched_get_n_splits(ggml_backend_sched_t sched)
    ggml_backend_t ggml_backend_sched_get_tensor_backend(ggml_backend_sched_t sched, ggml_tensor * node)
    bint ggml_backend_buft_is_host(ggml_backend_buffer_type_t buft)
    const char * ggml_backend_buft_name(ggml_backend_buffer_type_t buft)
    ggml_backend_buffer_type_t ggml_backend_buffer_get_type(ggml_backend_buffer_t buffer)

cdef extern from "pyggml_rt.h" nogil:
    int pyggml_try_gallocr_alloc_graph(pyggml_guard * g, ggml_gallocr * galloc, ggml_cgraph * graph, int * ok)
    int pyggml_try_sched_alloc_graph(pyggml_guard * g, ggml_backend_sched * sched, ggml_cgraph * graph, int * ok)
    int pyggml_backend_set_n_threads(ggml_backend * backend, int n_threads)
    ctypedef struct pyggml_node_cmp:
        int index
        int compared
        double nmse
        double max_abs
        int64_t n
    ctypedef struct pyggml_graph_cmp:
        pyggml_node_cmp * rows
        int n_rows
        double tolerance
        int stop_at_first
        int first_diverging
        int failed
    int pyggml_compare_graph(ggml_backend * b1, ggml_backend * b2, ggml_cgraph * graph, pyggml_graph_cmp * state)

    # no C++ exception crosses into Python (csrc/nothrow.cpp)
    enum:
        PYGGML_CXX_NONE
        PYGGML_CXX_BAD_ALLOC
        PYGGML_CXX_OTHER
        PYGGML_STATUS_CXX_BAD_ALLOC
        PYGGML_STATUS_CXX_OTHER
    int pyggml_cxx_last_exception()
    ggml_status pyggml_backend_compute_nothrow(ggml_cgraph * graph, void * backend) noexcept
    ggml_status pyggml_sched_compute_nothrow(ggml_cgraph * graph, void * sched) noexcept
    ggml_backend_sched_t pyggml_sched_new_nothrow(ggml_backend_t * backends, int n_backends, size_t graph_size)

    # the CPU backend
    ggml_backend_t ggml_backend_cpu_init()
    bint ggml_backend_is_cpu(ggml_backend_t backend)
    void ggml_backend_cpu_set_n_threads(ggml_backend_t backend_cpu, int n_threads)
    void ggml_backend_cpu_set_abort_callback(ggml_backend_t backend_cpu, ggml_abort_callback abort_callback,
                                             void * abort_callback_data)
    int pyggml_backend_cpu_set_use_ref(ggml_backend_t backend_cpu, int on)
