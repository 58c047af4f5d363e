/* The guarded compute: a graph computed with every tensor's data (and the work buffer)
 * moved into memory of its own, between two PROT_NONE guard pages: its data ends flush
 * against the back guard (up to 3 bytes short, for 4-byte alignment; the work buffer
 * keeps GGML_MEM_ALIGN), and the bytes from the front guard to its start and from its
 * end to the back guard are filled with a canary byte of that region's own (so a
 * kernel that copies one tensor's canary into another is seen too). Meant for a forked
 * child (pyggml_dry_run): a kernel that reads or writes past a tensor faults on a guard
 * page, or damages a canary, and the child says which tensor before it dies. Past a
 * budget of memory mappings (fenced_left: a graph of tens of thousands of tensors) the
 * remaining tensors get canary bytes only. pyggml_guarded_compute_here runs the same
 * compute in the calling process instead, for a process that is disposable (a parity
 * sweep's worker): a fault on a guard page, a ggml abort or a time limit jumps back out
 * of the kernel, the tensors get their own memory back, and the caller is told that
 * the process's state is no longer to be trusted. See pyggml_rt.h. */
#define _GNU_SOURCE
#include <errno.h>
#include "pyggml_rt.h"

#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <ucontext.h>
#include <unistd.h>

#include "ggml-cpu.h"
#include "ptrset.h"
#include "pyggml_defects.h"

#define ALIGN_DATA 4      /* tensors: floats stay aligned, the slack is at most 3 bytes */
#define ALIGN_WORK 16     /* the work buffer: GGML_MEM_ALIGN, as ggml hands it out */

/* Canary bytes on each side of a region without guard pages (see fenced_left) */
#define UNFENCED_PAD 64

typedef struct region {
    char * map;           /* fenced: the mapping [guard][... data + canary][guard]; else malloc'd */
    size_t map_len;       /* fenced: the mapping's length; 0: a region without guard pages */
    char * front;         /* the first canary byte before data */
    char * data;
    size_t nbytes;
    size_t slack;         /* canary bytes from data + nbytes to the back guard (or the end) */
    unsigned char canary; /* this region's: fills the bytes from front to data and the slack */
    char what[200];       /* "node 3 (MUL_MAT) f32 ne=(...)", preformatted for the handler */
} region;

static region * regions;
static int n_regions;
static size_t page;
/* every tensor the graph reaches, and the data pointer each had before the move */
static struct ggml_tensor ** moved;
static void ** moved_from;
static size_t n_moved;

/* --- the in-process mode (pyggml_guarded_compute_here) ---
 * here_active while the compute runs: a fault on a guard page, or the time limit's
 * SIGALRM, jumps back to here_env with here_msg set, instead of ending the process */
static sigjmp_buf here_env;
static volatile sig_atomic_t here_active;
static volatile sig_atomic_t here_timed_out;
static volatile sig_atomic_t here_signal;    /* a fault that is no guard page's */
static pthread_t here_thread;
static char here_msg[PYGGML_MSG_CAP];
/* the fatal signals the in-process mode takes for the call, and their handlers before */
static const int here_signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL};
#define N_HERE_SIGNALS ((int) (sizeof here_signals / sizeof here_signals[0]))
static struct sigaction here_previous[N_HERE_SIGNALS];
/* Regions that may still get guard pages. Each costs the process three memory mappings,
 * and Linux allows vm.max_map_count of them (65,530 by default): a graph of 140,000
 * tensors would run out. Past this budget a region is malloc'd with canary bytes on both
 * sides and no guard pages: a kernel writing past it is still seen (after the compute);
 * one reading past it is not. The work buffer always gets its guard pages. */
static long fenced_left;

static long count_lines(const char * path) {
    FILE * f = fopen(path, "r");
    long n = 0;
    int c;
    if (f == NULL) {
        return -1;
    }
    while ((c = fgetc(f)) != EOF) {
        n += c == '\n';
    }
    fclose(f);
    return n;
}

/* the budget, counted once per process: counting /proc/self/maps costs more than a
 * small proof's compute, and in the in-process mode every proof gives its mappings back */
static long fenced_budget = -1;

static void init_fenced_budget(void) {
    if (fenced_budget >= 0) {
        fenced_left = fenced_budget;
        return;
    }
    long max_maps = 65530, in_use = 0;
    FILE * f = fopen("/proc/sys/vm/max_map_count", "r");
    if (f != NULL) {
        if (fscanf(f, "%ld", &max_maps) != 1) {
            max_maps = 65530;
        }
        fclose(f);
    }
    in_use = count_lines("/proc/self/maps");
    if (in_use < 0) {
        in_use = 0;
    }
    /* a margin for what the compute itself maps (ggml's threads, malloc arenas) */
    fenced_left = (max_maps - in_use - 4096) / 3;
    const char * cap = getenv("PYGGML_PROOF_FENCED");     /* testing: a smaller budget */
    if (cap != NULL && atol(cap) > 0 && atol(cap) < fenced_left) {
        fenced_left = atol(cap);
    }
    if (fenced_left < 1) {
        fenced_left = 1;
    }
    fenced_budget = fenced_left;
}

static void say(const char * s) {
    size_t n = strlen(s);
    while (n > 0) {
        ssize_t w = write(2, s, n);
        if (w <= 0) {
            return;
        }
        s += w;
        n -= (size_t) w;
    }
}

/* n in decimal, async-signal-safe */
static void say_size(size_t n) {
    char buf[24];
    int i = (int) sizeof buf - 1;
    buf[i] = '\0';
    do {
        buf[--i] = (char) ('0' + n % 10);
        n /= 10;
    } while (n > 0 && i > 0);
    say(buf + i);
}

/* the guard page a faulting address lies in: "before the start of" / "past the end of"
 * a region (*r), and how far from its data; NULL when it is no guard page of ours */
static const char * guard_side(const char * addr, const region ** which, size_t * distance) {
    for (int i = 0; i < n_regions; i++) {
        const region * r = &regions[i];
        if (r->map_len == 0) {
            continue;            /* no guard pages */
        }
        if (addr >= r->map && addr < r->map + page) {
            *which = r;
            *distance = (size_t) (r->data - addr);
            return "before the start of";
        }
        if (addr >= r->map + r->map_len - page && addr < r->map + r->map_len) {
            *which = r;
            *distance = (size_t) (addr - (r->data + r->nbytes));
            return "past the end of";
        }
    }
    return NULL;
}

static void on_guard_fault(int sig, siginfo_t * info, void * context) {
    char * addr = info->si_addr;
    const char * access = "accessed";
#if defined(__x86_64__) && defined(REG_ERR)
    ucontext_t * uc = context;
    access = (uc->uc_mcontext.gregs[REG_ERR] & 2) ? "wrote" : "read";
#endif
    const region * r = NULL;
    size_t distance = 0;
    const char * side = guard_side(addr, &r, &distance);
    const int before = side != NULL && side[0] == 'b';
    if (side != NULL && here_active) {
        /* in process: a synchronous fault in the kernel, which jumps back out of it */
        here_active = 0;
        snprintf(here_msg, sizeof here_msg, "pyggml guarded compute: a kernel %s memory %s %s (the first "
                 "faulting access: %s%zu %s)", access, side, r->what, before ? "" : "byte ",
                 distance, before ? "bytes before it" : "past it");
        siglongjmp(here_env, 1);
    }
    if (side != NULL) {
        say("pyggml guarded compute: a kernel ");
        say(access);
        say(" memory ");
        say(side);
        say(" ");
        say(r->what);
        say(before ? " (the first faulting access: " : " (the first faulting access: byte ");
        say_size(distance);
        say(before ? " bytes before it)\n" : " past it)\n");
        _exit(PYGGML_EXIT_GUARD);
    }
    if (here_active) {
        /* not a guard page: the process would die of it; the forked proof's child dies of
         * it (PYGGML_PROOF_SIGNAL with the signal): jump back out, and say the same */
        here_active = 0;
        here_signal = sig;
        siglongjmp(here_env, 1);
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

/* region i's canary byte: distinct for 255 regions in a row, never 0 */
static unsigned char canary_of(int i) {
    return (unsigned char) (1 + (0xA4 + 97 * i) % 255);
}

static int add_region(struct ggml_tensor * t, size_t nbytes, size_t align, const char * what) {
    size_t padded = (nbytes + align - 1) / align * align;
    region * r = &regions[n_regions];
    if (t == NULL || fenced_left > 1) {       /* the last one is the work buffer's */
        size_t body = (padded + page - 1) / page * page;
        if (body == 0) {
            body = page;
        }
        size_t len = body + 2 * page;
        char * map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (map == MAP_FAILED) {
            return -1;
        }
        mprotect(map, page, PROT_NONE);
        mprotect(map + len - page, page, PROT_NONE);
        fenced_left--;
        r->map = map;
        r->map_len = len;
        r->front = map + page;
        r->data = map + len - page - padded;
    } else {
        size_t len = UNFENCED_PAD + padded + UNFENCED_PAD;
        char * map = malloc(len);
        if (map == NULL) {
            return -1;
        }
        r->map = map;
        r->map_len = 0;
        r->front = map;
        r->data = map + UNFENCED_PAD;     /* malloc's alignment (16) + 64: aligned as ggml's */
        padded += UNFENCED_PAD;           /* the slack runs to the end */
    }
    r->canary = canary_of(n_regions++);
    r->nbytes = nbytes;
    r->slack = padded - nbytes;
    memset(r->front, r->canary, (size_t) (r->data - r->front));
    memset(r->data + nbytes, r->canary, r->slack);
    snprintf(r->what, sizeof r->what, "%s", what);
    if (t != NULL) {
        memcpy(r->data, t->data, nbytes);
        t->data = r->data;
    }
    return 0;
}

static void describe(const struct ggml_tensor * t, const char * role, char * out, size_t cap) {
    const char * op = ggml_op_name(t->op);
    snprintf(out, cap, "%s \"%s\" (%s %s ne=(%lld, %lld, %lld, %lld))", role, t->name, op,
             ggml_type_name(t->type), (long long) t->ne[0], (long long) t->ne[1], (long long) t->ne[2],
             (long long) t->ne[3]);
}

/* Moves every tensor the graph reaches into guarded memory (saving where each was): 0,
 * or -1 when out of memory (msg says so; what was moved stays moved until
 * guarded_release). */
static int guarded_prepare(struct ggml_cgraph * graph, char * msg, size_t cap) {
    page = (size_t) sysconf(_SC_PAGESIZE);
    init_fenced_budget();
    msg[0] = '\0';
    regions = NULL;
    n_regions = 0;
    n_moved = 0;
    /* every tensor the graph reaches: nodes, their sources, the bases of views */
    pg_ptrset seen = {0};
    size_t cap_all = 64;
    moved = malloc(cap_all * sizeof *moved);
    if (moved == NULL) {
        snprintf(msg, cap, "guarded compute: out of memory");
        return -1;
    }
    int n_nodes = ggml_graph_n_nodes(graph);
    for (int i = 0; i < n_nodes; i++) {
        struct ggml_tensor * stack[64];
        int sp = 0;
        stack[sp++] = ggml_graph_node(graph, i);
        while (sp > 0) {
            struct ggml_tensor * t = stack[--sp];
            if (t == NULL || pg_ptrset_add(&seen, (uintptr_t) t) != 1) {
                continue;
            }
            if (n_moved == cap_all) {
                struct ggml_tensor ** more = realloc(moved, 2 * cap_all * sizeof *moved);
                if (more == NULL) {
                    pg_ptrset_free(&seen);
                    snprintf(msg, cap, "guarded compute: out of memory");
                    return -1;
                }
                moved = more;
                cap_all *= 2;
            }
            moved[n_moved++] = t;
            for (int j = 0; j < GGML_MAX_SRC && sp < 62; j++) {
                if (t->src[j] != NULL) {
                    stack[sp++] = t->src[j];
                }
            }
            if (t->view_src != NULL && sp < 63) {
                stack[sp++] = t->view_src;
            }
        }
    }
    pg_ptrset_free(&seen);
    moved_from = malloc((n_moved + 1) * sizeof *moved_from);
    regions = calloc(n_moved + 1, sizeof *regions);
    if (moved_from == NULL || regions == NULL) {
        snprintf(msg, cap, "guarded compute: out of memory");
        return -1;
    }
    for (size_t i = 0; i < n_moved; i++) {
        moved_from[i] = moved[i]->data;
    }
    char what[200];
    /* bases first, then views follow their (moved) base; a base of 0 bytes too (a size
       that wrapped): left where it was, a kernel that writes it would run through
       whatever memory follows, gigabytes of the child's copy-on-write heap */
    for (size_t i = 0; i < n_moved; i++) {
        struct ggml_tensor * t = moved[i];
        if (t->view_src == NULL && t->data != NULL) {
            describe(t, t->op == GGML_OP_NONE ? "leaf" : "node", what, sizeof what);
            if (add_region(t, ggml_nbytes(t), ALIGN_DATA, what) != 0) {
                snprintf(msg, cap, "guarded compute: out of memory");
                return -1;
            }
        }
    }
    for (size_t i = 0; i < n_moved; i++) {
        struct ggml_tensor * t = moved[i];
        if (t->view_src != NULL && t->view_src->data != NULL) {
            t->data = (char *) t->view_src->data + t->view_offs;
        }
    }
    return 0;
}

/* A one-thread plan whose work buffer (at least min_work bytes) is guarded too: 0, or -1
 * when out of memory. ggml_graph_plan asserts on some nodes' types. */
static int guarded_plan(struct ggml_cgraph * graph, size_t min_work, struct ggml_cplan * plan) {
    *plan = ggml_graph_plan(graph, 1, NULL);
    size_t work = plan->work_size > min_work ? plan->work_size : min_work;
    if (work > 0) {
        if (add_region(NULL, work, ALIGN_WORK, "the work buffer") != 0) {
            return -1;
        }
        plan->work_data = (uint8_t *) regions[n_regions - 1].data;
    }
    return 0;
}

/* 1 when a kernel damaged a region's canary bytes (msg says which), else 0 */
static int guarded_canaries(char * msg, size_t cap) {
    for (int i = 0; i < n_regions; i++) {
        region * r = &regions[i];
        size_t damaged = 0;
        for (size_t k = 0; k < r->slack; k++) {
            if ((unsigned char) r->data[r->nbytes + k] != r->canary) {
                damaged = k + 1;
            }
        }
        if (damaged) {
            snprintf(msg, cap, "pyggml guarded compute: a kernel wrote %zu bytes past the end of %s",
                     damaged, r->what);
            return 1;
        }
        const unsigned char * front = (const unsigned char *) r->front;
        const size_t n_front = (size_t) ((const unsigned char *) r->data - front);
        for (size_t k = 0; k < n_front; k++) {
            if (front[k] != r->canary) {
                snprintf(msg, cap, "pyggml guarded compute: a kernel wrote %zu bytes before the start of %s",
                         n_front - k, r->what);
                return 1;
            }
        }
    }
    return 0;
}

/* every tensor back to its own memory, the guarded memory given back */
static void guarded_release(void) {
    for (size_t i = 0; moved_from != NULL && i < n_moved; i++) {
        moved[i]->data = moved_from[i];
    }
    for (int i = 0; i < n_regions; i++) {
        region * r = &regions[i];
        if (r->map_len != 0) {
            munmap(r->map, r->map_len);
            fenced_left++;
        } else {
            free(r->map);
        }
    }
    free(regions);
    free(moved);
    free(moved_from);
    regions = NULL;
    moved = NULL;
    moved_from = NULL;
    n_regions = 0;
    n_moved = 0;
}

int pyggml_guarded_compute(struct ggml_cgraph * graph, size_t min_work, char * msg, size_t cap) {
    struct ggml_cplan plan;
    if (guarded_prepare(graph, msg, cap) != 0) {
        return -1;
    }
    if (guarded_plan(graph, min_work, &plan) != 0) {
        snprintf(msg, cap, "guarded compute: out of memory");
        return -1;
    }
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = on_guard_fault;
    action.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &action, NULL);
    sigaction(SIGBUS, &action, NULL);
    ggml_graph_compute(graph, &plan);
    return guarded_canaries(msg, cap);
}

/* SIGALRM: the in-process compute's time limit. The timer is the process's: a signal
 * that lands on another thread is passed on to the computing one, which jumps out. */
static void on_here_alarm(int sig) {
    if (!here_active) {
        return;
    }
    if (!pthread_equal(pthread_self(), here_thread)) {
        pthread_kill(here_thread, sig);
        return;
    }
    here_active = 0;
    here_timed_out = 1;
    siglongjmp(here_env, 1);
}

int pyggml_guarded_compute_here(struct ggml_cgraph * graph, size_t min_work, double timeout_s,
                                pyggml_status * st) {
    static pthread_mutex_t one_at_a_time = PTHREAD_MUTEX_INITIALIZER;
    static struct ggml_cplan plan;      /* static: kept across the jumps back */
    pyggml_status_clear(st);
    pyggml_guard_install();
    pthread_mutex_lock(&one_at_a_time);  /* the regions are the process's */
    if (guarded_prepare(graph, st->msg, sizeof st->msg) != 0) {
        pthread_mutex_unlock(&one_at_a_time);
        guarded_release();
        return pyggml_status_set(st, PYGGML_SYSTEM, ENOMEM, NULL, NULL, "guarded compute: out of memory");
    }
    struct sigaction fault, alarm, previous_alarm;
    memset(&fault, 0, sizeof fault);
    fault.sa_sigaction = on_guard_fault;
    fault.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&fault.sa_mask);
    memset(&alarm, 0, sizeof alarm);
    alarm.sa_handler = on_here_alarm;
    sigemptyset(&alarm.sa_mask);
    for (int i = 0; i < N_HERE_SIGNALS; i++) {
        sigaction(here_signals[i], &fault, &here_previous[i]);
    }
    sigaction(SIGALRM, &alarm, &previous_alarm);
    struct itimerval limit, off;
    memset(&limit, 0, sizeof limit);
    memset(&off, 0, sizeof off);
    limit.it_value.tv_sec = (time_t) timeout_s;
    limit.it_value.tv_usec = (suseconds_t) ((timeout_s - (double) (time_t) timeout_s) * 1e6);
    if (limit.it_value.tv_sec == 0 && limit.it_value.tv_usec == 0) {
        limit.it_value.tv_usec = 1;
    }
    static pyggml_guard g;              /* static: kept across the jumps back */
    static volatile int outcome;        /* 0 ran, 1 a guard page or the time limit, 2 the abort guard,
                                           3 out of memory */
    outcome = 0;
    here_msg[0] = '\0';
    here_timed_out = 0;
    here_signal = 0;
    here_thread = pthread_self();
    pyggml_guard_enter(&g);
    if (sigsetjmp(here_env, 1) == 0) {
        if (setjmp(g.env) == 0) {
            here_active = 1;
            setitimer(ITIMER_REAL, &limit, NULL);
            if (guarded_plan(graph, min_work, &plan) != 0) {
                outcome = 3;
            } else {
                ggml_graph_compute(graph, &plan);
            }
            here_active = 0;
            setitimer(ITIMER_REAL, &off, NULL);
            pyggml_guard_leave(&g);
        } else {                        /* ggml aborted, or a fault that is no guard page's */
            here_active = 0;
            setitimer(ITIMER_REAL, &off, NULL);
            outcome = 2;                /* the guard has left itself */
        }
    } else {
        setitimer(ITIMER_REAL, &off, NULL);
        pyggml_guard_leave(&g);
        outcome = 1;
    }
    for (int i = 0; i < N_HERE_SIGNALS; i++) {
        sigaction(here_signals[i], &here_previous[i], NULL);
    }
    sigaction(SIGALRM, &previous_alarm, NULL);
    if (outcome == 0 && guarded_canaries(st->msg, sizeof st->msg)) {
        st->code = PYGGML_DEFECT;
        st->defect = PG_DEFECT_KERNEL_OUT_OF_BOUNDS;
    }
    guarded_release();
    pthread_mutex_unlock(&one_at_a_time);
    /* each outcome as the forked proof reports it (pyggml_status_from_dry_run) */
    if (outcome == 3) {
        return pyggml_status_set(st, PYGGML_SYSTEM, ENOMEM, NULL, NULL, "guarded compute: out of memory");
    }
    if (outcome == 1 && here_timed_out) {
        return pyggml_status_set(st, PYGGML_PROOF_TIMEOUT, (int) (timeout_s * 1000.0 + 0.5), NULL, NULL,
                                 "the compute ran in this process, and was stopped");
    }
    if (outcome == 1 && here_signal) {
        return pyggml_status_set(st, PYGGML_PROOF_SIGNAL, here_signal, NULL, NULL, "");
    }
    if (outcome == 1) {
        return pyggml_status_set(st, PYGGML_DEFECT, 0, PG_DEFECT_KERNEL_OUT_OF_BOUNDS, NULL, "%s", here_msg);
    }
    if (outcome == 2) {                 /* an abort is SIGABRT, with ggml's message */
        return pyggml_status_set(st, PYGGML_PROOF_SIGNAL, g.signal ? g.signal : SIGABRT, NULL, NULL, "%s",
                                 g.message);
    }
    return st->code;
}

struct prove_args {
    struct ggml_cgraph * graph;
    size_t min_work;
};

static void prove_child(void * p) {
    struct prove_args * a = p;
    char msg[1024];
    int rc = pyggml_guarded_compute(a->graph, a->min_work, msg, sizeof msg);
    if (rc != 0) {
        say(msg);
        say("\n");
        _exit(rc == 1 ? PYGGML_EXIT_OVERRUN : PYGGML_EXIT_NO_MEMORY);
    }
}

int pyggml_prove_graph(struct ggml_cgraph * graph, size_t min_work, double timeout_s, const int * abort,
                       pyggml_status * st) {
    struct prove_args a = {graph, min_work};
    int how = 0;
    const int rc = pyggml_dry_run(prove_child, &a, timeout_s, abort, st->msg, sizeof st->msg, &how);
    return pyggml_status_from_dry_run(st, rc, rc < 0 ? errno : how, timeout_s);
}

/* --- what a proof depends on ------------------------------------------------------------
 * A proof's outcome depends on the graph's structure, not on its values (the kernels'
 * asserts and their reach follow shapes, strides and parameters; index data, which a
 * kernel does follow, is range-checked before every compute instead, and a graph with an
 * index op is proven every time all the same: see _cpu._prove). The signature is that
 * structure, byte for byte: every tensor the graph reaches, numbered in the order of a
 * walk from its nodes (nodes in graph order, then sources, then view bases), each with its
 * type, op, flags, shape, strides, op parameters, whether it has data, and its sources
 * and view base as those numbers (with the view's offset). Two graphs with the same
 * signature give the proof the same tensors, the same sizes and the same work. */

typedef struct sig_buf {
    uint8_t * p;
    size_t n, cap;
    int failed;
} sig_buf;

static void sig_put(sig_buf * b, const void * x, size_t n) {
    if (b->failed) {
        return;
    }
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->n + n) {
            cap *= 2;
        }
        uint8_t * more = realloc(b->p, cap);
        if (more == NULL) {
            b->failed = 1;
            return;
        }
        b->p = more;
        b->cap = cap;
    }
    memcpy(b->p + b->n, x, n);
    b->n += n;
}

typedef struct sig_entry {
    uintptr_t t;
    int32_t index;
} sig_entry;

static int sig_entry_cmp(const void * a, const void * b) {
    const uintptr_t x = ((const sig_entry *) a)->t, y = ((const sig_entry *) b)->t;
    return x < y ? -1 : x > y;
}

static int32_t sig_index(const sig_entry * sorted, size_t n, const struct ggml_tensor * t) {
    if (t == NULL) {
        return -1;
    }
    sig_entry key = {(uintptr_t) t, 0};
    const sig_entry * e = bsearch(&key, sorted, n, sizeof key, sig_entry_cmp);
    return e != NULL ? e->index : -2;    /* (-2 cannot happen: the walk reached every source) */
}

uint8_t * pyggml_graph_signature(struct ggml_cgraph * graph, size_t * len) {
    sig_buf b = {0};
    pg_ptrset seen = {0};
    struct ggml_tensor ** order = NULL, ** stack = NULL;
    size_t n = 0, cap = 0, sp = 0, stack_cap = 0;
    sig_entry * sorted = NULL;
    const int n_nodes = ggml_graph_n_nodes(graph);
    int ok = 1;
    for (int i = 0; i < n_nodes && ok; i++) {
        sp = 0;
        struct ggml_tensor * root = ggml_graph_node(graph, i);
        if (stack_cap == 0) {
            stack_cap = 64;
            stack = malloc(stack_cap * sizeof *stack);
            ok = stack != NULL;
            if (!ok) {
                break;
            }
        }
        stack[sp++] = root;
        while (sp > 0 && ok) {
            struct ggml_tensor * t = stack[--sp];
            int added = t == NULL ? 0 : pg_ptrset_add(&seen, (uintptr_t) t);
            if (added < 0) {
                ok = 0;
                break;
            }
            if (added != 1) {
                continue;
            }
            if (n == cap) {
                cap = cap ? 2 * cap : 64;
                struct ggml_tensor ** more = realloc(order, cap * sizeof *order);
                if (more == NULL) {
                    ok = 0;
                    break;
                }
                order = more;
            }
            order[n++] = t;
            if (sp + GGML_MAX_SRC + 1 > stack_cap) {
                stack_cap = 2 * (sp + GGML_MAX_SRC + 1);
                struct ggml_tensor ** more = realloc(stack, stack_cap * sizeof *stack);
                if (more == NULL) {
                    ok = 0;
                    break;
                }
                stack = more;
            }
            /* pushed in reverse, so that sources are numbered in their order */
            if (t->view_src != NULL) {
                stack[sp++] = t->view_src;
            }
            for (int j = GGML_MAX_SRC - 1; j >= 0; j--) {
                if (t->src[j] != NULL) {
                    stack[sp++] = t->src[j];
                }
            }
        }
    }
    pg_ptrset_free(&seen);
    free(stack);
    if (ok && n > 0) {
        sorted = malloc(n * sizeof *sorted);
        ok = sorted != NULL;
    }
    if (ok) {
        for (size_t i = 0; i < n; i++) {
            sorted[i].t = (uintptr_t) order[i];
            sorted[i].index = (int32_t) i;
        }
        if (n > 0) {
            qsort(sorted, n, sizeof *sorted, sig_entry_cmp);
        }
        const int32_t head[2] = {n_nodes, (int32_t) n};
        sig_put(&b, head, sizeof head);
        for (int i = 0; i < n_nodes; i++) {
            const int32_t at = sig_index(sorted, n, ggml_graph_node(graph, i));
            sig_put(&b, &at, sizeof at);
        }
        for (size_t i = 0; i < n; i++) {
            const struct ggml_tensor * t = order[i];
            const int32_t kind[4] = {(int32_t) t->type, (int32_t) t->op, t->flags, t->data != NULL};
            sig_put(&b, kind, sizeof kind);
            sig_put(&b, t->ne, sizeof t->ne);
            const uint64_t nb[GGML_MAX_DIMS] = {t->nb[0], t->nb[1], t->nb[2], t->nb[3]};
            sig_put(&b, nb, sizeof nb);
            sig_put(&b, t->op_params, sizeof t->op_params);
            int32_t refs[GGML_MAX_SRC + 1];
            for (int j = 0; j < GGML_MAX_SRC; j++) {
                refs[j] = sig_index(sorted, n, t->src[j]);
            }
            refs[GGML_MAX_SRC] = sig_index(sorted, n, t->view_src);
            sig_put(&b, refs, sizeof refs);
            const uint64_t offs = t->view_src != NULL ? (uint64_t) t->view_offs : 0;
            sig_put(&b, &offs, sizeof offs);
        }
    }
    free(order);
    free(sorted);
    if (!ok || b.failed) {
        free(b.p);
        return NULL;
    }
    *len = b.n;
    return b.p;
}
