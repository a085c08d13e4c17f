#!/usr/bin/env bash
# CPU prefill and decode throughput, ours beside llama.cpp's llama-bench (build b11434), same model,
# prompt length, generated length and thread count, engines alternating round by round in one
# command, for every instruction-set level asked: our kernels under LLORCH_CPU_ISA=<isa> against
# llama.cpp built for the same level (scripts/build-peer-cpu.sh builds or reuses it).
# Prints tokens/s (best of all rounds) and the ratio ours / llama.cpp.
#
#   scripts/bench-cpu.sh [model-key ...]      (default: smollm2 qwen05)
#
# Environment: ISAS ("native", plus "avx2" where the CPU has AVX-512), THREADS ("1 2"),
# PROMPT_TOKENS (128), GEN_TOKENS (64), ROUNDS (3), REPS (best of REPS per engine run, 3).
# Model keys: smollm2 qwen05 qwen15 gemma3 (scripts/fetch-assets.sh models), or a .gguf file's
# path (e.g. a scripts/gen-synthetic-models.py file of a format the real models lack).
#
# Ours: backend-cpu's `run_prompt --bench` (prefill of P tokens in one forward; decode of G tokens
# after an 8-token prompt, greedy). Peer: `llama-bench -p P -n G -r REPS` (prefill from an empty
# cache; decode from an empty cache), its best repetition. "native" runs our best level against
# llama.cpp built with -march=native; "avx2" runs our AVX2 kernels against llama.cpp built for
# AVX2/FMA/F16C without AVX-512.
set -euo pipefail
cd "$(dirname "$0")/.."
ASSETS="${LLORCH_ASSETS:-$HOME/.cache/llorch}"
THREADS="${THREADS:-1 2}"
PROMPT_TOKENS="${PROMPT_TOKENS:-128}"
GEN_TOKENS="${GEN_TOKENS:-64}"
ROUNDS="${ROUNDS:-3}"
REPS="${REPS:-3}"
if [[ -z "${ISAS:-}" ]]; then
  ISAS=native
  grep -qw avx512f /proc/cpuinfo && ISAS="native avx2"
fi
models=("$@")
[[ ${#models[@]} -gt 0 ]] || models=(smollm2 qwen05)
declare -A files=(
  [smollm2]=SmolLM2-135M-Instruct.Q4_1.gguf
  [qwen05]=qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
  [qwen15]=qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
  [gemma3]=gemma-3-270m-q4_k_m.gguf
)
# The path of model `key`: a key above, or a .gguf file's path (a synthetic model, say).
model_path() {
  if [[ "$1" == *.gguf ]]; then echo "$1"; else echo "$ASSETS/models/${files[$1]}"; fi
}
for key in "${models[@]}"; do
  [[ "$key" == *.gguf || -n "${files[$key]:-}" ]] ||
    { echo "bench-cpu: unknown model key '$key' (a key, or a .gguf path)" >&2; exit 2; }
  [[ -f "$(model_path "$key")" ]] ||
    { echo "bench-cpu: $(model_path "$key") missing: scripts/fetch-assets.sh models" >&2; exit 2; }
done
cargo build --release -q -p backend-cpu --example run_prompt
run_prompt="$(scripts/target-dir.sh)/release/examples/run_prompt"
results=$(mktemp)
build_log=$(mktemp)
trap 'rm -f "$results" "$build_log"' EXIT
declare -A llama_bench
for isa in $ISAS; do
  # The build's chatter only when it fails.
  server=$(PEER_ISA="$isa" scripts/build-peer-cpu.sh 2>"$build_log" | tail -n1) ||
    { cat "$build_log" >&2; exit 1; }
  llama_bench[$isa]="$(dirname "$server")/llama-bench"
done
prompt=$(cat scripts/bench-prompt.txt)
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)," \
  "$(nproc) CPUs; ISAs: $ISAS; P=$PROMPT_TOKENS G=$GEN_TOKENS rounds=$ROUNDS reps=$REPS"
for isa in $ISAS; do
  ours_isa=""
  [[ "$isa" == native ]] || ours_isa="$isa"
  for key in "${models[@]}"; do
    model=$(model_path "$key")
    for threads in $THREADS; do
      for ((round = 1; round <= ROUNDS; round++)); do
        LLORCH_CPU_ISA="$ours_isa" "$run_prompt" --model "$model" --threads "$threads" \
          --bench "$PROMPT_TOKENS" --max-tokens "$GEN_TOKENS" --reps "$REPS" --prompt "$prompt" |
          python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); r["isa"]=sys.argv[1]; print(json.dumps(r))' "$isa" |
          tee -a "$results"
        "${llama_bench[$isa]}" -m "$model" -t "$threads" -p "$PROMPT_TOKENS" -n "$GEN_TOKENS" \
          -r "$REPS" -o jsonl 2>/dev/null |
          python3 -c '
import json, sys
isa, threads = sys.argv[1], int(sys.argv[2])
rates = {}
for line in sys.stdin:
    r = json.loads(line)
    kind = "prefill_tok_s" if r["n_prompt"] > 0 else "decode_tok_s"
    rates[kind] = round(max(r["samples_ts"]), 2)
name = sys.argv[3].rsplit("/", 1)[-1]
print(json.dumps({"engine": "llama.cpp", "model": name, "threads": threads, "isa": isa, **rates}))
' "$isa" "$threads" "$model" | tee -a "$results"
      done
    done
  done
done
python3 - "$results" <<'PY'
import json, sys
best = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    key = (r["isa"], r["model"], r["threads"], r["engine"])
    b = best.setdefault(key, [0.0, 0.0])
    b[0] = max(b[0], r["prefill_tok_s"])
    b[1] = max(b[1], r["decode_tok_s"])
print("| ISA | model | threads | prefill ours | prefill llama.cpp | ratio | decode ours | decode llama.cpp | ratio |")
print("|---|---|---|---|---|---|---|---|---|")
for (isa, model, threads, engine), ours in sorted(best.items()):
    if engine != "llorch":
        continue
    peer = best.get((isa, model, threads, "llama.cpp"), [float("nan")] * 2)
    print(f"| {isa} | {model} | {threads} | {ours[0]:.1f} | {peer[0]:.1f} | {ours[0] / peer[0]:.2f}x "
          f"| {ours[1]:.1f} | {peer[1]:.1f} | {ours[1] / peer[1]:.2f}x |")
PY
