/* The guarded compute: a graph computed with every tensor's data (and the work buffer)
 * moved into memory of its own, between two PROT_NONE guard pages: its data ends flush
 * against the back guard (up to 3 bytes short, for 4-byte alignment; the work buffer
 * keeps GGML_MEM_ALIGN), and the bytes from the front guard to its start and from its
 * end to the back guard are filled with a canary byte of that region's own (so a
 * kernel that copies one tensor's canary into another is seen too). Meant for a forked
 * child (pyggml_dry_run): a kernel that reads or writes past a tensor faults on a guard
 * page, or damages a canary, and the child says which tensor before it dies. Past a
 * budget of memory mappings (fenced_left: a graph of tens of thousands of tensors) the
 * remaining tensors get canary bytes only. See pyggml_rt.h. */
#define _GNU_SOURCE
#include <errno.h>
#include "pyggml_rt.h"

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include "ggml-cpu.h"
#include "ptrset.h"

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

static void init_fenced_budget(void) {
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

static void on_guard_fault(int sig, siginfo_t * info, void * context) {
    char * addr = info->si_addr;
    const char * access = "accessed";
#if defined(__x86_64__) && defined(REG_ERR)
    ucontext_t * uc = context;
    access = (uc->uc_mcontext.gregs[REG_ERR] & 2) ? "wrote" : "read";
#else
    (void) context;
#endif
    for (int i = 0; i < n_regions; i++) {
        region * r = &regions[i];
        if (r->map_len == 0) {
            continue;            /* no guard pages */
        }
        if (addr >= r->map && addr < r->map + page) {
            say("pyggml guarded compute: a kernel ");
            say(access);
            say(" memory before the start of ");
            say(r->what);
            say(" (the first faulting access: ");
            say_size((size_t) (r->data - addr));
            say(" bytes before it)\n");
            _exit(PYGGML_EXIT_GUARD);
        }
        if (addr >= r->map + r->map_len - page && addr < r->map + r->map_len) {
            say("pyggml guarded compute: a kernel ");
            say(access);
            say(" memory past the end of ");
            say(r->what);
            say(" (the first faulting access: byte ");
            say_size((size_t) (addr - (r->data + r->nbytes)));
            say(" past it)\n");
            _exit(PYGGML_EXIT_GUARD);
        }
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

int pyggml_guarded_compute(struct ggml_cgraph * graph, size_t min_work, char * msg, size_t cap) {
    page = (size_t) sysconf(_SC_PAGESIZE);
    init_fenced_budget();
    msg[0] = '\0';
    /* every tensor the graph reaches: nodes, their sources, the bases of views */
    pg_ptrset seen = {0};
    size_t n_all = 0, cap_all = 64;
    struct ggml_tensor ** all = malloc(cap_all * sizeof *all);
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
            if (n_all == cap_all) {
                cap_all *= 2;
                all = realloc(all, cap_all * sizeof *all);
            }
            all[n_all++] = t;
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
    regions = calloc(n_all + 1, sizeof *regions);
    char what[200];
    /* bases first, then views follow their (moved) base; a base of 0 bytes too (a size
       that wrapped): left where it was, a kernel that writes it would run through
       whatever memory follows, gigabytes of the child's copy-on-write heap */
    for (size_t i = 0; i < n_all; i++) {
        struct ggml_tensor * t = all[i];
        if (t->view_src == NULL && t->data != NULL) {
            describe(t, t->op == GGML_OP_NONE ? "leaf" : "node", what, sizeof what);
            if (add_region(t, ggml_nbytes(t), ALIGN_DATA, what) != 0) {
                snprintf(msg, cap, "guarded compute: out of memory");
                return -1;
            }
        }
    }
    for (size_t i = 0; i < n_all; i++) {
        struct ggml_tensor * t = all[i];
        if (t->view_src != NULL && t->view_src->data != NULL) {
            t->data = (char *) t->view_src->data + t->view_offs;
        }
    }
    struct ggml_cplan plan = ggml_graph_plan(graph, 1, NULL);
    size_t work = plan.work_size > min_work ? plan.work_size : min_work;
    if (work > 0) {
        add_region(NULL, work, ALIGN_WORK, "the work buffer");
        plan.work_data = (uint8_t *) regions[n_regions - 1].data;
    }
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = on_guard_fault;
    action.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &action, NULL);
    sigaction(SIGBUS, &action, NULL);
    ggml_graph_compute(graph, &plan);
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
