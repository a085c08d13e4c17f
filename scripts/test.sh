#!/usr/bin/env bash
# The project's test command (README, .ci/run): fetch the real assets, lint, build the
# binaries the black-box tests spawn, run every test. GPU tests are #[ignore]d here and run on
# a GPU host with `cargo test -- --ignored`.
set -euo pipefail
cd "$(dirname "$0")/.."
# A clean clone's build gains nothing from incremental state and writes it for every crate
# (measured on the 2-core CI machine: the test-profile build is faster without it).
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}

scripts/fetch-assets.sh all >/dev/null
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# Everything `cargo test` runs plus the binaries the black-box tests spawn, in one build: the
# test profile and, with the test targets in it, the dev-dependencies' features, so that
# `cargo test` below finds every unit built (a build of the binaries alone resolves other
# features and compiles the dependencies twice). The binaries land in target/debug, beside the
# test executables that look for them.
cargo build --workspace --all-targets --locked --profile test
cargo test --workspace --locked
# The CPU kernels' unit tests again at each lower instruction-set level this CPU has (the
# default run above used its best; specs/CPU_NUMERICS.md).
levels=(scalar)
grep -qw avx512f /proc/cpuinfo && levels+=(avx2)
for isa in "${levels[@]}"; do
  LLORCH_CPU_ISA=$isa cargo test -p backend-cpu --lib --locked -q
done
