/* The forked dry run: a call run first in a forked child. See pyggml_rt.h. */
#define _GNU_SOURCE
#include "pyggml_rt.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* --- the forked dry run ----------------------------------------------------------------------- */

static int child_fd = -1;

static void child_write(const char * s) {
    size_t n = strlen(s);
    while (n > 0) {
        ssize_t w = write(child_fd, s, n);
        if (w < 0 && errno == EINTR) {
            continue;
        }
        if (w <= 0) {
            return;
        }
        s += w;
        n -= (size_t) w;
    }
}

static void child_abort_callback(const char * message) {
    child_write(message);
    child_write("\n");
}

static void child_log_callback(enum ggml_log_level level, const char * text, void * user_data) {
    (void) level;
    (void) user_data;
    child_write(text);
}

static int (*fork_before)(void) = NULL;
static void (*fork_after)(int) = NULL;

void pyggml_set_fork_hooks(int (*before)(void), void (*after)(int)) {
    fork_before = before;
    fork_after = after;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + 1e-9 * (double) ts.tv_nsec;
}

static pid_t wait_child(pid_t pid, int * status) {
    pid_t r;
    do {
        r = waitpid(pid, status, 0);
    } while (r < 0 && errno == EINTR);
    return r;
}

int pyggml_dry_run(void (*fn)(void *), void * arg, double timeout_s, const int * abort, char * msg, size_t cap,
                   int * how) {
    int fds[2];
    size_t used = 0;
    int status = 0, timed_out = 0, aborted = 0;
    if (cap > 0) {
        msg[0] = '\0';
    }
    *how = 0;
    if (pipe(fds) != 0) {
        return -1;
    }
    int (*before)(void) = fork_before;
    void (*after)(int) = fork_after;
    const int held = before != NULL ? before() : 0;
    pid_t pid = fork();
    if (pid != 0 && after != NULL) {
        int e = errno;
        after(held);
        errno = e;
    }
    if (pid < 0) {
        int e = errno;
        close(fds[0]);
        close(fds[1]);
        errno = e;
        return -1;
    }
    if (pid == 0) {                      /* the child: C only, then _exit */
        static const int fatal[] = {SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL};
        sigset_t all;
        close(fds[0]);
        child_fd = fds[1];
        dup2(fds[1], 2);
        /* the parent's fatal-signal handlers (faulthandler) would report the child's
         * expected abort as a crash of the interpreter */
        for (size_t i = 0; i < sizeof fatal / sizeof fatal[0]; i++) {
            signal(fatal[i], SIG_DFL);
        }
        sigemptyset(&all);
        sigprocmask(SIG_SETMASK, &all, NULL);
        ggml_set_abort_callback(child_abort_callback);
        ggml_log_set(child_log_callback, NULL);
        fn(arg);
        _exit(0);
    }
    close(fds[1]);
    double deadline = now_s() + timeout_s;
    for (;;) {
        struct pollfd p = {fds[0], POLLIN, 0};
        double left = deadline - now_s();
        if (left <= 0) {
            timed_out = 1;
            kill(pid, SIGKILL);
            break;
        }
        if (abort != NULL && __atomic_load_n(abort, __ATOMIC_RELAXED)) {
            aborted = 1;                 /* the caller gave up (Ctrl-C): the child goes too */
            kill(pid, SIGKILL);
            break;
        }
        int slice = (int) (left * 1000) + 1;
        if (abort != NULL && slice > PYGGML_DRY_SLICE_MS) {
            slice = PYGGML_DRY_SLICE_MS;
        }
        int r = poll(&p, 1, slice);
        if (r < 0) {
            if (errno == EINTR) {
                continue;
            }
            kill(pid, SIGKILL);
            break;
        }
        if (r == 0) {
            continue;                    /* the deadline is checked above */
        }
        char buf[512];
        ssize_t n = read(fds[0], buf, sizeof buf);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            break;                       /* EOF: the child exited (or closed stderr) */
        }
        if (cap > 1 && used < cap - 1) {
            size_t k = (size_t) n < cap - 1 - used ? (size_t) n : cap - 1 - used;
            memcpy(msg + used, buf, k);
            used += k;
            msg[used] = '\0';
        }
    }
    close(fds[0]);
    if (wait_child(pid, &status) < 0) {
        return -1;
    }
    if (timed_out) {
        return PYGGML_DRY_TIMEOUT;
    }
    if (aborted) {
        return PYGGML_DRY_ABORTED;
    }
    if (WIFEXITED(status)) {
        *how = WEXITSTATUS(status);
        return WEXITSTATUS(status) == 0 ? PYGGML_DRY_OK : PYGGML_DRY_EXIT;
    }
    *how = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    return PYGGML_DRY_SIGNAL;
}
