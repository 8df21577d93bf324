#!/usr/bin/env bash
# Newer Slurm releases for the test matrix: Debian trixie (Slurm 24.11) and
# sid (Slurm 26.05) in debootstrap chroots on this Debian 12 host (22.05),
# and Slurm built from SchedMD's source under /opt/slurm, as RHEL-family
# sites build it (src-25.11: a trixie chroot with the build tools; the
# tarball slurm-25.11.N.tar.bz2 must be in $CACHE or CARMA_SLURM_TARBALL).
# The same tests/cluster.sh and the same test binaries run inside a chroot;
# only the plugin is built again, against that release's headers.
#
#   tests/releases.sh make CODENAME      debootstrap + Slurm (cached in $CACHE)
#   tests/releases.sh series CODENAME    prints the release series (26.05)
#   tests/releases.sh root CODENAME      prints the chroot's directory
#   tests/releases.sh plugin CODENAME    builds the plugin against its headers
#                                        (target/$PROFILE/slurm-SERIES/)
#   tests/releases.sh previous CODENAME  the previous release against them
#                                        (tests/previous-release.sh)
#   tests/releases.sh enter CODENAME CMD...  runs CMD inside, as root, with
#                                        the checkout and target dir mounted
#                                        at their own paths
#   tests/releases.sh umount CODENAME    undoes enter's mounts
#   tests/releases.sh tarball SERIES GIT_DIR  writes $CACHE/slurm-SERIES.N.tar.bz2
#                                        from the newest tag slurm-SE-RIES-N-1
#                                        of a clone of SchedMD/slurm
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
# A source build's chroot: what Slurm's configure needs for the plugins the
# suites use (lua: job_submit/lua and cli_filter/lua, which configure
# silently leaves out without it; dbus: cgroup/v2), instead of Debian's Slurm.
SRC_PREFIX=/opt/slurm
SRC_BASE=trixie
SRC_PKGS="build-essential pkg-config libmunge-dev munge liblua5.3-dev libdbus-1-dev libyaml-dev libjson-c-dev python3 bzip2 binutils procps hostname"

die() { echo "releases.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root (debootstrap, chroot, mount)"

root_of() {
    case "$1" in
        trixie | sid | src-[0-9][0-9].[0-9][0-9]) echo "$CACHE/$1" ;;
        *) die "unknown release '$1': use trixie (Slurm 24.11), sid (Slurm 26.05) or src-SERIES (SchedMD's source, e.g. src-25.11)" ;;
    esac
}

is_source() { case "$1" in src-*) return 0 ;; *) return 1 ;; esac }

# Where the release's slurm/ headers are.
include_of() {
    if is_source "$1"; then echo "$(root_of "$1")$SRC_PREFIX/include"; else echo "$(root_of "$1")/usr/include"; fi
}

# The newest slurm-SERIES.N tarball for a source release.
tarball_of() {
    local series=${1#src-} t
    if [ -n "${CARMA_SLURM_TARBALL:-}" ]; then echo "$CARMA_SLURM_TARBALL"; return; fi
    t=$(find "$CACHE" -maxdepth 1 -name "slurm-$series.*.tar.bz2" -printf '%f\n' 2>/dev/null | sort -V | tail -1)
    [ -n "$t" ] || die "no slurm-$series.N.tar.bz2 in $CACHE: download it from https://download.schedmd.com/slurm/ (or: $0 tarball $series GIT_DIR)"
    echo "$CACHE/$t"
}

# A release tarball from a clone of SchedMD/slurm: its tags slurm-25-11-7-1
# hold the tree the tarball slurm-25.11.7.tar.bz2 is made from (configure
# included).
make_tarball() {
    local series=$1 git=$2 tag v
    # Root reads a clone another user owns: git's ownership check would
    # answer "no tag".
    tag=$(git -c safe.directory='*' -C "$git" tag -l "slurm-${series/./-}-*-1" | sort -V | tail -1)
    [ -n "$tag" ] || die "no tag slurm-${series/./-}-N-1 in $git"
    v=${tag#slurm-}; v=${v%-1}; v=${v//-/.}
    install -d "$CACHE"
    git -c safe.directory='*' -C "$git" archive --format=tar --prefix="slurm-$v/" "$tag" | bzip2 >"$CACHE/slurm-$v.tar.bz2.tmp"
    mv "$CACHE/slurm-$v.tar.bz2.tmp" "$CACHE/slurm-$v.tar.bz2"
    echo "$CACHE/slurm-$v.tar.bz2"
}

# Slurm from the tarball, configured as a site does (its own prefix, the
# configuration in /etc/slurm where tests/cluster.sh writes it), with one
# addition a site leaves out: several slurmds on one host (tests/cluster.sh
# runs two, one host name; without it slurmctld logs "Duplicated
# NodeHostName" and cannot reach the second, measured on 25.11.7). Debian's
# packages accept two slurmds on one host.
build_slurm() {
    local codename=$1 dir tarball name t=$SECONDS
    dir=$(root_of "$codename")
    tarball=$(tarball_of "$codename") || return 1
    name=$(basename "$tarball" .tar.bz2)
    [[ $name =~ ^slurm-[0-9]+\.[0-9]+\.[0-9]+$ ]] || { echo "releases.sh: $tarball is not named slurm-X.Y.Z.tar.bz2" >&2; return 1; }
    echo "releases.sh: building $name under $SRC_PREFIX in $dir (log: $CACHE/$codename.build.log)"
    rm -rf "$dir/usr/src/$name"
    tar -xjf "$tarball" -C "$dir/usr/src"
    chroot "$dir" sh -c "cd /usr/src/$name && ./configure --prefix=$SRC_PREFIX --sysconfdir=/etc/slurm --disable-debug --enable-multiple-slurmd && make -j$(($(nproc) + 1)) && make install" \
        >"$CACHE/$codename.build.log" 2>&1 || { tail -30 "$CACHE/$codename.build.log" >&2; return 1; }
    rm -rf "$dir/usr/src/$name"
    { echo "tarball: $(basename "$tarball")"; echo "sha1: $(sha1sum "$tarball" | cut -d' ' -f1)"; echo "build_seconds: $((SECONDS - t))"; } >"$dir$SRC_PREFIX/.carma-source"
    [ -x "$dir$SRC_PREFIX/sbin/slurmd" ] && [ -f "$dir$SRC_PREFIX/lib/slurm/job_submit_lua.so" ] ||
        { echo "releases.sh: the build has no slurmd or no job_submit/lua" >&2; return 1; }
    echo "releases.sh: $name built in $((SECONDS - t)) s"
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
    local codename=$1 dir base=$1 pkgs=$PKGS
    dir=$(root_of "$codename")
    if is_source "$codename"; then base=$SRC_BASE pkgs=$SRC_PKGS; fi
    if [ -f "$dir/.carma-ready" ]; then
        return 0
    fi
    # No tarball, no chroot: said before debootstrap's minute.
    ! is_source "$codename" || tarball_of "$codename" >/dev/null || exit 1
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
    echo "releases.sh: debootstrap $base into $dir"
    debootstrap --variant=minbase "$base" "$dir" "$(mirror)" >"$CACHE/$codename.debootstrap.log" 2>&1 ||
        { tail -20 "$CACHE/$codename.debootstrap.log" >&2; die "debootstrap $codename failed"; }
    # sid's Release file in the mirror is past its date.
    echo 'Acquire::Check-Valid-Until "false";' >"$dir/etc/apt/apt.conf.d/99carma-valid-until"
    # Services are started by our scripts, never by a package's postinst.
    printf '#!/bin/sh\nexit 101\n' >"$dir/usr/sbin/policy-rc.d"
    chmod 0755 "$dir/usr/sbin/policy-rc.d"
    mount_root "$codename"
    chroot "$dir" sh -c "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $pkgs" \
        >"$CACHE/$codename.apt.log" 2>&1 || { umount_root "$codename"; tail -20 "$CACHE/$codename.apt.log" >&2; die "installing Slurm in $codename failed"; }
    if is_source "$codename"; then
        build_slurm "$codename" || { umount_root "$codename"; die "building Slurm for $codename failed"; }
        # Slurm's own users and directories, as a site's RPM %pre makes them.
        chroot "$dir" sh -c "getent passwd slurm >/dev/null || useradd -r -M -d /var/lib/slurm -s /usr/sbin/nologin slurm"
    fi
    umount_root "$codename"
    touch "$dir/.carma-ready"
    echo "releases.sh: $codename ready with Slurm $(series "$codename") in $((SECONDS - t)) s"
}

# "26.05" from the chroot's headers.
series() {
    "$repo/packaging/slurm-series.sh" "$(include_of "$1")"
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
    local codename=$1 path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin prefix=
    shift
    make_root "$codename"
    mount_root "$codename"
    mount_work "$codename"
    # A source build: its commands first on PATH, as a site's profile.d does;
    # SLURM_PREFIX tells tests/cluster.sh where this Slurm is.
    if is_source "$codename"; then path=$SRC_PREFIX/bin:$SRC_PREFIX/sbin:$path prefix=$SRC_PREFIX; fi
    chroot "$(root_of "$codename")" /usr/bin/env -C "$PWD" PROFILE="$PROFILE" CARGO_TARGET_DIR="$TARGET" CARMA_CHROOT="$codename" \
        SLURM_PREFIX="$prefix" PATH="$path" "$@"
}

# The plugin against the release's headers; the rest of the workspace is
# built once (binaries built on Debian 12 run on trixie and sid).
plugin() {
    local codename=$1
    make_root "$codename"
    "$repo/packaging/build-plugin.sh" "$(include_of "$codename")"
}

# The previous release (tests/previous-release.sh) against the release's
# headers, for the upgrade test.
previous() {
    local codename=$1
    make_root "$codename"
    "$repo/tests/previous-release.sh" build "$(include_of "$codename")"
}

case "${1:-}" in
    make) make_root "${2:?codename}" ;;
    series) series "${2:?codename}" ;;
    root) root_of "${2:?codename}" ;;
    plugin) plugin "${2:?codename}" ;;
    previous) previous "${2:?codename}" ;;
    enter) shift; enter "$@" ;;
    umount) umount_root "${2:?codename}" ;;
    tarball) make_tarball "${2:?series, e.g. 25.11}" "${3:?a clone of SchedMD/slurm}" ;;
    *) die "usage: $0 make|series|root|plugin|previous|enter|umount CODENAME [CMD...] | tarball SERIES GIT_DIR" ;;
esac
