#!/usr/bin/env python3
"""Record llama.cpp's greedy continuations and top-20 log-probabilities on the synthetic models
(scripts/gen-synthetic-models.py) into tests/fixtures/synthetic/<model stem>.ctx<N>.json.

    python3 scripts/gen-synthetic-fixtures.py [--server .peer/cpu/build/bin/llama-server]
        [--models DIR] [--out DIR] [arch ...]

The reference is llama.cpp b11434's `llama-server` (scripts/build-peer-cpu.sh builds it), one
slot (`-np 1 -c N -t 2`, defaults otherwise), per model and context size: every model at 512,
phi3 also at 8192, beyond its original context of 4096, where llama.cpp takes the long RoPE
factors instead of the short ones. For each of the first 8 usable text prompts (a prompt
whose first generated token is an incomplete UTF-8 sequence comes back without its
probabilities, and is skipped): the prompt is tokenized by the
server (`/tokenize`, with the vocabulary's special tokens), then `/completion` generates 24
tokens greedily (`temperature` 0, `ignore_eos`, `cache_prompt` false) with `n_probs` 20: for
each generated token, the 20 most likely tokens and their log-probabilities, computed by the
server from the raw logits of that position (the prompt evaluated in one batch, then one token
at a time). A log-probability is the logit minus the position's log-sum-exp, so differences
between them are differences of logits.

File layout: generator, llama_cpp ("b11434"), server_args, model, model_sha256, n_ctx,
n_predict, top_k, sequences: [{text, prompt (ids), generated (ids), top ([[id, logprob] x 20]
per generated token, most likely first)}], tokenized: [{text, plain (ids: no BOS/EOS added, no
special token parsed), special (ids: both)}] for a fixed corpus of tokenizer corner cases.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ASSETS = Path(os.environ.get("LLORCH_ASSETS", Path.home() / ".cache" / "llorch"))
CONTEXTS = {"llama3": [512], "mxfp4": [512], "qwen3": [512], "phi3": [512, 8192], "gpt-oss": [512],
            "q3_k": [512], "iq4_xs": [512], "iq4_nl": [512], "iq3_s": [512], "q2_k": [512],
            "iq3_xxs": [512]}
N_PREDICT = 24
TOP_K = 20
PROMPTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time, in a land far away,",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "The capital of France is",
    "1, 2, 3, 4, 5, 6, 7,",
    "Water boils at 100 degrees Celsius at sea level, and",
    "In mathematics, a prime number is a natural number greater than 1 that",
    "Q: What is the largest planet in the solar system?\nA:",
    "She opened the door and saw",
    "import numpy as np\n\nx = np.",
    "The recipe calls for two cups of flour,",
    "Monday, Tuesday, Wednesday,",
    "The theory of relativity states that",
    "Dear Sir or Madam, I am writing to",
]
SEQUENCES = 8
# Texts whose ids under the model's tokenizer are recorded too (`tokenized`): case runs, marks,
# contractions, digits, whitespace and newline runs, slashes, non-Latin scripts, specials.
TOKENIZER_SAMPLES = [
    "Hello World",
    "HELLOworld helloWorld CamelCaseWords snake_case",
    "ÉCOLE normale, naïve café, Ünïcödé ÀBC",
    "I'm you're they'LL we'VE it's 'S 'Re don't STOP",
    "   leading spaces and trailing space ",
    "tabs\tand\nnewlines\n\n  \n  indented",
    "1234567 89 3.14159 1,000,000",
    "path/to/file.txt\n/ // comment\r\n!!!\n\n",
    "x = a+b; y -= 2*x;",
    "中文字符测试 日本語のテキスト 한국어",
    "ΑΒΓ αβγ Ωmega ǅungla",
    "e\u0301 combining, अनुच्छेद",
    "emoji 😀👍 test",
    "\u00a0nbsp\u3000ideographic\u2003em",
    "<|start|>user<|message|>hi<|end|><|start|>assistant",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port: int, route: str, body: dict) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{route}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.load(response)


def wait_ready(port: int, server: subprocess.Popen) -> None:
    deadline = time.time() + 120
    while time.time() < deadline:
        if server.poll() is not None:
            sys.exit(f"gen-synthetic-fixtures: llama-server exited with {server.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    sys.exit("gen-synthetic-fixtures: llama-server did not become ready in 120 s")


def sequence(port: int, text: str) -> dict | None:
    prompt = post(port, "/tokenize", {"content": text, "add_special": True})["tokens"]
    result = post(
        port,
        "/completion",
        {
            "prompt": prompt,
            "n_predict": N_PREDICT,
            "temperature": 0,
            "ignore_eos": True,
            "cache_prompt": False,
            "n_probs": TOP_K,
            "return_tokens": True,
        },
    )
    probs = result["completion_probabilities"]
    generated = [p["id"] for p in probs]
    if generated != result["tokens"] or len(generated) != N_PREDICT:
        # The server leaves out the probabilities of a token whose text is an incomplete UTF-8
        # sequence when the generation starts with it; such a prompt is skipped.
        return None
    top = [[[t["id"], round(t["logprob"], 5)] for t in p["top_logprobs"]] for p in probs]
    return {"text": text, "prompt": prompt, "generated": generated, "top": top}


def tokenized(port: int) -> list[dict]:
    """The ids of each tokenizer sample without specials (`plain`: none added, none parsed)
    and with them (`special`: BOS/EOS as the vocabulary adds them, special tokens parsed)."""
    def ids(text: str, special: bool) -> list[int]:
        body = {"content": text, "add_special": special, "parse_special": special}
        return post(port, "/tokenize", body)["tokens"]

    return [{"text": t, "plain": ids(t, False), "special": ids(t, True)} for t in TOKENIZER_SAMPLES]


def fixture(server_bin: Path, model: Path, n_ctx: int) -> dict:
    port = free_port()
    args = ["-np", "1", "-c", str(n_ctx), "-t", "2"]
    command = [str(server_bin), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), *args]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(port, server)
        sequences = []
        for text in PROMPTS:
            if len(sequences) < SEQUENCES and (seq := sequence(port, text)) is not None:
                sequences.append(seq)
        if len(sequences) < SEQUENCES:
            sys.exit(f"gen-synthetic-fixtures: {model.name}: only {len(sequences)} usable prompts")
        samples = tokenized(port)
    finally:
        server.terminate()
        server.wait(timeout=30)
    return {
        "generator": "scripts/gen-synthetic-fixtures.py",
        "llama_cpp": "b11434",
        "server_args": " ".join(args),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "model": model.name,
        "model_sha256": hashlib.sha256(model.read_bytes()).hexdigest(),
        "n_ctx": n_ctx,
        "n_predict": N_PREDICT,
        "top_k": TOP_K,
        "sequences": sequences,
        "tokenized": samples,
    }


def write(path: Path, data: dict) -> None:
    """Keys sorted, one line per generated token's top-k (reviewable diffs)."""
    lines = ["{"]
    items = sorted(data.items())
    for i, (key, value) in enumerate(items):
        comma = "," if i + 1 < len(items) else ""
        if key == "tokenized":
            lines.append('  "tokenized": [')
            samples = [f"    {json.dumps(sample, ensure_ascii=False)}" for sample in value]
            lines.append(",\n".join(samples))
            lines.append("  ]" + comma)
            continue
        if key != "sequences":
            lines.append(f"  {json.dumps(key)}: {json.dumps(value)}{comma}")
            continue
        lines.append('  "sequences": [')
        for j, seq in enumerate(value):
            lines.append("    {")
            for name in ("text", "prompt", "generated"):
                lines.append(f"      {json.dumps(name)}: {json.dumps(seq[name])},")
            lines.append('      "top": [')
            tops = [f"        {json.dumps(t)}" for t in seq["top"]]
            lines.append(",\n".join(tops))
            lines.append("      ]")
            lines.append("    }" + ("," if j + 1 < len(value) else ""))
        lines.append("  ]" + comma)
    lines.append("}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", type=Path, default=REPO / ".peer/cpu/build/bin/llama-server")
    parser.add_argument("--models", type=Path, default=ASSETS / "models" / "synthetic")
    parser.add_argument("--out", type=Path, default=REPO / "tests/fixtures/synthetic")
    parser.add_argument("archs", nargs="*", default=sorted(CONTEXTS))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for arch in args.archs:
        model = args.models / f"synthetic-{arch}.gguf"
        if not model.is_file():
            sys.exit(f"gen-synthetic-fixtures: {model} is missing; run scripts/gen-synthetic-models.py")
        for n_ctx in CONTEXTS[arch]:
            data = fixture(args.server, model, n_ctx)
            path = args.out / f"synthetic-{arch}.ctx{n_ctx}.json"
            write(path, data)
            margins = [s["top"][i][0][1] - s["top"][i][1][1] for s in data["sequences"] for i in range(N_PREDICT)]
            margins.sort()
            print(
                f"{path.name}: {len(margins)} positions, top-2 margin min {margins[0]:.3f} "
                f"median {margins[len(margins) // 2]:.3f}; first: {data['sequences'][0]['generated'][:8]}",
                file=sys.stderr,
            )


if __name__ == "__main__":
    main()
