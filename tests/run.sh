#!/usr/bin/env bash
# The project's test command: builds everything, starts the local Slurm
# cluster with the freshly built plugin, runs unit and integration tests,
# and stops the cluster. Run as root on a throwaway Debian 12 machine.
set -euo pipefail
cd "$(dirname "$0")/.."

export PROFILE=release
export CARGO_TERM_COLOR=never
tests/cluster.sh deps
command -v cargo >/dev/null || { echo "run.sh: cargo not found (install Rust via rustup)" >&2; exit 1; }

echo "== build"
# All targets at once: tests and benches share one feature resolution, so
# nothing (tract-onnx above all) is compiled twice.
cargo build --profile "$PROFILE" --workspace --all-targets
tests/cluster.sh start
trap 'tests/cluster.sh stop' EXIT
# Tests append what they injected and survived here (tests/reliability-report.sh);
# the directory is also where the test user's job scripts and outputs go.
# Emptied first: an earlier run's outputs must not be read as this run's.
rm -rf /tmp/carma-tests
install -d -o carmatest /tmp/carma-tests
: > /tmp/carma-tests/reliability.log

echo "== benchmarks (figures, not pass/fail)"
# --workspace, not -p: the features stay those of the build above, so
# nothing is compiled again for a bench.
cargo bench -q --workspace --bench latency
cargo bench -q --workspace --bench speed
cargo bench -q --workspace --bench estimate

echo "== fuzzing (bounded)"
tests/fuzz.sh | tee -a /tmp/carma-tests/reliability.log

echo "== tests"
# Integration tests share one cluster and its 4 GPUs: run them one at a time.
cargo test --profile "$PROFILE" --workspace -- --test-threads=1
