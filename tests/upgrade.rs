//! Upgrades of the packages under running CARMA jobs: to a newer build of
//! this tree, and between the previous release (tests/previous-release,
//! built from git) and this one, both ways. `tests/cluster.sh start`
//! installed this tree's packages; each test puts them back.

mod common;

use common::*;
use std::path::PathBuf;
use std::process::Command;

/// Cancels the jobs named so, when dropped.
struct CancelByName(String);

impl Drop for CancelByName {
    fn drop(&mut self) {
        let _ = root(&["scancel", "-n", &self.0], 20);
    }
}

/// Puts this tree's packages back, the version the other suites test, when
/// dropped, however the test ends: a failed test must not leave another
/// build on the node for the suites after it.
struct Reinstalled(String);

impl Reinstalled {
    fn debs(version: &str) -> [String; 2] {
        let dir = bin_dir().parent().unwrap().join("debian");
        ["carma-slurm", "carma-slurm-sim"]
            .map(|p| dir.join(format!("{p}_{version}_amd64.deb")).to_string_lossy().into_owned())
    }
}

impl Drop for Reinstalled {
    fn drop(&mut self) {
        let [deb, sim] = Reinstalled::debs(&self.0);
        // dpkg -i downgrades too; no assertion here (this may run while
        // the test unwinds), but a failure is said.
        let r = root(&["dpkg", "-i", &deb, &sim], 120);
        if r.code != 0 {
            eprintln!("putting carma-slurm {} back failed: {}{}", self.0, r.stdout, r.stderr);
        }
    }
}

#[test]
fn an_upgrade_leaves_running_jobs_and_their_reservations_alone() {
    require_cluster();
    let installed = dpkg_query(&["-W", "-f", "${Version}", "carma-slurm"]);
    let back = Reinstalled(installed.clone());
    let held = Held::start("upgrade", "3G");
    wait_held(&[&held]);
    let before = root(&["carma", "status", "--json"], 20).ok().stdout;

    // A newer version, installed the way admins upgrade, while the job runs.
    let out = std::env::temp_dir().join(format!("carma-upgrade-{}", std::process::id()));
    let newer = format!("{installed}+upgradetest1");
    let built = Command::new(common::repo().join("packaging/build-deb.sh"))
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
    let text = held.release();
    assert!(text.contains("STILL-HERE") && text.contains("gpu_indices="), "{text}");

    drop(back);
    assert_eq!(
        dpkg_query(&["-W", "-f", "${Version}", "carma-slurm"]),
        installed,
        "this tree's package was not put back"
    );
    let _ = std::fs::remove_dir_all(&out);
    report(
        "package",
        "upgrade of carma-slurm under a running CARMA job: the job finished, its reservation was kept, new steps were placed",
    );
}

/// A batch job on the first node (whose state `carma status` here reads)
/// that holds its GPU until released: its decision, once it runs, and its
/// end.
struct Held {
    go: PathBuf,
    decision: String,
    job: Option<std::thread::JoinHandle<(Run, String)>>,
    _cancel: CancelByName,
}

impl Held {
    fn start(tag: &str, mem: &str) -> Held {
        let name = unique(tag);
        let up = work_dir().join(format!("{name}.up"));
        let go = work_dir().join(format!("{name}.go"));
        let body = format!(
            "d=\"job=$SLURM_JOB_ID $CARMA_DECISION\"; echo \"$d\"; echo \"$d\" > {up}.tmp; mv {up}.tmp {up}; while [ ! -e {go} ]; do sleep 0.2; done; echo STILL-HERE",
            up = up.display(),
            go = go.display()
        );
        let cancel = CancelByName(name.clone());
        let opts = [format!("--carma-mem={mem}"), format!("--job-name={name}"), format!("--nodelist={}", node1())];
        let job = std::thread::spawn(move || {
            let opts: Vec<&str> = opts.iter().map(String::as_str).collect();
            sbatch_wait(&opts, &[], &body, 180)
        });
        let start = std::time::Instant::now();
        while !up.exists() {
            assert!(start.elapsed().as_secs() < 60, "job {name} never started");
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let decision = std::fs::read_to_string(&up).unwrap();
        Held { go, decision, job: Some(job), _cancel: cancel }
    }

    /// The GPU it was placed on.
    fn gpu(&self) -> String {
        self.decision.split_whitespace().find_map(|w| w.strip_prefix("gpu_indices=")).unwrap_or("none").to_string()
    }

    /// Ends the job, which must succeed; its output.
    fn release(mut self) -> String {
        std::fs::write(&self.go, "").unwrap();
        let (r, text) = self.job.take().unwrap().join().unwrap();
        assert_eq!(r.code, 0, "{text}");
        text
    }
}

/// The first node's name (tests/cluster.sh names it after this host): the
/// node whose state `carma status` here reads.
fn node1() -> String {
    root(&["hostname", "-s"], 10).ok().stdout.trim().to_string()
}

/// Waits (at most 20 s) until CARMA holds GPUs on the first node for
/// exactly `held`'s jobs: an ended job's slurmstepd releases its GPUs
/// shortly after Slurm reports it done.
fn wait_held(held: &[&Held]) {
    let mut want: Vec<u64> = held.iter().map(|h| job_id(h)).collect();
    want.sort_unstable();
    let start = std::time::Instant::now();
    loop {
        let out = root(&["carma", "status", "--json"], 20).ok().stdout;
        let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
        let mut jobs: Vec<u64> =
            v["reservations"].as_array().into_iter().flatten().filter_map(|r| r["job"].as_u64()).collect();
        jobs.sort_unstable();
        if jobs == want {
            return;
        }
        assert!(start.elapsed().as_secs() < 20, "CARMA holds GPUs for jobs {jobs:?}, not {want:?}: {out}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// Files the state file was set aside as (`state.json.corrupt.*`).
fn set_aside() -> usize {
    std::fs::read_dir("/run/carma")
        .map(|d| d.flatten().filter(|e| e.file_name().to_string_lossy().contains("corrupt")).count())
        .unwrap_or(0)
}

fn job_id(held: &Held) -> u64 {
    held.decision.split_whitespace().find_map(|w| w.strip_prefix("job=")?.parse().ok()).unwrap_or(0)
}

/// The previous release (tests/previous-release, built from this
/// repository's history) and this one on one node, as during an upgrade and
/// a rollback: steps placed by each run side by side, each release sees the
/// other's holdings, each releases its own, and the state file is neither
/// set aside nor refused.
const CONF: &str = "/etc/slurm/carma.yaml";

/// carma.yaml keys this tree added since tests/previous-release (#56).
const ADDED_SINCE_PREVIOUS: [&str; 3] = ["max_slowdown", "max_slowdown_unprofiled", "idle_first"];

#[test]
fn the_previous_release_and_this_one_place_and_release_on_one_node_state() {
    require_cluster();
    let installed = dpkg_query(&["-W", "-f", "${Version}", "carma-slurm"]);
    let back = Reinstalled(installed.clone());
    let target = bin_dir().parent().unwrap().to_path_buf();
    let previous_bin = bin_dir().join("previous");
    let src = target.join("previous/src");
    assert!(
        previous_bin.join("carma").is_file() && src.join("packaging/build-deb.sh").is_file(),
        "no previous release in {}: tests/run.sh builds it (tests/previous-release.sh build)",
        previous_bin.display()
    );
    // The previous release, packaged by its own script, a version below this one.
    let out = std::env::temp_dir().join(format!("carma-previous-{}", std::process::id()));
    let older = format!("{installed}~previous");
    let built = Command::new(src.join("packaging/build-deb.sh"))
        .arg(&previous_bin)
        .arg(&out)
        .env("CARMA_DEB_VERSION", &older)
        .output()
        .unwrap();
    assert!(built.status.success(), "{}", String::from_utf8_lossy(&built.stderr));
    let this_dir = bin_dir().parent().unwrap().join("debian");
    let install = |dir: &std::path::Path, v: &str| {
        let deb = dir.join(format!("carma-slurm_{v}_amd64.deb"));
        let sim = dir.join(format!("carma-slurm-sim_{v}_amd64.deb"));
        let r = root(&["dpkg", "-i", deb.to_str().unwrap(), sim.to_str().unwrap()], 120);
        assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
        assert_eq!(dpkg_query(&["-W", "-f", "${Version}", "carma-slurm"]), v);
    };
    let log = "/var/log/carma/carma.log";
    let log_from = std::fs::metadata(log).map(|m| m.len()).unwrap_or(0);
    let aside_before = set_aside();
    // The carma.yaml a site upgrades with: the previous release refuses
    // keys it does not know, so the keys added since are left out (this
    // release runs with their defaults; 30 GiB jobs on 40 GiB GPUs never
    // share, so the guard and idle-first do not change where they go).
    let _conf = Restore::new(CONF);
    let conf = std::fs::read_to_string(CONF).unwrap();
    let known = |l: &&str| !ADDED_SINCE_PREVIOUS.iter().any(|k| l.starts_with(&format!("{k}:")));
    std::fs::write(CONF, conf.lines().filter(known).collect::<Vec<_>>().join("\n") + "\n").unwrap();
    // A job of 30 GiB fits a 40 GiB GPU alone: four jobs run together on
    // the four GPUs only if each release sees what the other placed (magm
    // breaks ties by the lowest index, so a release blind to a holding
    // would take that GPU).
    install(&out, &older);
    let a = Held::start("previous-a", "30G");
    let b = Held::start("previous-b", "30G");
    install(&this_dir, &installed);
    let c = Held::start("this-c", "30G");
    wait_held(&[&a, &b, &c]);
    // A rollback while this release's job runs.
    install(&out, &older);
    let d = Held::start("previous-d", "30G");
    wait_held(&[&a, &b, &c, &d]);
    let gpus = [a.gpu(), b.gpu(), c.gpu(), d.gpu()];
    install(&this_dir, &installed);
    a.release(); // its slurmstepd runs the previous plugin
    c.release(); // this one
    wait_held(&[&b, &d]);
    b.release();
    d.release();
    wait_released();
    let _ = std::fs::remove_dir_all(&out);
    let distinct: std::collections::BTreeSet<&String> = gpus.iter().collect();
    assert!(
        distinct.len() == 4 && !distinct.contains(&"none".to_string()),
        "jobs that ran together shared a GPU: {gpus:?}"
    );
    // Bytes: an offset into the log need not fall between characters.
    let bytes = std::fs::read(log).unwrap_or_default();
    let since = String::from_utf8_lossy(&bytes[(log_from as usize).min(bytes.len())..]).into_owned();
    assert!(!since.contains("newer than this build"), "a release refused the other's state: {since}");
    assert_eq!(set_aside(), aside_before, "a release set the other's state aside: {since}");
    drop(back);
    assert_eq!(
        dpkg_query(&["-W", "-f", "${Version}", "carma-slurm"]),
        installed,
        "this tree's package was not put back"
    );
    let commit = std::fs::read_to_string(src.join(".commit")).unwrap_or_default();
    report(
        "package",
        &format!(
            "the previous release ({}) and this one, upgraded and rolled back under running jobs: four jobs on four GPUs, each release placing beside the other's holdings and releasing its own, the state never set aside",
            commit.trim().get(..12).unwrap_or("?")
        ),
    );
}
