#!/usr/bin/env bash
# A real single-node Slurm 22.05 cluster on 127.0.0.1 with 4 simulated GPUs
# and the CARMA plugin installed: used by the tests, CI and the demo.
#
#   tests/cluster.sh deps      install Debian packages (Slurm, munge, clang)
#   tests/cluster.sh start     build the Debian packages from target/$PROFILE
#                              (packaging/build-deb.sh), install them, (re)start
#                              munged, slurmctld, slurmd
#   tests/cluster.sh stop      stop the daemons (by pid file)
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
TEST_USER=carmatest

die() { echo "cluster.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root (it writes /etc/slurm and starts daemons)"

deps() {
    local pkgs=(slurm-wlm slurmctld slurmd slurm-client munge libslurm-dev clang libclang-dev)
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
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerParameters=sched_interval=1,bf_interval=1
MinJobAge=600
PlugStackConfig=/etc/slurm/plugstack.conf
# OOM recovery: detects GPU OOM crashes of CARMA jobs and requeues them.
Epilog=$EPILOG
JobRequeue=1
GresTypes=gpu,shard
# More CPUs than exist, so that many small jobs run at once.
SlurmdParameters=config_overrides
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=32 Gres=gpu:4,shard:32 State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
CONF
    # Four GPUs backed by character devices (Slurm 22.05 needs File=), each
    # split into 8 shards for collocated jobs.
    owned_write /etc/slurm/gres.conf <<CONF
$MARK
Name=gpu File=/dev/null
Name=gpu File=/dev/zero
Name=gpu File=/dev/full
Name=gpu File=/dev/urandom
Name=shard Count=8 File=/dev/null
Name=shard Count=8 File=/dev/zero
Name=shard Count=8 File=/dev/full
Name=shard Count=8 File=/dev/urandom
CONF
    owned_write /etc/slurm/plugstack.conf <<CONF
$MARK
required $PLUGIN config=/etc/slurm/carma.yaml
CONF
    owned_write /etc/slurm/carma.yaml <<CONF
$MARK
default_policy: magm
gpu_source: {simulated: $SIM}
state_dir: /run/carma
log_file: /var/log/carma/carma.log
timeouts: {lock: 5s, wait: 60s, poll: 250ms}
CONF
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
}

install_carma() {
    local t=$TARGET/$PROFILE debs=$TARGET/debian
    [ -f "$t/libcarma_spank.so" ] || die "$t/libcarma_spank.so missing: run cargo build --profile $PROFILE --workspace first"
    rm -f "$debs"/carma-slurm*.deb
    "$repo/packaging/build-deb.sh" "$t" "$debs"
    dpkg -i "$debs"/carma-slurm_*.deb "$debs"/carma-slurm-sim_*.deb >/dev/null
    # Copies an earlier version of this script installed by hand would
    # shadow the package's (/usr/local/bin comes first on PATH).
    rm -f /usr/local/bin/carma /usr/local/bin/carma-fakejob /usr/local/sbin/carma-epilog
    rm -rf /usr/local/lib/carma
    id "$TEST_USER" >/dev/null 2>&1 || useradd -m -s /bin/bash "$TEST_USER"
    # Simulated GPU processes register here (like /tmp: users create, only owners delete).
    install -d -m 1777 /run/carma-sim
    rm -f /run/carma-sim/*.json
    # A fresh cluster has no running jobs: start CARMA's node state empty.
    install -d -m 0755 -o root -g root /run/carma /var/log/carma
    rm -f /run/carma/state.json /run/carma/state.json.*
}

pid_of() { local p; p=$(cat "$1" 2>/dev/null) && kill -0 "$p" 2>/dev/null && echo "$p"; }

stop() {
    scontrol shutdown >/dev/null 2>&1 || true
    for p in "$RUN/slurmd.pid" "$RUN/slurmctld.pid"; do
        local pid
        for _ in $(seq 50); do pid=$(pid_of "$p") || break; sleep 0.1; done
        if pid=$(pid_of "$p"); then kill -TERM "$pid" 2>/dev/null || true; sleep 1; kill -KILL "$pid" 2>/dev/null || true; fi
        rm -f "$p"
    done
    # Leftover slurmstepds of killed jobs would hold GPUs in CARMA's state.
    pkill -KILL -x slurmstepd 2>/dev/null || true
}

start_munge() {
    if pid_of /run/munge/munged.pid >/dev/null || pgrep -x munged >/dev/null; then return; fi
    install -d -o munge -g munge -m 0755 /run/munge
    [ -f /etc/munge/munge.key ] || { dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 2>/dev/null; chown munge:munge /etc/munge/munge.key; chmod 0400 /etc/munge/munge.key; }
    runuser -u munge -- /usr/sbin/munged
}

wait_idle() {
    for _ in $(seq 150); do
        local st
        st=$(sinfo -h -n "$NODE" -o %T 2>/dev/null || true)
        case "$st" in idle|mixed|allocated) return 0 ;; esac
        sleep 0.2
    done
    sinfo -N -l >&2 || true
    tail -20 "$LOG/slurmd.log" "$LOG/slurmctld.log" >&2 || true
    die "node $NODE did not become idle within 30 s"
}

start() {
    deps
    stop
    write_config
    install_carma
    start_munge
    slurmctld -c
    slurmd -N "$NODE"
    wait_idle
    # A node drained by an earlier run (failed prolog/epilog) is resumed.
    scontrol update nodename="$NODE" state=resume >/dev/null 2>&1 || true
    echo "cluster.sh: $NODE up with 4 simulated GPUs; CARMA plugin $PLUGIN"
}

case "${1:-}" in
    deps) deps ;;
    start) start ;;
    stop) stop ;;
    status) sinfo -N -l; scontrol show node "$NODE" | grep -E 'State|Gres' ;;
    *) die "usage: $0 deps|start|stop|status" ;;
esac
