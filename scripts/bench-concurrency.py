#!/usr/bin/env python3
"""N clients at once against our worker and against llama.cpp's llama-server on the same model,
side by side: time to first token, inter-token latency and aggregate tok/s per N.

    scripts/bench-concurrency.py --binary target/release/llorch-cpud --model M.gguf \\
        [--peer .peer/cpu/build/bin/llama-server] [--clients 1,2,4,8,16] [--tokens 128] \\
        [--prompt-tokens 64] [--threads T] [--ctx 512] [--rounds 1] [--gpu] [--json FILE] \\
        [--timeout 600] [--skip-ours] [-- extra worker flags]

Ours: for each N the binary is started afresh as
`BINARY --model M --host 127.0.0.1 --port 0 --parallel N --ctx-size CTX --queue-depth max(16,2N)
[--threads T] EXTRA...` (`--threads` is not passed with `--gpu` or to worker-orcd, which has no such flag);
the port comes from the JSON `startup` log line, stdout is drained in a thread, /health must answer
200. Jobs: POST /execute {"job_id", "prompt", "raw": true, "temperature": 0, "max_tokens": T,
"ignore_eos": true}. A worker that refuses `ignore_eos` with a 400 gets the jobs without it (and
the report says generation may stop early at EOS); a worker that refuses `--parallel` at start-up
is run without it and the report says its jobs were queued (batch 1).

Peer: for each N, `llama-server -m M -np N -c N*CTX [-t T] --host 127.0.0.1 --port P
[-fa on -ngl 99 with --gpu]`, once with `-no-kvu` and once with `-kvu` (unified KV cache); the better
aggregate tok/s of the two is the peer's row. Jobs: POST /completion {"prompt", "n_predict": T,
"temperature": 0, "cache_prompt": false, "ignore_eos": true, "stream": true}.

Each server start gets one warm-up job (8 tokens), then `--rounds` rounds: N client threads wait on
a barrier and each sends one job with its own prompt (distinct per client, round and N, starting
with a unique tag, so no prefix cache helps). Per client: TTFT = send → first token event; ITL =
gaps between successive token events (llama-server: content chunks). Aggregate tok/s = generated
tokens of all clients / wall time from the barrier to the last client's end. Tokens are counted
from `end.tokens_out` (ours) and `timings.predicted_n` (peer; chunk count if absent). p50/p95 are
over all clients' TTFTs and all gaps of all clients (linear interpolation).

Prints a markdown report (command line, date, CPU model and ISA or GPU name) on stdout; `--json`
writes every number. Only 127.0.0.1; every socket has a timeout and the whole run is bounded by
`--timeout` seconds (what did not fit is reported as skipped). Standard library only.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import http.client
import json
import os
import platform
import random
import shlex
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

HOST = "127.0.0.1"
WARMUP_TOKENS = 8

WORDS = (
    "time year people way day man thing woman life child world school state family student "
    "group country problem hand part place case week company system program question work "
    "government number night point home water room mother area money story fact month lot right "
    "study book eye job word business issue side kind head house service friend father power hour "
    "game line end member law car city community name president team minute idea kid body "
    "information back parent face others level office door health person art war history party "
    "result change morning reason research girl guy moment air teacher force education river "
    "garden window paper music market table light summer winter bread stone forest road letter "
    "animal ocean mountain island village bridge engine garden tower machine network signal"
).split()


class Deadline:
    def __init__(self, seconds):
        self.end = time.monotonic() + seconds

    def left(self):
        return self.end - time.monotonic()

    def expired(self):
        return self.left() <= 0

    def sock_timeout(self, cap=300.0):
        return max(1.0, min(cap, self.left()))


class Abort(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# processes


class Server:
    """A child process whose output is drained in a thread (the pipe never fills); keeps a tail."""

    def __init__(self, argv, name):
        self.argv = argv
        self.name = name
        self.tail = collections.deque(maxlen=200)
        self.startup = None
        self.started = threading.Event()
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, text=True, errors="replace")
        self.thread = threading.Thread(target=self._drain, daemon=True)
        self.thread.start()

    def _drain(self):
        for line in self.proc.stdout:
            self.tail.append(line.rstrip("\n"))
            if self.startup is None and line.startswith("{"):
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if isinstance(record, dict) and record.get("event") == "startup":
                    self.startup = record
                    self.started.set()
        self.started.set()

    def output(self, lines=20):
        return "\n".join(list(self.tail)[-lines:])

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.thread.join(timeout=5)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def wait_health(server, port, deadline, limit=300):
    """Polls GET /health until 200; False if the process died or time ran out."""
    end = min(deadline.end, time.monotonic() + limit)
    while time.monotonic() < end:
        if not server.alive():
            return False
        try:
            conn = http.client.HTTPConnection(HOST, port, timeout=5)
            conn.request("GET", "/health")
            status = conn.getresponse().status
            conn.close()
            if status == 200:
                return True
        except OSError:
            pass
        time.sleep(0.1)
    return False


# ---------------------------------------------------------------------------------------------
# prompts


def make_prompt(n, rnd, client, words, side_salt=""):
    """~`words` + a few tokens; unique from its first token on (per N, round, client)."""
    rng = random.Random(f"{n}/{rnd}/{client}{side_salt}")
    tag = f"{rng.randrange(16**6):06x}"
    # The tag and the frame take about 16 tokens in gpt2-style BPE vocabularies; each word ~1.
    body = " ".join(rng.choice(WORDS) for _ in range(max(1, words - 16)))
    return f"Note {tag} (client {client}, round {rnd}): {body}"


# ---------------------------------------------------------------------------------------------
# clients


class JobResult:
    def __init__(self):
        self.send = None          # perf_counter at send
        self.token_times = []     # perf_counter of each token event
        self.done = None          # perf_counter at end
        self.tokens = 0           # generated tokens (server's count)
        self.prompt_tokens = None
        self.stop_reason = None
        self.error = None
        self.http_status = None
        self.body = None

    def ttft(self):
        return self.token_times[0] - self.send if self.token_times else None

    def gaps(self):
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:])]


def sse_lines(response, deadline):
    for raw in response:
        if deadline.expired():
            raise Abort("time budget exhausted during a stream")
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if line.startswith("data:"):
            yield line[5:].lstrip(" ")


def post(port, path, body, deadline):
    conn = http.client.HTTPConnection(HOST, port, timeout=deadline.sock_timeout())
    payload = json.dumps(body)
    sent = time.perf_counter()
    conn.request("POST", path, payload, {"Content-Type": "application/json",
                                         "Accept": "text/event-stream"})
    return conn, conn.getresponse(), sent


def run_ours(port, job_id, prompt, tokens, ignore_eos, deadline):
    r = JobResult()
    body = {"job_id": job_id, "prompt": prompt, "raw": True, "temperature": 0,
            "max_tokens": tokens}
    if ignore_eos:
        body["ignore_eos"] = True
    conn = None
    try:
        conn, response, r.send = post(port, "/execute", body, deadline)
        r.http_status = response.status
        if response.status != 200:
            r.body = response.read(4000).decode("utf-8", "replace")
            r.error = f"HTTP {response.status}: {r.body[:300]}"
            return r
        for data in sse_lines(response, deadline):
            now = time.perf_counter()
            try:
                event = json.loads(data)
            except ValueError:
                continue
            kind = event.get("type")
            if kind == "started":
                r.prompt_tokens = event.get("prompt_tokens")
            elif kind == "token":
                r.token_times.append(now)
            elif kind == "end":
                r.done = now
                r.tokens = int(event.get("tokens_out", len(r.token_times)))
                r.stop_reason = event.get("stop_reason")
                break
            elif kind == "error":
                r.done = now
                r.error = f"{event.get('code')}: {event.get('message')}"
                break
        if r.done is None and r.error is None:
            r.error = "stream closed without end/error"
    except (OSError, http.client.HTTPException, Abort) as e:
        r.error = f"{type(e).__name__}: {e}"
    finally:
        if conn is not None:
            conn.close()
    return r


def run_peer(port, job_id, prompt, tokens, ignore_eos, deadline):
    del job_id, ignore_eos
    r = JobResult()
    body = {"prompt": prompt, "n_predict": tokens, "temperature": 0, "cache_prompt": False,
            "ignore_eos": True, "stream": True}
    conn = None
    try:
        conn, response, r.send = post(port, "/completion", body, deadline)
        r.http_status = response.status
        if response.status != 200:
            r.body = response.read(4000).decode("utf-8", "replace")
            r.error = f"HTTP {response.status}: {r.body[:300]}"
            return r
        chunks = 0
        for data in sse_lines(response, deadline):
            now = time.perf_counter()
            if data == "[DONE]":
                break
            try:
                event = json.loads(data)
            except ValueError:
                continue
            if "error" in event:
                r.done = now
                r.error = f"peer error: {json.dumps(event['error'])[:300]}"
                break
            if event.get("content") or (not event.get("stop") and "content" in event):
                r.token_times.append(now)
                chunks += 1
            if event.get("stop"):
                r.done = now
                timings = event.get("timings") or {}
                r.tokens = int(timings.get("predicted_n", event.get("tokens_predicted", chunks)))
                r.prompt_tokens = timings.get("prompt_n", event.get("tokens_evaluated"))
                r.stop_reason = event.get("stop_type") or ("limit" if event.get("stopped_limit")
                                                           else None)
                break
        if r.done is None and r.error is None:
            r.error = "stream closed without a stop chunk"
    except (OSError, http.client.HTTPException, Abort) as e:
        r.error = f"{type(e).__name__}: {e}"
    finally:
        if conn is not None:
            conn.close()
    return r


def release_together(client, n, barrier, deadline):
    """Runs `client(i)` for each i < n in a thread of its own, each waiting on `barrier` (n + 1
    parties), releases them together and waits for them; returns the time of the release."""
    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    barrier.wait(timeout=60)
    released = time.perf_counter()
    for t in threads:
        t.join(timeout=max(1.0, deadline.left() + 5))
    return released


def measure_round(job_fn, port, n, rnd, args, ignore_eos, deadline):
    """N threads, one job each, released together; returns (results, wall seconds)."""
    results = [None] * n
    barrier = threading.Barrier(n + 1)

    def client(i):
        try:
            barrier.wait(timeout=60)
        except threading.BrokenBarrierError:
            results[i] = JobResult()
            results[i].error = "barrier broken"
            return
        prompt = make_prompt(n, rnd, i, args.prompt_tokens)
        results[i] = job_fn(port, f"bench-n{n}-r{rnd}-c{i}-{os.getpid()}", prompt, args.tokens,
                            ignore_eos, deadline)

    t0 = release_together(client, n, barrier, deadline)
    ends = [r.done for r in results if r is not None and r.done is not None]
    wall = (max(ends) if ends else time.perf_counter()) - t0
    for i, r in enumerate(results):
        if r is None:
            results[i] = JobResult()
            results[i].error = "client thread did not finish"
    return results, wall


# ---------------------------------------------------------------------------------------------
# statistics


def pct(values, q):
    values = sorted(values)
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    pos = (len(values) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)


def summarize(rounds):
    """rounds: list of (results, wall). Returns a dict of the measured numbers."""
    ttfts, gaps, tokens, prompt_tokens, errors, stops = [], [], 0, [], [], collections.Counter()
    wall = 0.0
    clients = 0
    for results, w in rounds:
        wall += w
        for r in results:
            clients += 1
            if r.error:
                errors.append(r.error)
                continue
            if r.ttft() is not None:
                ttfts.append(r.ttft())
            gaps.extend(r.gaps())
            tokens += r.tokens
            if r.prompt_tokens is not None:
                prompt_tokens.append(r.prompt_tokens)
            stops[str(r.stop_reason)] += 1
    ms = lambda v: None if v is None else v * 1e3  # noqa: E731
    return {
        "clients_total": clients,
        "ok": clients - len(errors),
        "errors": errors[:10],
        "error_count": len(errors),
        "generated_tokens": tokens,
        "tokens_per_client": tokens / max(1, clients - len(errors)),
        "prompt_tokens_mean": (sum(prompt_tokens) / len(prompt_tokens)) if prompt_tokens else None,
        "stop_reasons": dict(stops),
        "wall_s": wall,
        "aggregate_tok_s": tokens / wall if wall > 0 and tokens else 0.0,
        "ttft_p50_ms": ms(pct(ttfts, 0.5)),
        "ttft_p95_ms": ms(pct(ttfts, 0.95)),
        "itl_p50_ms": ms(pct(gaps, 0.5)),
        "itl_p95_ms": ms(pct(gaps, 0.95)),
        "ttft_ms_all": [round(x * 1e3, 3) for x in ttfts],
        "itl_samples": len(gaps),
    }


# ---------------------------------------------------------------------------------------------
# sides


def run_side(name, server, port, job_fn, n, args, deadline, state):
    """Warm-up, then the rounds. Returns a summary dict (or one with 'skipped')."""
    warm = job_fn(port, f"bench-warmup-n{n}-{os.getpid()}",
                  make_prompt(n, -1, 0, args.prompt_tokens, name), WARMUP_TOKENS,
                  state.get("ignore_eos", True), deadline)
    if warm.error and name == "ours" and warm.http_status == 400 and "ignore_eos" in (warm.body or ""):
        state["ignore_eos"] = False
        state.setdefault("notes", []).append(
            "the worker refused `ignore_eos` (400): jobs sent without it; generation may stop at EOS")
        warm = job_fn(port, f"bench-warmup2-n{n}-{os.getpid()}",
                      make_prompt(n, -1, 0, args.prompt_tokens, name), WARMUP_TOKENS, False,
                      deadline)
    if warm.error:
        return {"skipped": f"warm-up failed: {warm.error}", "server_output": server.output()}
    rounds = []
    for rnd in range(args.rounds):
        if deadline.expired():
            break
        rounds.append(measure_round(job_fn, port, n, rnd, args, state.get("ignore_eos", True),
                                    deadline))
    if not rounds:
        return {"skipped": "time budget exhausted"}
    summary = summarize(rounds)
    summary["rounds"] = len(rounds)
    if summary["error_count"] and not server.alive():
        summary["server_output"] = server.output()
    return summary


def start_ours(args, n, parallel, deadline):
    argv = [args.binary, "--model", args.model, "--host", HOST, "--port", "0",
            "--ctx-size", str(args.ctx), "--queue-depth", str(max(16, 2 * n))]
    if parallel:
        argv += ["--parallel", str(n)]
    if args.threads and not args.gpu and "orcd" not in Path(args.binary).name:
        argv += ["--threads", str(args.threads)]
    argv += args.worker_flags
    server = Server(argv, "ours")
    server.started.wait(timeout=max(1.0, min(120.0, deadline.left())))
    if server.startup is None:
        server.stop()
        return server, None
    address = server.startup.get("address", "")
    port = server.startup.get("port") or int(address.rsplit(":", 1)[1])
    if not wait_health(server, int(port), deadline):
        server.stop()
        return server, None
    return server, int(port)


def save_metrics(port, path):
    """Saves the worker's /metrics (step time and batch size histograms) to `path`."""
    try:
        conn = http.client.HTTPConnection(HOST, port, timeout=10)
        conn.request("GET", "/metrics")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(conn.getresponse().read())
        conn.close()
    except OSError as err:
        print(f"bench-concurrency: /metrics not saved: {err}", file=sys.stderr)


def bench_ours(args, n, deadline, state):
    if deadline.expired():
        return {"skipped": "time budget exhausted"}
    parallel = state.get("parallel", True)
    server, port = start_ours(args, n, parallel, deadline)
    if port is None and parallel and "--parallel" in server.output(50):
        state["parallel"] = False
        state.setdefault("notes", []).append(
            "the worker refused `--parallel`: it ran without it, so concurrent jobs were queued "
            "(batch 1, FIFO)")
        server, port = start_ours(args, n, False, deadline)
    if port is None:
        return {"skipped": "worker did not start or become healthy"
                           + (f" (exit {server.proc.returncode})" if not server.alive() else ""),
                "command": shlex.join(server.argv), "server_output": server.output()}
    try:
        summary = run_side("ours", server, port, run_ours, n, args, deadline, state)
        if args.metrics_dir:
            save_metrics(port, Path(args.metrics_dir) / f"metrics-n{n}.txt")
    finally:
        server.stop()
    summary["command"] = shlex.join(server.argv)
    summary["parallel_flag"] = state.get("parallel", True)
    summary["ignore_eos_sent"] = state.get("ignore_eos", True)
    return summary


def bench_peer_variant(args, n, unified, deadline):
    if deadline.expired():
        return {"skipped": "time budget exhausted"}
    port = free_port()
    argv = [args.peer, "-m", args.model, "-np", str(n), "-c", str(n * args.ctx),
            "--host", HOST, "--port", str(port)]
    if args.threads:
        argv += ["-t", str(args.threads)]
    if args.gpu:
        argv += ["-fa", "on", "-ngl", "99"]
    argv += ["-kvu"] if unified else ["-no-kvu"]
    argv += args.peer_flags
    server = Server(argv, "peer")
    try:
        if not wait_health(server, port, deadline):
            return {"skipped": "llama-server did not start or become healthy"
                               + (f" (exit {server.proc.returncode})" if not server.alive() else ""),
                    "command": shlex.join(argv), "server_output": server.output()}
        summary = run_side("peer", server, port, run_peer, n, args, deadline, {})
    finally:
        server.stop()
    summary["command"] = shlex.join(argv)
    summary["kv_unified"] = unified
    return summary


def bench_peer(args, n, deadline):
    variants = [bench_peer_variant(args, n, unified, deadline) for unified in (False, True)]
    ok = [v for v in variants if "skipped" not in v]
    if not ok:
        return {"skipped": variants[0].get("skipped"), "variants": variants}
    best = dict(max(ok, key=lambda v: v["aggregate_tok_s"]))
    best["variants"] = [{k: v.get(k) for k in ("kv_unified", "aggregate_tok_s", "ttft_p50_ms",
                                               "itl_p50_ms", "error_count", "skipped")}
                        for v in variants]
    return best


# ---------------------------------------------------------------------------------------------
# report


def machine():
    info = {"host": platform.node(), "cpus": os.cpu_count()}
    try:
        info["loadavg_start"] = Path("/proc/loadavg").read_text().split()[:3]
    except OSError:
        pass
    try:
        text = Path("/proc/cpuinfo").read_text()
        for line in text.splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        flags = set()
        for line in text.splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
        info["isa"] = ("avx512_vnni" if "avx512_vnni" in flags else
                       "avx2" if "avx2" in flags else "scalar")
    except OSError:
        info["cpu"] = platform.processor()
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=20)
        if out.returncode == 0 and out.stdout.strip():
            info["gpu"] = out.stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def fmt(v, digits=1):
    return "–" if v is None else f"{v:.{digits}f}"


def report(header, rows, notes):
    out = []
    out.append("# bench-concurrency")
    out.append("")
    out.append(f"- command: `{header['command']}`")
    out.append(f"- date: {header['date']}")
    m = header["machine"]
    out.append(f"- machine: {m.get('cpu')} ({m.get('isa')}, {m.get('cpus')} logical CPUs)"
               + (f"; GPU: {', '.join(m['gpu'])}" if m.get("gpu") else "")
               + (f"; load average {' '.join(m['loadavg_start'])} at start, "
                  f"{' '.join(m.get('loadavg_end', ['?']))} at end" if m.get("loadavg_start") else ""))
    out.append(f"- model: {Path(header['model']).name}; {header['tokens']} tokens per client, "
               f"~{header['prompt_tokens']}-word prompts (distinct per client/round), "
               f"ctx {header['ctx']} per sequence, threads {header['threads'] or 'default'}, "
               f"rounds {header['rounds']}")
    for note in notes:
        out.append(f"- note: {note}")
    out.append("")
    out.append("| N | engine | agg tok/s | TTFT p50 ms | TTFT p95 ms | ITL p50 ms | ITL p95 ms | "
               "tok/client | prompt tok | errors | config |")
    out.append("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for row in rows:
        for side in ("ours", "peer"):
            s = row.get(side)
            if s is None:
                continue
            if "skipped" in s:
                out.append(f"| {row['n']} | {side} | skipped: {s['skipped'][:80]} "
                           "| | | | | | | | |")
                continue
            config = ""
            if side == "peer":
                config = "-kvu" if s.get("kv_unified") else "-no-kvu"
                others = [v for v in s.get("variants", []) if v.get("kv_unified") != s.get("kv_unified")]
                if others and others[0].get("aggregate_tok_s") is not None:
                    config += f" (other: {others[0]['aggregate_tok_s']:.1f})"
            elif side == "ours":
                config = "--parallel" if s.get("parallel_flag") else "no --parallel (queued)"
            out.append(f"| {row['n']} | {side} | {fmt(s['aggregate_tok_s'])} | "
                       f"{fmt(s['ttft_p50_ms'])} | {fmt(s['ttft_p95_ms'])} | "
                       f"{fmt(s['itl_p50_ms'], 2)} | {fmt(s['itl_p95_ms'], 2)} | "
                       f"{fmt(s['tokens_per_client'])} | {fmt(s['prompt_tokens_mean'])} | "
                       f"{s['error_count']} | {config} |")
    both = [r for r in rows if r.get("ours") and r.get("peer")
            and "skipped" not in r["ours"] and "skipped" not in r["peer"]]
    if both:
        out.append("")
        out.append("| N | ours tok/s | peer tok/s | ours/peer tok/s | TTFT p50 ours/peer | "
                   "ITL p50 ours/peer |")
        out.append("|---:|---:|---:|---:|---:|---:|")

        def ratio(a, b):
            return "–" if not a or not b else f"{a / b:.2f}x"
        for r in both:
            o, p = r["ours"], r["peer"]
            out.append(f"| {r['n']} | {fmt(o['aggregate_tok_s'])} | {fmt(p['aggregate_tok_s'])} | "
                       f"{ratio(o['aggregate_tok_s'], p['aggregate_tok_s'])} | "
                       f"{ratio(o['ttft_p50_ms'], p['ttft_p50_ms'])} | "
                       f"{ratio(o['itl_p50_ms'], p['itl_p50_ms'])} |")
    errors = [(r["n"], side, e) for r in rows for side in ("ours", "peer")
              if r.get(side) for e in r[side].get("errors", [])[:3]]
    if errors:
        out.append("")
        out.append("Errors (first few):")
        for n, side, e in errors:
            out.append(f"- N={n} {side}: {e}")
    return "\n".join(out)


def split_worker_flags(argv):
    """(the script's arguments, the worker's extra flags after `--`)."""
    if "--" not in argv:
        return argv, []
    i = argv.index("--")
    return argv[:i], argv[i + 1:]


def server_parser(doc):
    """A parser with `doc` as its help and the arguments every benchmark of ours vs the peer
    takes: --binary, --model, --peer, --json, --timeout."""
    parser = argparse.ArgumentParser(
        description=doc.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=doc.split("\n\n", 1)[1])
    parser.add_argument("--binary", help="our worker (llorch-cpud or worker-orcd)")
    parser.add_argument("--model", required=True, help="GGUF file")
    parser.add_argument("--peer", help="llama-server binary (skipped when absent)")
    parser.add_argument("--json", help="write all numbers to this file")
    parser.add_argument("--timeout", type=float, default=600,
                        help="wall-clock budget of the whole run, seconds (default 600)")
    return parser


def parse_args(argv):
    argv, extra = split_worker_flags(argv)
    parser = server_parser(__doc__)
    parser.add_argument("--clients", default="1,2,4,8,16", help="comma-separated N values")
    parser.add_argument("--tokens", type=int, default=128, help="generated tokens per client")
    parser.add_argument("--prompt-tokens", type=int, default=64,
                        help="approximate prompt length (words after a short unique tag)")
    parser.add_argument("--threads", type=int, help="threads for both (ours: --threads, peer: -t)")
    parser.add_argument("--ctx", type=int, default=512, help="context per sequence")
    parser.add_argument("--rounds", type=int, default=1, help="measured rounds per N")
    parser.add_argument("--metrics-dir", help="save the worker's /metrics after each N here")
    parser.add_argument("--gpu", action="store_true",
                        help="GPU run: peer gets -fa on -ngl 99; ours gets no --threads")
    parser.add_argument("--peer-flag", dest="peer_flags", action="append", default=[],
                        help="extra llama-server argument (repeatable, e.g. --peer-flag=--no-mmap)")
    parser.add_argument("--skip-ours", action="store_true", help="run the peer only")
    args = parser.parse_args(argv)
    args.worker_flags = extra
    args.clients_list = [int(x) for x in args.clients.split(",") if x.strip()]
    if not args.clients_list or min(args.clients_list) < 1:
        parser.error("--clients needs positive integers")
    if args.binary is None and not args.skip_ours:
        parser.error("--binary is required (or --skip-ours)")
    if args.ctx < args.prompt_tokens * 2 + args.tokens + 32:
        parser.error(f"--ctx {args.ctx} is too small for ~{args.prompt_tokens} prompt words "
                     f"+ {args.tokens} tokens (need about {args.prompt_tokens * 2 + args.tokens + 32})")
    return args


def main():
    args = parse_args(sys.argv[1:])
    deadline = Deadline(args.timeout)
    notes = []
    if not Path(args.model).is_file():
        sys.exit(f"no model file {args.model}")
    if args.peer and not (Path(args.peer).is_file() and os.access(args.peer, os.X_OK)):
        notes.append(f"peer {args.peer} not found: peer skipped")
        args.peer = None
    elif not args.peer:
        notes.append("no --peer: peer skipped")
    if args.skip_ours:
        notes.append("--skip-ours: our worker skipped")
    header = {
        "command": shlex.join([sys.argv[0], *sys.argv[1:]]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(), "model": args.model, "tokens": args.tokens,
        "prompt_tokens": args.prompt_tokens, "ctx": args.ctx, "threads": args.threads,
        "rounds": args.rounds, "clients": args.clients_list,
    }
    print(f"bench-concurrency: {header['machine'].get('cpu')} ({header['machine'].get('isa')})",
          file=sys.stderr)
    rows = []
    state = {}
    for n in args.clients_list:
        row = {"n": n}
        if not args.skip_ours:
            print(f"bench-concurrency: N={n} ours", file=sys.stderr)
            row["ours"] = bench_ours(args, n, deadline, state)
            print(f"  -> {row['ours'].get('aggregate_tok_s', row['ours'].get('skipped'))}",
                  file=sys.stderr)
        if args.peer:
            print(f"bench-concurrency: N={n} peer", file=sys.stderr)
            row["peer"] = bench_peer(args, n, deadline)
            print(f"  -> {row['peer'].get('aggregate_tok_s', row['peer'].get('skipped'))}",
                  file=sys.stderr)
        rows.append(row)
    notes += state.get("notes", [])
    try:
        header["machine"]["loadavg_end"] = Path("/proc/loadavg").read_text().split()[:3]
    except OSError:
        pass
    if state.get("ignore_eos", True) is False or any(
            r.get("ours", {}).get("stop_reasons", {}).get("EOS") for r in rows):
        notes.append("some of our jobs stopped at EOS before --tokens (ignore_eos not honoured)")
    text = report(header, rows, notes)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"header": header, "notes": notes, "rows": rows}, f, indent=1)
    failed = any("skipped" in r.get(side, {}) for r in rows for side in ("ours", "peer"))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
