#!/usr/bin/env bash
# One command for a machine with an NVIDIA GPU: build pyggml with ggml's CUDA backend for the
# local GPU on every core, then run scripts/gpu_check.py's steps (the backend tests, the parity
# sweep's backend:CUDA0 path against float64, the examples guide's Llama block compared node by node
# with the CPU, flash attention against float64) and print one summary table; the report is
# OUT/gpu_check.json (OUT: --out, default gpu-check).
#
#   scripts/gpu_check.sh                     build (PYGGML_CUDA=ON, the GPU's arch), then check
#   scripts/gpu_check.sh --ggml-prefix DIR   build pyggml's modules only, against a ggml with the
#                                            CUDA backend installed in DIR (PYGGML_GGML=system)
#   scripts/gpu_check.sh --dry-run           the same steps with the CPU in place of the GPU
#                                            (no CUDA build): the script's own test, in .ci/run
#   scripts/gpu_check.sh --no-build ...      check the pyggml that PYTHON imports now
#
# Needs: PYTHON (default python3) with numpy, Cython, cython-cmake, scikit-build-core, pytest,
# pytest-xdist; CMake and ninja; for CUDA, nvcc and cuBLAS (a system CUDA, or the registry's
# toolkit: docs/site/guides/backends.md, "CUDA"); Python 3.11 or newer (python -P). pyggml is installed into
# build/gpu-check-site (pip --target), not into PYTHON's own site-packages, and its build folder
# is build/gpu-check (kept: a second run is incremental).
set -euo pipefail
cd "$(dirname "$0")/.."

dry=0 build=1 prefix="" arch="${PYGGML_CUDA_ARCH:-}" out="gpu-check" pass=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry=1 ;;
    --no-build) build=0 ;;
    --ggml-prefix) prefix="$(cd "$2" && pwd)"; shift ;;
    --arch) arch="$2"; shift ;;
    --out) out="$2"; shift ;;
    --quick|--only=*|--step-timeout=*|--device=*) pass+=("$1") ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
PY="${PYTHON:-python3}"
jobs="$(nproc)"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
start=$SECONDS

if [ "$build" = 1 ]; then
  site="$PWD/build/gpu-check-site"
  cfg=(-Cbuild-dir=build/gpu-check)
  if [ "$dry" = 0 ]; then
    export PYGGML_CUDA=ON
    if [ -z "$arch" ] && command -v nvidia-smi > /dev/null; then
      # "9.0" -> "90": the local GPU's compute capability, the one arch to build for
      arch="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d ' .')"
    fi
    cfg+=("-Ccmake.define.CMAKE_CUDA_ARCHITECTURES=${arch:-native}")
  fi
  if [ -n "$prefix" ]; then
    export PYGGML_GGML=system CMAKE_PREFIX_PATH="$prefix"
  fi
  echo "== build: ${PYGGML_GGML:-vendored} ggml${prefix:+ from $prefix}, CUDA ${PYGGML_CUDA:-OFF}${arch:+ (arch $arch)}, $jobs jobs -> $site"
  rm -rf "$site"
  CMAKE_BUILD_PARALLEL_LEVEL="$jobs" "$PY" -m pip install --no-build-isolation --no-deps --no-compile -q \
    --target "$site" "${cfg[@]}" . > "$out/build.log" 2>&1 ||
    { tail -n 40 "$out/build.log"; echo "gpu_check.sh: the build failed (log: $out/build.log)" >&2; exit 1; }
  echo "   built in $((SECONDS - start)) s"
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi

args=(--out "$out" --jobs "$jobs")
[ "$dry" = 1 ] && args+=(--dry-run)
exec "$PY" scripts/gpu_check.py "${args[@]}" "${pass[@]}"
