#!/usr/bin/env python3
"""Where a cold start's kernel compilation goes: NVRTC on the CUDA backend's program as the worker
compiles it, whole and part by part. The program and its options come from Rust (no copy here to
drift): write them first, where Rust is, with

    cargo run -p backend-cuda --example kernel_program -- DIR [sm_90]

then, on the GPU host:

    scripts/nvrtc-timing.py --program DIR [--nvrtc PATH/libnvrtc.so] [--runs 1] [--files K] [--jobs J]

The program's parts (the parameter structs, then each kernel file) are opened by a
`// ---- llorch part: NAME` line. For each k it compiles the first k parts and reports the time and
the increment over k - 1 parts: the increment is what part k's kernels cost (earlier parts are only
helpers to it, and parsing them is in the k - 1 figure). Then the whole program once more, as the
worker compiles it. `--jobs J` compiles J prefixes at once (ctypes releases the GIL; each compile
is single-threaded, so on a host of at least J idle cores the figures hardly change). Needs libnvrtc
(the CUDA toolkit's, or a `nvidia-cuda-nvrtc` wheel's, with its folder on LD_LIBRARY_PATH for
libnvrtc-builtins) and nothing else: ctypes, standard library only. No GPU is touched (the arch is
in the options).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import ctypes
import glob
import os
import sys
import time
from pathlib import Path

PART_MARK = "// ---- llorch part: "


def program_parts(program: Path) -> list[tuple[str, str]]:
    """The program's parts, each (name, text), in order; their texts concatenated are the program."""
    parts: list[tuple[str, str]] = []
    for line in (program / "program.cu").read_text().splitlines(keepends=True):
        if line.startswith(PART_MARK):
            parts.append((line[len(PART_MARK):].strip(), line))
        elif parts:
            parts[-1] = (parts[-1][0], parts[-1][1] + line)
        else:
            sys.exit(f"{program}/program.cu does not open with a part mark")
    return parts


def compile_options(program: Path) -> list[str]:
    """The worker's NVRTC options, as kernel_program wrote them."""
    return [o for o in (program / "options.txt").read_text().splitlines() if o]


def find_nvrtc(given: str | None) -> ctypes.CDLL:
    candidates = [given] if given else []
    candidates += ["libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12"]
    for pattern in ["/usr/local/cuda*/lib64/libnvrtc.so*", "/usr/local/cuda*/targets/*/lib/libnvrtc.so*"]:
        candidates += sorted(glob.glob(pattern), reverse=True)
    for path in sys.path:
        candidates += sorted(glob.glob(os.path.join(path, "nvidia", "cu*", "lib", "libnvrtc.so*")))
        candidates += sorted(glob.glob(os.path.join(path, "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so*")))
    for candidate in candidates:
        try:
            lib = ctypes.CDLL(candidate)
            print(f"nvrtc: {candidate}")
            return lib
        except OSError:
            continue
    sys.exit("no libnvrtc found; pass --nvrtc PATH")


def compile_seconds(nvrtc: ctypes.CDLL, source: str, options: list[str]) -> float:
    program = ctypes.c_void_p()
    status = nvrtc.nvrtcCreateProgram(
        ctypes.byref(program), source.encode(), b"llorch_kernels.cu", 0, None, None
    )
    if status != 0:
        sys.exit(f"nvrtcCreateProgram: status {status}")
    argv = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
    started = time.perf_counter()
    status = nvrtc.nvrtcCompileProgram(program, len(options), argv)
    seconds = time.perf_counter() - started
    if status != 0:
        size = ctypes.c_size_t()
        nvrtc.nvrtcGetProgramLogSize(program, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        nvrtc.nvrtcGetProgramLog(program, log)
        sys.exit(f"compile failed ({status}):\n{log.value.decode(errors='replace')[:4000]}")
    nvrtc.nvrtcDestroyProgram(ctypes.byref(program))
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--program", type=Path, required=True,
                        help="the folder kernel_program wrote (program.cu, options.txt)")
    parser.add_argument("--nvrtc", help="path of libnvrtc.so")
    parser.add_argument("--runs", type=int, default=1, help="compiles per prefix (the least is kept)")
    parser.add_argument("--files", type=int, help="stop after this many parts (no whole-program run)")
    parser.add_argument("--jobs", type=int, default=1, help="prefixes compiled at once")
    args = parser.parse_args()
    nvrtc = find_nvrtc(args.nvrtc)
    major, minor = ctypes.c_int(), ctypes.c_int()
    nvrtc.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    options = compile_options(args.program)
    parts = program_parts(args.program)[: args.files]
    files = [name for name, _ in parts]
    print(f"NVRTC {major.value}.{minor.value}, options {' '.join(options)}")
    sources = []
    for _, text in parts:
        sources.append((sources[-1] if sources else "") + text)
    if args.files is None:
        sources.append(sources[-1])

    def timed(source: str) -> float:
        return min(compile_seconds(nvrtc, source, options) for _ in range(args.runs))

    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        seconds = list(pool.map(timed, sources))
    print("| parts | last part | lines | seconds | increment |")
    print("|---:|---|---:|---:|---:|")
    previous = 0.0
    for k, name in enumerate(files, start=1):
        lines = sources[k - 1].count("\n")
        print(f"| {k} | {name} | {lines} | {seconds[k - 1]:.2f} | {seconds[k - 1] - previous:+.2f} |")
        previous = seconds[k - 1]
    if args.files is None:
        print(f"whole program again: {seconds[-1]:.2f} s")


if __name__ == "__main__":
    main()
