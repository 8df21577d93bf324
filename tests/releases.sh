#!/usr/bin/env bash
# Newer Slurm releases for the test matrix: Debian trixie (Slurm 24.11) and
# sid (Slurm 26.05) in debootstrap chroots on this Debian 12 host (22.05).
# The same tests/cluster.sh and the same test binaries run inside a chroot;
# only the plugin is built again, against that release's headers.
#
#   tests/releases.sh make CODENAME      debootstrap + Slurm (cached in $CACHE)
#   tests/releases.sh series CODENAME    prints the release series (26.05)
#   tests/releases.sh root CODENAME      prints the chroot's directory
#   tests/releases.sh plugin CODENAME    builds the plugin against its headers
#                                        (target/$PROFILE/slurm-SERIES/)
#   tests/releases.sh enter CODENAME CMD...  runs CMD inside, as root, with
#                                        the checkout and target dir mounted
#                                        at their own paths
#   tests/releases.sh umount CODENAME    undoes enter's mounts
#
# Runs as root. Only one cluster can hold Slurm's ports: stop the host's
# (tests/cluster.sh stop) before starting one inside.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
PROFILE=${PROFILE:-release}
TARGET=${CARGO_TARGET_DIR:-$repo/target}
CACHE=${CARMA_RELEASES_CACHE:-/var/cache/carma-releases}
# Packages a cluster of ours needs inside (binutils: build-deb.sh strips).
PKGS="slurmctld slurmd slurm-client munge libslurm-dev binutils procps hostname"

die() { echo "releases.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root (debootstrap, chroot, mount)"

root_of() {
    case "$1" in
        trixie | sid) echo "$CACHE/$1" ;;
        *) die "unknown release '$1': use trixie (Slurm 24.11) or sid (Slurm 26.05)" ;;
    esac
}

# The Debian mirror this host's apt already uses: no host is written here.
mirror() {
    local uri
    uri=$(grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' | grep -v security | head -1)
    [ -n "$uri" ] || uri=$(grep -hs '^deb ' /etc/apt/sources.list | awk '{print $2}' | grep -v security | head -1)
    [ -n "$uri" ] || die "cannot find this host's Debian mirror in /etc/apt"
    echo "$uri"
}

make_root() {
    local codename=$1 dir
    dir=$(root_of "$codename")
    if [ -f "$dir/.carma-ready" ]; then
        return 0
    fi
    command -v debootstrap >/dev/null || {
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
    }
    umount_root "$codename"
    # Never into a mount that is still there (/dev, /sys, the checkout: a
    # bind mount of the same disk, which --one-file-system would not see).
    ! awk -v d="$dir/" 'index($2, d) == 1 {found = 1} END {exit !found}' /proc/mounts ||
        die "mounts remain under $dir; not removing it"
    rm -rf --one-file-system "$dir"
    install -d "$CACHE"
    local t=$SECONDS
    echo "releases.sh: debootstrap $codename into $dir"
    debootstrap --variant=minbase "$codename" "$dir" "$(mirror)" >"$CACHE/$codename.debootstrap.log" 2>&1 ||
        { tail -20 "$CACHE/$codename.debootstrap.log" >&2; die "debootstrap $codename failed"; }
    # sid's Release file in the mirror is past its date.
    echo 'Acquire::Check-Valid-Until "false";' >"$dir/etc/apt/apt.conf.d/99carma-valid-until"
    # Services are started by our scripts, never by a package's postinst.
    printf '#!/bin/sh\nexit 101\n' >"$dir/usr/sbin/policy-rc.d"
    chmod 0755 "$dir/usr/sbin/policy-rc.d"
    mount_root "$codename"
    chroot "$dir" sh -c "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $PKGS" \
        >"$CACHE/$codename.apt.log" 2>&1 || { umount_root "$codename"; tail -20 "$CACHE/$codename.apt.log" >&2; die "installing Slurm in $codename failed"; }
    umount_root "$codename"
    touch "$dir/.carma-ready"
    echo "releases.sh: $codename ready with Slurm $(series "$codename") in $((SECONDS - t)) s"
}

# "26.05" from the chroot's headers.
series() {
    "$repo/packaging/slurm-series.sh" "$(root_of "$1")/usr/include"
}

is_mounted() { mountpoint -q "$1" 2>/dev/null; }

mount_root() {
    local dir
    dir=$(root_of "$1")
    is_mounted "$dir/proc" || mount -t proc proc "$dir/proc"
    # slurmd 24.11+ needs a cgroup filesystem under /sys/fs/cgroup: /sys recursively.
    is_mounted "$dir/sys" || { mount --rbind /sys "$dir/sys"; mount --make-rslave "$dir/sys"; }
    is_mounted "$dir/dev" || { mount --rbind /dev "$dir/dev"; mount --make-rslave "$dir/dev"; }
    is_mounted "$dir/run" || mount -t tmpfs -o mode=0755 tmpfs "$dir/run"
    cp /etc/hosts /etc/resolv.conf "$dir/etc/" 2>/dev/null || true
}

# The checkout, the target directory and the tests' work directory at their
# own paths: test binaries read data through CARGO_MANIFEST_DIR.
mount_work() {
    local dir p
    dir=$(root_of "$1")
    for p in "$repo" "$TARGET"; do
        install -d "$dir$p"
        is_mounted "$dir$p" || mount --bind "$p" "$dir$p"
    done
}

umount_root() {
    local dir m
    dir=$(root_of "$1")
    [ -d "$dir" ] || return 0
    # Deepest first.
    for m in $(awk -v d="$dir/" 'index($2, d) == 1 {print $2}' /proc/mounts | sort -r); do
        umount -l "$m" 2>/dev/null || true
    done
}

enter() {
    local codename=$1
    shift
    make_root "$codename"
    mount_root "$codename"
    mount_work "$codename"
    chroot "$(root_of "$codename")" /usr/bin/env -C "$PWD" PROFILE="$PROFILE" CARGO_TARGET_DIR="$TARGET" CARMA_CHROOT="$codename" \
        PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@"
}

# The plugin against the release's headers; the rest of the workspace is
# built once (binaries built on Debian 12 run on trixie and sid).
plugin() {
    local codename=$1 dir inc
    make_root "$codename"
    dir=$(root_of "$codename")
    inc=$dir/usr/include
    "$repo/packaging/build-plugin.sh" "$inc"
}

case "${1:-}" in
    make) make_root "${2:?codename}" ;;
    series) series "${2:?codename}" ;;
    root) root_of "${2:?codename}" ;;
    plugin) plugin "${2:?codename}" ;;
    enter) shift; enter "$@" ;;
    umount) umount_root "${2:?codename}" ;;
    *) die "usage: $0 make|series|root|plugin|enter|umount CODENAME [CMD...]" ;;
esac
