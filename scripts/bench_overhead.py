#!/usr/bin/env python3
"""Binding overhead: pyggml against the ctypes binding ggml-python, side by side.

Two figures, each the best of several rounds (the minimum is the least noisy
estimate of a cost on a shared machine):

* cycle: a 16 MiB context, two 4-element F32 tensors, add, a graph, compute on
  1 thread, free the context;
* numpy: one tensor-to-numpy call (pyggml: ``Tensor.numpy()``; ggml-python:
  ``ggml.utils.to_numpy``).

ggml-python runs in a subprocess (it loads its own libggml), alternating with
pyggml's rounds so both see the same machine. Give its interpreter with
``--peer-python`` (default: this one, if it can ``import ggml``).

Run: ``python scripts/bench_overhead.py [--peer-python /path/to/venv/bin/python]``
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time

PYGGML_CODE = r"""
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
"""

TIMER = r"""
import json, sys, time
def best(f, n, rounds):
    for _ in range(n // 10):
        f()
    out = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        out = min(out, (time.perf_counter() - t0) / n)
    return out * 1e6
n, rounds = int(sys.argv[1]), int(sys.argv[2])
print(json.dumps({"cycle_us": best(cycle, n, rounds), "numpy_us": best(to_numpy, 10 * n, rounds)}))
"""


def run(python: str, code: str, n: int, rounds: int) -> dict[str, float]:
    # cwd elsewhere: `python -c` puts cwd on sys.path, and the source tree's
    # pyggml/ (which has no compiled _core) would shadow the installed package
    out = subprocess.run([python, "-c", code + TIMER, str(n), str(rounds)], cwd=tempfile.gettempdir(),
                         check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer-python", default=sys.executable,
                    help="interpreter that has ggml-python installed")
    ap.add_argument("-n", type=int, default=20000, help="iterations per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--alternations", type=int, default=3)
    args = ap.parse_args()

    has_peer = subprocess.run([args.peer_python, "-c", "import ggml.utils"], cwd=tempfile.gettempdir(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0
    mine = {"cycle_us": float("inf"), "numpy_us": float("inf")}
    peer = dict(mine)
    t0 = time.perf_counter()
    for _ in range(args.alternations):
        for k, v in run(sys.executable, PYGGML_CODE, args.n, args.rounds).items():
            mine[k] = min(mine[k], v)
        if has_peer:
            for k, v in run(args.peer_python, PEER_CODE, args.n, args.rounds).items():
                peer[k] = min(peer[k], v)

    import pyggml
    print(f"pyggml {pyggml.__version__} (ggml {pyggml.ggml_version()}); best of "
          f"{args.alternations * args.rounds} rounds of {args.n} iterations; "
          f"{time.perf_counter() - t0:.1f} s")
    print(f"{'':28s} {'pyggml':>10s} {'ggml-python':>12s} {'speedup':>8s}")
    for key, label in (("cycle_us", "tiny graph cycle (us)"), ("numpy_us", "tensor -> numpy (us)")):
        if has_peer:
            print(f"{label:28s} {mine[key]:10.3f} {peer[key]:12.3f} {peer[key] / mine[key]:7.1f}x")
        else:
            print(f"{label:28s} {mine[key]:10.3f} {'n/a':>12s} {'n/a':>8s}")
    if not has_peer:
        print(f"(ggml-python is not importable from {args.peer_python}; "
              "install ggml-python==0.0.45 there to compare)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
