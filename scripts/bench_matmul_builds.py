#!/usr/bin/env python3
"""Matrix products of two pyggml builds side by side: the same graphs computed by each
build's ggml in its own interpreter, alternating, one thread, CPU time per compute.

Made to measure a build option of ggml's CPU backend (``PYGGML_LLAMAFILE``: llamafile's
sgemm) on the products a transformer block computes: weights (F32, F16, Q8_0, Q4_0) of
``hidden x hidden`` by ``tokens`` activations. Prints, per weight type, each build's
median CPU seconds per product and the ratio B/A (>1: A is faster), with the CPU model.

Run: ``python scripts/bench_matmul_builds.py --a VENV_A/bin/python --b VENV_B/bin/python
[--hidden 1024] [--tokens 128] [--rounds 7]``; ``--dry-run`` runs one tiny round.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CHILD = r"""
import json, sys, time
import numpy as np
import pyggml
hidden, tokens, reps = (int(x) for x in sys.argv[1:4])
rng = np.random.default_rng(0)
out = {"llamafile": pyggml.build_info().get("llamafile"), "times": {}}
with pyggml.Context(1 << 30) as ctx:
    x = ctx.from_numpy(rng.standard_normal((tokens, hidden)).astype(np.float32))
    for name in ("F32", "F16", "Q8_0", "Q4_0"):
        t = pyggml.Type[name]
        w32 = rng.standard_normal((hidden, hidden)).astype(np.float32)
        if t == pyggml.Type.F32:
            w = ctx.from_numpy(w32)
        elif t == pyggml.Type.F16:
            w = ctx.from_numpy(w32.astype(np.float16))
        else:
            w = ctx.from_numpy(pyggml.quantize(t, w32), type=t)
        g = pyggml.Graph(ctx)
        g.build_forward_expand(pyggml.mul_mat(ctx, w, x))
        g.compute(1)                                   # warm: caches, conversions
        times = []
        for _ in range(reps):
            c0 = time.process_time()
            g.compute(1)
            times.append(time.process_time() - c0)
        out["times"][name] = times
print(json.dumps(out))
"""


def run(python: str, hidden: int, tokens: int, reps: int) -> dict:
    proc = subprocess.run([python, "-c", CHILD, str(hidden), str(tokens), str(reps)], capture_output=True,
                          text=True, cwd="/", timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"{python}: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    from pyggml._machine import cpu_model
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", required=True, help="the python of build A")
    ap.add_argument("--b", required=True, help="the python of build B")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=7, help="alternations of A and B")
    ap.add_argument("--dry-run", action="store_true", help="one round of tiny products (a check of the script)")
    args = ap.parse_args()
    hidden, tokens, rounds, reps = ((64, 8, 1, 2) if args.dry_run else (args.hidden, args.tokens, args.rounds, 3))
    times: dict[str, dict[str, list[float]]] = {"A": {}, "B": {}}
    flags = {}
    for _ in range(rounds):
        for label, py in (("A", args.a), ("B", args.b)):
            doc = run(py, hidden, tokens, reps)
            flags[label] = doc["llamafile"]
            for name, ts in doc["times"].items():
                times[label].setdefault(name, []).extend(ts)
    print(f"{cpu_model()}; 1 thread; W[{hidden} x {hidden}] x X[{tokens} x {hidden}]; {rounds} rounds of {reps}, "
          f"A and B alternating; median CPU seconds per product")
    print(f"A: {args.a} (llamafile {flags['A']}); B: {args.b} (llamafile {flags['B']})")
    print(f"{'weights':8s} {'A s':>10s} {'B s':>10s} {'B/A':>7s}")
    for name in times["A"]:
        a, b = statistics.median(times["A"][name]), statistics.median(times["B"][name])
        print(f"{name:8s} {a:10.4f} {b:10.4f} {b / a:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
