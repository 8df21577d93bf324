//! The Debian packages admins install: what they hold, what they depend on,
//! and an upgrade under a running CARMA job. `tests/cluster.sh start`
//! installed them, so every other suite already runs the packaged plugin.

mod common;

use common::*;
use std::path::PathBuf;
use std::process::Command;

fn dpkg_query(args: &[&str]) -> String {
    root(&[&["dpkg-query"], args].concat(), 20).ok().stdout
}

/// Where `tests/cluster.sh` built the packages from.
fn bin_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"));
    target.join(std::env::var("PROFILE").unwrap_or_else(|_| "release".into()))
}

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

#[test]
fn an_upgrade_leaves_running_jobs_and_their_reservations_alone() {
    require_cluster();
    let installed = dpkg_query(&["-W", "-f", "${Version}", "carma-slurm"]);
    let name = unique("upgrade");
    let up = work_dir().join(format!("{name}.up"));
    let go = work_dir().join(format!("{name}.go"));
    let body = format!(
        "echo \"$CARMA_DECISION\"; touch {up}; while [ ! -e {go} ]; do sleep 0.2; done; echo STILL-HERE",
        up = up.display(),
        go = go.display()
    );
    let job = std::thread::spawn(move || sbatch_wait(&["--carma-mem=3G"], &[], &body, 120));
    let start = std::time::Instant::now();
    while !up.exists() {
        assert!(start.elapsed().as_secs() < 60, "the job never started");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let before = root(&["carma", "status", "--json"], 20).ok().stdout;

    // A newer version, installed the way admins upgrade, while the job runs.
    let out = std::env::temp_dir().join(format!("carma-upgrade-{}", std::process::id()));
    let newer = format!("{installed}+upgradetest1");
    let built = Command::new(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("packaging/build-deb.sh"))
        .arg(bin_dir())
        .arg(&out)
        .env("CARMA_DEB_VERSION", &newer)
        .output()
        .unwrap();
    assert!(built.status.success(), "{}", String::from_utf8_lossy(&built.stderr));
    let deb = |v: &str| out.join(format!("carma-slurm_{v}_amd64.deb")).to_string_lossy().into_owned();
    let sim = |v: &str| out.join(format!("carma-slurm-sim_{v}_amd64.deb")).to_string_lossy().into_owned();
    let r = root(&["dpkg", "-i", &deb(&newer), &sim(&newer)], 120);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("restart slurmd"), "the upgrade does not tell the admin what to do: {}", r.stderr);
    assert_eq!(dpkg_query(&["-W", "-f", "${Version}", "carma-slurm"]), newer);

    // The running job's reservation survived; a new step loads the new plugin and is placed.
    let after = root(&["carma", "status", "--json"], 20).ok().stdout;
    let reservations = |s: &str| serde_json::from_str::<serde_json::Value>(s).unwrap()["reservations"].clone();
    assert_eq!(reservations(&after), reservations(&before), "the upgrade changed the node state");
    let r = user(&["srun", "--carma-mem=1G", "printenv", "CARMA_DECISION"], 60).ok();
    assert!(r.stdout.contains("gpu_indices="), "{}", r.stdout);
    std::fs::write(&go, "").unwrap();
    let (r, text) = job.join().unwrap();
    assert_eq!(r.code, 0, "{text}");
    assert!(text.contains("STILL-HERE") && text.contains("gpu_indices="), "{text}");

    // Back to the version the other suites test (dpkg -i downgrades).
    let back = bin_dir().parent().unwrap().join("debian");
    let deb0 = back.join(format!("carma-slurm_{installed}_amd64.deb"));
    let sim0 = back.join(format!("carma-slurm-sim_{installed}_amd64.deb"));
    let r = root(&["dpkg", "-i", deb0.to_str().unwrap(), sim0.to_str().unwrap()], 120);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let _ = std::fs::remove_dir_all(&out);
    report(
        "package",
        "upgrade of carma-slurm under a running CARMA job: the job finished, its reservation was kept, new steps were placed",
    );
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
        Command::new(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("packaging/build-deb.sh"))
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
    for tool in ["carma", "carma-epilog", "carma-monitor", "carma-fakejob"] {
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
