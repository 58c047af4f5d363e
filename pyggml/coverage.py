"""Which ops of the linked ggml pyggml binds: :func:`op_coverage`, :func:`builder_coverage`."""

from __future__ import annotations

from pyggml import _core, _optable

__all__ = ["builder_coverage", "op_coverage"]

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
