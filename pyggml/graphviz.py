"""Pictures of ggml graphs: Graphviz DOT text, SVG or PNG.

``to_dot(graph)`` shows what ``ggml_graph_dump_dot`` shows: one record per node (name,
op, type, shape, op params: ints, or floats where the bits are not a small int) in
execution order, the leafs they read, an edge per source
labelled with its slot, parameters and losses coloured, and with gradients, each
gradient and the node it belongs to joined by a dashed edge. ``draw(graph, path)``
runs Graphviz's ``dot`` program on it, which must be installed (it is not a Python
package: ``apt install graphviz``, ``brew install graphviz``, ``conda install graphviz``).
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from typing import TYPE_CHECKING

from pyggml.errors import ArgumentError, GGMLTypeError

if TYPE_CHECKING:
    from pyggml import Graph, Tensor

__all__ = ["draw", "to_dot", "to_svg"]

_PARAM = 0x4      # GGML_TENSOR_FLAG_PARAM
_LOSS = 0x8       # GGML_TENSOR_FLAG_LOSS
_OUTPUT = 0x2     # GGML_TENSOR_FLAG_OUTPUT


def _esc(text: str) -> str:
    """Text inside a record label: the record syntax's own characters escaped."""
    out = []
    for ch in text:
        if ch in '{}|<>"\\':
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "".join(out)


def _ne(t: Tensor) -> str:
    ne = list(t.ne)
    while len(ne) > 1 and ne[-1] == 1:
        ne.pop()
    return "[" + ", ".join(str(n) for n in ne) + "]"


def _param(v: int) -> str:
    """An op param as an int, or as the float32 its bits hold when they are not a small int
    (eps, scales and frequencies are floats in op_params)."""
    if -65536 < v < 65536:
        return str(v)
    return f"{struct.unpack('<f', struct.pack('<i', v))[0]:g}"


def _params(t: Tensor) -> str:
    p = list(t.op_params)
    while p and p[-1] == 0:
        p.pop()
    return "" if not p else "params " + " ".join(_param(v) for v in p[:8]) + (" ..." if len(p) > 8 else "")


def _op(t: Tensor) -> str:
    return f"{t.op}:{t.sub_op}" if t.sub_op is not None else t.op


def _label(t: Tensor, what: str) -> str:
    name = t.name or what
    fields = [_esc(name), _esc(f"{_op(t)} ({t.type.name.lower()})"), _esc(_ne(t))]
    params = _params(t)
    if params and t.op not in ("NONE", "VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"):
        fields.append(_esc(params))
    return "{" + " | ".join(fields) + "}"


def _color(t: Tensor, is_grad: bool) -> str:
    if t.flags & _PARAM:
        return "yellow"
    if t.flags & _LOSS:
        return "lightcoral"
    if is_grad:
        return "lightgray"
    if t.flags & _OUTPUT:
        return "lightblue"
    return "white"


def to_dot(graph: Graph) -> str:
    """The graph as Graphviz DOT text (``digraph ggml``)."""
    nodes = graph.nodes
    ids: dict[Tensor, str] = {t: f"n{i}" for i, t in enumerate(nodes)}
    leafs: list[Tensor] = []
    for t in nodes:
        for s in t.src:
            if s is not None and s not in ids:
                ids[s] = f"l{len(leafs)}"
                leafs.append(s)
    grads: dict[Tensor, Tensor] = {}
    if graph.grads:
        for t in nodes + leafs:
            g = graph.grad(t)
            if g is not None and g in ids and g != t:
                grads[t] = g
    is_grad = set(grads.values())
    lines = ["digraph ggml {", "  rankdir = TB;",
             '  node [shape = record, style = filled, fontname = "monospace", fontsize = 10];']
    for i, t in enumerate(nodes):
        lines.append(f'  n{i} [label = "{_label(t, f"node_{i}")}", fillcolor = {_color(t, t in is_grad)}];')
    for j, t in enumerate(leafs):
        lines.append(f'  l{j} [label = "{_label(t, f"leaf_{j}")}", fillcolor = {_color(t, t in is_grad)}, '
                     f'style = "filled,rounded"];')
    for i, t in enumerate(nodes):
        for slot, s in enumerate(t.src):
            if s is not None:
                lines.append(f'  {ids[s]} -> n{i} [label = "src{slot}"];')
    for t, g in grads.items():
        lines.append(f'  {ids[g]} -> {ids[t]} [style = dashed, label = "grad", constraint = false];')
    lines.append("}")
    return "\n".join(lines) + "\n"


def _dot_program() -> str:
    exe = shutil.which("dot")
    if exe is None:
        raise ArgumentError("drawing a graph needs Graphviz's `dot` program, which is not installed "
                            "(it is not a Python package: apt install graphviz, brew install graphviz, "
                            "or conda install graphviz); Graph.to_dot() gives the DOT text without it")
    return exe


def to_svg(graph: Graph) -> str:
    """The graph as SVG text, through Graphviz's ``dot``."""
    out = subprocess.run([_dot_program(), "-Tsvg"], input=to_dot(graph), capture_output=True, text=True,
                         check=False)
    if out.returncode != 0:
        raise ArgumentError(f"dot -Tsvg failed: {out.stderr.strip()}")
    return out.stdout


def draw(graph: Graph, path: str | os.PathLike[str], format: str | None = None) -> None:
    """Write a picture of the graph to ``path``; ``format`` (``svg``, ``png``, ``pdf``,
    ...; default: the path's suffix) as Graphviz's ``dot -T`` takes it."""
    if not isinstance(path, (str, os.PathLike)):
        raise GGMLTypeError(f"draw: path must be a str or os.PathLike, not {type(path).__name__}")
    if format is not None and not isinstance(format, str):
        raise GGMLTypeError(f"draw: format must be a str or None, not {type(format).__name__}")
    fmt = format or os.path.splitext(os.fspath(path))[1].lstrip(".").lower()
    if not fmt:
        raise ArgumentError("draw: give a path with a suffix (.svg, .png, ...) or format=")
    out = subprocess.run([_dot_program(), f"-T{fmt}", "-o", os.fspath(path)], input=to_dot(graph),
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise ArgumentError(f"dot -T{fmt} failed (is {fmt!r} a format dot writes?): {out.stderr.strip()}")
