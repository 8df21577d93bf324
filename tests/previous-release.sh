#!/usr/bin/env bash
# The release a site upgrades from, built from this repository's history for
# the upgrade test (tests/upgrade.rs): its plugin against one Slurm
# release's headers, and its binaries.
#
#   tests/previous-release.sh build [INCLUDE_DIR]   (default /usr/include)
#   tests/previous-release.sh commit
#
# `build` writes TARGET/PROFILE/previous/ (carma, carma-epilog, ...) and
# TARGET/PROFILE/previous/slurm-SERIES/libcarma_spank.so, and the source in
# TARGET/previous/src, whose packaging/build-deb.sh packages them as that
# release did. The commit is tests/previous-release's; a clone has it (and
# .ci/run's copy carries the history).
#
# It builds in the target directory of this tree's build (tests/run.sh),
# so that it compiles its own crates and none of the dependencies again.
# Its crates get another version, which keeps their files apart from this
# tree's. The few files both builds name alike (the binaries, the plugin)
# are removed before it builds and once copied out: this tree's next cargo
# build puts its own back.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
PROFILE=${PROFILE:-release}
target=${CARGO_TARGET_DIR:-$repo/target}
die() { echo "previous-release.sh: $*" >&2; exit 1; }

commit=$(sed -n 's/^commit: *\([0-9a-f]\{40\}\)$/\1/p' "$repo/tests/previous-release")
[ -n "$commit" ] || die "tests/previous-release names no commit (a line 'commit: <40 hex digits>')"

# The files both builds name alike in TARGET/PROFILE, and the shared
# libraries' own files in deps/, which cargo names without a hash: removed,
# a build of either tree finds its output gone and builds it again.
SHARED=(carma carma-epilog carma-monitor carma-fakejob carma-fake-mps-control libnvidia_ml.so libcarma_spank.so)
unshare() {
    local f
    for f in "${SHARED[@]}" deps/libnvidia_ml.so deps/libcarma_spank.so; do rm -f "$target/$PROFILE/$f"; done
}

build() {
    local inc=${1:-/usr/include} series src=$target/previous/src out=$target/$PROFILE/previous f
    series=$("$repo/packaging/slurm-series.sh" "$inc") || die "name an include directory holding a release's slurm/ headers"
    if [ "$(cat "$src/.commit" 2>/dev/null)" != "$commit" ]; then
        git -C "$repo" cat-file -e "$commit^{commit}" ||
            die "commit $commit (tests/previous-release) is not in $repo's history: run from a full clone"
        rm -rf "$src"
        install -d "$src"
        # Extracted as new files (-m): cargo knows them by relative path and
        # mtime, and a source older than an earlier previous release's
        # build of the same crate would pass for built.
        git -C "$repo" archive "$commit" | tar -x -m -C "$src"
        sed -i '/^\[workspace.package\]/,/^\[/s/^version = ".*"/version = "0.0.0-previous"/' "$src/Cargo.toml"
        # A crate of its own version would keep this tree's unit names, and
        # its newer files would pass for this tree's build of that crate.
        local own
        own=$(find "$src" -name Cargo.toml -not -path "$src/fuzz/*" -exec grep -l '^\[package\]' {} + |
            xargs grep -L '^version.workspace = true' || true)
        [ -z "$own" ] || die "crates of the previous release with a version of their own: $own"
        echo "$commit" >"$src/.commit"
    fi
    # As that release's packaging/build-plugin.sh: the host's headers with
    # the variable unset; all targets, for this tree's feature resolution
    # (but its real-Slurm suites, which add no feature and are not run).
    if [ "$(realpath "$inc")" = /usr/include ]; then
        unset CARMA_SLURM_INCLUDE
    else
        export CARMA_SLURM_INCLUDE=$inc
    fi
    # What this tree built under the names both builds use must not pass
    # for the previous release's.
    unshare
    (cd "$src" && CARGO_TARGET_DIR=$target cargo build -q --profile "$PROFILE" --workspace --exclude carma-suites --all-targets)
    install -d "$out/slurm-$series"
    rm -f "$out"/carma*  "$out"/lib*.so "$out/slurm-$series/libcarma_spank.so"
    for f in "${SHARED[@]}"; do
        # Older releases lack some (their packaging asks for what it needs).
        if [ ! -f "$target/$PROFILE/$f" ]; then
            [ "$f" != libcarma_spank.so ] || die "the previous release built no plugin"
            continue
        fi
        case $f in
            libcarma_spank.so) install -m 0644 "$target/$PROFILE/$f" "$out/slurm-$series/$f" ;;
            *) install -m 0755 "$target/$PROFILE/$f" "$out/$f" ;;
        esac
    done
    unshare
    grep -qa "carma-slurm-series=$series;" "$out/slurm-$series/libcarma_spank.so" ||
        die "the previous release's plugin is not marked for Slurm $series"
    echo "$out"
}

case "${1:-}" in
    build) build "${2:-}" ;;
    commit) echo "$commit" ;;
    *) die "usage: $0 build [INCLUDE_DIR] | commit" ;;
esac
