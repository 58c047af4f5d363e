"""Differential results across builds: a sweep's outputs saved with the identity of
the build that made them (``pyggml parity --save F.npz``), and two such files compared
case by case and against the float64 reference (``pyggml parity diff A B``)."""

from __future__ import annotations

import dataclasses
import hashlib
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


# What --save keeps (format 3): the arrays of the paths parity diff compares, each
# case's float64 reference reduced to what diff reads of it (each path's NMSE against it,
# per array, and a sketch of it that tells whether two files drew the same inputs),
# ggml-ref and autodiff stored as "the same as ggml" or as their bits XOR ggml's where they
# match ggml's layout (most bits then zero), every 4-byte array stored byte plane by byte
# plane (a float's sign-and-exponent bytes compress apart from its mantissa bytes).
#
# A float output of more than WHOLE_MAX elements whose every array is finite and within
# SUMMARY_SHARE of its case's tolerance from the float64 reference is kept as a digest of
# its values per array instead of the values (format 3): lossless float32 does not
# compress below about 3.4 bytes a value, and such outputs (the attention subject's,
# mostly) were nine tenths of the file. diff still gives each its verdicts: bitwise from
# the digests, "closer" from the saved NMSEs against the reference, and within or beyond
# tolerance from the triangle inequality through the references (_bounds): two outputs
# each within 1e-4 of the tolerance from theirs are within the tolerance of each other.
# Only against an output kept whole whose own error lies within about 2% of the tolerance
# can a verdict stay undecided; diff says so, and --save-whole keeps every array. The full
# sweep's file: 278 MB in format 1 (every path, the references whole), 53 MB in format 2,
# 7.9 MB in format 3 (the attention guide has the figures and the command). load() reads
# every format; diff() gives the same verdicts from any.
FORMAT = 3
SAVED_PATHS = ("ggml", "ggml-ref", "autodiff")
WHOLE_MAX = 4096
SUMMARY_SHARE = 1e-4
_SKETCH = 8
_PROJECTIONS: dict[int, np.ndarray] = {}
# |R_A - R_B| <= _GAP_FACTOR max_k |P_k R_A - P_k R_B| for the sketches' _SKETCH random
# projections P_k, but with probability (0.8 / _GAP_FACTOR)^_SKETCH, about 2e-17 (each
# projection of the difference is a normal draw of its norm's scale): the distance of two
# files' references in the bounds, plus _GAP_FLOOR for the projections' own rounding
_GAP_FACTOR = 100.0
_GAP_FLOOR = 1e-9


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


def _digest(a: np.ndarray) -> str:
    """A digest of an array's values (dtype, shape and bytes, -0.0 counted as 0.0): two
    finite arrays have the same digest exactly when ``np.array_equal`` holds, as diff's
    bitwise flag asks of whole arrays."""
    a = np.ascontiguousarray(a)
    if a.dtype.kind == "f":
        a = a + a.dtype.type(0)          # -0.0 + 0.0 is +0.0
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{a.dtype.str}{a.shape}".encode())
    h.update(a.tobytes())
    return h.hexdigest()


def _summarizable(arrs: list[Any], errs: list[float] | None, tol: Any, whole_max: int | None) -> bool:
    """Whether an output may be kept as digests (format 3, above): large, float, finite,
    and within SUMMARY_SHARE of a positive tolerance from its reference, array by array."""
    if whole_max is None or errs is None or not isinstance(tol, (int, float)) or not 0 < tol < math.inf:
        return False
    if sum(np.size(a) for a in arrs) <= whole_max:
        return False
    return (all(np.asarray(a).dtype.kind == "f" and bool(np.isfinite(a).all()) for a in arrs)
            and all(e <= SUMMARY_SHARE * tol for e in errs))


def save(path: str, kept: dict[str, dict[str, list[np.ndarray]]], meta: dict[str, Any] | None = None,
         whole_max: int | None = WHOLE_MAX) -> tuple[int, int]:
    """Write a sweep's outputs for parity diff (format 3, above) in numpy's .npz format
    (key: case key, path, index), with the build identity and ``meta`` (its
    ``"tolerances"``, per case key, decide which outputs may be kept as digests),
    atomically, to ``path`` as given (numpy's ``savez`` would add ``.npz`` to a name
    without it; a file object keeps it). ``whole_max=None`` keeps every output whole.
    Returns (outputs saved, of those kept as digests)."""
    arrays: dict[str, np.ndarray] = {}
    planes: dict[str, list[Any]] = {}
    same: dict[str, str] = {}          # "key||path": the path whose arrays these are
    xor: dict[str, str] = {}           # "key||path": the path these are XORed with
    nmse_ref: dict[str, dict[str, float | str]] = {}
    nmse_arrays: dict[str, dict[str, list[float | str]]] = {}
    summaries: dict[str, dict[str, list[Any]]] = {}
    sketches: dict[str, list[list[float]]] = {}
    tols = (meta or {}).get("tolerances", {})
    outputs = 0
    for key, paths in kept.items():
        ref = paths.get("reference")
        if ref is not None:
            sketches[key] = _sketch(ref)
        base = None                    # ggml's arrays, where kept whole
        for p in SAVED_PATHS:
            arrs = paths.get(p)
            if arrs is None:
                continue
            outputs += 1
            errs = None
            if ref is not None:
                e = compare_outputs(arrs, ref)[0]
                nmse_ref.setdefault(key, {})[p] = e if math.isfinite(e) else str(e)
                if len(arrs) == len(ref):
                    errs = [compare_outputs([a], [r])[0] for a, r in zip(arrs, ref)]
                    nmse_arrays.setdefault(key, {})[p] = [x if math.isfinite(x) else str(x) for x in errs]
            name = _SEP.join((key, p))
            if _summarizable(arrs, errs, tols.get(key), whole_max):
                summaries[name] = {"digest": [_digest(np.asarray(a)) for a in arrs],
                                   "shape": [list(np.shape(a)) for a in arrs],
                                   "dtype": [np.asarray(a).dtype.str for a in arrs]}
                continue
            if p == "ggml":
                base = arrs
            elif base is not None and len(arrs) == len(base) and all(
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
           "xor": xor, "nmse_ref": nmse_ref, "nmse_arrays": nmse_arrays, "summaries": summaries,
           "sketches": sketches}
    arrays["__meta__"] = np.frombuffer(json.dumps(doc).encode(), np.uint8)
    with atomic_write(path, "wb") as f:
        np.savez_compressed(f, **arrays)  # type: ignore[arg-type]
    return outputs, len(summaries)


def load(path: str) -> tuple[dict[str, Any], dict[str, dict[str, list[np.ndarray]]]]:
    """(the saved document, {case key: {path: arrays}}) of a file of any format; the
    outputs kept as digests are in ``doc["summaries"]`` ("key||path"), not in the arrays."""
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
    for name in doc.get("summaries", {}):         # a case whose every output is kept as digests
        cases.setdefault(name.split(_SEP)[0], {})
    for name, base in doc.get("xor", {}).items():
        key, p = name.split(_SEP)
        cases[key][p] = [np.bitwise_xor(a.view(np.uint32), b.view(np.uint32)).view(a.dtype)
                         for a, b in zip(cases[key][p], cases[key][base])]
    return doc, cases


@dataclasses.dataclass
class Difference:
    case: str                 # subject|type|sample label (subject|type|index in a file without labels)
    path: str
    nmse: float               # A against B (where not exact: an upper bound)
    max_abs: float            # (where not exact: an upper bound)
    bitwise: bool
    nmse_a: float | None      # each against the reference saved with it
    nmse_b: float | None
    tol: float                # beyond this NMSE, A and B disagree
    exact: bool = True        # False: A or B was saved as digests (format 3); nmse between the bounds
    nmse_low: float = 0.0     # a lower bound of nmse where not exact

    @property
    def beyond(self) -> bool:
        if not self.exact:
            return not self.bitwise and self.nmse_low > self.tol
        return not (self.nmse <= self.tol)

    @property
    def undecided(self) -> bool:
        """Not exact, and the bounds straddle the tolerance (diff cannot tell without
        the arrays: save with --save-whole)."""
        return not self.exact and not self.bitwise and self.nmse_low <= self.tol < self.nmse

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
    """The sketch of a saved case's reference: from the file (formats 2, 3) or made from the
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
    reference in format 1, read in formats 2 and 3), None without one."""
    if "reference" in case:
        return compare_outputs(case[path], case["reference"])[0]
    e = doc.get("nmse_ref", {}).get(key, {}).get(path)
    return None if e is None else float(e)


def _array_nmse(doc: dict[str, Any], key: str, case: dict[str, list[np.ndarray]], path: str,
                worst: float | None) -> list[tuple[float, bool]] | None:
    """Per array of a saved path, (its NMSE against the reference, whether that is the
    value rather than an upper bound): saved in format 3, computed from the reference
    in format 1; a format 2 file saved only the worst, an upper bound of each."""
    if "reference" in case and path in case and len(case[path]) == len(case["reference"]):
        return [(compare_outputs([a], [r])[0], True) for a, r in zip(case[path], case["reference"])]
    errs = doc.get("nmse_arrays", {}).get(key, {}).get(path)
    if errs is not None:
        return [(float(e), True) for e in errs]
    if worst is None or path not in case:
        return None
    return [(worst, False)] * len(case[path])


def _bounds(ea: list[tuple[float, bool]] | None, eb: list[tuple[float, bool]] | None,
            rr: list[float], gaps: list[float]) -> tuple[float, float, float]:
    """Bounds of the worst NMSE of A against B over the arrays of an output, and an upper
    bound of its max abs difference, from each one's NMSE against its float64 reference
    (e = |X - R|^2 / |R|^2), the reference's squared norms ``rr`` and how far apart the
    two files' references are, relative to their norm (``gaps``, from their sketches): the
    triangle inequality |A - B| <= |A - R_A| + |R_A - R_B| + |B - R_B|, and
    |R|(1 - sqrt eb) <= |B| <= |R|(1 + sqrt eb). Without them: (0, inf, inf)."""
    if ea is None or eb is None or len(ea) != len(eb) or len(gaps) != len(ea) or len(rr) != len(ea):
        return 0.0, math.inf, math.inf
    lo = hi = mx = 0.0
    for i, ((a, a_exact), (b, b_exact)) in enumerate(zip(ea, eb)):
        if not (math.isfinite(a) and math.isfinite(b)):
            return 0.0, math.inf, math.inf
        qa, qb = math.sqrt(a), math.sqrt(b)
        up = qa + qb + gaps[i]
        hi = max(hi, (up / (1 - qb)) ** 2 * (1 + 1e-9) if qb < 1 else math.inf)
        if a_exact and b_exact:
            down = max(abs(qa - qb) - gaps[i], 0.0)
            lo = max(lo, (down / (1 + qb)) ** 2 * (1 - 1e-9))
        mx = max(mx, up * math.sqrt(rr[i]) * (1 + 1e-9))
    return lo, hi, mx


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
        sa, sb = (m.get("summaries", {}) for m in (meta_a, meta_b))
        for p in paths:
            na, nb = _SEP.join((ka, p)), _SEP.join((kb, p))
            if (p not in ca and na not in sa) or (p not in cb and nb not in sb):
                continue
            ra, rb = _ref_nmse(meta_a, ka, ca, p), _ref_nmse(meta_b, kb, cb, p)
            t = float(tols.get(ka, tol))
            if p in ca and p in cb:
                err, max_abs = compare_outputs(ca[p], cb[p])
                bitwise = all(np.array_equal(x, y) for x, y in zip(ca[p], cb[p]))
                out.append(Difference(name, p, err, max_abs, bitwise, ra, rb, t))
                continue
            # one of them (or both) kept as digests: bitwise from the digests, the NMSE
            # between bounds through the reference
            da, db = (s[n]["digest"] if n in s else [_digest(x) for x in c[p]]
                      for s, n, c in ((sa, na, ca), (sb, nb, cb)))
            if da == db:
                out.append(Difference(name, p, 0.0, 0.0, True, ra, rb, t))
                continue
            if any(not np.isfinite(np.asarray(x, np.float64)).all() for c in (ca, cb) for x in c.get(p, [])):
                # an output kept whole with a NaN or inf against one kept as digests, which
                # are finite: the NMSE between them is not finite, beyond any tolerance
                out.append(Difference(name, p, math.inf, math.inf, False, ra, rb, t, exact=False, nmse_low=math.inf))
                continue
            ea, eb = _array_nmse(meta_a, ka, ca, p, ra), _array_nmse(meta_b, kb, cb, p, rb)
            ska, skb = _sketch_of(meta_a, ka, ca) or [], _sketch_of(meta_b, kb, cb) or []
            rr = [x[2] for x in ska]
            gaps = [_GAP_FACTOR * max(abs(u - v) for u, v in zip(x[3:], y[3:])) / math.sqrt(x[2]) + _GAP_FLOOR
                    if x[2] > 0 else math.inf for x, y in zip(ska, skb)]
            lo, hi, max_abs = _bounds(ea, eb, rr, gaps) if len(da) == len(db) else (math.inf, math.inf, math.inf)
            out.append(Difference(name, p, hi, max_abs, False, ra, rb, t, exact=False, nmse_low=lo))
    meta_a["not_comparable"] = skipped
    return meta_a, meta_b, out


def _ident(doc: dict[str, Any]) -> str:
    i = doc["identity"]
    return (f"ggml {i['ggml_version']} ({i['ggml_source']}), {'+'.join(i['cpu_features']) or 'no SIMD'}"
            f"{', native' if i.get('native') else ''}")


def per_op(diffs: list[Difference]) -> dict[str, dict[str, int]]:
    """Per op (subject): outputs compared, bitwise equal, differing, beyond tolerance,
    undecided (bounds that straddle it), and of those that differ, how many are closer to
    the reference in A and in B."""
    out: dict[str, dict[str, int]] = {}
    for d in diffs:
        o = out.setdefault(d.op, {"outputs": 0, "bitwise": 0, "differ": 0, "beyond": 0, "undecided": 0,
                                  "closer_a": 0, "closer_b": 0})
        o["outputs"] += 1
        o["bitwise"] += d.bitwise
        o["differ"] += not d.bitwise
        o["beyond"] += d.beyond
        o["undecided"] += d.undecided
        o["closer_a"] += (not d.bitwise) and d.closer == "A"
        o["closer_b"] += (not d.bitwise) and d.closer == "B"
    return out


def to_json(meta_a: dict[str, Any], meta_b: dict[str, Any], diffs: list[Difference]) -> dict[str, Any]:
    def num(x: float | None) -> float | str | None:
        return x if x is None or math.isfinite(x) else str(x)
    return {"a": meta_a["identity"], "b": meta_b["identity"], "per_op": per_op(diffs),
            "not_comparable": meta_a.get("not_comparable", []),
            "diffs": [{**{k: num(v) if isinstance(v, float) else v for k, v in dataclasses.asdict(d).items()},
                       "closer": d.closer, "beyond": d.beyond, "undecided": d.undecided}
                      for d in diffs if not d.bitwise]}


def format_diff(meta_a: dict[str, Any], meta_b: dict[str, Any], diffs: list[Difference],
                limit: int = 40) -> tuple[str, int]:
    """A table of the cases where A and B differ (beyond tolerance first, then the
    undecided), and a count of those beyond tolerance or undecided."""
    beyond = [d for d in diffs if d.beyond]
    undecided = [d for d in diffs if d.undecided]
    differ = [d for d in diffs if not d.bitwise]
    bounded = [d for d in differ if not d.exact]
    lines = [f"A: {_ident(meta_a)}", f"B: {_ident(meta_b)}",
             f"{len(diffs)} outputs in both: {len(diffs) - len(differ)} bitwise equal, {len(differ)} differ, "
             f"{len(beyond)} beyond tolerance" + (f", {len(undecided)} undecided" if undecided else "")]
    closer = {"A": sum(d.closer == "A" for d in differ), "B": sum(d.closer == "B" for d in differ)}
    lines.append(f"of those that differ, closer to the float64 reference: A {closer['A']}, B {closer['B']}")
    if bounded:
        lines.append(f"{len(bounded)} of those that differ were saved as digests (large outputs close to the reference): "
                     f"their NMSE A~B and max abs are upper bounds (<=), from each one's error against the reference")
    if undecided:
        lines.append(f"undecided: {len(undecided)} outputs whose bounds straddle the tolerance; save both sweeps with "
                     f"pyggml parity --save-whole to decide them")
    skipped = meta_a.get("not_comparable", [])
    if skipped:
        lines.append(f"not compared: {len(skipped)} cases named alike whose float64 references differ (the two builds "
                     f"drew other inputs for them), e.g. {skipped[0]}")
    if differ:
        w = max([56] + [len(d.case) for d in differ])       # case names whole: they name the case
        lines.append(f"{'case':{w}s} {'path':9s} {'NMSE A~B':>10s} {'max abs':>10s} {'A~ref':>10s} {'B~ref':>10s} closer")
        ranked = sorted(differ, key=lambda d: (not d.beyond, not d.undecided,
                                               -(d.nmse if math.isfinite(d.nmse) else 1e300)))
        for d in ranked[:limit]:
            f = lambda x: "-" if x is None else f"{x:.2e}"  # noqa: E731
            g = f if d.exact else (lambda x: f"<={x:.2e}")  # noqa: E731
            lines.append(f"{d.case:{w}s} {d.path:9s} {g(d.nmse):>10s} {g(d.max_abs):>10s} {f(d.nmse_a):>10s} "
                         f"{f(d.nmse_b):>10s} {d.closer}")
    return "\n".join(lines), len(beyond) + len(undecided)
