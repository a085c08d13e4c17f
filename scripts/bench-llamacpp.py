#!/usr/bin/env python3
"""Benchmark the llama.cpp peer (through llama-cpp-python) on prefill and decode throughput.

    python3 scripts/bench-llamacpp.py --model M --threads T --prompt-tokens P --gen-tokens G [--reps R]
    python3 scripts/bench-llamacpp.py --print-prompt   (the paragraph, for the other engine)

M is a model key (smollm2, qwen05, qwen15, gemma3), a file name in the models cache
(${LLORCH_ASSETS:-$HOME/.cache/llorch}/models, filled by `scripts/fetch-assets.sh models`) or a
path to a GGUF file. The context has n_ctx = P + G + 16, n_batch = P (so the prompt is one
llama_decode call; llama.cpp's default n_ubatch of 512 still applies inside it), n_threads and
n_threads_batch both T, use_mlock off, llama-cpp-python's other defaults (mmap on, KV cache f16,
flash attention off), CPU only.

  prefill: from an empty KV cache, evaluate a P-token prompt in one batch (logits of the last
           position only); tokens/s = P / seconds.
  decode:  after an 8-token prompt (not timed), G single-token evals, each feeding back the
           argmax of the previous logits (greedy; the argmax is timed too, as it would be in a
           server); tokens/s = G / seconds.

Each is run once untimed as a warm-up (weight repacking, graph allocation), then R times; the
best (max) tokens/s of the R runs is reported. The prompt is a fixed English paragraph repeated
and its token ids cut to P (with BOS first where the model's GGUF asks for one), so runs are
comparable across engines that use the same tokenizer.

Prints exactly one JSON line on stdout:

  {"engine":"llama.cpp","model":...,"threads":T,"prompt_tokens":P,"gen_tokens":G,
   "prefill_tok_s":x,"decode_tok_s":y}

Environment: see scripts/gen-tokenizer-fixtures.py (llama-cpp-python==0.3.36 wheel built with
GGML_NATIVE=OFF).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import time
from pathlib import Path

import numpy as np
import llama_cpp
from llorch_assets import MODELS, models_dir


PARAGRAPH = (
    "The history of computing is a story of layered abstractions. Early machines were "
    "programmed by rewiring panels and flipping switches; later, stored programs let the same "
    "hardware run many tasks, and assemblers, compilers and operating systems each hid a little "
    "more of the machine. Today a single sentence typed into a prompt passes through tokenizers, "
    "matrix multiplications and caches spread over billions of transistors, yet the question we "
    "ask of it is old: given what came before, what comes next? "
)

DECODE_PROMPT_TOKENS = 8


# Kept at module level: llama.cpp may call it for the life of the process.
_QUIET = llama_cpp.llama_log_callback(lambda *_: None)


def resolve_model(name: str) -> Path:
    assets = models_dir()
    for candidate in (assets / MODELS.get(name, name), Path(name)):
        if candidate.is_file():
            return candidate
    raise SystemExit(f"model {name!r} not found (keys: {list(MODELS)}; cache: {assets})")


def prompt_tokens(llm: llama_cpp.Llama, n: int) -> list[int]:
    add_bos = bool(llama_cpp.llama_vocab_get_add_bos(llama_cpp.llama_model_get_vocab(llm.model)))
    text = PARAGRAPH
    while True:
        ids = llm.tokenize(text.encode(), add_bos=add_bos, special=False)
        if len(ids) >= n:
            return ids[:n]
        text += PARAGRAPH


def last_argmax(llm: llama_cpp.Llama) -> int:
    ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return int(np.argmax(np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),))))


def prefill(llm: llama_cpp.Llama, ids: list[int]) -> float:
    llm.reset()  # the next eval drops the whole KV cache (seq_rm from position 0)
    t0 = time.perf_counter()
    llm.eval(ids)
    dt = time.perf_counter() - t0
    return len(ids) / dt


def decode(llm: llama_cpp.Llama, ids: list[int], n_gen: int) -> float:
    llm.reset()
    llm.eval(ids[:DECODE_PROMPT_TOKENS])
    t0 = time.perf_counter()
    for _ in range(n_gen):
        llm.eval([last_argmax(llm)])
    dt = time.perf_counter() - t0
    return n_gen / dt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    if sys.argv[1:] == ["--print-prompt"]:
        print(PARAGRAPH, end="")
        return
    parser.add_argument("--model", required=True, help=f"key ({', '.join(MODELS)}), file name or path")
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--prompt-tokens", type=int, required=True)
    parser.add_argument("--gen-tokens", type=int, required=True)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    if min(args.threads, args.prompt_tokens, args.gen_tokens, args.reps) < 1:
        parser.error("--threads, --prompt-tokens, --gen-tokens and --reps must be >= 1")

    path = resolve_model(args.model)
    llama_cpp.llama_log_set(_QUIET, ctypes.c_void_p(0))
    llm = llama_cpp.Llama(
        model_path=str(path),
        n_ctx=args.prompt_tokens + args.gen_tokens + 16,
        n_batch=args.prompt_tokens,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        use_mlock=False,
        n_gpu_layers=0,
        logits_all=False,
        seed=0,
        verbose=False,
    )
    ids = prompt_tokens(llm, args.prompt_tokens)

    prefill(llm, ids)  # warm-up
    decode(llm, ids, min(args.gen_tokens, 8))
    best_prefill = max(prefill(llm, ids) for _ in range(args.reps))
    best_decode = max(decode(llm, ids, args.gen_tokens) for _ in range(args.reps))

    print(
        json.dumps(
            {
                "engine": "llama.cpp",
                "model": path.name,
                "threads": args.threads,
                "prompt_tokens": args.prompt_tokens,
                "gen_tokens": args.gen_tokens,
                "prefill_tok_s": round(best_prefill, 2),
                "decode_tok_s": round(best_decode, 2),
            },
            separators=(",", ":"),
        )
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
