#!/usr/bin/env python3
"""Soak a running worker: many sequential short jobs, memory sampled as they go, a trend at the end.

    scripts/soak.py [--url http://127.0.0.1:8080] [--pid PID] [--jobs 10000] [--every 100]
                    [--max-tokens 8] [--time-limit-min M] [--csv soak.csv] [--summary soak.md]

Runs against any worker of the contract (`llorch-cpud`, or `worker-orcd` on a GPU host), started
beforehand, e.g. with `scripts/serve.sh`. Jobs go one after another over one keep-alive
connection: a few distinct prompts, raw and chat-templated, greedy (temperature 0) and sampled
(temperature 0.8, seed = job number), each read to its terminal event. Every `--every` jobs, and
once before the first, it records into the CSV:

- the worker's RSS (`VmRSS`, and `RssAnon`: the heap, without the mapped model file) and
  descriptor and thread counts, from /proc/<pid> (the pid is found from the listening port when
  --pid is not given; the worker must run on this machine);
- VRAM: `/health`'s `vram_bytes_used` (the worker's own account), and as nvidia-smi reports it
  (when present): the process's use, and the GPUs' used memory (for containers where nvidia-smi
  does not see the process); plus /health's `memory_bytes` and free KV pages.

The summary gives, per series, first and last, min and max, max - min, and the least-squares
slope per 1,000 jobs over the whole run and over its second half (after allocator warm-up),
and a verdict: a growth trend when the second half's slope, carried over 10,000 jobs, exceeds 1 %
of the series' median (and 1 MiB). Any job that ends without exactly one `end` or `error` event,
or with an error, is counted and makes the exit status 1. Python 3 standard library only.
"""

import argparse
import csv
import http.client
import json
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time
import urllib.parse
from datetime import datetime, timezone

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village,",
    "def fibonacci(n):",
    "Write one sentence about the sea.",
    "1, 2, 3, 4, 5,",
    "The three primary colours are",
]

MIB = 1024 * 1024


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8080", help="the worker's base URL")
    p.add_argument("--pid", type=int, help="the worker's pid (default: found from the port)")
    p.add_argument("--jobs", type=int, default=10000)
    p.add_argument("--every", type=int, default=100, help="jobs between samples")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--time-limit-min", type=float, default=0.0,
                   help="stop after this many minutes (0: none); the summary says so")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per job")
    p.add_argument("--csv", default="soak.csv")
    p.add_argument("--summary", help="also write the markdown summary here")
    return p.parse_args()


# --- the worker's process -------------------------------------------------------------------

def pid_listening_on(port):
    """The pid whose socket listens on `port` (IPv4 or IPv6), via /proc/net and /proc/*/fd."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f[9])
    wanted = {f"socket:[{i}]" for i in inodes}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}") in wanted:
                    return int(pid)
        except OSError:
            continue
    return None


def proc_sample(pid):
    status = {}
    for line in open(f"/proc/{pid}/status"):
        key, _, value = line.partition(":")
        status[key] = value.strip()
    kb = lambda key: int(status.get(key, "0 kB").split()[0])  # noqa: E731
    return {
        "rss_kib": kb("VmRSS"),
        "rss_anon_kib": kb("RssAnon"),
        "rss_file_kib": kb("RssFile"),
        "hwm_kib": kb("VmHWM"),
        "threads": int(status.get("Threads", "0")),
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
    }


def nvidia_smi(query):
    """Rows of `nvidia-smi --query-<query> --format=csv,noheader,nounits`, or [] without it."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(["nvidia-smi", f"--query-{query}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [[f.strip() for f in line.split(",")] for line in out.splitlines() if line.strip()]


def smi_vram_mib(pid):
    """GPU memory in MiB per nvidia-smi: the process's own (None in a container whose pids
    nvidia-smi cannot see) and all GPUs' used memory; (None, None) without nvidia-smi."""
    own = [int(m) for p, m in nvidia_smi("compute-apps=pid,used_memory")
           if p.isdigit() and m.isdigit() and int(p) == pid]
    total = [int(r[0]) for r in nvidia_smi("gpu=memory.used") if r and r[0].isdigit()]
    return (sum(own) if own else None), (sum(total) if total else None)


# --- HTTP -------------------------------------------------------------------------------------

class Worker:
    def __init__(self, url, timeout):
        u = urllib.parse.urlsplit(url)
        self.host, self.port = u.hostname, u.port or 80
        self.timeout = timeout
        self.conn = None

    def _connection(self):
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        return self.conn

    def request(self, method, path, body=None):
        """One request on the keep-alive connection, reconnecting once if the server closed it."""
        for attempt in (0, 1):
            conn = self._connection()
            try:
                headers = {"Content-Type": "application/json"} if body is not None else {}
                conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
                return conn.getresponse()
            except (ConnectionError, http.client.HTTPException, socket.timeout):
                conn.close()
                self.conn = None
                if attempt:
                    raise

    def health(self):
        r = self.request("GET", "/health")
        return r.status, json.loads(r.read() or b"{}")

    def run_job(self, job):
        """Streams one job to its end: (terminal events, error code or None, tokens)."""
        r = self.request("POST", "/execute", job)
        if r.status != 200:
            body = r.read().decode("utf-8", "replace")
            return 0, f"HTTP {r.status}: {body[:200]}", 0
        terminals, error, tokens, event = 0, None, 0, None
        for raw in r:
            line = raw.decode("utf-8").rstrip("\r\n")
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:") and event:
                if event == "token":
                    tokens += 1
                elif event in ("end", "error"):
                    terminals += 1
                    if event == "error":
                        error = json.loads(line[5:]).get("code", "?")
        if r.will_close:
            self.conn.close()
            self.conn = None
        return terminals, error, tokens


def job_for(n, max_tokens):
    job = {
        "job_id": f"soak-{n}",
        "prompt": PROMPTS[n % len(PROMPTS)],
        "max_tokens": max_tokens,
        "raw": n % 3 != 2,  # every third job through the chat template
    }
    if n % 2:
        job.update(temperature=0.8, top_p=0.95, seed=n)
    else:
        job["temperature"] = 0
    return job


# --- statistics -------------------------------------------------------------------------------

def slope(xs, ys):
    """Least-squares slope of ys over xs."""
    if len(xs) < 2:
        return 0.0
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0


SERIES = [
    # column, label, unit scale to MiB (None: a count)
    ("rss_kib", "RSS (VmRSS)", 1024),
    ("rss_anon_kib", "RSS anonymous (heap)", 1024),
    ("health_memory_bytes", "/health memory_bytes", MIB),
    ("health_vram_bytes_used", "/health vram_bytes_used", MIB),
    ("smi_vram_mib", "VRAM of the process (nvidia-smi)", 1),
    ("smi_gpu_used_mib", "VRAM used on the GPUs (nvidia-smi)", 1),
    ("fds", "open descriptors", None),
    ("threads", "threads", None),
    ("kv_pages_free", "free KV pages", None),
]


def summarise(rows):
    lines = ["| series | first | last | min | max | max − min | slope /1k jobs | 2nd-half slope /1k jobs | trend |",
             "|---|---|---|---|---|---|---|---|---|"]
    growth = []
    for col, label, scale in SERIES:
        pts = [(r["jobs"], r[col]) for r in rows if r.get(col) not in (None, "")]
        if len(pts) < 2 or all(v == 0 for _, v in pts):
            continue
        xs = [x / 1000 for x, _ in pts]
        ys = [v / scale if scale else float(v) for _, v in pts]
        half = [(x, y) for x, y in zip(xs, ys) if x >= xs[-1] / 2]
        s_all, s_half = slope(xs, ys), slope(*zip(*half)) if len(half) >= 2 else 0.0
        med = statistics.median(ys)
        # Carried over 10k jobs, the late slope may not exceed 1 % of the median (and 1 MiB; 1 for counts).
        limit = max(0.01 * abs(med), 1.0)
        grows = col != "kv_pages_free" and s_half * 10 > limit
        shrinks_pages = col == "kv_pages_free" and s_half * 10 < -limit
        trend = "**growth**" if grows or shrinks_pages else "none"
        if grows or shrinks_pages:
            growth.append(label)
        unit = " MiB" if scale else ""
        fmt = (lambda v: f"{v:.1f}{unit}") if scale else (lambda v: f"{v:g}")
        lines.append(f"| {label} | {fmt(ys[0])} | {fmt(ys[-1])} | {fmt(min(ys))} | {fmt(max(ys))} "
                     f"| {fmt(max(ys) - min(ys))} | {s_all:+.3f}{unit} | {s_half:+.3f}{unit} | {trend} |")
    return lines, growth


def machine():
    cpu = "?"
    flags = ""
    try:
        info = open("/proc/cpuinfo").read()
        m = re.search(r"^model name\s*:\s*(.*)$", info, re.M)
        cpu = m.group(1).strip() if m else platform.processor()
        flags = "avx512_vnni" if re.search(r"\bavx512_vnni\b", info) else (
            "avx2" if re.search(r"\bavx2\b", info) else "no avx2")
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} CPUs, {flags}"


def main():
    args = parse_args()
    worker = Worker(args.url, args.timeout)
    status, health = worker.health()
    if status != 200:
        sys.exit(f"soak: {args.url}/health answered {status}: the worker is not ready")
    pid = args.pid or pid_listening_on(worker.port)
    if pid is None:
        sys.exit("soak: no local process listens on the port; pass --pid (the worker must run here)")
    print(f"soak: {health.get('model')} ({health.get('worker_type')}), pid {pid}, "
          f"{args.jobs} jobs, sample every {args.every}", file=sys.stderr)

    def sample(jobs_done, t0, errors):
        _, h = worker.health()
        row = {"jobs": jobs_done, "elapsed_s": round(time.monotonic() - t0, 1), "errors": errors}
        row.update(proc_sample(pid))
        row["health_memory_bytes"] = h.get("memory_bytes")
        row["health_vram_bytes_used"] = h.get("vram_bytes_used")
        row["smi_vram_mib"], row["smi_gpu_used_mib"] = smi_vram_mib(pid)
        row["kv_pages_free"] = h.get("kv_pages_free")
        row["state"] = h.get("state")
        return row

    fields = ["jobs", "elapsed_s", "errors", "rss_kib", "rss_anon_kib", "rss_file_kib", "hwm_kib",
              "threads", "fds", "health_memory_bytes", "health_vram_bytes_used", "smi_vram_mib",
              "smi_gpu_used_mib", "kv_pages_free", "state"]
    started = datetime.now(timezone.utc)
    t0 = time.monotonic()
    deadline = t0 + args.time_limit_min * 60 if args.time_limit_min > 0 else None
    errors, bad_terminals, tokens_total, codes = 0, 0, 0, {}
    rows = []
    done = 0
    with open(args.csv, "w", newline="") as f:
        out = csv.DictWriter(f, fieldnames=fields)
        out.writeheader()
        rows.append(sample(0, t0, 0))
        out.writerow(rows[-1])
        f.flush()
        for n in range(args.jobs):
            terminals, error, tokens = worker.run_job(job_for(n, args.max_tokens))
            done = n + 1
            tokens_total += tokens
            if terminals != 1 and not (error or "").startswith("HTTP"):
                bad_terminals += 1
            if error:
                errors += 1
                codes[error.split(":")[0]] = codes.get(error.split(":")[0], 0) + 1
            if done % args.every == 0 or done == args.jobs:
                rows.append(sample(done, t0, errors))
                out.writerow(rows[-1])
                f.flush()
                r = rows[-1]
                print(f"soak: {done} jobs, {r['elapsed_s']:.0f} s, RSS {r['rss_kib'] / 1024:.1f} MiB "
                      f"(anon {r['rss_anon_kib'] / 1024:.1f}), errors {errors}", file=sys.stderr)
            if deadline and time.monotonic() > deadline and done % args.every == 0:
                break
    elapsed = time.monotonic() - t0
    table, growth = summarise(rows)
    partial = done < args.jobs
    verdict = ("growth trend in: " + ", ".join(growth)) if growth else "no growth trend"
    rate = done / elapsed if elapsed else 0.0
    summary = [
        f"- date: {started:%Y-%m-%d %H:%M} UTC; machine: {machine()}",
        f"- worker: {health.get('model')} ({health.get('quant_kind')}), {health.get('worker_type')}, "
        f"version {health.get('version')}",
        f"- jobs: {done} of {args.jobs}{' (stopped at the time limit: PARTIAL RUN)' if partial else ''}, "
        f"max_tokens {args.max_tokens}, {len(PROMPTS)} prompts, raw and templated, temperature 0 and 0.8; "
        f"{tokens_total} tokens; {elapsed / 60:.1f} min ({rate:.1f} jobs/s)",
        f"- errors: {errors} {codes if codes else ''}; jobs without exactly one terminal event: {bad_terminals}",
        f"- samples: {len(rows)} (every {args.every} jobs, and before the first)",
        f"- the worker declares memory_bytes {rows[-1]['health_memory_bytes'] / MIB:.1f} MiB (weights, KV "
        f"pool, scratch: allocated at load, made resident as first used); RSS ends at "
        f"{rows[-1]['rss_kib'] / 1024:.1f} MiB, of which anonymous {rows[-1]['rss_anon_kib'] / 1024:.1f} MiB"
        if rows[-1].get("health_memory_bytes") else "- the worker reports no memory_bytes",
        "",
        *table,
        "",
        f"**Verdict: {verdict}.** (A trend: the second half's slope, carried over 10,000 jobs, above 1 % "
        "of the median and above 1 MiB, or 1 for counts.)",
    ]
    text = "\n".join(summary)
    print(text)
    if args.summary:
        with open(args.summary, "w") as f:
            f.write(text + "\n")
    sys.exit(1 if errors or bad_terminals else 0)


if __name__ == "__main__":
    main()
