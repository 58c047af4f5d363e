"""Joining the pieces of a sharded sweep (``pyggml parity --shard I/N --json piece.json``,
one per CI job) into the report of the whole: ``pyggml parity merge piece*.json``.

The pieces must be the N shards of one sweep: the same selection (ops, types, paths, seed,
quick), the same pyggml and ggml, every shard 1..N exactly once and, between them, every
case of the selection. Rows come out in one order, (subject, type, case index, pair),
whatever order the jobs finished in. Pieces that ran on CPUs with different instruction
sets are merged, and the report says so: the kernels' paths, and so the last bits of
their results, can differ between such machines.
"""

from __future__ import annotations

import json
import math
from typing import Any

from pyggml.parity.model import Row
from pyggml.parity.runner import parse_shard

__all__ = ["MergeError", "load_piece", "merge"]

# what must agree between the pieces (from their meta, and from their build identity)
SELECTION = ("quick", "seed", "ops", "types", "paths", "threads")
BUILD = ("pyggml", "ggml_version", "ggml_commit", "ggml_source", "native", "openmp", "untrusted_kernels")


class MergeError(ValueError):
    """The pieces are not the shards of one sweep (the message says how)."""


def _row(d: dict[str, Any]) -> Row:
    d = dict(d)
    for k in ("nmse", "max_abs"):
        if isinstance(d.get(k), str):          # write_json writes inf and nan as strings
            d[k] = float(d[k])
    return Row(**d)


def load_piece(path: str) -> tuple[list[Row], dict[str, Any]]:
    """The rows and meta of a report written by ``pyggml parity --shard I/N --json``."""
    try:
        with open(path) as f:
            doc = json.load(f)
        rows = [_row(d) for d in doc["rows"]]
        meta = doc["meta"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise MergeError(f"{path}: not a report of pyggml parity --json ({type(e).__name__}: {e})") from None
    if doc.get("partial") or meta.get("partial"):
        raise MergeError(f"{path}: a sweep that did not finish ({meta.get('stopped', 'partial')})")
    if "shard" not in meta:
        raise MergeError(f"{path}: not a shard (written without --shard I/N)")
    return rows, meta


def merge(paths: list[str]) -> tuple[list[Row], dict[str, Any]]:
    """The rows of the whole sweep and its meta, from the pieces at ``paths``."""
    pieces = [(p, *load_piece(p)) for p in paths]
    if not pieces:
        raise MergeError("no pieces")
    first_path, _, first = pieces[0]
    seen: dict[int, str] = {}
    n = parse_shard(first["shard"])[1]
    for path, _, meta in pieces:
        i, n_i = parse_shard(meta["shard"])
        if n_i != n:
            raise MergeError(f"{path} is shard {meta['shard']}, {first_path} one of {n}")
        if i in seen:
            raise MergeError(f"shard {i}/{n} twice: {seen[i]} and {path}")
        seen[i] = path
        for key in SELECTION:
            if meta.get(key) != first.get(key):
                raise MergeError(f"{path} and {first_path} are not one sweep: {key} {meta.get(key)!r} against "
                                 f"{first.get(key)!r}")
        for key in BUILD:
            a, b = meta["identity"].get(key), first["identity"].get(key)
            if a != b:
                raise MergeError(f"{path} and {first_path} ran on different builds: {key} {a!r} against {b!r}")
        if meta.get("total_cases") != first.get("total_cases"):
            raise MergeError(f"{path} and {first_path} selected different cases: {meta.get('total_cases')} "
                             f"against {first.get('total_cases')}")
    missing = [i for i in range(1, n + 1) if i not in seen]
    if missing:
        raise MergeError(f"shards {', '.join(f'{i}/{n}' for i in missing)} missing")
    rows = [r for _, piece_rows, _ in pieces for r in piece_rows]
    cases = {(r.subject, r.type, r.index) for r in rows}
    ran = sum(m["cases_selected"] for _, _, m in pieces)
    if ran != first["total_cases"]:
        raise MergeError(f"the shards hold {ran} cases, the sweep {first['total_cases']}")
    rows.sort(key=lambda r: (r.subject, r.type, r.index, r.a, r.b))
    features = {tuple(m["identity"].get("cpu_features", ())) for _, _, m in pieces}
    meta = {key: first.get(key) for key in SELECTION}
    meta.update(identity=first["identity"], shards=n, pieces=[p for p, _, _ in pieces], total_cases=first["total_cases"],
                cases_with_rows=len(cases), seconds=sum(m.get("seconds", 0.0) for _, _, m in pieces),
                cpu_features_differ=len(features) > 1)
    if len(features) > 1:
        meta["cpu_features"] = sorted(list(f) for f in features)
    worst = [r.nmse for r in rows if r.nmse is not None and math.isfinite(r.nmse)]
    meta["worst_nmse_any_pair"] = max(worst, default=0.0)
    return rows, meta
