# Sourced by packaging/build-deb.sh and packaging/build-rpm.sh: the files
# both package formats install, laid out from binaries already built.
#
#   stage BIN_DIR DEST
#
# sets $series (the Slurm series packaged for: CARMA_SLURM_SERIES, else that
# of this host's Slurm headers), $next (the series after it) and $base (the
# workspace version), and fills DEST/carma-slurm and DEST/carma-slurm-sim.
# Expects $repo and a die function.

stage() {
    local bin=$1 dest=$2 f plugin built_for p s doc
    for f in carma carma-epilog carma-monitor carma-fakejob carma-fake-mps-control; do
        [ -f "$bin/$f" ] || die "$bin/$f missing: run cargo build --release --workspace first"
    done
    # The series to package for: CARMA_SLURM_SERIES (one build host packages
    # every series), else that of the Slurm headers under SLURM_PREFIX (else
    # this host's /usr/include), which build-plugin.sh built against.
    series=${CARMA_SLURM_SERIES:-$("$repo/packaging/slurm-series.sh" "${SLURM_PREFIX:-/usr}/include" 2>/dev/null)} ||
        die "no Slurm headers here: name the series to package for (CARMA_SLURM_SERIES=26.05)"
    echo "$series" | grep -qxE '[0-9]+\.[0-9]{2}' || die "'$series' is not a Slurm release series (like 26.05)"
    next=$(echo "$series" | awk -F. '{ printf "%d.%02d", $1, $2 + 1 }')
    # The plugin built for this series (packaging/build-plugin.sh), else the
    # workspace build's; either way it must carry this series' mark.
    plugin=$bin/slurm-$series/libcarma_spank.so
    [ -f "$plugin" ] || plugin=$bin/libcarma_spank.so
    [ -f "$plugin" ] || die "$plugin missing: run packaging/build-plugin.sh first"
    built_for=$(grep -ao 'carma-slurm-series=[0-9.]*;' "$plugin" | head -1 | sed 's/.*=\(.*\);/\1/') || true
    [ "$built_for" = "$series" ] ||
        die "$plugin was built for Slurm ${built_for:-an unknown series}, not $series: run packaging/build-plugin.sh with Slurm $series's include directory"
    base=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' "$repo/Cargo.toml")
    [ -n "$base" ] || die "no version in Cargo.toml [workspace.package]"

    # --- carma-slurm ---------------------------------------------------------
    p=$dest/carma-slurm
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
    install -m 0644 "$repo/README.md" "$doc/"
    install -m 0644 "$repo"/slurm-conf-examples/* "$doc/examples/"
    install -m 0644 "$repo/packaging/copyright" "$doc/copyright"
    # The plugstack line, ready to include (plugstack.conf.d/) or copy.
    install -D -m 0644 "$repo/slurm-conf-examples/plugstack.conf" "$p/usr/share/carma-slurm/plugstack-carma.conf"
    # Transparent collocation: the Lua module and the two scripts that load it.
    install -m 0644 "$repo"/slurm-conf-examples/{carma_slurm,job_submit,cli_filter}.lua "$p/usr/share/carma-slurm/"
    # The series the package is for: the Lua writes GRES in that release's TRES
    # spelling (gres:carmamem:N up to 23.02, gres/carmamem:N since 23.11).
    echo "$series" >"$p/usr/share/carma-slurm/slurm-series"

    # --- carma-slurm-sim -----------------------------------------------------
    s=$dest/carma-slurm-sim
    install -D -m 0755 "$bin/carma-fakejob" "$s/usr/bin/carma-fakejob"
    strip --strip-unneeded "$s/usr/bin/carma-fakejob"
    # The stand-in for NVIDIA's MPS control daemon, under its file name
    # (CARMA knows an MPS server by its parent's executable: a copy, never a
    # link) and outside PATH, where it shadows no driver's.
    install -D -m 0755 "$bin/carma-fake-mps-control" "$s/usr/lib/carma-sim/nvidia-cuda-mps-control"
    strip --strip-unneeded "$s/usr/lib/carma-sim/nvidia-cuda-mps-control"
    install -D -m 0644 "$repo/packaging/sim-gpus.yaml" "$s/usr/share/doc/carma-slurm-sim/examples/sim-gpus.yaml"
    # The NVML stand-in: outside the loader's path on purpose (a GPU node's
    # driver owns libnvidia-ml.so.1); a test node names it in ld.so.conf.d or
    # in carma.yaml (gpu_source: {nvml: {library: ...}}).
    install -D -m 0644 "$bin/libnvidia_ml.so" "$s/usr/lib/carma-sim/libnvidia-ml.so.1"
    strip --strip-unneeded "$s/usr/lib/carma-sim/libnvidia-ml.so.1"
    install -D -m 0644 "$repo/data/h100/collocation.csv" "$s/usr/share/carma-sim/h100-collocation.csv"
    install -D -m 0644 "$repo/data/h100/probes.csv" "$s/usr/share/carma-sim/h100-probes.csv"
    install -m 0644 "$repo/packaging/copyright" "$s/usr/share/doc/carma-slurm-sim/copyright"
}
