"""Which ops of the linked ggml pyggml binds (:func:`op_coverage`, :func:`builder_coverage`),
and which of them ggml's backward pass differentiates (:func:`differentiable`)."""

from __future__ import annotations

from pyggml import _core, _graph, _optable
from pyggml.errors import ArgumentError, GGMLTypeError

__all__ = ["builder_coverage", "differentiable", "op_coverage"]

_NOT_OPS = {"NONE": "not an op: the op of leaf tensors (new_tensor, from_numpy)"}
_CUSTOM = {"MAP_CUSTOM1", "MAP_CUSTOM2", "MAP_CUSTOM3", "CUSTOM"}


def _targets(makes: str) -> list[str]:
    """The coverage names a row's `makes` stands for."""
    if makes.startswith("UNARY:"):
        sub = makes[6:]
        return ["GGML_OP_UNARY"] + ([] if sub == "*" else [f"GGML_UNARY_OP_{sub}"])
    if makes.startswith("GLU:"):
        sub = makes[4:]
        return ["GGML_OP_GLU"] + ([] if sub == "*" else [f"GGML_GLU_OP_{sub}"])
    return [f"GGML_OP_{makes}"]


def op_coverage() -> dict:
    """op_coverage() -> {"wrapped": [...], "not_wrapped": {name: reason}}

    Over every op of the *linked* ggml, read from the library at run time
    (``GGML_OP_*``, ``GGML_UNARY_OP_*`` and ``GGML_GLU_OP_*`` names): an op is wrapped
    when a graph builder pyggml binds in this build makes it; every other op is listed
    with the reason (not in this ggml's header with pyggml's signature, custom
    callbacks, or no row of pyggml's op table makes it yet).
    """
    ops, unary, glu = _core.linked_op_names()
    names = ([f"GGML_OP_{n}" for n in ops] + [f"GGML_UNARY_OP_{n}" for n in unary]
             + [f"GGML_GLU_OP_{n}" for n in glu])
    made: dict[str, list[dict]] = {}
    for row in _optable.OPS:
        for target in _targets(row["makes"]):
            made.setdefault(target, []).append(row)
    wrapped, not_wrapped = [], {}
    for name in names:
        rows = made.get(name, [])
        short = name.split("_OP_", 1)[1]
        if any(r["available"] for r in rows):
            wrapped.append(name)
        elif short in _NOT_OPS and name.startswith("GGML_OP_"):
            not_wrapped[name] = _NOT_OPS[short]
        elif short in _CUSTOM and name.startswith("GGML_OP_"):
            not_wrapped[name] = "custom C callbacks (ggml_map_custom*, ggml_custom_*) are not bound yet"
        elif rows:
            not_wrapped[name] = "; ".join(sorted({f"{r['name']}: {r['reason']}" for r in rows}))
        else:
            not_wrapped[name] = "no builder of pyggml's op table makes it (new in this ggml?)"
    return {"wrapped": wrapped, "not_wrapped": not_wrapped}


def builder_coverage() -> dict:
    """builder_coverage() -> {"bound": [...], "not_bound": {name: reason}, "header_only": [...]}

    Over the graph builders of pyggml's op table (C names without ``ggml_``), for this
    build; ``header_only`` lists builders of the linked ggml.h the table does not know.
    """
    bound = [r["name"] for r in _optable.OPS if r["available"]]
    not_bound = {r["name"]: r["reason"] for r in _optable.OPS if not r["available"]}
    return {"bound": bound, "not_bound": not_bound, "header_only": list(_optable.HEADER_ONLY)}


# the ops whose node may be a view of its source in a graph ggml differentiates
# (ggml_build_backward_expand's assertion on view_src)
_VIEWS_WITH_BACKWARD = {"CPY", "SET_ROWS", "VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"}


def differentiable(op) -> bool:
    """differentiable(op) -> bool

    Whether ggml's backward pass (``ggml_compute_backward``, which
    :meth:`Graph.build_backward_expand` runs) has a gradient for ``op``: a graph builder's
    name (``"tanh"``, ``"mul_mat"``), an :class:`Op`, :class:`UnaryOp` or :class:`GluOp`,
    or a node (a :class:`Tensor`). A builder stands for the node it returns (a composite
    builder's last node; an in-place builder has none); the fused ``swiglu`` of one tensor has none where
    ``swiglu_split`` has one. Where it is True, some sources may still have none:
    SOFT_MAX's mask, ROPE's frequency factors, CROSS_ENTROPY_LOSS's labels.
    ``build_backward_expand`` checks every node of a graph this way before ggml runs, and
    raises :class:`UnsupportedOpError` naming the node ggml would abort on.
    """
    if isinstance(op, _core.Tensor):
        node = op
        if node.op == "GLU" and (len(node.src) < 2 or node.src[1] is None):
            return False
        if node.view_src is not None and node.op not in _VIEWS_WITH_BACKWARD:
            return False                    # in place: ggml_build_backward_expand asserts
        return _graph._backward_sources(node.op, node.sub_op) >= 0
    if isinstance(op, _core.UnaryOp):
        return _graph._backward_sources("UNARY", op.name) >= 0
    if isinstance(op, _core.GluOp):
        return _graph._backward_sources("GLU", op.name) >= 0
    if isinstance(op, _core.Op):
        if op.name in ("UNARY", "GLU"):
            raise ArgumentError(f"differentiable: Op.{op.name} depends on which {op.name.lower()} op: "
                                f"pass a {'UnaryOp' if op.name == 'UNARY' else 'GluOp'}")
        return _graph._backward_sources(op.name, None) >= 0
    if not isinstance(op, str):
        raise GGMLTypeError(f"differentiable: op must be a builder name, an Op, UnaryOp or GluOp, or a Tensor, "
                            f"not {type(op).__name__}")
    row = next((r for r in _optable.OPS if r["name"] == op), None)
    if row is None:
        raise ArgumentError(f"differentiable: {op!r} is not a graph builder of pyggml's op table "
                            f"(pyggml.coverage.builder_coverage() lists them)")
    makes = row["makes"]
    if "inplace" in row["flags"]:
        return False                        # ggml's backward pass takes no in-place node
    if makes.endswith(":*"):
        raise ArgumentError(f"differentiable: {op} makes {makes}, which depends on its argument: pass the "
                            f"{'UnaryOp' if makes.startswith('UNARY') else 'GluOp'}")
    base, _, sub = makes.partition(":")
    if base == "GLU" and sum(1 for p in row["params"] if p[2].startswith("tensor")) == 1:
        return False                        # the fused form: ggml differentiates split GLUs only
    return _graph._backward_sources(base, sub or None) >= 0
