#!/usr/bin/env bash
# ggml's Vulkan backend without a GPU: built against Debian's Vulkan loader and glslc, run on
# Mesa's lavapipe (llvmpipe: a Vulkan device on the CPU), through scripts/gpu_check.py's steps
# with the device Vulkan0 (the backend tests, the parity sweep's backend:Vulkan0 path against
# float64, the examples guide's Llama block node by node against the CPU, flash attention). The report
# is OUT/gpu_check.json (OUT: --out, default vulkan-check). Results: docs/backends.md, "Vulkan".
#
#   scripts/vulkan_check.sh            install the Debian packages, build, check
#   scripts/vulkan_check.sh --no-deps  the packages are there already
#   scripts/vulkan_check.sh --quick    the sweep's --quick
#
# Debian 12 (this project's machines) ships Vulkan-Headers 1.3.239, which lack
# VK_EXT_layer_settings (vk::LayerSettingEXT, vk::LayerSettingsCreateInfoEXT), and
# ggml-vulkan.cpp of ggml 0.25.3 uses them in ggml_vk_instance_init: the build fails there. The
# script takes the headers of Debian 13's libvulkan-dev (1.4.309), checked against the hash
# below, into build/vulkan-headers (headers only: the loader stays Debian 12's) and points
# CMake's Vulkan_INCLUDE_DIR at them. lavapipe is a CPU-type device, which ggml-vulkan skips
# unless it is named: GGML_VK_VISIBLE_DEVICES=0.
#
# Needs: root for apt-get (or --no-deps), PYTHON (default python3) with numpy, Cython,
# cython-cmake, scikit-build-core, pytest, pytest-xdist; CMake and ninja; Python 3.11 or newer.
set -euo pipefail
cd "$(dirname "$0")/.."

deps=1 out="vulkan-check" pass=()
while [ $# -gt 0 ]; do
  case "$1" in
    --no-deps) deps=0 ;;
    --out) out="$2"; shift ;;
    --quick|--only=*|--step-timeout=*) pass+=("$1") ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "vulkan_check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
PY="${PYTHON:-python3}"
jobs="$(nproc)"
mkdir -p "$out" build
out="$(cd "$out" && pwd)"
start=$SECONDS

HEADERS_DEB="libvulkan-dev_1.4.309.0-1_amd64.deb"
HEADERS_SHA256="8d329d465e16168afff58b1bd0dd6db46aac2cc3f56054a481b25a04e90b345a"
headers="$PWD/build/vulkan-headers"

if [ "$deps" = 1 ]; then
  echo "== Debian's Vulkan loader, glslc and Mesa's lavapipe"
  apt-get install -y -q libvulkan-dev glslc mesa-vulkan-drivers > "$out/apt.log" 2>&1 ||
    { tail -n 20 "$out/apt.log"; exit 1; }
fi
if [ ! -f "$headers/usr/include/vulkan/vulkan.hpp" ]; then
  echo "== Debian 13's Vulkan headers (${HEADERS_DEB%%_amd64.deb}) into $headers"
  apt_dir="$PWD/build/vulkan-apt"
  mkdir -p "$apt_dir/lists/partial" "$apt_dir/archives/partial"
  echo "deb http://deb.debian.org/debian trixie main" > "$apt_dir/sources.list"
  apt_opts=(-o "Dir::Etc::sourcelist=$apt_dir/sources.list" -o Dir::Etc::sourceparts=/dev/null
            -o "Dir::State::lists=$apt_dir/lists" -o "Dir::Cache::archives=$apt_dir/archives")
  apt-get "${apt_opts[@]}" update > "$out/apt-headers.log" 2>&1
  (cd "$apt_dir" && apt-get "${apt_opts[@]}" download libvulkan-dev=1.4.309.0-1 >> "$out/apt-headers.log" 2>&1)
  echo "$HEADERS_SHA256  $apt_dir/$HEADERS_DEB" | sha256sum -c --quiet -
  rm -rf "$headers"
  dpkg -x "$apt_dir/$HEADERS_DEB" "$headers"
fi

site="$PWD/build/vulkan-check-site"
echo "== build: vendored ggml with PYGGML_VULKAN=ON, $jobs jobs -> $site"
rm -rf "$site"
PYGGML_VULKAN=ON CMAKE_BUILD_PARALLEL_LEVEL="$jobs" "$PY" -m pip install --no-build-isolation --no-deps --no-compile -q \
  --target "$site" -Cbuild-dir=build/vulkan-check \
  "-Ccmake.define.Vulkan_INCLUDE_DIR=$headers/usr/include" . > "$out/build.log" 2>&1 ||
  { tail -n 40 "$out/build.log"; echo "vulkan_check.sh: the build failed (log: $out/build.log)" >&2; exit 1; }
echo "   built in $((SECONDS - start)) s"
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
export GGML_VK_VISIBLE_DEVICES="${GGML_VK_VISIBLE_DEVICES:-0}"
# --isolate-steps: the Llama block's node-by-node comparison crashed once inside lavapipe
# (libvulkan_lvp.so, on a thread of its own; docs/backends.md), and passed on the next run
exec "$PY" scripts/gpu_check.py --device Vulkan0 --isolate-steps --out "$out" --jobs "$jobs" "${pass[@]}"
