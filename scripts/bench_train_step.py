#!/usr/bin/env python3
"""The cost of a training step built from scratch: context, forward graph of a small MLP,
``build_backward_expand``, and the first compute, as a training loop that rebuilds its
graph pays it. Two ways, alternated in one run, medians:

* ``checked``: pyggml's default: every node (the backward-only ops ggml inserts too)
  checked against its kernel rule in-process; no fork;
* ``forked proof``: the same step with the graph first proven in a forked child (every
  tensor between guard pages), as pyggml did for every backward graph before the kernel
  rules covered the backward ops (``pyggml._cpu.prove``), and still does for a node
  without a rule.

    python scripts/bench_train_step.py [--rounds 15] [--hidden 64]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

import pyggml
from pyggml import _cpu
from pyggml._machine import cpu_model


def step(X, Y, init, prove):
    with pyggml.Context(32 * 2**20) as ctx:
        p = {k: ctx.from_numpy(v) for k, v in init.items()}
        for t in p.values():
            pyggml.set_param(t)
        h = pyggml.silu(ctx, pyggml.add(ctx, pyggml.mul_mat(ctx, p["w1"], ctx.from_numpy(X)), p["b1"]))
        logits = pyggml.add(ctx, pyggml.mul_mat(ctx, p["w2"], h), p["b2"])
        loss = pyggml.cross_entropy_loss(ctx, logits, ctx.from_numpy(Y))
        pyggml.set_loss(loss)
        g = pyggml.Graph(ctx, 256, grads=True)
        g.build_forward_expand(loss)
        g.build_backward_expand()
        if prove:
            _cpu.prove(g)
        g.compute(1)
        return float(loss.numpy()[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--hidden", type=int, default=64)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    n_in, n_cls, B = 32, 10, 128
    X = rng.standard_normal((B, n_in)).astype(np.float32)
    Y = np.eye(n_cls, dtype=np.float32)[rng.integers(0, n_cls, B)]
    init = {"w1": rng.standard_normal((args.hidden, n_in)).astype(np.float32) / 6,
            "b1": np.zeros(args.hidden, np.float32),
            "w2": rng.standard_normal((n_cls, args.hidden)).astype(np.float32) / 8,
            "b2": np.zeros(n_cls, np.float32)}
    assert step(X, Y, init, False) == step(X, Y, init, True)
    times: dict[str, list[float]] = {"checked": [], "forked proof": []}
    for _ in range(args.rounds):
        for name, prove in (("checked", False), ("forked proof", True)):
            t0 = time.perf_counter()
            step(X, Y, init, prove)
            times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    print("$ " + " ".join(["python"] + sys.argv))
    print(f"CPU: {cpu_model()}, load average {os.getloadavg()[0]:.2f}")
    print(f"pyggml {pyggml.__version__} (ggml {pyggml.ggml_version()}); MLP {n_in}-{args.hidden}-{n_cls}, "
          f"batch {B}; median of {args.rounds} rounds, alternated")
    for k, v in med.items():
        print(f"  {k:14s} {v * 1e3:8.2f} ms per step (context, forward, backward, first compute)")
    print(f"  forked proof / checked: {med['forked proof'] / med['checked']:.1f}x")


if __name__ == "__main__":
    main()
