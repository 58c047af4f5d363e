# cython: language_level=3
# Raw C declarations of the parts of ggml that pyggml uses: ggml.h and ggml-cpu.h.
# Nothing here has behaviour; values of enums and macros come from the headers
# the extension is compiled against (never typed in), so the same .pxd builds
# against any ggml release that has these names.

from libc.stdint cimport int32_t, int64_t, uint8_t

# C's bool, for function-pointer types whose C signature has one (a bint there is an int:
# a callback declared with it would not have the type the caller calls it through)
cdef extern from "<stdbool.h>":
    ctypedef bint c_bool "bool"


cdef extern from "_compat.h" nogil:
    # _compat.h includes ggml.h and ggml-cpu.h and fills in what an older or newer
    # ggml lacks (PYGGML_HAVE_* from CMake's feature checks)
    enum:
        PYGGML_HAVE_GGML_VERSION
        PYGGML_HAVE_FLASH_ATTN_BACK
        PYGGML_HAVE_USE_REF
        PYGGML_HAVE_CUSTOM_4D
        PYGGML_HAVE_ROPE_SET_OFFSET
        PYGGML_HAVE_ADD_SINKS
        PYGGML_HAVE_FA_N_KV_MAX
        PYGGML_HAVE_PREC_SET
        PYGGML_HAVE_MUL_MAT_SET_HINT
        PYGGML_HAVE_ROPE_IMROPE
    int pyggml_plan_use_ref(ggml_cplan * plan, int on)

cdef extern from "_compat.h" nogil:
    enum:
        GGML_MAX_DIMS
        GGML_MAX_SRC
        GGML_MAX_OP_PARAMS
        GGML_MAX_NAME
        GGML_MEM_ALIGN
        GGML_DEFAULT_GRAPH_SIZE
        GGML_ROPE_TYPE_VISION

    enum ggml_status:
        GGML_STATUS_ALLOC_FAILED
        GGML_STATUS_FAILED
        GGML_STATUS_SUCCESS
        GGML_STATUS_ABORTED

    enum ggml_type:
        GGML_TYPE_F32
        GGML_TYPE_F16
        GGML_TYPE_Q4_0
        GGML_TYPE_Q4_1
        GGML_TYPE_Q5_0
        GGML_TYPE_Q5_1
        GGML_TYPE_Q8_0
        GGML_TYPE_I8
        GGML_TYPE_I16
        GGML_TYPE_I32
        GGML_TYPE_I64
        GGML_TYPE_F64
        GGML_TYPE_BF16
        GGML_TYPE_COUNT

    enum ggml_prec:
        GGML_PREC_DEFAULT

    enum ggml_op:
        GGML_OP_NONE
        GGML_OP_MUL_MAT
        GGML_OP_FLASH_ATTN_BACK
        GGML_OP_UNARY
        GGML_OP_GLU
        GGML_OP_COUNT

    enum ggml_unary_op:
        GGML_UNARY_OP_COUNT

    enum ggml_glu_op:
        GGML_GLU_OP_COUNT

    enum ggml_tensor_flag:
        GGML_TENSOR_FLAG_INPUT
        GGML_TENSOR_FLAG_OUTPUT
        GGML_TENSOR_FLAG_PARAM
        GGML_TENSOR_FLAG_LOSS

    struct ggml_context:
        pass

    struct ggml_cgraph:
        pass

    struct ggml_init_params:
        size_t mem_size
        void * mem_buffer
        bint   no_alloc

    struct ggml_tensor:
        ggml_type type
        int64_t ne[GGML_MAX_DIMS]
        size_t  nb[GGML_MAX_DIMS]
        ggml_op op
        int32_t op_params[1]     # really GGML_MAX_OP_PARAMS / 4 entries
        int32_t flags
        ggml_tensor * src[GGML_MAX_SRC]
        ggml_tensor * view_src
        size_t view_offs
        void * buffer            # struct ggml_backend_buffer *: NULL for a context pool's tensors
        void * data
        char name[GGML_MAX_NAME]
        char padding[8]          # unused by ggml (zeroed): pyggml keeps the numpy rank in [0]

    enum ggml_log_level:
        GGML_LOG_LEVEL_NONE

    ctypedef void (*ggml_abort_callback_t)(const char * error_message)
    ctypedef void (*ggml_log_callback)(ggml_log_level level, const char * text, void * user_data)
    ggml_abort_callback_t ggml_set_abort_callback(ggml_abort_callback_t callback)
    void ggml_log_set(ggml_log_callback log_callback, void * user_data)

    const char * c_ggml_version "ggml_version"()   # renamed: pyggml.ggml_version is the Python function
    const char * ggml_commit()
    const char * ggml_status_to_string(ggml_status status)

    ggml_context * ggml_init(ggml_init_params params)
    void ggml_free(ggml_context * ctx)
    void ggml_reset(ggml_context * ctx)
    size_t ggml_used_mem(const ggml_context * ctx)
    ggml_tensor * ggml_get_first_tensor(const ggml_context * ctx)
    ggml_tensor * ggml_get_tensor(ggml_context * ctx, const char * name)
    ggml_tensor * ggml_get_next_tensor(const ggml_context * ctx, ggml_tensor * tensor)
    size_t ggml_tensor_overhead()
    size_t ggml_graph_overhead_custom(size_t size, bint grads)
    size_t ggml_graph_overhead()

    int64_t ggml_nelements(const ggml_tensor * tensor)
    size_t ggml_nbytes(const ggml_tensor * tensor)
    int64_t ggml_blck_size(ggml_type type)
    size_t ggml_type_size(ggml_type type)
    size_t ggml_row_size(ggml_type type, int64_t ne)
    const char * ggml_type_name(ggml_type type)
    const char * ggml_op_name(ggml_op op)
    const char * ggml_op_desc(const ggml_tensor * t)
    const char * ggml_unary_op_name(ggml_unary_op op)
    const char * ggml_glu_op_name(ggml_glu_op op)
    bint ggml_is_quantized(ggml_type type)
    bint ggml_quantize_requires_imatrix(ggml_type type)

    ctypedef void (*ggml_to_float_t)(const void * x, float * y, int64_t k) noexcept nogil
    struct ggml_type_traits:
        int64_t blck_size
        size_t type_size
        bint is_quantized
        ggml_to_float_t to_float
    const ggml_type_traits * ggml_get_type_traits(ggml_type type)
    bint ggml_is_transposed(const ggml_tensor * tensor)
    bint ggml_is_contiguous(const ggml_tensor * tensor)
    bint ggml_can_repeat(const ggml_tensor * t0, const ggml_tensor * t1)
    int ggml_n_dims(const ggml_tensor * tensor)

    ggml_tensor * ggml_new_tensor(ggml_context * ctx, ggml_type type, int n_dims, const int64_t * ne)
    ggml_tensor * ggml_set_name(ggml_tensor * tensor, const char * name)
    void * ggml_new_buffer(ggml_context * ctx, size_t nbytes)
    void ggml_set_param(ggml_tensor * tensor)
    void ggml_set_output(ggml_tensor * tensor)
    void ggml_set_input(ggml_tensor * tensor)
    void ggml_mul_mat_set_prec(ggml_tensor * a, ggml_prec prec)
    void ggml_mul_mat_set_hint(ggml_tensor * a, int hint)   # enum ggml_op_hint; _compat.h: a stand-in where absent
    ggml_tensor * ggml_rope_set_offset(ggml_tensor * a, int n_offs)   # _compat.h: a no-op stand-in where absent
    void ggml_flash_attn_ext_set_prec(ggml_tensor * a, ggml_prec prec)
    void ggml_flash_attn_ext_set_n_kv_max(ggml_tensor * a, int32_t n_kv_max)   # _compat.h: a stand-in where absent
    void ggml_soft_max_add_sinks(ggml_tensor * a, ggml_tensor * sinks)          # the same
    void ggml_flash_attn_ext_add_sinks(ggml_tensor * a, ggml_tensor * sinks)    # the same
    bint ggml_prec_set_acc(ggml_tensor * a, ggml_prec prec)                 # the same
    bint ggml_prec_set_src(ggml_tensor * a, ggml_prec prec, int idx)        # the same
    void ggml_set_loss(ggml_tensor * tensor)

    # the graph builders (ggml_add, ...) are declared by the generated pyggml_ops.h

    ggml_cgraph * ggml_new_graph_custom(ggml_context * ctx, size_t size, bint grads)
    void ggml_graph_cpy(ggml_cgraph * src, ggml_cgraph * dst)
    int ggml_graph_size(ggml_cgraph * cgraph)
    void ggml_build_forward_expand(ggml_cgraph * cgraph, ggml_tensor * tensor)
    void ggml_build_backward_expand(ggml_context * ctx, ggml_cgraph * cgraph, ggml_tensor ** grad_accs)
    int ggml_graph_n_nodes(ggml_cgraph * cgraph)
    ggml_tensor * ggml_graph_node(ggml_cgraph * cgraph, int i)
    ggml_tensor * ggml_graph_get_grad(const ggml_cgraph * cgraph, const ggml_tensor * node)
    void ggml_graph_reset(ggml_cgraph * cgraph)


cdef extern from "_compat.h" nogil:   # ggml-cpu.h
    struct ggml_threadpool:
        pass

    struct ggml_threadpool_params:
        int n_threads

    ggml_threadpool_params ggml_threadpool_params_default(int n_threads)
    ggml_threadpool * ggml_threadpool_new(ggml_threadpool_params * params)
    void ggml_threadpool_free(ggml_threadpool * threadpool)

    ctypedef c_bool (*ggml_abort_callback)(void * data)

    struct ggml_cplan:
        size_t work_size
        uint8_t * work_data
        int n_threads
        ggml_threadpool * threadpool
        ggml_abort_callback abort_callback
        void * abort_callback_data

    # the instruction sets this ggml-cpu was compiled for
    int ggml_cpu_has_sse3()
    int ggml_cpu_has_ssse3()
    int ggml_cpu_has_avx()
    int ggml_cpu_has_avx_vnni()
    int ggml_cpu_has_avx2()
    int ggml_cpu_has_bmi2()
    int ggml_cpu_has_f16c()
    int ggml_cpu_has_fma()
    int ggml_cpu_has_avx512()
    int ggml_cpu_has_avx512_vbmi()
    int ggml_cpu_has_avx512_vnni()
    int ggml_cpu_has_avx512_bf16()
    int ggml_cpu_has_amx_int8()
    int ggml_cpu_has_neon()
    int ggml_cpu_has_arm_fma()
    int ggml_cpu_has_fp16_va()
    int ggml_cpu_has_dotprod()
    int ggml_cpu_has_matmul_int8()
    int ggml_cpu_has_sve()
    int ggml_cpu_has_llamafile()

    ggml_cplan ggml_graph_plan(const ggml_cgraph * cgraph, int n_threads, ggml_threadpool * threadpool)
    ggml_status ggml_graph_compute(ggml_cgraph * cgraph, ggml_cplan * cplan)
