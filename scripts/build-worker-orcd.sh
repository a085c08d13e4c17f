#!/usr/bin/env bash
# Builds the release worker-orcd with its CUDA kernels compiled at build time and embedded, so a
# new GPU host starts without compiling them (specs/CUDA.md, "Cold start"): NVRTC comes from the
# pinned PyPI wheel (scripts/requirements-nvrtc.txt, installed once into the asset cache), no
# CUDA toolkit is needed. LLORCH_CUDA_ARCHS picks the architectures (default
# sm_80,sm_86,sm_89,sm_90). Extra arguments go to cargo.
#
#   scripts/build-worker-orcd.sh [cargo flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
ASSETS=${LLORCH_ASSETS:-$HOME/.cache/llorch}
requirements=scripts/requirements-nvrtc.txt
dest=$ASSETS/python/nvrtc
if ! cmp -s "$requirements" "$dest/.requirements" 2>/dev/null; then
  echo "build-worker-orcd: installing NVRTC from PyPI into $dest" >&2
  rm -rf "$dest.tmp"
  python3 -m pip install --quiet --disable-pip-version-check --no-deps --only-binary :all: \
    --target "$dest.tmp" --requirement "$requirements"
  cp "$requirements" "$dest.tmp/.requirements"
  rm -rf "$dest"
  mv "$dest.tmp" "$dest"
fi
library=$(find "$dest/nvidia" -name 'libnvrtc.so.*' | head -1)
[[ -n "$library" ]] || { echo "build-worker-orcd: no libnvrtc.so in $dest" >&2; exit 1; }
# libnvrtc loads libnvrtc-builtins from its own folder.
export LLORCH_NVRTC=$library
export LD_LIBRARY_PATH="$(dirname "$library")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec cargo build --release --locked -p worker-orcd "$@"
