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
#   tests/scale.sh replay N TRACE POLICY COMPRESS
#                                  start it with gpu_owner: carma and
#                                  no_fit: hand_back, submit the trace (a
#                                  CSV of data/carma, one copy per node, or
#                                  synthetic:JOBS:GAP, the simulator's
#                                  generator) at its arrival times divided
#                                  by COMPRESS as carma-fakejob jobs, wait
#                                  for them all and print what they did
#                                  against `carma simulate` of the same
#                                  (carma replay-compare) and what
#                                  slurmctld served
#   tests/scale.sh stop            stop it (tests/cluster.sh stop)
#
# tests/cluster.sh start puts the test cluster back afterwards.
set -euo pipefail
CARMA_CLUSTER_SOURCED=1
# shellcheck source=tests/cluster.sh
. "$(cd "$(dirname "$0")" && pwd)/cluster.sh"

SC=/etc/slurm/scale
SCALE_LOG=/var/log/carma/carma-scale.log
# Measured: 8.5-8.6 per job with CARMA on (16 nodes, 26.05), 1.1 off; 13.6
# on 22.05 at 64 nodes, where 162 steps waited (docs/admission.md): a
# waiting step's polls grow with its wait, hence the margin.
MAX_ROOT_RPCS_PER_JOB=${SCALE_MAX_ROOT_RPCS_PER_JOB:-20}
# Node k is $NODE-s<k, 3 digits>; its slurmd listens on 7000+k.
node_name() { printf '%s-s%03d' "$NODE" "$1"; }
node_range() { printf '%s-s[001-%03d]' "$NODE" "$1"; }

write_scale() {
    local n=$1 carma=$2 extra=${3:-} k
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
log_file: $SCALE_LOG
timeouts: {lock: 5s, wait: ${SCALE_WAIT:-60}s, poll: 250ms}
monitor: {published: true, interval: 2s, stale_after: 10s, slurm_node: $name, admission_interval: 10s}
# As the suites' cluster (tests/cluster.sh): the replay's fake jobs are
# placed beside each other before any has run alone, which the slowdown
# guard refuses: 812 hand-backs of 320 jobs and 109 root RPCs per job on
# 26.05 (CI, 2026-11-28). replay-compare is told the same.
max_slowdown: off
idle_first: false
$extra
CONF
        [ -z "${SLURM_PREFIX:-}" ] || echo "slurm_bin_dir: $SLURM_PREFIX/bin" >>"$d/carma.yaml"
        printf '#!/bin/sh\n%s\nexec %s --config=%s/carma.yaml\n' "$MARK" "$EPILOG" "$d" >"$d/epilog"
        chmod 0755 "$d/epilog"
    done
}

start_scale() {
    local n=$1 carma=${2:-on} extra=${3:-} k
    [ "$n" -ge 1 ] && [ "$n" -le 200 ] || die "scale: N must be 1-200"
    deps
    stop
    install_carma
    write_scale "$n" "$carma" "$extra"
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
    # Every job of the burst fits somewhere: none may fail (for no fit or
    # anything else); what slurmctld served is printed either way.
    if [ "$states" != "$jobs COMPLETED " ]; then
        served "$jobs" "$n" 1000000
        die "scale: not every job completed: $states"
    fi
    served "$jobs" "$n"
}

# What slurmctld served since `sdiag -r` (RPCs by type and user), and what
# CARMA may cost it (docs/admission.md): no federation lookups (every
# squeue, the harness's too, is --local), and root's RPCs per job
# (prolog/epilog, monitors, records) under a ceiling.
served() {
    local jobs=$1 n=$2 max=${3:-$MAX_ROOT_RPCS_PER_JOB} rpcs root_rpcs
    rpcs=$(sdiag | sed -n '/by message type/,/Pending RPC/p' | grep -v '^$' | grep -v 'Pending RPC' || true)
    echo "$rpcs"
    ! grep -q 'REQUEST_FED_INFO' <<<"$rpcs" || die "scale: REQUEST_FED_INFO sent (an squeue without --local)"
    root_rpcs=$(awk '/by user/ {u = 1} u && $1 == "root" {sub("count:", "", $4); print $4}' <<<"$rpcs")
    [ -n "$root_rpcs" ] || die "scale: sdiag listed no RPCs by root"
    awk -v r="$root_rpcs" -v j="$jobs" -v n="$n" -v max="$max" 'BEGIN {
        printf "root RPCs per job: %.1f (ceiling %s), per node: %.1f\n", r / j, max, r / n; exit !(r / j <= max) }' ||
        die "scale: root sent more than $max RPCs per job"
}

# Which of slurmctld's schedulers started the jobs since `sdiag -r` (the
# main one, run at each submission and end, stops at the partition's first
# job that does not fit; backfill passes, bf_interval apart, try the jobs
# behind it), and how far apart the backfill passes were over $1 s: what
# the simulator's --backfill-interval models (docs/replay.md).
sched_split() {
    sdiag | awk -v span="$1" '
        /^Main schedule statistics/ {sec = "main"} /^Backfilling stats/ {sec = "bf"}
        /^[ \t]*Jobs started:/ {started = $3}
        sec == "bf" && /Total backfilled jobs \(since last stats cycle start\)/ {bf = $NF}
        sec == "bf" && /^[ \t]*Total cycles:/ {cycles = $3}
        sec == "bf" && /^[ \t]*Mean cycle:/ {mean = $3}
        sec == "bf" && /^[ \t]*Depth Mean:/ {depth = $3}
        END {
            if (started == "" || bf == "" || cycles == "") { print "sdiag: no scheduler figures"; exit 1 }
            printf "slurmctld started %d jobs (runs), %d of them by backfill; %d backfill passes, one per %.2f s, a mean of %.1f ms over a mean depth of %s jobs\n",
                started, bf, cycles, (cycles ? span / cycles : 0), mean / 1000, depth }' ||
        die "scale: sdiag printed no scheduler figures"
}

# Seconds since $1 (date +%s.%N), to the millisecond.
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN {printf "%.3f", b - a}'; }

# Until every job of the test user has left the queue, or die after $1 s.
drain() {
    local limit=$1 t0=$SECONDS left=1 queued
    while [ "$left" -gt 0 ]; do
        sleep 2
        # Polled as nobody, whose RPCs sdiag counts apart; a busy
        # slurmctld may not answer once: asked again.
        if queued=$(runuser -u nobody -- squeue --local -h -t pending,running,completing,suspended -u "$TEST_USER" -o %i); then
            left=$(printf '%s' "$queued" | grep -c . || true)
        fi
        [ $((SECONDS - t0)) -lt "$limit" ] || die "scale: $left jobs still not done after $limit s"
        pid_of "$RUN/slurmctld.pid" >/dev/null || die "scale: slurmctld is gone with $left jobs left"
    done
}

# A job of the replay: its runs' start and end lines (times), the fake
# training job between them, its node's carma.yaml found at run time.
replay_script() {
    local mem=$1 sm=$2 busy=$3 work=$4 ramp=$5
    printf '%s' "echo start \$(date +%s.%N) \$SLURMD_NODENAME \$SLURM_STEP_GPUS; /usr/bin/carma-fakejob --mem ${mem}M --sm $sm --busy $busy --work $work --ramp $ramp --config $SC/\$SLURMD_NODENAME/carma.yaml; rc=\$?; echo end \$(date +%s.%N) \$rc; exit \$rc"
}

replay() {
    local n=$1 trace=$2 policy=$3 compress=$4 r=$VAR/scale-replay src
    case "$trace" in
        synthetic:*:*) src=(--synthetic "$(cut -d: -f2 <<<"$trace")" --gap "$(cut -d: -f3 <<<"$trace")") ;;
        *) src=(--trace "$trace" --copies "$n") ;;
    esac
    rm -rf "$r"
    install -d -m 0755 "$r"
    install -d -m 0755 -o "$TEST_USER" "$r/out"
    # The plugin's wait before it hands a job back and the monitor's
    # window, as short as the compressed trace's times (carma.yaml's
    # defaults are 30 s and 60 s): the simulator is told the same, and the
    # monitors' admission interval (10 s, write_scale).
    local wait=5 window=6 publish=2 pause=10
    SCALE_WAIT=$wait start_scale "$n" on "$(printf 'gpu_owner: carma\nno_fit: hand_back\nhand_back_pause: %ss\nmonitor_window: %ss' "$pause" "$window")"
    /usr/bin/carma replay-plan "${src[@]}" --workloads "$repo/data/carma/workloads.csv" --compress "$compress" --out "$r/plan" ||
        die "scale: carma replay-plan failed"
    local ctld cpu0 log0 t0 jobs=0
    ctld=$(pid_of "$RUN/slurmctld.pid") || die "scale: slurmctld is not running"
    sleep 12
    sdiag -r >/dev/null
    cpu0=$(cpu_s "$ctld")
    log0=$(stat -c %s "$SCALE_LOG")
    t0=$(date +%s.%N)
    local seq at gpus mem sm busy work ramp gres sub id late=0
    while read -r seq at gpus mem sm busy work ramp; do
        [ "${seq:0:1}" != "#" ] || continue
        # Submitted at its arrival time (behind it while sbatch is slow).
        sleep "$(awk -v at="$at" -v now="$(since "$t0")" 'BEGIN {d = at - now; printf "%.3f", (d > 0 ? d : 0)}')"
        gres=shard:1
        [ "$gpus" -le 1 ] || gres=gpu:$gpus
        sub=$(since "$t0")
        id=$(runuser -u "$TEST_USER" -- sbatch --parsable -p scale --gres="$gres" --carma-mem="${mem}M" \
            --carma-policy="$policy" -o "$r/out/$seq.out" --open-mode=append \
            --wrap "$(replay_script "$mem" "$sm" "$busy" "$work" "$ramp")") || die "scale: sbatch of job $seq failed"
        echo "$seq $sub $id" >>"$r/submitted"
        jobs=$((jobs + 1))
        late=$(awk -v a="$sub" -v b="$at" -v l="$late" 'BEGIN {d = a - b; print (d > l ? d : l)}')
    done <"$r/plan/jobs.tsv"
    echo "scale.sh: $jobs jobs submitted in $(since "$t0") s (at most $late s behind their arrival)"
    drain 3600
    local span
    span=$(since "$t0")
    # Each job's last placement: how long the plugin waited on the node for
    # a GPU (its time in the hook, from the nodes' log, root's).
    awk 'match($0, /: job [0-9]+ step batch: policy=.* in_hook=[0-9]+ms/) {
            n = split(substr($0, RSTART, RLENGTH), f, /[ =]/); print f[3], substr(f[n], 1, length(f[n]) - 2) / 1000}' \
        <(tail -c +$((log0 + 1)) "$SCALE_LOG") >"$r/node-wait"
    # Each job's last run: its start and end from the replay's start, exit
    # status, the times a node handed it back (the epilog's line), its
    # wait on the node and the times it paused, out of hand-backs.
    while read -r seq sub id; do
        # Read as the user who owns the outputs (root would follow a link).
        runuser -u "$TEST_USER" -- test -f "$r/out/$seq.out" || { echo "$seq $sub - - - 0"; continue; }
        runuser -u "$TEST_USER" -- timeout 10 awk -v seq="$seq" -v st="$sub" -v t0="$t0" \
            -v nw="$(awk -v id="$id" '$1 == id {w = $2} END {print (w == "" ? "-" : w)}' "$r/node-wait")" '
            $1 == "start" {s = sprintf("%.3f", $2 - t0); e = "-"; rc = "-"; runs++}
            $1 == "end" {e = sprintf("%.3f", $2 - t0); rc = $3}
            /requeued to run on another node/ {hb++}
            /requeued to wait/ {pz++}
            END {printf "%s %s %s %s %s %d %s %d\n", seq, st, runs ? s : "-", runs ? e : "-", runs ? rc : "-", hb, nw, pz}' \
            "$r/out/$seq.out"
    done <"$r/submitted" >"$r/results"
    echo "== scale replay: $n nodes, $trace, policy $policy, time / $compress: $jobs jobs, all left the queue after $span s"
    # The admission claim (#42): no job fails for want of a GPU; one the
    # cluster has no room for pauses in the queue (hand_back_pause) and
    # runs when a node has room. Every job must end with status 0: each
    # that did not is counted by what its output says (carma-epilog's
    # refusal to hand it back again; grep: 0 found, 1 not, 2 unreadable:
    # the check fails), one with no run that started and ended too.
    local nofit=0 other=0 never=0 seq rc
    while read -r seq rc; do
        if [ "$rc" = - ]; then
            never=$((never + 1))
            continue
        fi
        runuser -u "$TEST_USER" -- grep -qE "found no GPU on [^;]*;.*not handed back" "$r/out/$seq.out" && rc=0 || rc=$?
        case $rc in 0) nofit=$((nofit + 1)) ;; 1) other=$((other + 1)) ;; *) die "scale: cannot read $r/out/$seq.out" ;; esac
    done < <(awk '$5 != "0" {print $1, $5}' "$r/results")
    echo "failed for no GPU: $nofit, for another reason: $other, no run started and ended: $never (of $jobs jobs); paused out of hand-backs: $(awk '{p += $8} END {print p + 0}' "$r/results") times"
    [ "$nofit" -eq 0 ] || die "scale: $nofit job(s) failed for want of a GPU (hand_back_pause is on): see $r/out"
    [ $((other + never)) -eq 0 ] || die "scale: $other job(s) failed and $never had no run that started and ended: see $r/out and $r/results"
    sched_split "$span"
    echo "slurmctld: $(awk -v a="$cpu0" -v b="$(cpu_s "$ctld")" 'BEGIN {printf "%.1f", b - a}') CPU s during the replay, RSS $(rss_mib "$ctld") MiB"
    # The stand-in answers GPM as an H100 does (its default profile), so
    # the nodes cap SM activity (carma.yaml's default activity_metric).
    local ll=()
    [ "$(slurmctld -V | awk '{split($2, v, "."); print v[1]}')" -lt 23 ] || ll=(--least-loaded)
    # priority/basic (22.05's default) gives a job released from its
    # requeue hold a new priority, the lowest so far; others keep its place.
    # (grep reads it all: -q would end scontrol early, failing the pipe.)
    if scontrol show config | grep -E '^PriorityType += priority/basic' >/dev/null; then ll+=(--requeue-to-back); fi
    # A makespan is made by the last few long jobs: the simulator runs 8
    # more times, each submission up to a second later (Slurm's own start,
    # a median of half a second a job), and the real one is held against
    # their median (docs/replay.md). slurmctld as measured: backfill passes
    # bf_interval (1 s, cluster.sh) apart, its main scheduler in order
    # between them; a job handed back eligible 3 s after it is pending
    # again (the follow-up sets its start so).
    /usr/bin/carma replay-compare --plan "$r/plan" --results "$r/results" --cluster "${n}x4x40G" --policy "$policy" \
        --gpu-owner carma --cap-metric sm --max-slowdown off --no-idle-first --window "$window" --publish "$publish" --node-wait "$wait" --count-interval 10 --hand-back-pause "$pause" \
        --backfill --backfill-interval 1 --requeue-delay 3 --noise-runs 8 --noise 1 --fail-above "${SCALE_FAIL_ABOVE:-50}" "${ll[@]}" || die "scale: carma replay-compare failed (or the simulated median makespan is off the real by more than ${SCALE_FAIL_ABOVE:-50} %)"
    # Each hand-back is a failed step, a requeue and a record more: 10.6
    # to 20.4 per job measured (docs/replay.md).
    served "$jobs" "$n" 30
}

case "${1:-}" in
    start) start_scale "${2:?N}" "${3:-on}" ;;
    burst) burst "${2:?N}" "${3:-on}" "${4:-4}" ;;
    replay) replay "${2:?N}" "${3:?TRACE}" "${4:?POLICY}" "${5:?COMPRESS}" ;;
    stop) stop ;;
    *) die "usage: $0 start N [off] | burst N [on|off] [JOBS_PER_NODE] | replay N TRACE POLICY COMPRESS | stop" ;;
esac
