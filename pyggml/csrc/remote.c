/* ggml's RPC backend (ggml-rpc.h) from pyggml: the server, the client's start, and what a
 * connection that fails does (docs/backends.md, "RPC").
 *
 * ggml-rpc's client talks to its server on a thread of its own (the dispatcher); a caller
 * waits for its answer on a future. When the connection fails (the server died, or sent
 * what it cannot parse), the dispatcher calls GGML_ABORT: the whole process would die.
 * pyggml instead (1) makes every call that may reach a server on a worker thread of its
 * own (pyggml_remote_start) and waits for it in slices, with a time limit and Ctrl-C;
 * (2) parks, for good, a thread of no Python's that ggml-rpc aborts on (the abort callback
 * calls pyggml_remote_park_if_rpc: the dispatcher, or a worker in ggml-rpc's connect),
 * counting the fault; (3) a caller that sees the fault or its time limit gives the job up
 * (pyggml_remote_abandon): what the job was given stays allocated for good, the connection
 * is not used again (pyggml._core: Remote.dead). A job's arguments are copied into it, so
 * that a job abandoned and answered late writes into memory of its own. */
#define _GNU_SOURCE
#include "pyggml_rt.h"
#include "pyggml_config.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if PYGGML_HAVE_RPC
#include "ggml-rpc.h"
#endif

/* --- the backend ------------------------------------------------------------------------ */

int pyggml_rpc_built(void) {
    return PYGGML_HAVE_RPC;
}

int pyggml_rpc_protocol(int * major, int * minor, int * patch) {
#if PYGGML_HAVE_RPC
    *major = RPC_PROTO_MAJOR_VERSION;
    *minor = RPC_PROTO_MINOR_VERSION;
    *patch = RPC_PROTO_PATCH_VERSION;
    return 1;
#else
    *major = *minor = *patch = -1;
    return 0;
#endif
}

ggml_backend_t pyggml_rpc_init(const char * endpoint, uint32_t device) {
#if PYGGML_HAVE_RPC
    return ggml_backend_rpc_init(endpoint, device);
#else
    (void) endpoint;
    (void) device;
    return NULL;
#endif
}

int pyggml_rpc_serve(const char * endpoint, const char * cache_dir, size_t n_threads, size_t n_devices,
                     ggml_backend_dev_t * devices) {
#if PYGGML_HAVE_RPC
    ggml_backend_rpc_start_server(endpoint, cache_dir, n_threads, n_devices, devices);
    return 1;               /* it returns only when it could not start */
#else
    (void) endpoint;
    (void) cache_dir;
    (void) n_threads;
    (void) n_devices;
    (void) devices;
    return 0;
#endif
}

/* --- a failed connection ---------------------------------------------------------------- */

static int (*thread_runs_python)(void);
static pthread_mutex_t fault_mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned n_faults;
static char fault_message[PYGGML_MSG_CAP];

void pyggml_remote_set_thread_probe(int (*probe)(void)) {
    thread_runs_python = probe;
}

void pyggml_remote_park_if_rpc(const char * message) {
    if (message == NULL || strstr(message, "ggml-rpc") == NULL) {
        return;
    }
    /* a Python thread in ggml-rpc is a call pyggml did not route to a worker: parking it
     * would hang the interpreter; it aborts as before (and says so) */
    if (thread_runs_python == NULL || thread_runs_python()) {
        return;
    }
    pthread_mutex_lock(&fault_mu);
    snprintf(fault_message, sizeof fault_message, "%s", message);
    n_faults++;
    pthread_mutex_unlock(&fault_mu);
    /* for good: no signal of the process's is delivered here, nothing is released (the
     * thread holds no lock of ggml-rpc's: it failed between a send and a receive) */
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    for (;;) {
        sleep(3600);
    }
}

unsigned pyggml_remote_faults(char * message, size_t cap) {
    pthread_mutex_lock(&fault_mu);
    const unsigned n = n_faults;
    if (message != NULL && cap > 0) {
        snprintf(message, cap, "%s", fault_message);
    }
    pthread_mutex_unlock(&fault_mu);
    return n;
}

/* --- jobs ---------------------------------------------------------------------------------- */

struct pyggml_remote_job {
    pyggml_async a;
    pyggml_remote_fn fn;
    void * owned;           /* freed with the job (a bounce buffer) */
    int refs;               /* the caller's and the worker's: the last frees the job */
    size_t size;
    unsigned char arg[];
};

static void job_release(pyggml_remote_job * job) {
    if (__atomic_sub_fetch(&job->refs, 1, __ATOMIC_ACQ_REL) == 0) {
        free(job->owned);
        free(job);
    }
}

static void remote_task(void * p, const int * abort) {
    (void) abort;
    pyggml_remote_job * job = p;
    job->fn(job->arg);
}

static void remote_done(void * p, int cleanup) {
    (void) cleanup;         /* nothing of Python's to give back: the caller keeps that */
    job_release(p);
}

pyggml_remote_job * pyggml_remote_start(pyggml_remote_fn fn, const void * arg, size_t size, void * owned, int * err) {
    pyggml_remote_job * job = calloc(1, sizeof *job + size);
    if (job == NULL) {
        *err = ENOMEM;
        free(owned);
        return NULL;
    }
    job->refs = 2;
    job->fn = fn;
    job->owned = owned;
    job->size = size;
    memcpy(job->arg, arg, size);
    job->a.task = remote_task;
    job->a.task_arg = job;
    job->a.on_done = remote_done;
    job->a.on_done_arg = job;
    *err = pyggml_async_start(&job->a);
    if (*err != 0) {
        free(job->owned);
        free(job);
        return NULL;
    }
    return job;
}

int pyggml_remote_wait(pyggml_remote_job * job, int timeout_ms) {
    return pyggml_async_wait(&job->a, timeout_ms);
}

void pyggml_remote_finish(pyggml_remote_job * job, void * arg_out) {
    memcpy(arg_out, job->arg, job->size);
    job->owned = NULL;      /* the caller's now (the worker is past its last use of it) */
    job_release(job);
}

void pyggml_remote_abandon(pyggml_remote_job * job) {
    pyggml_async_release_live(&job->a);     /* it may never return: exit does not wait */
    job_release(job);
}
