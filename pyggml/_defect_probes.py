"""The probes of :mod:`pyggml.defects`: each measures one known upstream defect on the
linked ggml (bytes past a buffer, a kernel verdict, an error against float64). A record names
its probe by the function's name here; :mod:`pyggml.defects` imports this module only when a
probe runs, so the registry itself loads without a built pyggml (``scripts/sanitize.py`` reads
it before any build).
"""

from __future__ import annotations

import numpy as np

import pyggml
from pyggml import _cpu
from pyggml._fab import _probe_fab_batch_gqa_oob
from pyggml.opinfo.harness import kernel_verdict, read, rules_disabled


def fab_batch_gqa_oob():
    """Bytes FLASH_ATTN_BACK writes past its result with batch + GQA (pyggml._fab measures it)."""
    return _probe_fab_batch_gqa_oob()


def fab_work_size():
    """Bytes the FLASH_ATTN_BACK kernel touches beyond what ggml_graph_plan reserves, for
    D = M = 1 on 4 threads (0: the plan is large enough)."""
    with pyggml.Context(1 << 20) as ctx:
        t = ctx.new_tensor(pyggml.Type.F32, (1, 1, 1, 1))
        r = pyggml.flash_attn_back(ctx, t, t, t, t, False)
        g = pyggml.Graph(ctx, 8)
        g.build_forward_expand(r)
        return max(0, _cpu.fab_work_bytes(1, 1, 4) - g._plan_work_size(4))


def set_bounds():
    return kernel_verdict(lambda ctx: pyggml.set_1d(ctx, ctx.from_numpy(np.zeros(1024, np.float32)),
                                              ctx.from_numpy(np.ones(1, np.float32)), 4096))


def pad_circular():
    return kernel_verdict(lambda ctx: pyggml.pad_ext_circular(ctx, ctx.from_numpy(np.zeros((32, 32), np.float32)),
                                                        64, 1, 0, 0, 0, 0, 0, 0))


def rope_ndims0():
    # a row of 8 rotated by 0 dims: 0.20.2's kernel copies it, 0.25.3's spins
    return kernel_verdict(lambda ctx: pyggml.rope(ctx, ctx.from_numpy(np.ones((1, 1, 8), np.float32)),
                                            ctx.from_numpy(np.zeros(1, np.int32)), 0, 0), timeout=5.0)


def cpy_to_q_work():
    def build(ctx):
        dst = ctx.new_tensor(pyggml.Type.Q8_0, (32, 16))
        return pyggml.cpy(ctx, ctx.from_numpy(np.ones((512,), np.float32)), dst)
    return kernel_verdict(build)


def add_q_no_from_float():
    # add1 of a zeroed IQ2_XXS row and 1: the kernel (0.20.2's, 0.25.3's) calls the NULL from_float (a
    # SIGSEGV in the child, "abort"); a kernel that checks it aborts or refuses ("abort"
    # too); one that writes the row through a fallback computes it ("ok")
    def build(ctx):
        a = ctx.new_tensor(pyggml.Type.IQ2_XXS, (256, 1))
        a.blocks()[...] = 0
        return pyggml.add1(ctx, a, ctx.from_numpy(np.ones(1, np.float32)))
    return kernel_verdict(build)


def _computed(ctx, t) -> bool:
    """Compute t's graph; False where the kernel aborts (not the probe's defect: it cannot
    measure it on this ggml)."""
    g = pyggml.Graph(ctx, 8)
    g.build_forward_expand(t)
    try:
        g.compute(1)
    except pyggml.GGMLAbort:
        return False
    return True


def conv_transpose_2d_batch():
    # two equal batches, rules off: 0.20.2's kernel computes the first and leaves the
    # second zero; a fixed one computes both alike. An F16 kernel: older releases (0.9.4)
    # take no other
    with rules_disabled(), pyggml.Context(1 << 20) as ctx:
        k = ctx.from_numpy(np.ones((2, 3, 3, 3), np.float16))
        x = ctx.from_numpy(np.ones((2, 2, 4, 4), np.float32))
        r = pyggml.conv_transpose_2d_p0(ctx, k, x, 2)
        if not _computed(ctx, r):
            return None
        v = read(r)
    if np.array_equal(v[0], v[1]):
        return "ok"
    return "zeros" if not v[1].any() and v[0].any() else "wrong"


def conv_2d_dw_f32_kernel():
    # conv_2d_dw of an F32 kernel, rules off: the pinned CPU mul_mat aborts on the F16
    # columns the builder makes ("abort"); one that converts them computes it ("ok")
    return kernel_verdict(lambda ctx: pyggml.conv_2d_dw(ctx, ctx.from_numpy(np.ones((2, 1, 3, 3), np.float32)),
                                                  ctx.from_numpy(np.ones((1, 2, 5, 5), np.float32)),
                                                  1, 1, 0, 0, 1, 1))


def rope_offset_grad():
    """The max abs error of ggml's gradient of sum(rope(x) * w) with a rotated block at
    offset 2, against the exact one (the forward's transpose applied to w), rules off
    (0: the backward carries the offset)."""
    rng = np.random.default_rng(0)
    # 3 positions (ne2) of one head of 8
    x, w = rng.standard_normal((3, 1, 8)).astype(np.float32), rng.standard_normal((3, 1, 8)).astype(np.float32)
    with rules_disabled(), pyggml.Context(1 << 22) as ctx:
        a = ctx.from_numpy(x)
        pyggml.set_param(a)
        pos = ctx.from_numpy(np.arange(3, dtype=np.int32))
        r = pyggml.rope_set_offset(pyggml.rope(ctx, a, pos, 4, 0), 2)      # raises GGMLVersionError before it
        loss = pyggml.sum(ctx, pyggml.mul(ctx, r, ctx.from_numpy(w)))
        pyggml.set_loss(loss)
        g = pyggml.Graph(ctx, 64, grads=True)
        g.build_forward_expand(loss)
        g.build_backward_expand()
        g.compute(1)
        got = g.grad(a).numpy().copy()
    # rope of 4 dims at offset 2, NORMAL mode: pairs (2, 3) and (4, 5) at position p rotate
    # by p * theta_i, theta_i = 10000 ** (-2i / 4); its transpose rotates w's pairs back
    want = w.astype(np.float64).copy()
    for p in range(3):
        for i, j in enumerate((2, 4)):
            c, s = np.cos(p * 10000.0 ** (-2 * i / 4)), np.sin(p * 10000.0 ** (-2 * i / 4))
            w0, w1 = float(w[p, 0, j]), float(w[p, 0, j + 1])
            want[p, 0, j], want[p, 0, j + 1] = c * w0 + s * w1, -s * w0 + c * w1
    err = float(np.max(np.abs(got - want)))
    return err if err > 1e-4 else 0.0           # (F32 rounding is not the defect)


def q8_k_rows(x):
    """Rows of x (float32, rows of 256) as Q8_K blocks, the layout of ggml's block_q8_K (d f32,
    qs i8[256], bsums i16[16]: 292 bytes), and the values they hold (d * qs). ggml quantizes
    into Q8_K only as a dot product's other side; no quantize_chunk writes it."""
    rows = np.asarray(x, np.float32).reshape(-1, 256)
    d = (np.abs(rows).max(axis=1) / 127).astype(np.float32)
    safe = np.where(d == 0, 1, d)
    qs = np.round(rows / safe[:, None]).clip(-127, 127).astype(np.int8)
    block = np.dtype([("d", "<f4"), ("qs", "i1", 256), ("bsums", "<i2", 16)])
    out = np.zeros(rows.shape[0], block)
    out["d"], out["qs"] = d, qs
    out["bsums"] = qs.reshape(-1, 16, 16).astype(np.int16).sum(axis=2)
    return out.view(np.uint8).reshape(*np.shape(x)[:-1], -1), (d[:, None] * qs).reshape(np.shape(x))


def mul_mat_tiled_q8k_batches():
    """The relative max error of mul_mat(Q4_K a, Q8_K b) with b's two batches of 8 rows each
    followed by 8 rows it does not hold (a view), rules off, against float64 (0: absent)."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 256)).astype(np.float32)
    raw, xv = q8_k_rows(rng.standard_normal((2, 16, 256)).astype(np.float32))
    with rules_disabled(), pyggml.Context(1 << 22) as ctx:
        a = ctx.from_numpy(pyggml.quantize(pyggml.Type.Q4_K, w), type=pyggml.Type.Q4_K)
        store = ctx.from_numpy(raw, type=pyggml.Type.Q8_K)              # ne (256, 16, 2)
        b = pyggml.view_3d(ctx, store, 256, 8, 2, store.nb[1], store.nb[2], 0)
        r = pyggml.mul_mat(ctx, a, b)
        if not _computed(ctx, r):
            return None
        got, wv = r.numpy().astype(np.float64), read(a)
    want = np.einsum("mk,bnk->bnm", wv, xv[:, :8, :].astype(np.float64))
    err = float(np.abs(got - want).max() / np.abs(want).max())
    return err if err > 1e-3 else 0.0


def wkv_threads_over_heads():
    # RWKV_WKV7 on one head, on 1 and on 3 threads, in a fresh interpreter with a time limit
    # (0.9.4's kernels may also hang there, and libgomp cannot run in a forked child): its
    # WKV6 and GLA kernels hang on more threads than heads, its WKV7 gives other values
    import subprocess
    import sys
    import tempfile
    if not hasattr(pyggml, "rwkv_wkv7"):
        return None
    code = ("import numpy as np, pyggml\n"
            "from pyggml import defects\n"
            "from pyggml.opinfo import registry\n"
            "from pyggml.opinfo.harness import compute\n"
            "defects._PRESENT['wkv-threads-over-heads'] = False      # (the probe computes what it measures)\n"
            "info = registry()['rwkv_wkv7']\n"
            "s = next(x for x in info.samples(np.random.default_rng(0), pyggml.Type.F32) if 'H=1 ' in x.name)\n"
            "print('ok' if np.array_equal(compute(info, s, 1)[0], compute(info, s, 3)[0]) else 'wrong')\n")
    try:
        # (from outside any source tree: the installed pyggml, as this process has it)
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                           cwd=tempfile.gettempdir())
    except subprocess.TimeoutExpired:
        return "hang"
    out = p.stdout.strip().splitlines()
    return out[-1] if p.returncode == 0 and out and out[-1] in ("ok", "wrong") else None
