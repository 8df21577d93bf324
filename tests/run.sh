#!/usr/bin/env bash
# The project's test command: builds everything, runs the unit tests,
# benchmarks and bounded fuzzing, then the real-Slurm suites on three Slurm
# releases, one cluster at a time (they share Slurm's ports):
#
#   Slurm 22.05  this Debian 12 host            SLURM_22_05 suites
#   Slurm 24.11  Debian trixie chroot           SLURM_24_11 suites
#   Slurm 26.05  Debian sid chroot (newest)     every suite
#   Slurm 26.05  sid's chroot booted in a VM,   SLURM_V2 suites
#                Slurm's own cgroup/v2 (vm)
#
# The chroots are made by tests/releases.sh (debootstrap, cached in
# /var/cache/carma-releases); the plugin is built once per release against
# its headers (packaging/build-plugin.sh), the rest of the workspace once.
# Run as root on a throwaway Debian 12 machine. CARMA_RELEASES=host limits
# a local run to the host's Slurm.
set -euo pipefail
cd "$(dirname "$0")/.."

export PROFILE=release
export CARGO_TERM_COLOR=never
TARGET=${CARGO_TARGET_DIR:-$PWD/target}
# Suites per release: every suite on the newest; on the older ones those
# that meet what differs between releases (options and SPANK contexts,
# job_submit/cli_filter Lua, requeue and epilog, slurmd restarts, packages).
# prometheus runs on the host only: a Prometheus server scraping the
# monitors' endpoints, which do not depend on Slurm's release.
# 22.05 (long out of support): recovery and admission run on 24.11 and 26.05,
# but for the hand-back (#37), which meets each release's requeue.
SLURM_22_05="foundation transparent package upgrade isolation record load prometheus owner guard recovery:handed_back,past_its_hand_backs"
# 24.11 (out of support): what meets its SPANK contexts, requeue and epilog,
# packages and device cgroups; 26.05 runs the rest (same TRES spelling).
SLURM_24_11="foundation recovery package upgrade isolation record owner"
SLURM_26_05="all -prometheus"
# Under Slurm's cgroup/v2 (this host's hierarchy is hybrid, which it
# refuses; tests/vm.sh): what touches device cgroups (isolation, owner)
# and one test of each path a job takes through Slurm to its GPU (SUITE:TEST
# names tests; the rest of those suites meets no cgroup and runs on sid).
# CPU-bound work runs 15-30 times slower under TCG: the whole of these
# five suites took 16 minutes there.
SLURM_V2="foundation isolation owner placement:gpus_slurm_gave_whole,an_unplaceable_job transparent:multi_gpu_multi_node admission:fits_only_on_the_empty_node"
# src-25.11 (Slurm built from SchedMD's tarball) is not in the default list:
# see docs/slurm-releases.md.
RELEASES=${CARMA_RELEASES:-host trixie sid vm}

started=$SECONDS
# Each phase's header says when it began: where CI's time goes.
phase() { echo "== $* (at $((SECONDS - started)) s)"; }

tests/cluster.sh deps
# Whatever CARMA cluster runs here (the host's, or one ./demo.sh left in a
# release's chroot) holds Slurm's ports: stopped before anything else.
tests/cluster.sh stop
command -v cargo >/dev/null || { echo "run.sh: cargo not found (install Rust via rustup)" >&2; exit 1; }

# The releases' chroots (debootstrap and apt: mostly waiting on the
# mirror) are made while the workspace compiles; each into its own log.
command -v debootstrap >/dev/null || {
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
}
makes=()
# A failed build must not leave debootstrap running in a chroot with /dev
# and /sys mounted: the makes are stopped and their mounts undone.
stop_makes() {
    set -- "${makes[@]}"
    while [ $# -gt 0 ]; do
        kill -- "-$2" 2>/dev/null || true
        wait "$2" 2>/dev/null || true
        tests/releases.sh umount "$1" || true
        shift 2
    done
}
trap stop_makes EXIT
mkdir -p "$TARGET"
for r in $RELEASES; do
    case $r in host) continue ;; vm) r=sid ;; esac
    case " ${makes[*]:-} " in *" $r "*) continue ;; esac
    # Its own process group (setsid): stop_makes ends debootstrap too.
    setsid tests/releases.sh make "$r" >"$TARGET/make-$r.log" 2>&1 &
    makes+=("$r" $!)
done

phase build
# All targets at once: tests and benches share one feature resolution, so
# nothing (tract-onnx above all) is compiled twice.
cargo build --profile "$PROFILE" --workspace --all-targets
set -- "${makes[@]}"
while [ $# -gt 0 ]; do
    wait "$2" || { cat "$TARGET/make-$1.log" >&2; echo "run.sh: making $1's chroot failed" >&2; exit 1; }
    cat "$TARGET/make-$1.log"
    shift 2
done
trap - EXIT
phase "plugins per release"
# The previous release's, per release (tests/upgrade.rs upgrades from it,
# where Slurm is Debian's: not src-*), all first: each takes this tree's
# binaries' names, which this tree's next build puts back by building them
# again (87 s here); built in turn with this tree's, that was paid once per
# release. Then one plugin per Slurm release; the host's last, so that the
# workspace build (and cargo test below) stays the host's.
for r in $RELEASES; do
    case $r in
        host) tests/previous-release.sh build /usr/include ;;
        vm | src-*) ;;
        *) tests/releases.sh previous "$r" ;;
    esac
done
for r in $RELEASES; do
    case $r in
        host) ;;
        *) tests/releases.sh plugin "${r/vm/sid}" ;;
    esac
done
packaging/build-plugin.sh /usr/include
# The RPMs of every series built (RHEL family; tests/package.rs checks them).
for plugin in "$TARGET/$PROFILE"/slurm-*/libcarma_spank.so; do
    series=$(basename "$(dirname "$plugin")"); series=${series#slurm-}
    CARMA_SLURM_SERIES=$series packaging/build-rpm.sh "$TARGET/$PROFILE" "$TARGET/rpm"
done
# The real-Slurm suites as built binaries: the chroots have no cargo.
# Every cargo command here selects the whole workspace with its tests (or
# excludes only carma-suites, which adds no feature): one feature
# resolution, so nothing built above is built again. (`-p` or leaving the
# plugin out resolves the build dependencies' features anew and builds
# tract again: ten minutes on a clean machine.) The suites' paths are
# relative to their package (tests/), the other crates' tests/*.rs not.
suites=$TARGET/suites.txt
cargo test --profile "$PROFILE" --workspace --tests --no-run 2>&1 |
    sed -n 's#^ *Executable \([a-z0-9_]*\)\.rs (\(.*\))$#\1 \2#p' |
    while read -r name exe; do echo "$name $(realpath "$exe")"; done >"$suites"
# Every suite file built: a change in how cargo names them would otherwise
# run fewer suites, silently.
[ "$(wc -l <"$suites")" -eq "$(ls tests/*.rs | wc -l)" ] ||
    { echo "run.sh: built suites ($(wc -l <"$suites")) are not tests/*.rs ($(ls tests/*.rs | wc -l))" >&2; exit 1; }

# carma-monitor under valgrind for 10 minutes on the NVML stand-in, beside
# everything below (it needs under a tenth of a core).
tests/leak.sh 600 >"$TARGET/leak.log" 2>&1 &
leak=$!

tests/cluster.sh start
trap 'tests/cluster.sh stop' EXIT
# Tests append what they injected and survived here (tests/reliability-report.sh).
rm -rf /tmp/carma-tests
install -d -o carmatest /tmp/carma-tests
: >/tmp/carma-tests/reliability.log

phase "benchmarks (figures, not pass/fail)"
# --workspace, not -p: the features stay those of the build above, so
# nothing is compiled again for a bench.
cargo bench -q --workspace --bench latency
cargo bench -q --workspace --bench speed
cargo bench -q --workspace --bench estimate

phase "fuzzing (bounded)"
tests/fuzz.sh | tee -a /tmp/carma-tests/reliability.log

phase "unit tests"
cargo test --profile "$PROFILE" --workspace --exclude carma-suites
# A site's Slurm under its own prefix (SLURM_PREFIX=/opt/slurm): the plugin
# built and unit-tested against headers and libslurmfull copied there.
tests/prefix.sh

failed=()
for r in $RELEASES; do
    if [ "$r" = host ]; then
        phase "real-Slurm suites on the host's Slurm ($SLURM_22_05)"
        since=$(date -u +%Y-%m-%dT%H:%M:%S)
        tests/suites.sh "$suites" $SLURM_22_05 || failed+=(host)
        tests/hook-times.sh "$since" || true
        tests/cluster.sh stop
        trap - EXIT
        continue
    fi
    if [ "$r" = vm ]; then
        phase "real-Slurm suites under Slurm's cgroup/v2 in a VM ($SLURM_V2)"
        tests/cluster.sh stop
        # Checked, not assumed: the suites would pass on cgroup/v1 too.
        v2="scontrol show config | grep -Eq '^CgroupPlugin += cgroup/v2 *$' || { echo 'run.sh: Slurm in the VM is not on cgroup/v2' >&2; exit 1; }"
        tests/vm.sh run bash -c "tests/cluster.sh start && $v2 && tests/suites.sh $suites $SLURM_V2" || failed+=(vm)
        continue
    fi
    # A Slurm built from source is no Debian package: the package suite
    # (Depends on Debian's Slurm series, apt's refusals) does not apply.
    case $r in trixie) chosen=$SLURM_24_11 ;; sid) chosen=$SLURM_26_05 ;; src-*) chosen="$SLURM_26_05 -package -upgrade" ;; esac
    phase "real-Slurm suites on $r's Slurm $(tests/releases.sh series "$r") ($chosen)"
    tests/cluster.sh stop
    trap "tests/releases.sh enter $r tests/cluster.sh stop; tests/releases.sh umount $r" EXIT
    tests/releases.sh enter "$r" tests/cluster.sh start
    since=$(date -u +%Y-%m-%dT%H:%M:%S)
    tests/releases.sh enter "$r" tests/suites.sh "$suites" $chosen || failed+=("$r")
    tests/releases.sh enter "$r" tests/hook-times.sh "$since" || true
    if [ "$r" = sid ]; then
        # What CARMA costs slurmctld, with and without it (#42; 64 nodes by
        # hand: tests/scale.sh burst 64, docs/admission.md).
        phase "scale figures: 16 nodes on $r's Slurm, CARMA on and off (tests/scale.sh)"
        { tests/releases.sh enter "$r" tests/scale.sh burst 16 on 4 &&
            tests/releases.sh enter "$r" tests/scale.sh burst 16 off 4; } || failed+=("scale-$r")
        # The simulator held against real Slurm: a synthetic trace replayed
        # through sbatch on 16 nodes (64 and the paper's traces by hand:
        # docs/replay.md).
        phase "scale replay: 16 nodes on $r's Slurm against carma simulate (tests/scale.sh replay)"
        tests/releases.sh enter "$r" tests/scale.sh replay 16 synthetic:320:1.6 magm 10 || failed+=("replay-$r")
    fi
    tests/releases.sh enter "$r" tests/cluster.sh stop
    tests/releases.sh umount "$r"
    trap - EXIT
done
phase "carma-monitor under valgrind (tests/leak.sh)"
wait "$leak" || failed+=(leak-check)
cat "$TARGET/leak.log"
if [ ${#failed[@]} -gt 0 ]; then
    echo "run.sh: failed: ${failed[*]}" >&2
    exit 1
fi
echo "run.sh: all suites passed on: $RELEASES (in $((SECONDS - started)) s)"
