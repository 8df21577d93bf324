#!/usr/bin/env bash
# A real Slurm cluster on 127.0.0.1 with the CARMA plugin installed (the
# host's Slurm 22.05, or a newer release inside a tests/releases.sh chroot),
# used by the tests, CI and the demo: node $NODE with 4 simulated GPUs, and
# a second node ${NODE}b (4 more) for multi-node jobs. CARMA reads them as
# GPU nodes' are read, through NVML (gpu_source: nvml): the NVML stand-in
# (nvml-standin/, /usr/lib/carma-sim/libnvidia-ml.so.1 from the
# carma-slurm-sim package) presents each node's simulated GPUs: $SIM for
# the first (found through ld.so.conf.d), and the file beside the second's
# copy of the library, which its carma.yaml names. Both slurmd run on this
# host: Debian's Slurm is not built with --enable-multiple-slurmd, but a
# second slurmd with its own Port=, spool, pid file and plugstack (hence its
# own carma.yaml, CARMA state and simulated GPUs) works; slurmd reads its
# copy of slurm.conf (-f), so the config hash check is off (NO_CONF_HASH).
# Placement on the second node reads carma-monitor's published readings;
# on the first it reads the simulated GPUs directly (instant readings, which
# most suites rely on).
#
# Partitions: debug (default; $NODE), shared ($NODE), multi, wide and widet
# (both nodes; wide and widet admit CARMA jobs by GPU memory).
# shared, multi and widet are transparent-collocation scopes (carma.yaml
# transparent:, applied by slurmctld's job_submit/lua).
#
#   tests/cluster.sh deps      install Debian packages (Slurm, munge, clang)
#   tests/cluster.sh start     build the Debian packages from target/$PROFILE
#                              (packaging/build-deb.sh), install them, (re)start
#                              munged, slurmctld, slurmd
#   tests/cluster.sh stop      stop the daemons (by pid file); on the host also
#                              a cluster left in a release's chroot (the demo's)
#   tests/cluster.sh start-monitor   (re)start carma-monitor for the second node
#
# On the host (not in a release's chroot) it also runs Debian's Prometheus on
# 127.0.0.1:9491, scraping both nodes' carma-monitor endpoints (127.0.0.1:9402
# and :9403) every second (tests/load.rs, tests/prometheus.rs).
#   tests/cluster.sh status
#
# Runs as root on a throwaway machine: it owns /etc/slurm/{slurm,gres,plugstack}.conf
# and /etc/slurm/carma.yaml, and refuses to overwrite files it did not write.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
PROFILE=${PROFILE:-release}
NODE=$(hostname -s)
MARK="# written by carma tests/cluster.sh"
RUN=/run/carma-cluster
VAR=/var/lib/carma-cluster
LOG=/var/log/carma-cluster
# Where the carma-slurm package installs: every test runs what admins get.
PLUGIN=/usr/lib/carma/carma_spank.so
EPILOG=/usr/sbin/carma-epilog
TARGET=${CARGO_TARGET_DIR:-$repo/target}
SIM=/etc/carma/sim-gpus.yaml
STANDIN=/usr/lib/carma-sim/libnvidia-ml.so.1
TEST_USER=carmatest
NODE2=${NODE}b
N2=/etc/slurm/node2
# The second node's stand-in: a link to the library and its own GPUs.
STANDIN2=/etc/carma/standin-$NODE2
TEST_USER2=carmatest2
# One MPS control daemon per GPU of the second node, each in its pipe
# directory: the carma-slurm-sim package's stand-in for NVIDIA's, run as
# root (start_mps). It makes the `control` pipe CARMA looks for and starts
# each user's MPS server itself, as NVIDIA's does.
MPS_PIPE=/run/carma-mps
MPS_CONTROL=/usr/lib/carma-sim/nvidia-cuda-mps-control

die() { echo "cluster.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root (it writes /etc/slurm and starts daemons)"

deps() {
    local pkgs=(slurm-wlm slurmctld slurmd slurm-client munge libslurm-dev clang libclang-dev)
    # Slurm built from source under SLURM_PREFIX (tests/releases.sh src-*):
    # Debian's Slurm must not come in beside it.
    [ -z "${SLURM_PREFIX:-}" ] || pkgs=(munge)
    # The host also runs carma-monitor under valgrind (tests/leak.sh) and a
    # Prometheus server (tests/prometheus.rs), and builds and checks the RPMs
    # (rpm: rpmbuild); a release's chroot does not.
    [ -n "${CARMA_CHROOT:-}" ] || pkgs+=(valgrind prometheus curl rpm)
    local missing=()
    for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "cluster.sh: installing ${missing[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
}

# Writes $1 from stdin unless it exists and was not written by us.
owned_write() {
    local f=$1
    if [ -e "$f" ] && ! grep -qF "$MARK" "$f" && [ -s "$f" ]; then
        # Debian ships a one-line plugstack.conf that includes plugstack.conf.d: safe to replace.
        if ! { [ "$f" = /etc/slurm/plugstack.conf ] && grep -q '^include /etc/slurm/plugstack.conf.d' "$f" && [ "$(grep -cv '^\s*\(#\|$\)' "$f")" -le 1 ]; }; then
            die "$f exists and was not written by this script; move it away first"
        fi
    fi
    install -d "$(dirname "$f")"
    cat >"$f.tmp.$$"
    mv "$f.tmp.$$" "$f"
}

# gres.conf for a node whose GPU of NVML index i is /dev/nvidia(i+$1).
# Slurm numbers GPUs by their File= names (sorted), so these stay in NVML's
# order (docs/isolation.md).
gres_conf() {
    local off=$1 g
    echo "$MARK"
    echo "Name=nic File=/dev/carma-nic0"
    echo "Name=migcap File=/dev/nvidia-caps/nvidia-cap1"
    for g in 0 1 2 3; do echo "Name=gpu File=/dev/nvidia$((g + off))"; done
    for g in 0 1 2 3; do echo "Name=shard Count=8 File=/dev/nvidia$((g + off))"; done
    echo "Name=carmamem Count=160"
}

write_config() {
    grep -qE "^[0-9.]+\s.*\b$NODE\b" /etc/hosts || echo "127.0.0.1 $NODE" >>/etc/hosts
    install -d -m 0755 "$RUN" "$LOG"
    install -d -m 0755 "$VAR" "$VAR/d"
    install -d -m 0700 "$VAR/ctld"
    owned_write /etc/slurm/slurm.conf <<CONF
$MARK
ClusterName=carma
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=$VAR/ctld
SlurmdSpoolDir=$VAR/d
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd.log
SlurmdDebug=verbose
SlurmctldDebug=info
# Device isolation as sites run it: a step opens only its GPUs (cgroup.conf).
ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerParameters=sched_interval=1,bf_interval=1
MinJobAge=600
PlugStackConfig=/etc/slurm/plugstack.conf
# Transparent collocation: --gres=gpu:N jobs in carma.yaml's scopes become shards.
JobSubmitPlugins=lua
CliFilterPlugins=lua
# ${NODE2}'s slurmd reads its own copy of this file (see the top of cluster.sh).
DebugFlags=NO_CONF_HASH
# OOM recovery: detects GPU OOM crashes of CARMA jobs and requeues them.
# job_submit.lua marks CARMA jobs requeueable one by one; the cluster's
# default stays off, as a site may have it, so that the suites show it.
Epilog=$EPILOG
JobRequeue=0
# carmamem: GPU memory in GiB, a count-only GRES for admission (docs/admission.md).
GresTypes=gpu,shard,carmamem,nic,migcap
# More CPUs than exist, so that many small jobs run at once.
SlurmdParameters=config_overrides
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=32 Gres=gpu:4,shard:32,carmamem:160,nic:1,migcap:1 State=UNKNOWN
NodeName=$NODE2 NodeHostname=$NODE NodeAddr=127.0.0.1 Port=6819 CPUs=32 Gres=gpu:4,shard:32,carmamem:160,nic:1,migcap:1 State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
PartitionName=shared Nodes=$NODE MaxTime=INFINITE State=UP
PartitionName=multi Nodes=$NODE,$NODE2 MaxTime=INFINITE State=UP
# Both nodes, CARMA jobs admitted by GPU memory (carma.yaml admission:);
# widet also collocates plain GPU jobs transparently.
PartitionName=wide Nodes=$NODE,$NODE2 MaxTime=INFINITE State=UP
PartitionName=widet Nodes=$NODE,$NODE2 MaxTime=INFINITE State=UP
# Preemption with requeue (tests/recovery.rs): only a job in urgent preempts,
# only jobs in lowprio are requeued by it; no other test uses either.
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
PartitionName=lowprio Nodes=$NODE MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE
PartitionName=urgent Nodes=$NODE MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF
CONF
    # Four GPUs backed by character devices (Slurm 22.05 needs File=), each
    # split into 8 shards for collocated jobs: /dev/nvidiaN as the driver
    # makes them (c 195:N). Without a driver behind them an open that the
    # device cgroup allows fails with ENXIO, one it denies with EPERM.
    # ${NODE2}'s GPUs are /dev/nvidia4..7 (minors 4-7 for NVML indices
    # 0-3, as a driver may number them): grants must name minors, not indices.
    local g
    for g in 0 1 2 3 4 5 6 7; do
        if [ ! -c /dev/nvidia$g ]; then
            rm -f /dev/nvidia$g
            mknod -m 0666 /dev/nvidia$g c 195 $g
        fi
    done
    # Devices of other kinds that Slurm hands out and denies as it does GPUs
    # (tests/isolation.rs: a CARMA grant must keep those denials): a NIC and
    # a MIG capability file, with majors of the "local/experimental use"
    # range 120-127 (outside the kernel's dynamic 234-254), refused if a
    # driver here has taken them.
    local major
    for major in 120 121; do
        ! awk -v m="$major" '/^Block/ {exit} $1 == m {found = 1} END {exit !found}' /proc/devices ||
            die "character major $major belongs to a driver here (/proc/devices); the test devices need it free"
    done
    if [ "$(stat -c %F:%a:%t:%T /dev/carma-nic0 2>/dev/null)" != "character special file:666:78:0" ]; then
        rm -f /dev/carma-nic0
        mknod -m 0666 /dev/carma-nic0 c 120 0
    fi
    install -d -m 0755 /dev/nvidia-caps
    if [ "$(stat -c %F:%a:%t:%T /dev/nvidia-caps/nvidia-cap1 2>/dev/null)" != "character special file:666:79:1" ]; then
        rm -f /dev/nvidia-caps/nvidia-cap1
        mknod -m 0666 /dev/nvidia-caps/nvidia-cap1 c 121 1
    fi
    gres_conf 0 | owned_write /etc/slurm/gres.conf
    # Device isolation through the kernel's cgroups: v1's devices controller
    # on this hybrid host and its chroots; cgroup/v2 (a BPF device program
    # per step) where the hierarchy is pure cgroup2, as in tests/vm.sh's VM;
    # there without systemd to ask for a scope (docs/isolation.md).
    local cgroup="CgroupPlugin=cgroup/v1"
    if ! grep -qv '^0::' /proc/self/cgroup; then
        cgroup="CgroupPlugin=cgroup/v2"
        [ -d /run/systemd/system ] || cgroup=$(printf '%s\nIgnoreSystemd=yes' "$cgroup")
    fi
    owned_write /etc/slurm/cgroup.conf <<CONF
$MARK
$cgroup
ConstrainDevices=yes
ConstrainCores=no
ConstrainRAMSpace=no
CONF
    owned_write /etc/slurm/plugstack.conf <<CONF
$MARK
required $PLUGIN config=/etc/slurm/carma.yaml
CONF
    owned_write /etc/slurm/carma.yaml <<CONF
$MARK
default_policy: magm
# CARMA picks among all the node's GPUs, as the suites written before
# gpu_owner (#37) expect; tests/owner.rs runs the default (slurm: a job's
# GPUs are those Slurm allocated it) and shows what carma costs on a node
# where plain GPU jobs also run.
gpu_owner: carma
# The NVML stand-in's GPUs ($SIM), as a GPU node reads its driver's.
gpu_source: nvml
# The suites written before the slowdown guard (#56) place fake jobs no
# node has profiled yet beside each other, which the guard refuses (an
# unknown job counts as filling its GPU), and expect each policy's own
# order (ff: the lowest GPU), which idle-first changes. tests/guard.rs
# turns both on; placement/src/policy/guard_tests.rs and the simulator
# test them too.
max_slowdown: off
idle_first: false
state_dir: /run/carma
log_file: /var/log/carma/carma.log
timeouts: {lock: 5s, wait: 60s, poll: 250ms}
# This node does not learn its fixed memory: the tests' fakejobs outgrow
# their estimates on purpose, and estimates must not depend on test order.
# The second node learns from the last 3 jobs (tests/estimator.rs).
estimator: {learn_runtime: {min_jobs: 0}}
# Jobs asking for whole GPUs are collocated here (tests/transparent.rs).
transparent:
  - {partition: shared, default_mem: 14G}
  - {partition: multi, default_mem: 4G}
  - {partition: widet, default_mem: 4G}
# slurmctld sends CARMA jobs of this partition only where their GPU memory
# is free (tests/admission.rs).
admission:
  - {partition: wide}
  - {partition: widet}
# carma-monitor keeps the node's admission count (started by
# tests/admission.rs for this node; always running for the second).
monitor: {admission_interval: 1s, metrics: '127.0.0.1:9402'}
CONF
    # Slurm under its own prefix: CARMA runs that Slurm's commands, not PATH's.
    [ -z "${SLURM_PREFIX:-}" ] || echo "slurm_bin_dir: $SLURM_PREFIX/bin" >>/etc/slurm/carma.yaml
    local lua
    for lua in job_submit cli_filter; do
        { echo "-- $MARK"; grep -v '^--' "$repo/slurm-conf-examples/$lua.lua"; } | owned_write "/etc/slurm/$lua.lua"
    done
    owned_write "$SIM" <<CONF
$MARK
# Four simulated A100-40GB GPUs; running carma-fakejobs register in process_dir.
process_dir: /run/carma-sim
gpus:
  - {index: 0, uuid: GPU-sim-0, memory_total: 40G}
  - {index: 1, uuid: GPU-sim-1, memory_total: 40G}
  - {index: 2, uuid: GPU-sim-2, memory_total: 40G}
  - {index: 3, uuid: GPU-sim-3, memory_total: 40G}
CONF
    write_node2
}

# ${NODE2}: the same configuration with its own slurmd files, plugstack,
# carma.yaml (state in /run/carma2, its own simulated GPUs) and epilog.
write_node2() {
    install -d -m 0755 "$N2" "$RUN/b" "$VAR/d2"
    sed -e "s#^SlurmdSpoolDir=.*#SlurmdSpoolDir=$VAR/d2#" \
        -e "s#^SlurmdPidFile=.*#SlurmdPidFile=$RUN/b/slurmd.pid#" \
        -e "s#^SlurmdLogFile=.*#SlurmdLogFile=$LOG/slurmd-$NODE2.log#" \
        -e "s#^PlugStackConfig=.*#PlugStackConfig=$N2/plugstack.conf#" \
        -e "s#^Epilog=.*#Epilog=$N2/epilog#" /etc/slurm/slurm.conf | owned_write "$N2/slurm.conf"
    gres_conf 4 | owned_write "$N2/gres.conf"
    owned_write "$N2/cgroup.conf" </etc/slurm/cgroup.conf
    sed "s#/etc/slurm/carma.yaml#$N2/carma.yaml#" /etc/slurm/plugstack.conf | owned_write "$N2/plugstack.conf"
    {
        sed -e "s#^gpu_source: .*#gpu_source: {nvml: {library: $STANDIN2/libnvidia-ml.so.1}}#" -e "s#^state_dir: .*#state_dir: /run/carma2#" \
            -e "s#^log_file: .*#log_file: /var/log/carma/carma-$NODE2.log#" \
            -e "s#^estimator: .*#estimator: {learn_runtime: {min_jobs: 3, window: 3}}#" -e "/^monitor: /d" /etc/slurm/carma.yaml
        # This node's placement reads carma-monitor's readings (tests/monitor.rs).
        echo "monitor: {published: true, interval: 250ms, stale_after: 2s, slurm_node: $NODE2, admission_interval: 1s, metrics: '127.0.0.1:9403'}"
        echo "monitor_window: 2s"
        # and its collocated jobs share GPUs as MPS clients (tests/mps.rs).
        echo "sharing: mps"
        echo "mps: {pipe_dir: $MPS_PIPE, log_dir: /var/log/carma-mps}"
    } | owned_write "$N2/carma.yaml"
    # The same GPUs with their minors (gres_conf 4).
    sed "s#/run/carma-sim#/run/carma-sim2#" "$SIM" |
        awk 'match($0, /\{index: [0-9]+, /) { i = substr($0, RSTART + 8, RLENGTH - 10); sub(/\{index: [0-9]+, /, "{index: " i ", minor: " i + 4 ", ") } { print }' |
        owned_write "$STANDIN2/sim-gpus.yaml"
    ln -sfn "$STANDIN" "$STANDIN2/libnvidia-ml.so.1"
    owned_write "$N2/epilog" <<CONF
#!/bin/sh
$MARK
exec $EPILOG --config=$N2/carma.yaml
CONF
    chmod 0755 "$N2/epilog"
}

install_carma() {
    local t=$TARGET/$PROFILE debs=$TARGET/debian series requires=1
    series=$("$repo/packaging/slurm-series.sh" "${SLURM_PREFIX:-/usr}/include")
    # A source build is no Debian package the .deb could require.
    [ -z "${SLURM_PREFIX:-}" ] || requires=0
    [ -f "$t/carma" ] || die "$t/carma missing: run cargo build --profile $PROFILE --workspace first"
    # The plugin for this Slurm series (tests/releases.sh builds the other
    # releases' before entering their chroots, where there is no cargo).
    if [ ! -f "$t/slurm-$series/libcarma_spank.so" ]; then
        command -v cargo >/dev/null || die "$t/slurm-$series/libcarma_spank.so missing: run packaging/build-plugin.sh"
        "$repo/packaging/build-plugin.sh" "${SLURM_PREFIX:-/usr}/include" >/dev/null
    fi
    # The target directory is shared by every release's cluster: only this
    # series' packages are replaced.
    rm -f "$debs"/carma-slurm*+slurm"$series"_*.deb
    CARMA_SLURM_SERIES=$series CARMA_DEB_SLURM_REQUIRES=$requires "$repo/packaging/build-deb.sh" "$t" "$debs"
    dpkg -i "$debs"/carma-slurm_*+slurm"$series"_*.deb "$debs"/carma-slurm-sim_*+slurm"$series"_*.deb >/dev/null
    # Copies an earlier version of this script installed by hand would
    # shadow the package's (/usr/local/bin comes first on PATH).
    rm -f /usr/local/bin/carma /usr/local/bin/carma-fakejob /usr/local/sbin/carma-epilog
    rm -rf /usr/local/lib/carma
    id "$TEST_USER" >/dev/null 2>&1 || useradd -m -s /bin/bash "$TEST_USER"
    # A second user, for MPS's one-user-per-GPU rule.
    id "$TEST_USER2" >/dev/null 2>&1 || useradd -m -s /bin/bash "$TEST_USER2"
    # A project group of the first user only: output readable through it
    # alone (tests/recovery.rs, the epilog reads as the user with its groups).
    getent group carmashare >/dev/null 2>&1 || groupadd carmashare
    id -nG "$TEST_USER" | grep -qw carmashare || usermod -a -G carmashare "$TEST_USER"
    local g
    for g in 0 1 2 3; do
        install -d -m 0755 "$MPS_PIPE/$g"
        # Left by a daemon that was killed: the pipe means a daemon runs.
        rm -f "$MPS_PIPE/$g/control" "$MPS_PIPE/$g/control.sock"
    done
    # The first node's NVML is the stand-in, on the loader's path as a
    # driver's library is.
    printf "%s\n%s\n" "$MARK" /usr/lib/carma-sim | owned_write /etc/ld.so.conf.d/carma-nvml-standin.conf
    ldconfig
    [ "$(ldconfig -p | grep -c 'libnvidia-ml.so.1 ')" -ge 1 ] || die "ldconfig does not list the NVML stand-in"
    # Simulated GPU processes register here (like /tmp: users create, only owners delete).
    install -d -m 1777 /run/carma-sim /run/carma-sim2
    rm -f /run/carma-sim/*.json /run/carma-sim2/*.json
    # A fresh cluster has no running jobs: start CARMA's node state empty.
    install -d -m 0755 -o root -g root /run/carma /run/carma2 /var/log/carma
    rm -f /run/carma/state.json /run/carma/state.json.* /run/carma2/state.json /run/carma2/state.json.* /run/carma2/readings.json
}

pid_of() { local p; p=$(cat "$1" 2>/dev/null) && kill -0 "$p" 2>/dev/null && echo "$p"; }

PROMETHEUS_ADDR=127.0.0.1:9491

# Prometheus scraping both nodes' monitors (host only: the chroots lack it).
start_prometheus() {
    [ -z "${CARMA_CHROOT:-}" ] || return 0
    command -v prometheus >/dev/null || die "prometheus missing (tests/cluster.sh deps installs it)"
    local pid
    if pid=$(pid_of "$RUN/prometheus.pid"); then kill "$pid"; sleep 0.5; fi
    rm -rf "$VAR/prometheus"
    install -d -m 0755 "$VAR/prometheus"
    cat >"$RUN/prometheus.yml" <<CONF
$MARK
global: {scrape_interval: 1s, scrape_timeout: 1s}
scrape_configs:
  - job_name: carma
    static_configs:
      - targets: ['127.0.0.1:9402', '127.0.0.1:9403']
CONF
    setsid prometheus --config.file="$RUN/prometheus.yml" --storage.tsdb.path="$VAR/prometheus" \
        --web.listen-address="$PROMETHEUS_ADDR" </dev/null >>"$LOG/prometheus.log" 2>&1 &
    echo $! >"$RUN/prometheus.pid"
    for _ in $(seq 100); do curl -sf "http://$PROMETHEUS_ADDR/-/ready" >/dev/null 2>&1 && return 0; sleep 0.1; done
    tail -5 "$LOG/prometheus.log" >&2
    die "Prometheus not ready on $PROMETHEUS_ADDR within 10 s"
}

# A cluster in a release's chroot (tests/releases.sh), such as the one
# ./demo.sh leaves running in sid's: it holds Slurm's ports, and this host's
# Slurm cannot talk to another release's slurmctld, so it is stopped from
# inside with its own tools. A chroot whose /run is not mounted runs none.
# From inside a chroot the others are out of sight: nothing to do.
stop_chroots() {
    [ -z "${CARMA_CHROOT:-}" ] || return 0
    local cache=${CARMA_RELEASES_CACHE:-/var/cache/carma-releases} r
    for r in trixie sid $(cd "$cache" 2>/dev/null && ls -d src-*/ 2>/dev/null | tr -d /); do
        [ -f "$cache/$r/.carma-ready" ] && mountpoint -q "$cache/$r/run" || continue
        echo "cluster.sh: stopping the cluster in $r's chroot ($cache/$r)"
        (cd "$repo" && tests/releases.sh enter "$r" tests/cluster.sh stop) || true
        (cd "$repo" && tests/releases.sh umount "$r") || true
    done
}

stop() {
    stop_chroots
    scontrol shutdown >/dev/null 2>&1 || true
    local prom
    if prom=$(pid_of "$RUN/prometheus.pid"); then kill -TERM "$prom" 2>/dev/null || true; fi
    rm -f "$RUN/prometheus.pid"
    # Monitors do not stop with slurmctld: all told at once (tests/scale.sh
    # runs one per node).
    local pid
    for p in "$RUN/b/carma-monitor.pid" "$RUN"/scale/monitor-*.pid "$RUN"/b/mps-*.pid; do
        if pid=$(pid_of "$p"); then kill -TERM "$pid" 2>/dev/null || true; fi
    done
    # tests/scale.sh's slurmds and monitors too, where it ran.
    for p in "$RUN/slurmd.pid" "$RUN/b/slurmd.pid" "$RUN"/scale/*.pid "$RUN/slurmctld.pid" "$RUN/b/carma-monitor.pid" "$RUN"/b/mps-*.pid; do
        for _ in $(seq 50); do pid=$(pid_of "$p") || break; sleep 0.1; done
        if pid=$(pid_of "$p"); then kill -TERM "$pid" 2>/dev/null || true; sleep 1; kill -KILL "$pid" 2>/dev/null || true; fi
        rm -f "$p"
    done
    # Leftover slurmstepds of killed jobs would hold GPUs in CARMA's state.
    pkill -KILL -x slurmstepd 2>/dev/null || true
    remove_job_cgroups
}

# Job cgroups a killed step left behind (cgroup/v1: this host's hierarchy,
# which its chroots share). Job ids restart with each cluster, and slurmd
# reuses a job_N directory it finds: a new job would enter an old task's
# cgroup and its device rules (measured on 24.11: a plain job denied its
# own GPU by the task_0 rules of an earlier cluster's CARMA job). The
# killed steps' tasks live on in them: they go first.
remove_job_cgroups() {
    local roots=() root procs left
    for root in /sys/fs/cgroup/*/slurm_"$NODE" /sys/fs/cgroup/*/slurm_"$NODE2" /sys/fs/cgroup/*/slurm_"$NODE"-s*; do
        [ -d "$root" ] && roots+=("$root")
    done
    [ ${#roots[@]} -gt 0 ] || return 0
    # A step's cgroup Slurm froze to kill it takes no signal until thawed.
    find /sys/fs/cgroup/freezer/slurm_"$NODE"* -path '*/job_*' -name freezer.state 2>/dev/null |
        while read -r f; do echo THAWED >"$f" 2>/dev/null || true; done
    for _ in $(seq 50); do
        procs=$(find "${roots[@]}" -path '*/job_*' -name cgroup.procs -exec cat {} + 2>/dev/null || true)
        [ -n "$procs" ] || pgrep -x slurmstepd >/dev/null || break
        # shellcheck disable=SC2086
        [ -z "$procs" ] || kill -KILL $procs 2>/dev/null || true
        sleep 0.1
    done
    find "${roots[@]}" -mindepth 1 -depth -type d -exec rmdir {} + 2>/dev/null || true
    # tests/scale.sh's nodes' roots too (the test cluster's stay).
    for root in "${roots[@]}"; do
        case $root in *-s[0-9][0-9][0-9]) rmdir "$root" 2>/dev/null || true ;; esac
    done
    left=$(find "${roots[@]}" -mindepth 1 -type d -name 'job_*' -print -quit 2>/dev/null || true)
    [ -z "$left" ] || echo "cluster.sh: job cgroups still in use, left in place (such as $left)" >&2
}

start_munge() {
    # This root's own munged (its pid file and socket): a cluster in a
    # chroot (tests/releases.sh) has its own /run beside the host's munged.
    if pid_of /run/munge/munged.pid >/dev/null && [ -S /run/munge/munge.socket.2 ]; then return; fi
    install -d -o munge -g munge -m 0755 /run/munge
    [ -f /etc/munge/munge.key ] || { dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 2>/dev/null; chown munge:munge /etc/munge/munge.key; chmod 0400 /etc/munge/munge.key; }
    runuser -u munge -- /usr/sbin/munged
}

wait_idle() {
    local node=$1 log=$2
    for _ in $(seq 150); do
        local st
        st=$(sinfo -h -N -n "$node" -o %T 2>/dev/null | head -1 || true)
        case "$st" in idle|mixed|allocated) return 0 ;; esac
        sleep 0.2
    done
    sinfo -N -l >&2 || true
    tail -20 "$log" "$LOG/slurmctld.log" >&2 || true
    die "node $node did not become idle within 30 s"
}

# The MPS control daemons of $NODE2's GPUs, as root, as the site starts
# NVIDIA's (slurm-conf-examples/carma-mps@.service): the stand-in
# (carma-fake-mps-control) registers each server on the stand-in's GPU.
start_mps() {
    local g pid
    for g in 0 1 2 3; do
        # One that runs already goes first (it removes its pipe and socket).
        if pid=$(pid_of "$RUN/b/mps-$g.pid"); then
            kill "$pid"
            for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
            # Past 5 s it goes by force: it must not remove the new one's.
            kill -KILL "$pid" 2>/dev/null || true
        fi
        # A killed daemon's pipe and socket would pass for the new one's.
        rm -f "$MPS_PIPE/$g/control" "$MPS_PIPE/$g/control.sock"
        install -d -m 0755 "$MPS_PIPE/$g"
        setsid "$MPS_CONTROL" --pipe-dir "$MPS_PIPE/$g" --gpu "$g" --sim-gpus "$STANDIN2/sim-gpus.yaml" \
            </dev/null >>"$LOG/carma-mps-control-$g.log" 2>&1 &
        echo $! >"$RUN/b/mps-$g.pid"
    done
    for g in 0 1 2 3; do
        for _ in $(seq 50); do
            [ -S "$MPS_PIPE/$g/control.sock" ] && [ -p "$MPS_PIPE/$g/control" ] && continue 2
            sleep 0.1
        done
        tail -5 "$LOG/carma-mps-control-$g.log" >&2
        die "the MPS control daemon of $NODE2's GPU $g did not start within 5 s"
    done
}

# carma-monitor for $NODE2 (as its systemd unit would run it).
start_monitor() {
    local pid
    if pid=$(pid_of "$RUN/b/carma-monitor.pid"); then kill "$pid"; sleep 0.3; fi
    setsid /usr/sbin/carma-monitor --config "$N2/carma.yaml" </dev/null >>"$LOG/carma-monitor-$NODE2.log" 2>&1 &
    echo $! >"$RUN/b/carma-monitor.pid"
    for _ in $(seq 50); do [ -s /run/carma2/readings.json ] && return 0; sleep 0.1; done
    tail -5 "$LOG/carma-monitor-$NODE2.log" >&2
    die "carma-monitor for $NODE2 published nothing within 5 s"
}

start() {
    deps
    stop
    write_config
    install_carma
    # The scopes slurmctld's job_submit.lua reads (it runs no command).
    /usr/bin/carma transparent-scopes --config /etc/slurm/carma.yaml --output /etc/slurm/carma-scopes
    start_munge
    slurmctld -c
    slurmd -N "$NODE"
    start_monitor
    start_prometheus
    start_mps
    slurmd -N "$NODE2" -f "$N2/slurm.conf"
    wait_idle "$NODE" "$LOG/slurmd.log"
    wait_idle "$NODE2" "$LOG/slurmd-$NODE2.log"
    # A node drained by an earlier run (failed prolog/epilog) is resumed.
    scontrol update nodename="$NODE,$NODE2" state=resume >/dev/null 2>&1 || true
    echo "cluster.sh: $NODE and $NODE2 up with 4 simulated GPUs each behind the NVML stand-in; CARMA plugin $PLUGIN"
}

# tests/scale.sh reads this file for its functions.
[ -z "${CARMA_CLUSTER_SOURCED:-}" ] || return 0

case "${1:-}" in
    deps) deps ;;
    start) start ;;
    start-monitor) start_monitor ;;
    start-mps) start_mps ;;
    stop) stop ;;
    status) sinfo -N -l; scontrol show node "$NODE,$NODE2" | grep -E 'State|Gres' ;;
    *) die "usage: $0 deps|start|stop|status" ;;
esac
