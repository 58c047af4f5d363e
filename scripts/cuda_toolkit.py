#!/usr/bin/env python3
"""A CUDA toolkit from the package registry, for ``PYGGML_CUDA=ON`` on a machine with no
system CUDA: NVIDIA's wheels (nvcc, the runtime, CCCL, cuBLAS) installed into one folder,
which then has the layout of a toolkit (``nvidia/cu13/{bin,include,lib,nvvm}``) but for the
unversioned library names a linker looks for (``libcudart.so``, ``libcublas.so``) and the
``lib64`` folder nvcc links from: this script adds those as links, checks nvcc, and prints the command that builds pyggml with it.

    python scripts/cuda_toolkit.py build/cuda            # then run the command it prints

The versions are pinned (CUDA 13.0: its nvcc builds for Turing to Blackwell; a driver of
the 580 series or newer runs what it builds). Compiling needs no GPU; running does.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

WHEELS = ("nvidia-cuda-nvcc==13.0.88", "nvidia-cuda-runtime==13.0.96", "nvidia-cuda-cccl==13.0.85",
          "nvidia-cuda-crt==13.0.88", "nvidia-nvvm==13.0.88", "nvidia-cublas==13.0.2.14")
# what CMake's FindCUDAToolkit and ggml-cuda link: the unversioned names it searches for
LINKS = {"libcudart.so": "libcudart.so.13", "libcublas.so": "libcublas.so.13", "libcublasLt.so": "libcublasLt.so.13"}


def toolkit_root(dest: Path) -> Path:
    return dest / "nvidia" / "cu13"


def install(dest: Path, pip: list[str]) -> None:
    cmd = [*pip, "install", "--quiet", "--no-deps", "--upgrade", "--target", str(dest), *WHEELS]
    subprocess.run(cmd, check=True)


def link(root: Path) -> list[str]:
    """The unversioned links, made where missing; the names made."""
    lib = root / "lib"
    made = []
    if not (root / "lib64").exists():           # where nvcc.profile's -L looks (lib$(_TARGET_SIZE_))
        os.symlink("lib", root / "lib64")
        made.append("lib64")
    for name, target in LINKS.items():
        if not (lib / target).is_file():
            raise SystemExit(f"cuda_toolkit: {lib / target} is missing: is {root} a complete install?")
        if not (lib / name).exists():
            os.symlink(target, lib / name)
            made.append(name)
    return made


def check_nvcc(root: Path) -> str:
    out = subprocess.run([str(root / "bin" / "nvcc"), "--version"], check=True, capture_output=True, text=True).stdout
    return out.strip().splitlines()[-1]


def build_command(root: Path, arch: str) -> str:
    # GGML_CUDA_NO_VMM: ggml's default links the driver (libcuda) for its virtual-memory pool,
    # and the registry has no driver stub to link; ggml then pools with cudaMalloc
    return (f"CUDACXX={root}/bin/nvcc CUDAToolkit_ROOT={root} PYGGML_CUDA=ON "
            f"pip install . -Ccmake.define.CMAKE_CUDA_ARCHITECTURES={arch} -Ccmake.define.GGML_CUDA_NO_VMM=ON")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dest", help="the folder to install the toolkit into (e.g. build/cuda)")
    ap.add_argument("--arch", default="90", help="CMAKE_CUDA_ARCHITECTURES for the printed command "
                                                 "(90: H100/H200; 89: L4/RTX 40; 80: A100; native: this machine's GPU)")
    ap.add_argument("--no-install", action="store_true", help="only link and check an installed one")
    args = ap.parse_args(argv)
    dest = Path(args.dest).resolve()
    if not args.no_install:
        install(dest, [sys.executable, "-m", "pip"])
    root = toolkit_root(dest)
    made = link(root)
    print(f"toolkit: {root} ({check_nvcc(root)}){'; linked ' + ', '.join(made) if made else ''}")
    print(build_command(root, args.arch))
    return 0


if __name__ == "__main__":
    sys.exit(main())
