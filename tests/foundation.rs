//! The plugin loads in every Slurm context and its options behave, tested
//! against the real local cluster (tests/cluster.sh).

mod common;
use common::*;

const FLAGS: [&str; 8] = [
    "--carma-policy",
    "--carma-model",
    "--carma-batch-size",
    "--carma-mem",
    "--carma-gpus",
    "--carma-recovery",
    "--carma-seq-len",
    "--carma-precision",
];

#[test]
fn options_are_listed_by_help_of_srun_sbatch_salloc() {
    require_cluster();
    for cmd in ["srun", "sbatch", "salloc"] {
        let r = user(&[cmd, "--help"], 20);
        let text = r.stdout + &r.stderr;
        for flag in FLAGS {
            assert!(text.contains(flag), "{cmd} --help lacks {flag}");
        }
    }
}

#[test]
fn bad_option_value_fails_at_submit_and_submits_nothing() {
    require_cluster();
    for (cmd, opt, shown) in [
        ("srun", "--carma-policy=fastest", "invalid --carma-policy=fastest"),
        ("sbatch", "--carma-gpus=0", "invalid --carma-gpus=0"),
        ("salloc", "--carma-mem=lots", "invalid --carma-mem=lots"),
        ("sbatch", "--carma-batch-size=-3", "invalid --carma-batch-size=-3"),
        ("srun", "--carma-recovery=twice", "invalid --carma-recovery=twice"),
        ("sbatch", "--carma-mem=99999999999999999999G", "invalid --carma-mem=99999999999999999999G"),
        ("srun", "--carma-gpus=4294967297", "invalid --carma-gpus=4294967297"),
        ("sbatch", "--carma-precision=fp16", "invalid --carma-precision=fp16"),
        ("srun", "--carma-seq-len=4k", "invalid --carma-seq-len=4k"),
    ] {
        let name = unique("bad");
        let script = script(&name, "true");
        let mut args = vec![cmd, "-J", &name, opt];
        args.push(if cmd == "sbatch" { &script } else { "true" });
        let r = user(&args, 30);
        assert_ne!(r.code, 0, "{cmd} {opt} was accepted");
        let line = r
            .stderr
            .lines()
            .find(|l| l.contains(shown))
            .unwrap_or_else(|| panic!("{cmd} {opt}: no error line in {:?}", r.stderr));
        assert!(line.contains("carma: ") && line.contains("expected"), "{line}");
        assert!(jobs_named(&name).is_empty(), "{cmd} {opt}: a job was submitted");
        report("hostile", &format!("{cmd} {opt}: refused before submission"));
    }
}

#[test]
fn bad_environment_value_fails_at_submit_naming_the_variable() {
    require_cluster();
    let name = unique("badenv");
    let s = script(&name, "true");
    let r = user_env(&[("CARMA_MEM", "12Q")], &["sbatch", "-J", &name, &s], 30);
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("carma: init_post_opt: invalid CARMA_MEM=12Q"), "{}", r.stderr);
    assert!(jobs_named(&name).is_empty());
    let r = user_env(&[("CARMA_POLICY", "bogus")], &["srun", "-J", &name, "true"], 30);
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("invalid CARMA_POLICY=bogus"), "{}", r.stderr);
}

#[test]
fn sbatch_policy_reaches_batch_step_and_inner_srun() {
    require_cluster();
    let body = "echo \"BATCH $CARMA_DECISION|$CUDA_VISIBLE_DEVICES|$SLURM_STEP_GPUS|$GPU_DEVICE_ORDINAL\"\n\
                srun bash -c 'echo \"STEP $CARMA_DECISION|$CUDA_VISIBLE_DEVICES|$SLURM_STEP_GPUS|$GPU_DEVICE_ORDINAL\"'\n\
                srun --carma-policy=ff bash -c 'echo \"OVERRIDE $CARMA_DECISION\"'";
    let (r, out) = sbatch_wait(&["--carma-policy=magm", "--carma-mem=4G"], &[], body, 90);
    r.ok();
    for tag in ["BATCH ", "STEP "] {
        let line = out.lines().find(|l| l.starts_with(tag)).unwrap_or_else(|| panic!("no {tag} line in {out}"));
        let fields: Vec<&str> = line[tag.len()..].split('|').collect();
        assert!(fields[0].contains("policy=magm"), "{line}");
        // The node's index in SLURM_STEP_GPUS; CUDA's in CUDA_VISIBLE_DEVICES
        // and GPU_DEVICE_ORDINAL: the device cgroup shows the step only its
        // GPU, which CUDA numbers 0 (as Slurm numbers them).
        assert!(fields[0].contains(&format!("gpu_indices={} ", fields[2])), "SLURM_STEP_GPUS differs: {line}");
        assert_eq!(fields[1], "0", "CUDA_VISIBLE_DEVICES: {line}");
        assert_eq!(fields[1], fields[3], "GPU_DEVICE_ORDINAL differs: {line}");
    }
    let over = out.lines().find(|l| l.starts_with("OVERRIDE ")).expect("no OVERRIDE line");
    assert!(over.contains("policy=ff"), "{over}");
}

#[test]
fn environment_fallback_reaches_the_job() {
    require_cluster();
    let (r, out) = sbatch_wait(&[], &[("CARMA_POLICY", "bf"), ("CARMA_MEM", "3G")], "echo \"D=$CARMA_DECISION\"", 60);
    r.ok();
    assert!(out.contains("policy=bf"), "{out}");
    let r = user_env(&[("CARMA_POLICY", "lug")], &["srun", "printenv", "CARMA_DECISION"], 60).ok();
    assert!(r.stdout.contains("policy=lug"), "{}", r.stdout);
    let r = user(&["salloc", "--carma-policy=rr", "srun", "printenv", "CARMA_DECISION"], 60).ok();
    assert!(r.stdout.contains("policy=rr"), "{}", r.stdout);
}

#[test]
fn job_without_carma_options_is_untouched() {
    require_cluster();
    let r = user(&["srun", "env"], 60).ok();
    assert_eq!(r.var("CARMA_DECISION"), None);
    assert_eq!(r.var("CUDA_VISIBLE_DEVICES"), None);
    // Slurm's own GPU allocation is left exactly as Slurm made it.
    let r = user(&["srun", "--gres=gpu:2", "env"], 60).ok();
    assert_eq!(r.var("CARMA_DECISION"), None);
    assert_eq!(r.var("CUDA_VISIBLE_DEVICES").as_deref(), Some("0,1"));
    assert_eq!(r.var("SLURM_STEP_GPUS").as_deref(), Some("0,1"));
    let (r, out) = sbatch_wait(&[], &[], "echo \"X${CARMA_DECISION:-none}\"", 60);
    r.ok();
    assert!(out.contains("Xnone"), "{out}");
}
