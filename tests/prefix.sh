#!/usr/bin/env bash
# A site's Slurm under its own prefix, as SchedMD's `./configure
# --prefix=/opt/slurm` installs it: copies this host's Slurm headers and
# libslurmfull.so into PREFIX (default /tmp/carma-opt-slurm) in that layout
# (include/slurm/, lib/slurm/libslurmfull.so), runs the plugin's unit tests
# built with SLURM_PREFIX=PREFIX, and checks that the build read the
# prefix's files, not /usr/include or Debian's slurm-wlm directory.
# Only the plugin crate is built again (seconds).
#
#   tests/prefix.sh [PREFIX]
set -euo pipefail
cd "$(dirname "$0")/.."
PROFILE=${PROFILE:-release}
TARGET=${CARGO_TARGET_DIR:-$PWD/target}
prefix=${1:-/tmp/carma-opt-slurm}
die() { echo "prefix.sh: $*" >&2; exit 1; }

lib=$(ls /usr/lib/*/slurm-wlm/libslurmfull.so /usr/lib64/slurm/libslurmfull.so 2>/dev/null | head -1) ||
    true
[ -n "$lib" ] && [ -f /usr/include/slurm/spank.h ] || die "no Slurm headers and libslurmfull.so here (tests/cluster.sh deps)"
rm -rf "$prefix"
install -d "$prefix/include" "$prefix/lib/slurm"
cp -a /usr/include/slurm "$prefix/include/"
cp "$lib" "$prefix/lib/slurm/"
unset CARMA_SLURM_INCLUDE
# The workspace's library tests (the feature resolution of run.sh's builds:
# only the plugin is built again).
SLURM_PREFIX=$prefix cargo test -q --profile "$PROFILE" --workspace --exclude carma-suites --lib
# What the build script read: its rerun-if-changed lines name the files.
out=$(ls -t "$TARGET/$PROFILE"/build/carma-spank-*/output | head -1)
for f in "$prefix/include/slurm/spank.h" "$prefix/lib/slurm/libslurmfull.so"; do
    grep -qxF "cargo:rerun-if-changed=$f" "$out" || die "the plugin was not built from $f ($out)"
done
echo "prefix.sh: the plugin's unit tests pass built against Slurm under $prefix"
