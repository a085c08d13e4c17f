#!/usr/bin/env python3
"""Speculative decoding by prompt lookup, side by side with llama-server's, on "rewrite this
function with one change" prompts (greedy, the answer repeats most of the prompt):

    scripts/bench-spec.py --binary target/release/llorch-cpud --model M.gguf \\
        [--peer .peer/cpu/build/bin/llama-server] [--threads T] [--tokens 256] [--gpu] \\
        [--clients 16] [--draft-model D.gguf] [--json FILE] [--timeout 900]

Batch 1, for each prompt in turn: ours without speculation, ours with `--spec-ngram`, the peer
without, with `--spec-default` (its maintainers' recommended n-gram setting) and with
`--spec-type ngram-simple`; every job stops at the closing code fence (the rewritten function is
the answer). Decode tok/s = (generated tokens - 1) / (last token - first token).
Our two runs must give the same text (speculation is exact); the report says whether they do.
Then `--clients` clients at once (distinct prompts), ours without and with speculation:
aggregate tok/s = all generated tokens / wall time. /metrics gives the drafted and accepted
tokens. With `--draft-model D`: "write this function" code prompts of `--tokens` tokens
instead (no stop), ours without and with `--draft-model D`, the peer without and with `-md D`.
Reuses bench-concurrency.py's process and HTTP helpers. Standard library only.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import platform
import statistics
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SPEC_SIDE = "ours --spec-ngram"
_spec = importlib.util.spec_from_file_location("bench_concurrency", HERE / "bench-concurrency.py")
bc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bc)

FUNCTIONS = [
    ("total", "values", "returns the largest value instead of the sum",
     "    result = 0\n    for value in values:\n        if value is None:\n            continue\n"
     "        result = result + value\n    return result\n"),
    ("count_words", "text", "counts only words longer than three letters",
     "    counts = {}\n    for word in text.split():\n        word = word.strip('.,;:!?').lower()\n"
     "        if not word:\n            continue\n        counts[word] = counts.get(word, 0) + 1\n"
     "    return counts\n"),
    ("parse_line", "line", "also accepts a tab as the separator",
     "    parts = line.strip().split(',')\n    if len(parts) != 3:\n"
     "        raise ValueError(f'expected 3 fields, got {len(parts)}')\n"
     "    name, age, city = parts\n    return {'name': name.strip(), 'age': int(age),"
     " 'city': city.strip()}\n"),
]


WRITE = [
    "Write a Python function `merge_intervals(intervals)` that merges overlapping intervals, "
    "with a docstring, type hints and three doctest examples.",
    "Write a Python class `LRUCache` with `get` and `put` in O(1), using a dict and a doubly "
    "linked list, with comments.",
    "Write a Python function that parses a CSV file of orders (id, customer, amount, date) and "
    "returns the total amount per customer per month, with error handling.",
]


def write_prompt(index):
    return (f"{WRITE[index % len(WRITE)]}\n\n```python\n")


def job_prompt(args, index, salt=""):
    return write_prompt(index) if args.draft_model else rewrite_prompt(index, salt)


def rewrite_prompt(index, salt=""):
    name, arg, change, body = FUNCTIONS[index % len(FUNCTIONS)]
    name = f"{name}{salt}"
    return (f"Rewrite this Python function so that it {change}. Keep everything else the same."
            f"\n\n```python\ndef {name}({arg}):\n{body}```\n\nHere is the whole function with "
            f"that one change:\n\n```python\ndef {name}({arg}):\n")


def stream(port, path, body, deadline, text_of, end_of):
    """Sends one job; returns (text, token times, tokens, error)."""
    text, times, tokens = [], [], None
    conn = None
    try:
        conn, response, _ = bc.post(port, path, body, deadline)
        if response.status != 200:
            return "", [], 0, f"HTTP {response.status}: {response.read(300)!r}"
        for data in bc.sse_lines(response, deadline):
            if data == "[DONE]":
                break
            try:
                event = json.loads(data)
            except ValueError:
                continue
            piece = text_of(event)
            if piece:
                times.append(time.perf_counter())
                text.append(piece)
            done, tokens = end_of(event)
            if done:
                break
    except (OSError, bc.Abort) as e:
        return "".join(text), times, 0, f"{type(e).__name__}: {e}"
    finally:
        if conn is not None:
            conn.close()
    return "".join(text), times, tokens if tokens is not None else len(times), None


# The rewritten function ends at its code fence: the task's answer, not the prose after it
# (the draft-model task sets none: it writes `--tokens` tokens).
STOP = ["```"]


def ours_job(port, prompt, tokens, deadline, job_id):
    body = {"job_id": job_id, "prompt": prompt, "raw": True, "temperature": 0,
            "max_tokens": tokens, "stop": STOP}
    return stream(port, "/execute", body, deadline,
                  lambda e: e.get("t") if e.get("type") == "token" else None,
                  lambda e: (e.get("type") in ("end", "error"), e.get("tokens_out")))


def peer_job(port, prompt, tokens, deadline, job_id):
    del job_id
    body = {"prompt": prompt, "n_predict": tokens, "temperature": 0, "cache_prompt": False,
            "stream": True, "stop": STOP}
    return stream(port, "/completion", body, deadline,
                  lambda e: e.get("content"),
                  lambda e: (bool(e.get("stop")),
                             (e.get("timings") or {}).get("predicted_n")))


def decode_rate(times, tokens):
    if len(times) < 2 or tokens < 2:
        return None
    return (tokens - 1) / (times[-1] - times[0])


def metric(port, name):
    conn = bc.http.client.HTTPConnection(bc.HOST, port, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def start(argv, name, port, deadline, ours):
    server = bc.Server(argv, name)
    if ours:
        server.started.wait(timeout=300)
        startup = server.startup or {}
        address = startup.get("address", "")
        port = int(startup.get("port") or address.rsplit(":", 1)[-1] or 0)
    if not bc.wait_health(server, port, deadline):
        server.stop()
        raise SystemExit(f"{name} did not start:\n{server.output()}")
    return server, port


def ours_argv(args, spec, parallel):
    argv = [args.binary, "--model", args.model, "--host", bc.HOST, "--port", "0",
            "--parallel", str(parallel), "--ctx-size", "2048", "--queue-depth", "64"]
    if args.threads and not args.gpu:
        argv += ["--threads", str(args.threads)]
    if not spec:
        return argv
    return argv + (["--draft-model", args.draft_model] if args.draft_model else ["--spec-ngram"])


def peer_argv(args, port, extra):
    argv = [args.peer, "-m", args.model, "-np", "1", "-c", "2048", "--host", bc.HOST,
            "--port", str(port)]
    if args.threads and not args.gpu:
        argv += ["-t", str(args.threads)]
    if args.gpu:
        argv += ["-fa", "on", "-ngl", "99"]
    return argv + extra


def batch_one(args, deadline):
    """Rows of (side, prompt index, tokens, decode tok/s, text)."""
    sides = [("ours", False, []), (SPEC_SIDE, True, [])]
    if args.peer and args.draft_model:
        sides += [("llama-server", None, []),
                  ("llama-server -md", None, ["-md", args.draft_model])]
    elif args.peer:
        sides += [("llama-server", None, []), ("llama-server --spec-default", None,
                                                ["--spec-default"]),
                  ("llama-server --spec-type ngram-simple", None,
                   ["--spec-type", "ngram-simple"])]
    rows, counters = [], {}
    for name, spec, extra in sides:
        ours = spec is not None
        port = bc.free_port()
        argv = ours_argv(args, spec, 1) if ours else peer_argv(args, port, extra)
        server, port = start(argv, name, port, deadline, ours)
        try:
            job = ours_job if ours else peer_job
            job(port, "Warm-up: say hello.", 8, deadline, "warm")
            for i in range(len(FUNCTIONS)):
                text, times, tokens, error = job(port, job_prompt(args, i), args.tokens,
                                                 deadline, f"p{i}")
                rows.append((name, i, tokens, decode_rate(times, tokens), text, error))
            if spec:
                counters = {k: metric(port, f"worker_spec_{k}_tokens_total")
                            for k in ("draft", "accepted")}
        finally:
            server.stop()
    return rows, counters


def together(args, spec, deadline):
    """Aggregate tok/s of `--clients` clients at once, ours, with or without speculation."""
    n = args.clients
    server, port = start(ours_argv(args, spec, n), "ours", 0, deadline, True)
    try:
        ours_job(port, "Warm-up: say hello.", 8, deadline, "warm")
        results = [None] * n
        barrier = threading.Barrier(n + 1)

        def client(i):
            barrier.wait(timeout=60)
            results[i] = ours_job(port, job_prompt(args, i, f"_{i}"), args.tokens, deadline,
                                  f"c{i}")

        released = bc.release_together(client, n, barrier, deadline)
        wall = max(r[1][-1] for r in results if r and r[1]) - released
        tokens = sum(r[2] for r in results if r)
        texts = [r[0] for r in results]
    finally:
        server.stop()
    return tokens / wall, texts


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--binary", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--peer")
    p.add_argument("--threads", type=int)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--gpu", action="store_true")
    p.add_argument("--draft-model")
    p.add_argument("--json")
    p.add_argument("--timeout", type=float, default=900)
    args = p.parse_args()
    global SPEC_SIDE
    if args.draft_model:
        SPEC_SIDE = "ours --draft-model"
        STOP.clear()
    deadline = bc.Deadline(args.timeout)
    rows, counters = batch_one(args, deadline)
    plain_texts = {i: t for side, i, _, _, t, _ in rows if side == "ours"}
    spec_texts = {i: t for side, i, _, _, t, _ in rows if side == SPEC_SIDE}
    aggregate = {}
    if args.clients > 1:
        aggregate["plain"], plain_many = together(args, False, deadline)
        aggregate["spec"], spec_many = together(args, True, deadline)
        aggregate["same_text"] = plain_many == spec_many
    print(f"# {SPEC_SIDE} beside llama-server, {datetime.date.today()}, {platform.machine()}, "
          f"{Path(args.model).name}, {args.tokens} tokens, greedy, threads {args.threads}\n")
    print("| side | prompt | tokens | decode tok/s | error |\n|---|---:|---:|---:|---|")
    for side, i, tokens, rate, _, error in rows:
        print(f"| {side} | {i} | {tokens} | {rate or 0:.1f} | {error or ''} |")
    mean = {}
    for side in dict.fromkeys(r[0] for r in rows):
        rates = [r[3] for r in rows if r[0] == side and r[3]]
        mean[side] = statistics.fmean(rates) if rates else None
    print("\n| side | mean decode tok/s | x ours plain |\n|---|---:|---:|")
    for side, rate in mean.items():
        ratio = rate / mean["ours"] if rate and mean.get("ours") else 0
        print(f"| {side} | {rate or 0:.1f} | {ratio:.2f} |")
    print(f"\nours with and without speculation give the same text: "
          f"{plain_texts == spec_texts}; drafted {counters.get('draft')}, accepted "
          f"{counters.get('accepted')}")
    if aggregate:
        print(f"\n{args.clients} clients: aggregate {aggregate['plain']:.1f} tok/s plain, "
              f"{aggregate['spec']:.1f} with speculation "
              f"({aggregate['spec'] / aggregate['plain']:.2f}x); same text: "
              f"{aggregate['same_text']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "mean": mean, "counters": counters,
                                               "aggregate": aggregate}, indent=1))


if __name__ == "__main__":
    main()
