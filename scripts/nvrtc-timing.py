#!/usr/bin/env python3
"""Where a cold start's kernel compilation goes: NVRTC on the CUDA backend's program, as
backend-cuda/src/program.rs defines it (the files of `SOURCE` concatenated in its order, the options
of `compile_options`), whole and file by file.

    scripts/nvrtc-timing.py [--arch sm_90] [--nvrtc PATH/libnvrtc.so] [--runs 1] [--files K] [--jobs J]

For each k it compiles the first k files of the program and reports the time and the increment
over k - 1 files: the increment is what file k's kernels cost (earlier files are only helpers
to it, and parsing them is in the k - 1 figure). Then the whole program once more, as the worker
compiles it. `--jobs J` compiles J prefixes at once (ctypes releases the GIL; each compile is
single-threaded, so on a host of at least J idle cores the figures hardly change). Needs libnvrtc (the CUDA toolkit's, or a `nvidia-cuda-nvrtc` wheel's, with its
folder on LD_LIBRARY_PATH for libnvrtc-builtins) and nothing else: ctypes, standard library only. Run it on the GPU host (no GPU is touched; the arch is
given).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import ctypes
import glob
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROGRAM_RS = ROOT / "backend-cuda" / "src" / "program.rs"
KERNELS = ROOT / "backend-cuda" / "kernels"


def program_files() -> list[str]:
    """The kernel files of `SOURCE`, in program.rs's order."""
    text = PROGRAM_RS.read_text()
    source = text[text.index("pub const SOURCE"):]
    source = source[: source.index(");")]
    return re.findall(r'include_str!\("\.\./kernels/([a-z_]+\.cu)"\)', source)


def compile_options(arch: str) -> list[str]:
    """program.rs's `compile_options`, read from the source so the two cannot drift: its fixed
    options and a -D for each entry of KERNEL_CONSTANTS."""
    text = PROGRAM_RS.read_text()
    body = text[text.index("pub fn compile_options"):]
    body = body[: body.index("\n}")]
    options = [o for o in re.findall(r'"(--[^"]+)"', body) if "{" not in o]
    values = dict(re.findall(r"pub const ([A-Z_0-9]+): usize = (\d+);", text))
    table = text[text.index("pub const KERNEL_CONSTANTS"):]
    table = table[: table.index("];")]
    defines = [f"-D{name}={values[const]}"
               for name, const in re.findall(r'\("([A-Z_0-9]+)", ([A-Z_0-9]+)\)', table)]
    return [f"--gpu-architecture={arch}"] + options + defines


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
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--nvrtc", help="path of libnvrtc.so")
    parser.add_argument("--runs", type=int, default=1, help="compiles per prefix (the least is kept)")
    parser.add_argument("--files", type=int, help="stop after this many files (no whole-program run)")
    parser.add_argument("--jobs", type=int, default=1, help="prefixes compiled at once")
    args = parser.parse_args()
    nvrtc = find_nvrtc(args.nvrtc)
    major, minor = ctypes.c_int(), ctypes.c_int()
    nvrtc.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    options = compile_options(args.arch)
    files = program_files()[: args.files]
    print(f"NVRTC {major.value}.{minor.value}, options {' '.join(options)}")
    sources = []
    for name in files:
        sources.append((sources[-1] if sources else "") + (KERNELS / name).read_text())
    if args.files is None:
        sources.append(sources[-1])

    def timed(source: str) -> float:
        return min(compile_seconds(nvrtc, source, options) for _ in range(args.runs))

    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        seconds = list(pool.map(timed, sources))
    print("| files | last file | lines | seconds | increment |")
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
