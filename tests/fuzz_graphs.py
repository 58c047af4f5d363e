"""Random graphs through the public API, for tests/test_fuzz.py.

Run as ``python fuzz_graphs.py SEED ITERATIONS``: builds random tensors (types,
shapes, strides), random ops on them, random forward and backward graphs,
computes them on 1 to 3 threads, closes contexts at random moments, and reads
results back. Every outcome must be a value or a Python exception: the process
must exit 0. A ggml abort or a segfault shows as a non-zero exit.
"""

import random
import sys

import numpy as np

import pyggml as g  # noqa: E402

T = g.Type
EXPECTED = (ValueError, TypeError, MemoryError, RuntimeError)
UNARY = ["sqr", "sqrt", "sum", "mean", "soft_max", "transpose", "cont", "scale", "diag_mask_inf",
         "permute", "reshape_nd", "view_nd"]
BINARY = ["add", "sub", "mul", "div", "mul_mat", "cpy", "repeat", "reshape"]


def rshape(rnd):
    return tuple(rnd.choice([1, 1, 2, 3, 4, 5, 8]) for _ in range(rnd.randint(1, 4)))


def unary(rnd, ctx, a, op):
    if op == "scale":
        return g.scale(ctx, a, rnd.uniform(-2, 2))
    if op == "diag_mask_inf":
        return g.diag_mask_inf(ctx, a, rnd.randint(-1, 4))
    if op == "permute":
        ax = [0, 1, 2, 3]
        rnd.shuffle(ax)
        return g.permute(ctx, a, *ax)
    if op == "reshape_nd":
        n = a.nelements
        ne = [n] if rnd.random() < 0.5 else [1, n]
        return (g.reshape_1d(ctx, a, *ne) if len(ne) == 1 else g.reshape_2d(ctx, a, *ne))
    if op == "view_nd":
        k = rnd.randint(1, 4)
        ne = [rnd.randint(0, 4) for _ in range(k)]
        nb = [rnd.choice([0, 4, 8, 12, 16, 32, 64, 100]) for _ in range(k - 1)]
        return getattr(g, f"view_{k}d")(ctx, a, *ne, *nb, rnd.choice([0, 4, 8, 16, 2]))
    return getattr(g, op)(ctx, a)


def one(rnd, it):
    ctxs = [g.Context(rnd.choice([1 << 12, 1 << 16, 1 << 22]), no_alloc=rnd.random() < 0.1)
            for _ in range(rnd.randint(1, 2))]
    pool = []
    for _ in range(3):
        ctx = rnd.choice(ctxs)
        try:
            t = ctx.new_tensor(rnd.choice([T.F32, T.F32, T.F32, T.F16, T.BF16, T.I32]), rshape(rnd))
            if rnd.random() < 0.5:
                g.set_param(t)
            if t.type == T.F32 and not ctx.no_alloc:
                t.numpy()[...] = np.random.default_rng(it).standard_normal(t.numpy().shape)
            pool.append(t)
        except EXPECTED:
            pass
    if not pool:
        return
    for _ in range(10):
        ctx = rnd.choice(ctxs)
        a, b = rnd.choice(pool), rnd.choice(pool)
        try:
            if rnd.random() < 0.1:
                q, k, v, d = (rnd.choice(pool) for _ in range(4))
                r = g.flash_attn_back(ctx, q, k, v, d, rnd.random() < 0.5)
            elif rnd.random() < 0.1:
                D, N, M, H, KVH, B = (rnd.randint(1, 3) for _ in range(6))
                ts = [ctx.new_tensor(T.F32, ne) for ne in ((D, N, H * KVH, B), (D, M + N - 1, KVH, B),
                                                           (M + N - 1, D, KVH, B), (D, N, H * KVH, B))]
                r = g.flash_attn_back(ctx, *ts, rnd.random() < 0.5)
                pool.extend(ts)
            elif rnd.random() < 0.55:
                r = unary(rnd, ctx, a, rnd.choice(UNARY))
            else:
                r = getattr(g, rnd.choice(BINARY))(ctx, a, b)
            pool.append(r)
        except EXPECTED:
            pass
    gctx = rnd.choice(ctxs)
    try:
        graph = g.Graph(gctx, rnd.choice([4, 16, 256]), grads=rnd.random() < 0.5)
    except EXPECTED:
        return
    for t in pool[3:]:
        try:
            graph.build_forward_expand(t)
        except EXPECTED:
            pass
    if graph.grads and rnd.random() < 0.7:
        try:
            loss = g.sum(gctx, rnd.choice(pool))
            g.set_loss(loss)
            graph.build_forward_expand(loss)
            graph.build_backward_expand()
        except EXPECTED:
            pass
    if rnd.random() < 0.1:
        rnd.choice(ctxs).close()
    try:
        graph.compute(rnd.choice([1, 2, 3]))
    except EXPECTED:
        pass
    for t in pool:
        try:
            t.numpy().sum()
            graph.grad(t)
        except EXPECTED:
            pass
    for c in ctxs:
        c.close()


def main(seed, iterations):
    rnd = random.Random(seed)
    for it in range(iterations):
        one(rnd, it)
    print("ok", seed)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
