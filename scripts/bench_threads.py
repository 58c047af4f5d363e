#!/usr/bin/env python3
"""Threads: does a compute through pyggml gain from a second thread as ggml's own does?

The same graphs computed side by side in one run, alternating, on 1 and on N threads:

* C, from a thread that stays (the program's main thread, as llama.cpp computes);
* C, from a new thread per compute (what pyggml did before its workers stayed: with
  OpenMP, the thread that starts a parallel region is its team's master, and libgomp's
  team was slow for a master that is new every time);
* pyggml ``Graph.compute(n)`` (a worker thread that stays, so Ctrl-C reaches the caller);
* pyggml ``Backend("CPU", n_threads=n).graph_compute``.

Graphs: ``matmul``, one F32 product 2048x2048 by 2048x64 (compute-bound, one node); and
``decode``, 12 blocks of a matrix-vector product (1024x1024 F32), RMS norm and GELU: many
small nodes, each a barrier, as a decoded token's graph has.

Printed: per graph and system the median wall time per compute, the median CPU time, and
the gain of N threads over 1 (T1 / TN, per system); then pyggml against C from a thread
that stays. The C programs are built here against the libggml pyggml loaded (a C
compiler and the vendored headers: skipped without them).

Run: ``python scripts/bench_threads.py [--threads 2] [--repeat 40] [--rounds 3]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

C_CODE = r"""
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "ggml.h"
#include "ggml-cpu.h"

static double now(int clock) {
    struct timespec t;
    clock_gettime(clock, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
struct job { struct ggml_cgraph * g; struct ggml_cplan * p; };
static void * run(void * a) {
    struct job * j = a;
    ggml_graph_compute(j->g, j->p);
    return NULL;
}
static void fill(struct ggml_tensor * t) {
    float * d = t->data;
    for (int64_t i = 0; i < ggml_nelements(t); i++) d[i] = (float) ((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
}
int main(int argc, char ** argv) {
    const int graph = atoi(argv[1]), fresh = atoi(argv[2]), nt = atoi(argv[3]), reps = atoi(argv[4]);
    struct ggml_init_params ip = {256u << 20, NULL, false};
    struct ggml_context * ctx = ggml_init(ip);
    struct ggml_cgraph * g = ggml_new_graph(ctx);
    if (graph == 0) {
        struct ggml_tensor * w = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 2048, 2048);
        struct ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 2048, 64);
        fill(w); fill(x);
        ggml_build_forward_expand(g, ggml_mul_mat(ctx, w, x));
    } else {
        struct ggml_tensor * x = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 1024);
        fill(x);
        for (int l = 0; l < 12; l++) {
            struct ggml_tensor * w = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 1024, 1024);
            fill(w);
            x = ggml_gelu(ctx, ggml_rms_norm(ctx, ggml_mul_mat(ctx, w, x), 1e-6f));
        }
        ggml_build_forward_expand(g, x);
    }
    struct ggml_threadpool_params tpp = ggml_threadpool_params_default(nt);
    struct ggml_threadpool * tp = ggml_threadpool_new(&tpp);
    struct ggml_cplan p = ggml_graph_plan(g, nt, tp);
    p.work_data = malloc(p.work_size + 64);
    printf("{\"wall\": [");
    double * cpu = malloc(sizeof(double) * reps);
    for (int r = 0; r < reps; r++) {
        const double t0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_PROCESS_CPUTIME_ID);
        if (fresh) {
            pthread_t th;
            struct job j = {g, &p};
            pthread_create(&th, NULL, run, &j);
            pthread_join(th, NULL);
        } else {
            ggml_graph_compute(g, &p);
        }
        cpu[r] = now(CLOCK_PROCESS_CPUTIME_ID) - c0;
        printf("%s%.9f", r ? ", " : "", now(CLOCK_MONOTONIC) - t0);
    }
    printf("], \"cpu\": [");
    for (int r = 0; r < reps; r++) printf("%s%.9f", r ? ", " : "", cpu[r]);
    printf("]}\n");
    ggml_threadpool_free(tp);
    ggml_free(ctx);
    return 0;
}
"""

GRAPHS = ("matmul", "decode")
SYSTEMS = ("C, thread that stays", "C, new thread per compute", "pyggml Graph.compute", "pyggml Backend")


def build_c(tmp: str) -> str | None:
    """The C program, against the libggml pyggml uses; None without a compiler or headers."""
    from pyggml._machine import build_c_program
    return build_c_program(C_CODE, tmp, "threads")


def pyggml_graph(ctx, which: str):
    """The same graph as the C program's, built with pyggml (same fill)."""
    import numpy as np

    import pyggml

    def filled(shape):
        n = int(np.prod(shape))
        i = np.arange(n, dtype=np.uint64)
        return (((i * np.uint64(2654435761)) % np.uint64(2**32)) % np.uint64(1000)).astype(np.float32) \
            .reshape(shape) / np.float32(1000) - np.float32(0.5)

    g = pyggml.Graph(ctx)
    if which == "matmul":
        w = ctx.from_numpy(filled((2048, 2048)))
        x = ctx.from_numpy(filled((64, 2048)))
        g.build_forward_expand(pyggml.mul_mat(ctx, w, x))
    else:
        x = ctx.from_numpy(filled((1024,)))
        for _ in range(12):
            w = ctx.from_numpy(filled((1024, 1024)))
            x = pyggml.gelu(ctx, pyggml.rms_norm(ctx, pyggml.mul_mat(ctx, w, x), 1e-6))
        g.build_forward_expand(x)
    return g


def time_pyggml(which: str, system: str, n_threads: int, reps: int) -> dict[str, list[float]]:
    import pyggml

    wall, cpu = [], []
    with pyggml.Context(256 << 20) as ctx:
        g = pyggml_graph(ctx, which)
        backend = pyggml.Backend("CPU", n_threads=n_threads) if system == "pyggml Backend" else None
        try:
            for _ in range(reps):
                t0, c0 = time.perf_counter(), time.process_time()
                if backend is None:
                    g.compute(n_threads)
                else:
                    backend.graph_compute(g)
                cpu.append(time.process_time() - c0)
                wall.append(time.perf_counter() - t0)
        finally:
            if backend is not None:
                backend.close()
    return {"wall": wall, "cpu": cpu}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2, help="the thread count compared with 1")
    ap.add_argument("--repeat", type=int, default=40, help="computes per measurement (the first 5 dropped)")
    ap.add_argument("--rounds", type=int, default=3, help="alternations of every system")
    ap.add_argument("--json", help="write the raw medians here")
    args = ap.parse_args()

    import pyggml
    from pyggml._machine import cpu_model

    runs: dict[tuple[str, str, int], list[float]] = {}
    cpus: dict[tuple[str, str, int], list[float]] = {}
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        exe = build_c(tmp)
        systems = SYSTEMS if exe else SYSTEMS[2:]
        for _ in range(args.rounds):
            for which in GRAPHS:
                for n in (1, args.threads):
                    for system in systems:
                        if system.startswith("C"):
                            assert exe is not None
                            out = subprocess.run(
                                [exe, str(GRAPHS.index(which)), "1" if "new thread" in system else "0", str(n),
                                 str(args.repeat)], check=True, stdout=subprocess.PIPE, text=True).stdout
                            r = json.loads(out)
                        else:
                            r = time_pyggml(which, system, n, args.repeat)
                        runs.setdefault((which, system, n), []).extend(r["wall"][5:])
                        cpus.setdefault((which, system, n), []).extend(r["cpu"][5:])

    def med(d, key):
        return statistics.median(d[key]) * 1e3

    print("$ " + " ".join(["python"] + sys.argv))
    print(f"CPU: {cpu_model()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    print(f"pyggml {pyggml.__version__} (ggml {pyggml.ggml_version()}, OpenMP {pyggml.build_info()['openmp']}); "
          f"medians of {args.rounds} x {args.repeat - 5} computes; {time.perf_counter() - t_start:.1f} s")
    n = args.threads
    report = {}
    for which in GRAPHS:
        print(f"\n{which}: ms per compute (wall; CPU in brackets)")
        print(f"  {'system':28s} {'1 thread':>16s} {f'{n} threads':>16s} {f'T1/T{n}':>7s}")
        for system in systems:
            w1, wn = med(runs, (which, system, 1)), med(runs, (which, system, n))
            c1, cn = med(cpus, (which, system, 1)), med(cpus, (which, system, n))
            report[f"{which}/{system}"] = {"wall_1": w1, f"wall_{n}": wn, "cpu_1": c1, f"cpu_{n}": cn}
            print(f"  {system:28s} {w1:7.2f} ({c1:6.2f}) {wn:7.2f} ({cn:6.2f}) {w1 / wn:6.2f}x")
        if exe:
            ref = "C, thread that stays"
            for system in SYSTEMS[2:]:
                print(f"  {system} / C (thread that stays), {n} threads: "
                      f"{med(runs, (which, system, n)) / med(runs, (which, ref, n)):.2f}x the time")
    if not exe:
        print("(no C compiler or no vendor/ggml headers: C figures skipped)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
