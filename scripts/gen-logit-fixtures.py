#!/usr/bin/env python3
"""Generate the logit reference fixtures in tests/fixtures/logits/ with llama.cpp.

For each of our four models (tests/src/assets.rs) this loads the model through llama-cpp-python
(CPU, n_ctx 512, n_batch 512, n_threads 2, seed 0, logits_all, llama-cpp-python's defaults
otherwise: KV cache f16, flash attention off, mmap on) and builds a set of token sequences:

  raw prompts   the text tokenized by llama.cpp, `Llama.tokenize(text, add_bos=<the GGUF's
                tokenizer.ggml.add_bos_token>, special=True)`;
  chat prompts  one user message rendered with the GGUF's own tokenizer.chat_template by Python
                jinja2 (llama-cpp-python's Jinja2ChatFormatter: trim_blocks, lstrip_blocks,
                add_generation_prompt=True, bos_token/eos_token = the vocab's BOS/EOS texts; the
                same renderer as tests/fixtures/tokenizer/<key>.chat.json), then tokenized as
                above (special tokens parsed). gemma3 (a base model) has no template and gets
                more raw prompts instead.

Each prompt is extended with llama.cpp's own greedy continuation up to TOTAL_TOKENS (80)
positions: the prompt is evaluated in one batch, then repeatedly the argmax of the last logits
(lowest id on ties) is appended and evaluated as a single token. The continuation is not stopped
at end-of-generation tokens: the prompts are chosen so that none is reached, and the generator
fails if one is (change the prompt then). Then the KV cache is cleared and the whole sequence is
evaluated again in ONE llama_decode call with logits for every position, and for every position i
the top-20 (token id, logit) pairs of the logits after tokens[0..=i] are stored, sorted by logit
descending (ties by id ascending), logits rounded to 4 decimals. So top[i][0][0] is the batch
argmax prediction for tokens[i+1].

Batch and one-token evaluation are not bit-identical in llama.cpp, and the differences are
amplified layer by layer by the Q8 re-quantization of activations: (1) with flash attention off
(as here) the attention results part once 3-4 keys are attended (SmolLM2, Q4_1: with flash
attention on, its one-token and batch logits were bit-identical); (2) for the Q4_K_M models
(qwen, gemma3) the repacked Q4_K kernels treat rows in blocks of 4 differently from leftover rows
and single tokens, so even the last (prompt_len mod 4) prompt positions differ between the
prompt-only batch and the whole-sequence batch. The spread is 0.3-0.9 logits (median of the
per-position max over the vocab) and up to ~3 on gemma3. "inc_abs_diff" records it per position,
and where the batch argmax differs from the greedy token the position is listed in
"batch_argmax_mismatch" (near-ties only: top-2 margin < 0.3 in the files as generated).

Output: tests/fixtures/logits/<model file stem>.json, e.g. SmolLM2-135M-Instruct.Q4_1.json.
File layout (keys sorted; one line per position under "top"):

  generator, llama_cpp_python, llama_cpp_system_info, jinja2, model, model_sha256, date (UTC),
  n_ctx, n_batch, n_ubatch, n_threads, n_threads_batch, seed, flash_attn, type_k, type_v,
  n_gpu_layers, n_vocab, add_bos, bos_id, eos_id, chat_template (bool), chat_renderer,
  top_k (20), logit_decimals (4), total_tokens (80),
  sequences: [ { name, mode ("raw" | "chat"), text (the prompt text as tokenized: the rendered
                 template for chat), messages (chat only), prompt_len, tokens (all ids,
                 prompt then greedy), greedy_text (the continuation's token pieces concatenated,
                 special tokens rendered, invalid UTF-8 replaced by U+FFFD),
                 batch_argmax_mismatch ([i, ...]: positions i >= prompt_len-1 where
                 top[i][0][0] != tokens[i+1]), inc_abs_diff (per position, max over the vocab of
                 |incremental logits - batch logits|, where "incremental" is the greedy run: the
                 prompt in one batch, then one token at a time; llama.cpp's own spread, see
                 above), top ([[[id, logit] x 20] per position]) } ]

Model keys: smollm2, qwen05, qwen15, gemma3. Models come from `scripts/fetch-assets.sh models`
(cache: ${LLORCH_ASSETS:-$HOME/.cache/llorch}/models). Environment: see
scripts/gen-tokenizer-fixtures.py (llama-cpp-python==0.3.36 wheel built with GGML_NATIVE=OFF,
then `pip install -r scripts/requirements-fixtures.txt`).

    python3 scripts/gen-logit-fixtures.py [--models DIR] [--out DIR] [key ...]

Prints per model: sequences, positions, smallest and median top-2 margin (batch logits), and the
greedy text of each sequence on stderr.
"""

from __future__ import annotations

import ctypes
import datetime
import hashlib
import json
import sys
from pathlib import Path

import jinja2
import llama_cpp
import numpy as np
from llama_cpp.llama_chat_format import Jinja2ChatFormatter
from llorch_assets import MODELS, REPO, fixture_args


N_CTX = 512
N_BATCH = 512
N_UBATCH = 512
N_THREADS = 2
SEED = 0
TOP_K = 20
DECIMALS = 4
TOTAL_TOKENS = 80

# (name, text). "capital_france" must stay first: the SmolLM2 smoke check reads it.
RAW_PROMPTS: list[tuple[str, str]] = [
    ("capital_france", "The capital of France is"),
    (
        "paragraph",
        "The old lighthouse stood at the edge of the cliff, its paint peeling in the salt wind. "
        "Every evening the keeper climbed the spiral stairs, trimmed the wick and watched the "
        "ships pass far below.",
    ),
    ("code_fibonacci", 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'),
    (
        "multilingual",
        "Greetings around the world 🌍:\n- English: Hello 👋\n- Chinese: 你好\n- French: Bonjour\n"
        "- Russian: Привет\n-",
    ),
]

# More raw prompts for models without a chat template (gemma3).
EXTRA_RAW_PROMPTS: list[tuple[str, str]] = [
    ("story", "Once upon a time, in a small village at the foot of the mountains,"),
    ("qa_arithmetic", "Question: What is 12 multiplied by 7?\nAnswer:"),
    ("markdown_list", "# Shopping list\n\n- apples\n- bread\n-"),
    (
        "code_rust",
        "use std::collections::HashMap;\n\nfn main() {\n    let text = \"the quick brown fox jumps over the lazy dog the end\";\n",
    ),
]

# (name, user message): long-answer questions, so no end-of-turn token within TOTAL_TOKENS.
CHAT_PROMPTS: list[tuple[str, str]] = [
    ("chat_sky", "Explain in a few sentences why the sky is blue."),
    (
        "chat_palindrome",
        "Write a Python palindrome check is_palindrome(s), then explain it step by step.",
    ),
    ("chat_chinese", "请用中文详细介绍一下长城的历史。"),
]


# Kept at module level: llama.cpp calls it for the life of the process.
_QUIET = llama_cpp.llama_log_callback(lambda *_: None)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def piece(vocab, token: int) -> bytes:
    buf = ctypes.create_string_buffer(256)
    n = llama_cpp.llama_token_to_piece(vocab, token, buf, 256, 0, True)
    if n < 0:
        raise RuntimeError(f"token_to_piece({token}): needs {-n} bytes")
    return buf.raw[:n]


def meta(model, key: str) -> str | None:
    buf = ctypes.create_string_buffer(1 << 20)
    n = llama_cpp.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    return None if n < 0 else buf.raw[:n].decode()


class Runner:
    def __init__(self, path: Path):
        self.llm = llama_cpp.Llama(
            model_path=str(path),
            n_ctx=N_CTX,
            n_batch=N_BATCH,
            n_ubatch=N_UBATCH,
            n_threads=N_THREADS,
            n_threads_batch=N_THREADS,
            n_gpu_layers=0,
            seed=SEED,
            logits_all=True,
            verbose=False,
        )
        self.vocab = llama_cpp.llama_model_get_vocab(self.llm.model)
        self.n_vocab = self.llm.n_vocab()
        self.add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self.vocab))
        self.eog = {t for t in range(self.n_vocab) if llama_cpp.llama_vocab_is_eog(self.vocab, t)}

    def clear(self) -> None:
        self.llm.reset()
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self.llm.ctx), True)

    def tokenize(self, text: str) -> list[int]:
        return self.llm.tokenize(text.encode(), add_bos=self.add_bos, special=True)

    def greedy(self, prompt: list[int], total: int) -> tuple[list[int], np.ndarray]:
        """Prompt in one batch, then argmax-and-feed one token at a time up to `total` tokens.

        Returns the tokens and the logits of every position as this incremental evaluation saw
        them (the last token is fed too, so its logits exist)."""
        self.clear()
        self.llm.eval(prompt)
        tokens = list(prompt)
        while len(tokens) < total:
            logits = self.llm.scores[self.llm.n_tokens - 1]
            tok = int(np.argmax(logits))  # first (lowest id) maximum
            tokens.append(tok)
            self.llm.eval([tok])
        assert self.llm.n_tokens == len(tokens)
        return tokens, np.array(self.llm.scores[: len(tokens)], dtype=np.float32, copy=True)

    def batch_logits(self, tokens: list[int]) -> np.ndarray:
        """Logits of every position from one llama_decode of the whole sequence."""
        assert len(tokens) <= N_BATCH
        self.clear()
        self.llm.eval(tokens)
        assert self.llm.n_tokens == len(tokens)
        return np.array(self.llm.scores[: len(tokens)], dtype=np.float32, copy=True)


def top_k(row: np.ndarray, k: int) -> list[tuple[int, float]]:
    idx = np.argpartition(-row, k)[:k]
    order = sorted(idx.tolist(), key=lambda i: (-float(row[i]), i))
    return [(int(i), float(row[i])) for i in order]


def build_sequence(r: Runner, name: str, mode: str, text: str, messages=None) -> tuple[dict, list[float]]:
    prompt = r.tokenize(text)
    if len(prompt) >= TOTAL_TOKENS - 16:
        raise SystemExit(f"{name}: prompt of {len(prompt)} tokens leaves too little greedy room")
    tokens, inc_logits = r.greedy(prompt, TOTAL_TOKENS)
    cont = tokens[len(prompt):]
    hit = [i for i, t in enumerate(cont) if t in r.eog]
    if hit:
        text = b"".join(piece(r.vocab, t) for t in cont).decode("utf-8", errors="replace")
        raise SystemExit(
            f"{name}: the greedy continuation reaches end-of-generation tokens at {hit} "
            f"({text!r}); change the prompt"
        )
    logits = r.batch_logits(tokens)
    inc_diff = np.abs(inc_logits - logits).max(axis=1)
    top = [top_k(row, TOP_K) for row in logits]
    margins = [t[0][1] - t[1][1] for t in top]
    mismatch = [i for i in range(len(prompt) - 1, len(tokens) - 1) if top[i][0][0] != tokens[i + 1]]
    seq = {
        "name": name,
        "mode": mode,
        "text": text,
        "prompt_len": len(prompt),
        "tokens": tokens,
        "greedy_text": b"".join(piece(r.vocab, t) for t in cont).decode("utf-8", errors="replace"),
        "batch_argmax_mismatch": mismatch,
        "inc_abs_diff": [round(float(x), DECIMALS) for x in inc_diff],
        "top": [[[i, round(v, DECIMALS)] for i, v in t] for t in top],
    }
    if messages is not None:
        seq["messages"] = messages
    return seq, margins


def compact(value) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def write_fixture(path: Path, doc: dict) -> int:
    """Sorted keys, one line per header field, per sequence field and per position."""
    lines = ["{"]
    keys = sorted(doc)
    for n, k in enumerate(keys):
        comma = "," if n + 1 < len(keys) else ""
        if k != "sequences":
            lines.append(f" {json.dumps(k)}: {compact(doc[k])}{comma}")
            continue
        lines.append(f' "sequences": [')
        for s_n, seq in enumerate(doc[k]):
            lines.append("  {")
            skeys = sorted(seq)
            for m, sk in enumerate(skeys):
                scomma = "," if m + 1 < len(skeys) else ""
                if sk != "top":
                    lines.append(f"   {json.dumps(sk)}: {compact(seq[sk])}{scomma}")
                    continue
                lines.append('   "top": [')
                rows = seq[sk]
                for p, row in enumerate(rows):
                    lines.append("    " + compact(row) + ("," if p + 1 < len(rows) else ""))
                lines.append("   ]" + scomma)
            lines.append("  }" + ("," if s_n + 1 < len(doc[k]) else ""))
        lines.append(" ]" + comma)
    lines.append("}")
    text = "\n".join(lines) + "\n"
    json.loads(text)  # self-check
    path.write_text(text, encoding="utf-8")
    return len(text.encode())


def fixture(key: str, path: Path) -> tuple[dict, list[float], list[float]]:
    r = Runner(path)
    model = r.llm.model
    template = meta(model, "tokenizer.chat_template")
    bos = llama_cpp.llama_vocab_bos(r.vocab)
    eos = llama_cpp.llama_vocab_eos(r.vocab)
    none = llama_cpp.LLAMA_TOKEN_NULL
    bos_text = "" if bos == none else piece(r.vocab, bos).decode()
    eos_text = "" if eos == none else piece(r.vocab, eos).decode()
    cp = r.llm.context_params

    sequences: list[dict] = []
    all_margins: list[float] = []
    greedy_margins: list[float] = []

    def add(seq: dict, margins: list[float]) -> None:
        sequences.append(seq)
        all_margins.extend(margins)
        greedy_margins.extend(margins[seq["prompt_len"] - 1 : -1])
        print(
            f"  {seq['name']:<16} {seq['mode']:<4} prompt {seq['prompt_len']:>3} "
            f"inc-diff max {max(seq['inc_abs_diff']):.3f} "
            f"mismatch {[(i, round(margins[i], 4)) for i in seq['batch_argmax_mismatch']]} "
            f"greedy {seq['greedy_text']!r}",
            file=sys.stderr,
        )

    raw = RAW_PROMPTS + (EXTRA_RAW_PROMPTS if template is None else [])
    for name, text in raw:
        add(*build_sequence(r, name, "raw", text))
    if template is not None:
        for name, user in CHAT_PROMPTS:
            messages = [{"role": "user", "content": user}]
            rendered = Jinja2ChatFormatter(
                template=template, eos_token=eos_text, bos_token=bos_text, add_generation_prompt=True
            )(messages=[dict(m) for m in messages]).prompt
            add(*build_sequence(r, name, "chat", rendered, messages))

    doc = {
        "generator": "scripts/gen-logit-fixtures.py",
        "llama_cpp_python": llama_cpp.__version__,
        "llama_cpp_system_info": llama_cpp.llama_print_system_info().decode().strip(),
        "jinja2": jinja2.__version__,
        "model": MODELS[key],
        "model_sha256": sha256(path),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "n_ctx": N_CTX,
        "n_batch": int(cp.n_batch),
        "n_ubatch": int(cp.n_ubatch),
        "n_threads": int(cp.n_threads),
        "n_threads_batch": int(cp.n_threads_batch),
        "seed": SEED,
        "flash_attn": {-1: "auto", 0: "disabled", 1: "enabled"}[int(cp.flash_attn_type)],
        "type_k": {0: "f32", 1: "f16"}.get(int(cp.type_k), int(cp.type_k)),
        "type_v": {0: "f32", 1: "f16"}.get(int(cp.type_v), int(cp.type_v)),
        "n_gpu_layers": 0,
        "n_vocab": r.n_vocab,
        "add_bos": r.add_bos,
        "bos_id": None if bos == none else int(bos),
        "eos_id": None if eos == none else int(eos),
        "chat_template": template is not None,
        "chat_renderer": "llama_cpp.llama_chat_format.Jinja2ChatFormatter (Python jinja2, trim_blocks, "
        "lstrip_blocks, add_generation_prompt=True, bos_token/eos_token = vocab BOS/EOS texts)",
        "top_k": TOP_K,
        "logit_decimals": DECIMALS,
        "total_tokens": TOTAL_TOKENS,
        "sequences": sequences,
    }
    r.llm.close()
    return doc, all_margins, greedy_margins


def main() -> None:
    args = fixture_args(__doc__.split("\n\n")[0], "logits")

    llama_cpp.llama_log_set(_QUIET, ctypes.c_void_p(0))
    args.out.mkdir(parents=True, exist_ok=True)
    for key in args.keys:
        path = args.models / MODELS[key]
        if not path.exists():
            raise SystemExit(f"{path} is missing; run scripts/fetch-assets.sh {key}")
        print(f"{key}: {path.name}", file=sys.stderr)
        doc, margins, greedy_margins = fixture(key, path)
        out = args.out / f"{Path(MODELS[key]).stem}.json"
        size = write_fixture(out, doc)
        seqs = doc["sequences"]
        positions = sum(len(s["tokens"]) for s in seqs)
        mism = sum(len(s["batch_argmax_mismatch"]) for s in seqs)
        print(
            f"{key}: {out.relative_to(REPO) if out.is_relative_to(REPO) else out} {size} bytes, "
            f"{len(seqs)} sequences, {positions} positions, top-2 margin min {min(margins):.4f} "
            f"median {float(np.median(margins)):.4f} (greedy positions: min {min(greedy_margins):.4f} "
            f"median {float(np.median(greedy_margins)):.4f}), batch-argmax/greedy mismatches {mism}"
        )
        if key == "smollm2":
            s = seqs[0]
            assert s["name"] == "capital_france" and len(s["tokens"]) - s["prompt_len"] >= 20
            print(f"smollm2 greedy 'The capital of France is' -> {s['greedy_text']!r}")


if __name__ == "__main__":
    main()
