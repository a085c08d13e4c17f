#!/usr/bin/env bash
# Regenerates the checked-in seed corpora under fuzz/corpus-seed/<target>/. Needs the SmolLM2 and Qwen2.5-Coder-0.5B assets
# (scripts/fetch-assets.sh). The seeds are committed, so a fuzz run does not need this script.
#
# gguf_parse: the mutation test's synthetic file, a 25 KiB cut-down SmolLM2, eight-level nested
# arrays, the first 4 KiB of the real SmolLM2, and a few tiny hand-made headers.
# tokenizer, chat_template, request: written by write-seeds.py.
set -euo pipefail

fuzz_dir="$(cd "$(dirname "$0")" && pwd)"
corpus="$fuzz_dir/corpus-seed/gguf_parse"
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

(cd "$fuzz_dir" && python3 write-seeds.py)

du -sb "$fuzz_dir"/corpus-seed/*
