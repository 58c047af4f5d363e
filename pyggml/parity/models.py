"""A real model as a parity subject: every named node of pyggml's graph of a GGUF model
(``pyggml.models``) against the same architecture in float64 over the dequantized weights.

``pyggml parity --model PATH [--prompt TEXT]`` runs the prompt through both, one row per
named node (subject ``model:<architecture>``, pair ``ggml~reference``), worst first.

Tolerances, measured (AMD EPYC Zen 4, 2026-12-04, prompt "The capital of France is"):

* every weight F32: the nodes agree with float64 to 3.5e-7 NMSE at worst (ggml's GELU reads
  an F16 table; before the first GELU they agree to 3e-14): ``TOL_F32`` = 1e-5.
* any weight in another type (quantized, F16, BF16): ggml converts the activations of such a
  product to the weight's dot-product type (Q8_K for the K-quants, Q8_0 for Q4_0..Q8_0, F16,
  BF16), so every product rounds its input: Gemma 3 270M Q4_K_M's worst node is 1.6e-2
  (l17.attn_out), its logits 1.3e-3: ``TOL_CONVERTED`` = 5e-2.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pyggml.parity.model import Row, nmse

__all__ = ["DEFAULT_PROMPT", "TOL_CONVERTED", "TOL_F32", "compare_nodes", "model_rows", "tolerance_for"]

DEFAULT_PROMPT = "The capital of France is"
TOL_F32 = 1e-5
TOL_CONVERTED = 5e-2


def compare_nodes(module: Any, model: Any, tokens: list[int]) -> tuple[dict[str, float], dict, dict]:
    """({node: NMSE}, pyggml's nodes, float64's nodes) of ``tokens`` from position 0, all at
    once, through ``model`` (a ``module.Model``) and ``module.reference_forward``."""
    nodes: dict[str, np.ndarray] = {}
    model.forward(tokens, all_logits=True, nodes=nodes)
    ref = module.reference_forward(model, tokens)
    if set(nodes) != set(ref):
        raise AssertionError(f"the graph names {sorted(set(nodes) ^ set(ref))} and the reference does not, "
                             "or the other way round")
    errs = {k: nmse(nodes[k].astype(np.float64).reshape(r.shape), r) for k, r in ref.items()}
    return errs, nodes, ref


def weight_types(f: Any) -> list[str]:
    """The ggml types of the file's tensors, sorted."""
    from pyggml import Type
    return sorted({Type(int(t.type)).name for t in f.tensors.values()})


def tolerance_for(types: list[str]) -> float:
    """TOL_F32 where every weight is F32, else TOL_CONVERTED (see the module's docstring)."""
    return TOL_F32 if set(types) <= {"F32"} else TOL_CONVERTED


def model_rows(path: str, prompt: str = DEFAULT_PROMPT, n_threads: int = 1) -> tuple[list[Row], dict[str, Any]]:
    """The rows of one model on one prompt, worst NMSE first, and what they were measured
    on (architecture, types, tokens, next-token agreement)."""
    import pyggml.gguf
    from pyggml import models

    with pyggml.gguf.load(path) as f:
        arch = str(f.metadata.get("general.architecture", ""))
        module = models.module_for(arch)
        tok = module.Tokenizer(f.metadata)
        ids = tok.encode(prompt)
        model = module.Model(f, n_ctx=max(32, len(ids)), n_threads=n_threads)
        errs, nodes, ref = compare_nodes(module, model, ids)
        types = weight_types(f)
    tol = tolerance_for(types)
    order = list(ref)                    # the graph's order: embd, l0.q, ..., logits
    subject = f"model:{arch}"
    rows = []
    for name in sorted(order, key=lambda k: (-errs[k] if math.isfinite(errs[k]) else -math.inf, order.index(k))):
        out, r = nodes[name].astype(np.float64).reshape(ref[name].shape), ref[name]
        err = errs[name]
        ok = math.isfinite(err) and err <= tol
        rows.append(Row(subject=subject, op=name.split(".")[-1], case=name, type="+".join(types),
                        index=order.index(name), seed=0, a="ggml", b="reference", nmse=err,
                        max_abs=float(np.max(np.abs(out - r))) if r.size else 0.0, tol=tol,
                        verdict="ok" if ok else "fail",
                        detail="" if ok else f"NMSE {err:.3e} > {tol:.0e} against float64"))
    agree = np.asarray(nodes["logits"]).reshape(ref["logits"].shape).argmax(-1) == ref["logits"].argmax(-1)
    meta = {"model": str(path), "architecture": arch, "prompt": prompt, "tokens": [int(i) for i in ids],
            "types": types, "tolerance": tol, "threads": n_threads,
            "next_token_agrees": int(agree.sum()), "positions": int(agree.size)}
    return rows, meta


def format_nodes(rows: list[Row], limit: int) -> str:
    """The worst ``limit`` nodes (all with limit <= 0), a line each."""
    shown = rows if limit <= 0 else rows[:limit]
    w = max([12] + [len(r.case) for r in shown])
    out = [f"{'node':{w}s} {'NMSE':>9s} {'max abs':>9s} {'tolerance':>9s}  verdict"]
    for r in shown:
        nm = "-" if r.nmse is None else f"{r.nmse:.2e}"
        mx = "-" if r.max_abs is None else f"{r.max_abs:.2e}"
        out.append(f"{r.case:{w}s} {nm:>9s} {mx:>9s} {r.tol:>9.0e}  {r.verdict}")
    if len(shown) < len(rows):
        out.append(f"({len(rows) - len(shown)} more nodes, all below the last NMSE shown)")
    return "\n".join(out)
