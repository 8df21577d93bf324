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
#                                     carma-fakejob and an example file of
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
for f in carma carma-epilog carma-monitor carma-fakejob; do
    [ -f "$bin/$f" ] || die "$bin/$f missing: run cargo build --release --workspace first"
done

arch=$(dpkg --print-architecture)
# The series to package for: CARMA_SLURM_SERIES (one build host packages
# every series), else that of this host's Slurm headers, which
# build-plugin.sh built against by default.
series=${CARMA_SLURM_SERIES:-$("$repo/packaging/slurm-series.sh" 2>/dev/null)} ||
    die "no Slurm headers here: name the series to package for (CARMA_SLURM_SERIES=26.05)"
echo "$series" | grep -qxE '[0-9]+\.[0-9]{2}' || die "'$series' is not a Slurm release series (like 26.05)"
# and the next series (22.06): the dependency admits exactly one.
next=$(echo "$series" | awk -F. '{ printf "%d.%02d", $1, $2 + 1 }')
slurm_dep="slurm-wlm-basic-plugins (>= $series~), slurm-wlm-basic-plugins (<< $next~)"
# The plugin built for this series (packaging/build-plugin.sh), else the
# workspace build's; either way it must carry this series' mark.
plugin=$bin/slurm-$series/libcarma_spank.so
[ -f "$plugin" ] || plugin=$bin/libcarma_spank.so
[ -f "$plugin" ] || die "$plugin missing: run packaging/build-plugin.sh first"
built_for=$(grep -ao 'carma-slurm-series=[0-9.]*;' "$plugin" | head -1 | sed 's/.*=\(.*\);/\1/') || true
[ "$built_for" = "$series" ] ||
    die "$plugin was built for Slurm ${built_for:-an unknown series}, not $series: run packaging/build-plugin.sh with Slurm $series's include directory"
# The version names the series: one carma-slurm per Slurm series.
base=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' "$repo/Cargo.toml")
[ -n "$base" ] || die "no version in Cargo.toml [workspace.package]"
version=${CARMA_DEB_VERSION:-$base+slurm$series}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
install -d "$out"

# --- carma-slurm -------------------------------------------------------------
p=$work/carma-slurm
doc=$p/usr/share/doc/carma-slurm
install -D -m 0644 "$plugin" "$p/usr/lib/carma/carma_spank.so"
install -D -m 0755 "$bin/carma" "$p/usr/bin/carma"
install -D -m 0755 "$bin/carma-epilog" "$p/usr/sbin/carma-epilog"
install -D -m 0755 "$bin/carma-monitor" "$p/usr/sbin/carma-monitor"
strip --strip-unneeded "$p/usr/lib/carma/carma_spank.so" "$p/usr/bin/carma" "$p/usr/sbin/carma-epilog" "$p/usr/sbin/carma-monitor"
# Installed, not enabled (the package enables nothing by itself).
install -D -m 0644 "$repo/slurm-conf-examples/carma-monitor.service" "$p/usr/lib/systemd/system/carma-monitor.service"
install -D -m 0644 "$repo/slurm-conf-examples/carma-mps@.service" "$p/usr/lib/systemd/system/carma-mps@.service"
install -d "$doc/examples"
install -m 0644 "$repo/README.md" "$repo/packaging/README.Debian" "$doc/"
install -m 0644 "$repo"/slurm-conf-examples/* "$doc/examples/"
install -m 0644 "$repo/packaging/copyright" "$doc/copyright"
# The plugstack line, ready to link into /etc/slurm/plugstack.conf.d/.
install -D -m 0644 "$repo/slurm-conf-examples/plugstack.conf" "$p/usr/share/carma-slurm/plugstack-carma.conf"
# Transparent collocation: the Lua module and the two scripts that load it.
install -m 0644 "$repo"/slurm-conf-examples/{carma_slurm,job_submit,cli_filter}.lua "$p/usr/share/carma-slurm/"
# The series the package is for: the Lua writes GRES in that release's TRES
# spelling (gres:carmamem:N up to 23.02, gres/carmamem:N since 23.11).
echo "$series" >"$p/usr/share/carma-slurm/slurm-series"
install -d "$p/DEBIAN"
for s in postinst postrm; do install -m 0755 "$repo/packaging/carma-slurm.$s" "$p/DEBIAN/$s"; done
cat >"$p/DEBIAN/control" <<EOF
Package: carma-slurm
Version: $version
Architecture: $arch
Maintainer: CARMA for Slurm developers <carma-slurm@localhost>
Section: admin
Priority: optional
Depends: libc6 (>= 2.36), $slurm_dep
Recommends: slurmd, slurm-client
Installed-Size: $(du -sk "$p/usr" | cut -f1)
Description: safe GPU collocation of training jobs on Slurm (SPANK plugin)
 CARMA estimates a job's GPU memory before placement, watches each GPU's
 SM activity and free memory, places several training jobs on one GPU only
 where they fit, and requeues a job that crashed with GPU out-of-memory on a
 GPU of its own. Built against Slurm $series headers; a SPANK plugin loads
 only into the Slurm $series series.
EOF

# --- carma-slurm-sim ---------------------------------------------------------
s=$work/carma-slurm-sim
install -D -m 0755 "$bin/carma-fakejob" "$s/usr/bin/carma-fakejob"
strip --strip-unneeded "$s/usr/bin/carma-fakejob"
install -D -m 0644 "$repo/packaging/sim-gpus.yaml" "$s/usr/share/doc/carma-slurm-sim/examples/sim-gpus.yaml"
# The NVML stand-in: outside the loader's path on purpose (a GPU node's
# driver owns libnvidia-ml.so.1); a test node names it in ld.so.conf.d or
# in carma.yaml (gpu_source: {nvml: {library: ...}}).
install -D -m 0644 "$bin/libnvidia_ml.so" "$s/usr/lib/carma-sim/libnvidia-ml.so.1"
strip --strip-unneeded "$s/usr/lib/carma-sim/libnvidia-ml.so.1"
install -D -m 0644 "$repo/data/h100/collocation.csv" "$s/usr/share/carma-sim/h100-collocation.csv"
install -D -m 0644 "$repo/data/h100/probes.csv" "$s/usr/share/carma-sim/h100-probes.csv"
install -m 0644 "$repo/packaging/copyright" "$s/usr/share/doc/carma-slurm-sim/copyright"
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
 CARMA's NVML path runs without a GPU. Not for production GPU nodes.
EOF

for d in "$p" "$s"; do
    dpkg-deb --root-owner-group -Zgzip -z6 --build "$d" "$out/$(basename "$d")_${version}_$arch.deb" >/dev/null
done
echo "build-deb.sh: $out/carma-slurm_${version}_$arch.deb, $out/carma-slurm-sim_${version}_$arch.deb (Slurm $series)"
