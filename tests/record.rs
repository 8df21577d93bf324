//! Each job's CARMA record after it ends, in its AdminComment: what
//! `scontrol show job` (and, with slurmdbd, `sacct -o AdminComment`) shows
//! a user who asks "how much GPU memory did my job use, and what did CARMA
//! reserve?".

mod common;
use common::*;

const N2_CONFIG: &str = "/etc/slurm/node2/carma.yaml";

fn admin_comment_as_user(job: &str) -> String {
    let r = user(&["scontrol", "show", "job", job], 20).ok();
    r.stdout.lines().find_map(|l| l.trim().strip_prefix("AdminComment=")).unwrap_or_default().trim().to_string()
}

#[test]
fn a_finished_jobs_decision_estimate_and_observed_peak_are_in_its_admin_comment() {
    require_cluster();
    // On the second node carma-monitor watches the job's processes: 2 GiB
    // against an estimate of 3 GiB.
    let node = node2();
    let body = format!("carma-fakejob --config {N2_CONFIG} --mem 2G --sm 0.2 --seconds 4");
    let name = unique("rec");
    let path = script(&name, &body);
    let out = work_dir().join(format!("{name}.out")).to_string_lossy().into_owned();
    let args =
        ["sbatch", "--parsable", "-p", "multi", "-w", &node, "--carma-mem=3G", "--carma-policy=ff", "-o", &out, &path];
    let job = user(&args, 30).ok().stdout.trim().to_string();
    wait_completed(&job);
    let record = admin_comment_as_user(&job);
    assert!(record.starts_with(&format!("carma@{node}: policy=ff estimate=3072M source=declared")), "{record}");
    assert!(record.contains(" gpu_indices=") && record.contains(" exclusive=false"), "{record}");
    assert!(record.ends_with(" peak=2048M"), "{record}");
    assert!(
        !record.contains("effective_free=") && !record.contains(" sm="),
        "the moment's readings are not kept: {record}"
    );
    report("record", "a finished CARMA job's decision, estimate and observed peak are in its AdminComment");
}

#[test]
fn a_site_note_in_admin_comment_survives_and_plain_jobs_get_no_record() {
    require_cluster();
    let name = unique("recnote");
    let path = script(&name, "sleep 2");
    let out = work_dir().join(format!("{name}.out")).to_string_lossy().into_owned();
    let job = user(&["sbatch", "--parsable", "--carma-mem=1G", "-o", &out, &path], 30).ok().stdout.trim().to_string();
    // The site's own note, set while the job runs.
    root(&["scontrol", "update", &format!("jobid={job}"), "admincomment=site: audited"], 20).ok();
    wait_completed(&job);
    let record = admin_comment_as_user(&job);
    assert!(record.starts_with("site: audited | carma@") && record.contains("estimate=1024M"), "{record}");
    let (r, _) = sbatch_wait(&[], &[], "true", 60);
    let plain = r.stdout.split_whitespace().last().unwrap_or_default().to_string();
    assert_eq!(admin_comment_as_user(&plain), "", "a job CARMA did not place has no record");
}

#[test]
fn jobs_srun_started_get_their_record_from_every_node() {
    require_cluster();
    // srun ends such a job as soon as its tasks are reported, so the
    // record is written before that (task_exit), from each node at once.
    let host = root(&["hostname", "-s"], 10).ok().stdout.trim().to_string();
    let mut missing = Vec::new();
    // One task per node ends on both nodes at the same moment, and their
    // writes meet (without the read-back, one of the two entries was lost
    // in 30 of 30 such jobs); two per node check the last task writes it.
    for tasks in ["2", "2", "2", "4", "4"] {
        let name = unique("recsrun");
        let r = user(&["srun", "-J", &name, "-p", "multi", "-N", "2", "-n", tasks, "--carma-mem=1G", "true"], 60);
        r.ok();
        let job = jobs_named(&name).pop().unwrap_or_else(|| panic!("no job named {name}"));
        let record = admin_comment_as_user(&job);
        for node in [host.clone(), node2()] {
            let entries = record.matches(&format!("carma@{node}: ")).count();
            if entries != 1 || !record.contains("estimate=1024M") {
                missing.push(format!("job {job}: {entries} entries of {node} in {record:?}"));
            }
        }
    }
    assert!(missing.is_empty(), "{missing:#?}");
    report("record", "5 two-node srun jobs (1 and 2 tasks per node): each has one record entry per node");
}

/// The job's AdminComment alone, as bytes (squeue prints that one field).
fn admin_comment_bytes(job: &str) -> Vec<u8> {
    let out = std::process::Command::new("squeue")
        .args(["-h", "-t", "all", "-j", job, "-O", "admin_comment:0"])
        .output()
        .expect("squeue");
    let mut b = out.stdout;
    if b.last() == Some(&b'\n') {
        b.pop();
    }
    b
}

#[test]
fn text_the_user_chose_never_reaches_admin_comment_and_the_sites_bytes_stay() {
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStringExt;
    require_cluster();
    // A job name and working directory with a newline and a forged
    // `AdminComment=` line (they come before AdminComment in `scontrol show
    // job`), and bytes that are not UTF-8.
    let name = unique("recforge");
    let dir = work_dir().join(format!("{name}\nAdminComment=forged-by-dir"));
    std::fs::create_dir_all(&dir).unwrap();
    std::process::Command::new("chown").arg(USER).arg(&dir).status().unwrap();
    let path = script(&name, "sleep 4");
    let out = work_dir().join(format!("{name}.out"));
    let job_name = OsString::from_vec([name.as_bytes(), b"\xff\nAdminComment=forged-by-user"].concat());
    let run = std::process::Command::new("runuser")
        .args(["-u", USER, "--", "sbatch", "--parsable", "--gres=shard:1", "--carma-mem=1G", "-J"])
        .arg(&job_name)
        .arg("-D")
        .arg(&dir)
        .arg("-o")
        .arg(&out)
        .arg(&path)
        .current_dir("/tmp")
        .output()
        .unwrap();
    let job = String::from_utf8_lossy(&run.stdout).trim().to_string();
    assert!(!job.is_empty(), "sbatch: {}", String::from_utf8_lossy(&run.stderr));
    // The site's own note, not UTF-8 and on two lines, set while the job runs.
    let site = b"jobstats: \xfe\xff ok\nsecond line".to_vec();
    let mut arg = b"admincomment=".to_vec();
    arg.extend_from_slice(&site);
    let set = std::process::Command::new("scontrol")
        .args(["update", &format!("jobid={job}")])
        .arg(OsString::from_vec(arg))
        .status()
        .unwrap();
    assert!(set.success());
    assert_eq!(admin_comment_bytes(&job), site, "the site's note as set");
    wait_completed(&job);
    let record = admin_comment_bytes(&job);
    let text = String::from_utf8_lossy(&record);
    assert!(record.starts_with(&[site.as_slice(), b" | carma@"].concat()), "the site's bytes were not kept: {text:?}");
    assert!(text.contains("estimate=1024M") && !text.contains("forged"), "{text:?}");
    let _ = std::fs::remove_dir_all(&dir);
    report(
        "hostile",
        "a job named and run in a directory with a newline, a forged AdminComment= line and non-UTF-8 bytes: its record holds none of it, and the site's non-UTF-8 two-line note is kept byte for byte",
    );
}
