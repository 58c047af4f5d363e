"""Build step: transpile several Cython modules in one Python process.

Run by pyggml/CMakeLists.txt (never imported by pyggml at run time):

    python _cythonize.py --depfile OUT.dep -I DIR ... MODULE=PYX=OUT.c ...

Why not one ``cython`` process per module (cython-cmake's ``cython_transpile``): each
process pays Cython's start-up (importing the compiler, loading its utility code) again.
Measured on a Zen 3 for pyggml's 13 generated op modules: 23.8 s of CPU time one process
each, 6.9 s in one process, with byte-identical C.

So that one batch does not do, or make, work for every module: a module is transpiled only
when one of its inputs is newer than its record of them (``out.c.inputs``), and its C file
is replaced only when its content changed (Ninja's ``restat``, which CMake sets on custom
commands, then skips the compiles of the unchanged ones). An edited row of ops.txt
transpiles and recompiles one module. The depfile names every ``.pyx``/``.pxd``/``.pxi``
any module of the batch reads, for its first output.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence

# The directives every pyggml module is transpiled with (a module's own header names only
# language_level). binding=False: functions and methods are CPython's own builtin
# functions and method descriptors, not Cython's function type, whose code each module
# otherwise carries and compiles; embedsignature in the "clinic" format gives each its
# __text_signature__, so inspect.signature() and help() still show the parameters.
# Measured on a Zen 3 (gcc -O2, one module's C alone): _core 22.5 -> 17.9 CPU-s,
# _ops_math 3.39 -> 2.86.
DIRECTIVES = {"binding": False, "embedsignature": True, "embedsignature.format": "clinic"}


def _deps_of(depfile: str) -> list[str]:
    """The dependencies in a depfile Cython wrote (``target: dep dep ...``), absolute."""
    with open(depfile, encoding="utf-8") as f:
        text = f.read().replace("\\\n", " ")
    deps = re.split(r"(?<!\\)\s+", text.partition(": ")[2].strip())
    return [os.path.abspath(d.replace("\\ ", " ")) for d in deps if d]


def transpile(jobs: list[tuple[str, str, str]], include: list[str], depfile: str | None,
              under: Sequence[str] = (), inputs: Sequence[str] = ()) -> int:
    """Transpile each (module, pyx, out.c); the number of modules that failed.

    The depfile lists only dependencies below one of the folders ``under`` (all, if none):
    Cython's and numpy's own .pxd files lie in pip's build environment, a new temporary
    folder for each ``pip install``, and a dependency that no longer exists would make
    Ninja transpile again every time. (The build stamps Cython's and numpy's versions in
    one of ``inputs``, files every module depends on.)

    Ninja runs the batch when any module's input changed; a module whose inputs are all
    older than its record (``out.c.inputs``, written when it was last transpiled) is not
    transpiled again: an edited row of ops.txt transpiles one module, not thirteen.
    """
    roots = tuple(os.path.join(os.path.abspath(u), "") for u in under)
    extra = [os.path.abspath(i) for i in inputs]
    base = None
    deps: dict[str, None] = {}
    failed = 0
    for module, pyx, out in jobs:
        record = out + ".inputs"
        mine = _up_to_date(out, record)
        if mine is None:
            if base is None:
                from Cython.Compiler.Main import CompilationOptions, compile_single, default_options
                base = CompilationOptions(default_options, include_path=include, depfile=True,
                                          compiler_directives=DIRECTIVES)
            tmp = f"{out}.new.c"
            result = compile_single(os.path.abspath(pyx), CompilationOptions(base, output_file=tmp),
                                    full_module_name=module)
            if result.num_errors:
                failed += 1
                for path in (tmp, tmp + ".dep", record):
                    if os.path.exists(path):
                        os.remove(path)
                continue
            mine = [d for d in _deps_of(tmp + ".dep") if not roots or d.startswith(roots)]
            mine = list(dict.fromkeys([os.path.abspath(pyx), *mine, *extra]))
            os.remove(tmp + ".dep")
            _replace_if_changed(tmp, out)
            with open(record, "w", encoding="utf-8") as f:
                f.write("".join(f"{m}\n" for m in mine))
        deps.update(dict.fromkeys(mine))
    if depfile and not failed:
        with open(depfile, "w", encoding="utf-8") as f:
            paths = " \\\n  ".join(p.replace(" ", "\\ ") for p in deps)
            f.write(f"{os.path.abspath(jobs[0][2])}: \\\n  {paths}\n")
    return failed


def _up_to_date(out: str, record: str) -> list[str] | None:
    """The inputs ``record`` lists, when ``out`` and ``record`` exist and every input is
    there and older than the record; else None (transpile)."""
    try:
        stamp = os.stat(record).st_mtime_ns
        os.stat(out)
        with open(record, encoding="utf-8") as f:
            mine = f.read().splitlines()
        if all(os.stat(m).st_mtime_ns <= stamp for m in mine):
            return mine
    except OSError:
        pass
    return None


def _replace_if_changed(new: str, out: str) -> None:
    """Move new to out, unless out has the same bytes (then out keeps its time stamp)."""
    try:
        with open(new, "rb") as a, open(out, "rb") as b:
            same = a.read() == b.read()
    except FileNotFoundError:
        same = False
    if same:
        os.remove(new)
    else:
        os.replace(new, out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-I", dest="include", action="append", default=[], help="a .pxd search folder")
    ap.add_argument("--depfile", help="write the batch's dependencies here (for its first output)")
    ap.add_argument("--deps-under", dest="under", action="append", default=[],
                    help="list in the depfile only the dependencies below this folder")
    ap.add_argument("--input", dest="inputs", action="append", default=[],
                    help="a file every module depends on (Cython's version stamp, this script)")
    ap.add_argument("jobs", nargs="+", metavar="MODULE=PYX=OUT", help="dotted module name, .pyx, .c")
    args = ap.parse_args(argv)
    jobs = []
    for job in args.jobs:
        parts = job.split("=")
        if len(parts) != 3:
            ap.error(f"{job!r}: expected MODULE=PYX=OUT")
        jobs.append((parts[0], parts[1], parts[2]))
    failed = transpile(jobs, args.include, args.depfile, args.under, args.inputs)
    if failed:
        print(f"_cythonize: {failed} of {len(jobs)} modules failed", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
