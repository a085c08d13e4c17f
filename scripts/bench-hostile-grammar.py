#!/usr/bin/env python3
"""Does one client's costly grammar slow everyone (issue 40, item 1)? Four clients decode
greedy jobs through `/execute`, first alone, then while a fifth sends, one after another,
forced tool calls on `/v1/chat/completions` whose parameters are costly, each tool under a
fresh name (so nothing compiled before helps): `--shape nested` nests arrays `--size` deep
(40: the issue's attack), `--shape optional` is one object of `--size` optional properties
(the shape whose compile and masks grow with its size; ~400 is the largest the worker's
grammar budget takes, specs/OPENAI.md). Reports the four's inter-token latency (client-side
arrival gaps) p50/p95 in both rounds and their ratio, and what the fifth got (status, seconds,
prompt tokens). `--no-grammar` sends the same tool as the message's text instead, a prompt of
about the same length without a grammar: what the prompt alone costs the four.

    scripts/bench-hostile-grammar.py --binary target/release/llorch-cpud --model <file.gguf> \\
        --shape optional --size 400 -- --threads 2 --parallel 8
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

PROMPT = "Write a long story about a lighthouse keeper and the sea.\n"


def nested_schema(depth):
    """Parameters whose one property is an array of arrays … `depth` deep of integers."""
    inner = {"type": "integer"}
    for _ in range(depth):
        inner = {"type": "array", "items": inner}
    return {"type": "object", "properties": {"v": inner}, "required": ["v"]}


def optional_schema(count):
    """Parameters of one object with `count` optional integer properties."""
    return {"type": "object",
            "properties": {f"p{i}": {"type": "integer"} for i in range(count)}}


SHAPES = {"nested": nested_schema, "optional": optional_schema}


def decode_gaps(host, port, job_id, tokens):
    """One greedy job; the gaps (s) between its token events as the client receives them."""
    conn = http.client.HTTPConnection(host, port, timeout=600)
    body = {"job_id": job_id, "prompt": PROMPT, "raw": True, "max_tokens": tokens,
            "temperature": 0, "ignore_eos": True}
    conn.request("POST", "/execute", json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    if response.status != 200:
        sys.exit(f"/execute answered {response.status}: {response.read()[:300]!r}")
    arrivals = []
    for raw in response:
        line = raw.decode().rstrip("\n")
        if not line.startswith("data: "):
            continue
        event = json.loads(line[6:])
        if event["type"] == "token":
            arrivals.append(time.perf_counter())
        if event["type"] in ("end", "error"):
            break
    conn.close()
    return [b - a for a, b in zip(arrivals, arrivals[1:])]


def hostile_call(host, port, name, parameters, grammar=True):
    """One forced call of a fresh tool (or, without `grammar`, a plain chat whose message is the
    tool's JSON: a prompt of about the same length, no grammar); returns (HTTP status, seconds,
    short reply)."""
    tool = {"type": "function", "function": {"name": name, "parameters": parameters}}
    body = {"messages": [{"role": "user", "content": "Call the tool."}], "tools": [tool],
            "tool_choice": {"type": "function", "function": {"name": name}},
            "max_tokens": 24, "temperature": 0}
    if not grammar:
        body = {"messages": [{"role": "user", "content": json.dumps(tool)}], "max_tokens": 24,
                "temperature": 0}
    conn = http.client.HTTPConnection(host, port, timeout=600)
    sent = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", json.dumps(body),
                 {"Content-Type": "application/json"})
    response = conn.getresponse()
    reply = response.read()
    conn.close()
    try:
        usage = json.loads(reply).get("usage", {})
    except ValueError:
        usage = {}
    return response.status, time.perf_counter() - sent, usage.get("prompt_tokens"), reply[:120]


def round_of(host, port, clients, tokens, parameters, label, grammar=True):
    """The clients' gaps, with a hostile client sending `parameters` (when given) meanwhile."""
    gaps, outcomes, done = [], [], threading.Event()

    def client(i):
        gaps.extend(decode_gaps(host, port, f"victim-{label}-{i}", tokens))

    def hostile():
        k = 0
        while not done.is_set():
            name = f"tool_{time.time_ns()}_{k}"
            outcomes.append(hostile_call(host, port, name, parameters, grammar))
            k += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    attacker = threading.Thread(target=hostile) if parameters else None
    if attacker:
        attacker.start()
        time.sleep(0.5)  # its grammar compiling and masking before the victims start
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    if attacker:
        attacker.join()
    return gaps, outcomes


def pct(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="nested")
    parser.add_argument("--size", type=int, default=40,
                        help="the nesting depth or the number of optional properties")
    parser.add_argument("--no-grammar", action="store_true",
                        help="the fifth client sends the tool as plain text: the prompt alone")
    parser.add_argument("extra", nargs="*", help="worker flags (after --)")
    args = parser.parse_args()
    proc, host, port = bench_http.start(args.binary, args.model, args.extra)
    try:
        bench_http.wait_ready(host, port)
        parameters = SHAPES[args.shape](args.size)
        round_of(host, port, args.clients, 8, None, "warm")
        alone, _ = round_of(host, port, args.clients, args.tokens, None, "alone")
        beside, outcomes = round_of(host, port, args.clients, args.tokens, parameters, "beside",
                                    not args.no_grammar)
        for name, gaps in (("alone", alone), ("beside the hostile client", beside)):
            print(f"ITL {name:26} p50 {pct(gaps, 0.5) * 1e3:7.1f} ms  p95 "
                  f"{pct(gaps, 0.95) * 1e3:7.1f} ms  ({len(gaps)} gaps)")
        print(f"p95 ratio {pct(beside, 0.95) / pct(alone, 0.95):.2f}  "
              f"p50 ratio {pct(beside, 0.5) / pct(alone, 0.5):.2f}")
        statuses = statistics.multimode([s for s, _, _, _ in outcomes]) if outcomes else []
        for status, seconds, prompt_tokens, reply in outcomes:
            print(f"hostile: {status} in {seconds:.2f} s, {prompt_tokens} prompt tokens  {reply!r}")
        print(f"hostile calls {len(outcomes)}, commonest status {statuses}")
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()
