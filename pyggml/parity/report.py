"""Reports of a sweep: a summary grouped by op and verdict (every row with
``verbose``), the failures with their reproducers, JSON and JUnit files."""

from __future__ import annotations

import collections
import json
import math
import xml.etree.ElementTree as ET
from typing import Any

from pyggml.parity.files import atomic_write
from pyggml.parity.model import BAD, Row
from pyggml.parity.runner import summarize

__all__ = ["format_rows", "format_summary", "write_json", "write_junit"]

_COLS = ("ok", "fail", "refused", "oob", "crashed", "timeout", "error", "skipped")


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.2e}"


def format_rows(rows: list[Row]) -> str:
    """One line per row; the case column as wide as the longest case name (never cut)."""
    w = max([44] + [len(r.case) for r in rows])
    out = [f"{'subject':28s} {'case':{w}s} {'pair':22s} {'NMSE':>9s} {'max abs':>9s}  verdict"]
    for r in rows:
        out.append(f"{r.subject:28s} {r.case:{w}s} {r.a + '~' + r.b:22s} {_num(r.nmse):>9s} "
                   f"{_num(r.max_abs):>9s}  {r.verdict}{': ' + r.detail[:100] if r.detail and r.verdict != 'ok' else ''}")
    return "\n".join(out)


def format_summary(rows: list[Row], failures: int = 20, every: bool = False) -> str:
    """One line per subject with anything but ``ok`` (every subject with ``every``):
    its comparisons by verdict and its worst NMSE against the reference; a count of the
    subjects whose every comparison is ok; then the first ``failures`` bad rows with
    their reproducers."""
    by: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    worst: dict[str, float] = {}
    for r in rows:
        by[r.subject][r.verdict] += 1
        if r.nmse is not None and math.isfinite(r.nmse) and r.b == "reference":
            worst[r.subject] = max(worst.get(r.subject, 0.0), r.nmse)
    cols = [c for c in _COLS if any(by[s][c] for s in by)]
    out = [f"{'subject':30s} " + " ".join(f"{c:>8s}" for c in cols) + f" {'worst NMSE':>11s}"]
    clean = [s for s in by if set(by[s]) == {"ok"}]
    for s in sorted(by, key=lambda s: (not any(by[s][v] for v in BAD), s)):
        if s in clean and not every:
            continue
        out.append(f"{s:30s} " + " ".join(f"{by[s][c] or '':>8}" for c in cols) +
                   f" {_num(worst.get(s)):>11s}")
    if clean and not every:
        out.append(f"{'(' + str(len(clean)) + ' more subjects: all ok)':30s} " +
                   " ".join(f"{sum(by[s][c] for s in clean) or '':>8}" for c in cols) +
                   f" {_num(max((worst.get(s, 0.0) for s in clean), default=None)):>11s}")
    bad = [r for r in rows if r.verdict in BAD]
    if bad:
        out.append("")
        out.append(f"{len(bad)} comparisons went wrong; the first {min(failures, len(bad))}, with a reproducer each:")
        seen = set()
        for r in bad[:failures]:
            out.append(f"- {r.subject} [{r.case}] {r.a}~{r.b}: {r.verdict}: {r.detail[:300]}")
            if r.repro and r.repro not in seen:
                seen.add(r.repro)
                out.extend("    " + line for line in r.repro.rstrip().splitlines())
    return "\n".join(out)


def write_json(rows: list[Row], path: str, meta: dict[str, Any] | None = None) -> None:
    """Every row, the summary and ``meta``, atomically. A sweep that did not finish
    (``meta["partial"]``) also says so at the top: ``"partial": true``."""
    doc: dict[str, Any] = {"rows": [r.as_dict() for r in rows], "summary": summarize(rows), "meta": meta or {}}
    if doc["meta"].get("partial"):
        doc["partial"] = True
    s = doc["summary"]
    if not math.isfinite(s["worst_nmse"]):
        s["worst_nmse"] = str(s["worst_nmse"])
    with atomic_write(path) as f:
        json.dump(doc, f, indent=1)


def write_junit(rows: list[Row], path: str, elapsed: float = 0.0, partial: bool = False) -> None:
    """A JUnit XML report, atomically; ``partial``: a property says the sweep did not finish."""
    s = summarize(rows)
    bad = sum(s[v] for v in BAD)
    suite = ET.Element("testsuite", name="pyggml.parity", tests=str(len(rows)), failures=str(bad),
                       skipped=str(s["refused"] + s["skipped"]), time=f"{elapsed:.3f}")
    if partial:
        ET.SubElement(ET.SubElement(suite, "properties"), "property", name="partial", value="true")
    for r in rows:
        tc = ET.SubElement(suite, "testcase", classname=f"parity.{r.subject}", name=f"{r.case} {r.a}~{r.b}")
        if r.verdict in ("refused", "skipped"):
            ET.SubElement(tc, "skipped", message=r.detail[:500])
        elif r.verdict in BAD:
            f = ET.SubElement(tc, "failure", message=f"{r.verdict}: {r.detail[:500]}")
            f.text = r.repro
    with atomic_write(path, "wb") as out:
        ET.ElementTree(suite).write(out, encoding="utf-8", xml_declaration=True)
