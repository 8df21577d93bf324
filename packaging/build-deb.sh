#!/usr/bin/env bash
# Builds the Debian packages admins install, from binaries already built:
#
#   packaging/build-deb.sh [BIN_DIR] [OUT_DIR]
#
# BIN_DIR defaults to target/release (cargo build --release --workspace;
# the plugin from BIN_DIR/slurm-SERIES/, made by packaging/build-plugin.sh
# for the host's Slurm series); OUT_DIR to target/debian. Writes:
#   carma-slurm_VERSION+slurmSERIES_ARCH.deb
#                                     the SPANK plugin, carma, carma-epilog,
#                                     example configuration, docs
#   carma-slurm-sim_VERSION+slurmSERIES_ARCH.deb
#                                     carma-fakejob, the NVML and MPS control
#                                     daemon stand-ins and an example file of
#                                     simulated GPUs (demos and tests only)
#
# A SPANK plugin loads only into the Slurm major.minor whose headers it was
# built against, so the package depends on exactly that release series of
# the Slurm it was built for (the series marked in the plugin).
# Needs only dpkg-deb (part of dpkg); no debhelper.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-$repo/target/release}
out=${2:-$repo/target/debian}

die() { echo "build-deb.sh: $*" >&2; exit 1; }
# shellcheck source=packaging/stage.sh
. "$repo/packaging/stage.sh"
arch=$(dpkg --print-architecture)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
install -d "$out"
stage "$bin" "$work"
# Debian's Slurm: libslurmfull is in slurm-wlm-basic-plugins. A Slurm built
# from SchedMD's tarball is no package: CARMA_DEB_SLURM_REQUIRES=0 leaves the
# requirement out (as the RPM's --without slurm_requires).
slurm_dep=", slurm-wlm-basic-plugins (>= $series~), slurm-wlm-basic-plugins (<< $next~)"
recommends="Recommends: slurmd, slurm-client"
# Nor would Debian's slurmd be welcome beside it.
[ "${CARMA_DEB_SLURM_REQUIRES:-1}" = 0 ] && slurm_dep= recommends=
# The version names the series: one carma-slurm per Slurm series.
version=${CARMA_DEB_VERSION:-$base+slurm$series}

# --- carma-slurm -------------------------------------------------------------
p=$work/carma-slurm
install -m 0644 "$repo/packaging/README.Debian" "$p/usr/share/doc/carma-slurm/"
install -d "$p/DEBIAN"
for s in postinst postrm; do install -m 0755 "$repo/packaging/carma-slurm.$s" "$p/DEBIAN/$s"; done
cat >"$p/DEBIAN/control" <<EOF
Package: carma-slurm
Version: $version
Architecture: $arch
Maintainer: CARMA for Slurm developers <carma-slurm@localhost>
Section: admin
Priority: optional
Depends: libc6 (>= 2.36)$slurm_dep
${recommends:+$recommends
}Installed-Size: $(du -sk "$p/usr" | cut -f1)
Description: safe GPU collocation of training jobs on Slurm (SPANK plugin)
 CARMA estimates a job's GPU memory before placement, watches each GPU's
 SM activity and free memory, places several training jobs on one GPU only
 where they fit, and requeues a job that crashed with GPU out-of-memory on a
 GPU of its own. Built against Slurm $series headers; a SPANK plugin loads
 only into the Slurm $series series.
EOF

# --- carma-slurm-sim ---------------------------------------------------------
s=$work/carma-slurm-sim
install -d "$s/DEBIAN"
cat >"$s/DEBIAN/control" <<EOF
Package: carma-slurm-sim
Version: $version
Architecture: $arch
Maintainer: CARMA for Slurm developers <carma-slurm@localhost>
Section: admin
Priority: optional
Depends: libc6 (>= 2.36), carma-slurm (= $version)
Installed-Size: $(du -sk "$s/usr" | cut -f1)
Description: simulated GPUs for CARMA for Slurm (demos and tests)
 carma-fakejob is a training-like process that registers GPU memory and SM
 activity with CARMA's simulated GPU source, so CARMA can be tried and tested
 on nodes without GPUs. /usr/lib/carma-sim/libnvidia-ml.so.1 presents the
 same GPUs behind NVML's C interface (H100 and A100 profiles, faults), so
 CARMA's NVML path runs without a GPU; /usr/lib/carma-sim/nvidia-cuda-mps-control
 stands in for NVIDIA's MPS control daemon there. Not for production GPU nodes.
EOF

for d in "$p" "$s"; do
    dpkg-deb --root-owner-group -Zgzip -z6 --build "$d" "$out/$(basename "$d")_${version}_$arch.deb" >/dev/null
done
echo "build-deb.sh: $out/carma-slurm_${version}_$arch.deb, $out/carma-slurm-sim_${version}_$arch.deb (Slurm $series)"
