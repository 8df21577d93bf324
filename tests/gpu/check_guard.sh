#!/usr/bin/env bash
# GPU check for the slowdown guard (issue #56), for a GPU node: run as root
# from the repository root with the release binaries built (or CARMA_BIN) and
# PyTorch, torchvision and pynvml installed. Uses GPU 0 only; nothing else
# should run on it. About 2.5 minutes.
#
#   tests/gpu/check_guard.sh [OUT_DIR]     (default $OUT, else /tmp/carma-gpu-check)
#
# Real training jobs time-sliced on one GPU, as data/h100/collocation.csv was
# measured: each alone (its profile: what carma-monitor reads while it runs
# alone, as the guard learns it), then two pairs and one set of three. Each
# set's window is written in collocation.csv's format (guard.csv), and
# `carma calibrate` holds the slowdown model against it job by job and says
# whether the guard would admit each set. guard_summary.py prints PASS/FAIL
# lines and writes guard-summary.json.
set -euo pipefail
out=${1:-${OUT:-/tmp/carma-gpu-check}}
bin=${CARMA_BIN:-target/release}
here=$(cd "$(dirname "$0")" && pwd)
install -d "$out"
work=$(mktemp -d)
install -d -m 0700 -o root -g root "$work/state"
cat >"$work/carma.yaml" <<CONF
gpu_source: nvml
state_dir: $work/state
monitor: {published: true, interval: 500ms, stale_after: 10s, metrics: off}
monitor_window: 6s
CONF
"$bin/carma-monitor" --config "$work/carma.yaml" >"$out/guard-monitor.log" 2>&1 &
monitor=$!
trap 'kill $monitor 2>/dev/null; kill $(jobs -p) 2>/dev/null; true' EXIT
export CUDA_VISIBLE_DEVICES=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader -i 0 >"$out/guard-device.txt"

# One set: its jobs (MODEL_BATCH) started together, 24 s each; the monitor's
# window means are kept 18 s in (a 6 s window after 12 s of warm-up, the
# jobs' own steps logged throughout), with nvidia-smi's view.
run_set() {
    local label=$1 job pids=()
    shift
    for job in "$@"; do
        python3 "$here/train.py" --model "${job%_*}" --batch "${job##*_}" --seconds 24 >"$out/guard-$label-$job.log" 2>&1 &
        pids+=($!)
    done
    sleep 18
    cp "$work/state/readings.json" "$out/guard-$label-readings.json"
    nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -i 0 >"$out/guard-$label-smi.csv"
    wait "${pids[@]}" || true
    echo "$label $*" >>"$out/guard-sets.txt"
}

: >"$out/guard-sets.txt"
run_set solo1 resnet50_64
run_set solo2 mobilenet_32
run_set solo3 resnet18_32
run_set pair1 mobilenet_32 resnet18_32
run_set pair2 resnet50_64 mobilenet_32
run_set three mobilenet_32 resnet18_32 resnet50_64
kill $monitor 2>/dev/null || true
python3 "$here/guard_summary.py" "$out" "$bin/carma"
