"""The machine a measurement ran on, as the benchmark scripts and ``pyggml info`` name it:
the CPU's model (with its family and model numbers, which tell Zen 3 from Zen 4 where the
name is only "AMD EPYC") and the cores this process may use."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess


def cpu_model() -> str:
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break                               # the first processor's block
                k, _, v = line.partition(":")
                fields[k.strip()] = v.strip()
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or platform.machine() or "unknown CPU"
    if "cpu family" in fields and "model" in fields:
        name += f" (family {fields['cpu family']}, model {fields['model']})"
    return name


def usable_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def build_c_program(source: str, folder: str, name: str, include: str | None = None,
                    shared: bool = False) -> str | None:
    """``source`` (C) compiled in ``folder`` against the libggml pyggml loaded (with the
    headers in ``include``; by default the vendored ones of this checkout), for the
    benchmarks' C baselines and the shrunk reproducers: the executable's path (with
    ``shared``, a shared library ``name.so`` built with ``-DPYGGML_C_LIBRARY``, for
    ctypes), or None without a C compiler, the headers or the libraries."""
    import pyggml._core

    cc = shutil.which("cc") or shutil.which("gcc")
    libdir = os.path.dirname(pyggml._core.__file__)     # the compiled modules' folder (editable installs too)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    include = include or os.path.join(here, "vendor", "ggml", "include")
    if cc is None or not os.path.exists(os.path.join(include, "ggml.h")) or \
            not os.path.exists(os.path.join(libdir, "libggml.so")):
        return None
    src = os.path.join(folder, name + ".c")
    exe = os.path.join(folder, name + (".so" if shared else ""))
    with open(src, "w") as f:
        f.write(source)
    kind = ["-shared", "-fPIC", "-DPYGGML_C_LIBRARY"] if shared else []
    subprocess.run([cc, "-O2", *kind, src, "-o", exe, f"-I{include}", f"-L{libdir}", "-lggml", "-lggml-base",
                    "-lggml-cpu", "-lpthread", f"-Wl,-rpath,{libdir}"], check=True)
    return exe
