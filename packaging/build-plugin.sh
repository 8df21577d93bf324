#!/usr/bin/env bash
# Builds the SPANK plugin against one Slurm release's headers:
#
#   packaging/build-plugin.sh [INCLUDE_DIR]
#
# INCLUDE_DIR holds that release's slurm/ headers (default /usr/include, the
# host's libslurm-dev; for another release, e.g. a chroot's usr/include).
# Writes target/$PROFILE/slurm-SERIES/libcarma_spank.so (SERIES: 26.05) and
# prints its path. Only the plugin crate is built again; carma, carma-epilog,
# carma-monitor and carma-fakejob do not depend on Slurm and are built once.
# A SPANK plugin loads only into the major.minor it was built for, so every
# series gets its own .so and its own package (packaging/build-deb.sh).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
inc=${1:-/usr/include}
PROFILE=${PROFILE:-release}
target=${CARGO_TARGET_DIR:-$repo/target}

die() { echo "build-plugin.sh: $*" >&2; exit 1; }
series=$("$repo/packaging/slurm-series.sh" "$inc") || die "name an include directory holding a release's slurm/ headers"

# The host's headers build with the variable unset, as a plain
# `cargo build` does: the two then share one build of the plugin.
if [ "$(realpath "$inc")" = /usr/include ]; then
    unset CARMA_SLURM_INCLUDE
else
    export CARMA_SLURM_INCLUDE=$inc
fi
# The same targets as the workspace build (tests/run.sh): the same feature
# resolution, so only the plugin crate and its unit tests are built again
# (seconds), where `-p carma-spank --lib` builds every dependency anew.
(cd "$repo" && cargo build -q --profile "$PROFILE" --workspace --all-targets)
out=$target/$PROFILE/slurm-$series
install -d "$out"
install -m 0644 "$target/$PROFILE/libcarma_spank.so" "$out/libcarma_spank.so.tmp"
grep -qa "carma-slurm-series=$series;" "$out/libcarma_spank.so.tmp" || die "the plugin built is not marked for Slurm $series"
mv "$out/libcarma_spank.so.tmp" "$out/libcarma_spank.so"
echo "$out/libcarma_spank.so"
