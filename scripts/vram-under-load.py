#!/usr/bin/env python3
"""The VRAM worker-orcd reports against what nvidia-smi sees for its process, N jobs running.

    scripts/vram-under-load.py --binary worker-orcd --model M.gguf --context-mib C \\
        [--clients 64] [--tokens 256] [--ctx 512]

Starts the worker as scripts/bench-concurrency.py does (`--parallel N --ctx-size CTX`), sends N
jobs at once (its prompts and requests), and while they run samples GET /health `memory_bytes`
and nvidia-smi's used memory of the worker's process, then once more after they end. nvidia-smi
counts the CUDA context, which the worker does not report: C is the bare context's MiB on the
same machine (the first line of `cargo run --release -p backend-cuda --example memory`). Prints
each sample's pair and the largest gap between `memory_bytes` and nvidia-smi − C, relative to
the latter.
"""

import argparse
import importlib.util
import json
import subprocess
import sys
import threading
import time
import http.client
from pathlib import Path

HERE = Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("bench", HERE / "bench-concurrency.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def health_mib(port):
    conn = http.client.HTTPConnection(bench.HOST, port, timeout=5)
    conn.request("GET", "/health")
    body = json.loads(conn.getresponse().read())
    conn.close()
    return body["memory_bytes"] / 2**20


def smi_mib(pid):
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True)
    for line in out.stdout.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 2 and fields[0] == str(pid):
            return float(fields[1])
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--context-mib", type=float, required=True)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--ctx", type=int, default=512)
    args = ap.parse_args()
    args.threads, args.gpu, args.worker_flags = None, True, []
    deadline = bench.Deadline(300)
    server, port = bench.start_ours(args, args.clients, True, deadline)
    if port is None:
        sys.exit(f"the worker did not start:\n{server.output()}")
    samples = []
    done = threading.Event()

    def sample(stage):
        samples.append((stage, health_mib(port), smi_mib(server.proc.pid)))

    def sampler():
        while not done.is_set():
            sample("running")
            time.sleep(0.05)

    try:
        sample("idle")
        jobs = [threading.Thread(target=bench.run_ours,
                                 args=(port, f"vram-{i}", bench.make_prompt(args.clients, 0, i, 64),
                                       args.tokens, True, deadline))
                for i in range(args.clients)]
        watcher = threading.Thread(target=sampler)
        watcher.start()
        for job in jobs:
            job.start()
        for job in jobs:
            job.join()
        done.set()
        watcher.join()
        sample("ended")
    finally:
        server.stop()
    worst = 0.0
    for stage, reported, seen in samples:
        if seen is None:
            continue
        process = seen - args.context_mib
        gap = abs(reported - process) / process
        worst = max(worst, gap)
        print(f"{stage:8s} memory_bytes {reported:8.1f} MiB | nvidia-smi − context "
              f"{process:8.1f} MiB | gap {100 * gap:.2f} %")
    print(f"{len(samples)} samples, {args.clients} clients; largest gap {100 * worst:.2f} %")


if __name__ == "__main__":
    main()
