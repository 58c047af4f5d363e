#!/usr/bin/env python3
"""Build pyggml with AddressSanitizer and UndefinedBehaviorSanitizer, and run tests under them.

Everything compiled is instrumented: ggml (through its own GGML_SANITIZE_ADDRESS /
GGML_SANITIZE_UNDEFINED options) and pyggml's C runtime and Cython modules (through
CFLAGS/CXXFLAGS/LDFLAGS, which GGML_SANITIZE_* do not reach). The build goes into its
own virtual environment and build directory (default ``build/sanitize``); the tests
run with the ASan runtime preloaded (Python itself is not instrumented), leak
detection off (the interpreter keeps memory on purpose at exit), and any UBSan report
fatal. Context pools are poisoned except the bytes ggml's objects use
(pyggml/csrc/asan_hooks.h), so a kernel writing past the last tensor of a pool is a
report.

    python scripts/sanitize.py                     # build, then the default test subset
    python scripts/sanitize.py --tests tests/test_ops.py tests/test_graph.py
    python scripts/sanitize.py --no-build          # rerun the tests on the last build
    python scripts/sanitize.py --no-test           # the build only (CI builds it in the background)
    python scripts/sanitize.py -j 2                # the tests in two pytest-xdist workers

Exits non-zero if the build fails or any test (or sanitizer) fails.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# UBSan's checks stay recoverable in the code, so that the suppressions of known upstream UB
# (pyggml/defects.py, Defect.ubsan) apply; halt_on_error=1 makes every other report fatal
FLAGS = "-fsanitize=address,undefined -fno-omit-frame-pointer"
# the tests that exercise the C layer the most, in a few minutes under ASan
DEFAULT_TESTS = ["tests/test_ops.py", "tests/test_graph.py", "tests/test_tensor.py", "tests/test_context.py",
                 "tests/test_autodiff.py", "tests/test_flash_attn_back.py", "tests/test_quant.py",
                 "tests/test_reliability.py", "tests/test_rules_arith.py", "tests/test_sanitize.py",
                 "tests/test_opinfo.py", "tests/test_backend.py", "tests/test_backend_multi.py",
                 "tests/test_attention_blocked.py", "tests/test_backend_reliability.py", "tests/test_stateful.py",
                 "tests/test_gguf.py"]


def sh(cmd, **kw):
    print("+", " ".join(str(c) for c in cmd), flush=True)
    return subprocess.run(cmd, check=True, **kw)


def asan_runtime(cc: str) -> str:
    out = subprocess.run([cc, "-print-file-name=libasan.so"], capture_output=True, text=True, check=True)
    path = out.stdout.strip()
    if not os.path.isabs(path):
        raise SystemExit(f"sanitize: {cc} does not know libasan.so (install gcc's sanitizer runtimes)")
    return os.path.realpath(path)


def build(venv: Path, build_dir: Path) -> None:
    if not (venv / "bin" / "python").exists():
        sh([sys.executable, "-m", "venv", str(venv)])
    py = str(venv / "bin" / "python")
    sh([py, "-m", "pip", "install", "-q", "scikit-build-core", "cython>=3", "cython-cmake", "numpy", "pytest",
        "pytest-xdist", "hypothesis", "gguf", "ninja", "cmake"])
    env = dict(os.environ, CFLAGS=FLAGS, CXXFLAGS=FLAGS, LDFLAGS="-fsanitize=address,undefined")
    sh([py, "-m", "pip", "install", "--no-build-isolation", "-q", str(ROOT),
        f"-Cbuild-dir={build_dir}", "-Ccmake.build-type=RelWithDebInfo",
        "-Ccmake.define.GGML_SANITIZE_ADDRESS=ON", "-Ccmake.define.GGML_SANITIZE_UNDEFINED=ON",
        "-Ccmake.define.PYGGML_NATIVE=ON"], env=env)


def ubsan_suppressions() -> list[str]:
    """The UBSan suppressions of the known upstream defects (pyggml/defects.py, read from
    the source tree: it is plain Python and needs no build)."""
    spec = importlib.util.spec_from_file_location("pyggml_defects_for_sanitize", ROOT / "pyggml" / "defects.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod            # (dataclasses looks its module up while it runs)
    try:
        spec.loader.exec_module(mod)
    finally:
        del sys.modules[spec.name]
    return [line for d in mod.DEFECTS for line in d.ubsan]


def write_suppressions(venv: Path) -> Path:
    path = venv / "ubsan-suppressions.txt"
    path.write_text("# written by scripts/sanitize.py from pyggml/defects.py (Defect.ubsan)\n"
                    + "".join(f"{line}\n" for line in ubsan_suppressions()))
    return path


def test(venv: Path, tests: list[str], cc: str, jobs: int) -> int:
    env = dict(os.environ)
    env["LD_PRELOAD"] = asan_runtime(cc)
    # freed memory stays poisoned in a 1 GiB quarantine before ASan reuses it: a use after
    # free (a tensor left pointing into a released buffer) is a report, not a silent read
    env["ASAN_OPTIONS"] = ("detect_leaks=0:abort_on_error=1:allocator_may_return_null=1:"
                           "quarantine_size_mb=1024")
    env["UBSAN_OPTIONS"] = f"print_stacktrace=1:halt_on_error=1:suppressions={write_suppressions(venv)}"
    env["PYGGML_SANITIZED"] = "1"
    # the stateful fuzzers run 60 examples each in the plain test run; under ASan (5-10x
    # slower) fewer, so that the stage stays within its minutes
    env.setdefault("PYGGML_STATEFUL_EXAMPLES", "25")
    # pytest-xdist's workers are child processes: they inherit LD_PRELOAD and the options
    args = [str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=10",
            *(["-n", str(jobs)] if jobs > 1 else []), *[str(ROOT / t) for t in tests]]
    print("+ LD_PRELOAD=... " + " ".join(args), flush=True)
    return subprocess.run(args, env=env, cwd="/").returncode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--venv", type=Path, default=ROOT / "build" / "sanitize-venv")
    ap.add_argument("--build-dir", type=Path, default=ROOT / "build" / "sanitize")
    ap.add_argument("--tests", nargs="*", default=DEFAULT_TESTS)
    ap.add_argument("--no-build", action="store_true", help="run the tests on the last build")
    ap.add_argument("--no-test", action="store_true", help="build only")
    ap.add_argument("--jobs", "-j", type=int, default=1, metavar="N",
                    help="run the tests in N pytest-xdist workers (default 1: one process)")
    args = ap.parse_args()
    if args.no_build and args.no_test:
        ap.error("--no-build and --no-test leave nothing to do")
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise SystemExit("sanitize: no C compiler")
    t0 = time.perf_counter()
    if not args.no_build:
        build(args.venv, args.build_dir)
    if args.no_test:
        print(f"sanitize: built in {time.perf_counter() - t0:.0f} s")
        return 0
    rc = test(args.venv, args.tests, cc, args.jobs)
    print(f"sanitize: {'clean' if rc == 0 else 'FAILED'} ({time.perf_counter() - t0:.0f} s)")
    return rc


if __name__ == "__main__":
    sys.exit(main())
