/* ggml's GGUF reader, called so that no file ends the process: under the abort guard
 * (a GGML_ASSERT in the reader becomes an error), through the nothrow wrapper (a
 * std::bad_alloc for a count the file lies about becomes a refused file), with ggml's log
 * captured while it reads, as in every guarded call (the reason it refuses a file is a
 * GGML_LOG_ERROR line, which becomes the exception's message). See pyggml_rt.h. */
#include "pyggml_rt.h"
#include "gguf.h"

#include <stdio.h>
#include <string.h>

int pyggml_gguf_write(const pyggml_gguf_kv * kvs, int64_t n_kv, struct ggml_tensor * const * tensors,
                      int64_t n_tensors, const char * path, pyggml_status * st) {
    pyggml_guard g;
    volatile int rc = 0;
    const char * log = g.log;       /* what ggml logged: the guard captures it */
    pyggml_guard_install();
    pyggml_guard_enter(&g);
    if (setjmp(g.env) == 0) {
        rc = pyggml_gguf_write_nothrow(kvs, n_kv, tensors, n_tensors, path);
        pyggml_guard_leave(&g);
    } else {
        rc = -2;
    }
    if (rc == 1) {
        return pyggml_status_clear(st);
    }
    if (rc == -2) {
        return pyggml_status_from_guard(st, &g);
    }
    if (rc == -1) {
        return pyggml_status_from_cxx(st, pyggml_cxx_last_exception());
    }
    return pyggml_status_set(st, PYGGML_BAD_FILE, 0, NULL, NULL, "%s",
                             log[0] ? log : "ggml's writer failed and logged no reason");
}

int pyggml_gguf_open(const char * path, struct gguf_context ** out, struct ggml_context ** meta,
                     pyggml_status * st) {
    pyggml_guard g;
    volatile int outcome = 0;       /* 1 read, 0 refused, -1 aborted, -2 C++ threw */
    const char * log = g.log;       /* what ggml logged: the guard captures it */
    int exception = PYGGML_CXX_NONE;
    *out = NULL;
    *meta = NULL;
    pyggml_guard_install();
    pyggml_guard_enter(&g);
    if (setjmp(g.env) == 0) {
        *out = pyggml_gguf_init_nothrow(path, meta);
        pyggml_guard_leave(&g);
        exception = pyggml_cxx_last_exception();
        outcome = *out != NULL ? 1 : (exception != PYGGML_CXX_NONE ? -2 : 0);
    } else {
        outcome = -1;
    }
    switch (outcome) {
    case 1:
        return pyggml_status_clear(st);
    case 0:
        return pyggml_status_set(st, PYGGML_BAD_FILE, 0, NULL, NULL, "%s",
                                 log[0] ? log : "ggml's reader refused it and logged no reason");
    case -1:
        return pyggml_status_from_guard(st, &g);
    default:
        /* a header whose counts or lengths are absurd makes older readers (0.9.4) allocate
         * them before checking against the file: the file is what is wrong */
        return pyggml_status_set(st, PYGGML_BAD_FILE, exception, NULL, NULL,
                                 "its C++ threw %s while reading it (a count or a length in the file "
                                 "larger than memory)%s%s",
                                 exception == PYGGML_CXX_BAD_ALLOC ? "std::bad_alloc" : "an exception",
                                 log[0] ? "; it logged: " : "", log);
    }
}
