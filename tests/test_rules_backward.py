"""Both sides of the kernel rules of the [backward] family (pyggml/csrc/rules_backward.c).

For every refusal clause: pyggml refuses the node at the op call with the right class,
and the same node with the rules off makes the CPU kernel fail: it aborts, or reads or
writes out of bounds (the guarded proof, harness.kernel_verdict), or, where the kernel
silently computes garbage, it computes the wrong values (shown against the reference of
pyggml.opinfo). The accepted side is the OpInfo samples (tests/test_opinfo.py) and the
backward graphs ggml's autodiff makes.

Also here: evidence for an upstream discrepancy of ggml's autodiff (see the module's end).
"""

import re

import numpy as np
import pytest

import pyggml
from pyggml import Type
from pyggml.opinfo.backward import (ROPE_MROPE, ROPE_NEOX, ROPE_NORMAL, ROPE_VISION, ref_cross_entropy_loss_back,
                                    ref_get_rows_back, ref_im2col_back, ref_pool_2d_back, ref_rope_ext_back,
                                    ref_silu_back, ref_soft_max_back)
from pyggml.opinfo.harness import read, rules_disabled
from rules_helpers import (BF16, F16, KPE, NEW_TENSOR_SIZE_ASSERT, TYPE_ERR, compute_unchecked, refused_and_kernel_fails,
                           refused_size, rnd, strided_vector, t_, tr, unwalkable)

PLAIN_ROPE = (0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0)     # n_ctx_orig .. beta_slow


# --- refusals the kernel backs with an abort or an out-of-bounds access ---------------------

def _rope(a_shape=(1, 4, 8), typ=Type.F32, n_dims=8, mode=ROPE_NORMAL, ff=None, layout=None):
    def build(ctx):
        a = tr(ctx, rnd(a_shape), typ) if layout == "transposed" else t_(ctx, rnd(a_shape), typ)
        pos = t_(ctx, np.arange(a.ne[2]), Type.I32)
        c = None if ff is None else t_(ctx, np.ones(ff))
        return pyggml.rope_ext_back(ctx, a, pos, c, n_dims, mode, *PLAIN_ROPE)
    return build


def _mrope(sections, n_dims=8, mode=ROPE_MROPE, ne0=8):
    def build(ctx):
        a = t_(ctx, rnd((2, 2, ne0)))
        return pyggml.rope_multi_back(ctx, a, t_(ctx, np.zeros(8), Type.I32), None, n_dims, sections, mode,
                                      *PLAIN_ROPE)
    return build


def _im2col_back(g_shape=(1, 2, 2, 8), g_type=Type.F32, k_type=Type.F32, s=(2, 2), ne=(4, 4, 2, 1)):
    def build(ctx):
        return pyggml.im2col_back(ctx, t_(ctx, rnd(g_shape), g_type), t_(ctx, rnd((2, 2, 2)), k_type), list(ne),
                                  s[0], s[1], 0, 0, 1, 1, True)
    return build


def _pool_back(g_type=Type.F32, af_type=Type.F32, op=pyggml.OpPool.MAX, g_shape=(2, 2, 2)):
    def build(ctx):
        return pyggml.pool_2d_back(ctx, t_(ctx, rnd(g_shape), g_type), t_(ctx, rnd((2, 4, 4)), af_type), op,
                                   2, 2, 2, 2, 0.0, 0.0)
    return build


def _ce_back(dy_type=Type.F32, a_type=Type.F32, b_type=Type.F32, a_layout=None, b_layout=None):
    def build(ctx):
        a = tr(ctx, rnd((4, 8)), a_type) if a_layout == "transposed" else t_(ctx, rnd((4, 8)), a_type)
        b = tr(ctx, rnd((4, 8)), b_type) if b_layout == "transposed" else t_(ctx, rnd((4, 8)), b_type)
        return pyggml.cross_entropy_loss_back(ctx, t_(ctx, [1.0], dy_type), a, b)
    return build


CASES = [
    # name, build, exception, message, defect id
    # REPEAT_BACK
    ("repeat_back: F16", lambda c: pyggml.repeat_back(c, t_(c, rnd((4, 8)), F16), t_(c, rnd((1, 8)), F16)),
     TYPE_ERR, "src0 of type f16", ""),
    ("repeat_back: rows not contiguous", lambda c: pyggml.repeat_back(c, tr(c, rnd((4, 8))), t_(c, rnd((1, 8)))),
     KPE, "src0 must have contiguous rows", ""),
    # SILU_BACK
    ("silu_back: BF16", lambda c: pyggml.silu_back(c, t_(c, rnd((4, 8)), BF16), t_(c, rnd((4, 8)), BF16)),
     TYPE_ERR, "dy .src0. of type bf16", ""),
    ("silu_back: F32 dy, F16 x", lambda c: pyggml.silu_back(c, t_(c, rnd((2, 3))), t_(c, rnd((2, 3)), F16)),
     TYPE_ERR, "x .src1. must have dy's type f32", ""),
    ("silu_back: x larger than dy", lambda c: pyggml.silu_back(c, t_(c, rnd((2, 3))), t_(c, rnd((4, 3)))),
     KPE, "must have the same shape", ""),
    # RMS_NORM_BACK
    ("rms_norm_back: F16 dy", lambda c: pyggml.rms_norm_back(c, t_(c, rnd((4, 8)), F16), t_(c, rnd((4, 8)), F16),
                                                             1e-6), TYPE_ERR, "dy .src0. of type f16", ""),
    ("rms_norm_back: F16 x", lambda c: pyggml.rms_norm_back(c, t_(c, rnd((4, 8))), t_(c, rnd((4, 8)), F16), 1e-6),
     TYPE_ERR, "x .src1. of type f16", ""),
    ("rms_norm_back: shapes differ", lambda c: pyggml.rms_norm_back(c, t_(c, rnd((4, 8))), t_(c, rnd((2, 8))), 1e-6),
     KPE, "must have the same shape", ""),
    ("rms_norm_back: dy transposed", lambda c: pyggml.rms_norm_back(c, tr(c, rnd((4, 8))), t_(c, rnd((4, 8))), 1e-6),
     KPE, "dy .src0. must have contiguous rows", ""),
    ("rms_norm_back: x transposed", lambda c: pyggml.rms_norm_back(c, t_(c, rnd((4, 8))), tr(c, rnd((4, 8))), 1e-6),
     KPE, "x .src1. must have contiguous rows", ""),
    # GET_ROWS_BACK
    ("get_rows_back: BF16 rows", lambda c: pyggml.get_rows_back(c, t_(c, rnd((3, 8)), BF16), t_(c, [0, 1, 2], Type.I32),
                                                                t_(c, rnd((4, 8)))), TYPE_ERR, "src0 of type bf16", ""),
    ("get_rows_back: rows not contiguous",
     lambda c: pyggml.get_rows_back(c, tr(c, rnd((3, 8))), t_(c, [0, 1, 2], Type.I32), t_(c, rnd((4, 8)))),
     KPE, "src0 must have contiguous rows", ""),
    ("get_rows_back: fewer rows than indices", lambda c: pyggml.get_rows_back(c, t_(c, rnd((2, 4))),
                                                                              t_(c, [0, 1, 2, 3, 0, 1], Type.I32),
                                                                              t_(c, rnd((4, 4)))),
     KPE, "a row per index: 6 indices", ""),
    # SOFT_MAX_BACK
    ("soft_max_ext_back: F16 dy", lambda c: pyggml.soft_max_ext_back(c, t_(c, rnd((4, 8)), F16), t_(c, rnd((4, 8))),
                                                                     1.0, 0.0), TYPE_ERR, "dy .src0. of type f16", ""),
    ("soft_max_ext_back: F16 y", lambda c: pyggml.soft_max_ext_back(c, t_(c, rnd((2, 3))), t_(c, rnd((2, 3)), F16),
                                                                    1.0, 0.0), TYPE_ERR, "y .src1. of type f16", ""),
    ("soft_max_ext_back: max_bias", lambda c: pyggml.soft_max_ext_back(c, t_(c, rnd((4, 8))), t_(c, rnd((4, 8))),
                                                                       1.0, 8.0), KPE, "needs max_bias == 0", ""),
    ("soft_max_ext_back: shapes differ", lambda c: pyggml.soft_max_ext_back(c, t_(c, rnd((4, 8))), t_(c, rnd((2, 8))),
                                                                            1.0, 0.0), KPE, "same shape", ""),
    ("soft_max_ext_back: dy transposed",
     lambda c: pyggml.soft_max_ext_back(c, tr(c, rnd((4, 8))), t_(c, rnd((4, 8))), 1.0, 0.0), KPE,
     "dy .src0. must be contiguous", ""),
    ("soft_max_ext_back: y transposed",
     lambda c: pyggml.soft_max_ext_back(c, t_(c, rnd((4, 8))), tr(c, rnd((4, 8))), 1.0, 0.0), KPE,
     "y .src1. must be contiguous", ""),
    ("soft_max_ext_back_inplace: dy transposed",
     lambda c: pyggml.soft_max_ext_back_inplace(c, tr(c, rnd((4, 8))), t_(c, rnd((4, 8))), 1.0, 0.0), KPE,
     "dy .src0. must be contiguous", ""),
    # ROPE_BACK
    ("rope_ext_back: BF16", _rope(typ=BF16), TYPE_ERR, "src0 of type bf16", ""),
    ("rope_ext_back: unknown mode", _rope(mode=4), KPE, "mode 4 is not one", ""),
    ("rope_ext_back: n_dims > ne0", _rope(n_dims=10), KPE, "n_dims must be even and in .0, ne0 = 8., got 10", ""),
    ("rope_ext_back: odd n_dims", _rope(n_dims=5), KPE, "got 5", ""),
    ("rope_ext_back: negative n_dims", _rope(a_shape=(1, 128, 8), n_dims=-2), KPE, "got -2", ""),
    ("rope_ext_back: rows not contiguous", _rope(a_shape=(1, 8, 4), n_dims=4, layout="transposed"), KPE,
     "src0 must have contiguous rows", ""),
    ("rope_multi_back: sections summing to 0", _mrope([2, -2, 0, 0]), KPE, "sections must be >= 0, got .2, -2, 0, 0.", ""),
    ("rope_multi_back: no section among the first three", _mrope([0, 0, 0, 4]), KPE, r"needs sections\[0\], \[1\] or \[2\] > 0", ""),
    ("rope_multi_back: sections longer than ne0", _mrope([4, 4, 4, 0]), KPE, "add up to 12, more than ne0 = 8", ""),
    ("rope_multi_back: VISION n_dims != ne0/2", _mrope([2, 2, 0, 0], n_dims=8, mode=ROPE_VISION), KPE,
     "VISION mode needs n_dims == ne0/2 = 4", ""),
    ("rope_ext_back: odd ne0 (upstream defect)", _rope(a_shape=(1, 4, 5), n_dims=4), pyggml.UpstreamDefect,
     "ne0 = 5 is odd", "rope-odd-ne0"),
    ("rope_ext_back: n_dims/2 freq factors (upstream defect)", _rope(a_shape=(1, 1, 16), n_dims=8, ff=4,
                                                                     mode=ROPE_NEOX),
     pyggml.UpstreamDefect, "each of the ne0/2 = 8 pairs", "rope-freq-factors-oob"),
    # IM2COL_BACK
    ("im2col_back: F16 gradient", _im2col_back(g_type=F16), TYPE_ERR, "gradient .src0. of type f16", ""),
    ("im2col_back: BF16 kernel", _im2col_back(k_type=BF16), TYPE_ERR, "kernel .src1. of type bf16", ""),
    ("im2col_back: s0 = 0", _im2col_back(s=(0, 2)), KPE, "strides must be nonzero", ""),
    ("im2col_back: s1 = 0", _im2col_back(s=(2, 0)), KPE, "strides must be nonzero", ""),
    ("im2col_back: gradient smaller than the columns", _im2col_back(g_shape=(1, 2, 2, 4)), KPE,
     "must have im2col's result shape", ""),
    # POOL_2D_BACK
    ("pool_2d_back: F16 gradient", _pool_back(g_type=F16), TYPE_ERR, "gradient .src0. of type f16", ""),
    ("pool_2d_back: BF16 forward input (MAX)", _pool_back(af_type=BF16), TYPE_ERR,
     "forward input .src1. of type bf16", ""),
    ("pool_2d_back: fewer gradient planes", _pool_back(g_shape=(1, 2, 2)), KPE, "has 1 planes, the result 2", ""),
    ("pool_2d_back: F16 forward input (upstream defect)", _pool_back(af_type=F16), pyggml.UpstreamDefect,
     "it is F16", "pool-2d-back-f16-oob"),
    # CROSS_ENTROPY_LOSS_BACK
    ("cross_entropy_loss_back: F16 dy", _ce_back(dy_type=F16), TYPE_ERR, "dy .src0. of type f16", ""),
    ("cross_entropy_loss_back: F16 logits", _ce_back(a_type=F16), TYPE_ERR, "logits .src1. of type f16", ""),
    ("cross_entropy_loss_back: F16 labels", _ce_back(b_type=F16), TYPE_ERR, "labels .src2. of type f16", ""),
    ("cross_entropy_loss_back: logits transposed", _ce_back(a_layout="transposed"), KPE,
     "logits .src1. must be contiguous", ""),
    ("cross_entropy_loss_back: labels transposed", _ce_back(b_layout="transposed"), KPE,
     "labels .src2. must be contiguous", ""),
]


@pytest.mark.parametrize("name, build, exc, match, defect", CASES, ids=[c[0] for c in CASES])
def test_rule_refuses_what_the_kernel_fails_on(name, build, exc, match, defect):
    refused_and_kernel_fails(build, exc, match, defect)


# --- refusals where the kernel runs clean and computes the wrong values ---------------------

@pytest.mark.parametrize("which", ["dy", "x"])
def test_silu_back_walks_rows_with_nb1(which):
    dy, x = rnd((2, 1, 3), 6), rnd((2, 1, 3), 7)

    def build(ctx):
        a = unwalkable(ctx, dy) if which == "dy" else t_(ctx, dy)
        b = unwalkable(ctx, x) if which == "x" else t_(ctx, x)
        return pyggml.silu_back(ctx, a, b)
    with pyggml.Context(1 << 20) as ctx, pytest.raises(KPE, match=f"{which} .src.. must have contiguous rows"):
        build(ctx)
    got = compute_unchecked(build)
    assert not np.allclose(got, ref_silu_back(dy.astype(np.float64), x.astype(np.float64)), rtol=1e-3)


@pytest.mark.parametrize("which", ["dy", "y"])
def test_soft_max_back_walks_rows_with_nb1(which):
    dy, y = rnd((2, 1, 3), 8), np.full((2, 1, 3), 1 / 3, np.float32)
    y[1] = [0.7, 0.2, 0.1]

    def build(ctx):
        a = unwalkable(ctx, dy) if which == "dy" else t_(ctx, dy)
        b = unwalkable(ctx, y) if which == "y" else t_(ctx, y)
        return pyggml.soft_max_ext_back(ctx, a, b, 1.0, 0.0)
    with pyggml.Context(1 << 20) as ctx, pytest.raises(KPE, match="dims 2 and 3 packed over rows"):
        build(ctx)
    got = compute_unchecked(build)
    assert not np.allclose(got, ref_soft_max_back(dy.astype(np.float64), y.astype(np.float64), 1.0, 0.0), rtol=1e-3)


@pytest.mark.parametrize("which", ["logits", "labels"])
def test_cross_entropy_loss_back_walks_rows_with_nb1(which):
    a, b = rnd((2, 1, 3), 9), np.full((2, 1, 3), 1 / 3, np.float32)
    b[1] = [1.0, 0.0, 0.0]

    def build(ctx):
        at = unwalkable(ctx, a) if which == "logits" else t_(ctx, a)
        bt = unwalkable(ctx, b) if which == "labels" else t_(ctx, b)
        return pyggml.cross_entropy_loss_back(ctx, t_(ctx, [1.0]), at, bt)
    with pyggml.Context(1 << 20) as ctx, pytest.raises(KPE, match="dims 2 and 3 packed over rows"):
        build(ctx)
    got = compute_unchecked(build)
    want = ref_cross_entropy_loss_back(np.array([1.0]), a.astype(np.float64), b.astype(np.float64))
    assert not np.allclose(got, want, rtol=1e-3)


def test_get_rows_back_reads_its_indices_as_an_array():
    # the defect get-rows-back-strided-index, in the kernel itself (rules off)
    a = rnd((3, 4), 10)

    def build(ctx):
        return pyggml.get_rows_back(ctx, t_(ctx, a), strided_vector(ctx, [2, 0, 1], np.int32),
                                    t_(ctx, np.zeros((3, 4))))
    with pyggml.Context(1 << 20) as ctx, pytest.raises(pyggml.UpstreamDefect, match="indices .src1. must be contiguous"):
        build(ctx)
    # the filler between the indices is 99: keep it in range, so the kernel stays in bounds
    def build_safe(ctx):
        return pyggml.get_rows_back(ctx, t_(ctx, a), strided_vector(ctx, [2, 0, 1], np.int32),
                                    t_(ctx, np.zeros((100, 4))))
    got = compute_unchecked(build_safe)
    want = ref_get_rows_back(a.astype(np.float64), np.array([2, 0, 1]), np.zeros((100, 4)))
    assert not np.allclose(got, want)
    np.testing.assert_allclose(got[99], a[1], rtol=1e-6)      # it read [2, 99, 0]


def test_rope_back_reads_positions_and_freq_factors_as_arrays():
    dy = rnd((3, 1, 4), 11)

    def build_pos(ctx):
        return pyggml.rope_ext_back(ctx, t_(ctx, dy), strided_vector(ctx, [0, 1, 2], np.int32), None, 4,
                                    ROPE_NORMAL, *PLAIN_ROPE)
    with pyggml.Context(1 << 20) as ctx, pytest.raises(KPE, match="positions .src1. must have contiguous rows"):
        build_pos(ctx)
    got = compute_unchecked(build_pos)
    want = ref_rope_ext_back(dy.astype(np.float64), np.array([0, 1, 2]), None, 4, ROPE_NORMAL, *PLAIN_ROPE)
    assert not np.allclose(got, want, rtol=1e-3)

    def build_ff(ctx):
        return pyggml.rope_ext_back(ctx, t_(ctx, dy), t_(ctx, [0, 1, 2], Type.I32), strided_vector(ctx, [1.0, 2.0]),
                                    4, ROPE_NORMAL, *PLAIN_ROPE)
    with pyggml.Context(1 << 20) as ctx, pytest.raises(KPE, match="frequency factors .src2. must have contiguous rows"):
        build_ff(ctx)
    got = compute_unchecked(build_ff)
    want = ref_rope_ext_back(dy.astype(np.float64), np.array([0, 1, 2]), np.array([1.0, 2.0]), 4, ROPE_NORMAL,
                             *PLAIN_ROPE)
    assert not np.allclose(got, want, rtol=1e-3)


def test_im2col_back_reads_the_gradient_as_a_flat_array():
    g = rnd((1, 2, 2, 8), 12)

    def build(ctx, cont=False):
        # g's values, ne (8, 2, 2, 1), as a permuted view (dims 1 and 2 swapped back)
        gt = pyggml.permute(ctx, t_(ctx, np.ascontiguousarray(np.swapaxes(g, 1, 2))), 0, 2, 1, 3)
        gt = pyggml.cont(ctx, gt) if cont else gt
        return pyggml.im2col_back(ctx, gt, t_(ctx, rnd((2, 2, 2))), [4, 4, 2, 1], 2, 2, 0, 0, 1, 1, True)
    with pyggml.Context(1 << 20) as ctx, pytest.raises(KPE, match="gradient .src0. must be contiguous"):
        build(ctx)
    want = ref_im2col_back(g.astype(np.float64), np.zeros((2, 2, 2)), [4, 4, 2, 1], 2, 2, 0, 0, 1, 1, True)
    with pyggml.Context(1 << 20) as ctx:        # the same values made contiguous: right
        t = build(ctx, cont=True)
        gr = pyggml.Graph(ctx, 16)
        gr.build_forward_expand(t)
        gr.compute(1)
        np.testing.assert_allclose(t.numpy().reshape(want.shape), want, rtol=1e-6)
    got = compute_unchecked(build)
    assert not np.allclose(got, want, rtol=1e-3)


def test_im2col_back_1d_never_writes_ne3():
    def build(ctx):
        return pyggml.im2col_back(ctx, t_(ctx, rnd((2, 4, 6), 13)), t_(ctx, rnd((2, 3))), [7, 2, 2, 2],
                                  2, 0, 1, 0, 1, 0, False)
    with pyggml.Context(1 << 20) as ctx, pytest.raises(KPE, match="1-D: the result's ne3 must be 1"):
        build(ctx)
    with rules_disabled(), pyggml.Context(1 << 20) as ctx:
        t = build(ctx)
        t.numpy()[...] = 12345.0                 # what the memory held
        g = pyggml.Graph(ctx, 16)
        g.build_forward_expand(t)
        g.compute(1)
        out = t.numpy()
        assert np.all(out[1] == 12345.0) and not np.any(out[0] == 12345.0)


@pytest.mark.parametrize("which", ["gradient", "forward input"])
def test_pool_2d_back_reads_flat_planes(which):
    g, af = rnd((2, 2, 2), 14), rnd((2, 4, 4), 15)

    def build(ctx):
        gt = tr(ctx, g) if which == "gradient" else t_(ctx, g)
        aft = tr(ctx, af) if which == "forward input" else t_(ctx, af)
        return pyggml.pool_2d_back(ctx, gt, aft, pyggml.OpPool.MAX, 2, 2, 2, 2, 0.0, 0.0)
    with pyggml.Context(1 << 20) as ctx, pytest.raises(KPE, match=f"{which} .src.., read at the result's offsets,"
                                                       if which == "forward input" else "gradient .src0. must be"):
        build(ctx)
    got = compute_unchecked(build)
    want = ref_pool_2d_back(g.astype(np.float64), af.astype(np.float64), 0, 2, 2, 2, 2, 0.0, 0.0)
    assert not np.allclose(got, want, rtol=1e-3)


def test_im2col_back_refuses_strides_past_the_kernels_int_offsets():
    # a 1-D result of 2**31 bytes per image: built in a no_alloc context, never computed
    with pyggml.Context(16 << 20, no_alloc=True) as ctx:
        g = ctx.new_tensor(Type.F32, (3, 1, 2, 1))
        k = ctx.new_tensor(Type.F32, (3, 1, 1, 1))
        with pytest.raises(KPE, match="int offsets"):
            pyggml.im2col_back(ctx, g, k, [1 << 29, 1, 2, 1], 1, 0, 0, 0, 1, 0, False)


_IM2COL_BACK_NE = [
    ([2**32, 2**32, 2, 1], r"has more elements than int64 holds \(ne\[1\] = 4294967296"),
    ([2**31, 2**30, 2, 1], r"takes more bytes than int64 holds \(f32, ne\[1\] = 1073741824"),
    ([4, -4, 2, 1], r"has ne\[1\] = -4: a dimension cannot be negative"),
]


@pytest.mark.parametrize("no_alloc", [False, True], ids=["pool", "no_alloc"])
@pytest.mark.parametrize("ne, match", _IM2COL_BACK_NE, ids=["elements", "bytes", "negative"])
def test_im2col_back_result_shape_is_checked_in_any_context(ne, match, no_alloc):
    """ggml_im2col_back makes its result of the ne it is given: 2**32 x 2**32 floats wrap
    to 0 bytes, which a no_alloc context kept (and a backend buffer then gave 0 bytes)"""
    with pyggml.Context(1 << 20, no_alloc=no_alloc) as ctx:
        g, k = ctx.new_tensor(Type.F32, (8, 2, 2, 1)), ctx.new_tensor(Type.F32, (2, 2, 2, 1))
        refused_size(lambda: pyggml.im2col_back(ctx, g, k, ne, 2, 2, 0, 0, 1, 1, True),
                     rf"im2col_back: IM2COL_BACK node refused: the IM2COL_BACK result {match}")


def test_im2col_back_of_a_wrapped_size_crashes_the_kernel():
    """the kernel side, rules off: the 2**32 x 2**32 result has 0 bytes in a backend buffer
    and the kernel writes past them. The guarded proof fences the 0-byte result too, so its
    first write faults at once (unfenced, it ran through the child's heap: 43 s in one CI run)"""
    with rules_disabled(), pyggml.Backend("CPU", n_threads=1) as cpu, \
            pyggml.Context(1 << 20, no_alloc=True) as ctx:
        g, k = ctx.new_tensor(Type.F32, (8, 2, 2, 1)), ctx.new_tensor(Type.F32, (2, 2, 2, 1))
        try:
            t = pyggml.im2col_back(ctx, g, k, [2**32, 2**32, 2, 1], 2, 2, 0, 0, 1, 1, True)
        except pyggml.GGMLAbort as e:      # a ggml whose builder refuses the size itself: no kernel to reach
            assert re.search(NEW_TENSOR_SIZE_ASSERT, str(e)), str(e)
            return
        cpu.alloc_ctx_tensors(ctx)
        gr = pyggml.Graph(ctx, 16)
        gr.build_forward_expand(t)
        with pytest.raises(pyggml.UpstreamDefect, match='wrote memory past the end of node "node_0" .IM2COL_BACK'):
            cpu.graph_compute(gr)


@pytest.mark.parametrize("no_alloc", [False, True], ids=["pool", "no_alloc"])
def test_im2col_back_of_a_sound_shape_still_computes(no_alloc):
    gv = rnd((1, 2, 2, 8), 21)
    want = ref_im2col_back(gv.astype(np.float64), np.zeros((2, 2, 2)), [4, 4, 2, 1], 2, 2, 0, 0, 1, 1, True)
    with pyggml.Backend("CPU", n_threads=1) as cpu, pyggml.Context(1 << 20, no_alloc=no_alloc) as ctx:
        g, k = ctx.new_tensor(Type.F32, (8, 2, 2, 1)), ctx.new_tensor(Type.F32, (2, 2, 2, 1))
        t = pyggml.im2col_back(ctx, g, k, [4, 4, 2, 1], 2, 2, 0, 0, 1, 1, True)
        gr = pyggml.Graph(ctx, 16)
        gr.build_forward_expand(t)
        if no_alloc:
            cpu.alloc_ctx_tensors(ctx)
            g.set(gv.reshape(g.shape))
            k.set(np.zeros(k.shape, np.float32))
            cpu.graph_compute(gr)
            got = np.asarray(t.get(), np.float64)
        else:
            g.numpy()[...] = gv.reshape(g.shape)
            k.numpy()[...] = 0
            gr.compute(1)
            got = read(t)
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-6)


# --- what the rules let through: the backward graphs ggml's autodiff makes ---------------

@pytest.mark.parametrize("forward", ["silu", "soft_max", "rms_norm", "get_rows", "repeat", "rope", "pool_2d",
                                     "im2col", "cross_entropy_loss"])
def test_autodiff_inserts_backward_nodes_the_rules_accept(forward):
    rng = np.random.default_rng(16)
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    with pyggml.Context(32 << 20) as ctx:
        xt = ctx.from_numpy(x)
        pyggml.set_param(xt)
        if forward == "silu":
            y = pyggml.silu(ctx, xt)
        elif forward == "soft_max":
            y = pyggml.soft_max(ctx, xt)
        elif forward == "rms_norm":
            y = pyggml.rms_norm(ctx, xt, 1e-6)
        elif forward == "get_rows":
            y = pyggml.get_rows(ctx, pyggml.reshape_2d(ctx, xt, 4, 6), ctx.from_numpy(np.array([5, 0, 5], np.int32)))
        elif forward == "repeat":
            y = pyggml.repeat_4d(ctx, xt, 8, 3, 4, 1)
        elif forward == "rope":
            y = pyggml.rope_ext(ctx, xt, ctx.from_numpy(np.array([0, 3], np.int32)), None, 4, ROPE_NEOX, *PLAIN_ROPE)
        elif forward == "pool_2d":
            y = pyggml.pool_2d(ctx, xt, pyggml.OpPool.MAX, 2, 2, 2, 1, 0.0, 0.0)
        elif forward == "im2col":       # x an image [4, 3, 2 channels], a 2x2 kernel
            k = ctx.from_numpy(np.ones((1, 2, 2, 2), np.float32))
            y = pyggml.im2col(ctx, k, xt, 1, 1, 1, 0, 1, 1, True, Type.F32)
        else:
            y = pyggml.cross_entropy_loss(ctx, xt, ctx.from_numpy(np.full((2, 3, 4), 0.25, np.float32)))
        loss = pyggml.sum(ctx, pyggml.sqr(ctx, y))
        pyggml.set_loss(loss)
        g = pyggml.Graph(ctx, 1024, grads=True)
        g.build_forward_expand(loss)
        g.build_backward_expand()
        g.compute(2)
        grad = g.grad(xt).numpy()
        assert np.all(np.isfinite(grad)) and np.any(grad != 0)


# --- upstream discrepancies ------------------------------------------------------------------

def test_upstream_autodiff_hands_row_kernels_a_transposed_gradient():
    # ggml.c ggml_compute_backward, case GGML_OP_TRANSPOSE: ggml_transpose(grad) is passed on
    # as is; SILU_BACK then reads it with contiguous rows and computes a wrong gradient
    # (SOFT_MAX_BACK and RMS_NORM_BACK abort). pyggml's rules refuse the backward pass
    # (defect "backward-strided-grad").
    x = rnd((2, 3, 4), 18)

    def graph(ctx):
        xt = ctx.from_numpy(x)
        pyggml.set_param(xt)
        y = pyggml.cont(ctx, pyggml.transpose(ctx, pyggml.silu(ctx, xt)))
        loss = pyggml.sum(ctx, pyggml.mul(ctx, y, ctx.from_numpy(np.arange(24, dtype=np.float32).reshape(2, 4, 3))))
        pyggml.set_loss(loss)
        g = pyggml.Graph(ctx, 256, grads=True)
        g.build_forward_expand(loss)
        return xt, g
    with pyggml.Context(16 << 20) as ctx:
        xt, g = graph(ctx)
        with pytest.raises(KPE, match="SILU_BACK node refused: dy .src0. must have contiguous rows"):
            g.build_backward_expand()
    with rules_disabled(), pyggml.Context(16 << 20) as ctx:
        xt, g = graph(ctx)
        g.build_backward_expand()
        pyggml._cpu.prove(g)
        g.compute(1)
        got = g.grad(xt).numpy()
    xs = x.astype(np.float64)
    s = 1 / (1 + np.exp(-xs))
    want = np.swapaxes(np.arange(24.0).reshape(2, 4, 3), -1, -2) * s * (1 + xs * (1 - s))
    assert not np.allclose(got, want, rtol=1e-3)
