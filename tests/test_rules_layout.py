"""Both sides of the [layout] kernel rules (pyggml/csrc/rules_layout.c).

For each refusal: pyggml raises the right class at the op call, and the same node with
the rules off really fails in the CPU kernel (kernel_verdict: "abort" or
"out-of-bounds"), or computes wrong values (shown against what the op should give).
The accepted side is the opinfo samples (tests/test_opinfo.py, pyggml/opinfo/layout.py).

Clauses that only restate what ggml's builder already asserts (concat's types and dim,
get_rows' index type and shapes, set_rows' source/index types and contiguous rows,
pad_reflect_1d's pads, roll's shifts, tri's type and layout, win_part's shape) cannot
be reached through the builders; they are kept in the rules for nodes made otherwise.

The last part checks the DUP/CONT/CPY rule against the kernel, including the cases an
earlier rule got wrong (four of them upstream defects).
"""

import math

import numpy as np
import pytest

import pyggml
from pyggml import Type
from pyggml.opinfo.harness import grad_check, kernel_verdict, rules_disabled
from pyggml.opinfo import Arg, Sample, registry
from pyggml.opinfo._common import kernel_before, kernel_since
from rules_helpers import compute, compute_unchecked, refused


@pytest.fixture
def ctx():
    with pyggml.Context(64 << 20) as c:
        yield c


def f32(ctx, x):
    return ctx.from_numpy(np.asarray(x, np.float32))


def q8(ctx, x):
    x = np.asarray(x, np.float32)
    return ctx.from_numpy(pyggml.quantize(Type.Q8_0, x), type=Type.Q8_0)






RNG = np.random.default_rng(7)

# --- CONCAT ---------------------------------------------------------------------------------


def _concat_q_transposed(ctx):
    x = q8(ctx, RNG.standard_normal((64, 64)))
    y = q8(ctx, RNG.standard_normal((2, 64)))
    return pyggml.concat(ctx, pyggml.transpose(ctx, x), y, 1)


def _concat_q_partial_blocks(ctx):
    x = q8(ctx, RNG.standard_normal((2, 64)))
    v = pyggml.view_2d(ctx, x, 48, 2, x.nb[1], 0)
    return pyggml.concat(ctx, v, v, 1)


def test_concat_quantized_needs_contiguous_rows():
    refused(_concat_q_transposed, pyggml.KernelPreconditionError, "contiguous rows")
    assert kernel_verdict(_concat_q_transposed) == "abort"


def test_concat_quantized_needs_whole_blocks():
    # a Q8_0 row of 1.5 blocks is no tensor ggml can size (ggml_row_size asserts whole
    # blocks in debug builds): the view is refused whatever the kernels. 0.20.2's CONCAT
    # kernel aborts on it; that 0.25.3's runs it says nothing about the refusal, which is
    # the view's
    refused(_concat_q_partial_blocks, pyggml.KernelPreconditionError, "view or reshape needs rows of whole blocks of 32")
    if kernel_before("CONCAT", "0.25.3"):
        assert kernel_verdict(_concat_q_partial_blocks) == "abort"


def _concat_i64_transposed(ctx):
    x = ctx.from_numpy(np.arange(12, dtype=np.int64).reshape(3, 4))
    y = ctx.from_numpy(np.arange(100, 106, dtype=np.int64).reshape(2, 3))
    return pyggml.concat(ctx, pyggml.transpose(ctx, x), y, 1)


WANT_I64 = np.concatenate([np.arange(12).reshape(3, 4).T, np.arange(100, 106).reshape(2, 3)], axis=0)


def test_concat_of_i64_with_strided_rows_is_refused_where_the_kernel_copies_rows():
    """0.20.2's concat_any copies I64 (and F64) element by element with any strides; 0.25.3's
    copies whole rows and asserts contiguous ones. The rule follows the kernel (reviewed for
    0.25.3: pg_kernel_since)."""
    if kernel_since("CONCAT", "0.25.3"):
        refused(_concat_i64_transposed, pyggml.KernelPreconditionError, "i64 sources must have contiguous rows")
        assert kernel_verdict(_concat_i64_transposed) == "abort"
        return
    if kernel_before("CONCAT", "0.25.3"):
        with pyggml.Context(1 << 20) as ctx:
            np.testing.assert_array_equal(compute(ctx, _concat_i64_transposed(ctx)), WANT_I64)
        was = pyggml._core._set_kernel_reviewed(pyggml.Op.CONCAT, "0.25.3")     # the rule for 0.25.3's kernel
        try:
            refused(_concat_i64_transposed, pyggml.KernelPreconditionError, "i64 sources must have contiguous rows")
        finally:
            pyggml._core._set_kernel_reviewed(pyggml.Op.CONCAT, was)


# --- GET_ROWS -------------------------------------------------------------------------------


@pytest.mark.parametrize("typ", [Type.Q8_K, Type.F64, Type.I16])
def test_get_rows_types(typ):
    def build(ctx):
        a = ctx.new_tensor(typ, (256, 4))
        return pyggml.get_rows(ctx, a, ctx.from_numpy(np.array([0, 3], np.int32)))
    refused(build, pyggml.GGMLTypeError, "does not take src0")
    assert kernel_verdict(build) == "abort"


def _get_rows_transposed(ctx):
    a = f32(ctx, np.arange(128.0).reshape(4, 32))      # ne (32, 4); transposed: ne (4, 32), nb0 = 128
    return pyggml.get_rows(ctx, pyggml.transpose(ctx, a), ctx.from_numpy(np.array([3], np.int32)))


def test_get_rows_needs_contiguous_rows():
    refused(_get_rows_transposed, pyggml.KernelPreconditionError, "contiguous rows")
    # rules off: row 3 of the transposed a is the column [3, 35, 67, 99]; the kernel reads
    # 4 packed floats from its start instead (an assert compiled out in release builds)
    assert compute_unchecked(_get_rows_transposed).reshape(-1).tolist() == [3, 4, 5, 6]


def test_get_rows_rows_of_one_element_take_any_stride():
    """a row of one element is read at its start: nb[0] does not matter (accepted, right)"""
    with pyggml.Context(1 << 20) as ctx:
        a = pyggml.transpose(ctx, f32(ctx, [[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]]))    # ne (1, 6), nb0 = 24
        t = pyggml.get_rows(ctx, a, ctx.from_numpy(np.array([5, 0, 2], np.int32)))
        g = pyggml.Graph(ctx, 8)
        g.build_forward_expand(t)
        g.compute(1)
        assert t.numpy().reshape(-1).tolist() == [5.0, 0.0, 2.0]


def test_get_rows_needs_whole_blocks():
    x = RNG.standard_normal((3, 64)).astype(np.float32)

    def build(ctx):
        a = q8(ctx, x)
        v = pyggml.view_2d(ctx, a, 48, 3, a.nb[1], 0)     # rows of 1.5 blocks
        return pyggml.get_rows(ctx, v, ctx.from_numpy(np.array([2, 0], np.int32)))
    refused(build, pyggml.KernelPreconditionError, "view or reshape needs rows of whole blocks of 32")
    # rules off: the kernel dequantizes floor(48/32) blocks: the last 16 values of each row
    # are never written (the result is filled with NaN before computing, to show it)
    with rules_disabled(), pyggml.Context(64 << 20) as ctx:
        t = build(ctx)
        g = pyggml.Graph(ctx, 16)
        g.build_forward_expand(t)
        t.numpy()[:] = np.nan
        g.compute(1)
        out = t.numpy().copy()
    want = pyggml.dequantize(Type.Q8_0, pyggml.quantize(Type.Q8_0, x), x.shape)[[2, 0], :48]
    assert np.allclose(out[:, :32], want[:, :32])
    assert np.isnan(out[:, 32:]).all()


def _get_rows_no_rows(ctx):
    a = ctx.new_tensor(Type.F32, (5, 0))
    return pyggml.get_rows(ctx, a, ctx.from_numpy(np.array([0, 1], np.int32)))


def test_get_rows_from_no_rows():
    refused(_get_rows_no_rows, pyggml.KernelPreconditionError, "no rows")
    assert kernel_verdict(_get_rows_no_rows) == "abort"


@pytest.mark.parametrize("index", [4, -1])
def test_get_rows_index_out_of_range_is_data_the_rule_cannot_see(index):
    """the indices are tensor data: the rule accepts the node; the kernel asserts each
    index lies in [0, ne01) (GGML_ASSERT, active in release builds: the process aborts)"""
    def build(ctx):
        a = f32(ctx, RNG.standard_normal((4, 3)))
        return pyggml.get_rows(ctx, a, ctx.from_numpy(np.array([0, index], np.int32)))
    with pyggml.Context(1 << 20) as ctx:
        build(ctx)                                        # accepted
    assert kernel_verdict(build) == "abort"


# --- SET_ROWS -------------------------------------------------------------------------------


@pytest.mark.parametrize("typ", [Type.IQ2_XXS, Type.I16, Type.F64])
def test_set_rows_result_types_without_from_float(typ):
    def build(ctx):
        a = ctx.new_tensor(typ, (256, 8))
        rows = f32(ctx, np.zeros((2, 256)))
        return pyggml.set_rows(ctx, a, rows, ctx.from_numpy(np.array([1, 5], np.int64)))
    refused(build, pyggml.GGMLTypeError, "cannot write rows")
    assert kernel_verdict(build) == "abort"


def test_set_rows_needs_whole_blocks():
    x = np.zeros((2, 64), np.float32)
    b = RNG.standard_normal((1, 48)).astype(np.float32) + 3.0

    def build(ctx):
        a = q8(ctx, x)
        v = pyggml.view_2d(ctx, a, 48, 2, a.nb[1], 0)     # rows of 1.5 blocks
        return pyggml.set_rows(ctx, v, f32(ctx, b), ctx.from_numpy(np.array([1], np.int64)))
    refused(build, pyggml.KernelPreconditionError, "view or reshape needs rows of whole blocks of 32")
    # rules off: only floor(48/32) blocks are quantized into row 1: values 32..47 stay 0
    with rules_disabled(), pyggml.Context(64 << 20) as ctx:
        t = build(ctx)
        g = pyggml.Graph(ctx, 16)
        g.build_forward_expand(t)
        g.compute(1)
        row = pyggml.dequantize(Type.Q8_0, t.view_src.blocks().copy(), (2, 64))[1]
    assert np.allclose(row[:32], b[0, :32], atol=0.05)
    assert np.all(row[32:48] == 0)


@pytest.mark.parametrize("index", [6, -2])
def test_set_rows_index_out_of_range_is_data_the_rule_cannot_see(index):
    def build(ctx):
        a = f32(ctx, np.zeros((6, 3)))
        return pyggml.set_rows(ctx, a, f32(ctx, np.ones((2, 3))), ctx.from_numpy(np.array([0, index], np.int64)))
    with pyggml.Context(1 << 20) as ctx:
        build(ctx)
    assert kernel_verdict(build) == "abort"


# --- SET ------------------------------------------------------------------------------------


def test_set_types():
    def f16(ctx):
        return pyggml.set(ctx, ctx.from_numpy(np.zeros((4, 6), np.float16)),
                          ctx.from_numpy(np.ones((2, 3), np.float16)), 12, 48, 48, 0)
    refused(f16, pyggml.GGMLTypeError, "does not take src0 of type f16")
    assert kernel_verdict(f16) == "abort"

    def mixed(ctx):
        return pyggml.set_1d(ctx, f32(ctx, np.zeros(4)), ctx.from_numpy(np.array([1, 2], np.int32)), 4)
    refused(mixed, pyggml.GGMLTypeError, "must have src0's type")
    # rules off: the I32 bits land in the F32 tensor as they are (1 -> 1.4e-45)
    out = compute_unchecked(mixed)
    assert out[1] != 1.0 and out[1] == np.array([1], np.int32).view(np.float32)[0]


def _set_a_transposed(ctx):
    a = f32(ctx, np.zeros((6, 4)))
    return pyggml.set(ctx, pyggml.transpose(ctx, a), f32(ctx, np.ones((2, 3))), 24, 96, 96, 0)


def _set_b_transposed(ctx):
    b = f32(ctx, np.ones((3, 2)))
    return pyggml.set(ctx, f32(ctx, np.zeros((4, 6))), pyggml.transpose(ctx, b), 24, 96, 96, 0)


def test_set_layouts():
    refused(_set_a_transposed, pyggml.KernelPreconditionError, "src0 must be contiguous")
    assert kernel_verdict(_set_a_transposed) == "abort"
    refused(_set_b_transposed, pyggml.KernelPreconditionError, "src1 must have contiguous rows")
    assert kernel_verdict(_set_b_transposed) == "abort"


def test_set_misaligned_offset():
    def build(ctx):
        return pyggml.set_1d(ctx, f32(ctx, np.zeros(4)), f32(ctx, [1.1]), 2)
    refused(build, pyggml.KernelPreconditionError, "offset")
    # rules off: the float is stored across elements 0 and 1, neither of which reads 1.1
    out = compute_unchecked(build)
    assert out[0] != 0 and out[1] != 0 and np.float32(1.1) not in out


@pytest.mark.parametrize("nb1", [2**32 - 4, 2**32 + 24, 2**31])
def test_set_stride_the_builder_would_truncate(nb1):
    """ggml_set_impl stores nb1..nb3 and offset as int32 op_params: 2**32 - 4 would become
    -4 (row 1 written one element BEFORE row 0), 2**32 + 24 silently 24: the wrapper
    refuses any value the int32 cannot hold, before the builder"""
    with pyggml.Context(1 << 20) as ctx:
        with pytest.raises(pyggml.ArgumentError, match="nb1 must be in .0, 2..31 - 1. .bytes: ggml keeps it"):
            pyggml.set(ctx, f32(ctx, np.zeros((4, 6))), f32(ctx, [[1, 1, 1], [2, 2, 2]]), nb1, 96, 96, 48)
        pyggml.set(ctx, f32(ctx, np.zeros((4, 6))), f32(ctx, [[1, 1, 1], [2, 2, 2]]), 24, 96, 96, 48)


def test_set_misaligned_stride():
    def build(ctx):
        return pyggml.set(ctx, f32(ctx, np.zeros((4, 6))), f32(ctx, np.ones((2, 3))), 26, 96, 96, 0)
    refused(build, pyggml.KernelPreconditionError, "nb1 .26 bytes.")
    out = compute_unchecked(build).reshape(-1)
    assert not set(np.unique(out)) <= {0.0, 1.0}        # a float stored at byte 26: garbage


def test_set_past_the_end():
    def build(ctx):
        return pyggml.set_1d(ctx, f32(ctx, np.zeros(24)), f32(ctx, [1.0]), 100)
    e = refused(build, pyggml.KernelPreconditionError, "reaches byte 104")
    assert not isinstance(e, pyggml.UpstreamDefect)
    assert kernel_verdict(build) == "abort"                  # the kernel's own check catches this one


@pytest.mark.parametrize("build", [
    lambda ctx: pyggml.set_1d(ctx, f32(ctx, np.zeros(1024)), f32(ctx, [1.0]), 4096),
    lambda ctx: pyggml.set_2d(ctx, f32(ctx, np.zeros((32, 32))), f32(ctx, np.ones((2, 4))), 2048, 2036),
    lambda ctx: pyggml.set_inplace(ctx, f32(ctx, np.zeros((32, 32))), f32(ctx, np.ones((1, 2))), 128, 128, 128,
                                   4096 - 4),
], ids=["set_1d", "set_2d", "set_inplace"])
def test_set_last_element_past_the_end_is_an_upstream_defect(build):
    """the kernel asserts offset + sum (ne_i - 1)*nb_i <= nbytes: the START of b's last
    element; ggml's ACC kernel asserts the same sum < nbytes. With the last element
    starting at the very end, SET writes one element past a."""
    e = refused(build, pyggml.UpstreamDefect, "past src0")
    assert e.defect == "set-bounds-off-by-one"
    assert kernel_verdict(build) == "out-of-bounds"


# --- DIAG, PAD, ROLL ------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["diag", "pad", "roll", "pad_reflect"])
def test_f32_only_kernels(op):
    def build(ctx):
        a = ctx.from_numpy(np.zeros((3, 4), np.float16))
        if op == "diag":
            return pyggml.diag(ctx, pyggml.reshape_2d(ctx, a, 12, 1))
        if op == "pad":
            return pyggml.pad(ctx, a, 1, 0, 0, 0)
        if op == "roll":
            return pyggml.roll(ctx, a, 1, 0, 0, 0)
        return pyggml.pad_reflect_1d(ctx, a, 1, 1)
    if op == "pad_reflect":                                   # ggml_pad_reflect_1d asserts F32 itself
        with pyggml.Context(1 << 20) as ctx, pytest.raises(pyggml.GGMLAbort):
            build(ctx)
        return
    refused(build, pyggml.GGMLTypeError, "does not take src0 of type f16")
    assert kernel_verdict(build) == "abort"


def _diag_strided_rows(ctx):
    a = f32(ctx, np.zeros((2, 1, 8)))                          # ne (8, 1, 2)
    return pyggml.diag(ctx, pyggml.permute(ctx, a, 2, 1, 0, 3))  # ne (2, 1, 8), nb0 = 32


def test_diag_needs_contiguous_rows():
    refused(_diag_strided_rows, pyggml.KernelPreconditionError, "contiguous rows")
    assert kernel_verdict(_diag_strided_rows) == "abort"


def _pad_circular_empty(ctx):
    return pyggml.pad_circular(ctx, ctx.new_tensor(Type.F32, (0, 3)), 2, 0, 0, 0)


def test_pad_circular_of_an_empty_axis():
    refused(_pad_circular_empty, pyggml.KernelPreconditionError, "nothing to wrap")
    assert kernel_verdict(_pad_circular_empty) == "abort"       # SIGFPE: % 0


def test_pad_zero_of_an_empty_axis_is_fine():
    # padding an empty axis gives an axis of zeros, no read of the (empty) source
    with pyggml.Context(1 << 20) as ctx:
        r = pyggml.pad(ctx, ctx.new_tensor(Type.F32, (0, 3)), 2, 0, 0, 0)
        assert r.ne == (2, 3, 1, 1)
        g = pyggml.Graph(ctx)
        g.build_forward_expand(r)
        r.numpy()[...] = np.nan
        g.compute(1)
        assert np.array_equal(r.numpy(), np.zeros((3, 2), np.float32))


@pytest.mark.parametrize("pads", [(33, 0, 0, 0, 0, 0, 0, 0), (0, 0, 34, 0, 0, 0, 0, 0), (64, 1, 0, 0, 0, 0, 0, 0)])
def test_pad_circular_left_pad_beyond_the_extent_is_an_upstream_defect(pads):
    """ggml_wrap_around(i - lp, ne) = (i - lp + ne) % ne is negative for i < lp - ne: the
    kernel reads before src0 (the source is a whole page, so the read hits the guard)"""
    def build(ctx):
        return pyggml.pad_ext_circular(ctx, f32(ctx, np.zeros((32, 32))), *pads)
    e = refused(build, pyggml.UpstreamDefect, "reads before src0")
    assert e.defect == "pad-circular-left-oob"
    assert kernel_verdict(build) == "out-of-bounds"


def test_pad_circular_left_pad_beyond_a_unit_axis_is_fine():
    """on an axis of extent 1 every index wraps to 0 (x % 1 == 0): accepted, and right"""
    with pyggml.Context(1 << 20) as ctx:
        a = f32(ctx, [[1.0, 2.0]])
        t = pyggml.pad_ext_circular(ctx, a, 0, 0, 3, 0, 0, 0, 0, 0)
        g = pyggml.Graph(ctx, 8)
        g.build_forward_expand(t)
        g.compute(1)
        assert t.numpy().tolist() == [[1.0, 2.0]] * 4


# --- results of a negative size: the shape check every node passes -------------------------
#
# ggml_pad_ext adds the pads to src0's ne and ggml_repeat_4d takes ne as given, unchecked. A
# pool context used to refuse such a result only by accident (its byte count wrapped: a
# ContextFullError for 2**63 bytes); a no_alloc context kept it, with wrapped strides, and a
# MUL_MAT over it dotted rows of -6 elements (reading before its sources). Refused now in
# both, before any op rule, naming the op, the dimension and the value.

_NEG = [
    ("pad", lambda ctx, a: pyggml.pad(ctx, a, 0, -8, 0, 0), 1, -5),
    ("pad_ext", lambda ctx, a: pyggml.pad_ext(ctx, a, -3, -3, 0, 0, 0, 0, 0, 0), 0, -2),
    ("pad_circular", lambda ctx, a: pyggml.pad_circular(ctx, a, 0, 0, -2, 0), 2, -1),
    ("pad_ext_circular", lambda ctx, a: pyggml.pad_ext_circular(ctx, a, 0, 0, 0, 0, 0, 0, -1, -1), 3, -1),
    ("repeat_4d", lambda ctx, a: pyggml.repeat_4d(ctx, a, 4, -3, 1, 1), 1, -3),
]


@pytest.mark.parametrize("no_alloc", [False, True], ids=["pool", "no_alloc"])
@pytest.mark.parametrize("name, build, dim, value", _NEG, ids=[c[0] for c in _NEG])
def test_a_negative_result_size_is_refused_in_any_context(name, build, dim, value, no_alloc):
    op = "REPEAT" if name == "repeat_4d" else "PAD"
    with pyggml.Context(1 << 20, no_alloc=no_alloc) as ctx:
        a = ctx.new_tensor(Type.F32, (4, 3))
        used = ctx.used_mem
        with pytest.raises(pyggml.KernelPreconditionError,
                           match=rf"{name}: {op} node refused: the {op} result has ne\[{dim}\] = {value}: "
                                 r"a dimension cannot be negative") as e:
            build(ctx, a)
        assert not isinstance(e.value, pyggml.UpstreamDefect)
        assert ctx.used_mem == used                   # the refused node was never made in ctx


def test_a_negative_pad_in_no_alloc_never_reaches_a_mul_mat():
    """the no_alloc chain of the issue: pad(a, 0, -8) gave ne (64, -5), pad(a, -70) ne
    (-6, 3), and a MUL_MAT over such a tensor built and computed garbage on every executor
    (rows of -6 elements, read before its sources)"""
    with pyggml.Context(1 << 20, no_alloc=True) as ctx:
        a = ctx.new_tensor(Type.F32, (64, 3))
        with pytest.raises(pyggml.KernelPreconditionError, match=r"PAD result has ne\[1\] = -5"):
            pyggml.pad(ctx, a, 0, -8, 0, 0)
        with pytest.raises(pyggml.KernelPreconditionError, match=r"PAD result has ne\[0\] = -6"):
            pyggml.pad(ctx, a, -70, 0, 0, 0)


@pytest.mark.parametrize("no_alloc", [False, True], ids=["pool", "no_alloc"])
def test_nearby_pads_and_repeats_still_build_and_compute(no_alloc):
    """the good side next to each refusal: pads that shrink an axis to 0 or crop it (a
    negative pad with a size >= 0), and a repeat to a whole multiple, equal their reference"""
    from pyggml.opinfo import layout as L
    x = np.arange(12, dtype=np.float32).reshape(3, 4)          # ne (4, 3)
    cases = [
        (lambda ctx, a: pyggml.pad(ctx, a, 0, -3, 0, 0), L._ref_pad(x, 0, -3, 0, 0)),        # ne1 = 0
        (lambda ctx, a: pyggml.pad_ext(ctx, a, -1, -1, 0, 0, 0, 0, 0, 0),
         L._ref_pad_ext(x, -1, -1, 0, 0, 0, 0, 0, 0)),                                        # a crop to 2
        (lambda ctx, a: pyggml.pad_circular(ctx, a, 2, 1, 0, 0), L._ref_pad_circular(x, 2, 1, 0, 0)),
        (lambda ctx, a: pyggml.repeat_4d(ctx, a, 8, 3, 2, 1), L._ref_repeat_4d(x, 8, 3, 2, 1)),
    ]
    for build, want in cases:
        with pyggml.Backend("CPU", n_threads=1) as cpu, pyggml.Context(1 << 20, no_alloc=no_alloc) as ctx:
            a = ctx.new_tensor(Type.F32, (4, 3))
            t = build(ctx, a)
            assert int(np.prod(t.ne)) == want.size
            if no_alloc:
                cpu.alloc_ctx_tensors(ctx)
                a.set(x)
            else:
                a.numpy()[...] = x
            g = pyggml.Graph(ctx, 16)
            g.build_forward_expand(t)
            if no_alloc:
                cpu.graph_compute(g)
                got = t.get()
            else:
                g.compute(1)
                got = t.numpy()
            np.testing.assert_array_equal(np.asarray(got, np.float64).reshape(want.shape), want)


# --- ARANGE ---------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [(0.0, 1.0, 0.0), (0.0, 1e30, 1e-30)])
def test_arange_without_a_finite_count(args):
    # ggml_arange casts the count inf (or 1e60) to int64: INT64_MIN where the conversion
    # wraps (x86), INT64_MAX where it saturates; the shape check every node passes first
    # refuses either before ARANGE's own rule ("no finite element count") sees it
    refused(lambda ctx: pyggml.arange(ctx, *args), pyggml.KernelPreconditionError,
            r"ARANGE result (has ne\[0\] = -9223372036854775808: a dimension cannot be negative|"
            r"takes more bytes than int64 holds)")
    # rules off: a tensor of ne0 = INT64_MIN, which the kernel then leaves alone
    with rules_disabled(), pyggml.Context(1 << 20) as ctx:
        t = pyggml.arange(ctx, *args)
        assert t.ne[0] < 0


# --- WIN_PART, WIN_UNPART -------------------------------------------------------------------


def test_win_part_ignores_source_strides():
    x = RNG.standard_normal((4, 4, 3)).astype(np.float32)      # ne (3, 4, 4): C=3, W=4, H=4

    def build(ctx):
        a = f32(ctx, np.ascontiguousarray(x.transpose(1, 0, 2)))
        return pyggml.win_part(ctx, pyggml.permute(ctx, a, 0, 2, 1, 3), 2)   # the values of x, strided
    refused(build, pyggml.KernelPreconditionError, "ignores its strides")
    out = compute_unchecked(build)
    info = registry()["win_part"]
    assert not np.allclose(out, info.ref(x.astype(np.float64), 2))


def test_win_unpart_ignores_source_strides():
    x = RNG.standard_normal((4, 2, 2, 3)).astype(np.float32)

    def build(ctx):
        a = f32(ctx, np.ascontiguousarray(x.transpose(0, 2, 1, 3)))
        return pyggml.win_unpart(ctx, pyggml.permute(ctx, a, 0, 2, 1, 3), 4, 4, 2)
    refused(build, pyggml.KernelPreconditionError, "ignores its strides")
    out = compute_unchecked(build)
    assert not np.allclose(out, registry()["win_unpart"].ref(x.astype(np.float64), 4, 4, 2))


def _win_unpart_w0(ctx):
    return pyggml.win_unpart(ctx, f32(ctx, np.zeros((4, 2, 2, 3))), 3, 3, 0)


def _win_unpart_few(ctx):
    return pyggml.win_unpart(ctx, f32(ctx, np.zeros((4, 2, 2, 3))), 5, 5, 2)   # 9 windows needed, 4 given


def test_win_unpart_window_size():
    refused(_win_unpart_w0, pyggml.KernelPreconditionError, "window size must be >= 1")
    assert kernel_verdict(_win_unpart_w0) == "abort"            # SIGFPE: % 0


def test_win_unpart_too_few_windows():
    refused(_win_unpart_few, pyggml.KernelPreconditionError, "needs src0 of at least")
    assert kernel_verdict(_win_unpart_few) == "out-of-bounds"


def test_win_unpart_windows_smaller_than_w():
    def build(ctx):
        a = pyggml.reshape_4d(ctx, f32(ctx, np.arange(12.0)), 3, 1, 1, 4)     # 4 windows of 1 x 1
        return pyggml.win_unpart(ctx, a, 2, 2, 2)
    refused(build, pyggml.KernelPreconditionError, "needs src0 of at least")
    # rules off: rows of a window of 1 x 1 are read as if it were 2 x 2: outputs (0, 1) and
    # (1, 0) both read a[3:6]
    out = compute_unchecked(build)
    assert np.array_equal(out[0, 1], out[1, 0])


# --- backward-pass defects (evidence; backward.c does not refuse them yet) ------------------


def test_view_gradient_with_overlapping_rows_is_wrong():
    """ggml's VIEW backward accumulates with ggml_acc, whose kernel computes
    dst[view] = src0[view] + b row by row: rows that share elements overwrite each
    other's contribution (proposed defect view-grad-overlap)"""
    x = RNG.standard_normal((2, 4, 6))
    s = Sample((Arg(x), 2, 2, 2, 48, 4, 0))                     # nb2 = 4 < the row's 8 bytes
    try:
        errs = grad_check(registry()["view_3d"], s)
    except pyggml.UpstreamDefect:
        return
    assert errs[0] > 1e-3


def test_set_gradient_with_overlapping_rows_is_wrong():
    """SET's backward gives b the gradient of every element of the view, also of the ones
    a later row overwrote"""
    s = Sample((Arg(RNG.standard_normal((4, 6))), Arg(RNG.standard_normal((2, 3))), 8, 48, 96, 0))
    try:
        errs = grad_check(registry()["set"], s)
    except pyggml.UpstreamDefect:
        return
    assert errs[0] < 1e-9 and errs[1] > 1e-2


def test_get_rows_gradient_with_a_strided_index_vector_is_refused():
    """GET_ROWS reads its indices through their strides, GET_ROWS_BACK (its backward)
    reads them as packed int32: a strided index vector gets the gradient of other rows
    (defect get-rows-back-strided-index): refused; rules off, the gradient is wrong"""
    a_np = RNG.standard_normal((5, 3)).astype(np.float32)

    def backward(ctx):
        a = f32(ctx, a_np)
        pyggml.set_param(a)
        m = ctx.from_numpy(np.array([[1, 2], [3, 2], [0, 2], [1, 2]], np.int32))   # column 0: [1, 3, 0, 1]
        idx = pyggml.transpose(ctx, pyggml.view_2d(ctx, m, 1, 4, m.nb[1], 0))     # ne (4, 1), nb0 = 8
        r = pyggml.get_rows(ctx, a, idx)
        loss = pyggml.sum(ctx, r)
        pyggml.set_loss(loss)
        g = pyggml.Graph(ctx, 256, grads=True)
        g.build_forward_expand(loss)
        g.build_backward_expand()
        return g, a, r

    with pyggml.Context(16 << 20) as ctx:
        with pytest.raises(pyggml.UpstreamDefect, match="GET_ROWS honours their strides") as e:
            backward(ctx)
    assert e.value.defect == "get-rows-back-strided-index"
    with rules_disabled(), pyggml.Context(16 << 20) as ctx:
        g, a, r = backward(ctx)
        g.compute(1)
        assert np.array_equal(r.numpy(), a_np[[1, 3, 0, 1]])                        # forward: right
        counts = g.grad(a).numpy()[:, 0]
    assert counts.tolist() == [0, 1, 2, 1, 0]            # the rows [1, 2, 3, 2]; right: [1, 2, 0, 1, 0]


def _overlapping_view_grad(ctx, nb1):
    a = f32(ctx, np.arange(8.0))
    pyggml.set_param(a)
    v = pyggml.view_2d(ctx, a, 4, 2, nb1, 0)           # rows a[0:4] and a[nb1/4 : nb1/4 + 4]
    w = f32(ctx, np.arange(8.0).reshape(2, 4) + 1)
    loss = pyggml.sum(ctx, pyggml.mul(ctx, v, w))
    pyggml.set_loss(loss)
    g = pyggml.Graph(ctx, 256, grads=True)
    g.build_forward_expand(loss)
    g.build_backward_expand()
    g.compute(1)
    return g.grad(a).numpy().copy()


def test_view_gradient_with_overlapping_rows_is_refused():
    """a view whose rows overlap: ggml's backward ACC writes each row's gradient over the
    one before where it should add (defect view-grad-overlap); rows that just fit are right"""
    w = np.arange(8.0).reshape(2, 4) + 1
    with pyggml.Context(16 << 20) as ctx:
        with pytest.raises(pyggml.UpstreamDefect, match="reach some elements twice") as e:
            _overlapping_view_grad(ctx, 8)
    assert e.value.defect == "view-grad-overlap"
    right = np.zeros(8)
    right[0:4] += w[0]
    right[2:6] += w[1]
    with rules_disabled(), pyggml.Context(16 << 20) as ctx:
        got = _overlapping_view_grad(ctx, 8)
    assert not np.allclose(got, right)
    assert np.allclose(got[4:], right[4:]) and np.allclose(got[2:4], w[1, :2])   # the second row overwrote
    # rows 16 bytes apart do not overlap (a[0:4], a[4:8] of a longer a is the usual case)
    with pyggml.Context(16 << 20) as ctx:
        a = f32(ctx, np.arange(8.0))
        pyggml.set_param(a)
        v = pyggml.view_2d(ctx, a, 4, 2, 16, 0)
        loss = pyggml.sum(ctx, pyggml.mul(ctx, v, f32(ctx, w)))
        pyggml.set_loss(loss)
        g = pyggml.Graph(ctx, 256, grads=True)
        g.build_forward_expand(loss)
        g.build_backward_expand()
        g.compute(1)
        assert np.array_equal(g.grad(a).numpy(), w.reshape(-1))


def test_set_gradient_of_an_overlapping_b_is_refused():
    """SET writes b's rows in order, a later row overwriting an earlier one; ggml's backward
    still hands the overwritten elements of b a gradient"""
    with pyggml.Context(16 << 20) as ctx:
        a = f32(ctx, np.zeros(8))
        b = f32(ctx, np.ones((2, 4)))
        pyggml.set_param(b)
        loss = pyggml.sum(ctx, pyggml.set_2d(ctx, a, b, 8, 0))
        pyggml.set_loss(loss)
        g = pyggml.Graph(ctx, 256, grads=True)
        g.build_forward_expand(loss)
        with pytest.raises(pyggml.UpstreamDefect) as e:
            g.build_backward_expand()
    assert e.value.defect == "view-grad-overlap"


@pytest.mark.parametrize("op, args, cls", [
    ("win_part", lambda: (Arg(RNG.standard_normal((4, 4, 3))), 2), pyggml.UnsupportedOpError),
    ("win_unpart", lambda: (Arg(RNG.standard_normal((4, 2, 2, 3))), 4, 4, 2), pyggml.UnsupportedOpError),
    ("get_rows", lambda: (Arg(RNG.standard_normal((2, 4, 5))), Arg(RNG.integers(0, 4, size=(2, 3)), Type.I32)),
     pyggml.GGMLAbort),
])
def test_backward_passes_that_abort(op, args, cls):
    """WIN_PART/WIN_UNPART fall into ggml_compute_backward's UNARY case, where
    ggml_get_unary_op asserts (pyggml refuses them first: no gradient); GET_ROWS of a 3-d
    source builds get_rows_back, which takes matrices only (the dry run's GGMLAbort)"""
    with pytest.raises(cls):
        grad_check(registry()[op], Sample(args()))
    with rules_disabled(), pytest.raises(pyggml.GGMLAbort):
        grad_check(registry()[op], Sample(args()))


# --- DUP / CONT / CPY: rules_layout.c rule_dup against ggml_compute_forward_dup ------------
#
# Each case: what the kernel does (rules off), and what pyggml raises.


def _cont_q_reshaped(ctx):
    a = q8(ctx, RNG.standard_normal((8, 64)))
    v = pyggml.view_2d(ctx, a, 32, 8, a.nb[1], 0)          # a non-contiguous Q8_0 view
    return pyggml.cont_2d(ctx, v, 64, 4)                   # into a contiguous result of another shape


def _cast_f16_i32(ctx):
    return pyggml.cast(ctx, ctx.from_numpy(RNG.standard_normal((4, 8)).astype(np.float16)), Type.I32)


def _cpy_long_rows_to_q(ctx):
    return pyggml.cpy(ctx, f32(ctx, RNG.standard_normal((1, 64))), ctx.new_tensor(Type.Q8_0, (32, 2)))


def _cast_q8_k(ctx):
    return pyggml.cast(ctx, ctx.new_tensor(Type.Q8_K, (256, 2)), Type.F32)


def test_dup_bytes_quantized_reshape_overruns():
    """dup_bytes, 'dst contiguous' branch: rs = ne00 * type_size bytes per row, counting
    elements as blocks (qk times too many)"""
    assert kernel_verdict(_cont_q_reshaped) == "out-of-bounds"


def test_dup_bytes_quantized_reshape_refused():
    e = refused(_cont_q_reshaped, pyggml.UpstreamDefect, "another shape")
    assert e.defect == "cpy-quantized-reshape-oob"


def test_cpy_f16_to_i32_lacks_its_work_buffer():
    """F16/BF16 -> I32 goes through dup_to_q (I32 has a from_float) and an F32 row in the
    work buffer, which ggml_graph_plan does not reserve for the pair"""
    assert kernel_verdict(_cast_f16_i32) == "abort"              # NULL work buffer
    # given a work buffer (another node asks for one), the kernel is right
    with rules_disabled(), pyggml.Context(64 << 20) as ctx:
        x = (RNG.standard_normal((4, 8)) * 10).astype(np.float16)
        c = pyggml.cast(ctx, ctx.from_numpy(x), Type.I32)
        big = pyggml.cast(ctx, f32(ctx, np.zeros((1, 4096))), Type.Q8_0)
        g = pyggml.Graph(ctx, 16)
        g.build_forward_expand(c)
        g.build_forward_expand(big)
        g.compute(1)
        assert np.array_equal(c.numpy(), np.trunc(x.astype(np.float32)).astype(np.int32))


def test_cpy_f16_to_i32_refused_as_a_defect():
    e = refused(_cast_f16_i32, pyggml.UpstreamDefect, "work buffer")
    assert e.defect == "cpy-f16-i32-work"


def test_cpy_to_q_work_buffer_sized_from_the_result():
    """dup_to_q gives each thread ne00 + 16 floats, ggml_graph_plan plans ne0 (the result's)"""
    assert kernel_verdict(_cpy_long_rows_to_q) == "out-of-bounds"


def test_cpy_to_q_work_buffer_refused_as_a_defect():
    e = refused(_cpy_long_rows_to_q, pyggml.UpstreamDefect, "work buffer")
    assert e.defect == "cpy-to-q-work-size"


def test_cpy_from_q8_k():
    """q8_K has no to_float: dup_from_q calls a NULL pointer"""
    assert kernel_verdict(_cast_q8_k) == "abort"


def test_cpy_from_q8_k_refused():
    refused(_cast_q8_k, pyggml.GGMLTypeError, "cannot dequantize")


def test_cpy_from_transposed_q():
    """dup_from_q computes block addresses as (i00/qk)*nb00: with nb00 not the block size
    (a transposed quantized tensor) it reads other blocks"""
    x = RNG.standard_normal((64, 64)).astype(np.float32)

    def build(ctx):
        return pyggml.cpy(ctx, pyggml.transpose(ctx, q8(ctx, x)), ctx.new_tensor(Type.F32, (64, 64)))
    out = compute_unchecked(build)
    deq = pyggml.dequantize(Type.Q8_0, pyggml.quantize(Type.Q8_0, x), x.shape)
    assert np.abs(out - deq.T).max() > 0.5


def test_cpy_from_transposed_q_refused():
    refused(lambda ctx: pyggml.cpy(ctx, pyggml.transpose(ctx, q8(ctx, np.zeros((64, 64)))),
                                   ctx.new_tensor(Type.F32, (64, 64))),
            pyggml.KernelPreconditionError, "contiguous rows")


def _cast_partial_blocks(ctx):
    a = q8(ctx, RNG.standard_normal((1, 64)))
    return pyggml.cast(ctx, pyggml.reshape_2d(ctx, a, 16, 4), Type.F32)   # rows of half a block


def test_cpy_from_q_partial_blocks():
    x = RNG.standard_normal((1, 64)).astype(np.float32)
    out = compute_unchecked(lambda ctx: pyggml.cast(ctx, pyggml.reshape_2d(ctx, q8(ctx, x), 16, 4), Type.F32))
    deq = pyggml.dequantize(Type.Q8_0, pyggml.quantize(Type.Q8_0, x), x.shape)
    assert not np.allclose(out.reshape(-1), deq.reshape(-1))


def test_cpy_from_q_partial_blocks_refused():
    refused(_cast_partial_blocks, pyggml.KernelPreconditionError, "view or reshape needs rows of whole blocks of 32")


def test_core_dup_rule_still_refuses_what_it_should():
    # F32 -> I16 (dup_to_q without a from_float) and I32 -> F16 abort in the kernel
    for build in (lambda ctx: pyggml.cast(ctx, f32(ctx, np.zeros(4)), Type.I16),
                  lambda ctx: pyggml.cast(ctx, ctx.from_numpy(np.zeros(4, np.int32)), Type.F16)):
        refused(build, pyggml.GGMLTypeError, "does not copy")
        assert kernel_verdict(build) == "abort"
    assert math.isfinite(1.0)
