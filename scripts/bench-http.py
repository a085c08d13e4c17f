#!/usr/bin/env python3
"""Measures a running worker through HTTP, as a client sees it: prefill tok/s (a 512-token
prompt), decode tok/s (128 generated tokens) and time to first token, printed beside the
llama.cpp anchors of ASSETS.md (H100, batch 1).

    scripts/bench-http.py --binary target/release/worker-orcd --model <file.gguf> [--reps 5]
    scripts/bench-http.py --binary target/release/llorch-cpud --model <file.gguf> -- --threads 2

It starts the binary on an ephemeral port (extra worker flags after `--`), reads the port from
the `startup` log line, waits for /health, runs one warm-up job, then `--reps` measured jobs of
each kind, and reports medians. Standard library only (it runs on the GPU host too).
"""

import argparse
import http.client
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

# llama.cpp b11434 on an H100 (ASSETS.md): decode tg128, prefill pp512, and llama-server's
# decode and prompt time through HTTP.
ANCHORS = {
    "SmolLM2-135M-Instruct.Q4_1.gguf": (913, 53000, 770, 1.4),
    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf": (843, 44000, 640, 1.8),
}


def start(binary, model, extra):
    proc = subprocess.Popen([binary, "--model", model, *extra], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("event") == "startup":
            host, port = record["address"].rsplit(":", 1)
            return proc, host, int(port)
    sys.exit(f"{binary} exited before listening (code {proc.wait()})")


def wait_ready(host, port, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            conn = http.client.HTTPConnection(host, port, timeout=5)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.05)
    sys.exit("the worker did not become ready")


def execute(host, port, body):
    """Runs one job; returns (events, seconds from sending to the first token event)."""
    conn = http.client.HTTPConnection(host, port, timeout=600)
    sent = time.perf_counter()
    conn.request("POST", "/execute", json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    if response.status != 200:
        sys.exit(f"/execute answered {response.status}: {response.read()[:500]!r}")
    events, first_token = [], None
    for raw in response:
        line = raw.decode().rstrip("\n")
        if not line.startswith("data: "):
            continue
        event = json.loads(line[6:])
        if event["type"] == "token" and first_token is None:
            first_token = time.perf_counter() - sent
        events.append(event)
        if event["type"] in ("end", "error"):
            break
    conn.close()
    if events[-1]["type"] != "end":
        sys.exit(f"job failed: {events[-1]}")
    return events, first_token


def prefill_prompt(host, port, target):
    """A raw prompt of `target` tokens: ' word' is one token in both vocabularies; calibrate."""
    words = target
    for _ in range(3):
        events, _ = execute(host, port, {"job_id": "calibrate", "prompt": "word " * words,
                                         "raw": True, "max_tokens": 1, "temperature": 0})
        got = events[0]["prompt_tokens"]
        if got == target:
            break
        words += target - got
    return "word " * words


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("worker_flags", nargs="*")
    args = parser.parse_args()
    proc, host, port = start(args.binary, args.model, args.worker_flags)
    try:
        wait_ready(host, port)
        prompt = prefill_prompt(host, port, 512)
        prefill_job = {"job_id": "prefill", "prompt": prompt, "raw": True, "max_tokens": 1,
                       "temperature": 0}
        # Greedy counting keeps going: 128 tokens without an end-of-generation token.
        decode_job = {"job_id": "decode", "prompt": "1, 2, 3, 4, 5,", "raw": True,
                      "max_tokens": 128, "temperature": 0}
        ttft_job = {"job_id": "ttft", "prompt": prefill_prompt(host, port, 32), "raw": True,
                    "max_tokens": 1, "temperature": 0}
        execute(host, port, prefill_job)
        execute(host, port, decode_job)
        # A pass shape is captured as a CUDA graph the second time it comes: warm up twice.
        for _ in range(2):
            execute(host, port, ttft_job)
        prefill, ttft_512, decode, client_decode, ttft_short = [], [], [], [], []
        ttft_32, ttft_32_server = [], []
        for _ in range(args.reps):
            events, first = execute(host, port, ttft_job)
            ttft_32.append(first * 1e3)
            ttft_32_server.append(events[-1]["time_to_first_token_ms"])
            events, first = execute(host, port, prefill_job)
            end = events[-1]
            prefill.append(events[0]["prompt_tokens"] / (end["prefill_time_ms"] / 1e3))
            ttft_512.append(first * 1e3)
            started = time.perf_counter()
            events, first = execute(host, port, decode_job)
            total = time.perf_counter() - started
            end = events[-1]
            decode.append(end["tokens_out"] / (end["decode_time_ms"] / 1e3))
            client_decode.append((end["tokens_out"] - 1) / (total - first))
            ttft_short.append(first * 1e3)
            short_tokens = events[0]["prompt_tokens"]
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    med = statistics.median
    name = Path(args.model).name
    anchor = ANCHORS.get(name)
    print(f"model: {name}  worker: {Path(args.binary).name} {' '.join(args.worker_flags)}  "
          f"reps: {args.reps} (medians)")
    print(f"  prefill 512 tokens (server prefill time): {med(prefill):10.0f} tok/s"
          + (f"   llama.cpp pp512 {anchor[1]:,} ({med(prefill) / anchor[1]:.2f}x)" if anchor else ""))
    print(f"  decode 128 tokens (server decode time):   {med(decode):10.1f} tok/s"
          + (f"   llama.cpp tg128 {anchor[0]} ({med(decode) / anchor[0]:.2f}x)" if anchor else ""))
    print(f"  decode 128 tokens (client, first→last):   {med(client_decode):10.1f} tok/s"
          + (f"   llama-server ≈{anchor[2]} ({med(client_decode) / anchor[2]:.2f}x)" if anchor else ""))
    print(f"  time to first token, {short_tokens}-token prompt:     {med(ttft_short):10.2f} ms"
          + (f"   llama-server prompt ≈{anchor[3]} ms" if anchor else ""))
    print(f"  time to first token, 512-token prompt:    {med(ttft_512):10.2f} ms")
    print(f"  time to first token, 32-token prompt:     {med(ttft_32):10.2f} ms client, "
          f"{med(ttft_32_server):.2f} ms server (end event)")


if __name__ == "__main__":
    main()
