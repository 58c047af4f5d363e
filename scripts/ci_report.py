"""The upstream matrix's report: what scripts/ci_upstream.py prints and writes of its spec rows.

Functions of the rows (one dict per spec, as ``ci_upstream.run_spec`` fills it) only: the
matrix table, the ops each ggml adds or lacks, where specs disagree, the timeline over the
releases, the HTML page, and beside them upstream's own test-backend-ops verdicts
(scripts/backend_ops.py). Nothing here builds or runs a spec.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

PARITY_BAD = ("fail", "oob", "crashed", "timeout", "error")     # pyggml.parity.model.BAD


def upstream_columns(rows: list[dict], ops: list[str]) -> dict[str, dict[str, str]]:
    """For the HTML grid: per spec that ran upstream's test-backend-ops, a column of its
    grad verdict beside pyggml's sweep, per pyggml op (through the node the op makes)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import backend_ops

    makes = backend_ops.makes_by_function()
    cols: dict[str, dict[str, str]] = {}
    for r in rows:
        grad = ((r.get("upstream_tests") or {}).get("upstream") or {}).get("grad", {}).get("ops", {})
        if grad:
            cols[f"{r['spec']}: test-backend-ops grad"] = {
                op: backend_ops.verdict(grad[makes[op]]) for op in ops if makes.get(op) in grad}
    return cols


def upstream_tests_report(rows: list[dict]) -> str:
    """Per spec that ran it: test-backend-ops' verdicts and where they and pyggml's disagree."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import backend_ops

    out = []
    for r in rows:
        u = r.get("upstream_tests")
        if not u:
            continue
        out.append(f"upstream's test-backend-ops beside pyggml, {r['spec']}:")
        if "upstream" not in u:
            out.append(f"  not run: {u.get('skipped') or u.get('error')}")
            continue
        out.append(textwrap.indent(backend_ops.report(u["upstream"], u.get("found", {})), "  "))
    return "\n".join(out) or "upstream's test-backend-ops: not asked for (--upstream-tests SPEC)"


def as_float(x: Any) -> float | None:
    return None if x is None else float(x)


_SEVERITY = ("ok", "skipped", "refused", "fail", "error", "timeout", "oob", "crashed")


# pytest's -ra summary line of the skips tests/conftest.py makes where the release refuses a
# sample itself (pyggml.opinfo.harness.release_abort's reasons)
_REFUSAL_SKIPS = re.compile(r"^SKIPPED \[(\d+)\] \S*conftest\.py:\d+: ggml \S+ "
                            r"(?:aborts on this sample|lacks what this sample needs)", re.M)


def release_refusals(pytest_output: str) -> int:
    """How many tests the run skipped because the linked release refused the sample itself."""
    return sum(int(n) for n in _REFUSAL_SKIPS.findall(pytest_output))


def _expectations() -> Any:
    """tests/expectations.py (it imports nothing): the findings known on each release."""
    spec = importlib.util.spec_from_file_location("pyggml_test_expectations", ROOT / "tests" / "expectations.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def known_sweep_findings(rows: list[dict], version: str | None) -> tuple[int, int]:
    """(bad rows of a sweep, how many of them are findings tests/expectations.py records on
    that release). A sweep row of op X, type T, sample i is the case the test
    ``test_op_matches_reference[X-T-i]`` computes (the same seeds): it is known when that
    test is. Rows of the other subjects (gradients, attention) are never known."""
    exp = _expectations()
    bad = [r for r in rows if r["verdict"] in PARITY_BAD]
    known = 0
    for r in bad:
        if r["subject"].startswith("op:") and version:
            test = f"tests/test_opinfo.py::test_op_matches_reference[{r['op']}-{r['type']}-{r['index']}]"
            known += exp.known_failure(test, version) is not None
    return len(bad), known


def parity_summary(rows: list[dict]) -> dict[str, Any]:
    """What the matrix keeps of a spec's sweep: the counts by verdict, each op's worst
    verdict, and the measured findings (overruns, crashes, timeouts) by op."""
    counts: dict[str, int] = {}
    ops: dict[str, str] = {}
    found: dict[str, list[str]] = {}
    for r in rows:
        v = r["verdict"]
        counts[v] = counts.get(v, 0) + 1
        if _SEVERITY.index(v) > _SEVERITY.index(ops.get(r["op"], "ok")):
            ops[r["op"]] = v
        else:
            ops.setdefault(r["op"], v)
        if v in ("oob", "crashed", "timeout"):
            found.setdefault(f"{v}:{r['op']}", []).append(f"{r['case']}: {r['detail'][:200]}")
    return {"counts": counts, "ops": ops, "found": found}


def spec_ok(row: dict) -> bool:
    """Built, tested and swept; for a patched tree also: the fixed defects are gone."""
    return bool(row["built"] and row["tests_ok"] and row["parity_ok"] and row.get("patch_ok", True))


def table(rows: list[dict]) -> str:
    def yn(v):
        return "yes" if v else "NO"
    w = max([32] + [len(r["spec"]) for r in rows])
    out = [f"{'spec':{w}s} {'ggml':>8s} {'built':>6s} {'tests':>6s} {'parity':>7s} {'worst NMSE':>11s} "
           f"{'time s':>7s}  known defects"]
    for r in rows:
        nm = f"{r['worst_nmse']:.2e}" if r["worst_nmse"] is not None else "-"
        out.append(f"{r['spec']:32s} {r['ggml_version'] or '-':>8s} {yn(r['built']):>6s} "
                   f"{yn(r['tests_ok']):>6s} {yn(r['parity_ok']):>7s} {nm:>11s} {r['seconds']:7.1f}  "
                   f"{'; '.join(r['known_defects']) or '-'}")
    for r in rows:
        if r.get("release_refusals"):
            out.append(f"  {r['spec']}: {r['release_refusals']} tests skipped where ggml {r['ggml_version']} "
                       f"refuses the sample itself ({r.get('tests_summary', '')})")
        known = (r.get("parity") or {}).get("known_findings")
        if known:
            out.append(f"  {r['spec']}: {known} of its sweep's bad rows are findings recorded for ggml "
                       f"{r['ggml_version']} (tests/expectations.py)"
                       + ("" if r["parity_ok"] else "; the others are not"))
    return "\n".join(out)


def op_changes(rows: list[dict]) -> str:
    """Per spec, against the first: ops the linked ggml has or lacks, builders the table
    cannot bind (absent or another signature), builders of the header the table lacks."""
    base = next((r for r in rows if r.get("ops")), None)
    if base is None:
        return "ops: no spec reported its ops"
    bops = set(base["ops"]["wrapped"]) | set(base["ops"]["not_wrapped"])
    bnot = set(base["builders"]["not_bound"])
    out = [f"ops per ggml, against {base['spec']} (ggml {base['ggml_version']}):"]
    for r in rows:
        if not r.get("ops") or r is base:
            continue
        ops = set(r["ops"]["wrapped"]) | set(r["ops"]["not_wrapped"])
        new, gone = sorted(ops - bops), sorted(bops - ops)
        changed = {k: v for k, v in r["builders"]["not_bound"].items() if k not in bnot}
        out.append(f"  {r['spec']} (ggml {r['ggml_version']}): {len(r['ops']['wrapped'])} ops wrapped, "
                   f"{len(r['builders']['bound'])} builders bound")
        out.append(f"    new ops: {', '.join(new) or '-'}")
        out.append(f"    removed ops: {', '.join(gone) or '-'}")
        for name, why in sorted(changed.items()):
            out.append(f"    not bound: {name}: {why}")
        if r["builders"]["header_only"]:
            out.append(f"    builders only in its header: {', '.join(r['builders']['header_only'])}")
        if r.get("api") is not None and base.get("api") is not None:
            added, removed = sorted(set(r["api"]) - set(base["api"])), sorted(set(base["api"]) - set(r["api"]))
            out.append(f"    GGML_API functions added: {', '.join(added) or '-'}")
            out.append(f"    GGML_API functions removed: {', '.join(removed) or '-'}")
    for r in rows:
        k = r.get("kernels")
        if k is not None and not k["known"]:
            out.append(f"  {r['spec']}: kernels unknown (a prebuilt ggml: no kernel source to fingerprint); "
                       f"no kernel trusted: every graph proven in a forked child")
        elif k is not None and k["untrusted"]:
            out.append(f"  {r['spec']}: kernels not trusted to their rules (graphs proven in a forked child): "
                       f"{', '.join(k['untrusted'])}")
        if k is not None and k.get("reviewed"):
            out.append(f"  {r['spec']}: changed kernels trusted by a rule review (pyggml/kernels.txt): "
                       f"{', '.join(k['reviewed'])}")
    return "\n".join(out)


def diff_specs(rows: list[dict], workdir: Path) -> None:
    """Each spec's saved sweep against the first spec's (``pyggml parity diff``, run in
    the first spec's environment): row["diff"] = its summary per op."""
    base = next((r for r in rows if r.get("parity_npz") and Path(r["parity_npz"]).exists()), None)
    if base is None:
        return
    for r in rows:
        if r is base or not (r.get("parity_npz") and Path(r["parity_npz"]).exists()):
            continue
        if Path(r["parity_npz"]).resolve() == Path(base["parity_npz"]).resolve():
            # not a diff: the same file twice (the specs shared a directory)
            r["diff"] = {"against": base["spec"], "error": f"{r['parity_npz']} is {base['spec']}'s own sweep"}
            continue
        # in the spec's own directory (the one its sweep was saved in)
        out = Path(r["parity_npz"]).parent / f"diff-{Path(base['parity_npz']).parent.name}.json"
        proc = subprocess.run([base["python"], "-m", "pyggml", "parity", "diff", base["parity_npz"], r["parity_npz"],
                               "--json", str(out)], capture_output=True, text=True, cwd=workdir)
        if out.exists():
            doc = json.loads(out.read_text())
            r["diff"] = {"against": base["spec"], "per_op": doc["per_op"]}
        else:
            r["diff"] = {"against": base["spec"], "error": (proc.stderr or proc.stdout)[-500:]}


def disagreements(rows: list[dict]) -> str:
    """Per op, the specs whose outputs differ from the first spec's beyond tolerance:
    how many outputs, and how many of those that differ are closer to the reference in
    the first spec (A) or in that spec (B)."""
    with_diff = [r for r in rows if r.get("diff", {}).get("per_op") is not None]
    if not with_diff:
        return "disagreements between builds: no two specs saved a sweep"
    base = with_diff[0]["diff"]["against"]
    lines = [f"outputs that disagree with {base} beyond tolerance (beyond/compared; closer to the reference: "
             f"A = {base}, B = that spec):"]
    ops = sorted({op for r in with_diff for op, o in r["diff"]["per_op"].items() if o["beyond"]})
    for r in with_diff:
        per = r["diff"]["per_op"]
        n = sum(o["outputs"] for o in per.values())
        same = sum(o["bitwise"] for o in per.values())
        beyond = sum(o["beyond"] for o in per.values())
        undecided = sum(o.get("undecided", 0) for o in per.values())     # (a diff before format 3: none)
        lines.append(f"  {r['spec']}: {n} outputs compared, {same} bitwise equal, {n - same} differ, {beyond} beyond"
                     + (f", {undecided} undecided (saved as digests: rerun with --save-whole)" if undecided else ""))
    for op in ops:
        cells = []
        for r in with_diff:
            o = r["diff"]["per_op"].get(op)
            if o and o["beyond"]:
                cells.append(f"{r['spec']} {o['beyond']}/{o['outputs']} (A {o['closer_a']}, B {o['closer_b']})")
        lines.append(f"  {op}: " + "; ".join(cells))
    if not ops:
        lines.append("  none")
    return "\n".join(lines)


@functools.lru_cache(maxsize=None)
def _defects() -> Any:
    """pyggml/defects.py, loaded from its file by the build's own loader (_gen_ops.load_defects):
    no build of pyggml is needed"""
    sys.path.insert(0, str(ROOT / "pyggml"))
    import _gen_ops

    return _gen_ops.load_defects()


def release_order(v: str | None) -> tuple[int, ...]:
    return _defects().release_key(v)


def measures_defect(value: object) -> bool:
    """Whether a defect probe's measurement shows the defect (pyggml.defects.measures_defect,
    which this script cannot import): bytes past a buffer (0: fixed) or a kernel verdict
    ("ok": fixed, "abort", "out-of-bounds", "hang": present)."""
    return value not in (None, False, 0, "", "ok")


def timeline(rows: list[dict]) -> list[dict]:
    """Over the releases (one spec per ggml version, native ISA, ordered by version):
    for every finding, the first release where it is seen and the last release before
    that where it is absent (None: seen in the oldest release tested), and the first
    release after it where it is absent again (None: still seen in the newest).

    Findings: a registry defect a probe measured (``defect:ID``), an overrun, crash or
    timeout the sweep saw (``oob:OP``...), and an op whose outputs disagree with the
    first spec's beyond tolerance (``disagrees:OP``)."""
    releases: dict[str, dict] = {}
    for r in rows:
        if (r.get("built") and r.get("isa", "native") == "native" and not r.get("patched")
                and r["ggml_version"] not in releases):
            releases[r["ggml_version"]] = r
    order = sorted(releases, key=release_order)
    seen: dict[str, dict[str, str]] = {}        # finding -> {version: what}
    kinds: dict[str, str] = {}
    # what each release measured at all: a release whose probes or sweep did not run is
    # neither "seen" nor "absent" for those findings
    measured = {v: {"defect": releases[v].get("defects") is not None,
                    "sweep": releases[v].get("parity") is not None,
                    "disagreement": bool((releases[v].get("diff") or {}).get("per_op"))} for v in order}
    for v in order:
        r = releases[v]
        for d, val in (r.get("defects") or {}).items():
            kinds[f"defect:{d}"] = "defect"
            if measures_defect(val):
                seen.setdefault(f"defect:{d}", {})[v] = str(val)
        for f, what in (r.get("parity") or {}).get("found", {}).items():
            kinds[f] = f.split(":")[0]
            seen.setdefault(f, {})[v] = what[0]
        for op, o in (r.get("diff") or {}).get("per_op", {}).items():
            if o["beyond"]:
                kinds[f"disagrees:{op}"] = "disagreement"
                seen.setdefault(f"disagrees:{op}", {})[v] = f"{o['beyond']}/{o['outputs']} outputs"
    out = []
    for f in sorted(kinds):
        where = seen.get(f, {})
        group = {"defect": "defect", "disagreement": "disagreement"}.get(kinds[f], "sweep")
        tested = [v for v in order if measured[v][group] or v in where]
        first = next((v for v in tested if v in where), None)
        if first is None:
            out.append({"id": f, "kind": kinds[f], "first_seen": None, "last_absent": tested[-1] if tested else None,
                        "absent_again": None, "detail": "not seen in any release"})
            continue
        k = tested.index(first)
        before = [v for v in tested[:k] if v not in where]
        after = next((v for v in tested[k + 1:] if v not in where), None)
        out.append({"id": f, "kind": kinds[f], "first_seen": first, "last_absent": before[-1] if before else None,
                    "absent_again": after, "detail": where[first]})
    return out


def format_timeline(items: list[dict], releases: list[str]) -> str:
    lines = [f"timeline over {len(releases)} releases ({', '.join(releases)}): "
             "first seen / last absent before it / absent again from"]
    for t in items:
        if t["first_seen"] is None:
            continue
        lines.append(f"  {t['id']}: first seen {t['first_seen']}, last absent {t['last_absent'] or '-'}, "
                     f"absent again {t['absent_again'] or '-'}: {t['detail'][:120]}")
    quiet = [t["id"] for t in items if t["first_seen"] is None]
    if quiet:
        lines.append(f"  not seen in any release: {', '.join(quiet)}")
    if len(lines) == 1:
        lines.append("  nothing")
    return "\n".join(lines)


HTML_SCRIPT = """
import json, sys
from pyggml.parity import html
from pyggml.parity.model import Row
doc = json.load(open(sys.argv[1]))
matrix = json.load(open(sys.argv[2]))
rows = [Row(**{k: (float(v) if k in ("nmse", "max_abs") and isinstance(v, str) else v) for k, v in r.items()})
        for r in doc["rows"]]
html.write_html(rows, sys.argv[3], doc["meta"], matrix)
"""


def write_html(rows: list[dict], items: list[dict], path: Path, workdir: Path) -> bool:
    """The first spec's sweep report, with the op x build grid and the timeline (in the
    first spec's environment, which has pyggml)."""
    base = next((r for r in rows if r.get("parity_json")), None)
    if base is None:
        return False
    ops = sorted({op for r in rows for op in (r.get("parity") or {}).get("ops", {})})
    cells = {op: {r["spec"]: r["parity"]["ops"][op] for r in rows if op in (r.get("parity") or {}).get("ops", {})}
             for op in ops}
    for r in rows:
        for op, o in (r.get("diff") or {}).get("per_op", {}).items():
            if o["beyond"] and cells.get(op, {}).get(r["spec"]) == "ok":
                cells[op][r["spec"]] = "fail"      # its own sweep passed, but it disagrees with the first spec
    builds = [r["spec"] for r in rows]
    for col, per_op in upstream_columns(rows, ops).items():
        builds.append(col)
        for op, v in per_op.items():
            cells[op][col] = v
    matrix = {"builds": builds, "cells": cells, "timeline": items}
    mpath = workdir / "matrix-html.json"
    mpath.write_text(json.dumps(matrix))
    proc = subprocess.run([base["python"], "-c", HTML_SCRIPT, base["parity_json"], str(mpath), str(path.resolve())],
                          capture_output=True, text=True, cwd=workdir)      # not the source tree: it shadows pyggml
    if proc.returncode:
        print(f"ci_upstream: --html failed: {proc.stderr[-1000:]}")
    return proc.returncode == 0
