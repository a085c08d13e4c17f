#!/usr/bin/env python3
"""The same generation streamed through /execute and through OpenAI's official SDK
(`client.completions.create(stream=True)` on /v1/completions and `client.chat.completions.create(
stream=True)` on /v1/chat/completions), alternated on one worker: does the OpenAI layer cost
streaming speed? Issue 39's "SDK stream vs /execute within noise".

    PYTHONPATH=${LLORCH_ASSETS:-$HOME/.cache/llorch}/python/sdk \\
        scripts/bench-sdk-stream.py --binary "$(scripts/target-dir.sh)/release/llorch-cpud" \\
        --model M.gguf [--tokens 128] [--reps 5] [--threads T] [-- extra worker flags]

The worker is started once (`--parallel 1`, port from its JSON `startup` line). Each rep runs
four jobs one after the other, in a rotating order, each generating `--tokens` tokens at
temperature 0 with `ignore_eos` (a /v1 extension field): /execute with the raw prompt and
/v1/completions with the same prompt; /execute with `raw: false` (the prompt rendered by the
chat template as one user message) and /v1/chat/completions with it as that user message, the
same tokens. Per run: time to first token, and the decode rate (tokens after the first over the
time from the first to the last). Prints the medians per route and each /v1 route's decode rate
over that of the /execute job with the same prompt. The SDK (`openai`, pinned in
scripts/requirements-sdk.txt, installed by `scripts/fetch-assets.sh python`) must be importable.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

PROMPT = "Write a Python function that returns the n-th Fibonacci number, then explain it."


def start_worker(binary: str, model: str, threads: int | None, extra: list[str]):
    """Starts the worker; returns (process, base URL) once /health answers 200."""
    cmd = [binary, "--model", model, "--host", "127.0.0.1", "--port", "0", "--parallel", "1"]
    if threads:
        cmd += ["--threads", str(threads)]
    proc = subprocess.Popen(cmd + extra, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    port = None
    assert proc.stdout is not None
    for line in proc.stdout:
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(entry, dict) and entry.get("event") == "startup":
            address = str(entry.get("address", ""))
            port = int(entry.get("port") or address.rsplit(":", 1)[1])
            break
    if port is None:
        sys.exit("bench-sdk-stream: the worker exited before saying its port")
    # Drain the logs so the worker never blocks on a full pipe.
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(base + "/health", timeout=5) as response:
                if response.status == 200:
                    return proc, base
        except OSError:
            pass
        time.sleep(0.5)
    proc.kill()
    sys.exit("bench-sdk-stream: /health did not answer 200 in 600 s")


def rates(stamps: list[float], sent: float) -> tuple[float, float]:
    """(time to first token in ms, decode tok/s after the first) of one run's token times."""
    if len(stamps) < 2:
        sys.exit(f"bench-sdk-stream: a run streamed {len(stamps)} tokens")
    return (stamps[0] - sent) * 1e3, (len(stamps) - 1) / (stamps[-1] - stamps[0])


def run_execute(base: str, tokens: int, tag: str, raw: bool = True) -> tuple[float, float]:
    body = {"job_id": f"bench-{tag}", "prompt": PROMPT, "raw": raw, "temperature": 0,
            "max_tokens": tokens, "ignore_eos": True}
    request = urllib.request.Request(base + "/execute", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    stamps = []
    sent = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as response:
        for line in response:
            if line.startswith(b"data: ") and b'"type":"token"' in line:
                stamps.append(time.perf_counter())
    return rates(stamps, sent)


def run_sdk(client, route: str, tokens: int) -> tuple[float, float]:
    extra = {"ignore_eos": True}
    stamps = []
    sent = time.perf_counter()
    if route == "completions":
        stream = client.completions.create(model="m", prompt=PROMPT, max_tokens=tokens,
                                           temperature=0, stream=True, extra_body=extra)
        for chunk in stream:
            if chunk.choices and chunk.choices[0].text:
                stamps.append(time.perf_counter())
    else:
        stream = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": PROMPT}], max_tokens=tokens,
            temperature=0, stream=True, extra_body=extra)
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                stamps.append(time.perf_counter())
    return rates(stamps, sent)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int)
    parser.add_argument("extra", nargs="*", help="extra worker flags (after --)")
    args = parser.parse_args()
    import openai  # the pinned SDK, on PYTHONPATH

    proc, base = start_worker(args.binary, args.model, args.threads, args.extra)
    try:
        client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0)
        run_execute(base, 8, "warm-up")
        routes = ["execute", "completions", "execute-chat", "chat"]
        results: dict[str, list[tuple[float, float]]] = {r: [] for r in routes}
        for rep in range(args.reps):
            order = routes[rep % 4:] + routes[:rep % 4]
            for route in order:
                if route.startswith("execute"):
                    raw = route == "execute"
                    results[route].append(run_execute(base, args.tokens, f"{route}-{rep}", raw))
                else:
                    results[route].append(run_sdk(client, route, args.tokens))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    print(f"# bench-sdk-stream\n\n- {args.model}, {args.tokens} tokens, {args.reps} reps, "
          f"temperature 0, ignore_eos\n")
    print("| route | TTFT p50 ms | decode tok/s p50 | min | max | vs /execute, same prompt |")
    print("|---|---:|---:|---:|---:|---:|")
    same_prompt = {"execute": "execute", "completions": "execute",
                   "execute-chat": "execute-chat", "chat": "execute-chat"}
    for route in routes:
        ttft = statistics.median(t for t, _ in results[route])
        decode = [r for _, r in results[route]]
        mid = statistics.median(decode)
        base_rate = statistics.median(r for _, r in results[same_prompt[route]])
        print(f"| {route} | {ttft:.1f} | {mid:.1f} | {min(decode):.1f} | {max(decode):.1f} | "
              f"{mid / base_rate:.3f} |")


if __name__ == "__main__":
    main()
