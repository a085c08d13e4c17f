#!/usr/bin/env bash
# Fills fuzz/corpus/gguf_parse (git-ignored) with seed files for the gguf_parse target:
# the mutation test's synthetic file, a 25 KiB cut-down SmolLM2, eight-level nested arrays,
# the first 4 KiB of the real SmolLM2, and a few tiny hand-made headers.
set -euo pipefail

fuzz_dir="$(cd "$(dirname "$0")" && pwd)"
corpus="$fuzz_dir/corpus/gguf_parse"
model="${LLORCH_ASSETS:-$HOME/.cache/llorch}/models/SmolLM2-135M-Instruct.Q4_1.gguf"
mkdir -p "$corpus"

(cd "$fuzz_dir/.." && GGUF_FUZZ_SEED_DIR="$corpus" cargo test -p llorch-tests \
    --test gguf_mutation write_fuzz_seeds -- --ignored --exact --quiet)

head -c 4096 "$model" > "$corpus/smollm2-head-4k.gguf"
# Magic and version only; then an empty file (no tensors, no metadata); then 2^60 tensors.
printf 'GGUF\x03\x00\x00\x00' > "$corpus/preamble.gguf"
printf 'GGUF\x03\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00' \
    > "$corpus/empty.gguf"
printf 'GGUF\x03\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x10' > "$corpus/2pow60-tensors.gguf"

ls -l "$corpus"
