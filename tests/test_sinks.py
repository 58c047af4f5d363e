"""Attention sinks: ggml_soft_max_add_sinks and ggml_flash_attn_ext_add_sinks, functions that
give an existing SOFT_MAX / FLASH_ATTN_EXT node one more logit per head (its src2 / src4).
Each soft_max_ext and flash_attn_ext sample of the OpInfo registry runs again with sinks,
against the float64 references given the same sinks; then every refusal."""

import gc

import numpy as np
import pytest

import pyggml
from pyggml import Type
from pyggml.opinfo import Arg, registry
from pyggml.opinfo.harness import _tensor, nmse, read

SOFT_MAX = registry()["soft_max_ext"]
FA = registry()["flash_attn_ext"]


def _heads(sample):
    q = sample.args[0].value
    return q.shape[-3] if q.ndim >= 3 else 1


def _src(t, i):
    return t.src[i] if len(t.src) > i else None


def _run_with_sinks(info, sample, add, sinks):
    """The sample's node with ``sinks`` added by ``add``; its result as stored."""
    with pyggml.Context(64 << 20) as ctx:
        args = [_tensor(ctx, a) if isinstance(a, Arg) else a for a in sample.args]
        node = getattr(pyggml, info.op)(ctx, *args)
        assert add(node, ctx.from_numpy(sinks)) is node
        g = pyggml.Graph(ctx)
        g.build_forward_expand(node)
        g.compute(1)
        return read(node)


def _ref_args(sample):
    from pyggml.opinfo.harness import _ref_args as ref_args
    return ref_args(sample)


@pytest.mark.parametrize("t", [Type.F32])
def test_soft_max_with_sinks_against_float64(t):
    rng = np.random.default_rng(0)
    n = 0
    for sample in SOFT_MAX.samples(rng, t):
        if sample.defect:
            continue
        sinks = rng.normal(0.0, 2.0, _heads(sample)).astype(np.float32)
        got = _run_with_sinks(SOFT_MAX, sample, pyggml.soft_max_add_sinks, sinks)
        want = SOFT_MAX.ref(*_ref_args(sample), sinks=sinks)
        without = SOFT_MAX.ref(*_ref_args(sample))
        assert nmse(got.reshape(want.shape), want) < SOFT_MAX.tolerance(t), sample.name
        assert nmse(without, want) > 1e-4, sample.name     # the sinks changed the result
        n += 1
    assert n >= 6


@pytest.mark.parametrize("t", [Type.F32, Type.F16, Type.Q8_0])
def test_flash_attn_ext_with_sinks_against_float64(t):
    rng = np.random.default_rng(1)
    n = 0
    for sample in FA.samples(rng, t):
        if sample.defect:
            continue
        sinks = rng.normal(0.0, 2.0, _heads(sample)).astype(np.float32)
        got = _run_with_sinks(FA, sample, pyggml.flash_attn_ext_add_sinks, sinks)
        want = FA.ref(*_ref_args(sample), sinks=sinks)
        assert nmse(got.reshape(want.shape), want) < FA.tolerance(t), sample.name
        n += 1
    assert n >= 10


def test_a_large_sink_takes_the_whole_row():
    with pyggml.Context(1 << 20) as ctx:
        a = ctx.from_numpy(np.zeros((2, 3, 4), np.float32))        # 2 heads
        y = pyggml.soft_max_ext(ctx, a, None, 1.0, 0.0)
        pyggml.soft_max_add_sinks(y, ctx.from_numpy(np.array([0.0, 80.0], np.float32)))
        g = pyggml.Graph(ctx)
        g.build_forward_expand(y)
        g.compute(1)
        np.testing.assert_allclose(y.numpy()[0], np.full((3, 4), 0.2), rtol=1e-6)   # 4 logits and a sink of 0
        assert np.all(y.numpy()[1] < 1e-30)                                        # exp(-80) of the row


def test_sinks_none_removes_them():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 3, 5)).astype(np.float32)
    with pyggml.Context(1 << 20) as ctx:
        y = pyggml.soft_max_ext(ctx, ctx.from_numpy(x), None, 1.0, 0.0)
        pyggml.soft_max_add_sinks(y, ctx.from_numpy(np.ones(2, np.float32)))
        assert _src(y, 2) is not None
        pyggml.soft_max_add_sinks(y, None)
        assert _src(y, 2) is None
        g = pyggml.Graph(ctx)
        g.build_forward_expand(y)
        g.compute(1)
        assert nmse(y.numpy(), SOFT_MAX.ref(x, None, 1.0, 0.0)) < 1e-12


def test_the_sinks_context_lives_as_long_as_the_node_s():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 5)).astype(np.float32)
    sinks = np.array([1.5, -0.5], np.float32)
    with pyggml.Context(1 << 20) as ctx:
        y = pyggml.soft_max_ext(ctx, ctx.from_numpy(x), None, 1.0, 0.0)
        other = pyggml.Context(1 << 16)
        pyggml.soft_max_add_sinks(y, other.from_numpy(sinks))
        del other
        gc.collect()                         # the node's context keeps the sinks' pool
        g = pyggml.Graph(ctx)
        g.build_forward_expand(y)
        g.compute(1)
        assert nmse(y.numpy(), SOFT_MAX.ref(x, None, 1.0, 0.0, sinks=sinks)) < 1e-12


def test_a_graph_built_before_the_sinks_looks_for_their_data_again():
    with pyggml.Context(1 << 20) as ctx, pyggml.Context(1 << 16, no_alloc=True) as later:
        y = pyggml.soft_max_ext(ctx, ctx.from_numpy(np.zeros((2, 1, 4), np.float32)), None, 1.0, 0.0)
        g = pyggml.Graph(ctx)
        g.build_forward_expand(y)
        g.compute(1)
        pyggml.soft_max_add_sinks(y, later.new_tensor(Type.F32, (2,)))    # no data yet
        with pytest.raises(pyggml.ArgumentError, match="without data"):
            g.compute(1)


@pytest.mark.parametrize("what, make, cls, match", [
    ("another op", lambda c, y: (pyggml.add(c, y, y), c.from_numpy(np.ones(2, np.float32))), pyggml.ArgumentError,
     "a must be a SOFT_MAX node, not ADD"),
    ("F16 sinks", lambda c, y: (y, c.from_numpy(np.ones(2, np.float16))), pyggml.GGMLTypeError,
     "sinks must be F32, not f16"),
    ("a head count that differs", lambda c, y: (y, c.from_numpy(np.ones(3, np.float32))), pyggml.ArgumentError,
     "one value per head: ne.0. = 3, but the node's src0 has ne.2. = 2"),
    ("not a tensor", lambda c, y: (y, [1.0, 2.0]), pyggml.GGMLTypeError, "sinks"),
])
def test_what_ggml_asserts_is_refused_and_the_node_kept(what, make, cls, match):
    with pyggml.Context(1 << 20) as ctx:
        y = pyggml.soft_max_ext(ctx, ctx.from_numpy(np.zeros((2, 3, 4), np.float32)), None, 1.0, 0.0)
        node, sinks = make(ctx, y)
        with pytest.raises(cls, match=match):
            pyggml.soft_max_add_sinks(node, sinks)
        assert _src(y, 2) is None


def test_strided_sinks_are_refused_for_the_kernel():
    # ops.cpp reads sk[i02] as a packed array: a transposed view (nb[0] = 8) would be misread
    with pyggml.Context(1 << 20) as ctx:
        y = pyggml.soft_max_ext(ctx, ctx.from_numpy(np.zeros((2, 3, 4), np.float32)), None, 1.0, 0.0)
        strided = pyggml.transpose(ctx, ctx.from_numpy(np.ones((2, 2), np.float32)))
        assert strided.nb[0] == 8
        with pytest.raises(pyggml.KernelPreconditionError, match="sinks"):
            pyggml.soft_max_add_sinks(y, strided)
        assert _src(y, 2) is None


def test_sinks_already_set_are_refused():
    with pyggml.Context(1 << 20) as ctx:
        y = pyggml.soft_max_ext(ctx, ctx.from_numpy(np.zeros((2, 3, 4), np.float32)), None, 1.0, 0.0)
        s = ctx.from_numpy(np.ones(2, np.float32))
        pyggml.soft_max_add_sinks(y, s)
        with pytest.raises(pyggml.ArgumentError, match="already has sinks"):
            pyggml.soft_max_add_sinks(y, s)


def test_flash_attn_ext_sinks_refusals():
    with pyggml.Context(1 << 20) as ctx:
        q = ctx.from_numpy(np.zeros((1, 2, 3, 8), np.float32))
        kv = ctx.from_numpy(np.zeros((1, 2, 5, 8), np.float16))
        o = pyggml.flash_attn_ext(ctx, q, kv, kv, None, 1.0, 0.0, 0.0)
        with pytest.raises(pyggml.ArgumentError, match="a must be a FLASH_ATTN_EXT node, not SOFT_MAX"):
            pyggml.flash_attn_ext_add_sinks(pyggml.soft_max(ctx, q), ctx.from_numpy(np.ones(2, np.float32)))
        with pytest.raises(pyggml.ArgumentError, match="one value per head"):
            pyggml.flash_attn_ext_add_sinks(o, ctx.from_numpy(np.ones(3, np.float32)))
        pyggml.flash_attn_ext_add_sinks(o, ctx.from_numpy(np.ones(2, np.float32)))
        assert _src(o, 4) is not None


def test_the_gradient_through_a_softmax_with_sinks():
    # ggml's SOFT_MAX backward (soft_max_ext_back) uses the forward's output, which already
    # holds the sinks' share: the gradient with respect to the logits is exact; the sinks,
    # if a parameter, get none (build_backward_expand refuses that: a NULL gradient)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 3, 5))
    c = rng.standard_normal((2, 3, 5))
    sinks = np.array([0.7, -1.2])

    def loss(xv):
        return float(np.sum(SOFT_MAX.ref(xv, None, 1.0, 0.0, sinks=sinks) * c))

    with pyggml.Context(16 << 20) as ctx:
        xt = ctx.from_numpy(x.astype(np.float32))
        st = ctx.from_numpy(sinks.astype(np.float32))
        pyggml.set_param(xt)
        y = pyggml.soft_max_ext(ctx, xt, None, 1.0, 0.0)
        pyggml.soft_max_add_sinks(y, st)
        out = pyggml.sum(ctx, pyggml.mul(ctx, y, ctx.from_numpy(c.astype(np.float32))))
        pyggml.set_loss(out)
        g = pyggml.Graph(ctx, grads=True)
        g.build_forward_expand(out)
        g.build_backward_expand()
        g.compute(1)
        got = g.grad(xt).numpy().astype(np.float64)
    eps = 1e-6
    want = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        d = np.zeros_like(x)
        d[i] = eps
        want[i] = (loss(x + d) - loss(x - d)) / (2 * eps)
    assert nmse(got, want) < 1e-9
    with pyggml.Context(16 << 20) as ctx:
        xt = ctx.from_numpy(x.astype(np.float32))
        st = ctx.from_numpy(sinks.astype(np.float32))
        pyggml.set_param(xt)
        pyggml.set_param(st)
        y = pyggml.soft_max_ext(ctx, xt, None, 1.0, 0.0)
        pyggml.soft_max_add_sinks(y, st)
        out = pyggml.sum(ctx, y)
        pyggml.set_loss(out)
        g = pyggml.Graph(ctx, grads=True)
        g.build_forward_expand(out)
        with pytest.raises(pyggml.UnsupportedOpError, match="src2 .* no gradient"):
            g.build_backward_expand()
