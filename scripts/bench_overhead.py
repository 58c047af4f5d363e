#!/usr/bin/env python3
"""Binding overhead: pyggml against the same calls from C and against the ctypes
binding ggml-python, side by side in one run.

Figures (each the best of several rounds: the minimum is the least noisy estimate of
a cost on a shared machine), per call in microseconds:

* cycle: a 16 MiB context, two 4-element F32 tensors, add, a graph, compute on 1
  thread, free the context;
* numpy: one tensor-to-numpy call (pyggml ``Tensor.numpy()``; ggml-python
  ``ggml.utils.to_numpy``);
* from_numpy: a tensor holding a copy of a 1,000-element float32 array (C: a new
  tensor and a memcpy), in a context reused every 200 tensors on both sides;
* shape / ne: the two shape properties of a Tensor.

Each is measured with small rounds (400 calls: the working set stays in cache) and
large ones (20,000 calls: these mostly measure the allocator and cache misses, and
even the C calls slow down there). The C figures come from a small program built
here against the same libggml pyggml loaded (needs a C compiler; skipped otherwise);
ggml-python runs in its own interpreter (``--peer-python``), alternating with pyggml.

The C cycle is timed a second time inside the pyggml process (the same source built as
a shared library, one ctypes call per round): the same C calls cost more in a Python
process that has imported numpy. numpy's wheel bundles libquadmath, whose constructor
registers printf hooks, and with hooks registered glibc formats every ``snprintf`` on
its slow positional path (51 against 85 ns for ``"node_%d"`` on a Zen 3, measured with
and without that library loaded); ``ggml_build_forward_expand`` names each new node and
leaf with one. pyggml's ratio is given against both.

Run: ``python scripts/bench_overhead.py [--peer-python /path/to/venv/bin/python]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

PYGGML_CODE = r"""
import numpy as np
import pyggml as g
F32 = g.Type.F32
def cycle():
    ctx = g.Context(16 * 1024 * 1024)
    a = ctx.new_tensor(F32, (4,))
    b = ctx.new_tensor(F32, (4,))
    c = g.add(ctx, a, b)
    gf = g.Graph(ctx)
    gf.build_forward_expand(c)
    gf.compute(1)
    ctx.close()
_ctx = g.Context(1024 * 1024)
_t = _ctx.new_tensor(F32, (4,))
def to_numpy():
    _t.numpy()
_arr = np.arange(1000, dtype=np.float32)
_fill = [g.Context(1 << 20), 0]
def from_numpy():
    # a context reused every 200 tensors, as the C side resets its own: warm memory
    if _fill[1] == 200:
        _fill[0].close()
        _fill[0] = g.Context(1 << 20)
        _fill[1] = 0
    _fill[1] += 1
    _fill[0].from_numpy(_arr)
def shape():
    _t.shape
def ne():
    _t.ne
BENCH = {"cycle": cycle, "numpy": to_numpy, "from_numpy": from_numpy, "shape": shape, "ne": ne}
"""

PEER_CODE = r"""
import ggml, ggml.utils
def cycle():
    params = ggml.ggml_init_params(mem_size=16 * 1024 * 1024, mem_buffer=None)
    ctx = ggml.ggml_init(params)
    a = ggml.ggml_new_tensor_1d(ctx, ggml.GGML_TYPE_F32, 4)
    b = ggml.ggml_new_tensor_1d(ctx, ggml.GGML_TYPE_F32, 4)
    c = ggml.ggml_add(ctx, a, b)
    gf = ggml.ggml_new_graph(ctx)
    ggml.ggml_build_forward_expand(gf, c)
    ggml.ggml_graph_compute_with_ctx(ctx, gf, 1)
    ggml.ggml_free(ctx)
_ctx = ggml.ggml_init(ggml.ggml_init_params(mem_size=1024 * 1024, mem_buffer=None))
_t = ggml.ggml_new_tensor_1d(_ctx, ggml.GGML_TYPE_F32, 4)
def to_numpy():
    ggml.utils.to_numpy(_t)
BENCH = {"cycle": cycle, "numpy": to_numpy}
"""

TIMER = r"""
import json, sys, time
def best(f, n, rounds):
    for _ in range(n // 10 + 1):
        f()
    out = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        out = min(out, (time.perf_counter() - t0) / n)
    return out * 1e6
n_small, n_large, rounds = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
res = {f"{k}@{n}": best(f, n, rounds if n == n_large else 25 * rounds)
       for k, f in BENCH.items() for n in (n_small, n_large)}
if len(sys.argv) > 4:      # the C cycle again, in this process (ctypes: one call per round)
    import ctypes
    lib = ctypes.CDLL(sys.argv[4])
    lib.bench_cycle.restype, lib.bench_cycle.argtypes = ctypes.c_double, [ctypes.c_int, ctypes.c_int]
    for n in (n_small, n_large):
        res[f"cycle_c@{n}"] = lib.bench_cycle(n, rounds if n == n_large else 25 * rounds)
print(json.dumps(res))
"""

C_CODE = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "ggml.h"
#include "ggml-cpu.h"
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
static struct ggml_threadpool * tp;
static struct ggml_context * big;
static float src[1000];
static void cycle(void) {
    void * mem = aligned_alloc(64, 16 << 20);
    struct ggml_init_params ip = {16 << 20, mem, false};
    struct ggml_context * ctx = ggml_init(ip);
    struct ggml_tensor * a = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 4);
    struct ggml_tensor * b = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 4);
    struct ggml_tensor * c = ggml_add(ctx, a, b);
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, c);
    struct ggml_cplan plan = ggml_graph_plan(gf, 1, tp);
    ggml_graph_compute(gf, &plan);
    ggml_free(ctx);
    free(mem);
}
static int filled;
static void from_numpy(void) {
    if (filled == 200) {
        ggml_reset(big);
        filled = 0;
    }
    filled++;
    struct ggml_tensor * t = ggml_new_tensor_1d(big, GGML_TYPE_F32, 1000);
    memcpy(t->data, src, sizeof src);
}
static double best(void (*f)(void), int n, int rounds) {
    double out = 1e9;
    for (int r = 0; r < rounds; r++) {
        double t0 = now();
        for (int i = 0; i < n; i++) f();
        double dt = (now() - t0) / n;
        if (dt < out) out = dt;
    }
    return out * 1e6;
}
static void setup(void) {
    struct ggml_threadpool_params p = ggml_threadpool_params_default(1);
    tp = ggml_threadpool_new(&p);
    struct ggml_init_params bp = {(size_t) 1 << 20, NULL, false};
    big = ggml_init(bp);
}
#ifdef PYGGML_C_LIBRARY
/* the same calls, timed inside the Python process that runs pyggml (through ctypes) */
double bench_cycle(int n, int rounds) {
    if (tp == NULL) setup();
    return best(cycle, n, rounds);
}
#else
int main(int argc, char ** argv) {
    int n_small = atoi(argv[1]), n_large = atoi(argv[2]), rounds = atoi(argv[3]);
    setup();
    printf("{\"cycle@%d\": %f, \"cycle@%d\": %f, ", n_small, best(cycle, n_small, 25 * rounds),
           n_large, best(cycle, n_large, rounds));
    printf("\"from_numpy@%d\": %f, ", n_small, best(from_numpy, n_small, 25 * rounds));
    printf("\"from_numpy@%d\": %f}\n", n_large, best(from_numpy, n_large, rounds));
    return 0;
}
#endif
"""


def run(python: str, code: str, n_small: int, n_large: int, rounds: int, c_library: str | None = None
        ) -> dict[str, float]:
    # cwd elsewhere: `python -c` puts cwd on sys.path, and the source tree's
    # pyggml/ (which has no compiled modules) would shadow the installed package
    extra = [c_library] if c_library else []
    out = subprocess.run([python, "-c", code + TIMER, str(n_small), str(n_large), str(rounds), *extra],
                         cwd=tempfile.gettempdir(), check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def build_c(tmp: str, shared: bool = False) -> str | None:
    """The C program (or, ``shared``, the library for ctypes), against the libggml pyggml
    uses; None without a compiler or headers."""
    from pyggml._machine import build_c_program
    return build_c_program(C_CODE, tmp, "bench", shared=shared)


def merge(into: dict[str, float], new: dict[str, float]) -> None:
    for k, v in new.items():
        into[k] = min(into.get(k, float("inf")), v)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer-python", default=sys.executable, help="interpreter that has ggml-python installed")
    ap.add_argument("--small", type=int, default=400, help="calls per small round")
    ap.add_argument("-n", type=int, default=20000, help="calls per large round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--alternations", type=int, default=3)
    ap.add_argument("--json", help="write the figures (microseconds per call) and the ratios here too")
    args = ap.parse_args()

    has_peer = subprocess.run([args.peer_python, "-c", "import ggml.utils"], cwd=tempfile.gettempdir(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0
    mine: dict[str, float] = {}
    peer: dict[str, float] = {}
    cres: dict[str, float] = {}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        exe = build_c(tmp)
        lib = build_c(tmp, shared=True) if exe else None
        for _ in range(args.alternations):
            merge(mine, run(sys.executable, PYGGML_CODE, args.small, args.n, args.rounds, lib))
            if has_peer:
                merge(peer, run(args.peer_python, PEER_CODE, args.small, args.n, args.rounds))
            if exe:
                out = subprocess.run([exe, str(args.small), str(args.n), str(args.rounds)], check=True,
                                     stdout=subprocess.PIPE, text=True).stdout
                merge(cres, json.loads(out))

    import pyggml
    from pyggml._machine import cpu_model
    print("$ " + " ".join(["python"] + sys.argv))
    print(f"CPU: {cpu_model()}, load average {os.getloadavg()[0]:.2f}")
    print(f"pyggml {pyggml.__version__} (ggml {pyggml.ggml_version()}); best of {args.alternations} x "
          f"{args.rounds} rounds ({args.small}-call rounds: 25x as many); {time.perf_counter() - t0:.1f} s")
    print(f"{'per call (us)':30s} {'C':>8s} {'pyggml':>8s} {'ggml-python':>12s} {'pyggml/C':>9s} {'peer/pyggml':>12s}")

    def fmt(d, k):
        return f"{d[k]:.3f}" if k in d else "n/a"

    rows = [("cycle", "tiny graph cycle"), ("numpy", "tensor -> numpy"),
            ("from_numpy", "from_numpy, 1000 float32"), ("shape", "Tensor.shape"), ("ne", "Tensor.ne")]
    for n in (args.small, args.n):
        for key, label in rows:
            k = f"{key}@{n}"
            if k not in mine:
                continue
            vs_c = f"{mine[k] / cres[k]:.2f}x" if k in cres else "n/a"
            vs_peer = f"{peer[k] / mine[k]:.2f}x" if k in peer else "n/a"
            print(f"{label + f' ({n})':30s} {fmt(cres, k):>8s} {fmt(mine, k):>8s} {fmt(peer, k):>12s} "
                  f"{vs_c:>9s} {vs_peer:>12s}")
    for n in (args.small, args.n):
        k = f"cycle_c@{n}"
        if k in mine:
            print(f"{f'tiny graph cycle ({n}), C in the pyggml process':48s} {mine[k]:8.3f} "
                  f"pyggml/C there: {mine[f'cycle@{n}'] / mine[k]:.2f}x")
    k = f"shape@{args.small}"
    print(f"Tensor.shape / Tensor.ne: {mine[k] / mine[f'ne@{args.small}']:.2f}x")
    if args.json:
        ratios = {f"{key}@{n}": mine[f"{key}@{n}"] / cres[f"{key}@{n}"] for n in (args.small, args.n)
                  for key, _ in rows if f"{key}@{n}" in mine and f"{key}@{n}" in cres}
        ratios.update({f"cycle_in_process@{n}": mine[f"cycle@{n}"] / mine[f"cycle_c@{n}"]
                       for n in (args.small, args.n) if f"cycle_c@{n}" in mine})
        with open(args.json, "w") as f:
            json.dump({"command": sys.argv, "cpu": cpu_model(), "pyggml_us": mine, "c_us": cres, "peer_us": peer,
                       "pyggml_over_c": ratios}, f, indent=1)
    if not has_peer:
        print(f"(ggml-python is not importable from {args.peer_python}; "
              "install ggml-python==0.0.45 there to compare)")
    if not cres:
        print("(no C compiler or no vendor/ggml headers: C figures skipped)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
