#!/usr/bin/env python3
"""Build pyggml against several ggml releases and run the same checks on each.

Each distinct ``--ggml SPEC`` gets its own virtual environment and build directory
(``WORKDIR/<slug>-<sha256 of the spec's normalised spelling>``: two spellings of one
spec, such as ``src:PATH`` and ``src:PATH/``, are one spec and run once):

``vendored``
    the pinned release (vendor/ggml.lock), built from source into the extension;
``pypi:libggml-python==X``
    the prebuilt ggml shared libraries of that registry package, installed into
    the environment and found with ``find_package(ggml CONFIG)``;
``src:PATH``
    an upstream source tree (for example a git checkout of master), built from source;
``prefix:PATH``
    an installed ggml (``PATH/lib*/cmake/ggml``), linked as a system library;
``patched:vendored``, ``patched:src:PATH``
    that source tree, copied and fixed by ``scripts/patch_upstream.py`` (pyggml's fixes
    for upstream defects, docs/upstream-defects.md), built from source: its defect
    probes must then measure nothing.

A source spec (vendored, src:) may end in ``@ISA``: ggml's CPU kernels built for one
instruction set through ggml's own options (GGML_NATIVE off, GGML_AVX* and friends):
``@generic`` (x86-64 baseline), ``@sse42``, ``@avx``, ``@avx2`` (with FMA, F16C, BMI2),
``@avx512``; kernels differ per ISA, and that is where CPU bugs hide.

For each: install pyggml with its test extra, read the ggml version the built
module reports, run the test suite and the parity sweep (``pyggml parity --save``;
``--quick-parity`` for the quick one). Then:

- the matrix (built, tests, parity, worst NMSE, the defect probes' measurements);
- per spec, the ops and builders its ggml has that the first spec's does not (or lacks);
- per op, where a spec's outputs disagree with the first spec's beyond the case's
  tolerance (``pyggml parity diff``), and which of the two is closer to the float64
  reference;
- a timeline over the releases: for every measured registry defect, every overrun or
  crash the sweeps saw, and every disagreement, the first release where it is seen and
  the last before it where it is absent.

``--upstream-tests SPEC``: for that source spec, upstream's own test-backend-ops is built
from its ggml tree and run on the CPU (test and grad modes) beside the sweep
(scripts/backend_ops.py); the report lists where the two suites disagree per op.

Writes ``--json PATH`` (``{"specs": [{"spec", "ggml_version", "built", "tests_ok",
"parity_ok", "ops", "builders", "defects", "parity", "diff", ...}], "timeline": [...]}``)
and ``--html PATH`` (the report of the first spec's sweep with the op x build grid and
the timeline); exits non-zero if a spec failed to build, test or sweep.
With no ``--ggml``: vendored, its ISA variants, and every prebuilt release.

``--bisect src:PATH --good REV --bad REV --op NAME`` instead runs ``git bisect`` over the
upstream checkout PATH: at each revision, pyggml is built against the tree and the op's
sweep compared with the good revision's (``--bisect-test CMD`` replaces that with a
shell command of your own, run in the tree, with git bisect's exit codes). The
revisions are checked out in a separate worktree of PATH's repository
(``WORKDIR/bisect/worktree``, removed at the end, also on an error or Ctrl-C): the
checkout PATH itself (its HEAD, branch, index and working tree) is never moved.

Run: ``python scripts/ci_upstream.py [--ggml SPEC ...] [--json matrix.json] [--html matrix.html]``
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))      # its sibling modules, however it is loaded
from ci_report import (PARITY_BAD, as_float, diff_specs, disagreements, format_timeline,  # noqa: E402
                       known_sweep_findings, measures_defect, op_changes, parity_summary, release_order,
                       release_refusals, spec_ok, table, timeline, upstream_tests_report, write_html)

ROOT = Path(__file__).resolve().parent.parent
# every release of the registry package with a prebuilt wheel for this platform
# (0.1.0 and 0.2.0 have none); 0.x.y.post1 repackage the same ggml
RELEASES = ["0.3.5", "0.9.4", "0.9.5", "0.9.7", "0.9.8", "0.9.11", "0.13.1", "0.15.3", "0.16.0", "0.17.0"]
DEFAULT_SPECS = (["vendored", "patched:vendored", "sdist:libggml-python==0.20.2.post1",
                  "vendored@avx2", "vendored@avx", "vendored@generic"] +
                 [f"pypi:libggml-python=={v}" for v in reversed(RELEASES)])

# ggml's own CMake options per instruction set (ggml/CMakeLists.txt, x86)
_X86 = ("GGML_SSE42", "GGML_AVX", "GGML_AVX2", "GGML_FMA", "GGML_F16C", "GGML_BMI2", "GGML_AVX512")
ISAS: dict[str, tuple[str, ...]] = {
    "generic": (),
    "sse42": ("GGML_SSE42",),
    "avx": ("GGML_SSE42", "GGML_AVX"),
    "avx2": ("GGML_SSE42", "GGML_AVX", "GGML_AVX2", "GGML_FMA", "GGML_F16C", "GGML_BMI2"),
    "avx512": _X86,
}


# backends a source build can add (pyggml's CMake options), as a spec suffix: vendored+blas
BACKENDS = {"blas": "PYGGML_BLAS", "cuda": "PYGGML_CUDA", "vulkan": "PYGGML_VULKAN", "metal": "PYGGML_METAL"}


def split_backends(spec: str) -> tuple[str, tuple[str, ...]]:
    """("vendored+blas") -> ("vendored", ("blas",)); the suffixes must end the spec (a
    path may hold a '+')."""
    found: list[str] = []
    while True:
        base, plus, name = spec.rpartition("+")
        if not plus or name not in BACKENDS:
            return spec, tuple(reversed(found))
        found.append(name)
        spec = base


def split_isa(spec: str) -> tuple[str, str]:
    """("vendored@avx2") -> ("vendored", "avx2"); no suffix -> (spec, "")."""
    base, at, isa = spec.rpartition("@")
    if not at or "==" in isa:
        return spec, ""
    if isa not in ISAS:
        raise SystemExit(f"ci_upstream: {spec}: unknown ISA {isa!r} (known: {', '.join(ISAS)})")
    if not _is_source(base):
        raise SystemExit(f"ci_upstream: {spec}: only a source build (vendored, src:) can choose its ISA")
    return base, isa


def _is_source(spec: str) -> bool:
    base, _ = split_backends(spec)
    return base in ("vendored", "patched:vendored") or base.startswith(("src:", "patched:src:", "sdist:"))


def build_defines(spec: str) -> dict[str, str]:
    """The CMake definitions of a spec's build: its ISA's and its backends'."""
    base, isa = split_isa(spec)
    _, backends = split_backends(base)
    if backends and not _is_source(base):
        raise SystemExit(f"ci_upstream: {spec}: only a source build (vendored, src:) can add backends")
    return {**isa_defines(isa), **{BACKENDS[b]: "ON" for b in backends}}


def isa_defines(isa: str) -> dict[str, str]:
    """The CMake definitions of a build for ``isa`` ({} for the default, native one)."""
    if not isa:
        return {}
    on = set(ISAS[isa])
    return {"PYGGML_NATIVE": "OFF", **{o: "ON" if o in on else "OFF" for o in _X86}}


# what the built pyggml says about the linked ggml: its ops (op_coverage), the
# builders of the table it binds, and the defect registry's probes
OPS_PROBE = """
import json, pyggml, pyggml.coverage, pyggml.defects
from pyggml import _optable
print(json.dumps({"ops": pyggml.op_coverage(), "builders": pyggml.coverage.builder_coverage(),
                  "api": getattr(_optable, "API", None),
                  "defects": {k: v for k, v in pyggml.defects.probe_all().items() if v is not None}}))
"""


def slug(spec: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", spec).strip("-")


def parse_spec(spec: str) -> tuple[str, str]:
    """(kind, argument) of a spec, without its backends and ISA: ("src", the resolved
    path), ("patched", "" or the resolved path of patched:src:PATH), ("pypi",
    "libggml-python==X"), ("vendored", "")..."""
    spec, _ = split_isa(spec)
    spec, _ = split_backends(spec)
    kind, _, arg = spec.partition(":")
    if kind == "patched":
        inner, inner_arg = parse_spec(arg) if arg else ("", "")
        if inner not in ("vendored", "src"):
            raise SystemExit(f"ci_upstream: bad --ggml {spec!r}: use patched:vendored or patched:src:PATH")
        return kind, inner_arg
    if kind == "vendored" and not arg:
        return kind, ""
    if kind == "pypi" and re.fullmatch(r"libggml-python==[0-9][0-9A-Za-z.+!_-]*", arg):
        return kind, arg
    if kind == "sdist" and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*==[0-9][0-9A-Za-z.+!_-]*", arg):
        return kind, arg              # its pin: vendor/sdists/PACKAGE-VERSION.lock (scripts/vendor_ggml.py)
    if kind in ("src", "prefix") and arg:
        path = Path(arg).expanduser().resolve()
        if not path.is_dir():
            raise SystemExit(f"ci_upstream: {spec}: {path} is not a directory")
        return kind, str(path)
    raise SystemExit(f"ci_upstream: bad --ggml {spec!r}: use vendored, pypi:libggml-python==X, sdist:PACKAGE==X, "
                     f"src:PATH or prefix:PATH")


def normalise_spec(spec: str) -> str:
    """The one spelling of a ``--ggml`` spec, after every check of one (its kind and
    argument, its ISA, its backends): a path resolved (``src:x/`` and ``src:/abs/x`` are
    one spec), the backends sorted and once each (``+cuda+blas`` is ``+blas+cuda``), then
    the ISA. Raises SystemExit for a spec the grammar does not accept."""
    kind, arg = parse_spec(spec)
    base, isa = split_isa(spec)
    _, backends = split_backends(base)
    build_defines(spec)                 # its ISA and backends are a source build's
    if kind == "patched":
        canon = "patched:" + (f"src:{arg}" if arg else "vendored")
    elif kind == "vendored":
        canon = "vendored"
    else:
        canon = f"{kind}:{arg}"
    canon += "".join(f"+{b}" for b in sorted(set(backends)))
    return canon + (f"@{isa}" if isa else "")


def spec_dirname(spec: str) -> str:
    """The name of a spec's directory in the work directory: a readable slug of its
    normalised spelling and a short sha256 of it, so that distinct specs never share one
    (slugs alone do: ``src:/x/a-b`` and ``src:/x/a_b``) and two spellings of one spec
    always do."""
    canon = normalise_spec(spec)
    s = slug(canon)
    if len(s) > 48:                     # a long path: its start (the kind) and its end
        s = f"{s[:16].rstrip('-')}--{s[-30:].lstrip('-')}"
    return f"{s}-{hashlib.sha256(canon.encode()).hexdigest()[:12]}"


def distinct_specs(specs: list[str]) -> list[str]:
    """The specs, each checked, with a later spelling of a spec already there left out
    (it would run in the same directory and replace the first's results)."""
    seen: dict[str, str] = {}
    for spec in specs:
        canon = normalise_spec(spec)
        if canon in seen:
            print(f"ci_upstream: --ggml {spec} is {seen[canon]} again ({canon}): run once", flush=True)
        else:
            seen[canon] = spec
    return list(seen.values())


TIMED_OUT = 124          # a step's exit status when it ran past its time (timeout(1)'s)


class Step:
    """Runs commands, appending their output to one log file per spec.

    Each command runs in a process group of its own and writes straight into the log, so
    that what it printed is there whatever happens; one that runs past ``timeout`` has its
    whole group killed (its children too: a forked proof spinning in a hung kernel, a
    pytest-xdist worker) and reads as exit TIMED_OUT, so the spec fails and the matrix goes
    on. Ctrl-C kills the group too, then propagates."""

    def __init__(self, log: Path):
        self.log = log
        log.write_text("")

    def run(self, cmd, env=None, cwd=None, timeout=1800) -> subprocess.CompletedProcess:
        with self.log.open("a") as f:
            f.write(f"\n$ {' '.join(map(str, cmd))}\n")
            f.flush()
            start = f.tell()
            t0 = time.perf_counter()
            proc = subprocess.Popen([str(c) for c in cmd], env=env, cwd=cwd, stdout=f, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                rc = TIMED_OUT
            except BaseException:
                _kill_group(proc)
                raise
            f.flush()
        with self.log.open() as f:
            f.seek(start)
            out = f.read()
        with self.log.open("a") as f:
            if rc == TIMED_OUT and proc.returncode != TIMED_OUT:
                f.write(f"[timed out after {timeout} s: its process group was killed]\n")
            f.write(f"[{time.perf_counter() - t0:.1f} s]\n[exit {rc}]\n")
        return subprocess.CompletedProcess(cmd, rc, stdout=out)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group a Step started (the command and everything it forked that
    stayed in its group), and reap the command."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


# a forked proof's time limit in the specs' environments (pyggml.set_proof_timeout; 600 s
# otherwise): a kernel that spins on some release costs each test that proves it this
# long, not ten minutes. A proof that needs longer fails its test with a KernelTimeout
# that names the limit. The caller's own PYGGML_PROOF_LIMIT wins.
PROOF_LIMIT_S = 60


def clean_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PYGGML_PROOF_LIMIT", str(PROOF_LIMIT_S))
    # PYGGML_REQUIRE_BROWSER: .ci/run's, for its own environment (the specs' have no browser driver);
    # GIT_*: what git bisect run sets for a step (the upstream worktree's), not pyggml's
    for var in ("PYGGML_GGML", "PYGGML_GGML_SOURCE_DIR", "CMAKE_PREFIX_PATH", "VIRTUAL_ENV", "PYTHONPATH",
                "PYGGML_REQUIRE_BROWSER", "PYGGML_REQUIRE_BACKENDS", *BACKENDS.values(),
                "GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_PREFIX"):
        env.pop(var, None)
    return env


# --reuse vendored=PYTHON: the interpreter's pyggml must be the plain vendored build of
# this checkout (its source file for file, the pinned ggml, native, the CPU backend only)
REUSE_CHECK = """
import json, sys, pathlib, pyggml
root = pathlib.Path(sys.argv[1]) / "pyggml"
pkg = pathlib.Path(pyggml.__file__).parent
stale = sorted(name for name in json.loads(sys.argv[2]) if not (pkg / name).exists()
               or (pkg / name).read_bytes() != (root / name).read_bytes())
print(json.dumps({"info": pyggml.build_info(), "backends": [d["name"] for d in pyggml.backends()],
                  "stale": stale, "editable": pkg.resolve() == root.resolve()}))
"""


def wheel_excludes() -> list[str]:
    """pyproject.toml's ``tool.scikit-build.wheel.exclude``: the build inputs (``_gen_ops.py``,
    ...) an installed pyggml does not have."""
    try:
        import tomllib
    except ImportError:                 # Python 3.10: the exclusions as the file writes them
        text = (ROOT / "pyproject.toml").read_text()
        m = re.search(r"^wheel\.exclude\s*=\s*\[(.*?)\]", text, re.S | re.M)
        return re.findall(r'"([^"]+)"', m.group(1)) if m else []
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return list(cfg.get("tool", {}).get("scikit-build", {}).get("wheel", {}).get("exclude", []))


def reusable(spec: str, python: Path, step: "Step", env: dict[str, str]) -> str:
    """Why the pyggml of interpreter ``python`` cannot stand for ``spec`` ("" if it can):
    only ``vendored`` can be reused, from an installed (not editable) build of this
    checkout's sources with the pinned ggml, for this machine's CPU, with no other backend."""
    if normalise_spec(spec) != "vendored":
        return f"only vendored can be reused, not {spec}"
    shipped = [p.name for p in sorted((ROOT / "pyggml").glob("*.py"))
               if not any(fnmatch.fnmatch(f"pyggml/{p.name}", pat) for pat in wheel_excludes())]
    proc = step.run([python, "-c", REUSE_CHECK, ROOT, json.dumps(shipped)], env=env, cwd=python.parent)
    if proc.returncode:
        return f"{python} cannot import pyggml"
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    lock = pinned_lock()
    want = f"pypi:{lock['package']} sha256:{lock['sha256']}"
    if got["editable"]:
        return f"{python}'s pyggml is this checkout's editable install, not a build"
    if got["stale"]:
        return f"{python}'s pyggml differs from this checkout in {', '.join(got['stale'])}"
    if got["info"]["ggml_source"] != want or not got["info"]["native"] or got["backends"] != ["CPU"]:
        return (f"{python}'s pyggml is not the plain vendored build: ggml {got['info']['ggml_source']}, "
                f"native {got['info']['native']}, backends {got['backends']}")
    return ""




def reused_results(results: Path, quick_parity: bool, build: dict) -> tuple[dict, str]:
    """What the runs already made with a reused interpreter (``--reuse-results DIR``: its
    pytest's ``junit.xml``, its sweep's ``parity.json`` and ``parity.npz``) give the spec's
    row, and why they cannot stand for its own runs ("" if they can): the sweep must be
    the one the matrix would run (full or quick, every op, type and path, one thread) by
    the same build."""
    import xml.etree.ElementTree as ET
    junit, pjson, npz = results / "junit.xml", results / "parity.json", results / "parity.npz"
    missing = [p.name for p in (junit, pjson, npz) if not p.is_file()]
    if missing:
        return {}, f"{results} has no {', '.join(missing)}"
    try:
        root = ET.parse(junit).getroot()
        suite = root if root.tag == "testsuite" else root.find("testsuite")
        if suite is None:
            return {}, f"{junit} has no testsuite"
        counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
        meta = json.loads(pjson.read_text())["meta"]
    except (ET.ParseError, AttributeError, ValueError, KeyError) as e:
        return {}, f"{results}: unreadable ({type(e).__name__}: {e})"
    ident = meta.get("identity", {})
    same = {k: ident.get(k) == build.get(k) for k in ("ggml_version", "ggml_source", "native")}
    if not all(same.values()):
        return {}, f"{pjson} is the sweep of another build ({', '.join(k for k, v in same.items() if not v)} differ)"
    if meta.get("quick") != quick_parity or meta.get("ops") or meta.get("types") or meta.get("paths") \
            or meta.get("threads") != 1:
        return {}, f"{pjson} is not the sweep the matrix runs ({'quick' if quick_parity else 'full'}, every op, one thread)"
    passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    summary = json.loads(pjson.read_text())["summary"]
    # the sweep's own exit status: no partial run, no verdict of pyggml.parity.model.BAD
    return {"parity_ok": not meta.get("partial") and not any(summary.get(v) for v in PARITY_BAD),
            "tests_ok": counts["tests"] > 0 and not counts["failures"] and not counts["errors"],
            "tests_summary": f"{passed} passed, {counts['skipped']} skipped, {counts['failures']} failed, "
                             f"{counts['errors']} errors (the reused run's {junit.name})"}, ""


def empty_row(spec: str, log: Path) -> dict[str, Any]:
    """A spec's row before anything ran: nothing built, nothing passed."""
    return {"spec": spec, "ggml_version": None, "built": False, "tests_ok": False, "parity_ok": False,
            "worst_nmse": None, "known_defects": [], "seconds": 0.0, "log": str(log)}


def pinned_lock() -> dict[str, str]:
    """The keys of vendor/ggml.lock, the default pin."""
    return dict(line.split(" = ", 1) for line in (ROOT / "vendor" / "ggml.lock").read_text().splitlines()
                if " = " in line and not line.startswith("#"))


def run_upstream_tests(row: dict, kind: str, arg: str, out: Path, py: Path, step: Step, env: dict) -> None:
    """Upstream's own test-backend-ops, built from the spec's ggml tree and run on the
    CPU in its test and grad modes, beside the spec's sweep (scripts/backend_ops.py):
    row["upstream_tests"]. A prebuilt ggml has no tree to build it from."""
    tree = {"vendored": ROOT / "vendor" / "ggml", "sdist": out / "ggml-src", "patched": out / "ggml-src",
            "src": Path(arg)}.get(kind)
    if tree is None or not (tree / "CMakeLists.txt").is_file():
        row["upstream_tests"] = {"skipped": f"no ggml source tree for a {kind} spec"}
        return
    # CMake and Ninja for the build, in the spec's environment (pip's build of pyggml had its own)
    if step.run([py, "-m", "pip", "install", "--quiet", "cmake", "ninja"], env=env).returncode:
        row["upstream_tests"] = {"error": "could not install cmake and ninja"}
        return
    doc = out / "backend-ops.json"
    # the registry sdist the tree came from: its enclosing project may hold the tests
    # (the pin's, vendor/ggml.lock, for vendored: llama-cpp-python's llama.cpp/tests/)
    sdist = arg if kind == "sdist" else pinned_lock()["package"] if kind == "vendored" else None
    cmd = [sys.executable, ROOT / "scripts" / "backend_ops.py", "--tree", tree, "--out", out / "backend-ops",
           "--json", doc, *(["--sdist", sdist] if sdist else [])]
    if (out / "parity.json").exists():
        cmd += ["--parity", out / "parity.json"]
    ran = step.run(cmd, env={**env, "PATH": f"{Path(py).parent}{os.pathsep}{env.get('PATH', '')}"}, timeout=3600)
    row["upstream_tests"] = json.loads(doc.read_text()) if doc.exists() else {"error": f"exit {ran.returncode}"}
    row["upstream_tests"]["rc"] = ran.returncode


def run_spec(spec: str, workdir: Path, pytest_args: list[str], quick_parity: bool = False,
             reuse: Path | None = None, results: Path | None = None, upstream_tests: bool = False) -> dict:
    """Build (or, with ``reuse``, take the interpreter's installed pyggml for) one spec and
    run the tests, the parity sweep and the probes on it: the spec's row of the matrix.
    With ``results`` as well, the tests and the sweep already run with that interpreter
    stand for the spec's own (see ``reused_results``)."""
    kind, arg = parse_spec(spec)
    _, isa = split_isa(spec)
    out = workdir / spec_dirname(spec)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    step = Step(out / "log.txt")
    row = empty_row(spec, out / "log.txt")
    t0 = time.perf_counter()
    venv = out / "venv"
    py = venv / "bin" / "python"
    env = clean_env()
    try:
        if reuse is not None:
            why = reusable(spec, reuse, step, env)
            if why:
                row["reuse_refused"] = why
                with step.log.open("a") as f:
                    f.write(f"ci_upstream: --reuse refused: {why}\n")
                return row
            row["reused"] = str(reuse)
            py = reuse
        elif step.run([sys.executable, "-m", "venv", venv]).returncode:
            return row
        if kind == "pypi":
            if step.run([py, "-m", "pip", "install", "--only-binary", ":all:", arg], env=env).returncode:
                return row
            prefix = step.run([py, "-c", "import libggml, os; print(os.path.dirname(libggml.__file__))"],
                              env=env, cwd=out).stdout.strip().splitlines()[-1]
            env.update(PYGGML_GGML="system", CMAKE_PREFIX_PATH=prefix)
        elif kind == "prefix":
            env.update(PYGGML_GGML="system", CMAKE_PREFIX_PATH=arg)
        elif kind == "src":
            env.update(PYGGML_GGML="vendored", PYGGML_GGML_SOURCE_DIR=arg)
        elif kind == "sdist":
            # the ggml tree of a registry sdist, pinned by sha256 in vendor/sdists/
            tree = out / "ggml-src"
            if step.run([sys.executable, ROOT / "scripts" / "vendor_ggml.py", "--dest", tree, "--sdist", arg],
                        env=env).returncode:
                return row
            row["ggml_tree"] = (tree / ".pyggml-source").read_text().strip()
            env.update(PYGGML_GGML="vendored", PYGGML_GGML_SOURCE_DIR=str(tree))
        elif kind == "patched":
            tree = out / "ggml-src"
            fetch = [sys.executable, ROOT / "scripts" / "vendor_ggml.py", "--dest", tree]
            if step.run(fetch + (["--from", arg] if arg else []), env=env).returncode:
                return row
            patch = step.run([sys.executable, ROOT / "scripts" / "patch_upstream.py", tree], env=env)
            row["patched"] = dict(line.split(": ", 1) for line in patch.stdout.splitlines() if ": " in line
                                  and not line.startswith("$"))
            if patch.returncode:
                return row
            env.update(PYGGML_GGML="vendored", PYGGML_GGML_SOURCE_DIR=str(tree))
        install = [py, "-m", "pip", "install", "-C", f"build-dir={out / 'build'}", f"{ROOT}[test]"]
        defines = build_defines(spec)
        for k, v in defines.items():
            install[4:4] = ["-C", f"cmake.define.{k}={v}"]
        # the backends asked for must be there, and their tests must run, not skip
        env["PYGGML_REQUIRE_BACKENDS"] = ",".join(b.upper() for b in split_backends(split_isa(spec)[0])[1])
        if reuse is None and step.run(install, env=env).returncode:
            return row
        info = step.run([py, "-c", "import json, pyggml; "
                         "print(json.dumps({**pyggml.build_info(), 'backends': pyggml.backends()}))"],
                        env=env, cwd=out)
        if info.returncode:
            return row
        build = json.loads(info.stdout.strip().splitlines()[-1])
        row["ggml_version"] = build["ggml_version"]
        row["ggml_source"] = build["ggml_source"]
        row["isa"] = isa or "native"
        row["backends"] = [d["name"] for d in build.get("backends", [])]
        row["kernels"] = build.get("kernels")        # the ops whose kernel the rules were not written against
        row["built"] = True
        pjson, npz = out / "parity.json", out / "parity.npz"
        if results is not None:
            got, why = reused_results(results, quick_parity, build)
            if why:
                row["reuse_refused"] = why
                with step.log.open("a") as f:
                    f.write(f"ci_upstream: --reuse-results refused: {why}\n")
                return row
            row.update(got, results_reused=str(results))
            shutil.copyfile(results / "parity.json", pjson)
            shutil.copyfile(results / "parity.npz", npz)
            with step.log.open("a") as f:
                f.write(f"ci_upstream: tests and sweep reused from {results}: {got['tests_summary']}\n")
        # the environment's pytest script, not `python -m pytest`: that would put ROOT (the
        # source tree, without the compiled modules) first on sys.path
        else:
            test_env = dict(env)
            if not build.get("openmp") and "PYGGML_NUM_THREADS" not in env:
                # a ggml without OpenMP spins at every barrier: pytest-xdist's workers, each
                # computing on every core by default, took turns wasting whole time slices
                # (0.17.0's suite: the digits classifier's training 9.5 s alone, 59 s beside
                # another worker). One thread by default; tests that ask for more get them.
                test_env["PYGGML_NUM_THREADS"] = "1"
                with step.log.open("a") as f:
                    f.write("ci_upstream: a ggml without OpenMP: the tests compute on 1 thread unless they "
                            "ask for more (PYGGML_NUM_THREADS=1)\n")
            tests = step.run([Path(py).parent / "pytest", "-q", "-p", "no:cacheprovider", *pytest_args],
                             env=test_env, cwd=ROOT)
            row["tests_ok"] = tests.returncode == 0
            row["tests_summary"] = (tests.stdout.strip().splitlines() or [""])[-1]
            row["release_refusals"] = release_refusals(tests.stdout)
            parity = step.run([py, "-m", "pyggml", "parity", *(["--quick"] if quick_parity else []), "--json",
                               pjson, "--save", npz], env=env, cwd=out)
            row["parity_ok"] = parity.returncode == 0
        if pjson.exists():
            doc = json.loads(pjson.read_text())
            row["worst_nmse"] = as_float(doc["summary"]["worst_nmse"])
            row["cpu_features"] = doc["meta"]["identity"]["cpu_features"]
            row["parity"] = parity_summary(doc["rows"])
            # a sweep whose every bad row is a finding recorded for that release (the same
            # record as its tests' strict xfails) passes, and says how many it holds
            n_bad, n_known = known_sweep_findings(doc["rows"], doc["meta"]["identity"].get("ggml_version"))
            if n_bad:
                row["parity"]["known_findings"] = n_known
                if n_known == n_bad and not doc["meta"].get("partial"):
                    row["parity_ok"] = True
            row["parity_json"], row["parity_npz"], row["python"] = str(pjson), str(npz), str(py)
        ops = step.run([py, "-c", OPS_PROBE], env=env, cwd=out)
        if ops.returncode == 0:
            probe = json.loads(ops.stdout.strip().splitlines()[-1])
            row["ops"] = probe["ops"]
            row["builders"] = probe["builders"]
            row["api"] = probe.get("api")           # every GGML_API function of its ggml.h
            row["defects"] = probe["defects"]
            row["known_defects"] = [f"{k}: {v}" for k, v in probe["defects"].items() if measures_defect(v)]
            if row.get("patched"):
                # the fixed defects must be gone: their probes measure nothing
                row["patch_ok"] = all(not measures_defect(probe["defects"].get(d)) for d in row["patched"])
        if upstream_tests:
            run_upstream_tests(row, kind, arg, out, py, step, env)
        return row
    finally:
        row["seconds"] = round(time.perf_counter() - t0, 1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ggml", action="append", metavar="SPEC",
                    help="vendored | pypi:libggml-python==X | sdist:PACKAGE==X | src:PATH | prefix:PATH | "
                         "patched:vendored | patched:src:PATH; a source build (vendored, sdist:, src:, patched:) "
                         "may add +BACKEND and @ISA (repeatable)")
    ap.add_argument("--json", metavar="PATH", help="write the matrix as JSON")
    ap.add_argument("--html", metavar="PATH", help="write the matrix as a self-contained HTML report")
    ap.add_argument("--workdir", type=Path, default=ROOT / "build" / "ci-upstream",
                    help="where the environments, builds and logs go")
    ap.add_argument("--pytest-args", default="", help="extra arguments for pytest (one string, split as a shell splits it: "
                         "-m 'not tooling' is two arguments)")
    ap.add_argument("--reuse", action="append", default=[], metavar="vendored=PYTHON",
                    help="run the vendored spec on the pyggml installed for interpreter PYTHON instead of "
                         "building it again (refused unless it is the plain vendored build of this checkout)")
    ap.add_argument("--reuse-results", type=Path, metavar="DIR",
                    help="with --reuse: the tests and the sweep already run with that interpreter stand for the "
                         "spec's own (DIR holds pytest's junit.xml and the sweep's parity.json and parity.npz)")
    ap.add_argument("--upstream-tests", action="append", default=[], metavar="SPEC",
                    help="also build upstream's test-backend-ops from that spec's ggml tree and run its CPU test "
                         "and grad modes beside pyggml's sweep (scripts/backend_ops.py); repeatable")
    ap.add_argument("--quick-parity", action="store_true", help="each spec runs pyggml parity --quick, not the full sweep")
    ap.add_argument("--bisect", metavar="src:PATH", help="bisect an upstream git checkout (with --good, --bad, --op)")
    ap.add_argument("--good", metavar="REV", help="--bisect: a revision where the op's result is as wanted")
    ap.add_argument("--bad", metavar="REV", help="--bisect: a later revision where it changed")
    ap.add_argument("--op", metavar="NAME|GLOB", help="--bisect: the subject whose result to follow")
    ap.add_argument("--bitwise", action="store_true", help="--bisect: any change of bits counts, not only beyond "
                                                           "tolerance")
    ap.add_argument("--bisect-test", metavar="CMD", help="--bisect: a shell command run in the tree at each "
                                                         "revision instead (exit 0 good, 1-124 bad, 125 skip)")
    ap.add_argument("--emit-matrix", choices=("specs", "shards"),
                    help="print a GitHub Actions job matrix (JSON, for fromJSON) and exit: one job per --ggml spec "
                         "(default: the default specs), or one per shard of the sweep (--shards)")
    ap.add_argument("--shards", type=int, default=4, help="--emit-matrix shards: how many (default 4)")
    ap.add_argument("--merge", nargs="+", type=Path, metavar="JSON",
                    help="join the --json matrices of jobs that each ran some specs into one (--json, --html) and "
                         "exit (no spec is run; cross-spec diffs need the specs' outputs in one workdir and are left "
                         "out)")
    ap.add_argument("--bisect-step", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--bisect-src", help=argparse.SUPPRESS)
    ap.add_argument("--bisect-baseline", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.workdir = args.workdir.resolve()       # the stages run in other folders
    if args.bisect_step or args.bisect:
        # (run as a script, this module is __main__: ci_bisect imports it as itself)
        sys.modules.setdefault("ci_upstream", sys.modules[__name__])
        from ci_bisect import bisect, bisect_step, git
    if args.bisect_step:
        return bisect_step(args.bisect_src, args.op, args.bisect_baseline, args.workdir, args.bitwise)
    if args.bisect:
        kind, src = parse_spec(args.bisect)
        if kind != "src" or not (args.good and args.bad and (args.op or args.bisect_test)):
            ap.error("--bisect src:PATH needs --good REV, --bad REV and --op NAME (or --bisect-test CMD)")
        if git(src, "rev-parse", "--git-dir", check=False).returncode:
            ap.error(f"--bisect: {src} is not a git checkout")
        commit, log = bisect(src, args.good, args.bad, args.op or "", args.bisect_test, args.workdir / "bisect",
                             args.bitwise)
        print(log.strip())
        if commit is None:
            print("\nci_upstream: --bisect found no first bad commit")
            return 1
        subject = git(src, "log", "-1", "--format=%h %ad %s", "--date=short", commit).stdout.strip()
        print(f"\nci_upstream: the first commit where {args.op or 'the test'} changed: {commit}\n  {subject}")
        return 0
    specs = distinct_specs(args.ggml or DEFAULT_SPECS)
    if args.emit_matrix:
        print(json.dumps(job_matrix(args.emit_matrix, specs, args.upstream_tests, args.shards)))
        return 0
    if args.merge:
        rows = []
        for path in args.merge:
            try:
                rows.extend(json.loads(path.read_text())["specs"])
            except (OSError, ValueError, KeyError) as e:
                ap.error(f"--merge {path}: not a matrix written by --json ({type(e).__name__}: {e})")
        names = [r["spec"] for r in rows]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            ap.error(f"--merge: {', '.join(twice)} in more than one report")
        return report(rows, args)
    reuse: dict[str, Path] = {}
    for item in args.reuse:
        name, eq, python = item.partition("=")
        if not eq or not python:
            ap.error(f"--reuse {item!r}: use --reuse vendored=PATH/TO/python")
        if normalise_spec(name) not in map(normalise_spec, specs):
            ap.error(f"--reuse {item!r}: {name} is not one of the --ggml specs")
        reuse[normalise_spec(name)] = Path(python).absolute()
    if args.reuse_results is not None and len(reuse) != 1:
        ap.error("--reuse-results DIR: give one --reuse vendored=PYTHON, the interpreter that made them")
    upstream_tests = {normalise_spec(s) for s in args.upstream_tests}
    if upstream_tests - set(map(normalise_spec, specs)):
        ap.error(f"--upstream-tests {sorted(upstream_tests - set(map(normalise_spec, specs)))}: not among the --ggml specs")
    args.workdir.mkdir(parents=True, exist_ok=True)
    rows = []
    for spec in specs:
        print(f"ci_upstream: {spec} ...", flush=True)
        reused = reuse.get(normalise_spec(spec))
        try:
            more = {"upstream_tests": True} if normalise_spec(spec) in upstream_tests else {}
            row = run_spec(spec, args.workdir, shlex.split(args.pytest_args), args.quick_parity, reused,
                           args.reuse_results.absolute() if reused and args.reuse_results else None, **more)
        except Exception as e:         # the spec fails; the report and the later specs still come
            row = {**empty_row(spec, args.workdir / spec_dirname(spec) / "log.txt"),
                   "error": f"{type(e).__name__}: {e}"}
            print(f"ci_upstream: {spec}: {row['error']}", flush=True)
        ok = spec_ok(row)
        print(f"ci_upstream: {spec}: ggml {row['ggml_version']}, {'ok' if ok else 'FAILED'} "
              f"in {row['seconds']} s (log: {row['log']})", flush=True)
        rows.append(row)
    diff_specs(rows, args.workdir)
    return report(rows, args)


def job_matrix(kind: str, specs: list[str], upstream_tests: list[str], shards: int) -> dict[str, Any]:
    """A GitHub Actions matrix: {"include": [{"spec", "name" (an artefact name), "upstream_tests"}]}
    per spec, or {"shard": [1..N], "of": [N]} for the sweep's shards."""
    if kind == "shards":
        if shards < 1:
            raise SystemExit("ci_upstream: --shards must be >= 1")
        return {"shard": list(range(1, shards + 1)), "of": [shards]}
    tests = {normalise_spec(s) for s in upstream_tests}
    return {"include": [{"spec": s, "name": re.sub(r"[^A-Za-z0-9._-]+", "-", s).strip("-"),
                         "upstream_tests": normalise_spec(s) in tests} for s in specs]}


def report(rows: list[dict], args: argparse.Namespace) -> int:
    """Print the matrix of ``rows`` (and write --json / --html); 1 when a spec failed."""
    items = timeline(rows)
    releases = sorted({r["ggml_version"] for r in rows if r.get("built") and r.get("isa") == "native"
                       and not r.get("patched")},
                      key=release_order)
    print()
    print(table(rows))
    print()
    print(op_changes(rows))
    print()
    print(disagreements(rows))
    print()
    print(format_timeline(items, releases))
    print()
    print(upstream_tests_report(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"specs": rows, "timeline": items}, indent=1))
    if args.html and write_html(rows, items, Path(args.html), args.workdir):
        print(f"\nci_upstream: wrote {args.html}")
    failed = [r["spec"] for r in rows if not spec_ok(r)]
    if failed:
        print(f"\nci_upstream: FAILED: {', '.join(failed)}")
        return 1
    print(f"\nci_upstream: all {len(rows)} passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
