#!/usr/bin/env python3
"""Multi-turn chat with one shared system prompt, against our worker and llama-server side by
side: what a prefix cache is for. N clients each hold a conversation of T turns; every turn
resends the shared system prompt (about 1,000 tokens), the whole history so far (the earlier
questions and the server's own answers) and a new question.

    scripts/bench-multiturn.py --binary target/release/worker-orcd --model M.gguf \\
        [--peer build/bin/llama-server] [--clients 16] [--turns 4] [--tokens 64] \\
        [--system-words 1000] [--ctx 2048] [--gpu] [--json FILE] [--timeout 600] \\
        [-- extra worker flags]

Ours: `BINARY --model M --host 127.0.0.1 --port 0 --parallel N --ctx-size CTX --queue-depth
max(16,2N) EXTRA...` (prefix cache on, its default). Jobs: POST /execute {"job_id", "prompt",
"raw": true, "temperature": 0, "max_tokens": K, "ignore_eos": true}.
Peer: `llama-server -m M -np N -c N*CTX --host 127.0.0.1 --port P [-fa on -ngl 99 with --gpu]`,
once with `-no-kvu` and once with `-kvu`, the better aggregate tok/s reported. Jobs: POST
/completion {"prompt", "n_predict": K, "temperature": 0, "cache_prompt": true, "ignore_eos":
true, "stream": true}.

Each server gets one warm-up job on another system prompt, then the N clients start together
(a barrier); client c runs its turns one after another, each turn's prompt built from the
previous answers' text. Aggregate tok/s = generated tokens of all turns of all clients / wall time
from the barrier to the last client's end. TTFT p50/p95 over all turns, and over turn 1 (the
first sight of the client's question) and turns 2..T (history the server saw) apart; for ours,
the share of prompt tokens served from the cache (`end.cached_tokens`).

Prints a markdown report on stdout; `--json` writes every number. Only 127.0.0.1; every socket
has a timeout and the run is bounded by `--timeout` seconds. Standard library only; the server
start-up, health checks, SSE reading and statistics are bench-concurrency.py's.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import random
import shlex
import sys
import threading
import time
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location(
    "bench_concurrency", Path(__file__).with_name("bench-concurrency.py"))
bc = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bc)

QUESTIONS = (
    "What does the first rule say about the river?",
    "Summarize the part about the market in one sentence.",
    "Which of the items mentions a bridge, and why does it matter?",
    "Write a short list of the three most important points.",
    "How would the village explain the story to a child?",
    "What is missing from the notes about the forest?",
)


def system_prompt(words, salt):
    """About `words` tokens of rules, the same for every client of a run."""
    rng = random.Random(f"system/{salt}")
    rules = []
    for i in range(max(1, words // 12)):
        body = " ".join(rng.choice(bc.WORDS) for _ in range(9))
        rules.append(f"Rule {i}: {body}.")
    return "You are a careful assistant. Follow these rules.\n" + "\n".join(rules) + "\n"


def turn_prompt(system, history, question):
    """The system prompt, every earlier (question, answer) pair, then the new question."""
    parts = [system]
    for asked, answer in history:
        parts.append(f"User: {asked}\nAssistant:{answer}\n")
    parts.append(f"User: {question}\nAssistant:")
    return "".join(parts)


class Turn:
    def __init__(self, index):
        self.index = index
        self.send = None
        self.first = None
        self.done = None
        self.text = []
        self.tokens = 0
        self.prompt_tokens = None
        self.cached_tokens = None
        self.error = None

    def ttft(self):
        return None if self.first is None else self.first - self.send


def read_ours(response, turn, deadline):
    for data in bc.sse_lines(response, deadline):
        event = json.loads(data)
        kind = event.get("type")
        if kind == "started":
            turn.prompt_tokens = event.get("prompt_tokens")
        elif kind == "token":
            turn.first = turn.first or time.perf_counter()
            turn.text.append(event.get("t", ""))
        elif kind == "end":
            turn.tokens = int(event.get("tokens_out", 0))
            turn.cached_tokens = event.get("cached_tokens")
            return
        elif kind == "error":
            turn.error = f"{event.get('code')}: {event.get('message')}"
            return
    turn.error = "stream closed without end/error"


def read_peer(response, turn, deadline):
    for data in bc.sse_lines(response, deadline):
        if data == "[DONE]":
            break
        event = json.loads(data)
        if "error" in event:
            turn.error = f"peer error: {json.dumps(event['error'])[:300]}"
            return
        if event.get("content"):
            turn.first = turn.first or time.perf_counter()
            turn.text.append(event["content"])
        if event.get("stop"):
            timings = event.get("timings") or {}
            turn.tokens = int(timings.get("predicted_n", event.get("tokens_predicted", 0)))
            # prompt_n counts the prompt tokens evaluated, cache_n those taken from the cache.
            turn.cached_tokens = timings.get("cache_n")
            if timings.get("prompt_n") is not None:
                turn.prompt_tokens = timings["prompt_n"] + (turn.cached_tokens or 0)
            return
    turn.error = "stream closed without a stop chunk"


def run_turn(side, port, job_id, prompt, tokens, deadline, index):
    turn = Turn(index)
    if side == "ours":
        path, reader = "/execute", read_ours
        body = {"job_id": job_id, "prompt": prompt, "raw": True, "temperature": 0,
                "max_tokens": tokens, "ignore_eos": True}
    else:
        path, reader = "/completion", read_peer
        body = {"prompt": prompt, "n_predict": tokens, "temperature": 0, "cache_prompt": True,
                "ignore_eos": True, "stream": True}
    conn = None
    try:
        conn, response, turn.send = bc.post(port, path, body, deadline)
        if response.status != 200:
            turn.error = f"HTTP {response.status}: {response.read(300).decode('utf-8', 'replace')}"
            return turn
        reader(response, turn, deadline)
    except (OSError, ValueError, bc.http.client.HTTPException, bc.Abort) as err:
        turn.error = f"{type(err).__name__}: {err}"
    finally:
        if conn is not None:
            conn.close()
    turn.done = time.perf_counter()
    return turn


def conversations(side, port, args, system, deadline):
    """N clients, T turns each, released together; returns (turns, wall seconds)."""
    turns = [[] for _ in range(args.clients)]
    barrier = threading.Barrier(args.clients + 1)

    def client(c):
        barrier.wait(timeout=60)
        history = []
        for t in range(args.turns):
            question = f"(client {c}) {QUESTIONS[(c + t) % len(QUESTIONS)]}"
            prompt = turn_prompt(system, history, question)
            turn = run_turn(side, port, f"mt-c{c}-t{t}", prompt, args.tokens, deadline, t)
            turns[c].append(turn)
            if turn.error:
                return
            history.append((question, "".join(turn.text)))

    start = bc.release_together(client, args.clients, barrier, deadline)
    ends = [t.done for ts in turns for t in ts if t.done is not None]
    return [t for ts in turns for t in ts], (max(ends) if ends else time.perf_counter()) - start


def summarize(turns, wall, args):
    ok = [t for t in turns if not t.error]
    ms = lambda v: None if v is None else v * 1e3  # noqa: E731
    ttft = lambda ts: [t.ttft() for t in ts if t.ttft() is not None]  # noqa: E731
    later = [t for t in ok if t.index > 0]
    prompt = sum(t.prompt_tokens or 0 for t in ok)
    cached = sum(t.cached_tokens or 0 for t in ok)
    tokens = sum(t.tokens for t in ok)
    return {
        "turns": len(turns), "expected_turns": args.clients * args.turns,
        "errors": [t.error for t in turns if t.error][:5],
        "generated_tokens": tokens, "wall_s": wall,
        "aggregate_tok_s": tokens / wall if wall > 0 else 0.0,
        "ttft_p50_ms": ms(bc.pct(ttft(ok), 0.5)), "ttft_p95_ms": ms(bc.pct(ttft(ok), 0.95)),
        "ttft_turn1_p50_ms": ms(bc.pct(ttft([t for t in ok if t.index == 0]), 0.5)),
        "ttft_later_p50_ms": ms(bc.pct(ttft(later), 0.5)),
        "ttft_later_p95_ms": ms(bc.pct(ttft(later), 0.95)),
        "prompt_tokens_mean": prompt / len(ok) if ok else None,
        "cached_share": cached / prompt if prompt else None,
    }


def bench(side, server, port, args, deadline):
    if port is None:
        return {"skipped": "server did not start or become healthy",
                "server_output": server.output()}
    try:
        warm = run_turn(side, port, "mt-warmup", turn_prompt(system_prompt(100, "warm"), [],
                                                             QUESTIONS[0]), 8, deadline, 0)
        if warm.error:
            return {"skipped": f"warm-up failed: {warm.error}", "server_output": server.output()}
        turns, wall = conversations(side, port, args, system_prompt(args.system_words, "run"),
                                    deadline)
        summary = summarize(turns, wall, args)
    finally:
        server.stop()
    summary["command"] = shlex.join(server.argv)
    return summary


def bench_ours(args, deadline):
    concurrency = argparse.Namespace(**vars(args), threads=None)
    server, port = bc.start_ours(concurrency, args.clients, True, deadline)
    return bench("ours", server, port, args, deadline)


def bench_peer(args, deadline):
    variants = []
    for unified in (False, True):
        port = bc.free_port()
        argv = [args.peer, "-m", args.model, "-np", str(args.clients),
                "-c", str(args.clients * args.ctx), "--host", bc.HOST, "--port", str(port)]
        if args.gpu:
            argv += ["-fa", "on", "-ngl", "99"]
        argv += ["-kvu"] if unified else ["-no-kvu"]
        server = bc.Server(argv, "peer")
        healthy = bc.wait_health(server, port, deadline)
        summary = bench("peer", server, port if healthy else None, args, deadline)
        summary["kv_unified"] = unified
        variants.append(summary)
    ok = [v for v in variants if "skipped" not in v]
    if not ok:
        return variants[0]
    best = dict(max(ok, key=lambda v: v["aggregate_tok_s"]))
    best["other_tok_s"] = [v.get("aggregate_tok_s") for v in variants if v is not best]
    return best


def report(header, results):
    fmt = bc.fmt
    out = ["# bench-multiturn", "", f"- command: `{header['command']}`",
           f"- date: {header['date']}"]
    m = header["machine"]
    out.append(f"- machine: {m.get('cpu')}" + (f"; GPU: {', '.join(m['gpu'])}" if m.get("gpu") else ""))
    out.append(f"- model: {Path(header['model']).name}; {header['clients']} clients x "
               f"{header['turns']} turns, {header['tokens']} tokens a turn, ~"
               f"{header['system_words']}-word shared system prompt, ctx {header['ctx']}")
    out += ["", "| engine | agg tok/s | TTFT p50 ms | TTFT p95 ms | turn 1 p50 | turns 2+ p50 | "
            "turns 2+ p95 | prompt tok | cached | turns | config |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for side, s in results.items():
        if "skipped" in s:
            out.append(f"| {side} | skipped: {s['skipped'][:80]} | | | | | | | | | |")
            continue
        cached = "–" if s["cached_share"] is None else f"{100 * s['cached_share']:.0f} %"
        config = ""
        if side == "peer":
            config = ("-kvu" if s.get("kv_unified") else "-no-kvu") + "".join(
                f" (other: {fmt(v)})" for v in s.get("other_tok_s", []))
        out.append(f"| {side} | {fmt(s['aggregate_tok_s'])} | {fmt(s['ttft_p50_ms'])} | "
                   f"{fmt(s['ttft_p95_ms'])} | {fmt(s['ttft_turn1_p50_ms'])} | "
                   f"{fmt(s['ttft_later_p50_ms'])} | {fmt(s['ttft_later_p95_ms'])} | "
                   f"{fmt(s['prompt_tokens_mean'])} | {cached} | {s['turns']}/"
                   f"{s['expected_turns']} | {config} |")
    ours, peer = results.get("ours", {}), results.get("peer", {})
    if ours.get("aggregate_tok_s") and peer.get("aggregate_tok_s"):
        ratio = lambda k: f"{ours[k] / peer[k]:.2f}x" if ours.get(k) and peer.get(k) else "–"  # noqa: E731
        out += ["", f"ours/peer: tok/s {ratio('aggregate_tok_s')}, TTFT p50 "
                f"{ratio('ttft_p50_ms')}, TTFT p95 {ratio('ttft_p95_ms')}"]
    for side, s in results.items():
        for err in s.get("errors", []):
            out.append(f"- {side} error: {err}")
    return "\n".join(out)


def parse_args(argv):
    argv, extra = bc.split_worker_flags(argv)
    parser = bc.server_parser(__doc__)
    parser.add_argument("--clients", type=int, default=16, help="conversations at once")
    parser.add_argument("--turns", type=int, default=4, help="turns per conversation")
    parser.add_argument("--tokens", type=int, default=64, help="generated tokens per turn")
    parser.add_argument("--system-words", type=int, default=1000,
                        help="approximate tokens of the shared system prompt")
    parser.add_argument("--ctx", type=int, default=2048, help="context per sequence")
    parser.add_argument("--gpu", action="store_true", help="GPU run: peer gets -fa on -ngl 99")
    args = parser.parse_args(argv)
    args.worker_flags = extra
    if args.clients < 1 or args.turns < 1:
        parser.error("--clients and --turns need positive integers")
    return args


def main():
    args = parse_args(sys.argv[1:])
    deadline = bc.Deadline(args.timeout)
    header = {
        "command": shlex.join([sys.argv[0], *sys.argv[1:]]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": bc.machine(), "model": args.model, "clients": args.clients,
        "turns": args.turns, "tokens": args.tokens, "system_words": args.system_words,
        "ctx": args.ctx,
    }
    results = {}
    if args.binary:
        print("bench-multiturn: ours", file=sys.stderr)
        results["ours"] = bench_ours(args, deadline)
    if args.peer:
        print("bench-multiturn: peer", file=sys.stderr)
        results["peer"] = bench_peer(args, deadline)
    print(report(header, results))
    if args.json:
        Path(args.json).write_text(json.dumps({"header": header, "results": results}, indent=1))
    sys.exit(1 if any("skipped" in s for s in results.values()) else 0)


if __name__ == "__main__":
    main()
