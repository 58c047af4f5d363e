#!/usr/bin/env python3
"""Instructions per call of pyggml's per-call paths, for one or more builds side by side.

Timings on a shared 2-core machine drift by several per cent between runs; the number of
instructions a call executes does not. This counts them with valgrind's callgrind: each
benchmark runs twice in a fresh interpreter, with 0 and with N calls, and the difference
divided by N is the cost of one call (start-up, imports and set-up cancel out). Hash
randomisation and numpy's BLAS threads are pinned (PYTHONHASHSEED=0, one thread), so the
same build gives the same counts from run to run.

Benchmarks: ``op`` (``pyggml.add`` of two 4-element F32 tensors, a fresh context every 2,000
calls), ``numpy`` (``Tensor.numpy()``), ``new_tensor`` (``Context.new_tensor(F32, (4, 3))``),
``shape`` (``Tensor.shape``).

Run: ``python scripts/bench_instructions.py [-n 20000] PYTHON [PYTHON ...]``, each PYTHON an
interpreter with a pyggml build installed (the first is the baseline of the ratios).
Needs valgrind.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

CODE = r"""
import sys
import pyggml as g
what, n = sys.argv[1], int(sys.argv[2])
F32 = g.Type.F32
ctx = g.Context(1 << 26)
a = ctx.new_tensor(F32, (4,))
b = ctx.new_tensor(F32, (4,))
if what == "op":
    for i in range(n):
        if i % 2000 == 1999:
            ctx.close()
            ctx = g.Context(1 << 26)
            a = ctx.new_tensor(F32, (4,))
            b = ctx.new_tensor(F32, (4,))
        g.add(ctx, a, b)
elif what == "numpy":
    for i in range(n):
        a.numpy()
elif what == "new_tensor":
    for i in range(n):
        if i % 2000 == 1999:
            ctx.close()
            ctx = g.Context(1 << 26)
        ctx.new_tensor(F32, (4, 3))
elif what == "shape":
    for i in range(n):
        a.shape
"""

BENCHES = ("op", "numpy", "new_tensor", "shape")


def instructions(python: str, what: str, n: int, tmp: str) -> int:
    env = dict(os.environ, PYTHONHASHSEED="0", OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    out = os.path.join(tmp, "callgrind.out")
    # cwd elsewhere: the source tree's pyggml/ (no compiled modules) would shadow the build
    proc = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", python, "-c", CODE,
                           what, str(n)], cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
    m = re.search(r"Collected : (\d+)", proc.stderr)
    if proc.returncode != 0 or m is None:
        sys.exit(f"{python} {what} {n}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    return int(m.group(1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pythons", nargs="+", metavar="PYTHON", help="interpreters, each with a pyggml build")
    ap.add_argument("-n", type=int, default=20000, help="calls per measured run")
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("bench_instructions: needs valgrind")
    table: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for py in args.pythons:
            table[py] = {w: (instructions(py, w, args.n, tmp) - instructions(py, w, 0, tmp)) / args.n
                         for w in BENCHES}
    base = table[args.pythons[0]]
    print(f"instructions per call (callgrind, {args.n} calls against 0); ratio to the first build")
    print(f"{'build':40s}" + "".join(f"{w:>18s}" for w in BENCHES))
    for py, row in table.items():
        cells = "".join(f"{row[w]:>9.0f} ({row[w] / base[w]:.3f})" for w in BENCHES)
        print(f"{py[-40:]:40s}{cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
