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


# What --save keeps (format 2): the arrays of the paths parity diff compares, each
# case's float64 reference reduced to what diff reads of it (each path's NMSE against it,
# and a sketch of it that tells whether two files drew the same inputs), ggml-ref and
# autodiff stored as "the same as ggml" or as their bits XOR ggml's where they match
# ggml's layout (most bits then zero), every 4-byte array stored byte plane by byte plane
# (a float's sign-and-exponent bytes compress apart from its mantissa bytes). The full
# sweep's file: 278 MB in format 1 (every path, the references whole), a tenth or less
# now. load() reads both formats; diff() gives the same verdicts from either.
FORMAT = 2
SAVED_PATHS = ("ggml", "ggml-ref", "autodiff")
_SKETCH = 8
_PROJECTIONS: dict[int, np.ndarray] = {}


def _sketch(arrays: list[np.ndarray]) -> list[list[float]]:
    """Per array: non-finite count, sum and sum of squares of the finite values, and
    _SKETCH fixed random projections of them; equal inputs give equal sketches (to
    rounding), other inputs sketches that differ in the first digits."""
    out = []
    for a in arrays:
        x = np.asarray(a, np.float64).reshape(-1)
        fin = np.isfinite(x)
        x = np.where(fin, x, 0.0)
        n = x.size
        if n not in _PROJECTIONS:
            if len(_PROJECTIONS) > 256:
                _PROJECTIONS.clear()
            _PROJECTIONS[n] = np.random.default_rng(n).standard_normal((_SKETCH, n))
        out.append([float(n - fin.sum()), float(x.sum()), float(x @ x), *map(float, _PROJECTIONS[n] @ x)])
    return out


def _planes(a: np.ndarray) -> tuple[np.ndarray, list[Any]]:
    """A 4-byte array as its byte planes (4 rows), with how to undo it; other arrays as
    they are."""
    a = np.ascontiguousarray(a)
    if a.dtype.itemsize == 4 and a.size:
        return a.view(np.uint8).reshape(-1, 4).T.copy(), [a.dtype.str, list(a.shape)]
    return a, []


def _unplanes(b: np.ndarray, how: list[Any]) -> np.ndarray:
    if not how:
        return b
    dtype, shape = how
    return np.ascontiguousarray(b.T).view(np.dtype(dtype)).reshape(shape)


def save(path: str, kept: dict[str, dict[str, list[np.ndarray]]], meta: dict[str, Any] | None = None) -> int:
    """Write a sweep's outputs for parity diff (format 2, above) in numpy's .npz format
    (key: case key, path, index), with the build identity and ``meta``, atomically, to
    ``path`` as given (numpy's ``savez`` would add ``.npz`` to a name without it; a file
    object keeps it). Returns the number of arrays written."""
    arrays: dict[str, np.ndarray] = {}
    planes: dict[str, list[Any]] = {}
    same: dict[str, str] = {}          # "key||path": the path whose arrays these are
    xor: dict[str, str] = {}           # "key||path": the path these are XORed with
    nmse_ref: dict[str, dict[str, float | str]] = {}
    sketches: dict[str, list[list[float]]] = {}
    for key, paths in kept.items():
        ref = paths.get("reference")
        if ref is not None:
            sketches[key] = _sketch(ref)
        base = paths.get("ggml")
        for p in SAVED_PATHS:
            arrs = paths.get(p)
            if arrs is None:
                continue
            if ref is not None:
                e = compare_outputs(arrs, ref)[0]
                nmse_ref.setdefault(key, {})[p] = e if math.isfinite(e) else str(e)
            name = _SEP.join((key, p))
            if p != "ggml" and base is not None and len(arrs) == len(base) and all(
                    np.shape(a) == np.shape(b) and np.asarray(a).dtype == np.asarray(b).dtype for a, b in zip(arrs, base)):
                if all(np.asarray(a).tobytes() == np.asarray(b).tobytes() for a, b in zip(arrs, base)):
                    same[name] = "ggml"
                    continue
                if all(np.asarray(a).dtype.itemsize == 4 for a in arrs):
                    xor[name] = "ggml"
                    arrs = [np.bitwise_xor(np.ascontiguousarray(a).view(np.uint32),
                                           np.ascontiguousarray(b).view(np.uint32)).view(np.asarray(a).dtype)
                            for a, b in zip(arrs, base)]
            for i, a in enumerate(arrs):
                k = _SEP.join((key, p, str(i)))
                arrays[k], how = _planes(np.asarray(a))
                if how:
                    planes[k] = how
    doc = {"identity": build_identity(), "meta": meta or {}, "format": FORMAT, "planes": planes, "same": same,
           "xor": xor, "nmse_ref": nmse_ref, "sketches": sketches}
    arrays["__meta__"] = np.frombuffer(json.dumps(doc).encode(), np.uint8)
    with atomic_write(path, "wb") as f:
        np.savez_compressed(f, **arrays)  # type: ignore[arg-type]
    return len(arrays)


def load(path: str) -> tuple[dict[str, Any], dict[str, dict[str, list[np.ndarray]]]]:
    """(the saved document, {case key: {path: arrays}}) of a file of either format."""
    with np.load(path) as z:
        doc = json.loads(bytes(z["__meta__"]).decode())
        planes = doc.get("planes", {})
        out: dict[str, dict[str, dict[int, np.ndarray]]] = {}
        for k in z.files:
            if k == "__meta__":
                continue
            key, p, i = k.split(_SEP)
            out.setdefault(key, {}).setdefault(p, {})[int(i)] = _unplanes(z[k], planes.get(k, []))
    cases = {key: {p: [d[i] for i in sorted(d)] for p, d in paths.items()} for key, paths in out.items()}
    for name, base in doc.get("same", {}).items():
        key, p = name.split(_SEP)
        cases.setdefault(key, {})[p] = cases[key][base]
    for name, base in doc.get("xor", {}).items():
        key, p = name.split(_SEP)
        cases[key][p] = [np.bitwise_xor(a.view(np.uint32), b.view(np.uint32)).view(a.dtype)
                         for a, b in zip(cases[key][p], cases[key][base])]
    return doc, cases


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


def _sketch_of(doc: dict[str, Any], key: str, case: dict[str, list[np.ndarray]]) -> list[list[float]] | None:
    """The sketch of a saved case's reference: from the file (format 2) or made from the
    reference itself (format 1), None without a reference."""
    if "reference" in case:
        return _sketch(case["reference"])
    return doc.get("sketches", {}).get(key)


def _same_inputs(sa: list[list[float]] | None, sb: list[list[float]] | None) -> bool:
    """Whether two saved cases computed the same inputs, as far as their float64 references'
    sketches show it (a sample list drawn in another order gives another input under one
    name): the same lengths, the same non-finite counts, and the rest within NMSE 1e-12."""
    if sa is None or sb is None:
        return True
    if len(sa) != len(sb) or any(len(x) != len(y) or x[0] != y[0] for x, y in zip(sa, sb)):
        return False
    return compare_outputs([np.asarray(x[1:]) for x in sa], [np.asarray(y[1:]) for y in sb])[0] <= 1e-12


def _ref_nmse(doc: dict[str, Any], key: str, case: dict[str, list[np.ndarray]], path: str) -> float | None:
    """A saved path's NMSE against the reference saved with it (computed from the
    reference in format 1, read in format 2), None without one."""
    if "reference" in case:
        return compare_outputs(case[path], case["reference"])[0]
    e = doc.get("nmse_ref", {}).get(key, {}).get(path)
    return None if e is None else float(e)


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
        ka, kb = names_a[name], names_b[name]
        ca, cb = a[ka], b[kb]
        if not _same_inputs(_sketch_of(meta_a, ka, ca), _sketch_of(meta_b, kb, cb)):
            skipped.append(name)
            continue
        for p in paths:
            if p not in ca or p not in cb:
                continue
            err, max_abs = compare_outputs(ca[p], cb[p])
            bitwise = all(np.array_equal(x, y) for x, y in zip(ca[p], cb[p]))
            ra, rb = _ref_nmse(meta_a, ka, ca, p), _ref_nmse(meta_b, kb, cb, p)
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
