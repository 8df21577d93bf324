#!/usr/bin/env bash
# carma-monitor under valgrind on the NVML stand-in: GPM samples are
# allocated and freed by NVML every interval, per GPU, for the life of the
# daemon; a leak there grows without bound on a GPU node. Runs the release
# carma-monitor for SECONDS (default 600) on a node of its own (a temporary
# directory: the stand-in, four H100s with load, carma.yaml), stops it with
# SIGTERM as systemd does, and fails if valgrind finds memory definitely
# lost or any memory error.
#
#   tests/leak.sh [SECONDS]     prints the monitor's sample count and
#                               valgrind's leak summary
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$repo/target}
PROFILE=${PROFILE:-release}
seconds=${1:-600}
bin=$TARGET/$PROFILE
command -v valgrind >/dev/null || { echo "leak.sh: valgrind not installed (tests/cluster.sh deps installs it)" >&2; exit 1; }
[ -x "$bin/carma-monitor" ] && [ -f "$bin/libnvidia_ml.so" ] || { echo "leak.sh: build first: cargo build --profile $PROFILE --workspace" >&2; exit 1; }

node=$(mktemp -d /tmp/carma-leak.XXXXXX)
chmod 0755 "$node"
trap 'rm -rf "$node"' EXIT
install -d -m 0755 "$node/state"
install -d -m 1777 "$node/procs"
ln -s "$bin/libnvidia_ml.so" "$node/libnvidia-ml.so.1"
cat >"$node/sim-gpus.yaml" <<CONF
process_dir: $node/procs
gpus:
  - {index: 0, uuid: GPU-leak-0, memory_total: 80G, memory_used: 20G, sm_activity: 0.4, busy: 0.9}
  - {index: 1, uuid: GPU-leak-1, memory_total: 80G}
  - {index: 2, uuid: GPU-leak-2, memory_total: 80G, memory_used: 4G, sm_activity: 0.1, busy: 0.3}
  - {index: 3, uuid: GPU-leak-3, memory_total: 80G}
standin:
  profile: h100
  replay: {file: $repo/data/h100/collocation.csv, gpus: {1: mps/resnet50_64+bert_base_16}}
CONF
cat >"$node/carma.yaml" <<CONF
gpu_source: {nvml: {library: $node/libnvidia-ml.so.1}}
state_dir: $node/state
log_file: $node/carma.log
monitor: {published: true, interval: 100ms, slurm_node: carma-leak-check-no-such-node, admission_interval: 60s, metrics: off}
monitor_window: 5s
CONF
# A registered process on GPU 3 (its memory and SM use, read through NVML).
sleep $((seconds + 60)) &
holder=$!
printf '{"pid":%d,"gpus":[{"index":3,"used_mib":8192,"sm":0.5,"busy":0.6}]}' "$holder" >"$node/procs/$holder.json"

valgrind --leak-check=full --show-leak-kinds=definite --errors-for-leak-kinds=definite \
    --error-exitcode=3 --log-file="$node/valgrind.log" \
    "$bin/carma-monitor" --config "$node/carma.yaml" &
monitor=$!
sleep "$seconds"
samples=$(grep -o '"samples":[0-9]*' "$node/state/readings.json" 2>/dev/null | head -1 | cut -d: -f2 || true)
kill -TERM "$monitor"
rc=0
wait "$monitor" || rc=$?
kill "$holder" 2>/dev/null || true
echo "leak.sh: carma-monitor ran ${seconds} s under valgrind on 4 stand-in H100s (100 ms interval; window of ${samples:-0} samples at the end), exit $rc"
grep -E 'in use at exit|total heap usage|definitely lost|indirectly lost|possibly lost|still reachable|ERROR SUMMARY|Invalid|uninitialised' "$node/valgrind.log" || true
tail -3 "$node/carma.log"
[ "$rc" = 0 ] || { echo "leak.sh: valgrind found leaks or memory errors (above)" >&2; exit 1; }
[ "${samples:-0}" -gt 0 ] || { echo "leak.sh: the monitor published nothing" >&2; exit 1; }
echo "leak.sh: no memory definitely lost, no memory errors"
