#!/usr/bin/env bash
# GPU check for MPS as CARMA meets it (issue #39): run as root from the
# repository root on a GPU node, with the release binaries (target/release,
# or CARMA_BIN) and PyTorch. Uses GPU 0 only; nothing else should run on it.
#
#   tests/gpu/check_mps.sh [OUT_DIR]     (default $OUT, else /tmp/carma-gpu-check)
#
# It starts NVIDIA's control daemon for GPU 0 as a site's unit does (root,
# one pipe directory per GPU), carma-monitor beside it, and two clients of
# one unprivileged user with the environment the plugin gives a sharing step
# (pipe directory, fence `0=2048M`): one allocates 1 GiB, one 3 GiB. While
# they run it keeps the process tree (who is the server's parent, as whom
# each runs), the monitor's readings, a direct `carma status --json`, and
# nvidia-smi's view. summarize_mps.py prints the checks, writes
# mps-summary.json.
set -uo pipefail
out=${1:-${OUT:-/tmp/carma-gpu-check}}
bin=${CARMA_BIN:-target/release}
here=$(cd "$(dirname "$0")" && pwd)
user=${CARMA_GPU_USER:-carmagpu}
install -d "$out"
control=$(command -v nvidia-cuda-mps-control) || {
    echo "no nvidia-cuda-mps-control on PATH" | tee "$out/mps-missing.txt"
    exit 2
}
id -u "$user" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$user"
work=$(mktemp -d)
chmod 0755 "$work"
install -d -m 0755 "$work/state" "$work/mps/0" "$work/mps-log/0"
install -d -m 0700 -o "$user" "$work/home"
cat >"$work/carma.yaml" <<CONF
gpu_source: nvml
state_dir: $work/state
activity_metric: sm
monitor: {published: true, interval: 1s, stale_after: 10s}
monitor_window: 5s
CONF
"$bin/carma-monitor" --config "$work/carma.yaml" >"$out/mps-monitor.log" 2>&1 &
monitor=$!
# Pids whose executable is a file named $1 (pgrep sees only the first 15
# characters of a name, and both NVIDIA programs begin `nvidia-cuda-mps`).
pids_of() {
    local p
    for p in /proc/[0-9]*; do
        [ "$(basename "$(readlink "$p/exe" 2>/dev/null)" 2>/dev/null)" = "$1" ] && echo "${p#/proc/}"
    done
    true
}
pipe_env=(CUDA_VISIBLE_DEVICES=0 CUDA_MPS_PIPE_DIRECTORY="$work/mps/0" CUDA_MPS_LOG_DIRECTORY="$work/mps-log/0")
stop_daemon() { echo quit | env "${pipe_env[@]}" "$control" >/dev/null 2>&1; }
trap 'stop_daemon; kill $monitor 2>/dev/null; kill $(jobs -p) 2>/dev/null; true' EXIT
# As slurm-conf-examples/carma-mps@.service starts it.
env CUDA_DEVICE_ORDER=PCI_BUS_ID "${pipe_env[@]}" "$control" -d
sleep 1
pids_of nvidia-cuda-mps-control >"$out/mps-control.pid"

# The plugin's environment for a sharing step (spank-plugin/src/ctx/remote/mps.rs).
# The script is copied where the user can read it.
install -m 0644 "$here/mps_client.py" "$work/mps_client.py"
client() {
    runuser -u "$user" -- env HOME="$work/home" "${pipe_env[@]}" CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2048M \
        python3 "$work/mps_client.py" "$@"
}
client --gib 1 --hold 20 >"$out/mps-client-1g.json" 2>"$out/mps-client-1g.err" &
client --gib 3 --hold 20 >"$out/mps-client-3g.json" 2>"$out/mps-client-3g.err" &
sleep 12
ps -eo pid,ppid,ruid,euid,comm,args >"$out/mps-ps.txt"
for pid in $(pids_of nvidia-cuda-mps-server); do
    ppid=$(awk '/^PPid:/ {print $2}' "/proc/$pid/status")
    printf '%s %s %s %s %s %s %s\n' "$pid" "$(awk '/^Uid:/ {print $2}' "/proc/$pid/status")" "$(readlink "/proc/$pid/exe")" \
        "$ppid" "$(awk '/^Uid:/ {print $2}' "/proc/$ppid/status")" "$(readlink "/proc/$ppid/exe")" \
        "$(stat -L -c '%u:%a' "/proc/$ppid/exe")"
done >"$out/mps-servers.txt"
cp "$work/state/readings.json" "$out/mps-readings.json"
cat >"$work/direct.yaml" <<CONF
gpu_source: nvml
state_dir: $work/state
activity_metric: sm
CONF
"$bin/carma" status --json --config "$work/direct.yaml" >"$out/mps-status-direct.json" 2>"$out/mps-status-direct.err"
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader,nounits >"$out/mps-apps.csv"
id -u "$user" >"$out/mps-user-uid.txt"
wait %2 %3 2>/dev/null
stop_daemon
python3 "$here/summarize_mps.py" "$out"
