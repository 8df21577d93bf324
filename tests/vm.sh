#!/usr/bin/env bash
# Slurm's own cgroup/v2 in a virtual machine. This host's cgroup hierarchy is
# hybrid, which Slurm's cgroup/v2 refuses; a VM has a kernel of its own and a
# pure cgroup2 hierarchy (docs/isolation.md).
#
#   tests/vm.sh make           kernel and initramfs (cached in $CACHE/vm)
#   tests/vm.sh run CMD...     boots the VM on sid's chroot (Slurm 26.05) and
#                              runs CMD there as root, in the checkout, with
#                              the target dir at its own path; prints what it
#                              prints and exits with its status
#
# The VM: qemu, TCG (no KVM on these machines: ../shared/notes/vm-facts.md),
# Debian 12's kernel from its linux-image package, no init system. Its root
# file system is tests/releases.sh's sid chroot, shared with the host over
# 9p (virtio), as are the checkout and the target dir; /run, /tmp, Slurm's
# spool and logs are the VM's own tmpfs. No network device: a dummy
# interface gives Slurm an address. Runs as root on the host. A VM that
# cannot start is a failure, never a skip.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$repo/target}
PROFILE=${PROFILE:-release}
CACHE=${CARMA_RELEASES_CACHE:-/var/cache/carma-releases}
VM=$CACHE/vm
RELEASE=sid
# Memory and CPUs of the VM: two slurmds, a slurmctld, a monitor and a suite.
MEM=${CARMA_VM_MEM:-3072}
CPUS=${CARMA_VM_CPUS:-$(nproc)}
# Modules the initramfs loads, with what they depend on (read from each
# module's own depends= field: the package has no modules.dep).
MODULES="virtio_pci virtio_blk 9pnet_virtio 9p dummy"

die() { echo "vm.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root (qemu shares the chroot as its root file system)"

deps() {
    local p missing=()
    for p in qemu-system-x86 busybox-static; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
    [ ${#missing[@]} -eq 0 ] && return 0
    echo "vm.sh: installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# The kernel package this host's Debian names (linux-image-amd64's).
kernel_package() {
    apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}'
}

# Prints module NAME's file and, before it, those of what it depends on.
module_files() {
    local kdir=$1 name=$2 f dep
    f=$(find "$kdir" -name "$name.ko" -o -name "${name//_/-}.ko" | head -1)
    [ -n "$f" ] || die "kernel module $name not found under $kdir"
    for dep in $(grep -a -o 'depends=[^[:cntrl:]]*' "$f" | head -1 | sed 's/^depends=//; s/,/ /g'); do
        module_files "$kdir" "$dep"
    done
    echo "$f"
}

make_vm() {
    deps
    local pkg stamp kdir t=$SECONDS
    pkg=$(kernel_package)
    [ -n "$pkg" ] || die "apt knows no linux-image-amd64 here (apt-get update?)"
    # Made again when the kernel (its version, not only its ABI name), the
    # modules, the initramfs's init or this script change.
    stamp=$({
        echo "$pkg $MODULES"
        apt-cache show --no-all-versions "$pkg" 2>/dev/null | grep -m1 '^Version:'
        cat "$here/vm/init" "$here/vm.sh" /bin/busybox
    } | sha1sum | cut -d' ' -f1)
    [ "$(cat "$VM/.ready" 2>/dev/null)" = "$stamp" ] && return 0
    rm -rf "$VM"
    install -d "$VM/deb" "$VM/kernel" "$VM/initramfs/bin" "$VM/initramfs/lib/modules"
    (cd "$VM/deb" && apt-get download "$pkg" >/dev/null 2>&1) || die "cannot download $pkg"
    dpkg -x "$VM"/deb/*.deb "$VM/kernel"
    cp "$VM"/kernel/boot/vmlinuz-* "$VM/vmlinuz"
    kdir=$(echo "$VM"/kernel/lib/modules/*)
    local m f files order=()
    for m in $MODULES; do
        # A missing module fails here, not at boot.
        files=$(module_files "$kdir" "$m") || exit 1
        for f in $files; do
            case " ${order[*]} " in *" $(basename "$f") "*) ;; *) order+=("$(basename "$f")"); cp "$f" "$VM/initramfs/lib/modules/" ;; esac
        done
    done
    printf '%s\n' "${order[@]}" >"$VM/initramfs/modules"
    cp /bin/busybox "$VM/initramfs/bin/busybox"
    cp "$here/vm/init" "$VM/initramfs/init"
    chmod 0755 "$VM/initramfs/init"
    (cd "$VM/initramfs" && find . | busybox cpio -o -H newc 2>/dev/null | gzip -1 >"$VM/initrd")
    rm -rf "$VM/deb" "$VM/kernel"
    echo "$stamp" >"$VM/.ready"
    echo "vm.sh: kernel $pkg and initramfs ready in $VM in $((SECONDS - t)) s"
}

run_vm() {
    make_vm
    local root io rc
    root=$("$here/releases.sh" root "$RELEASE")
    "$here/releases.sh" make "$RELEASE"
    # What tests/cluster.sh installs, installed here: the VM has no network.
    "$here/releases.sh" enter "$RELEASE" "$here/cluster.sh" deps
    # The chroot's mounts (the host's /proc, /sys, /dev) would be shared too.
    "$here/releases.sh" umount "$RELEASE"
    io=$VM/io
    rm -rf "$io"
    install -d "$io" "$root/mnt/carma-vm" "$root$repo" "$root$TARGET"
    # What stage 2 (tests/vm/stage2, PID 1 in the chroot) runs, and where.
    {
        printf 'REPO=%q\nTARGET=%q\nPROFILE=%q\nCWD=%q\n' "$repo" "$TARGET" "$PROFILE" "$PWD"
        printf 'CMD=(%s)\n' "$(printf '%q ' "$@")"
    } >"$io/job"
    cp "$here/vm/stage2" "$io/stage2"
    local t=$SECONDS
    # -no-reboot: the VM's power-off (or a panic) ends qemu.
    timeout --foreground "${CARMA_VM_TIMEOUT:-3600}" qemu-system-x86_64 \
        -accel tcg,thread=multi -cpu max -smp "$CPUS" -m "$MEM" -nographic -no-reboot -nic none \
        -kernel "$VM/vmlinuz" -initrd "$VM/initrd" \
        -append "console=ttyS0 panic=-1 quiet loglevel=3" \
        -virtfs "local,path=$root,mount_tag=root,security_model=passthrough,multidevs=remap" \
        -virtfs "local,path=$repo,mount_tag=repo,security_model=passthrough,multidevs=remap" \
        -virtfs "local,path=$TARGET,mount_tag=target,security_model=passthrough,multidevs=remap" \
        -virtfs "local,path=$io,mount_tag=io,security_model=passthrough,multidevs=remap" </dev/null |
        tr -d '\r' || echo "vm.sh: qemu exited with $?"
    rc=$(cat "$io/rc" 2>/dev/null) || die "the VM ended without running the command ($((SECONDS - t)) s): see the console above"
    [[ $rc =~ ^[0-9]+$ ]] || die "the VM wrote no exit status but '$rc'"
    echo "vm.sh: the command exited with $rc in the VM ($((SECONDS - t)) s with boot and power-off)"
    return "$rc"
}

case "${1:-}" in
    make) make_vm ;;
    run) shift; [ $# -gt 0 ] || die "usage: $0 run CMD..."; run_vm "$@" ;;
    *) die "usage: $0 make | run CMD..." ;;
esac
