/* pyggml's C runtime (libpyggml_rt): what must exist once per process and run without
 * Python objects. Linked by every extension module of pyggml.
 *
 * - abort_guard.c:    the abort guard (a GGML_ASSERT inside a guarded call becomes an
 *                     error return with ggml's message), big stacks, guarded graph calls.
 * - dry_run.c:        the forked dry run (an opt-in safety net for compute).
 * - preconditions.c:  what each CPU kernel needs of its node beyond what the builder
 *                     asserts (types, layouts, parameters), one rule per op.
 * - pyggml_ops.c:     generated from pyggml/ops.txt: one guarded call per graph builder.
 */
#pragma once

#include <setjmp.h>
#include <stddef.h>

#include "ggml.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#  define PYGGML_RT_API __declspec(dllexport)
#else
#  define PYGGML_RT_API __attribute__((visibility("default")))
#endif

#define PYGGML_MSG_CAP 1024

/* --- the outcome of every checked entry point (status.c) --------------------------------
 * Each entry point of this runtime that can refuse or fail fills one pyggml_status and
 * returns its code; pyggml's Cython side maps the record to an exception class in one
 * place (_core's raise_status, from one table). PYGGML_UNCHECKED is not a failure: the
 * node has no rule, and the caller proves its graph another way. */
enum pyggml_code {
    PYGGML_OK = 0,
    PYGGML_REFUSED = 1,         /* a node's kernel would abort or misread it: why in msg */
    PYGGML_UNCHECKED = 2,       /* pyggml has no rule for this node's op of the linked ggml */
    PYGGML_REFUSED_TYPE = 3,    /* a type the node's kernel does not take */
    PYGGML_DEFECT = 4,          /* a known upstream defect: defect is its pyggml.defects id */
    PYGGML_BAD_INDEX = 5,       /* an index out of range, found right before its node (those before ran) */
    PYGGML_NO_SEGMENTS = 6,     /* this ggml cannot compute a graph in segments (nothing ran) */
    PYGGML_ABORTED = 7,         /* ggml aborted (a failed GGML_ASSERT) in a guarded call: msg is its message */
    PYGGML_CRASHED = 8,         /* a guarded call faulted: how is the signal */
    PYGGML_PROOF_SIGNAL = 9,    /* a forked proof's child died of signal how (an abort is SIGABRT) */
    PYGGML_PROOF_EXIT = 10,     /* a forked proof's child exited with status how */
    PYGGML_PROOF_TIMEOUT = 11,  /* a forked proof's child ran past how milliseconds (killed) */
    PYGGML_SYSTEM = 12,         /* fork, pipe or a thread could not be made: how is errno */
    PYGGML_COMPUTE_FAILED = 13, /* ggml's compute returned how, a ggml_status other than success */
    PYGGML_OUT_OF_MEMORY = 14,  /* ggml's C++ threw std::bad_alloc, or pyggml's runtime ran out */
    PYGGML_CXX_EXCEPTION = 15,  /* ggml's C++ threw another exception */
    PYGGML_LACKS = 16,          /* a node asks what the linked ggml lacks (a mode its ggml.h does not define) */
    PYGGML_NO_BACKWARD = 17,    /* ggml's backward pass has no gradient for this node (or this source of it) */
    PYGGML_BAD_FILE = 18,       /* ggml's reader refused a file (a GGUF): msg is what ggml logged */
    PYGGML_CODE_COUNT
};
typedef struct pyggml_status {
    int code;                           /* enum pyggml_code */
    int how;                            /* per code: a signal, an exit status, milliseconds, errno, ggml_status */
    const char * defect;                /* PYGGML_DEFECT: the id (a PG_DEFECT_* string); else NULL */
    const struct ggml_tensor * node;    /* the node a rule refused, or NULL */
    char msg[PYGGML_MSG_CAP];          /* why, in words; "" if nothing more to say */
} pyggml_status;

/* st cleared to PYGGML_OK; returns PYGGML_OK */
PYGGML_RT_API int pyggml_status_clear(pyggml_status * st);
/* st set to code (how, defect, node, and the message fmt): returns code */
PYGGML_RT_API int pyggml_status_set(pyggml_status * st, int code, int how, const char * defect,
                                    const struct ggml_tensor * node, const char * fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 6, 7)))
#endif
    ;
/* a ggml_status (or a PYGGML_STATUS_CXX_* of the nothrow wrappers) into st: returns its code */
PYGGML_RT_API int pyggml_status_from_ggml(pyggml_status * st, int ggml_status);
/* what a nothrow wrapper caught (PYGGML_CXX_*, below) into st: returns its code */
PYGGML_RT_API int pyggml_status_from_cxx(pyggml_status * st, int exception);

/* --- the abort guard ------------------------------------------------------------------
 * ggml reports a failed GGML_ASSERT by calling its abort callback, then abort().
 * pyggml's callback jumps back (longjmp) into the innermost guarded call of the calling
 * thread, if there is one. Only graph builders and graph construction run guarded: plain
 * C that allocates nothing outside its context (a jump out of them leaks at most a few
 * objects in a scratch context pyggml resets). Kernels (C++, OpenMP threads) never run
 * guarded; their preconditions are checked before they run (preconditions.c). */
/* ggml's log, captured: while a capture is open on a thread, what ggml logs on that thread
 * (ggml_log_set's callback, which pyggml installs with the abort guard) goes into buf, cut
 * at cap; everywhere else to stderr, as ggml's own default logger does. Captures nest. */
typedef struct pyggml_log_capture {
    char * buf;
    size_t cap, len;
    struct pyggml_log_capture * prev;
} pyggml_log_capture;
PYGGML_RT_API void pyggml_log_capture_begin(pyggml_log_capture * c, char * buf, size_t cap);
PYGGML_RT_API void pyggml_log_capture_end(pyggml_log_capture * c);

#define PYGGML_LOG_CAP 512

typedef struct pyggml_guard {
    jmp_buf env;
    struct pyggml_guard * prev;
    int signal;                     /* 0, or the signal a guarded call died of (SIGFPE, ...) */
    char message[PYGGML_MSG_CAP];   /* ggml's abort message, when a guarded call aborted */
    char log[PYGGML_LOG_CAP];       /* what ggml logged during the guarded call ("" if nothing) */
    pyggml_log_capture capture;
} pyggml_guard;

/* Install pyggml's abort callback and its handlers for SIGFPE, SIGSEGV, SIGBUS and
 * SIGILL (idempotent). Both act only inside a guarded call of the calling thread (a
 * builder's assertion; a division by zero or a bad pointer in a builder given absurd
 * arguments) and otherwise hand over to what was installed before (the default: the
 * process dies as it would without pyggml). */
PYGGML_RT_API void pyggml_guard_install(void);
/* what ggml logged in a guarded call, its lines joined by "; ", or "" */
PYGGML_RT_API void pyggml_guard_logged(const pyggml_guard * g, char * out, size_t cap);
PYGGML_RT_API void pyggml_guard_enter(pyggml_guard * g);
PYGGML_RT_API void pyggml_guard_leave(pyggml_guard * g);
/* what a guarded call that did not return tells: PYGGML_ABORTED or PYGGML_CRASHED */
PYGGML_RT_API int pyggml_status_from_guard(pyggml_status * st, const pyggml_guard * g);

/* Use as: pyggml_guard_enter(&g); if (setjmp(g.env) == 0) { call; pyggml_guard_leave(&g); ok }
 * else { aborted: g.message }. The setjmp must be in the frame that makes the call. */

/* --- running a call on a thread with a large stack ---------------------------------------
 * ggml walks graphs recursively (ggml_visit_parents_graph): a deep chain of nodes needs
 * a deep C stack. Runs fn(arg) on a new thread with stack_bytes of stack and waits.
 * Returns 0, or an errno value if the thread could not be made. */
PYGGML_RT_API int pyggml_run_on_stack(void (*fn)(void *), void * arg, size_t stack_bytes);

/* --- guarded graph calls ------------------------------------------------------------------
 * ggml_build_forward_expand / ggml_build_backward_expand under the guard, on a thread with
 * stack_bytes of stack when that is not 0 (deep graphs). Return 1 on success, 0 when ggml
 * aborted (g->message), or -errno when the thread could not be made. */
PYGGML_RT_API int pyggml_try_build_forward_expand(pyggml_guard * g, struct ggml_cgraph * graph,
                                                  struct ggml_tensor * tensor, size_t stack_bytes);
PYGGML_RT_API int pyggml_try_build_backward_expand(pyggml_guard * g, struct ggml_context * ctx,
                                                   struct ggml_cgraph * graph, size_t stack_bytes);

/* ggml_graph_plan under the guard (it asserts on some nodes' types): 1, or 0 when ggml
 * aborted (g->message). */
struct ggml_threadpool;
struct ggml_cplan;
PYGGML_RT_API int pyggml_try_graph_plan(pyggml_guard * g, const struct ggml_cgraph * graph, int n_threads,
                                        struct ggml_threadpool * threadpool, struct ggml_cplan * plan);

/* ggml_quantize_chunk of nrows rows of n_per_row floats under the guard: 1, or 0 when
 * ggml aborted (g->message). */
PYGGML_RT_API int pyggml_try_quantize(pyggml_guard * g, int type, const float * src, void * dst, int64_t nrows,
                                      int64_t n_per_row, const float * imatrix);

/* Whether the CPU backend converts F32 rows into `type` (its type traits' from_float, what
 * CPY, SET_ROWS and the matrix products' conversion of src1 call): 1 or 0. */
PYGGML_RT_API int pyggml_type_has_cpu_from_float(int type);

/* --- computing on a worker thread ----------------------------------------------------------
 * So that a caller waiting for a long compute can return at once on Ctrl-C: the compute
 * runs on a worker thread (one that stays: it parks after a job and takes the next, so
 * that an OpenMP compute finds the thread team it made last time); the caller waits in slices (pyggml_async_wait) and checks
 * for signals between them; pyggml_async_abort makes ggml stop after the current node
 * (the plan's abort callback). The clean-up (pyggml: the graph's busy flag, the
 * threadpool, the memory) is done once, by whichever of the two calls
 * pyggml_async_handoff second (it returns 1): the worker calls it before setting done,
 * the caller after its wait, or when it gives up waiting. The worker ends with
 * on_done(on_done_arg, cleanup), cleanup = 1 when the clean-up is its own: a caller that
 * waited to the end always cleans up itself, so the worker takes no GIL then. The struct
 * must live until on_done.
 * What the worker runs: task(task_arg, &abort) when task is set (an epoch of ggml-opt, the
 * blocked attention kernel, which polls abort); else
 * compute(graph, compute_arg) when compute is set (a backend's or a scheduler's graph
 * compute: whoever starts it points the CPU backends' abort callback at
 * pyggml_async_aborted); else ggml_graph_compute(graph, plan). */
#include <pthread.h>
typedef struct pyggml_async {
    struct ggml_cgraph * graph;
    struct ggml_cplan * plan;
    enum ggml_status (*compute)(struct ggml_cgraph * graph, void * arg);
    void * compute_arg;
    void (*task)(void * arg, const int * abort);   /* abort: non-zero once the caller gave up */
    void * task_arg;
    int checked;            /* compute through pyggml_compute_checked (index ops) */
    pyggml_status result;   /* a compute's outcome, valid once done (a task reports its own) */
    void (*on_done)(void *, int cleanup);
    void * on_done_arg;
    int done;
    int abort;
    int handoff;
    int live_released;      /* the worker no longer counts for pyggml_async_drain */
    pthread_mutex_t mu;
    pthread_cond_t cv;
} pyggml_async;

PYGGML_RT_API int pyggml_async_start(pyggml_async * a);          /* 0, or an errno value */
PYGGML_RT_API int pyggml_async_wait(pyggml_async * a, int timeout_ms);   /* 1 when done */
PYGGML_RT_API void pyggml_async_abort(pyggml_async * a);
PYGGML_RT_API int pyggml_async_handoff(pyggml_async * a);
/* a's worker no longer counts for pyggml_async_drain (once, whoever calls first: the
 * worker when it returns, or a caller that abandons a worker that may never return) */
PYGGML_RT_API void pyggml_async_release_live(pyggml_async * a);
/* Wait (at most timeout_ms) until every worker has returned from on_done: at interpreter
 * exit, so that none is still in Python's or Cython's code when the interpreter
 * finalizes (a thread that wants the GIL then is ended in place, its frames abandoned).
 * Returns how many are left. Call with the GIL released. */
PYGGML_RT_API int pyggml_async_drain(int timeout_ms);
/* an abort callback (ggml_abort_callback) for ggml's CPU backend: true once
 * pyggml_async_abort was called on data (a pyggml_async *) */
PYGGML_RT_API bool pyggml_async_aborted(void * data);

/* 1 when the linked ggml-cpu uses OpenMP: a system ggml's build flags are unknown to
 * CMake, but its CPU backend lists OPENMP among its features (an older one without that
 * list: an OpenMP runtime, libgomp, libomp or libiomp, is loaded in the process) */
PYGGML_RT_API int pyggml_openmp_loaded(void);        /* 1: the caller cleans up */

/* --- the forked dry run (a safety net) ---------------------------------------------------
 * Runs fn(arg) in a forked child, which reports ggml's abort message (and log) through
 * a pipe into msg. Returns PYGGML_DRY_OK when the child exited 0; _SIGNAL when it died
 * of signal *how (an abort is SIGABRT); _EXIT when it exited with code *how; _TIMEOUT
 * when it ran longer than timeout_s (it is killed); _ABORTED when *abort (if abort is not
 * NULL) became non-zero while it ran (it is killed: *abort is read every
 * PYGGML_DRY_SLICE_MS); -1 on a system error (errno set).
 * Safe against EINTR; the child is always reaped. Call with the GIL released. */
enum { PYGGML_DRY_OK = 0, PYGGML_DRY_SIGNAL = 1, PYGGML_DRY_EXIT = 2, PYGGML_DRY_TIMEOUT = 3, PYGGML_DRY_ABORTED = 4 };
#define PYGGML_DRY_SLICE_MS 20
/* how long pyggml lets a forked proof run (a graph's, the optimizer's) before it kills it */
#define PYGGML_PROOF_TIMEOUT_S 600.0
PYGGML_RT_API int pyggml_dry_run(void (*fn)(void *), void * arg, double timeout_s, const int * abort,
                                 char * msg, size_t cap, int * how);
/* Calls around every dry run's fork (NULL: none): `before` returns what `after` gets, in
 * the parent only. The ASan build takes the GIL there (pyggml/_cpu.pyx): ASan's allocator,
 * unlike glibc's, keeps the locks another thread held at fork() locked in the child, which
 * then hangs in its first malloc; with the GIL held no Python thread (pytest-xdist's I/O
 * thread, a test's threads) is inside an allocation at the fork. */
PYGGML_RT_API void pyggml_set_fork_hooks(int (*before)(void), void (*after)(int));
/* a dry run's result (rc, how) into st, whose msg holds the child's message: a child of
 * the guarded compute that exited PYGGML_EXIT_GUARD or _OVERRUN is PYGGML_DEFECT
 * "kernel-out-of-bounds"; returns st->code */
PYGGML_RT_API int pyggml_status_from_dry_run(pyggml_status * st, int rc, int how, double timeout_s);

/* --- the guarded compute -------------------------------------------------------------
 * Computes graph on one thread with every tensor's data and the work buffer (at least
 * min_work bytes) moved into memory of its own between PROT_NONE guard pages, with
 * canary bytes up to the back guard. Changes the tensors' data pointers: meant for a
 * forked child. Returns 0; 1 when a kernel wrote past a tensor (msg says which); -1
 * when out of memory. A read or write into a guard page ends the process with
 * _exit(PYGGML_EXIT_GUARD) after writing which tensor to stderr. */
PYGGML_RT_API int pyggml_guarded_compute(struct ggml_cgraph * graph, size_t min_work, char * msg, size_t cap);

/* The proof: pyggml_dry_run of the guarded compute. The child exits PYGGML_EXIT_GUARD
 * when a kernel touched a guard page, PYGGML_EXIT_OVERRUN when it wrote past a tensor's
 * end without reaching one (damaged canary bytes); msg says which tensor. */
enum { PYGGML_EXIT_GUARD = 95, PYGGML_EXIT_NO_MEMORY = 96, PYGGML_EXIT_OVERRUN = 97 };
/* Returns st->code: PYGGML_OK, _DEFECT (kernel-out-of-bounds), _PROOF_*, or _SYSTEM. */
/* abort: as pyggml_dry_run's (NULL: none); a proof run as a pyggml_async task passes the
 * task's, so that a caller's Ctrl-C ends the child within PYGGML_DRY_SLICE_MS. */
PYGGML_RT_API int pyggml_prove_graph(struct ggml_cgraph * graph, size_t min_work, double timeout_s,
                                     const int * abort, pyggml_status * st);

/* The proof in the calling process, for a process that is disposable (a parity sweep's
 * worker): the guarded compute, with a fault on a guard page, an abort of ggml (or
 * another fault, through the abort guard) and the time limit (the process's ITIMER_REAL
 * and SIGALRM, taken for the call) jumping back out of the kernel. Returns st->code, as
 * pyggml_prove_graph's for the same graph (an abort is _PROOF_SIGNAL 6 with ggml's
 * message; the limit, _PROOF_TIMEOUT). Every tensor has its data pointer back after.
 * Any outcome but PYGGML_OK left a kernel abandoned part way (the memory it held, ggml's
 * disposable threadpool): the caller should let the process go. One call at a time. */
PYGGML_RT_API int pyggml_guarded_compute_here(struct ggml_cgraph * graph, size_t min_work, double timeout_s,
                                              pyggml_status * st);

/* What a proof of the graph depends on: its structure, as bytes (malloc'd, *len of them;
 * NULL when out of memory). Two graphs with the same bytes make the same proof
 * (csrc/guarded.c says what goes in); _cpu._prove keeps those it proved. */
PYGGML_RT_API uint8_t * pyggml_graph_signature(struct ggml_cgraph * graph, size_t * len);

/* --- kernel preconditions ----------------------------------------------------------------- */

/* Initialise the op -> rule table from the linked ggml's op names (idempotent). */
PYGGML_RT_API void pyggml_checks_init(void);
/* The rule for node->op (and its unary/glu sub-op): PYGGML_OK, _REFUSED, _REFUSED_TYPE,
 * _DEFECT (a known upstream defect) or _UNCHECKED, in st (st->node = node when refused).
 * Before any rule, and for ops without one, the node's shape: ne >= 0, element and byte
 * counts (and the bytes its strides reach) within int64, else _REFUSED (off, like the
 * rules, while pyggml_checks_set_enabled(0)). */
PYGGML_RT_API int pyggml_check_node(const struct ggml_tensor * node, pyggml_status * st);
/* Index data (indices.c): the source of an op that holds positions into another tensor
 * (GET_ROWS, SET_ROWS, ADD_ID, MUL_MAT_ID, SSM_SCAN, ...), or NULL; and a check of its
 * values, to run right before the node computes: PYGGML_OK, or PYGGML_BAD_INDEX with the
 * first index out of range in st->msg. */
PYGGML_RT_API struct ggml_tensor * pyggml_index_tensor(const struct ggml_tensor * node);
/* The head count of a node whose CPU kernel splits heads over threads (RWKV_WKV6,
 * GATED_LINEAR_ATTN, RWKV_WKV7; rules_recurrent.c), 0 for any other: pyggml.defects
 * "wkv-threads-over-heads" (more threads than heads hang or compute wrong values in 0.9.4). */
PYGGML_RT_API int64_t pyggml_thread_heads(const struct ggml_tensor * node);
PYGGML_RT_API int pyggml_check_indices(const struct ggml_tensor * node, pyggml_status * st);
/* The indices that exist before the graph runs (not computed by it): PYGGML_OK or
 * PYGGML_BAD_INDEX. */
PYGGML_RT_API int pyggml_check_ready_indices(struct ggml_cgraph * graph, pyggml_status * st);
/* ggml_graph_compute, with every index op's indices checked before the node runs: those
 * that exist before the compute first, those the graph computes between segments of it.
 * The outcome in st: PYGGML_OK, _BAD_INDEX (nothing after it ran), _NO_SEGMENTS (this
 * ggml cannot run segments; nothing ran), or ggml's own failure (pyggml_status_from_ggml). */
struct ggml_cplan;
PYGGML_RT_API int pyggml_compute_checked(struct ggml_cgraph * graph, struct ggml_cplan * plan, pyggml_status * st);
/* the same, computing each segment with compute(graph, arg) (a backend's graph compute) */
typedef enum ggml_status (*pyggml_compute_fn)(struct ggml_cgraph * graph, void * arg);
PYGGML_RT_API int pyggml_compute_checked_with(struct ggml_cgraph * graph, pyggml_compute_fn compute, void * arg,
                                              pyggml_status * st);

/* What ggml's backward pass would abort on or get wrong in this forward graph, before it
 * runs: PYGGML_OK; PYGGML_NO_BACKWARD for a node (st->node) that ggml_compute_backward has
 * no gradient for (an op without a case, a source its case does not differentiate, an
 * in-place node); PYGGML_REFUSED_TYPE for a gradient of a type it does not take;
 * PYGGML_DEFECT (st->defect its id) for a known defect (pyggml.defects). */
PYGGML_RT_API int pyggml_check_backward(struct ggml_cgraph * graph, pyggml_status * st);

/* The sources ggml_compute_backward gives a gradient for, on a node of op `op` (a
 * ggml_op_name) and `sub` (the ggml_unary_op_name / ggml_glu_op_name for UNARY / GLU, else
 * NULL): a bit mask (bit j: src j), or -1 where it has no case for the op (it aborts). */
PYGGML_RT_API int pyggml_backward_sources(const char * op, const char * sub);

/* Testing only: with rules disabled every node reads as PYGGML_UNCHECKED (so graphs are
 * proven in a guarded child); returns the previous setting. */
PYGGML_RT_API int pyggml_checks_set_enabled(int enabled);
/* FLASH_ATTN_BACK's batch + GQA overrun (pyggml.defects "fab-batch-gqa-oob") measured
 * absent in the linked ggml (pyggml._fab probes it at import): its rule lets it through */
PYGGML_RT_API void pyggml_set_fab_batch_gqa_fixed(int fixed);
PYGGML_RT_API int pyggml_checks_enabled(void);
/* 1 if pyggml has a rule for this op (and sub-op) of the linked ggml. */
PYGGML_RT_API int pyggml_op_is_checked(int op, int sub_op);
/* Kernel trust (pyggml/_kernels.py): 1 if the build fingerprinted the linked ggml's CPU
 * kernels; 1 if op's kernel is not the one its rule was written against, so that its
 * nodes read PYGGML_UNCHECKED even when the rule passes them (0 for every op of a build
 * that could not fingerprint them: the rules are trusted there, unverified). _set_ (testing
 * only) marks an op and returns the previous mark (-1 for no such op). */
PYGGML_RT_API int pyggml_kernels_known(void);
PYGGML_RT_API int pyggml_kernel_untrusted(int op);
/* op's kernel is trusted by a review of another release's print (kernels.txt), not the pinned
 * one: that release as PG_RELEASE(major, minor, patch) (> 0); 0: not so */
PYGGML_RT_API int pyggml_kernel_reviewed(int op);
PYGGML_RT_API int pyggml_kernel_set_untrusted(int op, int flag);
/* the release op's trusted kernel is from (PG_RELEASE: the review's, else the pinned prints');
 * 0: untrusted, or unknown */
PYGGML_RT_API int pyggml_kernel_release(int op);
/* the release of kernels.txt's pinned prints (PG_RELEASE); 0: unknown */
PYGGML_RT_API int pyggml_kernels_pinned_release(void);
/* testing only: mark op's kernel as reviewed for that release (PG_RELEASE; 0: not reviewed);
 * returns the previous release, -1 for no such op */
PYGGML_RT_API int pyggml_kernel_set_reviewed(int op, int release);
/* The i-th entry of the rule tables (0, 1, ... until it returns 0): the family whose
 * csrc/rules_<family>.c defines it and the op it is for ("ADD", "UNARY:RELU", "GLU:SWIGLU") */
PYGGML_RT_API int pyggml_rule_entry(int i, const char ** family, const char ** name);

/* --- the seed's FLASH_ATTN_BACK node (fab_node.c) ---------------------------------------
 * pyggml's own builder for the row flash_attn_back (impl=pyggml: upstream's aborts). The
 * result packs grad_q, grad_k, grad_v at offs[0..2] (bytes, each padded to GGML_MEM_ALIGN;
 * offs[3] the padded end); _padded adds `extra` F32 elements past the end (the defect
 * probe's room). Shape contract as GGML_ASSERTs; without GGML_OP_FLASH_ATTN_BACK in the
 * linked ggml, the builders abort. */
PYGGML_RT_API void pyggml_flash_attn_back_offsets(const struct ggml_tensor * q, const struct ggml_tensor * k,
                                                  const struct ggml_tensor * v, size_t offs[4]);
PYGGML_RT_API struct ggml_tensor * pyggml_flash_attn_back(struct ggml_context * ctx, struct ggml_tensor * q,
                                                          struct ggml_tensor * k, struct ggml_tensor * v,
                                                          struct ggml_tensor * d, bool masked);
PYGGML_RT_API struct ggml_tensor * pyggml_flash_attn_back_padded(struct ggml_context * ctx, struct ggml_tensor * q,
                                                                 struct ggml_tensor * k, struct ggml_tensor * v,
                                                                 struct ggml_tensor * d, bool masked, int64_t extra);

/* --- FLASH_ATTN_BACK's work buffer (fab_work.cpp) --------------------------------------- */
/* Bytes of work buffer the F32 CPU kernel touches for head size D and M keys on n_threads */
PYGGML_RT_API size_t pyggml_fab_work_bytes(int64_t D, int64_t M, int n_threads);
/* The most any FLASH_ATTN_BACK node of the graph needs on n_threads (0: none) */
PYGGML_RT_API size_t pyggml_graph_fab_work_bytes(struct ggml_cgraph * graph, int n_threads);

/* --- backends (backend.c) ------------------------------------------------------------ */
struct ggml_gallocr;
/* ggml_gallocr_alloc_graph under the abort guard: 1 (and *ok its result), or 0 when it aborted */
PYGGML_RT_API int pyggml_try_gallocr_alloc_graph(pyggml_guard * g, struct ggml_gallocr * galloc,
                                                 struct ggml_cgraph * graph, int * ok);
/* ggml_backend_compare_graph_backend, node by node: each compared node's row (the
 * second backend's result against the first's, after converting both to float) */
typedef struct {
    int index;             /* the node's index in the graph */
    int compared;          /* 0: not compared (a layout the comparison does not read) */
    double nmse;           /* sum((b - a)^2) / sum(a^2), a the first backend's */
    double max_abs;
    int64_t n;             /* elements compared */
} pyggml_node_cmp;
typedef struct {
    pyggml_node_cmp * rows;   /* caller-allocated, one per node */
    int n_rows;
    double tolerance;         /* a node with nmse > tolerance diverges */
    int stop_at_first;        /* stop after the first diverging node */
    int first_diverging;      /* its index, or -1 */
    int failed;               /* 1: could not read a tensor (out of memory) */
} pyggml_graph_cmp;
struct ggml_backend;
/* 1 done, 0 ggml could not copy the graph to the second backend, -1 this ggml has no
 * ggml_backend_compare_graph_backend of the signature pyggml binds */
PYGGML_RT_API int pyggml_compare_graph(struct ggml_backend * b1, struct ggml_backend * b2, struct ggml_cgraph * graph,
                                       pyggml_graph_cmp * state);
/* The blocked attention backward as a graph node (attn_node.c): a GGML_OP_CUSTOM node
 * over srcs q, k, v, d[, lse, o] whose F32 result packs dq, dk, dv at the float offsets
 * pyggml_attn_bwd_offsets gives (offs[3]: dv's end; a scratch may follow). Check the node first:
 * fill a probe with pyggml_attn_bwd_probe and run the rules on it. */
PYGGML_RT_API void pyggml_attn_bwd_offsets(const struct ggml_tensor * q, const struct ggml_tensor * k,
                                           int64_t offs[4]);
PYGGML_RT_API void pyggml_attn_bwd_probe(struct ggml_tensor * probe, struct ggml_tensor ** srcs, int n_srcs,
                                         float scale, int masked, int grouping);
PYGGML_RT_API struct ggml_tensor * pyggml_attn_bwd_node(struct ggml_context * ctx, struct ggml_tensor ** srcs,
                                                        int n_srcs, float scale, int masked, int grouping);
/* how many tensors pyggml_attn_bwd_node makes (2 where its threads need to meet: it returns
 * the second, an in-place view of the first, whose result holds a scratch after dv) */
PYGGML_RT_API int pyggml_attn_bwd_node_count(struct ggml_tensor ** srcs, int n_srcs);
/* a backend's threads per compute through its registry's "ggml_backend_set_n_threads"
 * (ggml's CPU and BLAS backends register one): 1 when set, 0 when it has none */
PYGGML_RT_API int pyggml_backend_set_n_threads(struct ggml_backend * backend, int n_threads);
struct ggml_backend_sched;
/* ggml_backend_sched_alloc_graph under the abort guard: 1 (and *ok its result), or 0 when it aborted */
PYGGML_RT_API int pyggml_try_sched_alloc_graph(pyggml_guard * g, struct ggml_backend_sched * sched,
                                               struct ggml_cgraph * graph, int * ok);

/* ggml-opt: the optimizer-parameter callback (returns *(struct ggml_opt_optimizer_params *)
 * userdata), and a forked dry run of ggml_opt_init + one training batch of dataset */
#include "ggml-opt.h"
PYGGML_RT_API struct ggml_opt_optimizer_params pyggml_opt_params_of(void * userdata);
typedef struct pyggml_opt_probe {
    struct ggml_opt_params params;
    ggml_opt_dataset_t dataset;
    ggml_backend_t cpu;            /* the scheduler's CPU backend: one thread in the child */
} pyggml_opt_probe;
/* the outcome and abort as pyggml_prove_graph's */
PYGGML_RT_API int pyggml_opt_dry_run(pyggml_opt_probe * probe, double timeout_s, const int * abort,
                                     pyggml_status * st);

/* --- no C++ exception crosses into Python (nothrow.cpp) ------------------------------------
 * Each wrapper calls ggml's C++ code in a try block: an exception becomes the error value
 * named (NULL, 0, GGML_STATUS_ALLOC_FAILED) and pyggml_cxx_last_exception() says which
 * (on the calling thread; reset by every wrapper). */
enum { PYGGML_CXX_NONE = 0, PYGGML_CXX_BAD_ALLOC = 1, PYGGML_CXX_OTHER = 2 };
/* the statuses of the compute wrappers when ggml's C++ threw (not ggml_status values) */
enum { PYGGML_STATUS_CXX_BAD_ALLOC = -100, PYGGML_STATUS_CXX_OTHER = -101 };
PYGGML_RT_API int pyggml_cxx_last_exception(void);
PYGGML_RT_API enum ggml_status pyggml_backend_compute_nothrow(struct ggml_cgraph * graph, void * backend);
PYGGML_RT_API enum ggml_status pyggml_sched_compute_nothrow(struct ggml_cgraph * graph, void * sched);
PYGGML_RT_API int pyggml_sched_alloc_graph_nothrow(ggml_backend_sched_t sched, struct ggml_cgraph * graph);
PYGGML_RT_API ggml_backend_sched_t pyggml_sched_new_nothrow(ggml_backend_t * backends, int n_backends,
                                                            size_t graph_size);
PYGGML_RT_API ggml_opt_dataset_t pyggml_opt_dataset_init_nothrow(enum ggml_type type_data, enum ggml_type type_label,
                                                                 int64_t ne_datapoint, int64_t ne_label,
                                                                 int64_t ndata, int64_t ndata_shard);
PYGGML_RT_API ggml_opt_context_t pyggml_opt_init_nothrow(struct ggml_opt_params params);
/* one ggml_opt_epoch, as a pyggml_async task (arg: a pyggml_epoch *); exception: PYGGML_CXX_* */
typedef struct pyggml_epoch {
    ggml_opt_context_t opt;
    ggml_opt_dataset_t dataset;
    ggml_opt_result_t result_train;
    ggml_opt_result_t result_eval;
    int64_t idata_split;
    ggml_opt_epoch_callback callback;
    int exception;
} pyggml_epoch;
PYGGML_RT_API void pyggml_opt_epoch_nothrow(void * arg, const int * abort);
/* ggml-opt over an RPC server: under the abort guard (backend.c); 1, or 0 when ggml aborted */
PYGGML_RT_API int pyggml_try_opt_init(pyggml_guard * g, struct ggml_opt_params params, ggml_opt_context_t * out);
PYGGML_RT_API int pyggml_try_opt_epoch(pyggml_guard * g, pyggml_epoch * e);
PYGGML_RT_API int pyggml_try_opt_reset(pyggml_guard * g, ggml_opt_context_t opt, int optimizer);

/* --- GGUF files (gguf_io.c) -----------------------------------------------------------------
 * ggml's reader (gguf_init_from_file, no_alloc: the metadata and a context of tensor
 * descriptions, *meta, no data) through the nothrow wrapper, under the abort guard, with
 * ggml's log lines of the calling thread captured while it reads. Fills st: PYGGML_OK
 * (*out, *meta set), PYGGML_BAD_FILE (ggml refused the file: msg is what it logged; or
 * its C++ threw, as older readers do for an absurd count in the header),
 * PYGGML_ABORTED/PYGGML_CRASHED (it aborted or faulted). Returns st->code. */
struct gguf_context;
PYGGML_RT_API struct gguf_context * pyggml_gguf_init_nothrow(const char * path, struct ggml_context ** meta);
PYGGML_RT_API int pyggml_gguf_open(const char * path, struct gguf_context ** out, struct ggml_context ** meta,
                                   pyggml_status * st);

/* One key of a GGUF file to write: type a gguf_type; for GGUF_TYPE_ARRAY, arr_type and n
 * elements at data (or n strings at strs); a scalar's value at data (a string's at str). */
typedef struct pyggml_gguf_kv {
    const char * key;
    int type;
    int arr_type;
    const void * data;
    const char * const * strs;
    size_t n;
} pyggml_gguf_kv;
/* ggml's writer (gguf_init_empty, gguf_set_*, gguf_add_tensor, gguf_write_to_file) through
 * the nothrow wrapper, under the abort guard, its log captured: the keys in order, then the
 * tensors (named, contiguous, with data; ggml reads a backend buffer's through
 * ggml_backend_tensor_get). Fills st: PYGGML_OK, PYGGML_BAD_FILE (ggml could not write:
 * msg is what it logged), PYGGML_ABORTED/PYGGML_CRASHED, PYGGML_OUT_OF_MEMORY. */
PYGGML_RT_API int pyggml_gguf_write_nothrow(const pyggml_gguf_kv * kvs, int64_t n_kv,
                                            struct ggml_tensor * const * tensors, int64_t n_tensors,
                                            const char * path);
PYGGML_RT_API int pyggml_gguf_write(const pyggml_gguf_kv * kvs, int64_t n_kv, struct ggml_tensor * const * tensors,
                                    int64_t n_tensors, const char * path, pyggml_status * st);

/* --- ggml's RPC backend (remote.c) -------------------------------------------------------- */
PYGGML_RT_API int pyggml_rpc_built(void);            /* 1 when this ggml has GGML_RPC */
PYGGML_RT_API int pyggml_rpc_protocol(int * major, int * minor, int * patch);
PYGGML_RT_API ggml_backend_t pyggml_rpc_init(const char * endpoint, uint32_t device);
/* ggml_backend_rpc_start_server: returns only when it could not start (0: no GGML_RPC) */
PYGGML_RT_API int pyggml_rpc_serve(const char * endpoint, const char * cache_dir, size_t n_threads,
                                   size_t n_devices, ggml_backend_dev_t * devices);
/* whether the calling thread runs Python (pyggml._core sets it: PyGILState_GetThisThreadState) */
PYGGML_RT_API void pyggml_remote_set_thread_probe(int (*probe)(void));
/* the abort callback's hook: an abort in ggml-rpc on a thread of no Python's parks it */
PYGGML_RT_API void pyggml_remote_park_if_rpc(const char * message);
/* how many threads ggml-rpc failed on so far, and the last one's message */
PYGGML_RT_API unsigned pyggml_remote_faults(char * message, size_t cap);
typedef void (*pyggml_remote_fn)(void * arg);
typedef struct pyggml_remote_job pyggml_remote_job;
/* fn(copy of arg) on a worker; owned (may be NULL) is freed with the job. NULL: *err set */
PYGGML_RT_API pyggml_remote_job * pyggml_remote_start(pyggml_remote_fn fn, const void * arg, size_t size,
                                                      void * owned, int * err);
PYGGML_RT_API int pyggml_remote_wait(pyggml_remote_job * job, int timeout_ms);   /* 1 when done */
/* after done: the job's copy of arg back into arg_out; owned is the caller's to free again */
PYGGML_RT_API void pyggml_remote_finish(pyggml_remote_job * job, void * arg_out);
/* the caller gives up on a job that may never return */
PYGGML_RT_API void pyggml_remote_abandon(pyggml_remote_job * job);

#ifdef __cplusplus
}
#endif
