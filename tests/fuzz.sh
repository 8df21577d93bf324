#!/usr/bin/env bash
# Runs every fuzz target for a bounded time (FUZZ_SECONDS each, default 15)
# on the corpus kept in fuzz/corpus. Needs cargo-fuzz (installed if
# missing); the stable toolchain builds it with RUSTC_BOOTSTRAP=1.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${FUZZ_SECONDS:-15}
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked -q
export RUSTC_BOOTSTRAP=1
cargo fuzz build -O
# The ONNX target alone needs tract-onnx: built in a second pass, so the
# text targets do not link it. An unoptimised build without ASan (all safe
# code): tract builds in ~2 min instead of ~8, runs about as many inputs
# (decoding dominates), and has the overflow checks that the shape walk's
# arithmetic on hostile dimensions needs.
onnx=(--dev -s none --features onnx)
cargo fuzz build "${onnx[@]}" onnx_walk
for t in $(cargo fuzz list); do
    # A scratch copy: new inputs found here are not committed by accident.
    work=$(mktemp -d)
    cp -r "fuzz/corpus/$t/." "$work/"
    flags=(-O); [ "$t" = onnx_walk ] && flags=("${onnx[@]}")
    out=$(cargo fuzz run "${flags[@]}" "$t" "$work" -- -max_total_time="$secs" -print_final_stats=1 2>&1) || {
        echo "$out" | tail -30
        echo "fuzz.sh: target $t failed; the crashing input is in fuzz/artifacts/$t" >&2
        exit 1
    }
    runs=$(echo "$out" | sed -n 's/^stat::number_of_executed_units: *//p')
    echo "fuzz: $t: $runs executions in ${secs}s, no crash"
    rm -rf "$work"
done
