#!/usr/bin/env bash
# Builds the RPMs admins of RHEL-family (and SUSE) clusters install, from
# binaries already built, as packaging/build-deb.sh builds the .deb:
#
#   packaging/build-rpm.sh [BIN_DIR] [OUT_DIR]
#
# BIN_DIR defaults to target/release, OUT_DIR to target/rpm. Writes
#   carma-slurm-VERSION-1.slurmSERIES.ARCH.rpm      plugin, carma, carma-epilog,
#                                                  carma-monitor, examples, docs
#   carma-slurm-sim-VERSION-1.slurmSERIES.ARCH.rpm  carma-fakejob, NVML and MPS stand-ins
# for the Slurm series CARMA_SLURM_SERIES (else this host's headers'), from
# packaging/carma-slurm.spec. The package requires exactly that series of
# SchedMD's slurm-plugins; CARMA_RPM_SLURM_REQUIRES=0 leaves the requirement
# out (a Slurm installed from its tarball under /opt/slurm, not from RPMs).
# Needs rpmbuild, which Debian's `rpm` package has: RPMs are built on the
# same machine as the .deb.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-$repo/target/release}
out=${2:-$repo/target/rpm}

die() { echo "build-rpm.sh: $*" >&2; exit 1; }
command -v rpmbuild >/dev/null || die "rpmbuild missing: apt-get install rpm (Debian) or dnf install rpm-build"
# shellcheck source=packaging/stage.sh
. "$repo/packaging/stage.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
stage "$bin" "$work/stage"
# One tree for the spec's %install: the %files lists split it in two.
cp -a "$work/stage/carma-slurm-sim/." "$work/stage/carma-slurm/"
version=${CARMA_RPM_VERSION:-$base}
requires=()
[ "${CARMA_RPM_SLURM_REQUIRES:-1}" = 0 ] && requires=(--without slurm_requires)
install -d "$out"
rpmbuild -bb --quiet \
    --define "_topdir $work/rpmbuild" \
    --define "_rpmdir $work/rpms" \
    --define "_build_name_fmt %%{NAME}-%%{VERSION}-%%{RELEASE}.%%{ARCH}.rpm" \
    --define "_tmppath $work/tmp" \
    --define "carma_stage $work/stage/carma-slurm" \
    --define "carma_version $version" \
    --define "slurm_series $series" \
    "${requires[@]}" \
    "$repo/packaging/carma-slurm.spec" >"$work/rpmbuild.log" 2>&1 ||
    { tail -30 "$work/rpmbuild.log" >&2; die "rpmbuild failed"; }
install -m 0644 "$work"/rpms/*.rpm "$out/"
echo "build-rpm.sh: $(cd "$work/rpms" && ls | sed "s#^#$out/#" | tr '\n' ' ')(Slurm $series)"
