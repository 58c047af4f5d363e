"""Both sides of the kernel rules of the [conv] family (pyggml/csrc/rules_conv.c).

For every refusal: pyggml raises the right class at the op call, and the same node with
the rules off shows what the CPU kernel really does with it (kernel_verdict: "abort" or
"out-of-bounds"; or, where the kernel silently computes something else, its values next
to the reference of pyggml/opinfo/conv.py). The accepted side is the OpInfo samples.
Also here: the upstream defects of the composite builders that no kernel rule can see
(conv_1d with a batch, conv_2d_dw with an F32 kernel), and which builders divide by a
stride (a SIGFPE inside the builder, raised as GGMLAbort).

Shapes are numpy order (ggml's ne reversed).
"""


import numpy as np
import pytest

import pyggml
from pyggml import OpPool, Type, defects
from pyggml.opinfo import conv as C
from pyggml.opinfo.harness import kernel_verdict, read, rules_disabled
from pyggml.opinfo._common import kernel_since
from rules_helpers import SCRATCH, compute_unchecked, computed, refused, refused_size, refused_where_kernel_aborts

F32, F16 = np.float32, np.float16
ALIGN = int(pyggml.ScaleFlag.ALIGN_CORNERS)
# GGML_SCALE_FLAG_ANTIALIAS is newer than some releases the matrix tests (0.9.4 lacks it)
AA = int(getattr(pyggml.ScaleFlag, "ANTIALIAS", 0))
needs_antialias = pytest.mark.skipif(not hasattr(pyggml.ScaleFlag, "ANTIALIAS"),
                                     reason="this ggml has no GGML_SCALE_FLAG_ANTIALIAS")


def vals(shape, seed=0):
    return np.random.default_rng(seed + int(np.prod(shape))).standard_normal(shape)


def rand(ctx, shape, dtype=F32, seed=0):
    return ctx.from_numpy(vals(shape, seed).astype(dtype))


def bf16(ctx, shape, seed=0):
    return pyggml.cast(ctx, rand(ctx, shape, seed=seed), Type.BF16)




def _compute_on(cpu, ctx, t, inputs, no_alloc):
    """t's values: a no_alloc context's tensors in a CPU backend buffer (graph_compute),
    a pool context's computed in place (Graph.compute)"""
    if no_alloc:
        cpu.alloc_ctx_tensors(ctx)
        for x, v in inputs.items():
            x.set(np.asarray(v, F32))
    else:
        for x, v in inputs.items():
            x.numpy()[...] = np.asarray(v, F32)
    g = pyggml.Graph(ctx, 64)
    g.build_forward_expand(t)
    if no_alloc:
        cpu.graph_compute(g)
        return np.asarray(t.get(), np.float64)
    g.compute(1)
    return read(t)


def stored(x, dtype=F32):
    return np.asarray(x).astype(dtype).astype(np.float64)


def transposed(ctx, x):
    """x (numpy order) as the transpose of a contiguous tensor: rows not contiguous"""
    return pyggml.transpose(ctx, ctx.from_numpy(np.ascontiguousarray(np.swapaxes(x, -1, -2)).astype(F32)))


# --- every op of the family has a rule ------------------------------------------------------------

def _untrusted_nodes(g):
    """Nodes of ``g`` whose op's kernel is not the one its rule was written against (none
    in the pinned build): they read unchecked although their rule passes them."""
    untrusted = set(pyggml._core.kernel_trust()["untrusted"])
    return sum(n.op in untrusted for n in g.nodes)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_every_conv_sample_builds_a_checked_graph():
    """each OpInfo's first sample makes nodes that all have a kernel rule (no guarded proof
    needed): the rule table's names are ggml's"""
    rng = np.random.default_rng(0)
    from pyggml.opinfo.harness import _tensor
    for info in C.OPINFOS:
        s = next(iter(info.samples(rng, info.types[0])))
        with pyggml.Context(16 << 20) as ctx:
            args = [_tensor(ctx, a) if isinstance(a, pyggml.opinfo.Arg) else a for a in s.args]
            g = pyggml.Graph(ctx, 64)
            g.build_forward_expand(getattr(pyggml, info.op)(ctx, *args))
            assert g.unchecked_ops == _untrusted_nodes(g), info.op


# --- IM2COL ----------------------------------------------------------------------------------------

def _im2col(b=None, dst=Type.F32, is_2d=True):
    def build(ctx):
        a = rand(ctx, (1, 2, 3, 3) if is_2d else (1, 2, 3))
        x = b(ctx) if b else rand(ctx, (1, 2, 6, 6) if is_2d else (1, 2, 8))
        return pyggml.im2col(ctx, a, x, 1, 1, 1, 1, 1, 1, is_2d, dst)
    return build


@pytest.mark.parametrize("dst, btype, msg", [
    (Type.BF16, F32, "makes F32 or F16 columns, not bf16"),
    (Type.F32, F16, "the data .src1. of an F32 result of type f16"),
    (Type.F16, "bf16", "the data .src1. of an F16 result of type bf16"),
])
def test_im2col_types(dst, btype, msg):
    def b(ctx):
        return bf16(ctx, (1, 2, 6, 6)) if btype == "bf16" else rand(ctx, (1, 2, 6, 6), btype)
    refused(_im2col(b, dst), pyggml.GGMLTypeError, msg)
    assert kernel_verdict(_im2col(b, dst)) == "abort"


def test_im2col_data_elements_contiguous():
    b = lambda ctx: pyggml.transpose(ctx, rand(ctx, (1, 2, 6, 6)))   # noqa: E731
    refused(_im2col(b), pyggml.KernelPreconditionError, "the data .src1. must have contiguous rows")
    assert kernel_verdict(_im2col(b)) == "abort"


def test_im2col_2d_data_rows_packed():
    """the 2-d kernel reads row iih of a channel at iih*ne0, ignoring nb1: a strided view
    is read as if packed (wrong values, no fault); 1-d takes the same view"""
    x = vals((1, 2, 6, 6))

    def b(ctx):
        big = np.zeros((1, 2, 6, 12))
        big[..., :6] = x
        base = ctx.from_numpy(big.astype(F32))
        return pyggml.view_4d(ctx, base, 6, 6, 2, 1, base.nb[1], base.nb[2], base.nb[3], 0)
    refused(_im2col(b), pyggml.KernelPreconditionError, r"must have packed rows \(nb\[1\] = ne\[0\]\*nb\[0\] = 24")
    want = C._ref_im2col(vals((1, 2, 3, 3)), stored(x), 1, 1, 1, 1, 1, 1, True, Type.F32)
    got = compute_unchecked(_im2col(b))
    assert not np.allclose(got.reshape(want.shape), want, atol=1e-3)

    def b1(ctx):           # 1-d: rows (channels) at any stride are fine
        base = rand(ctx, (1, 2, 16))
        return pyggml.view_3d(ctx, base, 8, 2, 1, base.nb[1], base.nb[2], 0)
    with pyggml.Context(1 << 20) as ctx:
        computed(ctx, _im2col(b1, is_2d=False)(ctx))


# --- IM2COL_3D ---------------------------------------------------------------------------------------

def _im2col_3d(b=None, dst=Type.F32):
    def build(ctx):
        x = b(ctx) if b else rand(ctx, (2, 3, 4, 4))
        return pyggml.im2col_3d(ctx, rand(ctx, (2, 2, 2, 2)), x, 2, 1, 1, 1, 0, 0, 0, 1, 1, 1, dst)
    return build


def test_im2col_3d_types_and_layout():
    refused(_im2col_3d(dst=Type.BF16), pyggml.GGMLTypeError, "the result of type bf16")
    assert kernel_verdict(_im2col_3d(dst=Type.BF16)) == "abort"
    b16 = lambda ctx: rand(ctx, (2, 3, 4, 4), F16)                  # noqa: E731
    refused(_im2col_3d(b16, Type.F16), pyggml.GGMLTypeError, "the data .src1. of type f16")
    assert kernel_verdict(_im2col_3d(b16, Type.F16)) == "abort"
    bt = lambda ctx: pyggml.transpose(ctx, rand(ctx, (2, 3, 4, 4)))  # noqa: E731
    refused(_im2col_3d(bt), pyggml.KernelPreconditionError, "the data .src1. must have contiguous rows")
    assert kernel_verdict(_im2col_3d(bt)) == "abort"


@pytest.mark.parametrize("op", ["im2col_3d", "conv_3d"])
@pytest.mark.parametrize("ic", [2**31, 2**32 + 2, -2**31 - 1])
@pytest.mark.parametrize("no_alloc", [False, True], ids=["pool", "no_alloc"])
def test_im2col_3d_channel_count_must_fit_its_int32_op_param(op, ic, no_alloc):
    """ggml_im2col_3d sizes its result with the int64 IC and keeps (int32_t) IC for the
    kernel: 2**32 + 2 would be read as 2 channels of a result sized for 2**32 + 2"""
    with pyggml.Context(1 << 20, no_alloc=no_alloc) as ctx:
        k, x = ctx.new_tensor(Type.F32, (2, 2, 2, 2)), ctx.new_tensor(Type.F32, (4, 4, 3, 2))
        args = (ic, 1, 1, 1, 0, 0, 0, 1, 1, 1) + ((Type.F32,) if op == "im2col_3d" else ())
        with pytest.raises(pyggml.ArgumentError, match=rf"{op}: IC must be in \[-2\*\*31, 2\*\*31 - 1\] "
                                                        rf"\(ggml keeps it in an int32 op param\), got {ic}"):
            getattr(pyggml, op)(ctx, k, x, *args)


@pytest.mark.parametrize("no_alloc", [False, True], ids=["pool", "no_alloc"])
def test_im2col_3d_a_channel_count_that_fits_still_computes(no_alloc):
    xv, kv = vals((2, 3, 4, 4)), vals((2, 2, 2, 2), 1)
    want = C._ref_im2col_3d(stored(kv), stored(xv), 2, 1, 1, 1, 0, 0, 0, 1, 1, 1, Type.F32)
    with pyggml.Backend("CPU", n_threads=1) as cpu, pyggml.Context(1 << 20, no_alloc=no_alloc) as ctx:
        k, x = ctx.new_tensor(Type.F32, (2, 2, 2, 2)), ctx.new_tensor(Type.F32, (4, 4, 3, 2))
        t = pyggml.im2col_3d(ctx, k, x, 2, 1, 1, 1, 0, 0, 0, 1, 1, 1, Type.F32)
        got = _compute_on(cpu, ctx, t, {k: kv, x: xv}, no_alloc)
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-6, atol=1e-6)


# --- COL2IM_1D ---------------------------------------------------------------------------------------

def test_col2im_1d_rule_mirrors_the_builders_asserts():
    """what the kernel needs (a float type kept by the result, contiguous source and result,
    s0 and oc > 0) ggml_col2im_1d asserts itself: the rule's clauses cannot be reached
    through the builder (they guard releases whose builder checks less)"""
    with pyggml.Context(1 << 20) as ctx:
        with pytest.raises(pyggml.GGMLAbort, match="ggml_is_contiguous"):
            pyggml.col2im_1d(ctx, pyggml.transpose(ctx, rand(ctx, (4, 6))), 2, 2, 0)
        with pytest.raises(pyggml.GGMLAbort, match="s0 > 0"):
            pyggml.col2im_1d(ctx, rand(ctx, (4, 6)), 0, 2, 0)
        t = pyggml.col2im_1d(ctx, rand(ctx, (4, 6)), 2, 2, 1)
        g = pyggml.Graph(ctx, 8)
        g.build_forward_expand(t)
        assert g.unchecked_ops == _untrusted_nodes(g)


# --- CONV_2D (ggml_conv_2d_direct) -------------------------------------------------------------------

def _conv2d(a=None, b=None):
    def build(ctx):
        k = a(ctx) if a else rand(ctx, (2, 2, 3, 3))
        x = b(ctx) if b else rand(ctx, (1, 2, 6, 6))
        return pyggml.conv_2d_direct(ctx, k, x, 1, 1, 0, 0, 1, 1)
    return build


def test_conv_2d_direct_types():
    refused(_conv2d(a=lambda ctx: bf16(ctx, (2, 2, 3, 3))), pyggml.GGMLTypeError, "the kernel .src0. of type bf16")
    assert kernel_verdict(_conv2d(a=lambda ctx: bf16(ctx, (2, 2, 3, 3)))) == "abort"
    # F16 data: read as floats at 2-byte steps, and the F16 result (b's type) written as floats
    b16 = lambda ctx: rand(ctx, (1, 2, 6, 6), F16)                  # noqa: E731
    refused(_conv2d(b=b16), pyggml.GGMLTypeError, "the data .src1. of type f16")
    assert kernel_verdict(_conv2d(b=b16)) == "out-of-bounds"


def test_conv_2d_direct_kernel_contiguous():
    at = lambda ctx: pyggml.transpose(ctx, rand(ctx, (2, 2, 3, 3)))  # noqa: E731
    refused(_conv2d(a=at), pyggml.KernelPreconditionError, "the kernel .src0. must be contiguous")
    assert kernel_verdict(_conv2d(a=at)) == "abort"


N_BIG = (1 << 22) + 17   # output channels: one patch needs 16 MiB + 70 bytes (an F16 tap, 4 bytes a channel)


def test_conv_2d_and_3d_direct_patch_larger_than_the_work_buffer():
    def build2(ctx):
        return pyggml.conv_2d_direct(ctx, rand(ctx, (N_BIG, 1, 1, 1), F16), rand(ctx, (1, 1, 1, 1)),
                                     1, 1, 0, 0, 1, 1)

    def build3(ctx):
        return pyggml.conv_3d_direct(ctx, rand(ctx, (N_BIG, 1, 1, 1), F16), rand(ctx, (1, 1, 1, 1)),
                                     1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1, N_BIG)
    for build in (build2, build3):
        refused(build, pyggml.KernelPreconditionError, "one patch .* takes 16777286 bytes, more than the 16777280")
        assert kernel_verdict(build) == "abort"


# --- CONV_3D (ggml_conv_3d_direct) -------------------------------------------------------------------

def _conv3d(a=None, b=None, c=2, n=1, oc=2):
    def build(ctx):
        k = a(ctx) if a else rand(ctx, (4, 2, 2, 2))
        x = b(ctx) if b else rand(ctx, (2, 3, 4, 4))
        return pyggml.conv_3d_direct(ctx, k, x, 1, 1, 1, 0, 0, 0, 1, 1, 1, c, n, oc)
    return build


def test_conv_3d_direct_types_and_layout():
    refused(_conv3d(a=lambda ctx: bf16(ctx, (4, 2, 2, 2))), pyggml.GGMLTypeError, "the kernel .src0. of type bf16")
    assert kernel_verdict(_conv3d(a=lambda ctx: bf16(ctx, (4, 2, 2, 2)))) == "abort"
    at = lambda ctx: pyggml.transpose(ctx, rand(ctx, (4, 2, 2, 2)))  # noqa: E731
    refused(_conv3d(a=at), pyggml.KernelPreconditionError, "the kernel .src0. must be contiguous")
    assert kernel_verdict(_conv3d(a=at)) == "abort"
    # F16 data is read as floats (pairs of halves), past its end
    b16 = lambda ctx: rand(ctx, (2, 3, 4, 4), F16)                  # noqa: E731
    refused(_conv3d(b=b16), pyggml.GGMLTypeError, "the data .src1. of type f16")
    assert kernel_verdict(_conv3d(b=b16)) == "out-of-bounds"


def test_conv_3d_direct_negative_channel_counts():
    # c*oc = 2 and c*n = 3 as the builder checks, all three negative
    build = _conv3d(a=lambda ctx: rand(ctx, (2, 3, 3, 3)), b=lambda ctx: rand(ctx, (3, 5, 5, 5)), c=-1, n=-3, oc=-2)
    refused(build, pyggml.KernelPreconditionError, "n_channels = -1, n_batch = -3 and n_channels_out = -2 must be")
    assert kernel_verdict(build) == "abort"


# --- CONV_2D_DW (ggml_conv_2d_dw_direct) -------------------------------------------------------------

def _dw(a=None, b=None):
    def build(ctx):
        k = a(ctx) if a else rand(ctx, (3, 1, 3, 3))
        x = b(ctx) if b else rand(ctx, (2, 3, 5, 6))
        return pyggml.conv_2d_dw_direct(ctx, k, x, 1, 1, 1, 1, 1, 1)
    return build


def cwhn(ctx, x, dtype=F32):
    """a [W, H, C, N] tensor stored channels first ([C, W, H, N] packed), as test-backend-ops does"""
    base = ctx.from_numpy(np.ascontiguousarray(np.asarray(x).transpose(0, 2, 3, 1)).astype(dtype))
    return pyggml.permute(ctx, base, 2, 0, 1, 3)


def cwhn_kernel(ctx, k, dtype=F32, pad=0):
    """a [KW, KH, 1, C] kernel stored as [C, 1, KW, KH] (channels fastest); pad: extra
    channels in memory (a view of the first C)"""
    c = k.shape[0]
    mem = np.zeros((k.shape[2], k.shape[3], 1, c + pad))        # numpy (KH, KW, 1, C+pad)
    mem[..., :c] = np.asarray(k).transpose(2, 3, 1, 0)
    base = ctx.from_numpy(mem.astype(dtype))
    v = pyggml.view_4d(ctx, base, c, 1, k.shape[3], k.shape[2], base.nb[1], base.nb[2], base.nb[3], 0)
    return pyggml.permute(ctx, v, 3, 2, 0, 1)


def test_conv_2d_dw_direct_types():
    refused(_dw(a=lambda ctx: bf16(ctx, (3, 1, 3, 3))), pyggml.GGMLTypeError, "the kernel .src0. of type bf16")
    assert kernel_verdict(_dw(a=lambda ctx: bf16(ctx, (3, 1, 3, 3)))) == "abort"
    b16 = lambda ctx: rand(ctx, (2, 3, 5, 6), F16)                 # noqa: E731
    refused(_dw(b=b16), pyggml.GGMLTypeError, "the data .src1. of type f16")
    assert kernel_verdict(_dw(b=b16)) == "out-of-bounds"


def test_conv_2d_dw_direct_contiguous_data_needs_a_contiguous_kernel():
    """with contiguous (WHCN) data the kernel is indexed as packed [KW, KH, 1, C]: a
    transposed kernel is read in the wrong order (no assert)"""
    k = vals((3, 1, 3, 2))
    at = lambda ctx: transposed(ctx, k)                              # noqa: E731
    refused(_dw(a=at), pyggml.KernelPreconditionError, "with contiguous data the kernel .src0. must be contiguous")
    want = C._ref_conv_2d_dw(stored(k), stored(vals((2, 3, 5, 6))), 1, 1, 1, 1, 1, 1)
    got = compute_unchecked(_dw(a=at))
    assert not np.allclose(got.reshape(want.shape), want, atol=1e-3)


def test_conv_2d_dw_direct_other_data_layouts_abort():
    bt = lambda ctx: pyggml.transpose(ctx, rand(ctx, (2, 3, 6, 5)))  # noqa: E731
    refused(_dw(b=bt), pyggml.KernelPreconditionError, "must be contiguous or channels-first")
    assert kernel_verdict(_dw(b=bt)) == "abort"


def test_conv_2d_dw_direct_channels_first_kernel_order():
    """channels-first data with a kernel whose strides are not ordered as ggml asserts"""
    b = lambda ctx: cwhn(ctx, vals((2, 3, 5, 6)))                   # noqa: E731
    refused(_dw(b=b), pyggml.KernelPreconditionError, r"needs nb\[2\] <= nb\[0\] <= nb\[1\]")
    assert kernel_verdict(_dw(b=b)) == "abort"
    with pyggml.Context(1 << 20) as ctx:       # the layout the kernel takes: right values
        k, x = vals((3, 1, 3, 3)), vals((2, 3, 5, 6))
        got = computed(ctx, pyggml.conv_2d_dw_direct(ctx, cwhn_kernel(ctx, k), cwhn(ctx, x), 1, 1, 1, 1, 1, 1))
        np.testing.assert_allclose(got, C._ref_conv_2d_dw(stored(k), stored(x), 1, 1, 1, 1, 1, 1), atol=1e-5)


def test_conv_2d_dw_direct_channels_first_needs_packed_strides():
    """ggml checks only the order of the strides; the kernel indexes data and kernel as packed
    channels-first blocks"""
    k, x = vals((3, 1, 3, 3)), vals((2, 3, 5, 6))
    want = C._ref_conv_2d_dw(stored(k), stored(x), 1, 1, 1, 1, 1, 1)

    def kernel_padded(ctx):    # a kernel with 4 channels in memory, viewed as 3
        return pyggml.conv_2d_dw_direct(ctx, cwhn_kernel(ctx, k, pad=1), cwhn(ctx, x), 1, 1, 1, 1, 1, 1)
    refused(kernel_padded, pyggml.KernelPreconditionError, r"the kernel .src0. must be a packed \[C, KW, KH\]")
    assert not np.allclose(compute_unchecked(kernel_padded).reshape(want.shape), want, atol=1e-3)

    def data_padded(ctx):      # data with 4 channels in memory, viewed as 3
        mem = np.zeros((2, 5, 6, 4))
        mem[..., :3] = x.transpose(0, 2, 3, 1)
        base = ctx.from_numpy(mem.astype(F32))
        v = pyggml.view_4d(ctx, base, 3, 6, 5, 2, base.nb[1], base.nb[2], base.nb[3], 0)
        return pyggml.conv_2d_dw_direct(ctx, cwhn_kernel(ctx, k), pyggml.permute(ctx, v, 2, 0, 1, 3),
                                        1, 1, 1, 1, 1, 1)
    refused(data_padded, pyggml.KernelPreconditionError, r"the channels-first data .src1. must be a packed")
    assert not np.allclose(compute_unchecked(data_padded).reshape(want.shape), want, atol=1e-3)


# --- CONV_TRANSPOSE_1D ------------------------------------------------------------------------------

def _ct1(a=None, b=None, s0=1):
    def build(ctx):
        k = a(ctx) if a else rand(ctx, (2, 3, 4))
        x = b(ctx) if b else rand(ctx, (2, 6))
        return pyggml.conv_transpose_1d(ctx, k, x, s0, 0, 1)
    return build


def test_conv_transpose_1d_types_and_layout():
    refused(_ct1(a=lambda ctx: bf16(ctx, (2, 3, 4))), pyggml.GGMLTypeError, "the kernel .src0. of type bf16")
    assert kernel_verdict(_ct1(a=lambda ctx: bf16(ctx, (2, 3, 4)))) == "abort"
    refused(_ct1(b=lambda ctx: rand(ctx, (2, 6), F16)), pyggml.GGMLTypeError, "the data .src1. of type f16")
    assert kernel_verdict(_ct1(b=lambda ctx: rand(ctx, (2, 6), F16))) == "abort"
    ap = lambda ctx: pyggml.permute(ctx, rand(ctx, (2, 4, 3)), 1, 0, 2, 3)   # noqa: E731  nb[0] = 4*ne...
    refused(_ct1(a=ap), pyggml.KernelPreconditionError, "the kernel .src0. must have contiguous rows")
    assert kernel_verdict(_ct1(a=ap)) == "abort"


def test_conv_transpose_1d_negative_stride_writes_before_the_result():
    # (L-1)*s0 + K = 5*-1 + 4 < 0: a negative result size, refused before the op's rule
    refused(_ct1(s0=-1), pyggml.KernelPreconditionError,
            r"CONV_TRANSPOSE_1D result has ne\[0\] = -1: a dimension cannot be negative")
    # a longer kernel: a result of positive size
    build = _ct1(a=lambda ctx: rand(ctx, (2, 3, 12)), s0=-1)
    refused(build, pyggml.KernelPreconditionError, "s0 = -1 must be >= 0")
    assert kernel_verdict(build) == "out-of-bounds"


# --- CONV_TRANSPOSE_2D ------------------------------------------------------------------------------

def _ct2(a=None, b=None, s=2):
    def build(ctx):
        k = a(ctx) if a else rand(ctx, (2, 3, 3, 3))
        x = b(ctx) if b else rand(ctx, (1, 2, 4, 4))
        return pyggml.conv_transpose_2d_p0(ctx, k, x, s)
    return build


def test_conv_transpose_2d_types_and_layout():
    refused(_ct2(a=lambda ctx: bf16(ctx, (2, 3, 3, 3))), pyggml.GGMLTypeError, "the kernel .src0. of type bf16")
    assert kernel_verdict(_ct2(a=lambda ctx: bf16(ctx, (2, 3, 3, 3)))) == "abort"
    refused(_ct2(b=lambda ctx: rand(ctx, (1, 2, 4, 4), F16)), pyggml.GGMLTypeError, "the data .src1. of type f16")
    assert kernel_verdict(_ct2(b=lambda ctx: rand(ctx, (1, 2, 4, 4), F16))) == "abort"
    at = lambda ctx: pyggml.transpose(ctx, rand(ctx, (2, 3, 3, 3)))  # noqa: E731
    refused(_ct2(a=at), pyggml.KernelPreconditionError, "the kernel .src0. must have contiguous rows")
    assert kernel_verdict(_ct2(a=at)) == "abort"
    bt = lambda ctx: pyggml.transpose(ctx, rand(ctx, (1, 2, 4, 4)))  # noqa: E731
    refused(_ct2(b=bt), pyggml.KernelPreconditionError, "the data .src1. must have contiguous rows")
    assert kernel_verdict(_ct2(b=bt)) == "abort"


def test_conv_transpose_2d_kernel_planes_packed():
    """each [KW, KH] plane of the kernel is read as one block: a strided view is misread"""
    k = vals((2, 3, 3, 3))

    def a(ctx):
        big = np.zeros((2, 3, 3, 6))
        big[..., :3] = k
        base = ctx.from_numpy(big.astype(F32))
        return pyggml.view_4d(ctx, base, 3, 3, 3, 2, base.nb[1], base.nb[2], base.nb[3], 0)
    refused(_ct2(a=a), pyggml.KernelPreconditionError, "the kernel .src0. must have packed rows")
    want = C._ref_conv_transpose_2d_p0(stored(k), stored(vals((1, 2, 4, 4))), 2)
    assert not np.allclose(compute_unchecked(_ct2(a=a)).reshape(want.shape), want, atol=1e-3)


def test_conv_transpose_2d_negative_stride():
    build = _ct2(a=lambda ctx: rand(ctx, (2, 3, 9, 9)), s=-1)
    refused(build, pyggml.KernelPreconditionError, "stride = -1 must be >= 0")
    assert kernel_verdict(build) == "out-of-bounds"


def test_conv_transpose_2d_batch_is_an_upstream_defect():
    """the kernel computes batch 0 only: the other batches of the result stay zero. 0.25.3's
    kernel computes every batch, and its reviewed rule takes them there."""
    build = _ct2(b=lambda ctx: rand(ctx, (2, 2, 4, 4)))
    want = C._ref_conv_transpose_2d_p0(stored(vals((2, 3, 3, 3))), stored(vals((2, 2, 4, 4))), 2)
    if kernel_since("CONV_TRANSPOSE_2D", "0.25.3"):
        assert not defects.present("conv-transpose-2d-batch")
        with pyggml.Context(SCRATCH) as ctx:
            got = computed(ctx, build(ctx))
        np.testing.assert_allclose(got.reshape(want.shape), want, atol=1e-4)
        return
    refused(build, pyggml.UpstreamDefect, "computes batch 0 only", "conv-transpose-2d-batch")
    got = compute_unchecked(build)
    np.testing.assert_allclose(got[0], want[0], atol=1e-4)
    if defects.present("conv-transpose-2d-batch"):
        assert np.all(got[1] == 0) and np.abs(want[1]).max() > 1
    else:       # a fixed kernel not reviewed: every batch right, the refusal a false one
        np.testing.assert_allclose(got[1], want[1], atol=1e-4)


# --- POOL_1D, POOL_2D --------------------------------------------------------------------------------

def _pool1(a=None, k=2, op=OpPool.MAX):
    def build(ctx):
        return pyggml.pool_1d(ctx, a(ctx) if a else rand(ctx, (3, 8)), op, k, 2, 0)
    return build


def _pool2(a=None, k=(2, 2), op=OpPool.MAX):
    def build(ctx):
        return pyggml.pool_2d(ctx, a(ctx) if a else rand(ctx, (2, 3, 6, 6)), op, *k, 2, 2, 0, 0)
    return build


def test_pool_bf16_is_read_as_f16():
    x = vals((3, 8))
    refused(_pool1(a=lambda ctx: bf16(ctx, (3, 8))), pyggml.GGMLTypeError, "src0 of type bf16")
    want = C._ref_pool_1d(stored(x), OpPool.MAX, 2, 2, 0)
    assert not np.allclose(compute_unchecked(_pool1(a=lambda ctx: bf16(ctx, (3, 8)))), want, atol=0.1)
    x2 = vals((2, 3, 6, 6))
    refused(_pool2(a=lambda ctx: bf16(ctx, (2, 3, 6, 6))), pyggml.GGMLTypeError, "src0 of type bf16")
    want2 = C._ref_pool_2d(stored(x2), OpPool.MAX, 2, 2, 2, 2, 0, 0)
    assert not np.allclose(compute_unchecked(_pool2(a=lambda ctx: bf16(ctx, (2, 3, 6, 6)))), want2, atol=0.1)


def test_pool_kernel_size_zero():
    """no window: max pooling gives -FLT_MAX everywhere, 2-d average pooling 0/0"""
    refused(_pool1(k=0), pyggml.KernelPreconditionError, "the kernel size k0 = 0 must be > 0")
    assert np.all(compute_unchecked(_pool1(k=0)) == -np.finfo(F32).max)
    refused(_pool2(k=(2, 0), op=OpPool.AVG), pyggml.KernelPreconditionError, "the kernel size k1 = 0 must be > 0")
    assert np.all(np.isnan(compute_unchecked(_pool2(k=(2, 0), op=OpPool.AVG))))


def test_pool_rows_contiguous():
    x = vals((2, 3, 6, 6))
    at = lambda ctx: transposed(ctx, x)                              # noqa: E731
    refused(_pool1(a=at), pyggml.KernelPreconditionError, "src0 must have contiguous rows")
    want1 = C._ref_pool_1d(stored(x), OpPool.MAX, 2, 2, 0)
    assert not np.allclose(compute_unchecked(_pool1(a=at)).reshape(want1.shape), want1, atol=1e-3)
    refused(_pool2(a=at), pyggml.KernelPreconditionError, "src0 must have contiguous rows")
    want2 = C._ref_pool_2d(stored(x), OpPool.MAX, 2, 2, 2, 2, 0, 0)
    assert not np.allclose(compute_unchecked(_pool2(a=at)).reshape(want2.shape), want2, atol=1e-3)


def test_pool_1d_rows_evenly_spaced():
    """rows walked as ir*nb1: a view with nb2 < ne1*nb1 is read past its end"""
    def a(ctx):
        base = rand(ctx, (40,))                # a [4, 3, 2] view: nb1 = 64 bytes, nb2 = 16
        return pyggml.view_3d(ctx, base, 4, 3, 2, 64, 16, 0)
    refused(_pool1(a=a), pyggml.KernelPreconditionError, "src0 must have evenly spaced rows")
    assert kernel_verdict(_pool1(a=a)) == "out-of-bounds"


def test_pool_2d_planes():
    """planes taken by nb2 until ggml_nbytes(src0) is used up: a permuted source gives the
    kernel more planes than the result has (written past it), or fewer (left unwritten)"""
    more = lambda ctx: pyggml.permute(ctx, rand(ctx, (1, 6, 3, 8)), 0, 2, 1, 3)   # noqa: E731  nb2 < nb1
    refused(_pool2(a=more), pyggml.KernelPreconditionError, "planes must be evenly spaced by nb.2.")
    assert kernel_verdict(_pool2(a=more)) == "out-of-bounds"
    x = vals((3, 2, 6, 6))
    def fewer(ctx):            # dims 2 and 3 swapped: nb3 = nb2 / ne3, too few planes
        return pyggml.permute(ctx, ctx.from_numpy(np.ascontiguousarray(x.swapaxes(0, 1)).astype(F32)), 0, 1, 3, 2)
    refused(_pool2(a=fewer), pyggml.KernelPreconditionError, "planes must be evenly spaced by nb.2.")
    want = C._ref_pool_2d(stored(x), OpPool.MAX, 2, 2, 2, 2, 0, 0)
    assert not np.allclose(compute_unchecked(_pool2(a=fewer)).reshape(want.shape), want, atol=1e-3)


def test_pool_2d_fractional_padding_is_an_upstream_defect():
    """ggml_pool_2d sizes its result with float paddings but stores them as int: p0 = 0.5
    on 4 columns (k0 = 2, s0 = 1) gives 4 outputs whose windows start at column 0 (the
    padding p0 = 0 would give 3): the 4th window hangs off the end"""
    x = np.arange(1, 5, dtype=F32).reshape(1, 4)

    def build(ctx, p0=0.5):
        return pyggml.pool_2d(ctx, ctx.from_numpy(x), OpPool.AVG, 2, 1, 1, 1, p0, 0)
    refused(build, pyggml.UpstreamDefect, "the result has 4 outputs along dim 0, the kernel's whole padding p0 = 0 "
            "gives 3", "pool-2d-fractional-padding")
    np.testing.assert_array_equal(compute_unchecked(build).ravel(), [1.5, 2.5, 3.5, 2.0])
    with pyggml.Context(1 << 20) as ctx:     # a fraction that does not change the size: as its whole part
        np.testing.assert_array_equal(computed(ctx, build(ctx, 0.25)).ravel(), [1.5, 2.5, 3.5])


# --- UPSCALE -----------------------------------------------------------------------------------------

def test_upscale_from_an_empty_source():
    build = lambda ctx: pyggml.interpolate(ctx, rand(ctx, (1, 2, 0)), 4, 2, 1, 1, 1)   # noqa: E731
    refused(build, pyggml.KernelPreconditionError, "src0 is empty .* but the result is not")
    assert kernel_verdict(build) == "abort"


def test_upscale_nearest_index_rounding_is_an_upstream_defect():
    """14 -> 2 nearest: ggml maps result index 1 to source 6 (1 / float32(2/14) = 6.9999995),
    not 7 (= floor(1 * 14 / 2)); any resize whose exact index is a whole number can be off"""
    x = np.arange(14, dtype=F32).reshape(1, 14)

    def build(ctx, mode=0):
        return pyggml.interpolate(ctx, ctx.from_numpy(x), 2, 1, 1, 1, mode)
    refused(build, pyggml.UpstreamDefect, "maps result index 1 to source index 6 .* not 7",
            "upscale-nearest-index-rounding")
    np.testing.assert_array_equal(compute_unchecked(build).ravel(), [0, 6])
    # dims 2 and 3 map this way in every mode
    refused(lambda ctx: pyggml.interpolate(ctx, ctx.from_numpy(np.ones((14, 1, 2), F32)), 2, 1, 2, 1, 1),
            pyggml.UpstreamDefect, "dim 2 resized 14 -> 2", "upscale-nearest-index-rounding")
    with pyggml.Context(1 << 20) as ctx:     # 14 -> 7 is exact: accepted
        np.testing.assert_array_equal(
            computed(ctx, pyggml.interpolate(ctx, ctx.from_numpy(x), 7, 1, 1, 1, 0)).ravel(), [0, 2, 4, 6, 8, 10, 12])


@needs_antialias
def test_upscale_antialias_with_aligned_corners_is_an_upstream_defect():
    """bilinear, antialiased, corners aligned (pixel offset 0): the window of result i is
    cut at (int)(x + support), dropping a tap of positive weight. [0, 1] -> 3 gives
    [0, 0, 1], not [0, 0.5, 1] (an upscale: antialiasing should change nothing)"""
    x = np.array([[0, 1]], F32)
    build = lambda ctx: pyggml.interpolate(ctx, ctx.from_numpy(x), 3, 1, 1, 1, 1 | ALIGN | AA)   # noqa: E731
    refused(build, pyggml.UpstreamDefect, "dim 0 resized 2 -> 3: the kernel cuts the window of result index 1",
            "upscale-antialias-align-corners")
    np.testing.assert_array_equal(compute_unchecked(build).ravel(), [0, 0, 1])
    np.testing.assert_allclose(C._ref_interpolate(stored(x), 3, 1, 1, 1, 1 | ALIGN | AA).ravel(), [0, 0.5, 1])
    with pyggml.Context(1 << 20) as ctx:     # without aligned corners: right
        got = computed(ctx, pyggml.interpolate(ctx, ctx.from_numpy(x), 3, 1, 1, 1, 1 | AA))
        np.testing.assert_allclose(got.ravel(), C._ref_interpolate(stored(x), 3, 1, 1, 1, 1 | AA).ravel(), atol=1e-6)


_RESIZE_BAD = [
    ("upscale_ext", lambda ctx, a: pyggml.upscale_ext(ctx, a, -4, 3, 1, 1, 0),
     r"UPSCALE result has ne\[0\] = -4: a dimension cannot be negative"),
    ("interpolate", lambda ctx, a: pyggml.interpolate(ctx, a, 4, 3, -2, 1, 0),
     r"UPSCALE result has ne\[2\] = -2: a dimension cannot be negative"),
    ("interpolate", lambda ctx, a: pyggml.interpolate(ctx, a, 2**40, 2**40, 1, 1, 0),      # 2**80 elements
     r"UPSCALE result has more elements than int64 holds \(ne\[1\] = 1099511627776"),
    ("interpolate", lambda ctx, a: pyggml.interpolate(ctx, a, 2**31, 2**31, 1, 1, 1),      # 2**64 bytes
     r"UPSCALE result takes more bytes than int64 holds \(f32, ne\[1\] = 2147483648"),
    ("interpolate", lambda ctx, a: pyggml.interpolate(ctx, a, 4, 2**63 - 1, 1, 1, 0),
     r"UPSCALE result has more elements than int64 holds \(ne\[1\] = 9223372036854775807"),
]


@pytest.mark.filterwarnings("ignore:ggml_upscale_ext is deprecated")
@pytest.mark.parametrize("no_alloc", [False, True], ids=["pool", "no_alloc"])
@pytest.mark.parametrize("name, build, match", _RESIZE_BAD, ids=[f"{c[0]}-{i}" for i, c in enumerate(_RESIZE_BAD)])
def test_upscale_result_size_is_checked_in_any_context(name, build, match, no_alloc):
    """a negative ne, or one whose element or byte count wraps int64 (the kernel then loops
    over a tensor of 0 bytes), was built in a no_alloc context; a pool context refused it
    only as a context too small for 2**63 bytes"""
    with pyggml.Context(1 << 20, no_alloc=no_alloc) as ctx:
        a = ctx.new_tensor(Type.F32, (4, 3))
        e = refused_size(lambda: build(ctx, a), rf"{name}: UPSCALE node refused: the {match}")
        assert not isinstance(e, pyggml.UpstreamDefect)


@pytest.mark.filterwarnings("ignore:ggml_upscale_ext is deprecated")
@pytest.mark.parametrize("no_alloc", [False, True], ids=["pool", "no_alloc"])
def test_nearby_resizes_still_build_and_compute(no_alloc):
    xv = vals((3, 4))
    for name, ne, mode in (("upscale_ext", (8, 6, 1, 1), 0), ("interpolate", (6, 3, 1, 1), 1),
                           ("interpolate", (2, 3, 1, 1), 0 | ALIGN)):
        want = C._ref_interpolate(stored(xv), *ne, mode)
        with pyggml.Backend("CPU", n_threads=1) as cpu, pyggml.Context(1 << 20, no_alloc=no_alloc) as ctx:
            a = ctx.new_tensor(Type.F32, (4, 3))
            t = getattr(pyggml, name)(ctx, a, *ne, mode)
            got = _compute_on(cpu, ctx, t, {a: xv}, no_alloc)
        np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("no_alloc", [False, True], ids=["pool", "no_alloc"])
def test_interpolate_to_2_63_rows_returns_at_once(no_alloc):
    """the issue's pathological case: ne1 = 2**63 - 1 never returned (the loop over its
    indices), and Ctrl-C could not stop it; now the shape check refuses it first"""
    import time
    with pyggml.Context(1 << 20, no_alloc=no_alloc) as ctx:
        a = ctx.new_tensor(Type.F32, (1, 3))
        t0 = time.monotonic()
        refused_size(lambda: pyggml.interpolate(ctx, a, 1, 2**63 - 1, 1, 1, 0), r"more bytes than int64 holds")
        assert time.monotonic() - t0 < 2.0


# The nearest-index rule in bounded time. It used to compare the kernel's float32 index
# with the exact one at every result index, with the GIL held: a resize to 2**30 rows took
# seconds, one to 2**60 never returned (and Ctrl-C could not stop it).

_HUGE = [
    # (source ne, result ne, mode, what comes back)
    ((4, 3), (4, 2**30, 1, 1), 0, r"dim 1 resized 3 -> 1073741824: the kernel maps result index 357913937 to "
                                  r"source index 1 .* not 0"),
    ((4, 3), (4, 2**30, 1, 1), ALIGN, r"dim 1 resized 3 -> 1073741824: the kernel maps result index 536870896 "),
    ((1, 2), (1, 2**60, 1, 1), 0, r"dim 1 resized 2 -> 1152921504606846976: the kernel maps result index "),
    ((1, 1), (1, 2**60, 1, 1), 0, r"dim 1 resized 1 -> 1152921504606846976: the kernel maps result index \d+ to "
                                  r"source index 1 .*past the source's last, 0"),
    ((4, 2**30), (4, 2**30, 1, 1), 0, r"dim 1 resized 1073741824 -> 1073741824: the kernel maps result index "
                                      r"16777217 to source index 16777216 .* not 16777217"),
]


@pytest.mark.parametrize("no_alloc", [False, True], ids=["pool", "no_alloc"])
@pytest.mark.parametrize("src, ne, mode, match", _HUGE, ids=[f"huge-{i}" for i in range(len(_HUGE))])
def test_upscale_nearest_rule_returns_at_once_on_huge_axes(src, ne, mode, match, no_alloc):
    import time
    with pyggml.Context(1 << 20, no_alloc=True) as src_ctx, pyggml.Context(1 << 20, no_alloc=no_alloc) as ctx:
        a = src_ctx.new_tensor(Type.F32, src)        # no data: only its shape is read
        t0 = time.monotonic()
        with pytest.raises(pyggml.UpstreamDefect, match=match) as e:
            pyggml.interpolate(ctx, a, *ne, mode)
        # microseconds now; the loop over every index took 1.8 s for 2**30 rows on the
        # machine this was written on, and never ended for 2**60
        assert time.monotonic() - t0 < 0.5
    assert e.value.defect == "upscale-nearest-index-rounding"


def test_upscale_huge_witnesses_are_the_first_wrong_index():
    """the indices above, by hand: 3 -> 2**30 maps i to floor(3i / 2**30), 0 below
    2**30/3 = 357913941.33; the kernel's float32 index is nondecreasing, so its first 1 is
    the first wrong index. 2**30 -> 2**30 (sf = 1): float32 holds every integer up to
    2**24 and rounds 2**24 + 1 to 2**24."""
    f = np.float32
    sf = f(f(2**30) / f(3))
    assert int(f(357913937) / sf) == 1 and int(f(357913936) / sf) == 0
    assert 357913937 * 3 // 2**30 == 0
    sfa = f(f(2**30 - 1) / f(2))                    # align corners: (n-1) / (n_src-1)
    assert int(f(536870896) / sfa) == 1 and int(f(536870895) / sfa) == 0 and 536870896 * 2 // (2**30 - 1) == 0
    assert int(f(2**24 + 1) / f(1)) == 2**24


def test_upscale_huge_axes_it_cannot_check_are_refused_as_unverified():
    """both extents above 2**16, one above 2**23, a ratio that is not a power of two, and
    no wrong index among the first and last 2**16: too large to settle in bounded time"""
    with pyggml.Context(1 << 20, no_alloc=True) as ctx:
        a = ctx.new_tensor(Type.F32, (10860990,))
        with pytest.raises(pyggml.UpstreamDefect, match=r"dim 0 resized 10860990 -> 3620330: pyggml cannot "
                                                        r"check in bounded time") as e:
            pyggml.interpolate(ctx, a, 3620330, 1, 1, 1, 0)
        assert e.value.defect == "upscale-nearest-index-rounding"
        # an exact power-of-two ratio of the same size is settled in closed form
        b = ctx.new_tensor(Type.F32, (4 * 3620330,))
        assert pyggml.interpolate(ctx, b, 3620330, 1, 1, 1, 0).ne == (3620330, 1, 1, 1)


def _first_wrong_nearest(n, n_src, align):
    """brute force: every result index, float32 as the kernel computes it"""
    f = np.float32
    if align and n > 1 and n_src > 1:
        sf, num, den = f(f(n - 1) / f(n_src - 1)), n_src - 1, n - 1
    else:
        sf, num, den = f(f(n) / f(n_src)), n_src, n
    for lo in range(0, n, 1 << 20):                  # in chunks: most wrong indices come early
        i = np.arange(lo, min(n, lo + (1 << 20)), dtype=np.int64)
        bad = np.flatnonzero((i.astype(f) / sf).astype(np.int64) != i * num // den)
        if bad.size:
            return lo + int(bad[0])
    return -1


def _rule_first_wrong(n, n_src, align, dim=0):
    """the index the rule names (dim 0 or 2, a 1-d resize), -1 if it accepts"""
    ne, src = [1, 1, 1, 1], [1, 1, 1, 1]
    ne[dim], src[dim] = n, n_src
    with pyggml.Context(1 << 20, no_alloc=True) as ctx:
        a = ctx.new_tensor(Type.F32, tuple(src))
        try:
            pyggml.interpolate(ctx, a, *ne, ALIGN if align else 0)
        except pyggml.UpstreamDefect as e:
            import re
            m = re.search(r"maps result index (\d+) ", str(e))
            assert m, str(e)
            return int(m.group(1))
    return -1


def _random_axes(rng, count, max_exp):
    for _ in range(count):
        n = int(rng.integers(1, 2 ** rng.uniform(0, max_exp) + 2))
        k = rng.random()
        if k < 0.15:
            n_src = n * int(rng.integers(1, 9))
        elif k < 0.3:
            n_src = max(1, n // int(rng.integers(1, 9)))
        elif k < 0.35:
            n_src = n
        else:
            n_src = int(rng.integers(1, 2 ** rng.uniform(0, max_exp) + 2))
        yield n, min(n_src, 2**23), bool(rng.random() < 0.5)


@pytest.mark.parametrize("seed, count, max_exp", [(0, 1500, 12), (1, 400, 17), (2, 60, 22)])
def test_upscale_nearest_rule_equals_a_brute_force_count(seed, count, max_exp):
    """the bounded-time rule names the same first wrong index as a float32 brute force over
    every result index (or accepts exactly where it finds none): random extents up to 2**12,
    2**17 and 2**22 (the larger ones where the rounding goes wrong between whole indices
    too), whole and power-of-two ratios among them, corners aligned or not"""
    rng = np.random.default_rng(seed)
    wrong = 0
    for n, n_src, align in _random_axes(rng, count, max_exp):
        want = _first_wrong_nearest(n, n_src, align)
        assert _rule_first_wrong(n, n_src, align) == want, (n, n_src, align)
        wrong += want >= 0
    assert 0 < wrong < count                      # both sides of the rule were seen


@pytest.mark.parametrize("n, n_src, align", [
    (1000, 2**24 + 12345, False), (65536, 3 * 2**23 + 7, True), (40000, 2**24 + 1, False),   # every index
    (2**24 + 9, 3, False), (2**24 + 4097, 60000, True), (2**25 + 1, 2, True),               # every run
])
def test_upscale_nearest_rule_past_2_23_equals_the_brute_force(n, n_src, align):
    """axes past float32's exact integers, where the rule checks every index (n <= 2**16)
    or both ends of every run of equal exact index (at most 2**16 runs)"""
    assert _rule_first_wrong(n, n_src, align) == _first_wrong_nearest(n, n_src, align)


def test_upscale_nearest_rule_on_dims_2_and_3_equals_the_brute_force():
    """dims 2 and 3 map nearest in every mode, never with aligned corners"""
    rng = np.random.default_rng(3)
    for n, n_src, _ in _random_axes(rng, 200, 10):
        assert _rule_first_wrong(n, n_src, False, dim=2) == _first_wrong_nearest(n, n_src, False)


def _first_dropped_tap(n, n_src):
    """brute force of the antialias + align corners window cut (C._antialias_drops_tap),
    returning the first result index"""
    f = np.float32
    sf = f(f(n - 1) / f(n_src - 1)) if n > 1 and n_src > 1 else f(f(n) / f(n_src))
    support = max(f(1.0), f(f(1.0) / sf))
    inv = f(f(1.0) / support)
    x = np.arange(n, dtype=f) / sf
    hi = (x + support).astype(np.int64)
    d = np.abs((hi.astype(f) - x) * inv)
    bad = np.flatnonzero((hi >= 0) & (hi < n_src) & (f(1.0) - d > 0))
    return int(bad[0]) if bad.size else -1


@needs_antialias
def test_upscale_antialias_rule_equals_a_brute_force():
    rng = np.random.default_rng(4)
    seen = set()
    extra = [(n, n, False) for n in (1, 2, 200000)] + [(300000, 1, False)]
    for n, n_src, _ in list(_random_axes(rng, 400, 12)) + extra:
        want = _first_dropped_tap(n, n_src)
        if n <= 300:
            assert C._antialias_drops_tap(n, n_src) == (want >= 0)
        with pyggml.Context(1 << 20, no_alloc=True) as ctx:
            a = ctx.new_tensor(Type.F32, (n_src, 2))
            try:
                pyggml.interpolate(ctx, a, n, 2, 1, 1, 1 | ALIGN | AA)
                got = -1
            except pyggml.UpstreamDefect as e:
                assert e.defect == "upscale-antialias-align-corners", str(e)
                got = int(str(e).split("window of result index ")[1].split()[0])
        assert got == want, (n, n_src)
        seen.add(got >= 0)
    assert seen == {True, False}


# --- TIMESTEP_EMBEDDING ------------------------------------------------------------------------------

def test_timestep_embedding_types_and_layout():
    build = lambda ctx: pyggml.timestep_embedding(ctx, rand(ctx, (3,), F16), 8, 10000)   # noqa: E731
    refused(build, pyggml.GGMLTypeError, "the timesteps .src0. of type f16")
    assert kernel_verdict(build) == "abort"
    tr = lambda ctx: pyggml.timestep_embedding(ctx, pyggml.transpose(ctx, rand(ctx, (3, 2))), 8, 10000)  # noqa: E731
    refused(tr, pyggml.KernelPreconditionError, "the timesteps .src0. must have contiguous rows")
    assert kernel_verdict(tr) == "abort"


@pytest.mark.parametrize("period", [0, -5])
def test_timestep_embedding_max_period(period):
    def build(ctx):
        return pyggml.timestep_embedding(ctx, ctx.from_numpy(np.array([1.0, 2.0], F32)), 6, period)
    refused(build, pyggml.KernelPreconditionError, f"max_period = {period} must be > 0")
    assert np.isnan(compute_unchecked(build)).any()


@pytest.mark.parametrize("no_alloc", [False, True], ids=["pool", "no_alloc"])
def test_timestep_embedding_negative_dim(no_alloc):
    """ggml_timestep_embedding makes [dim, N] unchecked: dim = -8 was a result of ne0 = -8"""
    ts = np.array([1.0, 2.0, 30.0], F32)
    with pyggml.Backend("CPU", n_threads=1) as cpu, pyggml.Context(1 << 20, no_alloc=no_alloc) as ctx:
        a = ctx.new_tensor(Type.F32, (3,))
        with pytest.raises(pyggml.KernelPreconditionError,
                           match=r"timestep_embedding: TIMESTEP_EMBEDDING node refused: the TIMESTEP_EMBEDDING "
                                 r"result has ne\[0\] = -8: a dimension cannot be negative"):
            pyggml.timestep_embedding(ctx, a, -8, 10000)
        t = pyggml.timestep_embedding(ctx, a, 8, 10000)            # nearby: dim = 8
        got = _compute_on(cpu, ctx, t, {a: ts}, no_alloc)
    want = C._ref_timestep_embedding(ts.astype(np.float64), 8, 10000)
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-5, atol=1e-5)


# --- composite builders: defects no kernel rule can see ------------------------------------------

@pytest.mark.parametrize("op", ["conv_1d", "conv_1d_ph"])
def test_conv_1d_with_a_batch_is_refused_and_really_scrambled(op):
    """ggml_conv_1d reshapes mul_mat's [OL, N, OC] product to [OL, OC, N] without permuting
    it (conv_2d permutes): with N > 1 the values of batches and channels interleave. Every
    node is sound for its kernel, so no rule sees it: the wrapper refuses a batch
    (pyggml/_prechecks.py)."""
    a, b = vals((4, 3, 3)), vals((2, 3, 8))
    call = {"conv_1d": lambda c, bb: pyggml.conv_1d(c, c.from_numpy(a.astype(F32)), c.from_numpy(bb), 1, 0, 1),
            "conv_1d_ph": lambda c, bb: pyggml.conv_1d_ph(c, c.from_numpy(a.astype(F32)), c.from_numpy(bb), 1, 1)}
    p0 = 0 if op == "conv_1d" else 1                                       # half padding: K/2 = 1
    with pyggml.Context(1 << 20) as ctx:
        with pytest.raises(pyggml.UpstreamDefect, match="without permuting") as e:
            call[op](ctx, b.astype(F32))
    assert e.value.defect == "conv-1d-batch-layout"
    want = C._ref_conv_1d(stored(a), stored(b), 1, p0, 1)                  # (N, OC, OL)
    with rules_disabled(), pyggml.Context(1 << 20) as ctx:
        got = computed(ctx, call[op](ctx, b.astype(F32)))
    ol = want.shape[-1]
    assert got.shape == want.shape and not np.allclose(got, want, atol=0.05)
    np.testing.assert_allclose(got.reshape(4, 2, ol).transpose(1, 0, 2), want, atol=0.05)   # really [OL, N, OC]
    with pyggml.Context(1 << 20) as ctx:     # N = 1: right, and accepted
        got1 = computed(ctx, call[op](ctx, b[:1].astype(F32)))
    np.testing.assert_allclose(got1.reshape(want[:1].shape), want[:1], atol=0.05)


def test_conv_2d_dw_with_an_f32_kernel_is_refused_where_mul_mat_aborts():
    """ggml_conv_2d_dw makes F16 columns and multiplies them as mul_mat's src1 by the kernel
    (src0): the pinned CPU mul_mat takes src1 of F32 or src0's vec_dot type only (F32 for an
    F32 kernel). The core MUL_MAT rule refuses it; unrefused, the kernel aborts. ggml
    0.25.3's converts the F16 columns to F32 (reviewed: the rule takes them there); where
    MUL_MAT's kernel changed unreviewed, the proof decides; the values are checked against
    the float64 reference (the columns rounded to F16)."""
    k = np.random.default_rng(0).standard_normal((3, 1, 3, 3)).astype(np.float32)
    x = np.random.default_rng(1).standard_normal((1, 3, 6, 6)).astype(np.float32)

    def build(ctx):
        return pyggml.conv_2d_dw(ctx, ctx.from_numpy(k), ctx.from_numpy(x), 1, 1, 0, 0, 1, 1)
    out = refused_where_kernel_aborts(build, pyggml.GGMLTypeError, "MUL_MAT node refused: src1 must be F32 or f32",
                                      "MUL_MAT", since="0.25.3")
    if out is not None:
        want = C._ref_conv_2d_dw(k.astype(np.float64), x.astype(np.float16).astype(np.float64), 1, 1, 0, 0, 1, 1)
        np.testing.assert_allclose(out.reshape(want.shape), want, rtol=1e-3, atol=1e-3)


STRIDE_ZERO = [
    ("im2col", lambda c: pyggml.im2col(c, rand(c, (1, 1, 3, 3)), rand(c, (1, 1, 6, 6)), 1, 0, 0, 0, 1, 1, True,
                                       Type.F32)),
    ("conv_1d", lambda c: pyggml.conv_1d(c, rand(c, (2, 2, 3)), rand(c, (1, 2, 6)), 0, 0, 1)),
    ("conv_1d_ph", lambda c: pyggml.conv_1d_ph(c, rand(c, (2, 2, 3)), rand(c, (1, 2, 6)), 0, 1)),
    ("conv_1d_dw", lambda c: pyggml.conv_1d_dw(c, rand(c, (2, 1, 3)), rand(c, (2, 6)), 0, 0, 1)),
    ("conv_1d_dw_ph", lambda c: pyggml.conv_1d_dw_ph(c, rand(c, (2, 1, 3)), rand(c, (2, 6)), 0, 1)),
    ("conv_2d", lambda c: pyggml.conv_2d(c, rand(c, (2, 2, 3, 3)), rand(c, (1, 2, 6, 6)), 0, 1, 0, 0, 1, 1)),
    ("conv_2d_sk_p0", lambda c: pyggml.conv_2d_sk_p0(c, rand(c, (2, 2, 0, 3)), rand(c, (1, 2, 6, 6)))),
    ("conv_2d_dw", lambda c: pyggml.conv_2d_dw(c, rand(c, (2, 1, 3, 3)), rand(c, (1, 2, 6, 6)), 1, 0, 0, 0, 1, 1)),
    ("conv_2d_dw_direct", lambda c: pyggml.conv_2d_dw_direct(c, rand(c, (2, 1, 3, 3)), rand(c, (1, 2, 6, 6)),
                                                             0, 1, 0, 0, 1, 1)),
    ("conv_2d_direct", lambda c: pyggml.conv_2d_direct(c, rand(c, (2, 2, 3, 3)), rand(c, (1, 2, 6, 6)),
                                                       1, 0, 0, 0, 1, 1)),
    ("im2col_3d", lambda c: pyggml.im2col_3d(c, rand(c, (4, 3, 3, 3)), rand(c, (2, 5, 5, 5)), 2, 1, 1, 0,
                                             0, 0, 0, 1, 1, 1, Type.F32)),
    ("im2col_3d IC=0", lambda c: pyggml.im2col_3d(c, rand(c, (4, 3, 3, 3)), rand(c, (2, 5, 5, 5)), 0, 1, 1, 1,
                                                  0, 0, 0, 1, 1, 1, Type.F32)),
    ("conv_3d", lambda c: pyggml.conv_3d(c, rand(c, (4, 3, 3, 3)), rand(c, (2, 5, 5, 5)), 2, 0, 1, 1, 0, 0, 0,
                                         1, 1, 1)),
    ("conv_3d IC=0", lambda c: pyggml.conv_3d(c, rand(c, (4, 3, 3, 3)), rand(c, (2, 5, 5, 5)), 0, 1, 1, 1,
                                              0, 0, 0, 1, 1, 1)),
    ("conv_3d_direct", lambda c: pyggml.conv_3d_direct(c, rand(c, (4, 3, 3, 3)), rand(c, (2, 5, 5, 5)),
                                                       1, 1, 0, 0, 0, 0, 1, 1, 1, 2, 1, 2)),
]


@pytest.mark.parametrize("name, build", STRIDE_ZERO, ids=[n for n, _ in STRIDE_ZERO])
def test_builders_that_divide_by_a_zero_stride(name, build, quiet_faulthandler):
    """ggml_calc_conv_output_size divides by the stride (conv_2d_sk_p0: by the kernel size;
    im2col_3d and conv_3d: b->ne[3] by IC): the builder raises SIGFPE, caught by the guard.
    (Dilations are never divided by; pool sizes divide in float and then assert.)"""
    with pyggml.Context(1 << 20) as ctx:
        with pytest.raises(pyggml.GGMLAbort, match="SIGFPE"):
            build(ctx)


def test_zero_stride_transposed_convolutions_are_accepted():
    """conv_transpose_1d / _2d with stride 0 add every input position onto the same K
    outputs: memory-safe, and the formula's value"""
    with pyggml.Context(1 << 20) as ctx:
        a, b = vals((2, 3, 4)), vals((2, 5))
        got = computed(ctx, pyggml.conv_transpose_1d(ctx, ctx.from_numpy(a.astype(F32)),
                                                    ctx.from_numpy(b.astype(F32)), 0, 0, 1))
    np.testing.assert_allclose(got, np.einsum("il,iok->ok", stored(b), stored(a)), atol=1e-5)
