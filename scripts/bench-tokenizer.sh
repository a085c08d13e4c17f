#!/usr/bin/env bash
# Tokenizer encode throughput, ours beside llama.cpp's (llama-cpp-python 0.3.36) on the same
# texts, in one command. Prints MB/s for each and the ratio.
#
#   scripts/bench-tokenizer.sh [model.gguf ...]   (default: SmolLM2, Qwen 0.5B, gemma-3-270m)
#
# The peer needs `pip install llama-cpp-python==0.3.36` (see scripts/gen-tokenizer-fixtures.py
# for building the wheel); without it only our numbers are printed.
set -euo pipefail
cd "$(dirname "$0")/.."
ASSETS="${LLORCH_ASSETS:-$HOME/.cache/llorch}"
models=("$@")
if [[ ${#models[@]} -eq 0 ]]; then
  models=("$ASSETS/models/SmolLM2-135M-Instruct.Q4_1.gguf"
          "$ASSETS/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
          "$ASSETS/models/gemma-3-270m-q4_k_m.gguf")
fi
cargo build --release -q -p worker-common --example tokenize_bench
tokenize_bench="$(scripts/target-dir.sh)/release/examples/tokenize_bench"
texts=$(mktemp -d)
trap 'rm -rf "$texts"' EXIT
for model in "${models[@]}"; do
  LLORCH_BENCH_TEXT_DIR="$texts" "$tokenize_bench" "$model" 5 | tee "$texts/ours.log"
  python3 - "$model" "$texts" <<'PY' || echo "peer: llama-cpp-python not available, skipped"
import re, sys, time
from pathlib import Path
import llama_cpp
model, texts = sys.argv[1], Path(sys.argv[2])
llm = llama_cpp.Llama(model_path=model, vocab_only=True, verbose=False)
ours = {}
for line in (texts / "ours.log").read_text().splitlines():
    m = re.search(r", (\S+): .* = ([0-9.]+) MB/s", line)
    if m:
        ours[m.group(1)] = float(m.group(2))
for label in ("mixed", "unique", "mixed-4MiB"):
    data = (texts / f"{label}.txt").read_bytes()
    best = min(
        (lambda t0: (llm.tokenize(data, add_bos=False, special=False), time.perf_counter() - t0)[1])(time.perf_counter())
        for _ in range(3)
    )
    peer = len(data) / 1e6 / best
    print(f"{Path(model).name}: {label}: llama.cpp {peer:.1f} MB/s, ours {ours.get(label, 0):.1f} MB/s, "
          f"ratio {ours.get(label, 0) / peer:.2f}x")
PY
done
