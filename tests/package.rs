//! The Debian and RPM packages admins install: what they hold and what they
//! depend on (upgrades: tests/upgrade.rs). `tests/cluster.sh start`
//! installed them, so every other suite already runs the packaged plugin.

mod common;

use common::*;
use std::path::PathBuf;
use std::process::Command;

#[test]
fn the_cluster_runs_the_packaged_plugin_built_for_its_slurm_series() {
    require_cluster();
    for p in ["carma-slurm", "carma-slurm-sim"] {
        assert_eq!(dpkg_query(&["-W", "-f", "${Status}", p]), "install ok installed", "{p}");
    }
    // The plugin Slurm loads is the package's.
    let plugstack = std::fs::read_to_string("/etc/slurm/plugstack.conf").unwrap();
    assert!(plugstack.contains("required /usr/lib/carma/carma_spank.so "), "{plugstack}");
    let owner = |path: &str| root(&["dpkg", "-S", path], 20).ok().stdout.split(':').next().unwrap().to_string();
    assert_eq!(owner("/usr/lib/carma/carma_spank.so"), "carma-slurm");
    assert_eq!(owner("/usr/sbin/carma-epilog"), "carma-slurm");
    assert_eq!(owner("/usr/bin/carma"), "carma-slurm");
    assert_eq!(owner("/usr/sbin/carma-monitor"), "carma-slurm");
    assert_eq!(owner("/usr/lib/systemd/system/carma-monitor.service"), "carma-slurm");
    assert_eq!(owner("/usr/lib/systemd/system/carma-mps@.service"), "carma-slurm");
    for lua in ["carma_slurm.lua", "job_submit.lua", "cli_filter.lua"] {
        assert_eq!(owner(&format!("/usr/share/carma-slurm/{lua}")), "carma-slurm", "{lua}");
    }
    // The simulated-GPU workload is kept out of what production nodes get.
    assert_eq!(owner("/usr/bin/carma-fakejob"), "carma-slurm-sim");
    assert!(!dpkg_query(&["-L", "carma-slurm"]).contains("carma-fakejob"));
    // So is the NVML stand-in: outside the loader's path (a GPU node's
    // driver owns libnvidia-ml.so.1), with the soname the driver's has.
    assert_eq!(owner("/usr/lib/carma-sim/libnvidia-ml.so.1"), "carma-slurm-sim");
    assert!(!dpkg_query(&["-L", "carma-slurm"]).contains("libnvidia-ml"));
    // And the MPS control daemon's stand-in, under NVIDIA's file name.
    assert_eq!(owner("/usr/lib/carma-sim/nvidia-cuda-mps-control"), "carma-slurm-sim");
    assert!(!dpkg_query(&["-L", "carma-slurm"]).contains("nvidia-cuda-mps-control"));
    let dynamic = std::process::Command::new("objdump").args(["-p", "/usr/lib/carma-sim/libnvidia-ml.so.1"]).output();
    if let Some(d) = dynamic.ok().filter(|d| d.status.success()) {
        assert!(String::from_utf8_lossy(&d.stdout).contains("SONAME               libnvidia-ml.so.1"));
    }
    // Depends on exactly the release series of the Slurm it was built with.
    let slurm = dpkg_query(&["-W", "-f", "${Version}", "libslurm-dev"]);
    let series: Vec<&str> = slurm.split('.').take(2).collect();
    let (major, minor): (u32, u32) = (series[0].parse().unwrap(), series[1].parse().unwrap());
    let depends = dpkg_query(&["-W", "-f", "${Depends}", "carma-slurm"]);
    assert!(
        depends.contains(&format!("slurm-wlm-basic-plugins (>= {major}.{minor:02}~)"))
            && depends.contains(&format!("slurm-wlm-basic-plugins (<< {major}.{:02}~)", minor + 1)),
        "{depends} (Slurm {slurm})"
    );
    // The documentation admins read comes with it.
    for f in ["README.Debian", "examples/carma.yaml", "examples/plugstack.conf", "copyright"] {
        assert!(std::path::Path::new("/usr/share/doc/carma-slurm").join(f).is_file(), "{f}");
    }
}

/// The running Slurm's series ("26.05"), and a plugin built for another one
/// (tests/run.sh builds one per release it tests).
fn series_and_other_plugin() -> (String, PathBuf) {
    let slurm = dpkg_query(&["-W", "-f", "${Version}", "slurmd"]);
    let series: String = slurm.split('.').take(2).collect::<Vec<_>>().join(".");
    let other = std::fs::read_dir(bin_dir())
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            name.starts_with("slurm-") && name != format!("slurm-{series}") && p.join("libcarma_spank.so").is_file()
        })
        .unwrap_or_else(|| {
            panic!(
                "no plugin built for a Slurm series other than {series} in {}: run tests/run.sh",
                bin_dir().display()
            )
        });
    (series, other.join("libcarma_spank.so"))
}

#[test]
fn a_plugin_or_package_for_another_slurm_series_is_refused() {
    require_cluster();
    let (series, other) = series_and_other_plugin();
    let other_series =
        other.parent().unwrap().file_name().unwrap().to_string_lossy().trim_start_matches("slurm-").to_string();
    let out = std::env::temp_dir().join(format!("carma-other-{}", std::process::id()));
    let build = |bin: &std::path::Path, series: &str| {
        Command::new(common::repo().join("packaging/build-deb.sh"))
            .arg(bin)
            .arg(&out)
            .env("CARMA_SLURM_SERIES", series)
            .output()
            .unwrap()
    };
    // Packaging refuses a plugin that was built for another series than the
    // package would depend on.
    let fake_bin = out.join("bin");
    std::fs::create_dir_all(fake_bin.join(format!("slurm-{series}"))).unwrap();
    for tool in ["carma", "carma-epilog", "carma-monitor", "carma-fakejob", "carma-fake-mps-control"] {
        std::os::unix::fs::symlink(bin_dir().join(tool), fake_bin.join(tool)).unwrap();
    }
    std::fs::copy(&other, fake_bin.join(format!("slurm-{series}/libcarma_spank.so"))).unwrap();
    let r = build(&fake_bin, &series);
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(!r.status.success(), "packaged a {other_series} plugin as {series}");
    assert!(err.contains(&format!("built for Slurm {other_series}, not {series}")), "{err}");

    // The package built for the other series installs nowhere else: apt
    // refuses it by its dependency, and what is installed stays.
    let before = dpkg_query(&["-W", "-f", "${Version}", "carma-slurm"]);
    let r = build(&bin_dir(), &other_series);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let deb = std::fs::read_dir(&out)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            name.starts_with("carma-slurm_") && name.contains(&format!("+slurm{other_series}_"))
        })
        .unwrap();
    let r = root(&["apt-get", "install", "-s", "-q", deb.to_str().unwrap()], 120);
    let said = format!("{}{}", r.stdout, r.stderr);
    assert_ne!(r.code, 0, "apt would install a plugin for Slurm {other_series} on {series}: {said}");
    assert!(said.contains("slurm-wlm-basic-plugins") && said.contains("unmet dependencies"), "{said}");
    assert_eq!(dpkg_query(&["-W", "-f", "${Version}", "carma-slurm"]), before);
    let _ = std::fs::remove_dir_all(&out);
    report(
        "package",
        &format!("Slurm {series}: a plugin built for {other_series} is refused by build-deb.sh, its package by apt"),
    );
}

fn node_state(node: &str) -> String {
    // One line per partition the node is in: the state is the node's.
    let out = root(&["sinfo", "-h", "-N", "-n", node, "-o", "%T"], 10).stdout;
    out.lines().next().unwrap_or("").trim().to_string()
}

/// Waits (at most `secs`) until the node's state passes `ok`; returns the last state.
fn wait_node(node: &str, secs: u64, ok: impl Fn(&str) -> bool) -> String {
    let start = std::time::Instant::now();
    loop {
        let state = node_state(node);
        if ok(&state) || start.elapsed().as_secs() >= secs {
            return state;
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
}

/// Puts node 2's plugstack back and resumes the node, however the test
/// ends, until it takes jobs again (bounded): the suites after this one
/// need it, and a drained node fails them.
struct Plugstack(PathBuf, String, String);

impl Drop for Plugstack {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.0, &self.1);
        // Resumed while drained; done once it reads plainly idle (a `*`,
        // not responding, clears within a second of a resume).
        wait_node(&self.2, 30, |s| {
            if s.contains("drain") || s.contains("drng") || s.contains("down") {
                root(&["scontrol", "update", &format!("nodename={}", self.2), "state=resume"], 20);
            }
            ["idle", "mixed", "allocated"].contains(&s)
        });
    }
}

#[test]
fn a_plugin_for_another_series_is_named_in_slurmds_log_as_slurm_refuses_it() {
    require_cluster();
    let (series, other) = series_and_other_plugin();
    let node2 = node2();
    // An admin copies the wrong .so onto node 2 by hand (the package would
    // have refused it): Slurm's plugin loader refuses it at the next step.
    let so = std::env::temp_dir().join(format!("carma-mismatched-{}.so", std::process::id()));
    std::fs::copy(&other, &so).unwrap();
    let path = PathBuf::from("/etc/slurm/node2/plugstack.conf");
    let saved = std::fs::read_to_string(&path).unwrap();
    let _restore = Plugstack(path.clone(), saved.clone(), node2.clone());
    std::fs::write(&path, saved.replace("/usr/lib/carma/carma_spank.so", so.to_str().unwrap())).unwrap();
    let r = user(&["srun", "-p", "multi", "-w", &node2, "true"], 60);
    assert_ne!(r.code, 0, "a step ran with a plugin built for another series");
    // Slurm fails the job's prolog and drains the node, after srun returns.
    let state = wait_node(&node2, 30, |s| s.contains("drain") || s.contains("drng"));
    assert!(state.contains("drain") || state.contains("drng"), "node {node2}: {state}");
    // The job's epilog fails too (the plugin loads there neither) and drains
    // the node again: put it right only once the job has left the node.
    let start = std::time::Instant::now();
    while !root(&["squeue", "-h", "-w", &node2, "-t", "R,CG", "-o", "%i"], 10).stdout.trim().is_empty() {
        assert!(start.elapsed().as_secs() < 30, "the failed job stayed on {node2}");
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
    let log = std::fs::read_to_string(format!("/var/log/carma-cluster/slurmd-{node2}.log")).unwrap();
    let named = log.lines().filter(|l| l.contains(so.to_str().unwrap())).collect::<Vec<_>>().join("\n");
    assert!(named.contains("Incompatible"), "slurmd's log does not name {}: {named}", so.display());
    drop(_restore);
    let state = node_state(&node2);
    assert!(["idle", "mixed", "allocated"].contains(&state.as_str()), "node {node2} not back: {state}");
    // Put right, the node runs steps again.
    let r = user(&["srun", "-p", "multi", "-w", &node2, "printenv", "SLURMD_NODENAME"], 60).ok();
    assert_eq!(r.stdout.trim(), node2);
    let _ = std::fs::remove_file(&so);
    report(
        "package",
        &format!(
            "Slurm {series}: a plugin built for another series named in slurmd's log (Incompatible plugin version); Slurm drained the node; resumed"
        ),
    );
}

/// `rpm -qp <args> <file>`: its output lines.
fn rpm_query(args: &[&str], file: &std::path::Path) -> Vec<String> {
    let out = Command::new("rpm").arg("-qp").args(args).arg(file).output().unwrap();
    assert!(out.status.success(), "rpm -qp {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect()
}

/// Files (not directories) of a .deb, as absolute paths.
fn deb_files(deb: &std::path::Path) -> Vec<String> {
    let out = Command::new("dpkg-deb").arg("-c").arg(deb).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut files: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.starts_with('d'))
        .filter_map(|l| l.split_whitespace().last().map(|p| p.trim_start_matches('.').to_string()))
        .collect();
    files.sort();
    files
}

/// The highest glibc symbol version (libc, libm...) a package's binaries need.
fn max_glibc(requires: &[String]) -> (u32, u32) {
    requires
        .iter()
        .filter_map(|r| r.split_once("(GLIBC_")?.1.strip_suffix(")(64bit)"))
        .filter_map(|v| {
            let mut parts = v.split('.').map(|n| n.parse::<u32>().ok());
            Some((parts.next()??, parts.next()??))
        })
        .max()
        .unwrap_or((0, 0))
}

/// The RPMs (packaging/carma-slurm.spec, built with Debian's rpmbuild by
/// packaging/build-rpm.sh), for every Slurm series this run built a plugin
/// for: each requires exactly that series of SchedMD's slurm-plugins, holds
/// the files the .deb of that series holds, provides nothing a GPU driver
/// does, asks for no newer glibc than the .deb does (Debian 12's 2.36), and
/// says on upgrade that slurmd must be restarted.
#[test]
fn the_rpm_of_each_slurm_series_requires_that_series_and_holds_what_the_deb_holds() {
    let have_rpm = Command::new("rpmbuild").arg("--version").output().is_ok_and(|o| o.status.success());
    if !have_rpm && std::env::var_os("CARMA_CHROOT").is_some() {
        // The releases' chroots are minimal; the host builds and checks the RPMs of every series.
        eprintln!("rpmbuild is not in this release's chroot: the host's run checks the RPMs");
        return;
    }
    assert!(have_rpm, "rpmbuild missing: tests/cluster.sh deps installs Debian's rpm package");
    let manifest = common::repo();
    let mut series: Vec<String> = std::fs::read_dir(bin_dir())
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("libcarma_spank.so").is_file())
        .filter_map(|p| p.file_name()?.to_str()?.strip_prefix("slurm-").map(str::to_string))
        .collect();
    series.sort();
    assert!(!series.is_empty(), "no plugin built per series in {}: run packaging/build-plugin.sh", bin_dir().display());
    let out = std::env::temp_dir().join(format!("carma-rpm-{}", std::process::id()));
    for s in &series {
        let next = {
            let (major, minor) = s.split_once('.').unwrap();
            format!("{major}.{:02}", minor.parse::<u32>().unwrap() + 1)
        };
        let dir = out.join(s);
        let build = |script: &str, dest: &std::path::Path, requires: &str| {
            let r = Command::new(manifest.join("packaging").join(script))
                .arg(bin_dir())
                .arg(dest)
                .env("CARMA_SLURM_SERIES", s)
                .env("CARMA_RPM_SLURM_REQUIRES", requires)
                .output()
                .unwrap();
            assert!(r.status.success(), "{script} for {s}: {}", String::from_utf8_lossy(&r.stderr));
        };
        build("build-rpm.sh", &dir.join("rpm"), "1");
        build("build-deb.sh", &dir.join("deb"), "1");
        let find = |sub: &str, prefix: &str| {
            std::fs::read_dir(dir.join(sub))
                .unwrap()
                .filter_map(|e| e.ok().map(|e| e.path()))
                .find(|p| p.file_name().unwrap().to_string_lossy().starts_with(prefix))
                .unwrap_or_else(|| panic!("no {prefix}* in {}", dir.join(sub).display()))
        };
        let (rpm, rpm_sim) = (find("rpm", "carma-slurm-0"), find("rpm", "carma-slurm-sim-"));

        // Exactly this series of SchedMD's Slurm, nothing of Slurm's libraries
        // (the plugin takes them from the process that loads it).
        let requires = rpm_query(&["--requires"], &rpm);
        assert!(requires.contains(&format!("slurm-plugins >= {s}")), "{s}: {requires:?}");
        assert!(requires.contains(&format!("slurm-plugins < {next}")), "{s}: {requires:?}");
        assert!(!requires.iter().any(|r| r.contains("libslurm") || r.contains("nvidia")), "{s}: {requires:?}");
        // The glibc the RPM asks for is read from the binaries: no newer than
        // the build host's, and stated (RHEL 9's 2.34 is short of hypot@2.35:
        // docs/packaging.md).
        let glibc = max_glibc(&requires);
        assert!(((2, 2)..=(2, 36)).contains(&glibc), "{s}: glibc {glibc:?}: {requires:?}");
        let version = rpm_query(&["--qf", "%{VERSION}-%{RELEASE}"], &rpm).join("");
        assert!(version.ends_with(&format!(".slurm{s}")), "{version}");
        let sim_requires = rpm_query(&["--requires"], &rpm_sim);
        assert!(sim_requires.contains(&format!("carma-slurm = {version}")), "{sim_requires:?}");
        // The NVML stand-in and the plugin provide nothing: a driver's
        // libnvidia-ml.so.1 dependency is never met by the simulator.
        for (file, name) in [(&rpm, "carma-slurm"), (&rpm_sim, "carma-slurm-sim")] {
            let provides = rpm_query(&["--provides"], file);
            assert!(
                provides.iter().all(|p| p.starts_with(&format!("{name} =")) || p.starts_with(&format!("{name}("))),
                "{provides:?}"
            );
        }

        // What the .deb of the series installs (less Debian's own README).
        let mut files: Vec<String> = [&rpm, &rpm_sim]
            .iter()
            .flat_map(|f| rpm_query(&["--qf", "[%{FILEMODES:perms} %{FILENAMES}\n]"], f))
            .filter(|l| !l.starts_with('d'))
            .map(|l| l.split_once(' ').unwrap().1.to_string())
            .collect();
        files.sort();
        let mut deb: Vec<String> =
            [find("deb", "carma-slurm_"), find("deb", "carma-slurm-sim_")].iter().flat_map(|d| deb_files(d)).collect();
        deb.retain(|f| !f.ends_with("/README.Debian"));
        deb.sort();
        assert_eq!(files, deb, "{s}: the RPMs and the .deb install different files");
        let dirs = rpm_query(&["--qf", "[%{FILEMODES:perms} %{FILEUSERNAME} %{FILENAMES}\n]"], &rpm);
        assert!(dirs.contains(&"drwxr-xr-x root /var/log/carma".to_string()), "{dirs:?}");

        // The upgrade scriptlet tells the admin what to do, and only on upgrade.
        let scripts = rpm_query(&["--qf", "%{POSTIN}"], &rpm).join("\n");
        let run = |arg: &str| Command::new("sh").args(["-c", &scripts, "postin", arg]).output().unwrap();
        let (install, upgrade) = (run("1"), run("2"));
        assert!(install.status.success() && install.stderr.is_empty(), "{install:?}");
        assert!(upgrade.status.success() && String::from_utf8_lossy(&upgrade.stderr).contains("restart slurmd"));
        let postun = rpm_query(&["--qf", "%{POSTUN}"], &rpm).join("\n");
        assert!(postun.contains("\"$1\" -eq 0") && postun.contains("rm -rf /run/carma"), "{postun}");

        // A Slurm installed from its tarball (no slurm-plugins RPM): no requirement.
        build("build-rpm.sh", &dir.join("rpm-nodeps"), "0");
        let bare = rpm_query(&["--requires"], &find("rpm-nodeps", "carma-slurm-0"));
        assert!(!bare.iter().any(|r| r.contains("slurm-plugins")), "{bare:?}");
    }
    let _ = std::fs::remove_dir_all(&out);
    report("package", &format!("RPMs for Slurm {} checked: requires, provides, files, scriptlets", series.join(", ")));
}
