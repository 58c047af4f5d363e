"""Graph pictures: Graph.to_dot() parses as DOT and shows every node, leaf, source edge
and gradient; draw() and _repr_svg_ go through Graphviz's dot, or say it is missing."""

import shutil

import numpy as np
import pydot
import pytest

import pyggml
from pyggml import Type


def _graph(ctx, grads):
    x = ctx.from_numpy(np.arange(8, dtype=np.float32).reshape(2, 4))
    x.name = "x"
    w = ctx.from_numpy(np.ones(4, np.float32))
    w.name = "w"
    if grads:
        pyggml.set_param(w)
    h = pyggml.mul(ctx, pyggml.rms_norm(ctx, x, 1e-6), w)
    y = pyggml.sum(ctx, pyggml.silu(ctx, h))
    g = pyggml.Graph(ctx, 64, grads=grads)
    if grads:
        pyggml.set_loss(y)
    g.build_forward_expand(y)
    if grads:
        g.build_backward_expand()
    return g, x, w


def _parse(text):
    (dot,) = pydot.graph_from_dot_data(text)
    return dot


def test_to_dot_shows_every_node_leaf_and_source(ctx):
    g, x, w = _graph(ctx, False)
    dot = _parse(g.to_dot())
    names = {n.get_name() for n in dot.get_nodes()} - {"node"}
    assert names == {f"n{i}" for i in range(g.n_nodes)} | {"l0", "l1"}
    labels = {n.get_name(): n.get_label() for n in dot.get_nodes()}
    ops = [labels[f"n{i}"] for i in range(g.n_nodes)]
    assert "RMS_NORM (f32) | [4, 2] | params 1e-06" in ops[0]          # eps: float bits
    assert f"UNARY:SILU (f32) | [4, 2] | params {int(pyggml.UnaryOp.SILU)}" in ops[2]
    assert "SUM (f32) | [1]" in ops[3]
    assert sorted(labels[k].split("|")[0].strip('"{ ') for k in ("l0", "l1")) == ["w", "x"]
    edges = {(e.get_source(), e.get_destination(), e.get_label()) for e in dot.get_edges()}
    want = {(src_id, f"n{i}", f'"src{slot}"')
            for i, t in enumerate(g.nodes) for slot, s in enumerate(t.src) if s is not None
            for src_id in [f"n{g.nodes.index(s)}" if s in g.nodes else ("l0" if s == x else "l1")]}
    assert edges == want and len(edges) == 5


def test_to_dot_shows_parameters_losses_and_gradients(ctx):
    g, x, w = _graph(ctx, True)
    text = g.to_dot()
    dot = _parse(text)
    colors = {n.get_name(): n.get_fillcolor() for n in dot.get_nodes()}
    labels = {n.get_name(): n.get_label() or "" for n in dot.get_nodes()}
    (w_id,) = [k for k, v in labels.items() if v.startswith('"{w |')]
    assert colors[w_id] == "yellow"
    assert "lightcoral" in colors.values()
    grad_edges = [e for e in dot.get_edges() if e.get_style() == "dashed"]
    gw = g.grad(w)
    assert gw is not None and any(e.get_destination() == w_id for e in grad_edges)
    assert all(colors[e.get_source()] == "lightgray" for e in grad_edges)


def test_labels_escape_record_syntax(ctx):
    a = ctx.new_tensor(Type.F32, (3,))
    a.name = 'a{b}|<c>"d'
    g = pyggml.Graph(ctx)
    g.build_forward_expand(pyggml.neg(ctx, a))
    dot = _parse(g.to_dot())
    (leaf,) = [n for n in dot.get_nodes() if n.get_name() == "l0"]
    assert leaf.get_label().startswith('"{a\\{b\\}\\|\\<c\\>\\"d |')


@pytest.mark.skipif(shutil.which("dot") is not None, reason="Graphviz is installed here")
def test_draw_without_graphviz_says_what_is_missing(ctx, tmp_path):
    g, _, _ = _graph(ctx, False)
    with pytest.raises(pyggml.ArgumentError, match="Graphviz's `dot` program, which is not installed"):
        g.draw(tmp_path / "g.svg")
    assert not (tmp_path / "g.svg").exists()
    assert g._repr_svg_() is None


@pytest.mark.skipif(shutil.which("dot") is None, reason="needs Graphviz's dot")
def test_draw_with_graphviz(ctx, tmp_path):
    g, _, _ = _graph(ctx, True)
    g.draw(tmp_path / "g.svg")
    svg = (tmp_path / "g.svg").read_text()
    assert "<svg" in svg and "RMS_NORM" in svg
    assert g._repr_svg_().count("<g id=\"node") == g.n_nodes + 2


def test_draw_needs_a_format(ctx, tmp_path):
    g, _, _ = _graph(ctx, False)
    with pytest.raises(pyggml.ArgumentError, match="suffix"):
        g.draw(tmp_path / "g")
