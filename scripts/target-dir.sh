#!/usr/bin/env bash
# Prints the workspace's cargo target folder, as cargo resolves it: CARGO_TARGET_DIR, a
# `build.target-dir` in a cargo config, or `target/` in the workspace root. Scripts run built
# binaries as "$(scripts/target-dir.sh)/release/<name>", never a hard-coded `target/release`.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])'
