#!/usr/bin/env python3
"""Upstream's own test suite beside pyggml's: build ggml's ``test-backend-ops`` from a
ggml tree, run its CPU modes, and read its verdicts per op.

``test-backend-ops`` (``tests/test-backend-ops.cpp`` of ggml, and of llama.cpp) checks
each backend against the CPU backend (mode ``test``), ggml's autodiff against finite
differences (mode ``grad``), and asks a backend which cases it supports (mode
``support``, nothing computed). Run on the CPU alone (``-b CPU``), ``test`` compares
the CPU with itself: its verdict says which cases the CPU runs (supported, finishes,
same result twice), not whether their values are right, and it is slow (stopped after 18 minutes
for ggml 0.25.3's cases on one core of a 2-core Zen 5). So the default modes are
``support`` (what the CPU says it runs) and ``grad`` (a real check of the backward
pass); ``--mode test`` adds it. pyggml's sweep checks values against float64, so beside
it:

- an op upstream runs while pyggml refuses every case of it is a false-refusal
  candidate (pyggml's rule refuses what the kernel runs);
- an op pyggml finds wrong while upstream passes it is a CPU bug upstream cannot see
  (its oracle is the CPU itself);
- an op whose gradient upstream finds wrong, or pyggml does, is named with both.

The test program is compiled from the tree's own ``tests/test-backend-ops.cpp`` (a ggml
checkout or the libggml-python sdist has it), or, for a registry sdist whose ggml lies in
a larger project (llama-cpp-python's ``vendor/llama.cpp/ggml``), from that project's
``tests/`` in the same sdist, verified by the sha256 pinned in ``vendor/sdists/``. It is
linked against the same ggml tree by a small CMake project written into ``--out``.

Run: ``python scripts/backend_ops.py --tree GGML_TREE [--sdist PKG==VER] --out DIR
[--mode test --mode grad] [--json F]``; ``scripts/ci_upstream.py --upstream-tests``
does it for every source spec and shows the verdicts in its matrix.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SOURCE = "test-backend-ops.cpp"
MODES = ("support", "grad", "test")
DEFAULT_MODES = ("support", "grad")
BUILD_TIMEOUT_S = 1800
RUN_TIMEOUT_S = 1800          # one run of a whole mode
OP_TIMEOUT_S = 300            # one op's run, where a mode runs per op (a slow op is named, not waited for)

CMAKE = """\
# written by pyggml's scripts/backend_ops.py: upstream's test-backend-ops, linked against
# the ggml tree pyggml was built from
cmake_minimum_required(VERSION 3.14)
project(pyggml_backend_ops C CXX)
set(CMAKE_CXX_STANDARD 17)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
set(GGML_BUILD_TESTS OFF CACHE BOOL "" FORCE)
set(GGML_BUILD_EXAMPLES OFF CACHE BOOL "" FORCE)
add_subdirectory("{tree}" ggml)
add_executable(test-backend-ops "{source}")
target_link_libraries(test-backend-ops PRIVATE ggml)
"""


class BackendOpsError(Exception):
    pass


def find_source(tree: Path, out: Path, sdist: str | None = None) -> Path:
    """The test-backend-ops.cpp that belongs to ``tree``: its own tests/, or the
    enclosing project's tests/ in the pinned sdist ``sdist`` (extracted into ``out``)."""
    own = tree / "tests" / SOURCE
    if own.is_file():
        return own
    if not sdist:
        raise BackendOpsError(f"{tree} has no tests/{SOURCE} (give --sdist for a tree from a registry sdist)")
    sys.path.insert(0, str(ROOT / "scripts"))
    import vendor_ggml

    lock = vendor_ggml.read_sdist_lock(sdist)
    archive = vendor_ggml.fetch_sdist(lock)          # verified by its pinned sha256
    # the project the ggml folder lies in: vendor/llama.cpp/ggml -> vendor/llama.cpp/tests/
    want = Path(lock["subdir"]).parent / "tests" / SOURCE
    with tarfile.open(archive, "r:gz") as tar:
        for m in tar.getmembers():
            parts = Path(m.name).parts
            if len(parts) > 1 and Path(*parts[1:]) == want and m.isfile():
                f = tar.extractfile(m)
                assert f is not None
                dest, data = out / SOURCE, f.read()
                out.mkdir(parents=True, exist_ok=True)
                if not dest.is_file() or dest.read_bytes() != data:      # (unchanged: no rebuild)
                    dest.write_bytes(data)
                return dest
    raise BackendOpsError(f"{archive.name} has no {want}")


def _run(cmd: list, log: Path, timeout: float, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run cmd in its own process group, its output appended to log and returned; past
    ``timeout`` the whole group is killed (rc 124)."""
    proc = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=cwd, start_new_session=True)
    try:
        text, _ = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        text, _ = proc.communicate()
        text += f"\n[timed out after {timeout:g} s: its process group was killed]\n"
        rc = 124
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    with _LOG_LOCK, log.open("a") as f:      # (runs may go on in threads: one block each)
        f.write(f"$ {' '.join(map(str, cmd))}\n")
        f.write(text if len(text) < 200_000 else text[:2000] + "\n[...]\n" + text[-20_000:])
        f.write(f"[exit {rc}]\n")
    return subprocess.CompletedProcess(cmd, rc, text, "")


def build(tree: Path, source: Path, out: Path, log: Path, jobs: int = 2) -> Path:
    """Configure and build the test program against ``tree``; returns its path."""
    project = out / "project"
    project.mkdir(parents=True, exist_ok=True)
    (project / "CMakeLists.txt").write_text(CMAKE.format(tree=tree.resolve().as_posix(),
                                                         source=source.resolve().as_posix()))
    bdir = out / "build"
    gen = ["-G", "Ninja"] if _have("ninja") else []
    if _run(["cmake", "-S", project, "-B", bdir, *gen, "-DCMAKE_BUILD_TYPE=Release"], log, BUILD_TIMEOUT_S).returncode:
        raise BackendOpsError(f"cmake could not configure test-backend-ops (log: {log})")
    if _run(["cmake", "--build", bdir, "--target", "test-backend-ops", "-j", str(jobs)], log,
            BUILD_TIMEOUT_S).returncode:
        raise BackendOpsError(f"test-backend-ops did not build (log: {log})")
    exe = bdir / "test-backend-ops"
    if not exe.is_file():
        found = sorted(bdir.rglob("test-backend-ops"))
        if not found:
            raise BackendOpsError(f"no test-backend-ops in {bdir}")
        exe = found[0]
    return exe


def _have(tool: str) -> bool:
    from shutil import which
    return which(tool) is not None


_LOG_LOCK = threading.Lock()
_INSERT = re.compile(r"^INSERT INTO test_backend_ops \((?P<fields>[^)]*)\) VALUES \((?P<values>.*)\);$")


def parse_sql(text: str) -> list[dict[str, str]]:
    """test-backend-ops' ``--output sql`` result rows as dicts (field: value)."""
    rows = []
    for line in text.splitlines():
        m = _INSERT.match(line.strip())
        if not m:
            continue
        fields = [f.strip() for f in m.group("fields").split(",")]
        values = re.findall(r"'((?:[^']|'')*)'", m.group("values"))
        if len(values) != len(fields):
            continue
        rows.append(dict(zip(fields, (v.replace("''", "'") for v in values))))
    return rows


_CASE = re.compile(r"^  (?P<op>[A-Z0-9_]+)\((?P<params>.*)\): ?(?P<rest>.*)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def parse_console(text: str) -> list[dict[str, str]]:
    """The cases of a console run (the grad and test modes print their verdicts only
    there): one row per case, as parse_sql's. A case may print several lines with its
    params (grad mode prints "OK" before it has run, then the node it checked, which may
    be another op, then its verdict): consecutive lines with the same params are one
    case, and its last line says how it ended: "OK", "FAIL", "not supported [...]" or
    "skipping large tensors" (both: not run)."""
    rows: list[dict[str, str]] = []
    last = None
    for line in text.splitlines():
        m = _CASE.match(_ANSI.sub("", line.rstrip()))
        if not m:
            continue
        rest = m.group("rest").strip()
        if last is not None and last["op_params"] == m.group("params"):
            row = last
        else:
            row = {"op_name": m.group("op"), "op_params": m.group("params")}
            rows.append(row)
            last = row
        ran = not rest.startswith(("not supported", "skipping"))
        row["supported"] = "1" if ran else "0"
        row["passed"] = "1" if ran and rest.endswith("OK") else "0"
        row["error_message"] = rest[:300]
    return rows


def _true(v: str) -> bool:
    return v.strip().lower() in ("1", "true", "yes")


def summarize(rows: list[dict[str, str]], keep: int = 5) -> dict[str, dict[str, Any]]:
    """Per op name: cases, supported, passed, and the first failing cases' params."""
    ops: dict[str, dict[str, Any]] = {}
    for r in rows:
        s = ops.setdefault(r.get("op_name", "?"), {"cases": 0, "supported": 0, "passed": 0, "failed": []})
        s["cases"] += 1
        if _true(r.get("supported", "")):
            s["supported"] += 1
            if _true(r.get("passed", "")):
                s["passed"] += 1
            elif len(s["failed"]) < keep:
                s["failed"].append(r.get("op_params", "")[:300])
    return ops


def _abort_line(text: str) -> str:
    """The line an aborted run printed about why: ggml's GGML_ABORT and GGML_ASSERT
    print "FILE:LINE: message"."""
    for line in text.splitlines():
        # (stderr may follow a partial stdout line); the file without its directory
        m = re.search(r"(?:\S*/)?(\S+\.(?:c|cpp|h):\d+: .*)", line)
        if m:
            return m.group(1).strip()[:300]
    return ""


# Ops whose per-op run is split in two by test-backend-ops' -p (a regex over a case's
# params), the second the first's complement, so that the two halves run side by side.
# Measured on a 2-core Zen 3 (AMD EPYC, family 25 model 1), ggml 0.25.3's grad mode:
# MUL_MAT 264 of its 287 s (the next, ROPE, 11.5 s); its heavy cases come in pairs
# (k = 128 and 129, 1056 and 1057), which k's parity splits evenly: 143 s split.
SHARDS = {"MUL_MAT": r",k=[0-9]*[02468],"}


def shards(name: str) -> tuple[str | None, ...]:
    """The -p filters of an op's runs: the op's SHARDS regex and its complement (every
    case in exactly one), or one run with no filter."""
    rx = SHARDS.get(name)
    return (rx, f"^(?!.*{rx})") if rx else (None,)


def run_mode(exe: Path, mode: str, log: Path, timeout: float = RUN_TIMEOUT_S, ops: str | None = None,
             per_op: list[str] | None = None, jobs: int = 1, split: bool = False) -> dict[str, Any]:
    """One mode on the CPU backend: {"rc", "seconds", "cases", "ops": summarize(...)}.

    With ``per_op`` (op names), one run per op (``-o NAME``, ``jobs`` at a time): a case
    that aborts the program then ends its op's run only, and that op carries
    ``"exit"`` and ``"abort"`` (the message) beside the verdicts of the cases it had
    printed, and ``"seconds"``, its runs' time. With ``split`` (a program that has -p), an
    op of SHARDS runs as two runs, one per half of its cases. Output is line-buffered
    (stdbuf) so that those are not lost with it."""
    line_buffered = ["stdbuf", "-oL"] if _have("stdbuf") else []

    # support mode reports through the SQL printer; grad and test print their verdicts on
    # the console only
    sql = mode == "support"

    def one(task: tuple[str | None, str | None]) -> tuple[subprocess.CompletedProcess, list[dict[str, str]], float]:
        op_filter, params = task
        cmd: list = [*line_buffered, exe, mode, "-b", "CPU", *(["--output", "sql"] if sql else [])]
        if op_filter:
            cmd += ["-o", op_filter]
        if params:
            cmd += ["-p", params]
        t = time.perf_counter()
        proc = _run(cmd, log, timeout if op_filter is None or per_op is None else min(timeout, OP_TIMEOUT_S))
        return proc, parse_sql(proc.stdout) if sql else parse_console(proc.stdout), round(time.perf_counter() - t, 1)

    t0 = time.perf_counter()
    if per_op is None:
        proc, rows, _ = one((ops, None))
        return {"rc": proc.returncode, "seconds": round(time.perf_counter() - t0, 1), "cases": len(rows),
                "ops": summarize(rows)}
    from concurrent.futures import ThreadPoolExecutor

    # the split ops first (the longest runs: the others then fill the other worker's time)
    order = sorted(per_op, key=lambda name: split and name in SHARDS, reverse=True)
    tasks = [(name, p) for name in order for p in (shards(name) if split else (None,))]
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        results = list(zip(tasks, pool.map(one, tasks)))
    results.sort(key=lambda r: per_op.index(r[0][0]))      # read in op order (rc: the first op's that failed)
    summary: dict[str, dict[str, Any]] = {}
    cases, rc = 0, 0
    for (name, _), (proc, rows, seconds) in results:
        # (a case is named by its first line: the op it was asked for)
        mine = [r for r in rows if r["op_name"] == name]
        # exit 1: some case failed (its verdicts say which); a signal, or another status
        # with ggml's abort message, is the program dying in that op's run
        why = _abort_line(proc.stdout) or (f"ran past {OP_TIMEOUT_S} s (killed)" if proc.returncode == 124 else "")
        died = proc.returncode < 0 or proc.returncode not in (0, 1) or bool(proc.returncode and why)
        if died and mine and not sql:
            # the case it died in: grad mode prints "OK" for a case before running it
            mine[-1].update(supported="1", passed="0", error_message=why or f"exit {proc.returncode}")
        got = summarize(mine).get(name, {"cases": 0, "supported": 0, "passed": 0, "failed": []})
        cases += got["cases"]
        if name in summary:         # the op's other half: one entry for both
            prev = summary[name]
            for k in ("cases", "supported", "passed"):
                prev[k] += got[k]
            prev["failed"] = (prev["failed"] + got["failed"])[:5]
            prev["seconds"] = max(prev["seconds"], seconds)     # (side by side)
        else:
            got["seconds"] = seconds
            summary[name] = got
        if died and "exit" not in summary[name]:
            summary[name].update(exit=proc.returncode, abort=why)
        rc = rc or proc.returncode
    return {"rc": rc, "seconds": round(time.perf_counter() - t0, 1), "cases": cases, "ops": summary}


# --- beside pyggml's sweep -------------------------------------------------------------------

def op_names(makes: str) -> str | None:
    """The name test-backend-ops gives the node an op table row makes (ggml_op_desc: the
    unary or GLU op's own name for UNARY:X and GLU:X); None for a generic UNARY:*."""
    kind, _, sub = makes.partition(":")
    if sub == "*":
        return None
    return sub or kind


def makes_by_function() -> dict[str, str]:
    """pyggml's function -> the test-backend-ops op name of the node it makes."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("pyggml_gen_ops", ROOT / "pyggml" / "_gen_ops.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = gen          # (its dataclasses look their module up)
    spec.loader.exec_module(gen)
    out = {}
    for op in gen.read_table(str(ROOT / "pyggml" / "ops.txt")):
        name = op_names(op.makes)
        if name:
            out[op.name] = name
    return out


def pyggml_by_op(parity_rows: list[dict], makes: dict[str, str]) -> dict[str, dict[str, dict[str, int]]]:
    """pyggml's sweep per test-backend-ops op name: forward and gradient verdict counts
    ({"forward": {verdict: n}, "grad": {...}}); a gradient row is one whose first path is
    ggml's autodiff."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for r in parity_rows:
        name = makes.get(r["op"])
        if name is None:
            continue
        part = "grad" if r.get("a") == "autodiff" else "forward"
        counts = out.setdefault(name, {"forward": {}, "grad": {}})[part]
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
    return out


BAD = ("fail", "oob", "crashed", "timeout", "error")


def compare(upstream: dict[str, Any], ours: dict[str, dict[str, dict[str, int]]]) -> dict[str, list[str]]:
    """Where the two suites disagree, per finding kind: lines naming the op and both
    verdicts. ``upstream``: {mode: run_mode(...)}."""
    # what the CPU runs: test mode's passes where it ran, else what support mode says
    runs = upstream.get("test", upstream.get("support", {})).get("ops", {})
    test_ops = upstream.get("test", {}).get("ops", {})
    grad_ops = upstream.get("grad", {}).get("ops", {})
    found: dict[str, list[str]] = {"false_refusal": [], "upstream_blind": [], "upstream_fails": [],
                                   "upstream_aborts": [], "grad_disagrees": []}
    for mode in ("test", "grad"):
        for name, u in sorted(upstream.get(mode, {}).get("ops", {}).items()):
            if u.get("exit"):
                found["upstream_aborts"].append(f"{name} ({mode}): exit {u['exit']} after {u['cases']} cases: "
                                                f"{u.get('abort') or 'no message'}")
    for name in sorted(set(runs) | set(grad_ops) | set(ours)):
        up = runs.get(name)
        fw = ours.get(name, {}).get("forward", {})
        gr = ours.get(name, {}).get("grad", {})
        ran = sum(fw.values())
        if up and up["passed"] and ran and fw.get("refused", 0) == ran:
            found["false_refusal"].append(f"{name}: upstream runs {up['passed']}/{up['cases']} cases; "
                                          f"pyggml refused all {ran} of its sweep")
        bad = sum(fw.get(v, 0) for v in BAD)
        if up and bad and up["supported"] and up["passed"] == up["supported"]:
            found["upstream_blind"].append(f"{name}: pyggml {bad}/{ran} bad against float64 "
                                           f"({_counts(fw)}); upstream runs {up['passed']}/{up['supported']} "
                                           f"supported cases (its oracle is the CPU itself)")
        ut = test_ops.get(name)
        if ut and ut["passed"] < ut["supported"]:
            found["upstream_fails"].append(f"{name}: upstream fails {ut['supported'] - ut['passed']}/"
                                           f"{ut['supported']} (first: {ut['failed'][:1]}); pyggml {_counts(fw)}")
        ug = grad_ops.get(name)
        gbad = sum(gr.get(v, 0) for v in BAD)
        up_gbad = ug is not None and ug["passed"] < ug["supported"]
        if (gbad > 0) != up_gbad and (ug is not None and ug["supported"]) and sum(gr.values()):
            found["grad_disagrees"].append(
                f"{name}: gradient upstream {ug['passed']}/{ug['supported']} pass"
                f"{' (first failing: ' + ug['failed'][0] + ')' if ug['failed'] else ''}; pyggml {_counts(gr)}")
    return found


def verdict(s: dict[str, Any]) -> str:
    """One op's upstream outcome in the words of pyggml's sweep (its HTML grid's cells):
    "crashed" where the program died in it, "skipped" where no case ran, "ok" or "fail"."""
    if s.get("exit"):
        return "crashed"
    if not s["supported"]:
        return "skipped"
    return "ok" if s["passed"] == s["supported"] else "fail"


def _counts(c: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(c.items())) or "not swept"


def report(upstream: dict[str, Any], found: dict[str, list[str]]) -> str:
    titles = {
        "false_refusal": "upstream runs it, pyggml refuses every case (false-refusal candidates)",
        "upstream_blind": "pyggml finds wrong values upstream passes (its oracle is the CPU itself)",
        "upstream_fails": "upstream's own CPU test fails",
        "upstream_aborts": "upstream's own program aborts (its run of that op ends there)",
        "grad_disagrees": "the gradient verdicts disagree",
    }
    out = []
    for mode, res in upstream.items():
        ops = res.get("ops", {})
        sup = sum(s["supported"] for s in ops.values())
        ok = sum(s["passed"] for s in ops.values())
        out.append(f"test-backend-ops {mode} -b CPU: {res.get('cases', 0)} cases, {sup} supported, {ok} passed, "
                   f"{len(ops)} ops ({res.get('seconds')} s, exit {res.get('rc')})")
        slow = sorted((s["seconds"], name) for name, s in ops.items() if "seconds" in s)[::-1][:5]
        if slow:        # (one run per op: where the mode's time goes)
            out.append("  slowest: " + ", ".join(f"{name} {sec:g} s" for sec, name in slow))
    for kind, lines in found.items():
        out.append(f"  {titles[kind]}: {len(lines) or 'none'}")
        out += [f"    {line}" for line in lines]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", type=Path, required=True, help="the ggml tree (CMakeLists.txt, include/, src/)")
    ap.add_argument("--sdist", metavar="PKG==VER", help="the registry sdist the tree came from (pinned in vendor/sdists)")
    ap.add_argument("--out", type=Path, required=True, help="work directory (build, log)")
    ap.add_argument("--mode", action="append", choices=MODES, help="modes to run (default: support and grad)")
    ap.add_argument("--ops", metavar="OP,REGEX", help="test-backend-ops -o (default: every op)")
    ap.add_argument("--parity", type=Path, metavar="parity.json", help="pyggml's sweep of the same build, to compare")
    ap.add_argument("--json", type=Path, metavar="F", help="write the verdicts (and the comparison) as JSON")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "log.txt"
    try:
        source = find_source(args.tree, args.out, args.sdist)
        exe = build(args.tree, source, args.out, log, args.jobs)
    except BackendOpsError as e:
        print(f"backend_ops: {e}", file=sys.stderr)
        return 2
    upstream: dict[str, Any] = {}
    modes = args.mode or DEFAULT_MODES
    if any(m != "support" for m in modes) and "support" not in modes:
        upstream["support"] = run_mode(exe, "support", log, ops=args.ops)     # the op list
    for m in modes:
        if m == "support":
            upstream[m] = run_mode(exe, m, log, ops=args.ops)
        else:
            # one run per op: a case that aborts ends its op's run, not the mode's
            names = sorted(upstream["support"]["ops"])
            upstream[m] = run_mode(exe, m, log, per_op=names, jobs=args.jobs,
                                   split='"-p"' in source.read_text(errors="replace"))
    doc: dict[str, Any] = {"source": str(source), "upstream": upstream}
    if args.parity:
        rows = json.loads(args.parity.read_text())["rows"]
        doc["found"] = compare(upstream, pyggml_by_op(rows, makes_by_function()))
    print(report(upstream, doc.get("found", {})))
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1))
    return 0 if all(r["rc"] == 0 for r in upstream.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
