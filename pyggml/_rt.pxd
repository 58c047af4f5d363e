# cython: language_level=3
# Raw C declarations of pyggml's own C runtime (csrc/pyggml_rt.h, libpyggml_rt).
from libc.stdint cimport int64_t, uint8_t, uint32_t
from pyggml._ggml cimport ggml_cgraph, ggml_context, ggml_cplan, ggml_status, ggml_tensor, ggml_threadpool

cdef extern from "pyggml_rt.h" nogil:
    enum:
        PYGGML_MSG_CAP

    ctypedef struct pyggml_guard:
        int signal               # 0, or the signal the guarded call died of
        char message[1]          # really PYGGML_MSG_CAP bytes, NUL-terminated
    void pyggml_guard_logged(const pyggml_guard * g, char * out, size_t cap)

    # the outcome of every checked entry point (status.c); mapped to exceptions in one
    # place: _core's raise_status
    enum:
        PYGGML_OK
        PYGGML_REFUSED
        PYGGML_UNCHECKED
        PYGGML_REFUSED_TYPE
        PYGGML_DEFECT
        PYGGML_BAD_INDEX
        PYGGML_NO_SEGMENTS
        PYGGML_ABORTED
        PYGGML_CRASHED
        PYGGML_PROOF_SIGNAL
        PYGGML_PROOF_EXIT
        PYGGML_PROOF_TIMEOUT
        PYGGML_SYSTEM
        PYGGML_COMPUTE_FAILED
        PYGGML_OUT_OF_MEMORY
        PYGGML_CXX_EXCEPTION
        PYGGML_LACKS
        PYGGML_NO_BACKWARD
        PYGGML_BAD_FILE
        PYGGML_CODE_COUNT
    ctypedef struct pyggml_status:
        int code
        int how
        const char * defect
        const ggml_tensor * node
        char msg[1]              # really PYGGML_MSG_CAP bytes, NUL-terminated
    int pyggml_status_clear(pyggml_status * st)
    int pyggml_status_from_ggml(pyggml_status * st, int ggml_status)
    int pyggml_status_from_cxx(pyggml_status * st, int exception)
    int pyggml_status_from_guard(pyggml_status * st, const pyggml_guard * g)

    const double PYGGML_PROOF_TIMEOUT_S

    void pyggml_guard_install()

    void pyggml_checks_init()
    int pyggml_check_node(const ggml_tensor * node, pyggml_status * st)
    int pyggml_op_is_checked(int op, int sub_op)
    int pyggml_kernels_known()
    int pyggml_kernel_untrusted(int op)
    int pyggml_kernel_reviewed(int op)
    int pyggml_kernel_set_untrusted(int op, int flag)
    int pyggml_kernel_set_reviewed(int op, int release)
    int pyggml_kernel_release(int op)
    int pyggml_kernels_pinned_release()
    int pyggml_rule_entry(int i, const char ** family, const char ** name)
    void pyggml_flash_attn_back_offsets(const ggml_tensor * q, const ggml_tensor * k, const ggml_tensor * v,
                                        size_t * offs)
    ggml_tensor * pyggml_flash_attn_back_padded(ggml_context * ctx, ggml_tensor * q, ggml_tensor * k,
                                                ggml_tensor * v, ggml_tensor * d, bint masked, int64_t extra)
    size_t pyggml_fab_work_bytes(int64_t D, int64_t M, int n_threads)
    size_t pyggml_graph_fab_work_bytes(ggml_cgraph * graph, int n_threads)
    int pyggml_checks_set_enabled(int enabled)
    int pyggml_checks_enabled()
    void pyggml_set_fab_batch_gqa_fixed(int fixed)
    int pyggml_check_backward(ggml_cgraph * graph, pyggml_status * st)
    int pyggml_backward_sources(const char * op, const char * sub)
    ggml_tensor * pyggml_index_tensor(const ggml_tensor * node)
    int64_t pyggml_thread_heads(const ggml_tensor * node)
    int pyggml_check_indices(const ggml_tensor * node, pyggml_status * st)
    int pyggml_check_ready_indices(ggml_cgraph * graph, pyggml_status * st)
    int pyggml_compute_checked(ggml_cgraph * graph, ggml_cplan * plan, pyggml_status * st)
    ctypedef ggml_status (*pyggml_compute_fn)(ggml_cgraph * graph, void * arg) noexcept nogil
    int pyggml_compute_checked_with(ggml_cgraph * graph, pyggml_compute_fn compute, void * arg, pyggml_status * st)

    int pyggml_try_build_forward_expand(pyggml_guard * g, ggml_cgraph * graph, ggml_tensor * tensor,
                                        size_t stack_bytes)
    int pyggml_try_build_backward_expand(pyggml_guard * g, ggml_context * ctx, ggml_cgraph * graph,
                                         size_t stack_bytes)
    int pyggml_try_graph_plan(pyggml_guard * g, const ggml_cgraph * graph, int n_threads,
                              ggml_threadpool * threadpool, ggml_cplan * plan)

    void pyggml_set_fork_hooks(int (*before)() noexcept nogil, void (*after)(int) noexcept nogil)
    int pyggml_prove_graph(ggml_cgraph * graph, size_t min_work, double timeout_s, const int * abort,
                           pyggml_status * st)
    int pyggml_guarded_compute_here(ggml_cgraph * graph, size_t min_work, double timeout_s,
                                    pyggml_status * st) nogil
    uint8_t * pyggml_graph_signature(ggml_cgraph * graph, size_t * len)
    int pyggml_try_quantize(pyggml_guard * g, int type, const float * src, void * dst, int64_t nrows,
                            int64_t n_per_row, const float * imatrix) nogil
    int pyggml_type_has_cpu_from_float(int type)

    ctypedef struct pyggml_async:
        ggml_cgraph * graph
        ggml_cplan * plan
        ggml_status (*compute)(ggml_cgraph * graph, void * arg) noexcept nogil
        void * compute_arg
        void (*task)(void * arg, const int * abort) noexcept nogil
        void * task_arg
        int checked
        pyggml_status result
        void (*on_done)(void *, int) noexcept nogil
        void * on_done_arg
        int done
    int pyggml_async_start(pyggml_async * a)
    int pyggml_async_wait(pyggml_async * a, int timeout_ms)
    void pyggml_async_abort(pyggml_async * a)
    int pyggml_async_handoff(pyggml_async * a)
    int pyggml_async_drain(int timeout_ms)
    bint pyggml_async_aborted(void * data) noexcept nogil
    int pyggml_openmp_loaded()

    # ggml's RPC backend and the jobs that may reach a server (csrc/remote.c)
    int pyggml_rpc_built()
    int pyggml_rpc_protocol(int * major, int * minor, int * patch)
    void * pyggml_rpc_init(const char * endpoint, uint32_t device)        # a ggml_backend_t
    int pyggml_rpc_serve(const char * endpoint, const char * cache_dir, size_t n_threads, size_t n_devices,
                         void ** devices)
    void pyggml_remote_set_thread_probe(int (*probe)() noexcept nogil)
    unsigned pyggml_remote_faults(char * message, size_t cap)
    ctypedef void (*pyggml_remote_fn)(void * arg) noexcept nogil
    ctypedef struct pyggml_remote_job:
        pass
    pyggml_remote_job * pyggml_remote_start(pyggml_remote_fn fn, const void * arg, size_t size, void * owned,
                                            int * err)
    int pyggml_remote_wait(pyggml_remote_job * job, int timeout_ms)
    void pyggml_remote_finish(pyggml_remote_job * job, void * arg_out)
    void pyggml_remote_abandon(pyggml_remote_job * job)


# the blocked attention backward (csrc/attn_blocked.h) and its graph node (csrc/attn_node.c)
cdef extern from "attn_blocked.h" nogil:
    ctypedef struct pyggml_attn_bwd:
        int64_t D, N, M, H, KVH, B
        float scale
        int masked
        int grouping
        const float * q
        const float * k
        const float * v
        const float * d
        const float * lse
        const float * o
        float * dq
        float * dk
        float * dv
        const int * cancel
    int pyggml_attn_bwd_compute(const pyggml_attn_bwd * a, int n_threads)
    int pyggml_attn_bwd_set_isa(int force)
    int pyggml_attn_bwd_set_panels(int on)
    int pyggml_attn_bwd_set_start_elsewhere(int on)
    double pyggml_attn_fma_flops(int isa, long iters)
    double pyggml_attn_tile_flops(int D, long iters)

cdef extern from "pyggml_rt.h" nogil:
    void pyggml_attn_bwd_offsets(const ggml_tensor * q, const ggml_tensor * k, int64_t * offs)
    void pyggml_attn_bwd_probe(ggml_tensor * probe, ggml_tensor ** srcs, int n_srcs, float scale, int masked,
                               int grouping)
    ggml_tensor * pyggml_attn_bwd_node(ggml_context * ctx, ggml_tensor ** srcs, int n_srcs, float scale, int masked,
                                       int grouping)
    int pyggml_attn_bwd_node_count(ggml_tensor ** srcs, int n_srcs)
