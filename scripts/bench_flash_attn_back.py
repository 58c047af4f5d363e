#!/usr/bin/env python3
"""FLASH_ATTN_BACK through pyggml: kernel time, end-to-end time, and peers.

For each case prints the graph compute time alone (the kernel, inputs already in
ggml tensors), the end-to-end ``pyggml.attention_backward`` time (numpy in,
numpy out), their ratio, GFLOP/s (10*N*M*D*H flops per backward, half when
masked), and, when available, torch's CPU ``scaled_dot_product_attention``
backward and the float64 NumPy reference on the same inputs. Times are the
best of ``--repeat`` runs, all measured in this one run.

Run: ``python scripts/bench_flash_attn_back.py [--threads 2] [--repeat 3] [--quick]``
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

import pyggml
from pyggml import reference


def best_of(fn, repeat):
    fn()                                   # warm up (allocations, threads, caches)
    t = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        t = min(t, time.perf_counter() - t0)
    return t


def inputs(B, H, N, M, D, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, H, N, D), dtype=np.float32)
    k = rng.standard_normal((B, H, M, D), dtype=np.float32)
    v = rng.standard_normal((B, H, M, D), dtype=np.float32)
    d = rng.standard_normal((B, H, N, D), dtype=np.float32)
    return q, k, v, d


def kernel_and_e2e(q, k, v, d, masked, threads, repeat):
    """Best times of the graph compute alone and of attention_backward, measured
    alternately so that both see the same machine (it is shared and noisy)."""
    mem = 4 * (q.size + k.size + v.size + d.size) * 2 + (64 << 20)
    with pyggml.Context(mem) as ctx:
        tq, tk, td = ctx.from_numpy(q), ctx.from_numpy(k), ctx.from_numpy(d)
        tv = ctx.from_numpy(np.ascontiguousarray(v.swapaxes(-1, -2)))
        ctx._align_next_data(64)       # the result on a cache line, as attention_backward has it
        r = pyggml.flash_attn_back(ctx, tq, tk, tv, td, masked)
        graph = pyggml.Graph(ctx)
        graph.build_forward_expand(r)
        t_kernel = t_e2e = float("inf")
        for _ in range(repeat):
            t_kernel = min(t_kernel, best_of(lambda: graph.compute(threads), 1))
            t_e2e = min(t_e2e, best_of(lambda: pyggml.attention_backward(
                q, k, v, d, masked=masked, n_threads=threads), 1))
        return t_kernel, t_e2e


def torch_backward(q, k, v, d, masked, threads, repeat):
    try:
        import torch
    except ImportError:
        return None, None
    torch.set_num_threads(threads)
    tq, tk, tv = (torch.from_numpy(x).requires_grad_() for x in (q, k, v))
    td = torch.from_numpy(d)

    def run():
        for t in (tq, tk, tv):
            t.grad = None
        out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=masked)
        out.backward(td)

    # torch's is_causal aligns the mask top-left (j > i); same as ggml's only for N == M
    return best_of(run, repeat), torch.__version__


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="only the smaller case")
    ap.add_argument("--no-reference", action="store_true", help="skip the NumPy float64 reference")
    args = ap.parse_args()

    cases = [(64, 512, 8), (128, 1024, 8)]
    if args.quick:
        cases = cases[:1]
    print(f"pyggml {pyggml.__version__}, ggml {pyggml.ggml_version()}, {args.threads} threads, "
          f"best of {args.repeat}; build: native={pyggml.build_info()['native']} "
          f"openmp={pyggml.build_info()['openmp']}")
    head = (f"{'D':>4} {'N=M':>5} {'H':>2} {'masked':>6} | {'kernel s':>9} {'GFLOP/s':>8} | "
            f"{'e2e s':>8} {'e2e/kern':>8} | {'torch s':>8} {'GFLOP/s':>8} {'e2e/torch':>9} | {'numpy s':>8}")
    print(head)
    print("-" * len(head))
    worst = 0.0
    torch_version = None
    for D, NM, H in cases:
        q, k, v, d = inputs(1, H, NM, NM, D)
        for masked in (False, True):
            flops = 10.0 * NM * NM * D * H * (0.5 if masked else 1.0)
            t_kernel, t_e2e = kernel_and_e2e(q, k, v, d, masked, args.threads, args.repeat)
            worst = max(worst, t_e2e / t_kernel)
            t_torch, torch_version = torch_backward(q, k, v, d, masked, args.threads, args.repeat)
            t_ref = None if args.no_reference else best_of(
                lambda: reference.attention_backward(q, k, v, d, masked=masked), 1)
            torch_cols = (f"{t_torch:8.3f} {flops / t_torch / 1e9:8.1f} {t_e2e / t_torch:8.2f}x"
                          if t_torch else f"{'n/a':>8} {'n/a':>8} {'n/a':>9}")
            print(f"{D:4d} {NM:5d} {H:2d} {str(masked):>6} | {t_kernel:9.4f} {flops / t_kernel / 1e9:8.1f} | "
                  f"{t_e2e:8.4f} {t_e2e / t_kernel:7.3f}x | {torch_cols} | "
                  + (f"{t_ref:8.3f}" if t_ref is not None else f"{'n/a':>8}"))
    print(f"worst end-to-end / kernel ratio: {worst:.3f}x (goal: <= 1.10x)")
    print(f"torch: {torch_version or 'not importable'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
