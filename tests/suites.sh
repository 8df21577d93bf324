#!/usr/bin/env bash
# Runs real-Slurm suites (tests/*.rs, already built) against the cluster
# that is up in this root: the host's, or a release's chroot
# (tests/releases.sh enter CODENAME tests/suites.sh ...). There is no cargo
# in a chroot, so the suites are run as the test binaries cargo built.
#
#   tests/suites.sh LIST SUITE...   LIST: "name executable" lines
#                                   (tests/run.sh writes it); SUITE: a name,
#                                   NAME:PART,PART (only its tests whose
#                                   names hold a PART), or `all`
#
# Runs every suite named, one test at a time (they share one cluster), and
# exits non-zero if any failed. Prints how long each took.
set -uo pipefail
list=${1:?usage: suites.sh LIST SUITE...}
shift
[ -s "$list" ] || { echo "suites.sh: $list is empty: build the tests first (tests/run.sh)" >&2; exit 1; }

# The tests' work directory: job scripts and outputs of the test user,
# emptied first, so that an earlier run's outputs are not read as this
# run's; and the reliability log (tests/reliability-report.sh), appended to.
install -d -o carmatest /tmp/carma-tests
find /tmp/carma-tests -mindepth 1 ! -name reliability.log -delete

series=$(slurmd -V 2>/dev/null | awk '{print $NF}'); series=${series:-unknown}
names=("$@")
# `all`, optionally less some: `all -prometheus`.
if [ "${names[0]:-}" = all ]; then
    skip=" ${names[*]:1} "
    mapfile -t names < <(awk '{print $1}' "$list" | while read -r n; do case "$skip" in *" -$n "*) ;; *) echo "$n" ;; esac; done)
fi
# Each node whose state is not up, one line each: `NODE STATE`, matched on
# the state alone; sinfo failing or naming no node is a line too.
nodes_not_up() {
    local out
    if ! out=$(sinfo -h -N -o '%N %T' 2>/dev/null) || [ -z "$out" ]; then
        echo "sinfo: ${out:-no nodes}"
        return
    fi
    echo "$out" | sort -u | awk '$2 ~ /^(drain|down|fail|inval|unk|maint|reboot|power)/ || $2 ~ /[*~#!%@^]$/'
}
for _ in 1 2 3 4 5 6 7 8 9 10; do
    before=$(nodes_not_up)
    [ -n "$before" ] || break
    sleep 1
done
[ -z "$before" ] || { echo "suites.sh: nodes not up before the first suite: $before" >&2; exit 1; }
failed=()
for entry in "${names[@]}"; do
    name=${entry%%:*} parts=()
    [ "$name" = "$entry" ] || IFS=, read -ra parts <<<"${entry#*:}"
    exe=$(awk -v n="$name" '$1 == n {print $2}' "$list")
    [ -n "$exe" ] || { echo "suites.sh: no suite '$name' in $list" >&2; failed+=("$name"); continue; }
    echo "== suite $entry on Slurm $series"
    start=$SECONDS
    # A part that names no test would pass unseen: each must name one.
    # (Read whole: grep -q closing the pipe early would fail the lister.)
    for part in "${parts[@]}"; do
        listed=$("$exe" --list "$part" 2>/dev/null)
        grep -q ': test$' <<<"$listed" ||
            { echo "suites.sh: no test of suite $name holds '$part'" >&2; failed+=("$entry"); }
    done
    if ! "$exe" --test-threads=1 "${parts[@]}"; then
        failed+=("$name")
        # What CARMA and slurmd said meanwhile: CI keeps nothing else.
        for f in /var/log/carma/carma*.log /var/log/carma-cluster/slurmd*.log; do
            [ -f "$f" ] || continue
            echo "== last lines of $f"
            tail -n 40 "$f"
        done
    fi
    echo "== suite $entry on Slurm $series: $((SECONDS - start)) s"
    # No suite leaves a node drained, down or not responding (a '*' after
    # the state): CARMA must never cost a site a node. A slurmd a suite
    # restarted may take a few seconds to register again.
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        bad=$(nodes_not_up)
        [ -n "$bad" ] || break
        sleep 1
    done
    if [ -n "$bad" ]; then
        echo "suites.sh: after suite $name, nodes not up: $bad" >&2
        failed+=("$name(nodes)")
        # A test drains with Reason=carma-test and resumes when done; one
        # killed before that would fail every later suite.
        sinfo -h -N -o '%N %E' | awk '$2 == "carma-test" {print $1}' | sort -u |
            while read -r n; do scontrol update NodeName="$n" State=RESUME || true; done
    fi
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "suites.sh: failed on Slurm $series: ${failed[*]}" >&2
    exit 1
fi
