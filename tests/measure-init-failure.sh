#!/usr/bin/env bash
# Measures what a Slurm release does when a required SPANK plugin's
# slurm_spank_init fails in slurmstepd, without and with
# slurm_spank_init_failure_mode = ESPANK_JOB_FAILURE (read since 25.05):
#
#   tests/measure-init-failure.sh host|trixie|sid
#
# Needs that release's cluster up (tests/cluster.sh start, on the host or
# through tests/releases.sh enter). Builds tests/probes/init_fails.c twice
# against the release's headers, adds each in turn as a `required` plugin to
# the second node's plugstack, runs one step there and prints what became of
# the step, the job and the node. Puts the plugstack back and resumes the
# node. A measurement for docs, not a test.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
release=${1:?usage: measure-init-failure.sh host|trixie|sid}

if [ "${2:-}" != --inside ]; then
    if [ "$release" = host ]; then root=; else root=$("$here/releases.sh" root "$release"); fi
    out=$repo/target/probes/$release
    inc=$out/include
    install -d "$inc"
    ln -sfn "$root/usr/include/slurm" "$inc/slurm"
    cc -shared -fPIC -Wall -I"$inc" -o "$out/node-failure.so" "$repo/tests/probes/init_fails.c"
    cc -shared -fPIC -Wall -I"$inc" -DJOB_FAILURE -o "$out/job-failure.so" "$repo/tests/probes/init_fails.c" 2>/dev/null ||
        echo "(ESPANK_JOB_FAILURE is not in this release's headers: no job-failure variant)"
    if [ "$release" = host ]; then exec "$0" host --inside "$out"; fi
    exec "$here/releases.sh" enter "$release" "$0" "$release" --inside "$out"
fi

out=$3
node2="$(hostname -s)b"
plugstack=/etc/slurm/node2/plugstack.conf
saved=$(cat "$plugstack")
restore() {
    printf '%s\n' "$saved" >"$plugstack"
    scontrol update nodename="$node2" state=resume 2>/dev/null || true
}
trap restore EXIT
slurm=$(dpkg-query -W -f '${Version}' slurmd)
for variant in node-failure job-failure; do
    so=$out/$variant.so
    [ -f "$so" ] || continue
    printf '%s\nrequired %s\n' "$saved" "$so" >"$plugstack"
    set +e
    said=$(cd /tmp && timeout 60 runuser -u carmatest -- srun -p multi -w "$node2" -J probe-$variant true 2>&1)
    rc=$?
    set -e
    job=$(squeue -h -t all -n probe-$variant -o %i | tail -1)
    sleep 1
    state=$(scontrol show job "$job" | grep -o 'JobState=[A-Z_]* Reason=[^ ]*' | head -1)
    node=$(sinfo -h -N -n "$node2" -o '%T %E' | head -1)
    echo "Slurm $slurm, $variant, srun step: srun rc=$rc ($(echo "$said" | tail -1)); job $job $state; node $node2: $node"
    restore
    # A batch job: its batch step's slurmstepd runs the failing init.
    printf '%s\nrequired %s\n' "$saved" "$so" >"$plugstack"
    job=$(cd /tmp && runuser -u carmatest -- sbatch --parsable -p multi -w "$node2" -J probe-batch-$variant -o /dev/null --wrap true)
    for _ in $(seq 60); do
        state=$(scontrol show job "$job" | grep -o 'JobState=[A-Z_]* Reason=[^ ]*' | head -1)
        case $state in *PENDING*Reason=None* | *RUNNING* | *CONFIGURING* | *PENDING*Priority* | *PENDING*Resources*) sleep 0.5 ;; *) break ;; esac
    done
    restarts=$(scontrol show job "$job" | grep -o 'Restarts=[0-9]*')
    node=$(sinfo -h -N -n "$node2" -o '%T %E' | head -1)
    echo "Slurm $slurm, $variant, batch job: job $job $state $restarts; node $node2: $node"
    scancel "$job" 2>/dev/null || true
    restore
done
