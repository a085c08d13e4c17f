#!/usr/bin/env bash
# Long-prompt CPU prefill, ours beside llama.cpp's native llama-bench (scripts/build-peer-cpu.sh),
# same model, prompt length and threads, alternating engines round by round in one command.
# Prints prompt tokens/s (best of the rounds) and the ratio ours / llama.cpp.
#
#   scripts/bench-long-prompt.sh [model-key ...]     (default: smollm2)
#
# Environment: PROMPT_TOKENS (5000), THREADS ("1 2"), ROUNDS (2). Model keys: smollm2 qwen05.
set -euo pipefail
cd "$(dirname "$0")/.."
ASSETS="${LLORCH_ASSETS:-$HOME/.cache/llorch}"
PROMPT_TOKENS="${PROMPT_TOKENS:-5000}"
THREADS="${THREADS:-1 2}"
ROUNDS="${ROUNDS:-2}"
models=("$@")
[[ ${#models[@]} -gt 0 ]] || models=(smollm2)
declare -A files=(
  [smollm2]=SmolLM2-135M-Instruct.Q4_1.gguf
  [qwen05]=qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
)
cargo build --release -q -p backend-cpu --example run_prompt
run_prompt="$(scripts/target-dir.sh)/release/examples/run_prompt"
llama_bench="$(dirname "$(scripts/build-peer-cpu.sh | tail -1)")/llama-bench"
prompt="The history of the city begins with a small settlement on the river, where traders met to exchange salt, grain and cloth. "
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)," \
  "$(nproc) CPUs, $(grep -q avx512_vnni /proc/cpuinfo && echo AVX-512 VNNI || echo AVX2); P=$PROMPT_TOKENS rounds=$ROUNDS"
echo "| model | threads | ours tok/s | llama.cpp tok/s | ours / llama.cpp |"
echo "|---|---|---|---|---|"
for key in "${models[@]}"; do
  model="$ASSETS/models/${files[$key]}"
  for threads in $THREADS; do
    ours=0 peer=0
    for ((round = 1; round <= ROUNDS; round++)); do
      o=$("$run_prompt" --model "$model" --threads "$threads" --bench "$PROMPT_TOKENS" \
        --max-tokens 1 --reps 1 --prompt "$prompt" | python3 -c 'import json,sys; print(json.load(sys.stdin)["prefill_tok_s"])')
      p=$("$llama_bench" -m "$model" -t "$threads" -p "$PROMPT_TOKENS" -n 0 -r 1 -o json \
        | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["avg_ts"])')
      ours=$(python3 -c "print(max($ours, $o))")
      peer=$(python3 -c "print(max($peer, $p))")
    done
    ratio=$(python3 -c "print(f'{$ours / $peer:.2f}')")
    echo "| ${files[$key]} | $threads | $ours | $peer | $ratio |"
  done
done
