"""Gradients of flash_attn_ext (which ggml cannot differentiate) through the
FLASH_ATTN_BACK kernel: checked against the float64 reference, whose semantics are
checked against ggml's own flash_attn_ext forward."""

import numpy as np
import pytest

import pyggml
from pyggml import reference

SHAPES = [(1, 1, 1, 3, 5, 4), (1, 2, 1, 4, 4, 8), (2, 4, 2, 3, 7, 16), (1, 8, 2, 5, 9, 64), (2, 6, 3, 1, 4, 17),
          (1, 4, 4, 6, 6, 80)]


def _inputs(B, H, KVH, N, M, D, seed=0, kv_dtype=np.float32):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, H, N, D)).astype(np.float32)
    k = rng.standard_normal((B, KVH, M, D)).astype(kv_dtype)
    v = rng.standard_normal((B, KVH, M, D)).astype(kv_dtype)
    d = rng.standard_normal((B, H, N, D)).astype(np.float32)
    return q, k, v, d


def _ggml_forward(q, k, v, scale, masked):
    """flash_attn_ext computed by ggml, in the reference's layout (B, H, N, D)."""
    B, H, N, D = q.shape
    M = k.shape[2]
    with pyggml.Context(64 << 20) as ctx:
        tq = ctx.from_numpy(np.ascontiguousarray(q.transpose(0, 2, 1, 3)))          # ne (D, H, N, B)
        tk = ctx.from_numpy(np.ascontiguousarray(k.astype(np.float16).transpose(0, 2, 1, 3)))
        tv = ctx.from_numpy(np.ascontiguousarray(v.astype(np.float16).transpose(0, 2, 1, 3)))
        perm = [pyggml.permute(ctx, t, 0, 2, 1, 3) for t in (tq, tk, tv)]          # ne (D, N, H, B) etc.
        mask = None
        if masked:
            m = np.where(np.arange(M)[None, :] > (M - N) + np.arange(N)[:, None], -np.inf, 0.0)
            mask = ctx.from_numpy(m.astype(np.float16))
        r = pyggml.flash_attn_ext(ctx, *perm, mask, scale, 0.0, 0.0)               # ne (D, H, N, B)
        g = pyggml.Graph(ctx)
        g.build_forward_expand(r)
        g.compute(1)
        return r.numpy().reshape(B, N, H, D).transpose(0, 2, 1, 3).astype(np.float64)     # (B, H, N, D)


@pytest.mark.parametrize("masked", [False, True])
def test_the_reference_has_flash_attn_ext_semantics(masked):
    # the reference's "group" mapping, scale and causal mask are what ggml's op computes
    for B, H, KVH, N, M, D in SHAPES[:4]:
        q, k, v, _ = _inputs(B, H, KVH, N, M, D, kv_dtype=np.float16)
        scale = 0.37
        want = reference.attention_forward(q, k, v, masked=masked, mapping="group", scale=scale)
        got = _ggml_forward(q, k, v, scale, masked)
        assert reference.nmse(got, want) < 1e-5, (B, H, KVH, N, M, D)       # F16 K/V, F16 softmax inside


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_flash_attn_ext_gradients_match_the_float64_reference(shape, masked):
    B, H, KVH, N, M, D = shape
    q, k, v, d = _inputs(*shape, seed=sum(shape))
    for scale in (None, 0.125, 1.7):
        got = pyggml.flash_attn_ext_backward(q, k, v, d, scale=scale, masked=masked, n_threads=2)
        want = reference.attention_backward(q, k, v, d, masked=masked, mapping="group", scale=scale)
        for name, g, w in zip("qkv", got, want):
            assert g.shape == w.shape
            assert reference.nmse(g, w) < 1e-10, (name, scale)


def test_f16_keys_and_values_and_the_tile_mapping():
    q, k, v, d = _inputs(1, 4, 2, 3, 5, 8, kv_dtype=np.float16)
    got = pyggml.flash_attn_ext_backward(q, k, v, d, mapping="tile")
    want = reference.attention_backward(q, k, v, d, mapping="tile")
    assert all(reference.nmse(g, w) < 1e-10 for g, w in zip(got, want))
    # the wrong mapping would be far off: the test can fail
    other = reference.attention_backward(q, k, v, d, mapping="group")
    assert reference.nmse(got[0], other[0]) > 1e-3


def test_what_the_kernel_does_not_cover_is_named():
    q, k, v, d = _inputs(1, 2, 1, 3, 5, 4)
    for kw, what in ((dict(mask=np.zeros((3, 5))), "arbitrary mask"), (dict(max_bias=8.0), "ALiBi"),
                     (dict(logit_softcap=30.0), "logit_softcap")):
        with pytest.raises(NotImplementedError, match=what):
            pyggml.flash_attn_ext_backward(q, k, v, d, **kw)
    with pytest.raises(NotImplementedError, match="head size"):
        pyggml.flash_attn_ext_backward(q, k, v[..., :2], d)
    with pytest.raises(ValueError, match="scale"):
        pyggml.flash_attn_ext_backward(q, k, v, d, scale=0.0)
    with pytest.raises(ValueError, match="mapping"):
        pyggml.flash_attn_ext_backward(q, k, v, d, mapping="diagonal")
