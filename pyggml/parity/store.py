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

__all__ = ["Difference", "build_identity", "diff", "format_diff", "load", "per_op", "save", "to_json"]

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


def save(path: str, kept: dict[str, dict[str, list[np.ndarray]]], meta: dict[str, Any] | None = None) -> int:
    """Write every path's arrays of every case in numpy's .npz format (key: case key, path,
    index), with the build identity and ``meta``, atomically, to ``path`` as given (numpy's
    ``savez`` would add ``.npz`` to a name without it; a file object keeps it). Returns the
    number of arrays."""
    arrays = {}
    for key, paths in kept.items():
        for p, arrs in paths.items():
            for i, a in enumerate(arrs):
                arrays[_SEP.join((key, p, str(i)))] = np.asarray(a)
    doc = {"identity": build_identity(), "meta": meta or {}}
    arrays["__meta__"] = np.frombuffer(json.dumps(doc).encode(), np.uint8)
    with atomic_write(path, "wb") as f:
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
    case: str                 # subject|type|sample label (subject|type|index in a file without labels)
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


def _by_name(labels: dict[str, str] | None, cases: dict[str, dict[str, list[np.ndarray]]]) -> dict[str, str]:
    """{name: case key}: a case is named by its subject, type and sample label (saved with
    the sweep), not by its index, since two builds may draw different sample lists for one
    subject (a sample a release lacks is skipped); a label drawn twice gets "#n". Without
    labels, cases are named by their keys."""
    if not labels:
        return {k: k for k in cases}
    out: dict[str, str] = {}

    def order(k: str) -> tuple[str, str, int]:
        subject, type_, index = k.rsplit("|", 2)
        return subject, type_, int(index)
    for key in sorted(cases, key=order):
        subject, type_, _ = key.rsplit("|", 2)
        name = f"{subject}|{type_}|{labels.get(key, key)}"
        n, base = 1, name
        while name in out:
            n += 1
            name = f"{base}#{n}"
        out[name] = key
    return out


def _same_inputs(ca: dict[str, list[np.ndarray]], cb: dict[str, list[np.ndarray]]) -> bool:
    """Whether two saved cases computed the same inputs, as far as their float64 references
    show it (a sample list drawn in another order gives another input under one name)."""
    if "reference" not in ca or "reference" not in cb:
        return True
    ra, rb = ca["reference"], cb["reference"]
    if len(ra) != len(rb) or any(np.shape(x) != np.shape(y) for x, y in zip(ra, rb)):
        return False
    return compare_outputs(ra, rb)[0] <= 1e-12


def diff(a_path: str, b_path: str, paths: tuple[str, ...] = ("ggml", "ggml-ref", "autodiff"),
         tol: float = 1e-7) -> tuple[dict[str, Any], dict[str, Any], list[Difference]]:
    """Compare two saved sweeps on the cases and paths both have, case by name (subject,
    type, sample label) where the files name them. A case whose float64 references differ
    was drawn from other inputs in the two builds: it is not compared, and counted in
    ``meta_a["not_comparable"]``. A and B disagree on a case beyond the tolerance saved
    with it (two ggml paths of its subject, from A's file), or ``tol`` where none was saved."""
    meta_a, a = load(a_path)
    meta_b, b = load(b_path)
    tols = meta_a.get("meta", {}).get("tolerances", {})
    # by label where both files have them (a file saved before they were: by index)
    la, lb = (m.get("meta", {}).get("labels") for m in (meta_a, meta_b))
    names_a, names_b = _by_name(la if lb else None, a), _by_name(lb if la else None, b)
    out, skipped = [], []
    for name in sorted(set(names_a) & set(names_b)):
        ca, cb = a[names_a[name]], b[names_b[name]]
        if not _same_inputs(ca, cb):
            skipped.append(name)
            continue
        for p in paths:
            if p not in ca or p not in cb:
                continue
            err, max_abs = compare_outputs(ca[p], cb[p])
            bitwise = all(np.array_equal(x, y) for x, y in zip(ca[p], cb[p]))
            ra = compare_outputs(ca[p], ca["reference"])[0] if "reference" in ca else None
            rb = compare_outputs(cb[p], cb["reference"])[0] if "reference" in cb else None
            out.append(Difference(name, p, err, max_abs, bitwise, ra, rb, float(tols.get(names_a[name], tol))))
    meta_a["not_comparable"] = skipped
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
            "not_comparable": meta_a.get("not_comparable", []),
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
    skipped = meta_a.get("not_comparable", [])
    if skipped:
        lines.append(f"not compared: {len(skipped)} cases named alike whose float64 references differ (the two builds "
                     f"drew other inputs for them), e.g. {skipped[0]}")
    if differ:
        w = max([56] + [len(d.case) for d in differ])       # case names whole: they name the case
        lines.append(f"{'case':{w}s} {'path':9s} {'NMSE A~B':>10s} {'max abs':>10s} {'A~ref':>10s} {'B~ref':>10s} closer")
        ranked = sorted(differ, key=lambda d: (not d.beyond, -(d.nmse if math.isfinite(d.nmse) else 1e300)))
        for d in ranked[:limit]:
            f = lambda x: "-" if x is None else f"{x:.2e}"  # noqa: E731
            lines.append(f"{d.case:{w}s} {d.path:9s} {f(d.nmse):>10s} {f(d.max_abs):>10s} {f(d.nmse_a):>10s} "
                         f"{f(d.nmse_b):>10s} {d.closer}")
    return "\n".join(lines), len(beyond)
