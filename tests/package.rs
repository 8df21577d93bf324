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
    wait_released();
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
