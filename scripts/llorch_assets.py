"""The models of ASSETS.md and where the scripts find them, shared by the fixture and bench scripts.

The cache is ${LLORCH_ASSETS:-$HOME/.cache/llorch}/models, filled by `scripts/fetch-assets.sh`.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

MODELS = {
    "smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "qwen05": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "qwen15": "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    "gemma3": "gemma-3-270m-q4_k_m.gguf",
}

REPO = Path(__file__).resolve().parent.parent


def models_dir() -> Path:
    return Path(os.environ.get("LLORCH_ASSETS", Path.home() / ".cache" / "llorch")) / "models"


def fixture_args(description: str, fixtures: str) -> argparse.Namespace:
    """`[--models DIR] [--out DIR] [key ...]` for a script writing tests/fixtures/<fixtures>/."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--models", type=Path, default=models_dir())
    parser.add_argument("--out", type=Path, default=REPO / "tests" / "fixtures" / fixtures)
    parser.add_argument("keys", nargs="*", help=f"models to do (default: all of {', '.join(MODELS)})")
    args = parser.parse_args()
    unknown = [k for k in args.keys if k not in MODELS]
    if unknown:
        parser.error(f"unknown model key(s) {unknown}; known: {list(MODELS)}")
    args.keys = args.keys or list(MODELS)
    return args
