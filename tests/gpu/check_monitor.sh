#!/usr/bin/env bash
# GPU check for carma-monitor (issue #13), for a GPU node: run as root from
# the repository root with the release binaries built (cargo build --release
# --workspace, or carried in target/release) and PyTorch, torchvision and
# pynvml installed. Uses GPU 0 only; nothing else should run on it.
#
#   tests/gpu/check_monitor.sh [OUT_DIR]     (default $OUT, else /tmp/carma-gpu-check)
#
# It starts carma-monitor with its own carma.yaml and state directory, runs
# two light PyTorch jobs, then one heavy one, and after each full window
# keeps: the monitor's readings, pynvml GPM's SM activity, nvidia-smi's busy
# time and per-process memory, and `carma place --dry-run`. summarize.py
# prints the checks and writes summary.json.
#
set -euo pipefail
out=${1:-${OUT:-/tmp/carma-gpu-check}}
bin=${CARMA_BIN:-target/release}
here=$(cd "$(dirname "$0")" && pwd)
install -d "$out"
work=$(mktemp -d)
install -d -m 0755 -o root -g root "$work/state"
cat >"$work/carma.yaml" <<CONF
gpu_source: nvml
state_dir: $work/state
activity_metric: sm
monitor: {published: true, interval: 1s, stale_after: 10s}
monitor_window: 10s
CONF
# The same node read directly (one NVML read per command, no monitor).
cat >"$work/direct.yaml" <<CONF
gpu_source: nvml
state_dir: $work/state
activity_metric: sm
CONF
"$bin/carma-monitor" --config "$work/carma.yaml" >"$out/monitor.log" 2>&1 &
monitor=$!
trap 'kill $monitor 2>/dev/null; kill $(jobs -p) 2>/dev/null; true' EXIT
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader -i 0 >"$out/device.txt"
# The device file the driver gives GPU 0: what a job's device cgroup must allow.
nvidia-smi -q -i 0 | awk -F: '/Minor Number/ {gsub(/ /, "", $2); print $2}' >"$out/minor.txt"

# After one full window of the workload (from its first training steps:
# PyTorch takes seconds to start): everything the checks compare.
sample() {
    local label=$1 log
    shift
    for log in "$@"; do
        for _ in $(seq 120); do grep -q '^step' "$log" 2>/dev/null && break; sleep 0.5; done
    done
    sleep 11
    cp "$work/state/readings.json" "$out/readings-$label.json"
    nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader,nounits -i 0 >"$out/smi-$label.csv"
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits >"$out/apps-$label.csv"
    python3 "$here/gpm_smutil.py" 0 >"$out/gpm-$label.json"
    python3 "$here/nvml_samples.py" 0 1 >"$out/samples-$label.json"
    "$bin/carma" status --json --config "$work/direct.yaml" >"$out/direct-$label.json" 2>&1 || true
    "$bin/carma" place --dry-run --config "$work/carma.yaml" --mem 2G --policy ff >"$out/dryrun-$label.txt" 2>&1 || true
    timed "$out/status-seconds-$label.txt" "$bin/carma" status --config "$work/carma.yaml" >"$out/status-$label.txt" || true
}

# Appends the wall time of a command, in seconds, to $1.
timed() {
    local file=$1 t0 t1
    shift
    t0=$(date +%s.%N)
    "$@"
    t1=$(date +%s.%N)
    python3 -c "print(round($t1 - $t0, 4))" >>"$file"
}

export CUDA_VISIBLE_DEVICES=0
python3 "$here/train.py" --model tiny --batch 64 --seconds 30 >"$out/light1.log" 2>&1 &
python3 "$here/train.py" --model tiny --batch 64 --seconds 30 >"$out/light2.log" 2>&1 &
sample light "$out/light1.log" "$out/light2.log"
wait %2 %3 2>/dev/null || true
python3 "$here/train.py" --model resnet50 --batch 64 --seconds 30 >"$out/heavy.log" 2>&1 &
sample heavy "$out/heavy.log"
wait %4 2>/dev/null || true
# The cost of a direct NVML read (the fallback placement takes when the
# monitor's readings are stale): carma status with the monitor stopped.
kill $monitor; sleep 11
for _ in 1 2 3 4 5; do timed "$out/direct-read-seconds.txt" "$bin/carma" status --config "$work/carma.yaml" >/dev/null 2>&1 || true; done
python3 "$here/summarize.py" "$out"
