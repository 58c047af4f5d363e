/* The abort guard, calls on a big stack, and the guarded graph calls. See pyggml_rt.h. */
#define _GNU_SOURCE
#include "pyggml_rt.h"
#include "ggml-cpu.h"

#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* --- the abort guard ----------------------------------------------------------------------- */

/* initial-exec: one slot of static TLS, no __tls_get_addr call on every guarded call */
static _Thread_local pyggml_guard * current_guard __attribute__((tls_model("initial-exec")));
static ggml_abort_callback_t previous_callback;
static pthread_once_t install_once = PTHREAD_ONCE_INIT;

static const int fault_signals[] = {SIGFPE, SIGSEGV, SIGBUS, SIGILL};
#define N_FAULTS ((int) (sizeof fault_signals / sizeof fault_signals[0]))
static struct sigaction previous_actions[N_FAULTS];

/* --- ggml's log ------------------------------------------------------------------------------ */

static _Thread_local pyggml_log_capture * current_capture __attribute__((tls_model("initial-exec")));

void pyggml_log_capture_begin(pyggml_log_capture * c, char * buf, size_t cap) {
    c->buf = buf;
    c->cap = cap;
    c->len = 0;
    if (cap > 0) {
        buf[0] = '\0';
    }
    c->prev = current_capture;
    current_capture = c;
}

void pyggml_log_capture_end(pyggml_log_capture * c) {
    current_capture = c->prev;
}

static void route_log(enum ggml_log_level level, const char * text, void * user_data) {
    (void) user_data;
    pyggml_log_capture * c = current_capture;
    if (c == NULL || level == GGML_LOG_LEVEL_DEBUG) {
        fputs(text, stderr);            /* ggml's default logger */
        fflush(stderr);
        return;
    }
    for (; *text != '\0' && c->len + 1 < c->cap; text++) {
        c->buf[c->len++] = *text;
    }
    if (c->cap > 0) {
        c->buf[c->len] = '\0';
    }
}

/* a guarded call that ends by longjmp: its capture ends too */
static void guard_abandon(pyggml_guard * g) {
    current_guard = g->prev;
    current_capture = g->capture.prev;
}

static void on_fault(int sig, siginfo_t * info, void * context) {
    pyggml_guard * g = current_guard;
    if (g != NULL) {
        /* a synchronous fault in a guarded builder: abandon the call (its scratch
         * context is reset before the next one); SA_NODEFER left the signal unblocked */
        g->signal = sig;
        snprintf(g->message, sizeof g->message, "signal %d (%s) in the guarded ggml call", sig,
                 sig == SIGFPE ? "SIGFPE: an arithmetic error, such as an integer division by zero"
                 : sig == SIGSEGV ? "SIGSEGV: an invalid memory access"
                 : sig == SIGBUS ? "SIGBUS" : "SIGILL");
        guard_abandon(g);
        longjmp(g->env, 1);
    }
    for (int i = 0; i < N_FAULTS; i++) {
        if (fault_signals[i] != sig) {
            continue;
        }
        const struct sigaction * prev = &previous_actions[i];
        if ((prev->sa_flags & SA_SIGINFO) && prev->sa_sigaction != NULL) {
            prev->sa_sigaction(sig, info, context);
            return;
        }
        if (prev->sa_handler != SIG_DFL && prev->sa_handler != SIG_IGN) {
            prev->sa_handler(sig);
            return;
        }
    }
    /* nobody else handles it: die of it, as without pyggml */
    signal(sig, SIG_DFL);
    raise(sig);
}

static void on_ggml_abort(const char * message) {
    pyggml_guard * g = current_guard;
    if (g != NULL) {
        snprintf(g->message, sizeof g->message, "%s", message);
        guard_abandon(g);
        longjmp(g->env, 1);
    }
    /* ggml-rpc's client, on a thread that runs no Python (its dispatcher, a pyggml
     * worker): the connection failed; park the thread instead (csrc/remote.c) */
    pyggml_remote_park_if_rpc(message);
    /* not in a guarded call (a kernel, another library): ggml aborts after this returns */
    if (previous_callback != NULL) {
        previous_callback(message);
    } else {
        fprintf(stderr, "%s\n(pyggml: ggml aborted outside a guarded call: please report this "
                        "with the message above)\n", message);
        fflush(stderr);
    }
}

static void install(void) {
    previous_callback = ggml_set_abort_callback(on_ggml_abort);
    ggml_log_set(route_log, NULL);
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = on_fault;
    action.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&action.sa_mask);
    for (int i = 0; i < N_FAULTS; i++) {
        sigaction(fault_signals[i], &action, &previous_actions[i]);
    }
}

void pyggml_guard_install(void) {
    pthread_once(&install_once, install);
}

void pyggml_guard_enter(pyggml_guard * g) {
    g->prev = current_guard;
    g->signal = 0;
    g->message[0] = '\0';
    current_guard = g;
    pyggml_log_capture_begin(&g->capture, g->log, sizeof g->log);
}

void pyggml_guard_leave(pyggml_guard * g) {
    pyggml_log_capture_end(&g->capture);
    current_guard = g->prev;
}

/* --- big stacks ------------------------------------------------------------------------------ */

struct stack_call {
    void (*fn)(void *);
    void * arg;
};

static void * stack_trampoline(void * p) {
    struct stack_call * c = p;
    c->fn(c->arg);
    return NULL;
}

int pyggml_run_on_stack(void (*fn)(void *), void * arg, size_t stack_bytes) {
    pthread_attr_t attr;
    pthread_t thread;
    struct stack_call call = {fn, arg};
    int rc = pthread_attr_init(&attr);
    if (rc != 0) {
        return rc;
    }
    rc = pthread_attr_setstacksize(&attr, stack_bytes);
    if (rc == 0) {
        rc = pthread_create(&thread, &attr, stack_trampoline, &call);
    }
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        return rc;
    }
    return pthread_join(thread, NULL);
}

/* --- guarded graph calls ----------------------------------------------------------------- */

struct graph_call {
    pyggml_guard * g;
    struct ggml_context * ctx;
    struct ggml_cgraph * graph;
    struct ggml_tensor * tensor;
    int backward;
    int ok;
};

static void graph_call_run(void * p) {
    struct graph_call * c = p;
    pyggml_guard_enter(c->g);
    if (setjmp(c->g->env) == 0) {
        if (c->backward) {
            ggml_build_backward_expand(c->ctx, c->graph, NULL);
        } else {
            ggml_build_forward_expand(c->graph, c->tensor);
        }
        pyggml_guard_leave(c->g);
        c->ok = 1;
    }
}

static int graph_call(struct graph_call * c, size_t stack_bytes) {
    if (stack_bytes == 0) {
        graph_call_run(c);
        return c->ok;
    }
    int rc = pyggml_run_on_stack(graph_call_run, c, stack_bytes);
    return rc != 0 ? -rc : c->ok;
}

int pyggml_try_build_forward_expand(pyggml_guard * g, struct ggml_cgraph * graph, struct ggml_tensor * tensor,
                                    size_t stack_bytes) {
    struct graph_call c = {g, NULL, graph, tensor, 0, 0};
    return graph_call(&c, stack_bytes);
}

int pyggml_try_build_backward_expand(pyggml_guard * g, struct ggml_context * ctx, struct ggml_cgraph * graph,
                                     size_t stack_bytes) {
    struct graph_call c = {g, ctx, graph, NULL, 1, 0};
    return graph_call(&c, stack_bytes);
}

int pyggml_try_graph_plan(pyggml_guard * g, const struct ggml_cgraph * graph, int n_threads,
                          struct ggml_threadpool * threadpool, struct ggml_cplan * plan) {
    volatile int ok = 0;
    pyggml_guard_enter(g);
    if (setjmp(g->env) == 0) {
        *plan = ggml_graph_plan(graph, n_threads, threadpool);
        pyggml_guard_leave(g);
        ok = 1;
    }
    return ok;
}

int pyggml_type_has_cpu_from_float(int type) {
    if (type < 0 || type >= GGML_TYPE_COUNT) {
        return 0;
    }
    const struct ggml_type_traits_cpu * tr = ggml_get_type_traits_cpu((enum ggml_type) type);
    return tr != NULL && tr->from_float != NULL;
}

int pyggml_try_quantize(pyggml_guard * g, int type, const float * src, void * dst, int64_t nrows,
                        int64_t n_per_row, const float * imatrix) {
    volatile int ok = 0;
    pyggml_guard_enter(g);
    if (setjmp(g->env) == 0) {
        if (type == GGML_TYPE_Q8_1 || type == GGML_TYPE_Q8_K) {
            /* the dot-product types ggml_quantize_chunk leaves out: their row quantizers
             * (the reference one of ggml-base where there is one, else the CPU backend's) */
            ggml_from_float_t row = ggml_get_type_traits((enum ggml_type) type)->from_float_ref;
            if (row == NULL) {
                row = ggml_get_type_traits_cpu((enum ggml_type) type)->from_float;
            }
            const size_t row_size = ggml_row_size((enum ggml_type) type, n_per_row);
            for (int64_t r = 0; r < nrows; r++) {
                row(src + r * n_per_row, (char *) dst + r * row_size, n_per_row);
            }
        } else {
            ggml_quantize_chunk((enum ggml_type) type, src, dst, 0, nrows, n_per_row, imatrix);
        }
        pyggml_guard_leave(g);
        ok = 1;
    }
    return ok;
}

/* --- computing on a worker thread ------------------------------------------------------ */

bool pyggml_async_aborted(void * data) {
    pyggml_async * a = data;
    return __atomic_load_n(&a->abort, __ATOMIC_RELAXED) != 0;
}

/* now + timeout_ms, for pthread_cond_timedwait */
static struct timespec deadline(int timeout_ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += timeout_ms / 1000;
    ts.tv_nsec += (long) (timeout_ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec += 1;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

/* the workers that have not returned yet, for pyggml_async_drain */
static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t live_cv = PTHREAD_COND_INITIALIZER;
static int live_workers;

static void live_add(int d) {
    pthread_mutex_lock(&live_mu);
    live_workers += d;
    if (live_workers == 0) {
        pthread_cond_broadcast(&live_cv);
    }
    pthread_mutex_unlock(&live_mu);
}

int pyggml_async_drain(int timeout_ms) {
    struct timespec ts = deadline(timeout_ms);
    pthread_mutex_lock(&live_mu);
    while (live_workers > 0) {
        if (pthread_cond_timedwait(&live_cv, &live_mu, &ts) != 0) {
            break;
        }
    }
    const int left = live_workers;
    pthread_mutex_unlock(&live_mu);
    return left;
}

/* The workers stay: one that finished its job parks (at most MAX_PARKED of them) and takes
 * the next job. The thread that starts an OpenMP parallel region is its team's master, and
 * libgomp's team is fast only for a master that stays: with a new worker per compute, a
 * 2048x2048x64 F32 product on 2 threads took 19 ms, from a thread that stays 5.5 ms
 * (scripts/bench_threads.py has both). A worker whose caller waited to the end is
 * "finishing" from just before its caller sees done until it parks (steps that take no
 * GIL), and pyggml_async_start waits for it rather than start another: back-to-back
 * computes then run on one worker and its team. */
#define MAX_PARKED 4

typedef struct worker {
    pthread_cond_t cv;
    pyggml_async * job;     /* the next job, handed over by pyggml_async_start */
} worker;

static pthread_mutex_t park_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t park_cv = PTHREAD_COND_INITIALIZER;   /* a worker parked or left */
static worker * parked[MAX_PARKED];
static int n_parked;
static int n_finishing;
static pthread_once_t park_once = PTHREAD_ONCE_INIT;

/* fork: the child has none of the parent's workers (only the forking thread) */
static void park_prepare(void) { pthread_mutex_lock(&park_mu); }
static void park_parent(void) { pthread_mutex_unlock(&park_mu); }
static void park_child(void) {
    n_parked = 0;
    n_finishing = 0;
    pthread_mutex_init(&park_mu, NULL);
    pthread_cond_init(&park_cv, NULL);
}
static void park_install(void) { pthread_atfork(park_prepare, park_parent, park_child); }

/* run a's job and tell its caller; returns whether this worker is finishing (see above) */
static int async_run(pyggml_async * a) {
    pyggml_status result;
    pyggml_status_clear(&result);
    if (a->task != NULL) {
        a->task(a->task_arg, &a->abort);
    } else if (a->compute != NULL) {
        if (a->checked) {
            pyggml_compute_checked_with(a->graph, a->compute, a->compute_arg, &result);
        } else {
            pyggml_status_from_ggml(&result, a->compute(a->graph, a->compute_arg));
        }
    } else {
        a->plan->abort_callback = pyggml_async_aborted;
        a->plan->abort_callback_data = a;
        if (a->checked) {
            pyggml_compute_checked(a->graph, a->plan, &result);
        } else {
            pyggml_status_from_ggml(&result, ggml_graph_compute(a->graph, a->plan));
        }
    }
    /* before done is set: a caller that sees done has not handed the clean-up over */
    const int handed_over = pyggml_async_handoff(a);
    /* whether this worker still counts for pyggml_async_drain (an abandoned one does not):
     * claimed before done (after it the caller may free a), counted down after on_done */
    const int counted = __atomic_exchange_n(&a->live_released, 1, __ATOMIC_ACQ_REL) == 0;
    void (*on_done)(void *, int) = a->on_done;
    void * on_done_arg = a->on_done_arg;
    if (!handed_over) {
        /* on_done(..., 0) takes no GIL: a start that waits for this worker with the GIL
         * held waits for steps that do not need it */
        pthread_mutex_lock(&park_mu);
        n_finishing++;
        pthread_mutex_unlock(&park_mu);
    }
    pthread_mutex_lock(&a->mu);
    a->result = result;
    a->done = 1;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
    if (on_done != NULL) {
        on_done(on_done_arg, handed_over);  /* handed over: the caller gave up waiting */
    }
    if (counted) {
        live_add(-1);                       /* nothing of Python's left to run here */
    }
    return !handed_over;
}

static void * worker_main(void * p) {
    pyggml_async * a = p;
    worker self;
    pthread_cond_init(&self.cv, NULL);
    for (;;) {
        const int finishing = async_run(a);
        pthread_mutex_lock(&park_mu);
        n_finishing -= finishing;
        if (n_parked == MAX_PARKED) {
            pthread_cond_broadcast(&park_cv);
            pthread_mutex_unlock(&park_mu);
            break;
        }
        self.job = NULL;
        parked[n_parked++] = &self;
        pthread_cond_broadcast(&park_cv);
        while (self.job == NULL) {
            pthread_cond_wait(&self.cv, &park_mu);
        }
        a = self.job;
        pthread_mutex_unlock(&park_mu);
    }
    pthread_cond_destroy(&self.cv);
    return NULL;
}

int pyggml_async_start(pyggml_async * a) {
    a->done = 0;
    a->abort = 0;
    a->handoff = 0;
    a->live_released = 0;
    pyggml_status_clear(&a->result);
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->cv, NULL);
    pthread_once(&park_once, park_install);
    live_add(1);
    pthread_mutex_lock(&park_mu);
    while (n_parked == 0 && n_finishing > 0) {
        pthread_cond_wait(&park_cv, &park_mu);
    }
    if (n_parked > 0) {
        worker * w = parked[--n_parked];
        w->job = a;
        pthread_cond_signal(&w->cv);
        pthread_mutex_unlock(&park_mu);
        return 0;
    }
    pthread_mutex_unlock(&park_mu);
    pthread_attr_t attr;
    pthread_t thread;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&thread, &attr, worker_main, a);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        live_add(-1);
    }
    return rc;
}

int pyggml_async_wait(pyggml_async * a, int timeout_ms) {
    struct timespec ts = deadline(timeout_ms);
    pthread_mutex_lock(&a->mu);
    while (!a->done) {
        if (pthread_cond_timedwait(&a->cv, &a->mu, &ts) != 0) {
            break;
        }
    }
    int done = a->done;
    pthread_mutex_unlock(&a->mu);
    return done;
}

void pyggml_async_release_live(pyggml_async * a) {
    if (__atomic_exchange_n(&a->live_released, 1, __ATOMIC_ACQ_REL) == 0) {
        live_add(-1);
    }
}

int pyggml_async_handoff(pyggml_async * a) {
    return __atomic_exchange_n(&a->handoff, 1, __ATOMIC_ACQ_REL);
}

void pyggml_async_abort(pyggml_async * a) {
    __atomic_store_n(&a->abort, 1, __ATOMIC_RELAXED);
}

/* --- is an OpenMP runtime loaded? ------------------------------------------------------ */

static int find_openmp(struct dl_phdr_info * info, size_t size, void * data) {
    (void) size;
    (void) data;
    const char * name = info->dlpi_name;
    return name != NULL && (strstr(name, "libgomp") != NULL || strstr(name, "libomp") != NULL ||
                            strstr(name, "libiomp") != NULL);
}

int pyggml_openmp_loaded(void) {
    /* what the CPU backend says of itself (its registry features carry OPENMP when
     * ggml-cpu was built with it); only a ggml without that list is judged by the
     * libraries loaded, which another library's OpenMP runtime can mislead */
    ggml_backend_reg_t reg = ggml_backend_cpu_reg();
    ggml_backend_get_features_t get =
        reg != NULL ? (ggml_backend_get_features_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_get_features")
                    : NULL;
    if (get != NULL) {
        for (struct ggml_backend_feature * f = get(reg); f != NULL && f->name != NULL; f++) {
            if (strcmp(f->name, "OPENMP") == 0) {
                return 1;
            }
        }
        return 0;
    }
    return dl_iterate_phdr(find_openmp, NULL) != 0;
}
