import numpy as np
import pytest

import pyggml
from pyggml import Type

from conftest import compute

NUMPY_TYPES = [np.float32, np.float16, np.float64, np.int8, np.int16, np.int32, np.int64]
SHAPES = [(5,), (3, 5), (2, 3, 5), (2, 2, 3, 5)]


@pytest.mark.parametrize("dtype", NUMPY_TYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_from_numpy_round_trip(ctx, rng, dtype, shape):
    a = (rng.standard_normal(shape) * 50).astype(dtype)
    t = ctx.from_numpy(a)
    assert t.type == Type[{np.float32: "F32", np.float16: "F16", np.float64: "F64", np.int8: "I8",
                           np.int16: "I16", np.int32: "I32", np.int64: "I64"}[dtype]]
    assert t.ne == tuple(reversed(shape)) + (1,) * (4 - len(shape))
    item = np.dtype(dtype).itemsize
    # ggml strides: nb[0] = element size, nb[i] = nb[i-1] * ne[i-1]
    nb = [item]
    for n in t.ne[:3]:
        nb.append(nb[-1] * n)
    assert t.nb == tuple(nb)
    assert t.shape == shape
    assert t.n_dims == len(shape)
    v = t.numpy()
    assert v.dtype == dtype and v.shape == shape
    assert v.strides == tuple(reversed(nb[:len(shape)]))
    np.testing.assert_array_equal(v, a)
    assert not np.shares_memory(v, a)  # from_numpy copies


def test_numpy_is_zero_copy_and_writable(ctx):
    t = ctx.new_tensor(Type.F32, (3, 2))
    v1, v2 = t.numpy(), t.numpy()
    v1[...] = 7
    assert np.all(v2 == 7)
    assert v1.ctypes.data == t.data_ptr
    assert v1.flags.writeable and v1.flags.c_contiguous and not v1.flags.owndata


def test_shape_keeps_the_rank_ggml_n_dims_drops(ctx):
    t = ctx.from_numpy(np.zeros((1, 3), np.float32))
    assert t.ne == (3, 1, 1, 1)
    assert t.n_dims == 1                       # ggml's count
    assert t.shape == (1, 3)                   # the array's
    assert ctx.new_tensor(Type.F32, (1, 1)).shape == (1, 1)
    assert ctx.new_tensor(Type.F32, (3, 1, 1, 1)).shape == (1, 1, 1, 3)


@pytest.mark.parametrize("shape", [(1, 7), (2, 1, 3, 4), (1, 1, 1, 5), (5, 1), (), (1,), (1, 1)])
def test_an_array_comes_back_in_its_shape(ctx, shape):
    a = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    t = ctx.from_numpy(a)
    assert t.shape == shape and t.numpy().shape == shape and np.array_equal(t.numpy(), a)
    assert np.asarray(t).shape == shape and t.get().shape == shape
    t.set(np.asarray(a + 1))                    # set takes the same shape
    assert np.array_equal(t.numpy(), a + 1)


def test_ops_keep_the_unit_dimensions_their_sources_have(ctx):
    x = ctx.from_numpy(np.ones((1, 5), np.float32))           # one token of 5 features
    w = ctx.from_numpy(np.ones((7, 5), np.float32))
    assert pyggml.mul_mat(ctx, w, x).shape == (1, 7)             # numpy: x @ w.T
    assert pyggml.add(ctx, x, x).shape == (1, 5)
    assert pyggml.soft_max(ctx, x).shape == (1, 5)
    assert pyggml.transpose(ctx, x).shape == (5, 1)
    b = ctx.from_numpy(np.ones((2, 1, 3, 4), np.float32))
    assert pyggml.scale(ctx, b, 2.0).shape == (2, 1, 3, 4)
    assert pyggml.permute(ctx, b, 0, 2, 1, 3).shape == (2, 3, 1, 4)
    assert pyggml.reshape_2d(ctx, b, 4, 6).shape == (6, 4)      # the rank asked for
    assert pyggml.reshape_3d(ctx, x, 5, 1, 1).shape == (1, 1, 5)
    assert pyggml.argmax(ctx, ctx.from_numpy(np.ones((3, 5), np.float32))).shape == (3,)   # ne0 reduced away
    assert pyggml.sum(ctx, ctx.from_numpy(np.ones((2, 3), np.float32))).shape == (1,)      # one element: (1,)
    s = ctx.from_numpy(np.float32(2.5))
    assert s.shape == () and float(s.numpy()) == 2.5
    assert pyggml.add(ctx, s, s).shape == ()                     # the same shape as its sources


def test_from_numpy_non_contiguous_and_byteswapped(ctx):
    a = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]
    np.testing.assert_array_equal(ctx.from_numpy(a).numpy(), a)
    b = np.arange(5, dtype=">f4")
    t = ctx.from_numpy(b)
    assert t.type == Type.F32
    np.testing.assert_array_equal(t.numpy(), b.astype(np.float32))


def test_bf16_through_cpy(ctx):
    a = np.array([1.0, -2.5, 3.140625, 1e-3], dtype=np.float32)
    src = ctx.from_numpy(a)
    bf = ctx.new_tensor(Type.BF16, (4,))
    back = ctx.new_tensor(Type.F32, (4,))
    g = pyggml.Graph(ctx)
    g.build_forward_expand(pyggml.cpy(ctx, src, bf))
    g.build_forward_expand(pyggml.cpy(ctx, bf, back))
    g.compute(1)
    bits = bf.numpy()
    assert bits.dtype == np.uint16
    # bfloat16 is the upper half of the float32 bits (round to nearest even)
    expect_bits = ((a.view(np.uint32) + 0x7FFF + ((a.view(np.uint32) >> 16) & 1)) >> 16).astype(np.uint16)
    np.testing.assert_array_equal(bits, expect_bits)
    np.testing.assert_array_equal(back.numpy(), (expect_bits.astype(np.uint32) << 16).view(np.float32))


def test_f16_through_cpy(ctx, rng):
    a = rng.standard_normal((3, 4)).astype(np.float32)
    h = ctx.new_tensor(Type.F16, (4, 3))
    out = compute(ctx, pyggml.cpy(ctx, ctx.from_numpy(a), h))
    np.testing.assert_array_equal(out, a.astype(np.float16))


def test_quantized_tensor_has_no_numpy_view(ctx):
    t = ctx.new_tensor(Type.Q8_0, (64,))
    assert t.nbytes == 2 * Type.Q8_0.type_size
    with pytest.raises(TypeError, match="Q8_0 has no numpy dtype"):
        t.numpy()
    with pytest.raises(ValueError, match="multiple of the block size 32"):
        ctx.new_tensor(Type.Q8_0, (33,))


def test_empty_tensor(ctx):
    t = ctx.new_tensor(Type.F32, (0, 3))
    assert t.nelements == 0 and t.nbytes == 0
    assert t.numpy().shape == (3, 0)
    # ggml_n_dims ignores a trailing 0; the numpy shape keeps it
    e = ctx.new_tensor(Type.F32, (1, 0))
    assert e.n_dims == 1 and e.shape == (0, 1) and e.numpy().size == 0


def test_name_get_set(ctx):
    t = ctx.new_tensor(Type.F32, (2,))
    assert t.name == ""
    t.name = "weights"
    assert t.name == "weights"
    t.name = "x" * (pyggml.MAX_NAME - 1)
    assert t.name == "x" * (pyggml.MAX_NAME - 1)
    with pytest.raises(ValueError, match="at most 63 UTF-8 bytes"):
        t.name = "x" * pyggml.MAX_NAME
    with pytest.raises(ValueError, match="without NUL"):
        t.name = "a\0b"
    with pytest.raises(TypeError, match="name must be a str"):
        t.name = 5


def test_op_and_src(ctx):
    a = ctx.new_tensor(Type.F32, (4,))
    b = ctx.new_tensor(Type.F32, (4,))
    c = pyggml.add(ctx, a, b)
    assert a.op == "NONE" and c.op == "ADD"
    assert c.src == (a, b)
    assert a.src == ()
    assert c.src[0] is not a and c.src[0] == a and hash(c.src[0]) == hash(a)
    assert pyggml.transpose(ctx, a).view_src == a


def test_tensor_cannot_be_constructed_directly():
    with pytest.raises(TypeError, match="made by"):
        pyggml.Tensor()


@pytest.mark.parametrize("ne, exc, match", [
    ((), ValueError, "1 to 4 values"),
    ((1, 2, 3, 4, 5), ValueError, "1 to 4 values"),
    ((-1,), ValueError, r"ne\[0\] must be in \[0, 2\*\*63 - 1\], got -1"),
    ((2, 1.0), TypeError, r"ne\[1\] must be an int"),
    ((True,), TypeError, r"ne\[0\] must be an int"),
    (5, TypeError, "ne must be a sequence"),
    ((1 << 64,), ValueError, r"ne\[0\] must be in \[0, 2\*\*63 - 1\], got 18446744073709551616"),
    ((1 << 40, 1 << 40), ValueError, "more elements than int64 holds"),
])
def test_new_tensor_bad_ne(ctx, ne, exc, match):
    with pytest.raises(exc, match=match):
        ctx.new_tensor(Type.F32, ne)


@pytest.mark.parametrize("typ, exc, match", [
    (999, ValueError, "not a ggml type"),
    ("F32", TypeError, r"type must be a pyggml.Type \(or its int value\), not str"),
    (None, TypeError, r"type must be a pyggml.Type \(or its int value\), not NoneType"),
])
def test_new_tensor_bad_type(ctx, typ, exc, match):
    with pytest.raises(exc, match=match):
        ctx.new_tensor(typ, (4,))


def test_new_tensor_accepts_plain_int_type(ctx):
    assert ctx.new_tensor(int(Type.I32), (2,)).type == Type.I32


@pytest.mark.parametrize("arr, exc, match", [
    (np.zeros(3, dtype=bool), TypeError, "dtype bool has no ggml type"),
    (np.zeros(3, dtype=np.complex64), TypeError, "has no ggml type"),
    (np.zeros((1, 1, 1, 1, 1), np.float32), ValueError, "0 to 4 dimensions, got 5"),
])
def test_from_numpy_errors(ctx, arr, exc, match):
    with pytest.raises(exc, match=match):
        ctx.from_numpy(arr)


def test_from_numpy_in_no_alloc_context():
    with pyggml.Context(1 << 20, no_alloc=True) as ctx:
        with pytest.raises(ValueError, match="no_alloc"):
            ctx.from_numpy(np.zeros(3, np.float32))
        t = ctx.new_tensor(Type.F32, (3,))
        with pytest.raises(ValueError, match="has no data"):
            t.numpy()


def test_type_enum_matches_ggml():
    assert Type.F32.type_size == 4 and Type.F16.type_size == 2 and Type.BF16.type_size == 2
    assert Type.F32.blck_size == 1 and Type.Q4_0.blck_size == 32
    assert Type.F32.numpy_dtype == np.float32
    assert Type.BF16.numpy_dtype == np.uint16
    assert Type.Q4_0.numpy_dtype is None


def test_rope_type_is_ggml_h_s_defines():
    # RopeType: the GGML_ROPE_TYPE_* #defines of the header this build compiled, read by the
    # generator and valued by the compiler; the samples' table (opinfo/_common.py) agrees
    from pyggml.opinfo._common import ROPE_MODES
    members = {m.name: int(m) for m in pyggml.RopeType}
    assert members and all(ROPE_MODES[name] == value for name, value in members.items())
    assert pyggml.RopeType.NEOX == 2            # in every header; 0.9.4's has no GGML_ROPE_TYPE_NORMAL (0)
    assert "mode: RopeType or int" in pyggml.rope_ext.__doc__
    assert "mode: RopeType or int" in pyggml.rope_multi_back.__doc__
    assert "mode: ScaleMode or int" in pyggml.interpolate.__doc__
