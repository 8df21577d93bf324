#!/usr/bin/env bash
# Every GPU check in one run, for a GPU machine lent for a few minutes: run
# as root from the repository root, with the release binaries in
# target/release (or CARMA_BIN). Each check runs under its own time limit;
# the whole output is packed into OUT/gpu-check.tgz, with the summaries
# beside it (at most a handful of files come back from a lent machine).
#
#   tests/gpu/run_all.sh [OUT_DIR]     (default $OUT, else /tmp/carma-gpu-check)
set -uo pipefail
out=${1:-${OUT:-/tmp/carma-gpu-check}}
here=$(cd "$(dirname "$0")" && pwd)
install -d "$out"
# It starts and stops its own carma-monitor and MPS daemon, and stops by
# name what a check left behind: on a node running either, it would stop
# the site's. An idle node (drained, or a test machine) only.
for p in carma-monitor nvidia-cuda-mps; do
    ! pgrep -x "$p" >/dev/null || { echo "run_all.sh: $p runs here: use an idle GPU node" >&2; exit 1; }
done
work=$(mktemp -d)
export PYTHONUNBUFFERED=1
{
    date -u
    uname -a
    nvidia-smi
    nvidia-smi -q -i 0 | grep -E "Product Name|Driver Version|Minor Number|MIG Mode|Current  *:" | head -8
    ls -l /dev/nvidia*
    python3 -c 'import torch, pynvml; print("torch", torch.__version__, "pynvml", pynvml.__file__)'
    command -v nvidia-cuda-mps-control runuser
} >"$work/env.txt" 2>&1
for check in monitor:180 mps:100 guard:170; do
    name=${check%%:*}
    limit=${check#*:}
    t0=$(date +%s)
    timeout -k 5 "$limit" "$here/check_$name.sh" "$work/$name" >"$work/$name.out" 2>&1
    echo "check_$name.sh: exit $? after $(($(date +%s) - t0)) s" | tee -a "$work/runs.txt"
    grep -E '^(PASS|FAIL)' "$work/$name.out"
    # A check stopped at its limit leaves its daemons and jobs behind.
    pkill -x carma-monitor; pkill -f tests/gpu/train.py; pkill -f mps_client.py; pkill -f guard_summary.py; sleep 1
    # NVIDIA's MPS daemon and server (the kernel names both so) left by a
    # check stopped at its limit: they daemonised, out of its reach.
    pkill -x nvidia-cuda-mps
done
tar czf "$out/gpu-check.tgz" -C "$work" .
cp "$work/runs.txt" "$work/env.txt" "$out/"
for f in "$work/monitor/summary.json" "$work/mps/mps-summary.json" "$work/guard/guard-summary.json" \
    "$work/guard/guard.csv" "$work/guard/guard-calibrate.txt"; do [ -f "$f" ] && cp "$f" "$out/"; done
true
