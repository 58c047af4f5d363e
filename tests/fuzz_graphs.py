"""Random graphs through the public API, for tests/test_fuzz.py.

Run as ``python fuzz_graphs.py SEED ITERATIONS [OP ...]``: builds random tensors
(types, shapes, strides, views), calls random ops of the op table
(``pyggml._optable``: every builder this build binds, with arguments drawn from
each parameter's C type, NULL where the table allows it, and absurd values now and
then), builds forward and backward graphs, computes them on 1 to 3 threads, closes
contexts at random moments, and reads results back. Every outcome must be a value or
a Python exception: the process must exit 0. A ggml abort or a segfault shows as a
non-zero exit. With OP names, only those ops are drawn.
"""

import os
import random
import sys

import numpy as np

import pyggml as g
from pyggml import _optable

T = g.Type
EXPECTED = (g.GGMLError, ValueError, TypeError, MemoryError)
TYPES = [T.F32, T.F32, T.F32, T.F32, T.F16, T.BF16, T.I32, T.Q8_0, T.Q4_0]
ENUMS = {"enum ggml_type": T, "enum ggml_glu_op": g.GluOp, "enum ggml_unary_op": g.UnaryOp,
         "enum ggml_op_pool": g.OpPool, "enum ggml_scale_mode": g.ScaleMode,
         "enum ggml_sort_order": g.SortOrder, "enum ggml_tri_type": g.TriType}
OPS = [r for r in _optable.OPS if r["available"]]
REPORT = bool(os.environ.get("PYGGML_FUZZ_REPORT"))


def rshape(rnd):
    return tuple(rnd.choice([1, 1, 2, 3, 4, 5, 8, 32]) for _ in range(rnd.randint(1, 4)))


def new_tensor(rnd, ctx, it):
    typ = rnd.choice(TYPES)
    ne = list(rshape(rnd))
    if typ.is_quantized:
        ne[0] = typ.blck_size * rnd.randint(1, 2)
    t = ctx.new_tensor(typ, ne)
    if not ctx.no_alloc and not typ.is_quantized:
        a = t.numpy()
        a[...] = (np.random.default_rng(it).standard_normal(a.shape) * 3).astype(a.dtype)
    elif not ctx.no_alloc:
        t.blocks()[...] = 0
    return t


def view_of(rnd, ctx, t):
    """A permuted, transposed or strided view of t (or t)."""
    r = rnd.random()
    if r < 0.2:
        ax = [0, 1, 2, 3]
        rnd.shuffle(ax)
        return g.permute(ctx, t, *ax)
    if r < 0.3:
        return g.transpose(ctx, t)
    if r < 0.4 and t.ne[1] > 1:
        return g.view_2d(ctx, t, t.ne[0], t.ne[1] // 2, t.nb[1] * 2, 0)
    return t


def scalar(rnd, ctype):
    wild = rnd.random() < 0.1
    if ctype == "float":
        return rnd.choice([0.0, -1.0, 1e30, float("nan")]) if wild else rnd.uniform(-2, 2)
    if ctype == "bool":
        return rnd.random() < 0.5
    if ctype == "size_t":
        return rnd.choice([0, 3, 1 << 40]) if wild else rnd.choice([0, 4, 8, 16, 32, 64])
    if ctype in ("int", "int32_t"):
        return rnd.choice([-1, 0, -(1 << 20), 1 << 20]) if wild else rnd.randint(0, 4)
    if ctype in ("int64_t", "uint32_t"):
        return rnd.choice([0, 1 << 31, 7]) if wild else rnd.randint(1, 8)
    raise AssertionError(ctype)


def args_for(rnd, row, pool):
    out = []
    for name, ctype, kind in row["params"]:
        if kind in ("tensor", "tensor?"):
            if kind == "tensor?" and rnd.random() < 0.4:
                out.append(None)
            else:
                out.append(rnd.choice(pool) if rnd.random() < 0.97 else None)
        elif kind == "enum":
            enum = ENUMS[ctype]
            out.append(rnd.choice(list(enum)) if rnd.random() < 0.95 else 99)
        elif kind == "array":
            out.append([rnd.randint(0, 4) for _ in range(4)])
        else:
            out.append(scalar(rnd, ctype))
    return out


def one(rnd, it, ops):
    ctxs = [g.Context(rnd.choice([1 << 12, 1 << 16, 1 << 22]), no_alloc=rnd.random() < 0.1)
            for _ in range(rnd.randint(1, 2))]
    pool = []
    for _ in range(4):
        try:
            t = new_tensor(rnd, rnd.choice(ctxs), it)
            if rnd.random() < 0.3 and t.type in (T.F32, T.F16):
                g.set_param(t)
            pool.append(t)
            pool.append(view_of(rnd, rnd.choice(ctxs), t))
        except EXPECTED:
            pass
    if not pool:
        return
    made = []
    for _ in range(10):
        ctx = rnd.choice(ctxs)
        row = rnd.choice(ops)
        try:
            if row["name"] == "flash_attn_back" or rnd.random() < 0.03:
                q, k, v, d = (rnd.choice(pool) for _ in range(4))
                r = g.flash_attn_back(ctx, q, k, v, d, rnd.random() < 0.5)
            else:
                r = getattr(g, row["name"])(ctx, *args_for(rnd, row, pool))
            pool.append(r)
            made.append(r)
        except EXPECTED:
            pass
    gctx = rnd.choice(ctxs)
    try:
        graph = g.Graph(gctx, rnd.choice([4, 16, 256]), grads=rnd.random() < 0.5)
    except EXPECTED:
        return
    for t in made:
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
    except g.UpstreamDefect as e:
        if REPORT:
            print(f"FOUND {e.defect}: {e}", file=sys.stderr)
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


def main(seed, iterations, names=()):
    rnd = random.Random(seed)
    ops = [r for r in OPS if not names or r["name"] in names] or OPS
    for it in range(iterations):
        one(rnd, it, ops)
    print("ok", seed)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:])
