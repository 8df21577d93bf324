#!/usr/bin/env bash
# A scale cluster on this host (#42): one slurmctld and N slurmd (as
# tests/cluster.sh runs its two: a port, spool, pid file, plugstack and
# carma.yaml per node), each node with 4 simulated GPUs behind its own
# NVML stand-in file, its own CARMA state directory and its own
# carma-monitor (published readings, admission count on), all in one
# partition `scale` whose CARMA jobs are admitted by GPU memory. With
# `off`, the same cluster without CARMA: no plugin, no Lua, no monitors,
# no epilog: what the site had before.
#
#   tests/scale.sh start N [off]   (re)start it (stops the test cluster)
#   tests/scale.sh burst N [off] [JOBS_PER_NODE]
#                                  start it, submit JOBS_PER_NODE (4) short
#                                  jobs per node at once, wait for them all,
#                                  and print what slurmctld served (sdiag:
#                                  RPCs by type and user) and what each part
#                                  cost in memory and CPU
#   tests/scale.sh stop            stop it (tests/cluster.sh stop)
#
# tests/cluster.sh start puts the test cluster back afterwards.
set -euo pipefail
CARMA_CLUSTER_SOURCED=1
# shellcheck source=tests/cluster.sh
. "$(cd "$(dirname "$0")" && pwd)/cluster.sh"

SC=/etc/slurm/scale
# Measured: 8.5-8.6 per job with CARMA on (16 nodes, 26.05), 1.1 off; 13.6
# on 22.05 at 64 nodes, where 162 steps waited (docs/admission.md): a
# waiting step's polls grow with its wait, hence the margin.
MAX_ROOT_RPCS_PER_JOB=${SCALE_MAX_ROOT_RPCS_PER_JOB:-20}
# Node k is $NODE-s<k, 3 digits>; its slurmd listens on 7000+k.
node_name() { printf '%s-s%03d' "$NODE" "$1"; }
node_range() { printf '%s-s[001-%03d]' "$NODE" "$1"; }

write_scale() {
    local n=$1 carma=$2 k
    write_config
    install -d -m 0755 "$SC" "$RUN/scale" "$LOG/scale" "$VAR/scale"
    rm -rf "${SC:?}"/* "$RUN"/scale/* /run/carma-sim-"$NODE"-s* /run/carma-scale
    # The test cluster's slurm.conf without its nodes, partitions and
    # preemption; CARMA's parts only where it is on.
    local base
    base=$(grep -vE '^(NodeName|PartitionName|PreemptType|PreemptMode)=' /etc/slurm/slurm.conf)
    if [ "$carma" = off ]; then
        echo "$MARK" >"$SC/plugstack-off.conf"
        base=$(printf '%s\n' "$base" | grep -vE '^(JobSubmitPlugins|CliFilterPlugins|Epilog)=' |
            sed "s#^PlugStackConfig=.*#PlugStackConfig=$SC/plugstack-off.conf#")
    fi
    # As the site snippet has it from 23.11 on: a job's shards come from
    # the least loaded GPU (22.05 takes them all from the first).
    local major
    major=$(slurmctld -V | awk '{split($2, v, "."); print v[1]}')
    [ "$major" -lt 23 ] || base=$(printf '%s\n' "$base" | sed 's/^SelectTypeParameters=.*/SelectTypeParameters=CR_Core,LL_SHARED_GRES/')
    {
        printf '%s\n' "$base"
        for k in $(seq "$n"); do
            echo "NodeName=$(node_name "$k") NodeHostname=$NODE NodeAddr=127.0.0.1 Port=$((7000 + k)) CPUs=32 Gres=gpu:4,shard:32,carmamem:160 State=UNKNOWN"
        done
        echo "PartitionName=scale Nodes=$(node_range "$n") Default=YES MaxTime=INFINITE State=UP"
    } | owned_write /etc/slurm/slurm.conf
    # The scopes job_submit.lua reads: admission by GPU memory in `scale`.
    sed -i -e '/^transparent:/,/^[a-z]/{/^  - /d}' -e 's/^transparent:$/transparent: []/' \
        -e '/^admission:/,/^[a-z]/{/^  - /d}' -e 's/^admission:$/admission: [{partition: scale}]/' /etc/slurm/carma.yaml
    /usr/bin/carma transparent-scopes --config /etc/slurm/carma.yaml --output /etc/slurm/carma-scopes
    for k in $(seq "$n"); do
        local name d
        name=$(node_name "$k")
        d=$SC/$name
        install -d -m 0755 "$d" "$VAR/scale/$name"
        sed -e "s#^SlurmdSpoolDir=.*#SlurmdSpoolDir=$VAR/scale/$name#" \
            -e "s#^SlurmdPidFile=.*#SlurmdPidFile=$RUN/scale/$name.pid#" \
            -e "s#^SlurmdLogFile=.*#SlurmdLogFile=$LOG/scale/$name.log#" \
            -e "s#^SlurmdDebug=.*#SlurmdDebug=error#" \
            -e "s#^PlugStackConfig=.*#PlugStackConfig=$d/plugstack.conf#" \
            -e "s#^Epilog=.*#Epilog=$d/epilog#" /etc/slurm/slurm.conf >"$d/slurm.conf"
        # Every node's GPUs are /dev/nvidia0-3: isolation is per node's
        # cgroups, and tests/cluster.sh checks minors on its two nodes.
        { gres_conf 0 | grep -vE 'nic|migcap'; } >"$d/gres.conf"
        cp /etc/slurm/cgroup.conf "$d/cgroup.conf"
        if [ "$carma" = off ]; then
            echo "$MARK" >"$d/plugstack.conf"
            continue
        fi
        echo "required $PLUGIN config=$d/carma.yaml" >"$d/plugstack.conf"
        install -d -m 1777 "/run/carma-sim-$name"
        install -d -m 0755 "/run/carma-scale/$name"
        rm -f "/run/carma-sim-$name"/*.json "/run/carma-scale/$name"/*
        sed "s#/run/carma-sim\$#/run/carma-sim-$name#" "$SIM" >"$d/sim-gpus.yaml"
        ln -sfn "$STANDIN" "$d/libnvidia-ml.so.1"
        cat >"$d/carma.yaml" <<CONF
$MARK
default_policy: magm
gpu_source: {nvml: {library: $d/libnvidia-ml.so.1}}
state_dir: /run/carma-scale/$name
log_file: /var/log/carma/carma-scale.log
timeouts: {lock: 5s, wait: 60s, poll: 250ms}
monitor: {published: true, interval: 2s, stale_after: 10s, slurm_node: $name, admission_interval: 10s}
CONF
        [ -z "${SLURM_PREFIX:-}" ] || echo "slurm_bin_dir: $SLURM_PREFIX/bin" >>"$d/carma.yaml"
        printf '#!/bin/sh\n%s\nexec %s --config=%s/carma.yaml\n' "$MARK" "$EPILOG" "$d" >"$d/epilog"
        chmod 0755 "$d/epilog"
    done
}

start_scale() {
    local n=$1 carma=${2:-on} k
    [ "$n" -ge 1 ] && [ "$n" -le 200 ] || die "scale: N must be 1-200"
    deps
    stop
    install_carma
    write_scale "$n" "$carma"
    start_munge
    slurmctld -c
    for k in $(seq "$n"); do
        local name
        name=$(node_name "$k")
        slurmd -N "$name" -f "$SC/$name/slurm.conf"
        [ "$carma" = off ] && continue
        setsid /usr/sbin/carma-monitor --config "$SC/$name/carma.yaml" </dev/null >>"$LOG/scale/monitor-$name.log" 2>&1 &
        echo $! >"$RUN/scale/monitor-$name.pid"
    done
    local t0=$SECONDS up=0
    while [ $((SECONDS - t0)) -lt 120 ]; do
        up=$(sinfo -h -N -p scale -t idle,mixed,allocated -o %N 2>/dev/null | sort -u | wc -l || true)
        [ "$up" -ge "$n" ] && break
        sleep 1
    done
    [ "$up" -ge "$n" ] || { sinfo -N | head -20 >&2; die "scale: $up of $n nodes up after 120 s"; }
    echo "scale.sh: $n nodes up (CARMA $carma) in $((SECONDS - t0)) s"
}

# Resident memory in MiB of the processes whose pids are listed.
rss_mib() {
    local total=0 p kb
    for p in "$@"; do
        kb=$(awk '/^VmRSS:/ {print $2}' "/proc/$p/status" 2>/dev/null || echo 0)
        total=$((total + ${kb:-0}))
    done
    echo $((total / 1024))
}

# CPU seconds (user + system) a process has used.
cpu_s() { awk '{printf "%.1f", ($14 + $15) / '"$(getconf CLK_TCK)"'}' "/proc/$1/stat"; }

burst() {
    local n=$1 carma=${2:-on} per=${3:-4}
    start_scale "$n" "$carma"
    local ctld jobs=$((n * per)) opts=(-p scale --gres=shard:1 -o /dev/null)
    ctld=$(pid_of "$RUN/slurmctld.pid") || die "scale: slurmctld is not running"
    [ "$carma" = off ] || opts+=(--carma-mem=8G)
    # Let every monitor publish and set its count first.
    sleep 12
    sdiag -r >/dev/null
    local cpu0 t0
    cpu0=$(cpu_s "$ctld")
    t0=$(date +%s.%N)
    local i
    for i in $(seq "$jobs"); do
        runuser -u "$TEST_USER" -- sbatch --parsable "${opts[@]}" --wrap 'sleep 5' >/dev/null
    done
    local t_sub
    t_sub=$(date +%s.%N)
    # Polled as nobody, whose RPCs sdiag counts apart.
    local left=1 t_end
    while [ "$left" -gt 0 ]; do
        sleep 1
        # A busy slurmctld may not answer once: asked again (until 600 s).
        local queued
        if queued=$(runuser -u nobody -- squeue --local -h -t pending,running,completing -u "$TEST_USER" -o %i); then
            left=$(printf '%s' "$queued" | grep -c . || true)
        fi
        if awk -v t0="$t0" -v now="$(date +%s.%N)" 'BEGIN {exit !(now - t0 > 600)}'; then
            die "scale: $left jobs still not done after 600 s"
        fi
    done
    t_end=$(date +%s.%N)
    local states
    states=$(runuser -u nobody -- squeue --local -h -t all -u "$TEST_USER" -o %T | sort | uniq -c | awk '{printf "%s %s ", $1, $2}' || true)
    echo "== scale burst: $n nodes, CARMA $carma, $jobs jobs of 5 s (shard:1$([ "$carma" = off ] || echo ", carma-mem 8G")), $per per node"
    awk -v a="$t0" -v b="$t_sub" -v c="$t_end" -v j="$jobs" \
        'BEGIN {printf "submitted in %.1f s, all done in %.1f s (%.1f jobs/s end to end)\n", b - a, c - a, j / (c - a)}'
    echo "jobs: $states"
    echo "slurmctld: $(awk -v a="$cpu0" -v b="$(cpu_s "$ctld")" 'BEGIN {printf "%.1f", b - a}') CPU s during the burst, RSS $(rss_mib "$ctld") MiB"
    local slurmds monitors
    slurmds=$(cat "$RUN"/scale/"$NODE"-s*.pid 2>/dev/null | tr '\n' ' ' || true)
    monitors=$(cat "$RUN"/scale/monitor-*.pid 2>/dev/null | tr '\n' ' ' || true)
    # shellcheck disable=SC2086
    echo "slurmd: $(rss_mib $slurmds) MiB RSS in all ($n); carma-monitor: $( [ -n "$monitors" ] && rss_mib $monitors || echo 0) MiB in all"
    local rpcs
    rpcs=$(sdiag | sed -n '/by message type/,/Pending RPC/p' | grep -v '^$' | grep -v 'Pending RPC' || true)
    echo "$rpcs"
    # Every job of the burst fits somewhere: none may fail (for no fit or
    # anything else).
    [ "$states" = "$jobs COMPLETED " ] || die "scale: not every job completed: $states"
    # What CARMA may cost slurmctld (docs/admission.md): no federation
    # lookups (every squeue, the harness's too, is --local), and root's RPCs
    # per job (prolog/epilog, monitors, records) under a ceiling.
    ! grep -q 'REQUEST_FED_INFO' <<<"$rpcs" || die "scale: REQUEST_FED_INFO sent (an squeue without --local)"
    local root_rpcs
    root_rpcs=$(awk '/by user/ {u = 1} u && $1 == "root" {sub("count:", "", $4); print $4}' <<<"$rpcs")
    [ -n "$root_rpcs" ] || die "scale: sdiag listed no RPCs by root"
    awk -v r="$root_rpcs" -v j="$jobs" -v max="$MAX_ROOT_RPCS_PER_JOB" 'BEGIN {
        printf "root RPCs per job: %.1f (ceiling %s)\n", r / j, max; exit !(r / j <= max) }' ||
        die "scale: root sent more than $MAX_ROOT_RPCS_PER_JOB RPCs per job"
}

case "${1:-}" in
    start) start_scale "${2:?N}" "${3:-on}" ;;
    burst) burst "${2:?N}" "${3:-on}" "${4:-4}" ;;
    stop) stop ;;
    *) die "usage: $0 start N [off] | burst N [on|off] [JOBS_PER_NODE] | stop" ;;
esac
