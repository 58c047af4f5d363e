/* The one record every checked entry point of the runtime fills (pyggml_rt.h), and the
 * translations into it of what ggml, the abort guard and the forked dry run report. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "pyggml_defects.h"
#include "pyggml_rt.h"

#include <errno.h>

int pyggml_status_clear(pyggml_status * st) {
    st->code = PYGGML_OK;
    st->how = 0;
    st->defect = NULL;
    st->node = NULL;
    st->msg[0] = '\0';
    return PYGGML_OK;
}

int pyggml_status_set(pyggml_status * st, int code, int how, const char * defect,
                      const struct ggml_tensor * node, const char * fmt, ...) {
    st->code = code;
    st->how = how;
    st->defect = defect;
    st->node = node;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st->msg, sizeof st->msg, fmt, ap);
    va_end(ap);
    return code;
}

int pyggml_status_from_cxx(pyggml_status * st, int exception) {
    switch (exception) {
    case PYGGML_CXX_NONE:
        return pyggml_status_clear(st);
    case PYGGML_CXX_BAD_ALLOC:
        return pyggml_status_set(st, PYGGML_OUT_OF_MEMORY, exception, NULL, NULL, "std::bad_alloc");
    default:
        return pyggml_status_set(st, PYGGML_CXX_EXCEPTION, exception, NULL, NULL, "a C++ exception");
    }
}

int pyggml_status_from_ggml(pyggml_status * st, int status) {
    switch (status) {
    case GGML_STATUS_SUCCESS:
        return pyggml_status_clear(st);
    case PYGGML_STATUS_CXX_BAD_ALLOC:
        return pyggml_status_from_cxx(st, PYGGML_CXX_BAD_ALLOC);
    case PYGGML_STATUS_CXX_OTHER:
        return pyggml_status_from_cxx(st, PYGGML_CXX_OTHER);
    default:
        return pyggml_status_set(st, PYGGML_COMPUTE_FAILED, status, NULL, NULL, "%s",
                                 ggml_status_to_string((enum ggml_status) status));
    }
}

int pyggml_status_from_guard(pyggml_status * st, const pyggml_guard * g) {
    char logged[PYGGML_LOG_CAP];
    pyggml_guard_logged(g, logged, sizeof logged);
    return pyggml_status_set(st, g->signal ? PYGGML_CRASHED : PYGGML_ABORTED, g->signal, NULL, NULL, "%s%s%s%s",
                             g->message, logged[0] ? " (ggml logged: " : "", logged, logged[0] ? ")" : "");
}

void pyggml_guard_logged(const pyggml_guard * g, char * out, size_t cap) {
    /* the captured lines on one line, "; " between them */
    size_t n = 0;
    const char * p = g->log;
    while (*p == '\n' || *p == ' ') p++;
    for (; *p != '\0' && n + 2 < cap; p++) {
        if (*p == '\n') {
            const char * q = p;
            while (*q == '\n' || *q == ' ') q++;
            if (*q == '\0') break;
            if (n + 3 >= cap) break;
            out[n++] = ';';
            out[n++] = ' ';
            p = q - 1;
        } else {
            out[n++] = *p;
        }
    }
    out[n] = '\0';
}

int pyggml_status_from_dry_run(pyggml_status * st, int rc, int how, double timeout_s) {
    st->defect = NULL;
    st->node = NULL;
    st->how = how;
    switch (rc) {
    case PYGGML_DRY_OK:
        return pyggml_status_clear(st);
    case PYGGML_DRY_SIGNAL:
        return st->code = PYGGML_PROOF_SIGNAL;
    case PYGGML_DRY_EXIT:
        if (how == PYGGML_EXIT_GUARD || how == PYGGML_EXIT_OVERRUN) {
            st->defect = PG_DEFECT_KERNEL_OUT_OF_BOUNDS;
            return st->code = PYGGML_DEFECT;
        }
        if (how == PYGGML_EXIT_NO_MEMORY) {  /* the proof could not run; msg: what it could not map */
            st->how = ENOMEM;
            return st->code = PYGGML_SYSTEM;
        }
        return st->code = PYGGML_PROOF_EXIT;
    case PYGGML_DRY_TIMEOUT:
        st->how = (int) (timeout_s * 1000.0 + 0.5);    /* milliseconds: a limit may be under 1 s */
        if (st->msg[0] == '\0') {
            snprintf(st->msg, sizeof st->msg, "the child was killed");
        }
        return st->code = PYGGML_PROOF_TIMEOUT;
    case PYGGML_DRY_ABORTED:                /* as a compute stopped by its abort callback */
        return pyggml_status_set(st, PYGGML_COMPUTE_FAILED, GGML_STATUS_ABORTED, NULL, NULL,
                                 "the proof was stopped: its caller gave up waiting");
    default:                                /* how: errno */
        return pyggml_status_set(st, PYGGML_SYSTEM, how, NULL, NULL, "fork or pipe failed: %s", strerror(how));
    }
}
