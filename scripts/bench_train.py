#!/usr/bin/env python3
"""Training side by side with torch on one thread: an epoch of ggml-opt (pyggml.opt, its
static graphs, no Python per batch) against the same model, loss, optimizer and batches
in torch (``zero_grad``, forward, ``cross_entropy``, ``backward``, ``AdamW.step`` per batch).

Two models, both a two-layer ReLU MLP trained with AdamW (ggml-opt's defaults: alpha 1e-3,
betas 0.9/0.999, eps 1e-8, no weight decay; torch's AdamW given the same):

* ``digits``: the classifier of tests/test_opt.py, 64-32-10, batch 50, 1,500 points per epoch
  (scikit-learn's 8x8 digits where it is installed, else random points of that shape);
* ``mlp784``: 784-512-10, batch 64, 1,280 random points per epoch.

Each round times one epoch of each (CPU time of this process, ``time.process_time``),
in alternating order; the figures are medians over the rounds, and the ratio is the median
of the rounds' torch/pyggml ratios (above 1: pyggml is faster). With ``mlp784``, the rates of
the CPU backend's two kernels for its first layer's products follow: MUL_MAT (the forward)
and OUT_PROD (the weight gradient ggml's autodiff builds), the step's largest parts.

``--backends BLAS,CPU`` (a build with ``PYGGML_BLAS=ON``) trains through a scheduler over
those backends, as ggml-opt's users with a BLAS do: the matrix products of at least 32 in
each dimension and ``out_prod`` (the gradient of ``mul_mat``'s first argument in ggml's
autodiff) go to BLAS. ``OPENBLAS_NUM_THREADS`` is set to ``--threads`` unless given.

    python scripts/bench_train.py [--rounds 9] [--models digits,mlp784] [--threads 1] [--backends CPU]
                                  [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

MODELS = {  # name: (inputs, hidden, classes, batch, points per epoch)
    "digits": (64, 32, 10, 50, 1500),
    "mlp784": (784, 512, 10, 64, 1280),
}


def data(name: str, rng):
    n_in, _, n_cls, _, n = MODELS[name]
    if name == "digits":
        try:
            from sklearn.datasets import load_digits
            d = load_digits()
            return (d.data[:n] / 16.0).astype(np.float32), np.eye(n_cls, dtype=np.float32)[d.target[:n]]
        except ImportError:
            pass
    x = rng.standard_normal((n, n_in)).astype(np.float32)
    return x, np.eye(n_cls, dtype=np.float32)[rng.integers(0, n_cls, n)]


def init(name: str, rng):
    n_in, hidden, n_cls, _, _ = MODELS[name]
    return {"w1": (rng.standard_normal((hidden, n_in)) / np.sqrt(n_in)).astype(np.float32),
            "b1": np.zeros(hidden, np.float32),
            "w2": (rng.standard_normal((n_cls, hidden)) / np.sqrt(hidden)).astype(np.float32),
            "b2": np.zeros(n_cls, np.float32)}


class Ggml:
    """ggml-opt: the weights in a CPU backend's buffer, the forward graph in a no_alloc
    context, one Optimizer (static graphs), one Dataset."""

    def __init__(self, name, x, y, w, threads, backends):
        import pyggml
        from pyggml import Type, opt
        n_in, hidden, n_cls, batch, n = MODELS[name]
        self.backends = [pyggml.Backend(b, n_threads=threads) for b in backends]
        self.cpu = self.backends[-1]
        self.weights = pyggml.Context(1 << 20, no_alloc=True)
        p = {k: self.weights.new_tensor(Type.F32, v.shape[::-1]) for k, v in w.items()}
        images = self.weights.new_tensor(Type.F32, (n_in, batch))
        for t in p.values():
            pyggml.set_param(t)
        self.cpu.alloc_ctx_tensors(self.weights)
        for k, v in w.items():
            p[k].set(v)
        self.compute = pyggml.Context(64 << 20, no_alloc=True)
        c = self.compute
        h = pyggml.relu(c, pyggml.add(c, pyggml.mul_mat(c, p["w1"], images), p["b1"]))
        logits = pyggml.add(c, pyggml.mul_mat(c, p["w2"], h), p["b2"])
        self.trainer = opt.Optimizer(opt.Scheduler(self.backends), c, images, logits, loss="cross_entropy",
                                     optimizer="adamw")
        self.dataset = opt.Dataset(n, n_in, n_cls)
        self.dataset.data[...] = x
        self.dataset.labels[...] = y
        self.p = p

    def epoch(self) -> float:
        train, _ = self.trainer.epoch(self.dataset)
        return train.loss


class Torch:
    def __init__(self, name, x, y, w, threads, backends):
        import torch
        torch.set_num_threads(threads)
        self.torch = torch
        self.batch = MODELS[name][3]
        lin1 = torch.nn.Linear(*w["w1"].shape[::-1])
        lin2 = torch.nn.Linear(*w["w2"].shape[::-1])
        with torch.no_grad():
            for lin, wk, bk in ((lin1, "w1", "b1"), (lin2, "w2", "b2")):
                lin.weight.copy_(torch.from_numpy(w[wk]))
                lin.bias.copy_(torch.from_numpy(w[bk]))
        self.model = torch.nn.Sequential(lin1, torch.nn.ReLU(), lin2)
        self.optim = torch.optim.AdamW(self.model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                                       weight_decay=0.0)
        self.x = torch.from_numpy(x)
        self.y = torch.from_numpy(y)

    def epoch(self) -> float:
        F = self.torch.nn.functional
        total = 0.0
        n = 0
        for i in range(0, len(self.x), self.batch):
            self.optim.zero_grad(set_to_none=True)
            loss = F.cross_entropy(self.model(self.x[i:i + self.batch]), self.y[i:i + self.batch])
            loss.backward()
            self.optim.step()
            total += loss.item()
            n += 1
        return total / n


def kernel_rates(threads: int, rounds: int) -> dict[str, float]:
    """GFLOP/s of the two products of mlp784's first layer on the CPU backend
    (``Graph.compute``): MUL_MAT, the forward W1·X, and OUT_PROD, the gradient of W1 that
    ggml's autodiff builds for it (what BLAS takes over in a BLAS scheduler); and OUT_PROD's
    milliseconds beside those of the whole forward and backward graph of one batch."""
    import pyggml
    n_in, hidden, _, batch, _ = MODELS["mlp784"]
    rng = np.random.default_rng(1)
    x = rng.standard_normal((batch, n_in)).astype(np.float32)
    w1 = rng.standard_normal((hidden, n_in)).astype(np.float32)
    dh = rng.standard_normal((batch, hidden)).astype(np.float32)
    w2 = rng.standard_normal((MODELS["mlp784"][2], hidden)).astype(np.float32)
    y = np.eye(MODELS["mlp784"][2], dtype=np.float32)[rng.integers(0, MODELS["mlp784"][2], batch)]

    def step(c):        # the MLP's forward and backward, as ggml's autodiff builds it
        p = [c.from_numpy(v) for v in (w1, np.zeros(hidden, np.float32), w2, np.zeros(len(w2), np.float32))]
        for t in p:
            pyggml.set_param(t)
        h = pyggml.relu(c, pyggml.add(c, pyggml.mul_mat(c, p[0], c.from_numpy(x)), p[1]))
        loss = pyggml.cross_entropy_loss(c, pyggml.add(c, pyggml.mul_mat(c, p[2], h), p[3]), c.from_numpy(y))
        pyggml.set_loss(loss)
        return loss
    builds = {"MUL_MAT": lambda c: pyggml.mul_mat(c, c.from_numpy(w1), c.from_numpy(x)),
              "OUT_PROD": lambda c: pyggml.out_prod(c, c.from_numpy(x), c.from_numpy(dh)),
              "step": step}
    ms = {}
    for name, build in builds.items():
        with pyggml.Context(64 << 20) as ctx:
            g = pyggml.Graph(ctx, 1024, grads=name == "step")
            g.build_forward_expand(build(ctx))
            if name == "step":
                g.build_backward_expand()
            g.compute(threads)
            times = []
            for _ in range(max(rounds, 5) * 4):
                t0 = time.process_time()
                g.compute(threads)
                times.append(time.process_time() - t0)
        ms[name] = statistics.median(times) * 1e3
    flop = 2 * n_in * hidden * batch
    return {"MUL_MAT": flop / ms["MUL_MAT"] / 1e6, "OUT_PROD": flop / ms["OUT_PROD"] / 1e6,
            "OUT_PROD_ms": ms["OUT_PROD"], "forward_backward_ms": ms["step"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--models", default="digits,mlp784")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--backends", default="CPU", help="the scheduler's backends, CPU last (e.g. BLAS,CPU)")
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args()
    backends = args.backends.split(",")
    if backends[-1] != "CPU":
        sys.exit("bench_train: --backends must end with CPU (ggml-opt's scheduler needs it last)")
    os.environ.setdefault("OPENBLAS_NUM_THREADS", str(args.threads))   # before libopenblas loads
    import pyggml
    from pyggml._machine import cpu_model
    have = [d["name"] for d in pyggml.backends()]
    for b in backends:
        if b not in have:
            sys.exit(f"bench_train: this pyggml has no {b} backend (it has {', '.join(have)})")
    models = args.models.split(",")
    for m in models:
        if m not in MODELS:
            sys.exit(f"bench_train: unknown model {m!r} (known: {', '.join(MODELS)})")
    try:
        import torch
    except ImportError:
        sys.exit("bench_train: torch is not installed (pip install -e '.[torch]')")
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; threads {args.threads}; torch {torch.__version__}, "
          f"pyggml {pyggml.__version__} (ggml {pyggml.ggml_version()}); pyggml's backends {','.join(backends)}")
    print(f"{'model':8} {'pyggml ms/epoch':>16} {'torch ms/epoch':>15} {'torch/pyggml':>13}  "
          f"{'ms/step (pyggml, torch)':>24}  final loss (pyggml, torch)")
    doc = {"cpu": cpu_model(), "threads": args.threads, "backends": backends, "models": {}}
    for m in models:
        rng = np.random.default_rng(0)
        x, y = data(m, rng)
        w = init(m, rng)
        runners = {"pyggml": Ggml(m, x, y, w, args.threads, backends), "torch": Torch(m, x, y, w, args.threads, backends)}
        times = {k: [] for k in runners}
        losses = {}
        for r in runners.values():                      # warm-up: first-touch, allocator, torch's dispatch
            r.epoch()
        for i in range(args.rounds):
            for k in (("pyggml", "torch") if i % 2 == 0 else ("torch", "pyggml")):
                t0 = time.process_time()
                losses[k] = runners[k].epoch()
                times[k].append(time.process_time() - t0)
        ratio = statistics.median(t / g for g, t in zip(times["pyggml"], times["torch"]))
        g, t = (statistics.median(times[k]) * 1e3 for k in ("pyggml", "torch"))
        steps = MODELS[m][4] // MODELS[m][3]
        print(f"{m:8} {g:16.2f} {t:15.2f} {ratio:13.2f}  {g / steps:11.3f} {t / steps:11.3f}  "
              f"{losses['pyggml']:.4f} {losses['torch']:.4f}")
        doc["models"][m] = {"pyggml_ms": g, "torch_ms": t, "torch_over_pyggml": ratio,
                            "loss_pyggml": losses["pyggml"], "loss_torch": losses["torch"]}
    if "mlp784" in models:
        r = kernel_rates(args.threads, args.rounds)
        print(f"CPU backend, mlp784's first layer ({MODELS['mlp784'][0]}x{MODELS['mlp784'][1]}, batch "
              f"{MODELS['mlp784'][3]}): MUL_MAT (forward) {r['MUL_MAT']:.1f} GFLOP/s, OUT_PROD (its weight "
              f"gradient in ggml's autodiff) {r['OUT_PROD']:.1f} GFLOP/s: {r['OUT_PROD_ms']:.2f} ms of the forward "
              f"and backward's {r['forward_backward_ms']:.2f} ms (Graph.compute, without the optimizer)")
        doc["cpu_backend_kernels"] = r
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
