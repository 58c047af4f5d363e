"""Differential results across builds: a sweep's outputs saved with the identity of
the build that made them (``pyggml parity --save F.npz``), and two such files compared
case by case and against the float64 reference (``pyggml parity diff A B``)."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import numpy as np

from pyggml.parity.files import atomic_write
from pyggml.parity.model import compare_outputs

__all__ = ["Difference", "build_identity", "diff", "format_diff", "load", "npz_path", "per_op", "save", "to_json"]

_SEP = "||"


def build_identity() -> dict[str, Any]:
    """What made these numbers: ggml version and commit, where its source came from, the
    instruction sets its CPU kernels were compiled for, the backend."""
    import pyggml
    from pyggml import _cpu

    info = pyggml.build_info()
    feats = _cpu.cpu_features()
    return {"pyggml": pyggml.__version__, "ggml_version": info["ggml_version"], "ggml_commit": info["ggml_commit"],
            "ggml_source": info["ggml_source"], "native": info["native"], "openmp": info["openmp"],
            "cpu_features": sorted(k for k, v in feats.items() if v), "backend": "CPU",
            # the ops whose CPU kernel pyggml's rules were not written against (proven in a child)
            "untrusted_kernels": (info["kernels"]["untrusted"] if info["kernels"]["known"]
                                  else "unknown: a prebuilt ggml, no kernel trusted (every graph proven)")}


def npz_path(path: str) -> str:
    """The file :func:`save` writes for ``path``: with ``.npz`` appended where it has not
    that suffix (as numpy's ``savez`` names it)."""
    return path if path.endswith(".npz") else path + ".npz"


def save(path: str, kept: dict[str, dict[str, list[np.ndarray]]], meta: dict[str, Any] | None = None) -> int:
    """Write every path's arrays of every case to an .npz (key: case key, path, index),
    with the build identity and ``meta``, atomically (to :func:`npz_path`). Returns the
    number of arrays."""
    arrays = {}
    for key, paths in kept.items():
        for p, arrs in paths.items():
            for i, a in enumerate(arrs):
                arrays[_SEP.join((key, p, str(i)))] = np.asarray(a)
    doc = {"identity": build_identity(), "meta": meta or {}}
    arrays["__meta__"] = np.frombuffer(json.dumps(doc).encode(), np.uint8)
    with atomic_write(npz_path(path), "wb") as f:
        np.savez_compressed(f, **arrays)  # type: ignore[arg-type]
    return len(arrays)


def load(path: str) -> tuple[dict[str, Any], dict[str, dict[str, list[np.ndarray]]]]:
    with np.load(path) as z:
        doc = json.loads(bytes(z["__meta__"]).decode())
        out: dict[str, dict[str, dict[int, np.ndarray]]] = {}
        for k in z.files:
            if k == "__meta__":
                continue
            key, p, i = k.split(_SEP)
            out.setdefault(key, {}).setdefault(p, {})[int(i)] = z[k]
    return doc, {key: {p: [d[i] for i in sorted(d)] for p, d in paths.items()} for key, paths in out.items()}


@dataclasses.dataclass
class Difference:
    case: str                 # subject|type|index
    path: str
    nmse: float               # A against B
    max_abs: float
    bitwise: bool
    nmse_a: float | None      # each against the reference saved with it
    nmse_b: float | None
    tol: float                # beyond this NMSE, A and B disagree

    @property
    def beyond(self) -> bool:
        return not (self.nmse <= self.tol)

    @property
    def op(self) -> str:
        return self.case.split("|")[0]

    @property
    def closer(self) -> str:
        if self.nmse_a is None or self.nmse_b is None or self.nmse_a == self.nmse_b:
            return "-"
        return "A" if self.nmse_a < self.nmse_b else "B"


def diff(a_path: str, b_path: str, paths: tuple[str, ...] = ("ggml", "ggml-ref", "autodiff"),
         tol: float = 1e-7) -> tuple[dict[str, Any], dict[str, Any], list[Difference]]:
    """Compare two saved sweeps on the cases and paths both have. A and B disagree on a
    case beyond the tolerance saved with it (two ggml paths of its subject, from A's
    file), or ``tol`` where none was saved."""
    meta_a, a = load(a_path)
    meta_b, b = load(b_path)
    tols = meta_a.get("meta", {}).get("tolerances", {})
    out = []
    for key in sorted(set(a) & set(b)):
        for p in paths:
            if p not in a[key] or p not in b[key]:
                continue
            err, max_abs = compare_outputs(a[key][p], b[key][p])
            bitwise = all(np.array_equal(x, y) for x, y in zip(a[key][p], b[key][p]))
            ra = compare_outputs(a[key][p], a[key]["reference"])[0] if "reference" in a[key] else None
            rb = compare_outputs(b[key][p], b[key]["reference"])[0] if "reference" in b[key] else None
            out.append(Difference(key, p, err, max_abs, bitwise, ra, rb, float(tols.get(key, tol))))
    return meta_a, meta_b, out


def _ident(doc: dict[str, Any]) -> str:
    i = doc["identity"]
    return (f"ggml {i['ggml_version']} ({i['ggml_source']}), {'+'.join(i['cpu_features']) or 'no SIMD'}"
            f"{', native' if i.get('native') else ''}")


def per_op(diffs: list[Difference]) -> dict[str, dict[str, int]]:
    """Per op (subject): outputs compared, bitwise equal, differing, beyond tolerance, and
    of those that differ, how many are closer to the reference in A and in B."""
    out: dict[str, dict[str, int]] = {}
    for d in diffs:
        o = out.setdefault(d.op, {"outputs": 0, "bitwise": 0, "differ": 0, "beyond": 0, "closer_a": 0, "closer_b": 0})
        o["outputs"] += 1
        o["bitwise"] += d.bitwise
        o["differ"] += not d.bitwise
        o["beyond"] += d.beyond
        o["closer_a"] += (not d.bitwise) and d.closer == "A"
        o["closer_b"] += (not d.bitwise) and d.closer == "B"
    return out


def to_json(meta_a: dict[str, Any], meta_b: dict[str, Any], diffs: list[Difference]) -> dict[str, Any]:
    def num(x: float | None) -> float | str | None:
        return x if x is None or math.isfinite(x) else str(x)
    return {"a": meta_a["identity"], "b": meta_b["identity"], "per_op": per_op(diffs),
            "diffs": [{**{k: num(v) if isinstance(v, float) else v for k, v in dataclasses.asdict(d).items()},
                       "closer": d.closer, "beyond": d.beyond} for d in diffs if not d.bitwise]}


def format_diff(meta_a: dict[str, Any], meta_b: dict[str, Any], diffs: list[Difference],
                limit: int = 40) -> tuple[str, int]:
    """A table of the cases where A and B differ (beyond tolerance first), and a count of
    those beyond tolerance."""
    beyond = [d for d in diffs if d.beyond]
    differ = [d for d in diffs if not d.bitwise]
    lines = [f"A: {_ident(meta_a)}", f"B: {_ident(meta_b)}",
             f"{len(diffs)} outputs in both: {len(diffs) - len(differ)} bitwise equal, {len(differ)} differ, "
             f"{len(beyond)} beyond tolerance"]
    closer = {"A": sum(d.closer == "A" for d in differ), "B": sum(d.closer == "B" for d in differ)}
    lines.append(f"of those that differ, closer to the float64 reference: A {closer['A']}, B {closer['B']}")
    if differ:
        lines.append(f"{'case':56s} {'path':9s} {'NMSE A~B':>10s} {'max abs':>10s} {'A~ref':>10s} {'B~ref':>10s} closer")
        ranked = sorted(differ, key=lambda d: (not d.beyond, -(d.nmse if math.isfinite(d.nmse) else 1e300)))
        for d in ranked[:limit]:
            f = lambda x: "-" if x is None else f"{x:.2e}"  # noqa: E731
            lines.append(f"{d.case[:56]:56s} {d.path:9s} {f(d.nmse):>10s} {f(d.max_abs):>10s} {f(d.nmse_a):>10s} "
                         f"{f(d.nmse_b):>10s} {d.closer}")
    return "\n".join(lines), len(beyond)
