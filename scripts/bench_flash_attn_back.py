#!/usr/bin/env python3
"""Attention backward on the CPU, side by side in one run: ggml's FLASH_ATTN_BACK kernel,
pyggml's blocked kernel (without and with the forward's saved log-sum-exp), torch's
scaled_dot_product_attention backward, and the float64 NumPy reference.

The compared systems alternate: in each of ``--repeat`` rounds every kernel runs once at
every thread count, in turn (the order rotated from round to round), so a change in the
machine's speed during the run hits all of them alike. Each time is the median over the
rounds of the CPU time the process spent (``time.process_time``: every thread's), so rates
are per CPU-second: with 2 threads a kernel that scales perfectly shows the same GFLOP/s as
with 1; each ratio between two kernels, or between two thread counts, is the median of its
per-round ratios. GFLOP/s counts the nominal
10*N*M*D*H flops of a backward (half when masked), whatever a kernel really does (the
blocked kernel without lse recomputes the softmax statistics, about 14*N*M*D*H).

Also printed, so that no figure can be read without its machine: the command, the CPU
model (family and model numbers: "AMD EPYC" alone does not tell Zen 3 from Zen 5), the code
path of the blocked kernel (``--isa``: AVX-512 or AVX2+FMA), one core's FMA peak *measured*
on that path (a micro-kernel of independent fused multiply-adds, ``pyggml._attn.fma_peak``:
not the nominal clock times lanes, which misleads where the clock boosts or AVX-512 is
split in halves), the rate of the kernel's own five tile products on buffers that stay in
cache (``pyggml._attn.tile_rate``: what its products reach where memory does not stand in
their way), the single-core SGEMM rate of numpy's BLAS (1024^3, float32) with the
library and the kernel it chose (threadpoolctl, where installed), the ratios to both, the
extra memory each kernel allocates while it runs (one thread; Linux's peak-RSS counter),
and the exponent of cost growth in N. A row's ``lse/tile`` and ``lse/peak`` put the kernel's
rate with saved statistics against the tile products' rate and the FMA peak measured at the
start of each of its rounds (the median of the per-round ratios): this machine's speed may
change between the start of a run and a row. With 1 and more threads in ``--threads``, the wall-time
gain of each thread count over 1 (``--heads 1``: one head, the case the blocked kernel splits
over key or query chunks).

``--node`` adds the blocked kernel as a graph node (``attention_backward_node``, without
saved statistics; ggml's compute threads run it: two nodes where they must meet).

Run: ``python scripts/bench_flash_attn_back.py [--quick] [--repeat 5] [--threads 1,2] [--isa avx2]
[--threads-start-anywhere] [--node]``
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import statistics
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")      # numpy's SGEMM: the single-core rate

import numpy as np  # noqa: E402

import pyggml  # noqa: E402
from pyggml import _attn, reference  # noqa: E402
from pyggml._machine import cpu_model, usable_cores  # noqa: E402

KERNELS = ("ggml", "blocked", "blocked+lse", "torch", "float64")


def timed_median(fn, repeat):
    """(median CPU seconds, median wall seconds) of fn() over ``repeat`` runs, after one
    warm-up run."""
    fn()
    cpu, wall = [], []
    for _ in range(repeat):
        c, w = timed(fn)
        cpu.append(c)
        wall.append(w)
    return statistics.median(cpu), statistics.median(wall)


def timed(fn):
    """(CPU seconds, wall seconds) of one fn()."""
    t0, w0 = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - t0, time.perf_counter() - w0


SETTLE_S = 0.03


def alternated(fns, repeat, settle=SETTLE_S, probes=None):
    """{(system, threads): ([CPU seconds per round], [wall seconds per round])} of the
    functions in ``fns`` ({(system, threads): fn}), and {name: [value per round]} of the
    ``probes`` ({name: fn() -> value}, each called once at the start of every round: the
    ceilings a row's rates are put against, measured in the same rounds, since this
    machine's speed may change between the start of a run and a row). Each round runs every system in turn,
    the order rotated by one every round, so that a change in the machine's speed during
    the run hits all of them alike. Between two systems, a pause of ``settle`` seconds and
    as long of untimed runs of the next at its last thread count: the OpenMP threads of the
    system before (torch's, ggml's) spin some milliseconds after it returns (timed straight
    after torch on a 2-core machine, 2 threads of the blocked kernel at N = 256 ran at
    0.16x the speed of 1), and after the pause the untimed runs wake the next system's
    threads and the CPU (one untimed run of 1 ms left the next run 1.7x slower). Then one
    timed run at each thread count."""
    systems = list(dict.fromkeys(k for k, _ in fns))
    for f in fns.values():
        f()
    out = {n: ([], []) for n in fns}
    probed = {name: [] for name in (probes or {})}
    for r in range(repeat):
        for name, probe in (probes or {}).items():
            probed[name].append(probe())
        for k in systems[r % len(systems):] + systems[:r % len(systems)]:
            mine = [n for n in fns if n[0] == k]
            time.sleep(settle)
            until = time.perf_counter() + settle
            while True:
                fns[mine[-1]]()
                if time.perf_counter() >= until:
                    break
            for n in (mine if r % 2 == 0 else mine[::-1]):
                c, w = timed(fns[n])
                out[n][0].append(c)
                out[n][1].append(w)
    return out, probed


def paired(a, b):
    """The median of the per-round ratios a[i] / b[i]."""
    return statistics.median(x / y for x, y in zip(a, b))


def per_round(flops, seconds, ceilings):
    """The median over rounds of a kernel's rate (flops / seconds, GFLOP/s) over the
    ceiling measured in the same round."""
    return statistics.median(flops / t / 1e9 / c for t, c in zip(seconds, ceilings))


def cpu_median(fn, repeat):
    """Median CPU seconds of fn() over ``repeat`` runs, after one warm-up run."""
    return timed_median(fn, repeat)[0]


def _status_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise OSError(field)


def extra_memory(fn):
    """Peak resident memory fn() adds (bytes), or None: Linux's peak-RSS reset
    (``/proc/self/clear_refs``, 5) before, VmHWM after, against VmRSS before. What
    fn() allocates and frees counts; a result already in place (ggml's, in its
    context) does not."""
    try:
        try:        # give freed heap pages back first, or a re-run reuses resident memory
            ctypes.CDLL(None).malloc_trim(0)
        except (OSError, AttributeError):
            pass
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        base = _status_kb("VmRSS")
        fn()
        return max(0, _status_kb("VmHWM") - base)
    except OSError:
        return None


def forward64(q, k, v, masked):
    """O and the per-row log-sum-exp a forward pass saves (float64, stored as float32)."""
    N, M, D = q.shape[-2], k.shape[-2], q.shape[-1]
    s = (q.astype(np.float64) @ k.astype(np.float64).swapaxes(-1, -2)) / math.sqrt(D)
    if masked:
        s[..., np.arange(M)[None, :] > (M - N) + np.arange(N)[:, None]] = -np.inf
    m = s.max(-1, keepdims=True)
    p = np.exp(s - m)
    lse = m[..., 0] + np.log(p.sum(-1))
    o = (p / p.sum(-1, keepdims=True)) @ v.astype(np.float64)
    return o.astype(np.float32), lse.astype(np.float32)


class Runner:
    """The kernels over one input (B=1), each ready to time (inputs already in place)."""

    def __init__(self, D, N, H, masked, seed=0, node=False):
        rng = np.random.default_rng(seed)
        f = lambda: rng.standard_normal((1, H, N, D), dtype=np.float32)  # noqa: E731
        self.q, self.k, self.v, self.d = f(), f(), f(), f()
        self.masked = masked
        self.scale = 1 / math.sqrt(D)
        self.o, self.lse = forward64(self.q, self.k, self.v, masked)
        self.ctx = pyggml.Context(4 * self.q.size * 8 + (64 << 20))
        tq, tk, td = (self.ctx.from_numpy(x) for x in (self.q, self.k, self.d))
        tv = self.ctx.from_numpy(np.ascontiguousarray(self.v.swapaxes(-1, -2)))
        self.ctx._align_next_data(64)
        r = pyggml.flash_attn_back(self.ctx, tq, tk, tv, td, masked)
        self.graph = pyggml.Graph(self.ctx)
        self.graph.build_forward_expand(r)
        self.torch_state = None
        self.node_ctx = self.node_graph = None
        if node:        # inputs, gradients and the scratch of two nodes (at most 16 D x N floats a head)
            self.node_ctx = pyggml.Context(4 * self.q.size * 7 + 64 * H * (N + 64) * (D + 8) + (1 << 20))
            ts = [self.node_ctx.from_numpy(x) for x in (self.q, self.k, self.v, self.d)]
            grads = pyggml.attention_backward_node(self.node_ctx, *ts, masked=masked)
            self.node_graph = pyggml.Graph(self.node_ctx)
            for t in grads:
                self.node_graph.build_forward_expand(t)

    def close(self):
        self.ctx.close()
        if self.node_ctx is not None:
            self.node_ctx.close()

    def fn(self, kernel, threads):
        if kernel == "ggml":
            return lambda: self.graph.compute(threads)
        if kernel == "node":
            return lambda: self.node_graph.compute(threads)
        if kernel == "blocked":
            return lambda: _attn.blocked_backward(self.q, self.k, self.v, self.d, None, None, self.scale,
                                                  self.masked, 0, threads)
        if kernel == "blocked+lse":
            return lambda: _attn.blocked_backward(self.q, self.k, self.v, self.d, self.lse, self.o, self.scale,
                                                  self.masked, 0, threads)
        if kernel == "float64":
            return lambda: reference.attention_backward(self.q, self.k, self.v, self.d, masked=self.masked)
        if kernel == "torch":
            import torch
            torch.set_num_threads(threads)
            tq, tk, tv = (torch.from_numpy(x).requires_grad_() for x in (self.q, self.k, self.v))
            # N == M here: torch's top-left causal mask is the bottom-right one
            out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=self.masked)
            td = torch.from_numpy(self.d)
            self.torch_state = (tq, tk, tv, out)

            def run():
                for t in (tq, tk, tv):
                    t.grad = None
                out.backward(td, retain_graph=True)
            return run
        raise ValueError(kernel)


def sgemm_rate():
    """numpy float32 matmul, 1024^3, one thread: GFLOP/s per CPU-second."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((1024, 1024), dtype=np.float32) for _ in range(2))
    return 2 * 1024 ** 3 / cpu_median(lambda: a @ b, 5) / 1e9


def blas_info():
    """numpy's BLAS as threadpoolctl reports it ("OpenBLAS 0.3.27, kernel Zen, 1 thread"),
    or what numpy's build says where threadpoolctl is absent."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "threadpoolctl absent: the BLAS kernel unknown (pip install threadpoolctl)"
    libs = [d for d in threadpool_info() if d.get("user_api") == "blas"]
    if not libs:
        return "no BLAS found by threadpoolctl"
    return "; ".join(f"{d.get('internal_api')} {d.get('version')}, kernel {d.get('architecture') or '?'}, "
                     f"{d.get('num_threads')} thread(s)" for d in libs)


def torch_version():
    try:
        import torch
        return torch.__version__
    except ImportError:
        return None


def growth(rows, kernel, D, masked, threads):
    """The exponent p of cost ~ N^p (cost per head, N >= 1024), or None."""
    pts = [(r["N"], r["cpu_s"][kernel] / r["H"]) for r in rows
           if r["D"] == D and r["masked"] == masked and r["threads"] == threads and r["N"] >= 1024
           and r["cpu_s"].get(kernel)]
    if len(pts) < 2:
        return None
    x = np.log([p[0] for p in pts])
    y = np.log([p[1] for p in pts])
    return float(np.polyfit(x, y, 1)[0])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="D=64, N=256 and 512 only (a smoke run)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--D", default="64,128")
    ap.add_argument("--N", default="256,1024,2048,4096")
    ap.add_argument("--heads", type=int, default=None,
                    help="query heads (batch 1; default 8 up to N 1024, 4 up to 2048, else 2)")
    ap.add_argument("--reference-max-n", type=int, default=1024, help="the float64 reference up to this N")
    ap.add_argument("--no-memory", action="store_true", help="skip the memory measurement")
    ap.add_argument("--json", help="write the rows and the summary here")
    ap.add_argument("--isa", default="auto", choices=list(_attn.ISAS),
                    help="the blocked kernel's code path (and the FMA peak's): auto = the best this CPU has")
    ap.add_argument("--threads-start-anywhere", action="store_true",
                    help="the blocked kernel's helper threads start where the scheduler puts them, not on the "
                         "CPUs other than the caller's (an A/B of _attn._set_start_elsewhere)")
    ap.add_argument("--node", action="store_true",
                    help="also the blocked kernel as a graph node (attention_backward_node, no saved statistics)")
    args = ap.parse_args()
    Ds = [64] if args.quick else [int(x) for x in args.D.split(",")]
    Ns = [256, 512] if args.quick else [int(x) for x in args.N.split(",")]
    threads_list = [int(x) for x in args.threads.split(",")]
    has_torch = torch_version() is not None
    kernels = [k for k in KERNELS if k != "torch" or has_torch] + (["node"] if args.node else [])

    isa = _attn.set_isa(args.isa)
    _attn._set_start_elsewhere(not args.threads_start_anywhere)
    sgemm, peak = sgemm_rate(), _attn.fma_peak(isa if isa != "portable" else "auto")
    tile = {D: _attn.tile_rate(D) for D in Ds}
    info = pyggml.build_info()
    print("$ " + " ".join(["python"] + sys.argv))
    print(f"CPU: {cpu_model()}, {usable_cores()} usable core(s), load average {os.getloadavg()[0]:.2f}")
    print(f"pyggml {pyggml.__version__}, ggml {pyggml.ggml_version()} (native={info['native']}), "
          f"torch {torch_version() or 'absent'}; medians of {args.repeat} alternating rounds, per CPU-second")
    print(f"blocked kernel's path: {isa}; FMA peak measured on it: "
          f"{f'{peak:.1f} GFLOP/s per core' if peak else 'none (no FMA path)'}; its helper threads start "
          f"{'where the scheduler puts them' if args.threads_start_anywhere else 'on the CPUs other than the caller'}")
    print(f"numpy SGEMM (1 thread, 1024^3): {sgemm:.1f} GFLOP/s ({blas_info()})")
    print("the blocked kernel's five tile products in cache (_attn.tile_rate): " +
          ", ".join(f"D={D} {r:.1f} GFLOP/s" + (f" ({r / peak * 100:.0f}% of the peak)" if peak else "")
                    for D, r in tile.items()))
    head = (f"{'D':>4} {'N=M':>5} {'H':>2} {'mask':>4} {'thr':>3} | " +
            " ".join(f"{k:>11}" for k in kernels) +
            f" | {'blk/ggml':>8} {'blk/torch':>9} {'lse/torch':>9} {'lse/sgemm':>9} {'lse/tile':>8} {'lse/peak':>8}"
            f" | {'MB ggml':>7} {'MB blk':>7}")
    print("GFLOP/s per CPU-second (nominal flops):")
    print(head)
    print("-" * len(head))
    rows = []
    for D in Ds:
        for N in Ns:
            H = args.heads or (8 if N <= 1024 else (4 if N <= 2048 else 2))
            for masked in (False, True):
                run = Runner(D, N, H, masked, node=args.node)
                flops = 10.0 * N * N * D * H * (0.5 if masked else 1.0)
                mem = {}
                if not args.no_memory:
                    mem = {k: extra_memory(run.fn(k, 1)) for k in ("ggml", "blocked")}
                # every kernel at every thread count, alternating round by round (the
                # float64 reference, slow, once on its own)
                probes = {"tile": lambda: _attn.tile_rate(D, 0.03, 1)}
                if peak:
                    probes["peak"] = lambda: _attn.fma_peak(isa, 0.03, 1)
                samples, probed = alternated({(k, t): run.fn(k, t) for t in threads_list for k in kernels
                                              if k != "float64"}, args.repeat, probes=probes)
                ref = (timed(run.fn("float64", 1)) if "float64" in kernels and N <= args.reference_max_n
                       else None)
                for threads in threads_list:
                    sc = {k: samples[(k, threads)][0] for k in kernels if (k, threads) in samples}
                    cpu = {k: statistics.median(v) for k, v in sc.items()}
                    wall = {k: statistics.median(samples[(k, threads)][1]) for k in sc}
                    if ref is not None:
                        cpu["float64"], wall["float64"] = ref
                    rate = {k: flops / t / 1e9 for k, t in cpu.items()}
                    row = {"D": D, "N": N, "M": N, "H": H, "masked": masked, "threads": threads, "flops": flops,
                           "cpu_s": cpu,
                           "wall_s": wall, "cpu_rounds": sc,
                           "gflops": rate, "extra_bytes": mem,
                           "blocked_over_ggml": paired(sc["ggml"], sc["blocked"]),
                           "blocked_over_torch": paired(sc["torch"], sc["blocked"]) if "torch" in sc else None,
                           "lse_over_torch": paired(sc["torch"], sc["blocked+lse"]) if "torch" in sc else None,
                           "lse_over_sgemm": rate["blocked+lse"] / sgemm,
                           # the kernel's rate in a round over the ceiling measured in that round
                           "lse_over_tile": per_round(flops, sc["blocked+lse"], probed["tile"]),
                           "tile_rounds": probed["tile"], "peak_rounds": probed.get("peak"),
                           "lse_over_peak": per_round(flops, sc["blocked+lse"], probed["peak"]) if peak else None}
                    if threads != 1 and 1 in threads_list:
                        row["gain_over_1_thread"] = {k: paired(samples[(k, 1)][1], samples[(k, threads)][1])
                                                     for k in ("blocked", "blocked+lse", "ggml", "node")
                                                     if (k, threads) in samples}
                    rows.append(row)
                    cells = " ".join(f"{rate[k]:11.1f}" if k in rate else f"{'-':>11}" for k in kernels)
                    x = lambda v, w: f"{v:{w - 1}.2f}x" if v is not None else f"{'-':>{w}}"  # noqa: E731
                    mb = lambda b: f"{b / 2**20:7.1f}" if b is not None else f"{'-':>7}"  # noqa: E731
                    print(f"{D:4d} {N:5d} {H:2d} {'yes' if masked else 'no':>4} {threads:3d} | {cells} | "
                          f"{x(row['blocked_over_ggml'], 8)} {x(row['blocked_over_torch'], 9)} "
                          f"{x(row['lse_over_torch'], 9)} {x(row['lse_over_sgemm'], 9)} "
                          f"{row['lse_over_tile'] * 100:7.0f}% "
                          f"{row['lse_over_peak'] * 100 if peak else 0:7.0f}% | "
                          f"{mb(mem.get('ggml'))} {mb(mem.get('blocked'))}", flush=True)
                run.close()

    print("\ncost growth in N (cost per head ~ N^p, N >= 1024):")
    for D in Ds:
        for masked in (False, True):
            for threads in threads_list:
                ps = {k: growth(rows, k, D, masked, threads) for k in kernels}
                print(f"  D={D} masked={masked!s:5} threads={threads}: " +
                      ", ".join(f"{k} {p:.2f}" for k, p in ps.items() if p is not None))
    more = [t for t in threads_list if t > 1]
    if 1 in threads_list and more:
        print(f"\nwall-time gain of {', '.join(map(str, more))} threads over 1 (T1 / Tn, the median of the "
              "per-round ratios, 1 and n threads alternating; blocked, blocked+lse, ggml" +
              (", node" if args.node else "") + "):")
        for r1 in (r for r in rows if r["threads"] == 1):
            gains = []
            for t in more:
                rn = next(r for r in rows if r["threads"] == t and all(r[k] == r1[k] for k in ("D", "N", "H", "masked")))
                g = rn["gain_over_1_thread"]
                gains.append(f"{t} threads " + " ".join(f"{v:.2f}x" for v in g.values()))
            print(f"  D={r1['D']} N={r1['N']} H={r1['H']} masked={r1['masked']!s:5}: " + "; ".join(gains))
    big = [r for r in rows if r["N"] >= 1024]
    summary = {}
    if big:
        summary = {
            "blocked_over_ggml_min": min(r["blocked_over_ggml"] for r in big),
            "blocked_over_ggml_median": statistics.median(r["blocked_over_ggml"] for r in big),
            "blocked_over_torch_unmasked_min": min((r["blocked_over_torch"] for r in big
                                                    if not r["masked"] and r["blocked_over_torch"]), default=None),
            "blocked_over_torch_masked_min": min((r["blocked_over_torch"] for r in big
                                                  if r["masked"] and r["blocked_over_torch"]), default=None),
            "lse_over_torch_unmasked_min": min((r["lse_over_torch"] for r in big
                                                if not r["masked"] and r["lse_over_torch"]), default=None),
            "lse_over_torch_masked_min": min((r["lse_over_torch"] for r in big
                                              if r["masked"] and r["lse_over_torch"]), default=None),
            "lse_over_sgemm_min_1thread": min((r["lse_over_sgemm"] for r in big if r["threads"] == 1),
                                              default=None),
            "blocked_lse_over_tile_max_1thread": max((r["lse_over_tile"] for r in big if r["threads"] == 1),
                                                     default=None),
            "blocked_lse_over_peak_max_1thread": max((r["lse_over_peak"] for r in big
                                                      if r["threads"] == 1 and r["lse_over_peak"]), default=None),
        }
        print("\nN >= 1024: " + "; ".join(f"{k} {v:.2f}" for k, v in summary.items() if v is not None))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": sys.argv, "cpu": cpu_model(), "isa": isa, "blas": blas_info(),
                       "threads_start_anywhere": args.threads_start_anywhere,
                       "sgemm_gflops": sgemm, "fma_peak_gflops": peak, "tile_gflops": tile, "rows": rows, "summary": summary}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
