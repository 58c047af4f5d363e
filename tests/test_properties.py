"""Property tests: whatever the arguments, pyggml raises or returns something sound."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyggml

dims = st.lists(st.integers(1, 5), min_size=1, max_size=4)


@settings(max_examples=200, deadline=None)
@given(base=dims, ne=st.lists(st.integers(0, 6), min_size=1, max_size=4),
       strides=st.lists(st.integers(0, 200), min_size=3, max_size=3), offset=st.integers(0, 400))
def test_views_never_reach_outside_their_base(base, ne, strides, offset):
    nb = [4] + strides[:len(ne) - 1]
    ne4, nb4 = ne + [1] * (4 - len(ne)), list(nb)
    while len(nb4) < 4:                    # ggml's default strides: contiguous continuation
        nb4.append(nb4[-1] * ne4[len(nb4) - 1])
    size = 4 * int(np.prod(base))
    # an independent statement of pyggml's rule (ggml's own builder checks only that a
    # contiguous block of the view's size fits): every element the strides reach lies in
    # a's data, the offset and strides are multiples of the float size
    n = int(np.prod(ne4))
    span = 4 + sum((x - 1) * s for x, s in zip(ne4, nb4)) if n else 0
    ok = n == 0 or (offset + span <= size and offset % 4 == 0 and all(s % 4 == 0 for s in nb4)
                    and offset + 4 * n <= size)
    with pyggml.Context(1 << 20) as ctx:
        a = ctx.from_numpy(np.arange(int(np.prod(base)), dtype=np.float32).reshape(base))
        lo, hi = a.data_ptr, a.data_ptr + a.nbytes
        view = (pyggml.view_1d, pyggml.view_2d, pyggml.view_3d, pyggml.view_4d)[len(ne) - 1]
        if not ok:
            with pytest.raises(ValueError):
                view(ctx, a, *ne, *strides[:len(ne) - 1], offset)
            return
        v = view(ctx, a, *ne, *strides[:len(ne) - 1], offset)
        arr = v.numpy()
        assert arr.size == v.nelements
        if arr.size:
            # every element the view can address lies inside a's data
            first = arr.ctypes.data
            last = first + sum((n - 1) * s for n, s in zip(arr.shape, arr.strides)) + 4
            assert lo <= first and last <= hi
            flat = np.arange(int(np.prod(base)), dtype=np.float32)
            idx = (np.array(arr.reshape(-1)) if arr.ndim else arr).astype(np.int64)
            np.testing.assert_array_equal(flat[idx], arr.reshape(-1))


@settings(max_examples=100, deadline=None)
@given(a=dims, b=dims)
def test_binary_ops_raise_or_match_ggml_broadcasting(a, b):
    a_ne, b_ne = a + [1] * (4 - len(a)), b + [1] * (4 - len(b))
    with pyggml.Context(1 << 20) as ctx:
        ta = ctx.from_numpy(np.ones(a[::-1], np.float32))
        tb = ctx.from_numpy(np.full(b[::-1], 2.0, np.float32))
        can = all(x % y == 0 for x, y in zip(a_ne, b_ne))
        if not can:
            with pytest.raises(pyggml.GGMLAbort, match=r"GGML_ASSERT\(ggml_can_repeat\(b, a\)\) failed"):
                pyggml.add(ctx, ta, tb)
            return
        c = pyggml.add(ctx, ta, tb)
        g = pyggml.Graph(ctx)
        g.build_forward_expand(c)
        g.compute(1)
        assert c.ne == ta.ne
        assert np.all(c.numpy() == 3.0)


@settings(max_examples=100, deadline=None)
@given(shape=dims, dtype=st.sampled_from([np.float32, np.float16, np.int32, np.int8, np.float64]))
def test_from_numpy_round_trips(shape, dtype):
    rng = np.random.default_rng(0)
    a = (rng.standard_normal(shape) * 100).astype(dtype)
    with pyggml.Context(1 << 20) as ctx:
        t = ctx.from_numpy(a)
        assert t.ne[:len(shape)] == tuple(shape[::-1])
        np.testing.assert_array_equal(t.numpy().reshape(shape), a)


@settings(max_examples=60, deadline=None)
@given(D=st.integers(1, 9), N=st.integers(1, 4), extra=st.integers(0, 3), kvh=st.integers(1, 2),
       rep=st.integers(1, 3), B=st.integers(1, 2), masked=st.booleans())
def test_attention_backward_matches_reference(D, N, extra, kvh, rep, B, masked):
    from pyggml import reference
    M, H = N + extra, kvh * rep
    rng = np.random.default_rng(D * 1000 + N * 100 + M)
    q = rng.standard_normal((B, H, N, D)).astype(np.float32)
    k = rng.standard_normal((B, kvh, M, D)).astype(np.float32)
    v = rng.standard_normal((B, kvh, M, D)).astype(np.float32)
    d = rng.standard_normal((B, H, N, D)).astype(np.float32)
    got = pyggml.attention_backward(q, k, v, d, masked=masked, n_threads=2)
    ref = reference.attention_backward(q, k, v, d, masked=masked)
    assert max(reference.nmse(g, r) for g, r in zip(got, ref)) < 1e-7
