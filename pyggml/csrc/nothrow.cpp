/* No C++ exception reaches Python's C frames: ggml's C++ parts (ggml-backend.cpp, the CPU
 * backend's graph_compute, ggml-opt.cpp) allocate with new and std::vector, whose
 * std::bad_alloc would otherwise unwind through Cython's C code and end the process with
 * std::terminate. Each entry point pyggml calls into them goes through one of these
 * wrappers, which turns an exception into an error value (see pyggml_rt.h). */
#include <exception>
#include <new>

#include "pyggml_rt.h"

#include "ggml-backend.h"
#include "ggml-opt.h"
#include "gguf.h"

/* what the last wrapper caught on this thread: PYGGML_CXX_* */
static thread_local int last_exception = PYGGML_CXX_NONE;

template <typename F, typename R>
static R guarded(F f, R on_error) {
    last_exception = PYGGML_CXX_NONE;
    try {
        return f();
    } catch (const std::bad_alloc &) {
        last_exception = PYGGML_CXX_BAD_ALLOC;
    } catch (...) {
        last_exception = PYGGML_CXX_OTHER;
    }
    return on_error;
}

extern "C" {

int pyggml_cxx_last_exception(void) {
    return last_exception;
}

/* a compute's status, or PYGGML_STATUS_CXX_* (it runs on a worker thread: the status
 * itself carries what was caught) */
static enum ggml_status cxx_status(void) {
    return (enum ggml_status) (last_exception == PYGGML_CXX_BAD_ALLOC ? PYGGML_STATUS_CXX_BAD_ALLOC
                                                                       : PYGGML_STATUS_CXX_OTHER);
}

enum ggml_status pyggml_backend_compute_nothrow(struct ggml_cgraph * graph, void * backend) {
    enum ggml_status st = guarded([&] { return ggml_backend_graph_compute((ggml_backend_t) backend, graph); },
                                  GGML_STATUS_FAILED);
    return last_exception != PYGGML_CXX_NONE ? cxx_status() : st;
}

enum ggml_status pyggml_sched_compute_nothrow(struct ggml_cgraph * graph, void * sched) {
    enum ggml_status st = guarded([&] { return ggml_backend_sched_graph_compute((ggml_backend_sched_t) sched, graph); },
                                  GGML_STATUS_FAILED);
    return last_exception != PYGGML_CXX_NONE ? cxx_status() : st;
}

int pyggml_sched_alloc_graph_nothrow(ggml_backend_sched_t sched, struct ggml_cgraph * graph) {
    return guarded([&] { return ggml_backend_sched_alloc_graph(sched, graph) ? 1 : 0; }, 0);
}

ggml_backend_sched_t pyggml_sched_new_nothrow(ggml_backend_t * backends, int n_backends, size_t graph_size) {
    return guarded([&] { return ggml_backend_sched_new(backends, NULL, n_backends, graph_size, false, true); },
                   (ggml_backend_sched_t) NULL);
}

ggml_opt_dataset_t pyggml_opt_dataset_init_nothrow(enum ggml_type type_data, enum ggml_type type_label,
                                                   int64_t ne_datapoint, int64_t ne_label, int64_t ndata,
                                                   int64_t ndata_shard) {
    return guarded([&] {
        return ggml_opt_dataset_init(type_data, type_label, ne_datapoint, ne_label, ndata, ndata_shard);
    }, (ggml_opt_dataset_t) NULL);
}

ggml_opt_context_t pyggml_opt_init_nothrow(struct ggml_opt_params params) {
    return guarded([&] { return ggml_opt_init(params); }, (ggml_opt_context_t) NULL);
}

void pyggml_opt_epoch_nothrow(void * arg, const int * abort) {
    (void) abort;       /* an epoch stops through its CPU backends' abort callbacks */
    pyggml_epoch * e = (pyggml_epoch *) arg;
    e->exception = guarded([&] {
        ggml_opt_epoch(e->opt, e->dataset, e->result_train, e->result_eval, e->idata_split, e->callback,
                       e->callback);
        return PYGGML_CXX_NONE;
    }, -1);
    if (e->exception == -1) {
        e->exception = last_exception;
    }
}

struct gguf_context * pyggml_gguf_init_nothrow(const char * path, struct ggml_context ** meta) {
    return guarded([&] {
        struct gguf_init_params params = {/*no_alloc =*/ true, /*ctx =*/ meta};
        return gguf_init_from_file(path, params);
    }, (struct gguf_context *) NULL);
}

int pyggml_gguf_write_nothrow(const pyggml_gguf_kv * kvs, int64_t n_kv, struct ggml_tensor * const * tensors,
                              int64_t n_tensors, const char * path) {
    struct gguf_context * g = NULL;
    const int ok = guarded([&] {
        g = gguf_init_empty();
        for (int64_t i = 0; i < n_kv; i++) {
            const pyggml_gguf_kv & kv = kvs[i];
            switch (kv.type) {
            case GGUF_TYPE_UINT8:   gguf_set_val_u8(g, kv.key, *(const uint8_t *) kv.data); break;
            case GGUF_TYPE_INT8:    gguf_set_val_i8(g, kv.key, *(const int8_t *) kv.data); break;
            case GGUF_TYPE_UINT16:  gguf_set_val_u16(g, kv.key, *(const uint16_t *) kv.data); break;
            case GGUF_TYPE_INT16:   gguf_set_val_i16(g, kv.key, *(const int16_t *) kv.data); break;
            case GGUF_TYPE_UINT32:  gguf_set_val_u32(g, kv.key, *(const uint32_t *) kv.data); break;
            case GGUF_TYPE_INT32:   gguf_set_val_i32(g, kv.key, *(const int32_t *) kv.data); break;
            case GGUF_TYPE_FLOAT32: gguf_set_val_f32(g, kv.key, *(const float *) kv.data); break;
            case GGUF_TYPE_UINT64:  gguf_set_val_u64(g, kv.key, *(const uint64_t *) kv.data); break;
            case GGUF_TYPE_INT64:   gguf_set_val_i64(g, kv.key, *(const int64_t *) kv.data); break;
            case GGUF_TYPE_FLOAT64: gguf_set_val_f64(g, kv.key, *(const double *) kv.data); break;
            case GGUF_TYPE_BOOL:    gguf_set_val_bool(g, kv.key, *(const uint8_t *) kv.data != 0); break;
            case GGUF_TYPE_STRING:  gguf_set_val_str(g, kv.key, (const char *) kv.data); break;
            case GGUF_TYPE_ARRAY:
                if (kv.arr_type == GGUF_TYPE_STRING) {
                    gguf_set_arr_str(g, kv.key, (const char **) kv.strs, kv.n);
                } else {
                    gguf_set_arr_data(g, kv.key, (enum gguf_type) kv.arr_type, kv.data, kv.n);
                }
                break;
            default:
                return 0;
            }
        }
        for (int64_t i = 0; i < n_tensors; i++) {
            gguf_add_tensor(g, tensors[i]);
        }
        return gguf_write_to_file(g, path, false) ? 1 : 0;
    }, -1);
    if (g != NULL) {
        gguf_free(g);
    }
    return ok;
}

}  // extern "C"
