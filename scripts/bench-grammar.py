#!/usr/bin/env python3
"""What a grammar's token mask costs the decode rate at batch 1: the same greedy job (N
generated tokens) without a grammar, with `logprobs` (the logits path a grammar also takes,
without the mask) and with a JSON-schema grammar that never lets the job end early, through
`/execute` on a real worker. Reports each median decode tok/s (from the `end` event) and the
ratios.

    scripts/bench-grammar.py --binary target/release/llorch-cpud --model <file.gguf> -- --threads 2
"""

import argparse
import hashlib
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from importlib import import_module  # noqa: E402

bench_http = import_module("bench-http")

# An endless array of objects with a free string and an integer: strings are where masks are
# widest (most of the vocabulary is allowed), numbers and punctuation where they are narrowest.
SCHEMA = {
    "type": "array",
    "minItems": 10000,
    "items": {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    },
}
PROMPT = "Here is a long JSON list of people with their names and ages:\n"


def decode_rate(host, port, tokens, extra):
    body = {"job_id": "bench-grammar", "prompt": PROMPT, "raw": True, "max_tokens": tokens,
            "temperature": 0, **extra}
    events, _ = bench_http.execute(host, port, body)
    end = events[-1]
    if end["tokens_out"] != tokens:
        sys.exit(f"the job ended after {end['tokens_out']} tokens: {end}")
    text = "".join(e.get("t", "") for e in events if e["type"] == "token")
    return (tokens - 1) / (end["decode_time_ms"] / 1e3), text


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("extra", nargs="*", help="worker flags (after --)")
    args = parser.parse_args()
    proc, host, port = bench_http.start(args.binary, args.model, args.extra)
    try:
        bench_http.wait_ready(host, port)
        modes = {
            "plain": {"ignore_eos": True},
            "logits": {"ignore_eos": True, "logprobs": 0},
            "grammar": {"grammar": {"type": "json_schema", "schema": SCHEMA}},
        }
        for extra in modes.values():
            decode_rate(host, port, 16, extra)
        rates = {name: [] for name in modes}
        texts = {name: set() for name in modes}
        for _ in range(args.reps):
            for name, extra in modes.items():
                rate, text = decode_rate(host, port, args.tokens, extra)
                rates[name].append(rate)
                texts[name].add(text)
        medians = {name: statistics.median(values) for name, values in rates.items()}
        for name, values in rates.items():
            shown = ", ".join(f"{v:.1f}" for v in values)
            print(f"{name:8} median {medians[name]:8.1f} tok/s   ({shown})")
        print(f"grammar / plain  {medians['grammar'] / medians['plain']:.3f}")
        print(f"grammar / logits {medians['grammar'] / medians['logits']:.3f}")
        # The same greedy output every time; its digest compares builds and backends.
        for name, seen in texts.items():
            digest = hashlib.sha256("".join(sorted(seen)).encode()).hexdigest()[:16]
            print(f"{name:8} output {digest} ({len(seen)} distinct)")
        print(f"grammar output starts {next(iter(texts['grammar']))[:60]!r}")
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()
