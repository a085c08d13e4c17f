#!/usr/bin/env bash
# CPU prefill and decode throughput, ours beside llama.cpp's (llama-cpp-python 0.3.36), same
# model, prompt, prompt length and thread count, alternating engines round by round in one
# command. Prints tokens/s (best of all rounds) and the ratio ours / llama.cpp.
#
#   scripts/bench-cpu.sh [model-key ...]      (default: smollm2 qwen05)
#
# Environment: THREADS (default "1 2"), PROMPT_TOKENS (128), GEN_TOKENS (64), ROUNDS (3),
# REPS (best of REPS per engine run, 3). Model keys: smollm2 qwen05 qwen15 gemma3.
# The peer needs llama-cpp-python==0.3.36 (see scripts/gen-tokenizer-fixtures.py).
set -euo pipefail
cd "$(dirname "$0")/.."
ASSETS="${LLORCH_ASSETS:-$HOME/.cache/llorch}"
THREADS="${THREADS:-1 2}"
PROMPT_TOKENS="${PROMPT_TOKENS:-128}"
GEN_TOKENS="${GEN_TOKENS:-64}"
ROUNDS="${ROUNDS:-3}"
REPS="${REPS:-3}"
models=("$@")
[[ ${#models[@]} -gt 0 ]] || models=(smollm2 qwen05)
declare -A files=(
  [smollm2]=SmolLM2-135M-Instruct.Q4_1.gguf
  [qwen05]=qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
  [qwen15]=qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
  [gemma3]=gemma-3-270m-q4_k_m.gguf
)
cargo build --release -q -p backend-cpu --example run_prompt
run_prompt="$(scripts/target-dir.sh)/release/examples/run_prompt"
prompt=$(python3 scripts/bench-llamacpp.py --print-prompt)
results=$(mktemp)
trap 'rm -f "$results"' EXIT
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)," \
  "$(nproc) CPUs; P=$PROMPT_TOKENS G=$GEN_TOKENS rounds=$ROUNDS reps=$REPS"
for key in "${models[@]}"; do
  model="$ASSETS/models/${files[$key]}"
  for threads in $THREADS; do
    for ((round = 1; round <= ROUNDS; round++)); do
      "$run_prompt" --model "$model" --threads "$threads" \
        --bench "$PROMPT_TOKENS" --max-tokens "$GEN_TOKENS" --reps "$REPS" --prompt "$prompt" \
        | tee -a "$results"
      python3 scripts/bench-llamacpp.py --model "$model" --threads "$threads" \
        --prompt-tokens "$PROMPT_TOKENS" --gen-tokens "$GEN_TOKENS" --reps "$REPS" \
        | tee -a "$results"
    done
  done
done
python3 - "$results" <<'PY'
import json, sys
best = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    key = (r["model"], r["threads"], r["engine"])
    b = best.setdefault(key, [0.0, 0.0])
    b[0] = max(b[0], r["prefill_tok_s"])
    b[1] = max(b[1], r["decode_tok_s"])
print("| model | threads | prefill ours | prefill llama.cpp | ratio | decode ours | decode llama.cpp | ratio |")
print("|---|---|---|---|---|---|---|---|")
for (model, threads, engine), ours in sorted(best.items()):
    if engine != "llorch":
        continue
    peer = best.get((model, threads, "llama.cpp"), [float("nan")] * 2)
    print(f"| {model} | {threads} | {ours[0]:.1f} | {peer[0]:.1f} | {ours[0] / peer[0]:.2f}x "
          f"| {ours[1]:.1f} | {peer[1]:.1f} | {ours[1] / peer[1]:.2f}x |")
PY
