"""The op wrappers' argument checks and refusals (each message asserted), the structure of
results, and contexts that keep each other alive. The values ops compute are checked by
their OpInfos (pyggml/opinfo/, tests/test_opinfo.py), not here."""

import numpy as np
import pytest

import pyggml
from pyggml import Type
from pyggml.opinfo.harness import kernels_trusted

from conftest import compute


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def test_result_structure(ctx, rng):
    """What a value comparison cannot see: the shapes and types of results, and which
    tensor a view's data belongs to. (The values of every op, for these cases and many
    more, are checked against float64 by its OpInfo's samples: tests/test_opinfo.py and
    ``pyggml parity``; the binary broadcasts, diag_mask_inf's n_past, mul_mat's batch
    broadcast, the views and reshapes that this file used to compute are samples there.)"""
    a = f32(rng, 2, 3, 5)
    ta = ctx.from_numpy(a)
    assert pyggml.sum(ctx, ta).ne == (1, 1, 1, 1)
    assert pyggml.mean(ctx, ta).ne == (1, 3, 2, 1)
    b = ctx.from_numpy(f32(rng, 4, 3, 5))               # batch 4 broadcasts a's batch 2
    r = pyggml.mul_mat(ctx, ctx.from_numpy(a.astype(np.float16)), b)
    assert r.ne == (3, 3, 4, 1) and r.type == Type.F32
    t4 = ctx.from_numpy(f32(rng, 2, 3, 4, 5))
    assert pyggml.transpose(ctx, t4).ne == (4, 5, 3, 2)
    assert pyggml.permute(ctx, t4, 2, 0, 1, 3).ne == (4, 3, 5, 2)     # src dim i goes to axis_i
    m = ctx.from_numpy(f32(rng, 4, 6))
    r = pyggml.reshape(ctx, m, ctx.new_tensor(Type.F32, (12, 2)))
    assert r.ne == (12, 2, 1, 1) and r.view_src == m
    # a view of a view resolves to the base tensor, its offset the sum of both
    v1 = pyggml.view_1d(ctx, m, 5, 4 * 7)
    vv = pyggml.view_1d(ctx, v1, 2, 4)
    assert vv.view_src == m and vv.view_offs == 4 * 8
    np.testing.assert_array_equal(vv.numpy(), m.numpy().reshape(-1)[8:10])
    # cpy's result is a view of its destination: computing it writes there
    dst = ctx.new_tensor(Type.F32, (6,))
    x = f32(rng, 2, 3)
    c = pyggml.cpy(ctx, ctx.from_numpy(x), dst)
    assert c.view_src == dst
    compute(ctx, c)
    np.testing.assert_array_equal(dst.numpy(), x.reshape(-1))


def test_ops_across_contexts_keep_each_other_alive(rng):
    a = f32(rng, 4)
    c1 = pyggml.Context(1 << 20)
    c2 = pyggml.Context(1 << 20)
    ta = c1.from_numpy(a)
    out = pyggml.add(c2, ta, ta)
    del ta
    assert out.src[0].ctx is c1
    np.testing.assert_allclose(compute(c2, out), 2 * a)
    g = pyggml.Graph(c2)
    g.build_forward_expand(out)
    c1.close()
    # c1's tensors raise, but its memory stays alive while c2's tensors point into it:
    # what was built from them keeps working
    with pytest.raises(pyggml.ContextClosedError):
        out.src[0].ne
    g.compute(1)
    np.testing.assert_allclose(out.numpy(), 2 * a)
    g2 = pyggml.Graph(c2)
    g2.build_forward_expand(pyggml.scale(c2, out, 3.0))
    g2.compute(1)
    np.testing.assert_allclose(g2.nodes[-1].numpy(), 6 * a)
    c2.close()
    with pytest.raises(pyggml.ContextClosedError, match="graph used after its context was closed"):
        g.compute(1)


# --- error paths -------------------------------------------------------------

@pytest.fixture
def t34(ctx):
    return ctx.new_tensor(Type.F32, (4, 3))


def test_arguments_must_be_tensors(ctx, t34):
    with pytest.raises(TypeError, match="b must be a pyggml.Tensor, not ndarray"):
        pyggml.add(ctx, t34, np.zeros(3))
    with pytest.raises(TypeError, match="a must be a pyggml.Tensor, not NoneType"):
        pyggml.sqr(ctx, None)
    with pytest.raises(TypeError, match="ctx"):
        pyggml.add(None, t34, t34)
    with pytest.raises(TypeError):
        pyggml.add("ctx", t34, t34)


def test_binary_shape_mismatch(ctx, t34):
    b = ctx.new_tensor(Type.F32, (3, 3))
    used = ctx.used_mem
    with pytest.raises(pyggml.GGMLAbort, match=r"add: ggml would abort: ggml.c:\d+: "
                       r"GGML_ASSERT\(ggml_can_repeat\(b, a\)\) failed; a: f32 ne=\(4, 3, 1, 1\) .*"
                       r"b: f32 ne=\(3, 3, 1, 1\)") as e:
        pyggml.add(ctx, t34, b)
    assert e.value.ggml_message.endswith("GGML_ASSERT(ggml_can_repeat(b, a)) failed")
    assert ctx.used_mem == used                  # refused before ctx was touched
    big = ctx.new_tensor(Type.F32, (8, 3))
    with pytest.raises(ValueError, match=r"mul: ggml would abort: .*ggml_can_repeat"):
        pyggml.mul(ctx, t34, big)


def test_type_errors(ctx, t34):
    i = ctx.new_tensor(Type.I32, (4, 3))
    with pytest.raises(pyggml.GGMLTypeError, match=r"add: ADD node refused: the CPU kernel does not take "
                       r"src0 i32, src1 f32, result i32 .*\(src0 is a; src1 is b\)"):
        pyggml.add(ctx, i, t34)
    with pytest.raises(pyggml.GGMLTypeError, match=r"soft_max: SOFT_MAX node refused: the CPU kernel does not "
                       r"take src0 of type i32"):
        pyggml.soft_max(ctx, i)
    # (a refusal that stands for the kernel's abort: kept where MUL_MAT's kernel is the one
    # its rule was written against, as kernels_trusted makes it on any ggml)
    with kernels_trusted(), pytest.raises(pyggml.GGMLTypeError, match=r"mul_mat: MUL_MAT node refused: src1 must "
                                          r"be F32 or f32 \(the vec_dot type of src0's f32\), got i32"):
        pyggml.mul_mat(ctx, t34, i)
    with pytest.raises(pyggml.GGMLTypeError, match=r"cpy: CPY node refused: the CPU kernel does not copy f32 to i16"):
        pyggml.cpy(ctx, t34, ctx.new_tensor(Type.I16, (4, 3)))
    with pytest.raises(TypeError, match=r"sum: SUM node refused: the CPU kernel does not take src0 of type i32"):
        pyggml.sum(ctx, i)


def test_types_the_cpu_kernels_take_are_accepted(ctx, rng):
    # the CPU kernels run these (binary-ops.cpp, ggml_compute_forward_mul_mat): no refusal
    x = rng.standard_normal((3, 4)).astype(np.float32)
    a16 = ctx.from_numpy(x.astype(np.float16))
    b16 = ctx.from_numpy(x.astype(np.float16))
    out = pyggml.add(ctx, a16, ctx.from_numpy(x))              # F16 + F32 -> F16
    assert out.type == Type.F16
    np.testing.assert_allclose(compute(ctx, out), 2 * x, rtol=2e-3, atol=2e-3)
    mm = pyggml.mul_mat(ctx, a16, b16)                           # F16 x F16 (vec_dot_type of F16)
    np.testing.assert_allclose(compute(ctx, mm), (x @ x.T).astype(np.float32), rtol=1e-2, atol=1e-2)
    c = pyggml.cpy(ctx, ctx.from_numpy(x), ctx.new_tensor(Type.I32, (4, 3)))   # F32 -> I32
    np.testing.assert_array_equal(compute(ctx, c), x.astype(np.int32))


def test_non_contiguous_inputs(ctx, t34):
    tt = pyggml.transpose(ctx, t34)
    with pytest.raises(pyggml.GGMLAbort, match=r"scale: ggml would abort: .*GGML_ASSERT\(ggml_is_padded_1d\(a\)\)"):
        pyggml.scale(ctx, tt, 2.0)
    with pytest.raises(pyggml.GGMLAbort, match=r"soft_max: ggml would abort: .*GGML_ASSERT\(ggml_is_contiguous\(a\)\)"):
        pyggml.soft_max(ctx, tt)
    with pytest.raises(pyggml.GGMLAbort, match=r"reshape_1d: ggml would abort: .*GGML_ASSERT\(ggml_is_contiguous\(a\)\)"):
        pyggml.reshape_1d(ctx, tt, 12)
    with pytest.raises(pyggml.KernelPreconditionError, match="diag_mask_inf: DIAG_MASK_INF node refused: src0 must "
                                                           "have contiguous rows"):
        pyggml.diag_mask_inf(ctx, tt, 0)
    with pytest.raises(pyggml.KernelPreconditionError, match=r"sqr: SQR node refused: src0 must have contiguous "
                       r"rows \(nb\[0\] = 4, the size of f32\), got nb\[0\] = 16"):
        pyggml.sqr(ctx, tt)
    with pytest.raises(pyggml.GGMLAbort, match=r"mul_mat: .*GGML_ASSERT\(!ggml_is_transposed\(a\)\)"):
        pyggml.mul_mat(ctx, tt, ctx.new_tensor(Type.F32, (3, 2)))


def test_mul_mat_shape_errors(ctx, t34):
    with pytest.raises(pyggml.GGMLAbort, match=r"GGML_ASSERT\(ggml_can_mul_mat\(a, b\)\) failed; "
                       r"a: f32 ne=\(4, 3, 1, 1\) .*b: f32 ne=\(5, 2, 1, 1\)"):
        pyggml.mul_mat(ctx, t34, ctx.new_tensor(Type.F32, (5, 2)))
    a = ctx.new_tensor(Type.F32, (4, 3, 2))
    with pytest.raises(pyggml.GGMLAbort, match=r"ggml_can_mul_mat"):
        pyggml.mul_mat(ctx, a, ctx.new_tensor(Type.F32, (4, 3, 3)))


def test_diag_mask_inf_n_past(ctx, t34):
    with pytest.raises(pyggml.KernelPreconditionError, match=r"DIAG_MASK_INF node refused: n_past must be >= 0, "
                                                           r"got -1"):
        pyggml.diag_mask_inf(ctx, t34, -1)
    with pytest.raises(TypeError, match="diag_mask_inf: n_past must be an int, not float"):
        pyggml.diag_mask_inf(ctx, t34, 1.5)
    with pytest.raises(pyggml.ArgumentError, match=r"n_past must be in \[-2\*\*31, 2\*\*31 - 1\]"):
        pyggml.diag_mask_inf(ctx, t34, 1 << 31)


def test_permute_errors(ctx, t34):
    with pytest.raises(pyggml.GGMLAbort, match=r"permute: ggml would abort: .*GGML_ASSERT\(axis0 != axis1\)"):
        pyggml.permute(ctx, t34, 0, 0, 1, 2)
    with pytest.raises(pyggml.GGMLAbort, match=r"GGML_ASSERT\(axis3 >= 0 && axis3 < GGML_MAX_DIMS\)"):
        pyggml.permute(ctx, t34, 0, 1, 2, 4)
    with pytest.raises(TypeError, match="axis1 must be an int"):
        pyggml.permute(ctx, t34, 0, "1", 2, 3)


def test_reshape_errors(ctx, t34):
    with pytest.raises(pyggml.GGMLAbort, match=r"reshape_1d: .*GGML_ASSERT\(ggml_nelements\(a\) == ne0\)"):
        pyggml.reshape_1d(ctx, t34, 5)
    with pytest.raises(pyggml.GGMLAbort, match=r"reshape: .*GGML_ASSERT\(ggml_nelements\(a\) == ggml_nelements\(b\)\)"):
        pyggml.reshape(ctx, t34, ctx.new_tensor(Type.F32, (5,)))


def test_view_errors(ctx, t34):
    with pytest.raises(pyggml.GGMLAbort, match=r"view_1d: ggml would abort: .*data_size \+ view_offs <= "
                                               r"ggml_nbytes\(view_src\)"):
        pyggml.view_1d(ctx, t34, 13, 0)
    with pytest.raises(pyggml.GGMLAbort, match="view_1d: ggml would abort"):
        pyggml.view_1d(ctx, t34, 1, 48)
    with pytest.raises(pyggml.ArgumentError, match=r"view_1d: offset must be in \[0, 2\*\*63 - 1\] \(bytes\), got -4"):
        pyggml.view_1d(ctx, t34, 1, -4)
    # fits as a contiguous block (ggml's only check), but the strides reach past the data
    with pytest.raises(pyggml.KernelPreconditionError, match="view_2d: VIEW node refused: the view reaches byte 64 "
                                                           "of its source, which has 48 bytes"):
        pyggml.view_2d(ctx, t34, 2, 2, 56, 0)
    with pytest.raises(pyggml.KernelPreconditionError, match="must be multiples of the 4-byte f32 element"):
        pyggml.view_1d(ctx, t34, 2, 2)
    with pytest.raises(pyggml.ArgumentError, match="nb1 must be in"):
        pyggml.view_2d(ctx, t34, 2, 2, -1, 0)
    with pytest.raises(pyggml.ArgumentError, match="nb1 must be in"):
        pyggml.view_2d(ctx, t34, 2, 2, 2**64, 0)


def test_cpy_and_repeat_errors(ctx, t34):
    with pytest.raises(pyggml.GGMLAbort, match=r"cpy: .*GGML_ASSERT\(ggml_nelements\(a\) == ggml_nelements\(b\)\)"):
        pyggml.cpy(ctx, t34, ctx.new_tensor(Type.F32, (13,)))
    with pytest.raises(pyggml.GGMLAbort, match=r"repeat: .*GGML_ASSERT\(ggml_can_repeat\(a, b\)\)"):
        pyggml.repeat(ctx, t34, ctx.new_tensor(Type.F32, (6, 3)))
