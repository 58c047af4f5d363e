# cython: language_level=3
# Raw C declarations of gguf.h (ggml's GGUF reader and writer) and of pyggml's runtime
# helper around its reader (csrc/gguf_io.c). Nothing here has behaviour.

from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t

from pyggml._ggml cimport c_bool, ggml_context, ggml_tensor, ggml_type
from pyggml._rt cimport pyggml_status


cdef extern from "gguf.h" nogil:
    enum gguf_type:
        GGUF_TYPE_UINT8
        GGUF_TYPE_INT8
        GGUF_TYPE_UINT16
        GGUF_TYPE_INT16
        GGUF_TYPE_UINT32
        GGUF_TYPE_INT32
        GGUF_TYPE_FLOAT32
        GGUF_TYPE_BOOL
        GGUF_TYPE_STRING
        GGUF_TYPE_ARRAY
        GGUF_TYPE_UINT64
        GGUF_TYPE_INT64
        GGUF_TYPE_FLOAT64

    cdef struct gguf_context:
        pass

    void gguf_free(gguf_context * ctx)
    uint32_t gguf_get_version(const gguf_context * ctx)
    size_t gguf_get_alignment(const gguf_context * ctx)
    size_t gguf_get_data_offset(const gguf_context * ctx)

    int64_t gguf_get_n_kv(const gguf_context * ctx)
    const char * gguf_get_key(const gguf_context * ctx, int64_t key_id)
    gguf_type gguf_get_kv_type(const gguf_context * ctx, int64_t key_id)
    gguf_type gguf_get_arr_type(const gguf_context * ctx, int64_t key_id)
    uint8_t gguf_get_val_u8(const gguf_context * ctx, int64_t key_id)
    int8_t gguf_get_val_i8(const gguf_context * ctx, int64_t key_id)
    uint16_t gguf_get_val_u16(const gguf_context * ctx, int64_t key_id)
    int16_t gguf_get_val_i16(const gguf_context * ctx, int64_t key_id)
    uint32_t gguf_get_val_u32(const gguf_context * ctx, int64_t key_id)
    int32_t gguf_get_val_i32(const gguf_context * ctx, int64_t key_id)
    float gguf_get_val_f32(const gguf_context * ctx, int64_t key_id)
    uint64_t gguf_get_val_u64(const gguf_context * ctx, int64_t key_id)
    int64_t gguf_get_val_i64(const gguf_context * ctx, int64_t key_id)
    double gguf_get_val_f64(const gguf_context * ctx, int64_t key_id)
    c_bool gguf_get_val_bool(const gguf_context * ctx, int64_t key_id)
    const char * gguf_get_val_str(const gguf_context * ctx, int64_t key_id)
    size_t gguf_get_arr_n(const gguf_context * ctx, int64_t key_id)
    const void * gguf_get_arr_data(const gguf_context * ctx, int64_t key_id)
    const char * gguf_get_arr_str(const gguf_context * ctx, int64_t key_id, size_t i)

    int64_t gguf_get_n_tensors(const gguf_context * ctx)
    size_t gguf_get_tensor_offset(const gguf_context * ctx, int64_t tensor_id)
    const char * gguf_get_tensor_name(const gguf_context * ctx, int64_t tensor_id)
    ggml_type gguf_get_tensor_type(const gguf_context * ctx, int64_t tensor_id)
    size_t gguf_get_tensor_size(const gguf_context * ctx, int64_t tensor_id)


cdef extern from "pyggml_rt.h" nogil:
    int pyggml_gguf_open(const char * path, gguf_context ** out, ggml_context ** meta, pyggml_status * st)
    ctypedef struct pyggml_gguf_kv:
        const char * key
        int type
        int arr_type
        const void * data
        const char * const * strs
        size_t n
    int pyggml_gguf_write(const pyggml_gguf_kv * kvs, int64_t n_kv, ggml_tensor * const * tensors,
                          int64_t n_tensors, const char * path, pyggml_status * st)
