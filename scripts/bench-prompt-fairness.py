#!/usr/bin/env python3
"""Does one client's long prompt slow everyone (issue 40, item 4)? Four clients run short
greedy jobs through `/execute`, first alone, then while a fifth's long prompt is prefilling
(sent half a second before them). Reports each round's short-job times (median and slowest,
from sending to the end event), their ratio, and the long job's time alone and beside them.

    scripts/bench-prompt-fairness.py --binary target/release/llorch-cpud --model <file.gguf> \\
        --prompt-tokens 5000 -- --threads 1 --parallel 8 --ctx-size 8192

Each long prompt starts with a fresh word, so the prefix cache cannot serve it.
"""

import argparse
import http.client
import json
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from importlib import import_module  # noqa: E402

bench_http = import_module("bench-http")

SHORT = "Write a short story about a lighthouse keeper.\n"


def token_count(host, port, text):
    conn = http.client.HTTPConnection(host, port, timeout=60)
    conn.request("POST", "/tokenize", json.dumps({"content": text}),
                 {"Content-Type": "application/json"})
    response = conn.getresponse()
    body = response.read()
    conn.close()
    if response.status != 200:
        sys.exit(f"/tokenize answered {response.status}: {body[:300]!r}")
    return len(json.loads(body)["tokens"])


def long_prompt(host, port, target, first_word):
    """`first_word` then ' word' repeated to `target` tokens (one token each in our vocabularies)."""
    words = target
    for _ in range(3):
        text = first_word + " word" * words
        got = token_count(host, port, text)
        if got == target:
            break
        words += target - got
    return text


def timed_job(host, port, body, times, at):
    """Runs one job, storing its seconds from sending to the end event in `times[at]`."""
    sent = time.perf_counter()
    bench_http.execute(host, port, body)
    times[at] = time.perf_counter() - sent


def short_body(k, tokens):
    return {"job_id": f"short-{k}", "prompt": SHORT, "raw": True, "max_tokens": tokens,
            "temperature": 0, "ignore_eos": True}


def long_body(prompt):
    return {"job_id": f"long-{time.time_ns()}", "prompt": prompt, "raw": True, "max_tokens": 1,
            "temperature": 0}


def run_round(host, port, clients, tokens, prompt):
    """The short jobs' times, and the long job's (None without one)."""
    times = [None] * (clients + 1)
    threads = [threading.Thread(target=timed_job,
                                args=(host, port, short_body(k, tokens), times, k))
               for k in range(clients)]
    long = None
    if prompt is not None:
        long = threading.Thread(target=timed_job,
                                args=(host, port, long_body(prompt), times, clients))
        long.start()
        time.sleep(0.5)  # its prefill under way before the short jobs come
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if long:
        long.join()
    return times[:clients], times[clients]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=16, help="each short job's tokens")
    parser.add_argument("--prompt-tokens", type=int, default=5000)
    parser.add_argument("extra", nargs="*", help="worker flags (after --)")
    args = parser.parse_args()
    proc, host, port = bench_http.start(args.binary, args.model, args.extra)
    try:
        bench_http.wait_ready(host, port)
        run_round(host, port, args.clients, 4, None)  # warm-up
        alone, _ = run_round(host, port, args.clients, args.tokens, None)
        sent = time.perf_counter()
        bench_http.execute(host, port, long_body(long_prompt(host, port, args.prompt_tokens,
                                                             "alpha")))
        long_alone = time.perf_counter() - sent
        beside, long_beside = run_round(host, port, args.clients, args.tokens,
                                        long_prompt(host, port, args.prompt_tokens, "omega"))
        for name, times in (("alone", alone), ("beside the long prompt", beside)):
            print(f"short jobs {name:23} median {statistics.median(times):6.2f} s  "
                  f"slowest {max(times):6.2f} s")
        print(f"ratio beside / alone: median {statistics.median(beside) / statistics.median(alone):.2f}"
              f"  slowest {max(beside) / max(alone):.2f}")
        print(f"long prompt ({args.prompt_tokens} tokens): alone {long_alone:.2f} s, "
              f"beside the short jobs {long_beside:.2f} s")
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()
