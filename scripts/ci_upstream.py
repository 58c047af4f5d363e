#!/usr/bin/env python3
"""Build pyggml against several ggml releases and run the same checks on each.

Each ``--ggml SPEC`` gets its own virtual environment and build directory:

``vendored``
    the pinned release (vendor/ggml.lock), built from source into the extension;
``pypi:libggml-python==X``
    the prebuilt ggml shared libraries of that registry package, installed into
    the environment and found with ``find_package(ggml CONFIG)``;
``src:PATH``
    an upstream source tree (for example a git checkout of master), built from source;
``prefix:PATH``
    an installed ggml (``PATH/lib*/cmake/ggml``), linked as a system library.

For each: install pyggml with its test extra, read the ggml version the built
module reports, run the test suite and ``python -m pyggml parity --quick``.
Prints the matrix and, per spec, the ops and builders its ggml has that the first
spec's does not (or lacks), and the measurements of the defect registry's probes;
writes ``--json PATH`` (a list of ``{"spec", "ggml_version", "built", "tests_ok",
"parity_ok", "ops", "builders", "defects", ...}``); exits non-zero if anything failed.
With no ``--ggml``: vendored plus three prebuilt releases.

Run: ``python scripts/ci_upstream.py [--ggml SPEC ...] [--json matrix.json]``
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SPECS = ["vendored", "pypi:libggml-python==0.9.4", "pypi:libggml-python==0.13.1",
                 "pypi:libggml-python==0.17.0"]


# what the built pyggml says about the linked ggml: its ops (op_coverage), the
# builders of the table it binds, and the defect registry's probes
OPS_PROBE = """
import json, pyggml, pyggml.coverage, pyggml.defects
print(json.dumps({"ops": pyggml.op_coverage(), "builders": pyggml.coverage.builder_coverage(),
                  "defects": {k: v for k, v in pyggml.defects.probe_all().items() if v is not None}}))
"""


def slug(spec: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", spec).strip("-")


def parse_spec(spec: str) -> tuple[str, str]:
    kind, _, arg = spec.partition(":")
    if kind == "vendored" and not arg:
        return kind, ""
    if kind == "pypi" and arg.startswith("libggml-python=="):
        return kind, arg
    if kind in ("src", "prefix") and arg:
        path = Path(arg).expanduser().resolve()
        if not path.is_dir():
            raise SystemExit(f"ci_upstream: {spec}: {path} is not a directory")
        return kind, str(path)
    raise SystemExit(f"ci_upstream: bad --ggml {spec!r}: use vendored, pypi:libggml-python==X, src:PATH or prefix:PATH")


class Step:
    """Runs commands, appending their output to one log file per spec."""

    def __init__(self, log: Path):
        self.log = log
        log.write_text("")

    def run(self, cmd, env=None, cwd=None, timeout=1800) -> subprocess.CompletedProcess:
        with self.log.open("a") as f:
            f.write(f"\n$ {' '.join(map(str, cmd))}\n")
            f.flush()
            proc = subprocess.run([str(c) for c in cmd], env=env, cwd=cwd, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, timeout=timeout)
            f.write(proc.stdout)
            f.write(f"[exit {proc.returncode}]\n")
        return proc


def clean_env() -> dict[str, str]:
    env = dict(os.environ)
    for var in ("PYGGML_GGML", "PYGGML_GGML_SOURCE_DIR", "CMAKE_PREFIX_PATH", "VIRTUAL_ENV", "PYTHONPATH"):
        env.pop(var, None)
    return env


def run_spec(spec: str, workdir: Path, pytest_args: list[str]) -> dict:
    kind, arg = parse_spec(spec)
    out = workdir / slug(spec)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    step = Step(out / "log.txt")
    row: dict[str, Any] = {"spec": spec, "ggml_version": None, "built": False, "tests_ok": False, "parity_ok": False,
           "worst_nmse": None, "known_defects": [], "seconds": 0.0, "log": str(out / "log.txt")}
    t0 = time.perf_counter()
    venv = out / "venv"
    py = venv / "bin" / "python"
    env = clean_env()
    try:
        if step.run([sys.executable, "-m", "venv", venv]).returncode:
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
        install = [py, "-m", "pip", "install", "-C", f"build-dir={out / 'build'}", f"{ROOT}[test]"]
        if step.run(install, env=env).returncode:
            return row
        info = step.run([py, "-c", "import json, pyggml; print(json.dumps(pyggml.build_info()))"],
                        env=env, cwd=out)
        if info.returncode:
            return row
        build = json.loads(info.stdout.strip().splitlines()[-1])
        row["ggml_version"] = build["ggml_version"]
        row["ggml_source"] = build["ggml_source"]
        row["built"] = True
        tests = step.run([venv / "bin" / "pytest", "-q", "-p", "no:cacheprovider", *pytest_args],
                         env=env, cwd=ROOT)
        row["tests_ok"] = tests.returncode == 0
        row["tests_summary"] = (tests.stdout.strip().splitlines() or [""])[-1]
        pjson = out / "parity.json"
        parity = step.run([py, "-m", "pyggml", "parity", "--quick", "--json", pjson], env=env, cwd=out)
        row["parity_ok"] = parity.returncode == 0
        if pjson.exists():
            doc = json.loads(pjson.read_text())
            row["worst_nmse"] = doc["worst_nmse"]
        ops = step.run([py, "-c", OPS_PROBE], env=env, cwd=out)
        if ops.returncode == 0:
            probe = json.loads(ops.stdout.strip().splitlines()[-1])
            row["ops"] = probe["ops"]
            row["builders"] = probe["builders"]
            row["defects"] = probe["defects"]
            row["known_defects"] = [f"{k}: {v}" for k, v in probe["defects"].items() if v]
        return row
    finally:
        row["seconds"] = round(time.perf_counter() - t0, 1)


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
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ggml", action="append", metavar="SPEC",
                    help="vendored | pypi:libggml-python==X | src:PATH | prefix:PATH (repeatable)")
    ap.add_argument("--json", metavar="PATH", help="write the matrix as JSON")
    ap.add_argument("--workdir", type=Path, default=ROOT / "build" / "ci-upstream",
                    help="where the environments, builds and logs go")
    ap.add_argument("--pytest-args", default="", help="extra arguments for pytest (one string)")
    args = ap.parse_args(argv)
    specs = args.ggml or DEFAULT_SPECS
    for spec in specs:
        parse_spec(spec)
    args.workdir.mkdir(parents=True, exist_ok=True)
    rows = []
    for spec in specs:
        print(f"ci_upstream: {spec} ...", flush=True)
        row = run_spec(spec, args.workdir, args.pytest_args.split())
        ok = row["built"] and row["tests_ok"] and row["parity_ok"]
        print(f"ci_upstream: {spec}: ggml {row['ggml_version']}, {'ok' if ok else 'FAILED'} "
              f"in {row['seconds']} s (log: {row['log']})", flush=True)
        rows.append(row)
    print()
    print(table(rows))
    print()
    print(op_changes(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    failed = [r["spec"] for r in rows if not (r["built"] and r["tests_ok"] and r["parity_ok"])]
    if failed:
        print(f"\nci_upstream: FAILED: {', '.join(failed)}")
        return 1
    print(f"\nci_upstream: all {len(rows)} passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
