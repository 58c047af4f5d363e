import numpy as np
import pytest

import pyggml
from pyggml import Type
from pyggml.opinfo.harness import rules_disabled


def grads_of(ctx, build, *arrays, size=256):
    """Mark arrays as params, build loss = build(ctx, *tensors), return (loss, grads)."""
    ts = [ctx.from_numpy(a) for a in arrays]
    for t in ts:
        pyggml.set_param(t)
    loss = build(ctx, *ts)
    pyggml.set_loss(loss)
    g = pyggml.Graph(ctx, size, grads=True)
    g.build_forward_expand(loss)
    g.build_backward_expand()
    g.compute(2)
    return loss.numpy()[0], [g.grad(t).numpy().copy() for t in ts]


def test_grad_of_sum_of_squares(ctx):
    x = np.array([1.0, -2.0, 3.5], np.float32)
    loss, (gx,) = grads_of(ctx, lambda c, t: pyggml.sum(c, pyggml.sqr(c, t)), x)
    assert loss == pytest.approx(float(np.sum(x * x)))
    np.testing.assert_allclose(gx, 2 * x)


def test_grad_of_mul_mat_and_softmax(ctx, rng):
    a = rng.standard_normal((3, 5)).astype(np.float32)      # ne (5, 3)
    b = rng.standard_normal((4, 5)).astype(np.float32)      # ne (5, 4)
    w = rng.standard_normal((4, 3)).astype(np.float32)      # weights for the loss

    def build(c, ta, tb):
        p = pyggml.soft_max(c, pyggml.mul_mat(c, ta, tb))   # (4, 3) = softmax(b @ a.T)
        return pyggml.sum(c, pyggml.mul(c, p, c.from_numpy(w)))

    _, (ga, gb) = grads_of(ctx, build, a, b)
    s = b.astype(np.float64) @ a.T
    p = np.exp(s - s.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    ds = p * (w - (w * p).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(ga, ds.T @ b, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(gb, ds @ a, rtol=1e-4, atol=1e-5)


def test_grad_is_none_for_non_params(ctx):
    x = ctx.from_numpy(np.ones(3, np.float32))
    y = ctx.from_numpy(np.ones(3, np.float32))
    pyggml.set_param(x)
    loss = pyggml.sum(ctx, pyggml.mul(ctx, x, y))
    pyggml.set_loss(loss)
    g = pyggml.Graph(ctx, grads=True)
    g.build_forward_expand(loss)
    g.build_backward_expand()
    g.compute(1)
    assert g.grad(y) is None
    np.testing.assert_array_equal(g.grad(x).numpy(), np.ones(3))
    g.reset()
    g.compute(1)
    np.testing.assert_array_equal(g.grad(x).numpy(), np.ones(3))


def test_set_param_and_set_loss_errors(ctx):
    x = ctx.new_tensor(Type.F32, (3,))
    s = pyggml.sqr(ctx, x)
    with pytest.raises(ValueError, match="set_param: t must be an input tensor .op NONE., not the result of SQR"):
        pyggml.set_param(s)
    with pytest.raises(TypeError, match="set_param: t has type I32"):
        pyggml.set_param(ctx.new_tensor(Type.I32, (3,)))
    with pytest.raises(ValueError, match=r"set_loss: t must be a scalar \(1 element\), got ne=\(3, 1, 1, 1\)"):
        pyggml.set_loss(s)
    with pytest.raises(TypeError, match="set_loss: t has type F16"):
        pyggml.set_loss(ctx.new_tensor(Type.F16, (1,)))
    with pytest.raises(TypeError, match="t must be a pyggml.Tensor"):
        pyggml.set_param(None)


def _loss_graph(ctx, param=True, loss=True, grads=True, size=256):
    x = ctx.from_numpy(np.ones(3, np.float32))
    if param:
        pyggml.set_param(x)
    out = pyggml.sum(ctx, pyggml.sqr(ctx, x))
    if loss:
        pyggml.set_loss(out)
    g = pyggml.Graph(ctx, size, grads=grads)
    g.build_forward_expand(out)
    return g


def test_build_backward_expand_precondition_errors(ctx):
    with pytest.raises(ValueError, match=r"made without gradients; use Graph\(ctx, size, grads=True\)"):
        _loss_graph(ctx, grads=False).build_backward_expand()
    with pytest.raises(ValueError, match="no parameter among the graph's nodes"):
        _loss_graph(ctx, param=False).build_backward_expand()
    with pytest.raises(ValueError, match="no loss among the graph's nodes"):
        _loss_graph(ctx, loss=False).build_backward_expand()
    with pytest.raises(ValueError, match="no parameter"):
        pyggml.Graph(ctx, grads=True).build_backward_expand()
    with pytest.raises(ValueError, match="no_alloc"):
        _loss_graph(ctx).build_backward_expand(pyggml.Context(1 << 20, no_alloc=True))


def test_graph_too_small_for_the_backward_pass(ctx):
    g = _loss_graph(ctx, size=3)
    with pytest.raises(pyggml.GraphFullError, match="the graph would hold 6 nodes; its size is 3"):
        g.build_backward_expand()
    assert g.n_nodes == 3                # nothing happened in this process
    g.compute(1)


def test_context_too_small_for_the_gradients():
    probe = pyggml.Context(1 << 20)
    _loss_graph(probe, size=16)
    need = probe.used_mem
    with pyggml.Context(need + 64) as ctx:
        g = _loss_graph(ctx, size=16)
        used = ctx.used_mem
        with pytest.raises(pyggml.ContextFullError, match="build_backward_expand needs .* bytes but the context has"):
            g.build_backward_expand()
        assert ctx.used_mem == used      # nothing was created in ctx
        g.compute(1)                     # the graph is untouched and usable


def test_op_without_backward_is_refused(ctx, rng):
    # FLASH_ATTN_BACK has no backward in ggml: ggml would abort; pyggml raises
    q = ctx.from_numpy(rng.standard_normal((1, 2, 2, 4)).astype(np.float32))
    k = ctx.from_numpy(rng.standard_normal((1, 2, 3, 4)).astype(np.float32))
    v = ctx.from_numpy(rng.standard_normal((1, 2, 4, 3)).astype(np.float32))
    d = ctx.from_numpy(rng.standard_normal((1, 2, 2, 4)).astype(np.float32))
    pyggml.set_param(q)
    r = pyggml.flash_attn_back(ctx, q, k, v, d, False)
    loss = pyggml.sum(ctx, r)
    pyggml.set_loss(loss)
    g = pyggml.Graph(ctx, grads=True)
    g.build_forward_expand(loss)
    n = g.n_nodes
    with pytest.raises(pyggml.GGMLAbort, match="ggml would abort: .*unsupported ggml op for backward pass: "
                                               "FLASH_ATTN_BACK") as e:
        g.build_backward_expand()
    assert "FLASH_ATTN_BACK" in e.value.ggml_message
    assert g.n_nodes == n                # the graph is as it was


def test_reset_and_grad_errors(ctx):
    g = pyggml.Graph(ctx)
    with pytest.raises(ValueError, match="without gradients"):
        g.reset()
    with pytest.raises(TypeError, match="t must be a pyggml.Tensor"):
        g.grad("x")
    assert g.grad(ctx.new_tensor(Type.F32, (1,))) is None


def test_backward_graph_whose_kernels_would_abort_is_refused_at_compute(ctx):
    # grad of the repeat output arrives permuted (non-contiguous); REPEAT_BACK's
    # kernel asserts contiguous rows. ggml builds this graph, then aborts computing it.
    # pyggml's REPEAT_BACK rule refuses it in build_backward_expand; without the rules,
    # the guarded proof refuses it at compute.
    def graph():
        x = ctx.from_numpy(np.ones((3, 4), np.float32))
        pyggml.set_param(x)
        r = pyggml.repeat(ctx, x, ctx.new_tensor(Type.F32, (4, 3, 2)))
        loss = pyggml.sum(ctx, pyggml.cont(ctx, pyggml.permute(ctx, r, 1, 0, 2, 3)))
        pyggml.set_loss(loss)
        g = pyggml.Graph(ctx, grads=True)
        g.build_forward_expand(loss)
        return g
    with pytest.raises(pyggml.KernelPreconditionError, match="REPEAT_BACK node refused: src0 must have contiguous"):
        graph().build_backward_expand()
    g = graph()
    with rules_disabled():
        g.build_backward_expand()
    with pytest.raises(ValueError, match=r"compute: ggml would abort .*GGML_ASSERT\(nb00 == sizeof\(float\)\)"):
        g.compute(2)
    with pytest.raises(ValueError, match="would abort"):     # still refused: nothing changed
        g.compute(1)


def test_backward_graph_computes_repeatedly(ctx):
    x = ctx.from_numpy(np.array([1.0, 2.0], np.float32))
    pyggml.set_param(x)
    loss = pyggml.sum(ctx, pyggml.sqr(ctx, x))
    pyggml.set_loss(loss)
    g = pyggml.Graph(ctx, grads=True)
    g.build_forward_expand(loss)
    g.build_backward_expand()
    for _ in range(3):
        g.compute(2)
        np.testing.assert_array_equal(g.grad(x).numpy(), [2.0, 4.0])


def test_mean_of_a_tensor_with_another_gradient_is_refused_as_a_known_defect(ctx):
    p = ctx.from_numpy(np.ones((3, 4), np.float32))
    pyggml.set_param(p)
    loss = pyggml.add(ctx, pyggml.sum(ctx, pyggml.mean(ctx, p)), pyggml.sum(ctx, pyggml.sqr(ctx, p)))
    pyggml.set_loss(loss)
    g = pyggml.Graph(ctx, 64, grads=True)
    g.build_forward_expand(loss)
    with pytest.raises(pyggml.UpstreamDefect, match="node 1 \\(MEAN\\) of a tensor that node") as e:
        g.build_backward_expand()
    assert e.value.defect == "mean-grad-accumulate"
    # the mean alone differentiates: d/dp sum(mean(p)) = 1/4 everywhere
    q = ctx.from_numpy(np.ones((3, 4), np.float32))
    pyggml.set_param(q)
    loss2 = pyggml.sum(ctx, pyggml.mean(ctx, q))
    pyggml.set_loss(loss2)
    g2 = pyggml.Graph(ctx, 64, grads=True)
    g2.build_forward_expand(loss2)
    g2.build_backward_expand()
    g2.compute(1)
    np.testing.assert_allclose(g2.grad(q).numpy(), np.full((3, 4), 0.25))


# --- ggml's own backward pass on what pyggml refuses: the defects, shown with the rules off
# (rules_disabled turns the backward checks off too; ggml's aborts are caught, the compute
# is proven in a forked child)

def _backward(ctx, loss, params):
    for p in params:
        pyggml.set_param(p)
    pyggml.set_loss(loss)
    g = pyggml.Graph(ctx, 256, grads=True)
    g.build_forward_expand(loss)
    g.build_backward_expand()
    return g


def test_upstream_add1_gradient_is_the_mean_where_the_sum_belongs():
    # the defect add1-grad-mean: d sum(a + b) / db is the number of elements of a (6); ggml
    # gives the mean of the gradient (1). (A 1-D a: ggml_mean is per row, and a 2-D a's
    # gradient of b is not even a scalar, which ggml asserts.)
    with rules_disabled(), pyggml.Context(16 << 20) as ctx:
        a = ctx.from_numpy(np.arange(6, dtype=np.float32))
        b = ctx.from_numpy(np.array([0.5], np.float32))
        g = _backward(ctx, pyggml.sum(ctx, pyggml.add1(ctx, a, b)), [a, b])
        g.compute(1)
        np.testing.assert_array_equal(g.grad(a).numpy(), np.ones(6, np.float32))
        assert float(g.grad(b).numpy()[0]) == 1.0       # the sum, 6, belongs here


@pytest.mark.parametrize("op", ["sub", "div"])
def test_upstream_sub_div_gradient_of_a_broadcast_b_aborts(op):
    # the defect sub-div-broadcast-grad: b's gradient keeps a's shape (no repeat_back)
    with rules_disabled(), pyggml.Context(16 << 20) as ctx:
        a = ctx.from_numpy(np.full((3, 4), 2.0, np.float32))
        b = ctx.from_numpy(np.full((1, 4), 2.0, np.float32))
        with pytest.raises(pyggml.GGMLAbort, match="ggml_are_same_shape"):
            _backward(ctx, pyggml.sum(ctx, getattr(pyggml, op)(ctx, a, b)), [a, b])


def test_upstream_mean_gradient_with_another_gradient_aborts():
    # the defect mean-grad-accumulate: MEAN's [1, ne1, ...] gradient reaches ggml_add1
    with rules_disabled(), pyggml.Context(16 << 20) as ctx:
        p = ctx.from_numpy(np.ones((3, 4), np.float32))
        loss = pyggml.add(ctx, pyggml.sum(ctx, pyggml.mean(ctx, p)), pyggml.sum(ctx, pyggml.sqr(ctx, p)))
        with pytest.raises(pyggml.GGMLAbort, match="ggml_is_scalar"):
            _backward(ctx, loss, [p])


def test_upstream_soft_max_alibi_gradient_aborts_at_compute():
    # the defect soft-max-alibi-grad: the backward node carries max_bias, its kernel asserts 0
    rng = np.random.default_rng(0)
    with rules_disabled(), pyggml.Context(16 << 20) as ctx:
        a = ctx.from_numpy(rng.standard_normal((1, 4, 3, 6)).astype(np.float32))
        m = ctx.from_numpy(rng.standard_normal((1, 1, 3, 6)).astype(np.float32))
        y = pyggml.soft_max_ext(ctx, a, m, 0.5, 8.0)
        w = ctx.from_numpy(rng.standard_normal((1, 4, 3, 6)).astype(np.float32))
        g = _backward(ctx, pyggml.sum(ctx, pyggml.mul(ctx, y, w)), [a])
        with pytest.raises(pyggml.GGMLAbort, match="max_bias"):
            g.compute(1)
