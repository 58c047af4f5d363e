"""Quantized data from Python: pyggml.quantize / dequantize through ggml's type traits,
checked bit for bit against gguf-py (llama.cpp's own NumPy implementation), and used
by ops (from_numpy(type=...), mul_mat of a quantized matrix)."""

import numpy as np
import pytest

import pyggml
from pyggml import Type

gguf_quants = pytest.importorskip("gguf.quants")
from gguf import GGMLQuantizationType as GQ  # noqa: E402

from conftest import compute  # noqa: E402

X = (np.random.default_rng(1).standard_normal((4, 512)) * 3).astype(np.float32)
BLOCK_TYPES = [t for t in Type if t.is_quantized or t in (Type.F16, Type.BF16)]


def gguf_type(t):
    return getattr(GQ, t.name, None)


def gguf_can(fn, t):
    """Does gguf-py implement fn (quantize / dequantize) for t?"""
    qt = gguf_type(t)
    if qt is None:
        return False
    try:
        if fn == "quantize":
            gguf_quants.quantize(X[:1, :256], qt)
        else:
            gguf_quants.dequantize(np.zeros((1, gguf_quants.quant_shape_to_byte_shape((1, 256), qt)[-1]),
                                            np.uint8), qt)
    except NotImplementedError:
        return False
    return True


@pytest.mark.parametrize("t", [t for t in BLOCK_TYPES if gguf_can("quantize", t)], ids=lambda t: t.name)
def test_quantize_matches_gguf_bit_for_bit(t):
    ours = pyggml.quantize(t, X)
    theirs = np.asarray(gguf_quants.quantize(X, gguf_type(t))).view(np.uint8)
    assert ours.dtype == np.uint8 and ours.shape == (4, pyggml.Type(t).type_size * 512 // t.blck_size)
    np.testing.assert_array_equal(ours, theirs.reshape(ours.shape))


@pytest.mark.parametrize("t", [t for t in BLOCK_TYPES if gguf_can("dequantize", t)
                               and not pyggml._core.Type(t).name.startswith(("IQ2_XXS", "IQ2_XS", "IQ1"))]
                         + [Type.IQ2_XXS, Type.IQ1_S], ids=lambda t: t.name)
def test_dequantize_matches_gguf_bit_for_bit(t):
    if not gguf_can("dequantize", t):
        pytest.skip(f"gguf-py does not dequantize {t.name}")
    imatrix = np.ones(512, np.float32) if pyggml._core.Type(t) in (Type.IQ2_XXS, Type.IQ1_S) else None
    data = pyggml.quantize(t, X, imatrix=imatrix)       # ggml's own blocks, for every type
    ours = pyggml.dequantize(t, data, X.shape)
    theirs = gguf_quants.dequantize(data, gguf_type(t)).astype(np.float32)
    np.testing.assert_array_equal(ours, theirs)
    # and the values are X, to the precision of the type (bits per weight)
    bpw = 8 * t.type_size / t.blck_size
    rel = np.sqrt(np.mean((ours - X) ** 2)) / np.std(X)
    assert rel < (0.15 if bpw >= 4 else 0.4 if bpw >= 2.5 else 0.9), (t.name, bpw, rel)


def test_round_trip_through_a_tensor(ctx):
    q = pyggml.quantize(Type.Q8_0, X)
    t = ctx.from_numpy(q, type=Type.Q8_0)
    assert t.type == Type.Q8_0 and t.ne == (512, 4, 1, 1)
    np.testing.assert_array_equal(t.blocks(), q)
    assert np.shares_memory(t.blocks(), t.blocks())
    with pytest.raises(pyggml.GGMLTypeError, match="quantized blocks: use Tensor.blocks"):
        t.numpy()


def test_mul_mat_of_a_quantized_matrix_matches_its_dequantized_values(ctx, rng):
    b = rng.standard_normal((3, 512)).astype(np.float32)
    for t in (Type.Q8_0, Type.Q4_0, Type.Q4_K):
        q = pyggml.quantize(t, X)
        a = ctx.from_numpy(q, type=t)
        out = compute(ctx, pyggml.mul_mat(ctx, a, ctx.from_numpy(b)))
        ref = b.astype(np.float64) @ pyggml.dequantize(t, q, X.shape).T.astype(np.float64)
        # ggml quantizes b to the type's vec_dot_type on the way (Q8_0/Q8_K): a small error
        assert np.sum((out - ref) ** 2) / np.sum(ref ** 2) < 1e-3


def test_get_rows_from_a_quantized_table(ctx):
    q = pyggml.quantize(Type.Q4_0, X)
    table = ctx.from_numpy(q, type=Type.Q4_0)
    idx = ctx.from_numpy(np.array([3, 0, 3], np.int32))
    out = compute(ctx, pyggml.get_rows(ctx, table, idx))
    np.testing.assert_array_equal(out, pyggml.dequantize(Type.Q4_0, q, X.shape)[[3, 0, 3]])


@pytest.mark.parametrize("args, exc, match", [
    ((Type.I32, X), pyggml.GGMLTypeError, "is not a quantized, F16, BF16 or F32 type"),
    ((Type.Q4_0, X[:, :40]), pyggml.ArgumentError, "rows of 40 values are not whole Q4_0 blocks of 32"),
    ((Type.IQ2_XXS, X), pyggml.ArgumentError, "needs an importance matrix"),
])
def test_quantize_errors(args, exc, match):
    with pytest.raises(exc, match=match):
        pyggml.quantize(*args)


def test_dequantize_errors():
    q = pyggml.quantize(Type.Q4_0, X)
    with pytest.raises(pyggml.ArgumentError, match="take 576 bytes, got 1152"):
        pyggml.dequantize(Type.Q4_0, q, (2, 512))
    with pytest.raises(pyggml.ArgumentError, match="not whole Q4_0 blocks"):
        pyggml.dequantize(Type.Q4_0, q, (4, 500))
    with pytest.raises(pyggml.GGMLTypeError, match="no to_float for I32"):
        pyggml.dequantize(Type.I32, q, (4, 512))


def test_quantize_q8_1_matches_its_block_layout():
    """Q8_1 (Q4_1's dot-product type), which ggml_quantize_chunk leaves out: per block of
    32, d = amax/127 (F16), s = d * sum(q) (F16), q = round(x/d) as int8"""
    x = np.random.default_rng(3).standard_normal((2, 64)).astype(np.float32)
    raw = pyggml.quantize(Type.Q8_1, x)
    blocks = raw.reshape(2, 2, 36)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    s = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    q = blocks[..., 4:].view(np.int8).astype(np.int32)
    xb = x.reshape(2, 2, 32)
    amax = np.abs(xb).max(-1)
    np.testing.assert_allclose(d, amax / 127, rtol=1e-3)
    want_q = np.round(xb / (amax / 127)[..., None])
    assert np.abs(q - want_q).max() <= 1 and np.mean(q == want_q) > 0.95
    np.testing.assert_allclose(s, (amax / 127) * q.sum(-1), rtol=2e-3, atol=1e-3)


@pytest.mark.parametrize("wtype, btype", [(Type.Q4_1, Type.Q8_1), (Type.Q4_K, Type.Q8_K)])
def test_mul_mat_with_b_already_in_the_dot_product_type(ctx, wtype, btype):
    """mul_mat converts an F32 b into a's dot-product type itself: handing it b quantized
    by pyggml.quantize gives the very same result"""
    rng = np.random.default_rng(4)
    w = rng.standard_normal((3, 256)).astype(np.float32)
    b = rng.standard_normal((2, 256)).astype(np.float32)
    a = ctx.from_numpy(pyggml.quantize(wtype, w), type=wtype)
    r_f32 = pyggml.mul_mat(ctx, a, ctx.from_numpy(b))
    r_q = pyggml.mul_mat(ctx, a, ctx.from_numpy(pyggml.quantize(btype, b), type=btype))
    got_f32, got_q = compute(ctx, r_f32), compute(ctx, r_q)
    assert np.array_equal(got_f32, got_q)
    wd = pyggml.dequantize(wtype, pyggml.quantize(wtype, w), w.shape).astype(np.float64)
    # b rounded to 8 bits: ~amax/127/sqrt(12) per value, over 256 products: ~0.1
    np.testing.assert_allclose(got_q, b @ wd.T, rtol=0, atol=0.4)
