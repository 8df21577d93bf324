#!/usr/bin/env bash
# CARMA demo: builds the plugin, starts a local Slurm cluster with 4
# simulated A100-40GB GPUs and submits training-like jobs (carma-fakejob)
# under different policies, printing where each landed. CARMA reads the GPUs
# as on a GPU node, through NVML (gpu_source: nvml), here answered by the
# NVML stand-in of the carma-slurm-sim package (docs/nvml-standin.md).
# Run as root on a throwaway Debian 12 machine: sudo ./demo.sh
#
# The cluster runs the newest supported Slurm, 26.05 (Debian sid, in a
# debootstrap chroot made by tests/releases.sh: about a minute the first
# time). CARMA_DEMO_SLURM=trixie runs it on 24.11, =host on this host's
# Debian 12 Slurm 22.05 (out of support).
set -euo pipefail
cd "$(dirname "$0")"
export PROFILE=release

if [ "${1:-}" != --jobs ]; then
    # Exported: the jobs part, run inside the chroot, says where it ran.
    export CARMA_DEMO_SLURM=${CARMA_DEMO_SLURM:-sid}
    release=$CARMA_DEMO_SLURM
    tests/cluster.sh deps
    # Whatever CARMA cluster runs here (the host's, a release chroot's: an
    # earlier demo's or an interrupted test run's) holds Slurm's ports.
    tests/cluster.sh stop
    echo "== building (first build takes a few minutes)"
    # The same targets as the tests: one feature resolution, one build.
    cargo build --profile "$PROFILE" --workspace --all-targets -q
    if [ "$release" = host ]; then
        tests/cluster.sh start
        exec ./demo.sh --jobs
    fi
    tests/releases.sh plugin "$release" >/dev/null
    # The workspace build stays the host's.
    packaging/build-plugin.sh /usr/include >/dev/null
    tests/releases.sh enter "$release" tests/cluster.sh start
    exec tests/releases.sh enter "$release" ./demo.sh --jobs
fi

echo "== Slurm $(sinfo -V | awk '{print $2}'), CARMA plugin $(dpkg-query -W -f '${Version}' carma-slurm)"
user=carmatest
out=/tmp/carma-demo
rm -rf "$out"; install -d -o "$user" "$out"
submit() { # name, carma options..., -- fakejob args
    local name=$1; shift
    local opts=() fake=()
    while [ "$1" != -- ]; do opts+=("$1"); shift; done; shift
    fake=("$@")
    runuser -u "$user" -- sbatch -Q -J "$name" -D "$out" -o "$out/$name.out" "${opts[@]}" \
        --wrap "echo \"\$CARMA_DECISION\"; carma-fakejob ${fake[*]}"
}

# A CARMA job holds a GPU Slurm accounts for: a shard of one, here.
echo "== submitting 7 jobs as user $user"
submit resnet50-a --gres=shard:1 --carma-policy=magm --carma-mem=14G -- --mem 12G --sm 0.4 --seconds 12 --ramp 2
submit resnet50-b --gres=shard:1 --carma-policy=magm --carma-mem=14G -- --mem 12G --sm 0.4 --seconds 12 --ramp 2
submit bert-base  --gres=shard:1 --carma-policy=magm --carma-mem=20G -- --mem 18G --sm 0.5 --seconds 12 --ramp 2
submit vgg16      --gres=shard:1 --carma-policy=bf   --carma-mem=10G -- --mem 9G  --sm 0.3 --seconds 12 --ramp 2
submit mobilenet  --gres=shard:1 --carma-policy=ff   --carma-mem=4G  -- --mem 3G  --sm 0.2 --seconds 12 --ramp 2
submit big-model  --gres=shard:1 --carma-policy=exclusive --carma-mem=36G -- --mem 34G --sm 0.7 --seconds 12 --ramp 2
submit two-gpus   --gres=shard:2 --carma-policy=lug  --carma-mem=8G --carma-gpus=2 -- --mem 7G --sm 0.3 --seconds 12 --ramp 2
# Jobs of a user who never heard of CARMA, in partition `shared`, which
# carma.yaml makes a transparent-collocation scope: slurmctld's
# job_submit.lua turns their --gres=gpu:1 into a shard, CARMA places them.
echo "== submitting 3 plain --gres=gpu:1 jobs to partition shared"
for i in 1 2 3; do
    submit "plain-$i" -p shared --gres=gpu:1 -- --mem 6G --sm 0.2 --seconds 12 --ramp 2
done
sleep 5
echo "== carma status while the jobs run (read through NVML: the stand-in's GPUs)"
carma status
echo "== waiting for the jobs to finish"
while squeue -h -u "$user" | grep -q .; do sleep 1; done
echo "== where each job ran (CARMA_DECISION in its output)"
for f in "$out"/*.out; do
    printf '%-12s %s\n' "$(basename "$f" .out)" "$(head -1 "$f")"
    grep -h -E 'OutOfMemory|error' "$f" || true
done
echo "== what slurmctld recorded for the plain jobs (scontrol show job: Comment)"
for i in 1 2 3; do
    squeue -h -t all -n "plain-$i" -o '%i' | while read -r id; do scontrol show job "$id" | grep -o 'Comment=.*'; done
done
release=${CARMA_DEMO_SLURM:-host}
if [ "$release" = host ]; then
    echo "== CARMA's log: /var/log/carma/carma.log"
else
    echo "== CARMA's log: /var/log/carma/carma.log inside $(tests/releases.sh root "$release")"
fi
# The host's stop command stops a chroot's cluster too.
echo "== stop the cluster with: sudo tests/cluster.sh stop"
