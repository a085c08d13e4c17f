#!/usr/bin/env bash
# The project's test command (README, .ci/run): fetch the real assets, lint, build the
# binaries the black-box tests spawn, run every test. GPU tests are #[ignore]d here and run on
# a GPU host with `cargo test -- --ignored`.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/fetch-assets.sh all >/dev/null
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo build --workspace --bins --locked
cargo test --workspace --locked
