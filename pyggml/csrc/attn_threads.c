/* attn_threads.c: pyggml_attn_bwd_compute, the blocked attention backward (attn_blocked.c) run
 * on threads of its own (pthreads) for the numpy call: the threads, their start gate and the
 * barrier the split and head modes meet at, and where the helper threads start. */
#if defined(__linux__)
#define _GNU_SOURCE /* sched_getcpu, pthread_attr_setaffinity_np: see start_elsewhere */
#else
#define _POSIX_C_SOURCE 200809L
#endif
#include "attn_blocked.h"

#include <pthread.h>
#include <stdlib.h>
#if defined(__linux__)
#include <sched.h>
#endif

static int g_start_elsewhere = 1;    /* pyggml_attn_bwd_set_start_elsewhere */

int pyggml_attn_bwd_set_start_elsewhere(int on) {
    const int was = g_start_elsewhere;
    g_start_elsewhere = on != 0;
    return was;
}

/* ------------------------------- pthread convenience driver ------------------------------- */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n, count;
    unsigned gen;
    int go, abort_run; /* start gate */
} pgab_sync;

static void pgab_barrier(void *ctx) {
    pgab_sync *s = (pgab_sync *)ctx;
    pthread_mutex_lock(&s->mu);
    const unsigned gen = s->gen;
    if (++s->count == s->n) {
        s->count = 0;
        s->gen++;
        pthread_cond_broadcast(&s->cv);
    } else {
        while (gen == s->gen) pthread_cond_wait(&s->cv, &s->mu);
    }
    pthread_mutex_unlock(&s->mu);
}

typedef struct {
    const pyggml_attn_bwd *a;
    int ith, nth;
    void *work;
    pgab_sync *sync;
} pgab_targ;

static void *pgab_thread(void *p) {
    pgab_targ *t = (pgab_targ *)p;
    pgab_sync *s = t->sync;
    pthread_mutex_lock(&s->mu);
    while (!s->go) pthread_cond_wait(&s->cv, &s->mu);
    const int ab = s->abort_run;
    pthread_mutex_unlock(&s->mu);
    if (!ab) pyggml_attn_bwd_run(t->a, t->ith, t->nth, t->work, pgab_barrier, s);
    return NULL;
}

/* The helper threads start on the CPUs the caller may run on other than the one it runs on
 * now (Linux).  A new thread otherwise often starts on its creator's CPU and shares it until
 * the scheduler moves it, some milliseconds later: with one helper on a 2-core machine, half
 * of the 5 ms calls at N = M = 1024, D = 64, one head took 8-9 ms instead of 5 (the helper
 * still may move anywhere the mask allows; the caller's own thread is left as it is).
 * Returns whether attr holds such a mask. */
static int start_elsewhere(pthread_attr_t *attr) {
#if defined(__linux__)
    cpu_set_t allowed;
    const int here = sched_getcpu();
    if (here < 0 || here >= CPU_SETSIZE || sched_getaffinity(0, sizeof allowed, &allowed) != 0 ||
        !CPU_ISSET(here, &allowed) || CPU_COUNT(&allowed) < 2)
        return 0;
    CPU_CLR(here, &allowed);
    return pthread_attr_setaffinity_np(attr, sizeof allowed, &allowed) == 0;
#else
    (void)attr;
    return 0;
#endif
}

int pyggml_attn_bwd_compute(const pyggml_attn_bwd *a, int n_threads) {
    if (!a || a->D < 1 || a->N < 1 || a->M < 1 || a->H < 1 || a->KVH < 1 || a->B < 1 ||
        a->H % a->KVH != 0 || (a->masked && a->M < a->N) || !a->q || !a->k || !a->v || !a->d ||
        !a->dq || !a->dk || !a->dv)
        return 1;
    if (n_threads < 1) n_threads = 1;
    size_t ws = pyggml_attn_bwd_work_size(a, n_threads);
    ws = (ws + 63) / 64 * 64;
    void *work = aligned_alloc(64, ws);
    pgab_targ *args = (pgab_targ *)malloc(sizeof(pgab_targ) * (size_t)n_threads);
    pthread_t *tids = (pthread_t *)malloc(sizeof(pthread_t) * (size_t)n_threads);
    if (!work || !args || !tids) {
        free(work);
        free(args);
        free(tids);
        return 2;
    }
    pgab_sync s;
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.cv, NULL);
    s.n = n_threads;
    s.count = 0;
    s.gen = 0;
    s.go = 0;
    s.abort_run = 0;
    int created = 0, rc = 0;
    for (int t = 0; t < n_threads; t++) args[t] = (pgab_targ){a, t, n_threads, work, &s};
    pthread_attr_t attr;
    const int have_attr = n_threads > 1 && pthread_attr_init(&attr) == 0;
    const int elsewhere = have_attr && g_start_elsewhere && start_elsewhere(&attr);
    for (int t = 1; t < n_threads; t++) {
        if (pthread_create(&tids[t], elsewhere ? &attr : NULL, pgab_thread, &args[t]) != 0) {
            rc = 3;
            break;
        }
        created++;
    }
    if (have_attr) pthread_attr_destroy(&attr);
    pthread_mutex_lock(&s.mu);
    s.go = 1;
    s.abort_run = rc != 0;
    pthread_cond_broadcast(&s.cv);
    pthread_mutex_unlock(&s.mu);
    if (rc == 0) pyggml_attn_bwd_run(a, 0, n_threads, work, pgab_barrier, &s);
    for (int t = 1; t <= created; t++) pthread_join(tids[t], NULL);
    pthread_cond_destroy(&s.cv);
    pthread_mutex_destroy(&s.mu);
    free(work);
    free(args);
    free(tids);
    return rc;
}
