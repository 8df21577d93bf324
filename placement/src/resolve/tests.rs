//! The resolution without a cluster: each rule the plugin used to apply
//! inline, on plain facts.

use super::*;
use carma_config::OptionName;

fn config(yaml: &str) -> Config {
    Config::parse(yaml, Path::new("carma.yaml")).unwrap()
}

fn facts(options: &[(OptionName, &str)]) -> StepFacts {
    let mut request = JobRequest::default();
    for (o, v) in options {
        request.set(*o, v.as_bytes(), "test").unwrap();
    }
    StepFacts { job: 7, uid: 1000, request, ..Default::default() }
}

/// A job the prolog saw holding a Slurm GPU (or shard) here.
fn held() -> NodeFacts {
    NodeFacts { slurm_gpus: vec![0, 1, 2, 3], ..NodeFacts::default() }
}

fn plan(r: Resolution) -> Plan {
    match r {
        Resolution::Place(p) => *p,
        other => panic!("not placed: {other:?}"),
    }
}

#[test]
fn a_step_without_options_or_shards_is_not_carmas() {
    let cfg = config("");
    let f = facts(&[]);
    assert_eq!(resolve(&f, &held(), &cfg).unwrap(), Resolution::Nothing);
    assert!(!is_carma(&f, &cfg));
}

#[test]
fn shards_outside_every_scope_only_drop_the_whole_gpu_record() {
    let cfg = config("transparent:\n  - {partition: shared}\n");
    let f = StepFacts { shards_on_node: Some(2), partition: Some("other".into()), ..facts(&[]) };
    assert_eq!(resolve(&f, &held(), &cfg).unwrap(), Resolution::DropWhole);
    assert!(!is_carma(&f, &cfg));
}

#[test]
fn declared_memory_wins_over_a_model_estimate() {
    let cfg = config("");
    let f = StepFacts {
        estimate: Some("9000M:layers:0000000000000abc:700M".into()),
        ..facts(&[(OptionName::Mem, "8G"), (OptionName::Policy, "bf")])
    };
    let p = plan(resolve(&f, &held(), &cfg).unwrap());
    assert_eq!((p.request.estimate_mib, p.request.estimate_source.as_str()), (Some(8192), "declared"));
    assert_eq!((p.request.policy, p.request.signature.clone(), p.request.runtime_mib), (Policy::BestFit, None, None));
    assert!(!p.request.shares, "whole Slurm GPUs, no shards: they stay the job's");
}

#[test]
fn a_model_estimate_carries_its_source_signature_per_user_and_fixed_part() {
    let cfg = config("");
    let f = StepFacts {
        estimate: Some("9000M:layers:0000000000000abc:700M".into()),
        ..facts(&[(OptionName::BatchSize, "32")])
    };
    let p = plan(resolve(&f, &held(), &cfg).unwrap());
    assert_eq!(p.request.estimate_mib, Some(9000));
    assert_eq!(p.request.estimate_source, "layers");
    assert_eq!(p.request.signature.as_deref(), Some("1000:0000000000000abc"));
    assert_eq!(p.request.runtime_mib, Some(700));
    assert_eq!(p.request.policy, cfg.default_policy);
}

#[test]
fn a_corrupt_estimate_names_the_variable() {
    let f = StepFacts { estimate: Some("lots".into()), ..facts(&[(OptionName::BatchSize, "32")]) };
    let e = resolve(&f, &held(), &config("")).unwrap_err();
    assert!(e.starts_with("CARMA_ESTIMATE: "), "{e}");
}

#[test]
fn a_model_without_an_estimate_is_unknown_with_a_note() {
    let f = facts(&[(OptionName::Model, "/x/net.onnx")]);
    let p = plan(resolve(&f, &held(), &config("")).unwrap());
    assert_eq!((p.request.estimate_mib, p.request.estimate_source.as_str()), (None, "unknown"));
    assert_eq!(p.notes.len(), 1);
    let p = plan(resolve(&f, &held(), &config("unknown_estimate: 6G\n")).unwrap());
    assert_eq!((p.request.estimate_mib, p.request.estimate_source.as_str()), (Some(6144), "default"));
}

#[test]
fn recovery_reruns_exclusive_or_looser_by_the_marker() {
    let cfg = config("recovery:\n  mode: looser\n  looser_margin: 1G\n");
    let f = facts(&[(OptionName::Mem, "4G"), (OptionName::Policy, "magm")]);
    let marker = |mode, need_mib| NodeFacts {
        recovery: Some(jobfiles::Recovery { mode, need_mib, count: 1 }),
        slurm_gpus: vec![0],
    };
    let p = plan(resolve(&f, &marker(RecoveryMode::Looser, Some(9000)), &cfg).unwrap());
    assert_eq!((p.request.estimate_mib, p.request.estimate_source.as_str()), (Some(9000 + 1024), "recovery"));
    assert_eq!(p.request.policy, Policy::Magm);
    // Looser without a recorded need: a GPU of its own.
    let p = plan(resolve(&f, &marker(RecoveryMode::Looser, None), &cfg).unwrap());
    assert_eq!(p.request.policy, Policy::Exclusive);
    // recovery: none keeps the request as it was.
    let p = plan(resolve(&f, &marker(RecoveryMode::None, None), &cfg).unwrap());
    assert_eq!((p.request.policy, p.request.estimate_mib), (Policy::Magm, Some(4096)));
    // An absurd recorded need (u64::MAX from an "inf" in an older epilog's
    // marker) does not wrap around to a tiny estimate.
    let p = plan(resolve(&f, &marker(RecoveryMode::Looser, Some(u64::MAX - 10)), &cfg).unwrap());
    assert_eq!(p.request.estimate_mib, Some(u64::MAX));
}

#[test]
fn a_transparent_step_takes_its_scope_and_history_first() {
    let cfg = config("transparent:\n  - {partition: shared, policy: bf, default_mem: 10G}\n");
    let f = StepFacts {
        shards_on_node: Some(2),
        partition: Some("shared".into()),
        job_signature: Some("job:00ff".into()),
        ..facts(&[])
    };
    assert!(is_carma(&f, &cfg));
    let p = plan(resolve(&f, &held(), &cfg).unwrap());
    assert_eq!((p.request.policy, p.request.count), (Policy::BestFit, 2));
    assert_eq!((p.request.estimate_mib, p.request.estimate_source.as_str()), (Some(10240), "scope_default"));
    assert!(p.request.history_first);
    assert_eq!(p.request.signature.as_deref(), Some("1000:job:00ff"));
    let mark = p.transparent.clone().unwrap();
    assert_eq!((mark.scope.as_str(), mark.signature.as_deref()), ("partition:shared", Some("1000:job:00ff")));
    // A recovering rerun keeps what recovery decided: history does not come first.
    let rerun = NodeFacts {
        recovery: Some(jobfiles::Recovery { mode: RecoveryMode::Exclusive, need_mib: None, count: 1 }),
        slurm_gpus: vec![0, 1],
    };
    let p = plan(resolve(&f, &rerun, &cfg).unwrap());
    assert!(!p.request.history_first);
    assert_eq!(p.request.policy, Policy::Exclusive);
}

#[test]
fn mps_serves_one_user_on_one_shared_gpu() {
    let cfg = config("sharing: mps\n");
    let one = facts(&[(OptionName::Mem, "4G")]);
    assert_eq!(plan(resolve(&one, &held(), &cfg).unwrap()).request.mps_uid, Some(1000));
    let two = facts(&[(OptionName::Mem, "4G"), (OptionName::Gpus, "2")]);
    assert_eq!(plan(resolve(&two, &held(), &cfg).unwrap()).request.mps_uid, None);
    let excl = facts(&[(OptionName::Mem, "4G"), (OptionName::Policy, "exclusive")]);
    assert_eq!(plan(resolve(&excl, &held(), &cfg).unwrap()).request.mps_uid, None);
    assert_eq!(plan(resolve(&one, &held(), &config("")).unwrap()).request.mps_uid, None);
}

#[test]
fn slurm_gpus_without_shards_are_not_shared() {
    let f = facts(&[(OptionName::Mem, "4G")]);
    assert!(!plan(resolve(&f, &held(), &config("")).unwrap()).request.shares);
}

#[test]
fn a_step_is_placed_among_the_gpus_slurm_gave_its_job() {
    let f = facts(&[(OptionName::Mem, "4G"), (OptionName::Policy, "magm")]);
    let node = NodeFacts { slurm_gpus: vec![2, 3], ..NodeFacts::default() };
    assert_eq!(plan(resolve(&f, &node, &config("")).unwrap()).request.within, Some(vec![2, 3]));
    // Where carma.yaml hands the node's GPUs to CARMA: any of them.
    assert_eq!(plan(resolve(&f, &node, &config("gpu_owner: carma\n")).unwrap()).request.within, None);
    // More GPUs than Slurm allocated: refused at once, saying what to ask.
    let three = facts(&[(OptionName::Mem, "4G"), (OptionName::Gpus, "3")]);
    let e = resolve(&three, &node, &config("")).unwrap_err();
    assert!(e.contains("asks for 3 GPUs but Slurm charged the job 2") && e.contains("--gres=gpu:3"), "{e}");
}

/// Issue 58: under gpu_owner: carma, `--gres=shard:1 --carma-gpus=8
/// --carma-policy=exclusive` was granted 8 whole GPUs while Slurm charged
/// one shard and counted 7 GPUs free. A step uses at most the GPUs Slurm
/// charged its job here, whoever picks them; set by option or by
/// `CARMA_GPUS` in the step's environment alike (the request is merged).
#[test]
fn a_step_never_uses_more_gpus_than_slurm_charged_its_job_whoever_owns_them() {
    for owner in ["gpu_owner: carma\n", "gpu_owner: slurm\n"] {
        let cfg = config(owner);
        let one_shard = NodeFacts { slurm_gpus: vec![1], ..NodeFacts::default() };
        let eight = StepFacts {
            shards_on_node: Some(1),
            ..facts(&[(OptionName::Gpus, "8"), (OptionName::Policy, "exclusive")])
        };
        let e = resolve(&eight, &one_shard, &cfg).unwrap_err();
        assert!(
            e.starts_with("--carma-gpus=8:")
                && e.contains("Slurm charged the job 1")
                && e.contains("shard")
                && e.contains("--gres=gpu:8"),
            "{owner}: {e}"
        );
        // Four shards from one GPU (Slurm takes a job's shards from the
        // first GPU with room) are still one GPU in Slurm's books.
        let four = StepFacts { shards_on_node: Some(4), ..facts(&[(OptionName::Gpus, "4"), (OptionName::Mem, "1G")]) };
        assert!(resolve(&four, &one_shard, &cfg).is_err(), "{owner}");
        // Spread over four GPUs (LL_SHARED_GRES), or four whole GPUs: four.
        let spread = NodeFacts { slurm_gpus: vec![0, 1, 2, 3], ..NodeFacts::default() };
        assert_eq!(plan(resolve(&four, &spread, &cfg).unwrap()).request.count, 4, "{owner}");
        let whole = StepFacts { shards_on_node: None, ..four.clone() };
        assert_eq!(plan(resolve(&whole, &spread, &cfg).unwrap()).request.count, 4, "{owner}");
        // One whole GPU buys one: --gres=gpu:1 --carma-gpus=2 is refused too.
        let two = facts(&[(OptionName::Gpus, "2"), (OptionName::Mem, "1G")]);
        let e = resolve(&two, &one_shard, &cfg).unwrap_err();
        assert!(e.contains("holds 1 GPU") && e.contains("--gres=gpu:2"), "{owner}: {e}");
        // One shard, exclusive: one GPU's worth, as before.
        let one = StepFacts { shards_on_node: Some(1), ..facts(&[(OptionName::Policy, "exclusive")]) };
        assert_eq!(plan(resolve(&one, &one_shard, &cfg).unwrap()).request.count, 1, "{owner}");
        // A transparent shard job's count is its shards: bounded alike.
        let scoped = config(&format!("{owner}transparent:\n  - {{partition: shared}}\n"));
        let t = StepFacts { shards_on_node: Some(4), partition: Some("shared".into()), ..facts(&[]) };
        assert!(resolve(&t, &one_shard, &scoped).is_err(), "{owner}");
    }
}

#[test]
fn the_summary_says_what_decided_the_estimate_in_the_end() {
    let f = StepFacts {
        estimate: Some("9000M:layers:0000000000000abc:700M".into()),
        ..facts(&[(OptionName::BatchSize, "32")])
    };
    let p = plan(resolve(&f, &held(), &config("")).unwrap());
    let mut d = Decision {
        gpus: vec![1],
        exclusive: false,
        reserve_mib: 9000,
        reused: true,
        history_mib: None,
        free_mib: vec![],
        metric: carma_config::ActivityMetric::Sm,
        activity: vec![],
        slowdown: vec![],
        learned_runtime_mib: None,
        learned_from: None,
    };
    let s = p.summary(&d, "");
    assert!(s.starts_with(&format!("policy={} estimate=9000M source=layers gpu_count=1", p.request.policy)), "{s}");
    d.learned_runtime_mib = Some(1700);
    assert!(p.summary(&d, "").contains("estimate=10000M source=layers runtime=learned:1700M"));
    d.history_mib = Some(12000);
    d.learned_runtime_mib = None;
    assert!(p.summary(&d, " sharing=mps").contains("estimate=12000M source=history"));
    assert!(p.summary(&d, " sharing=mps").ends_with(" sharing=mps"));
    assert!(p.failure(&"no GPU fits").contains("estimate 9000M (layers): no GPU fits"));
}

#[test]
fn a_carma_step_without_a_slurm_gpu_is_refused() {
    let cfg = config("transparent:\n  - {partition: shared}\n");
    let f = facts(&[(OptionName::Mem, "6G")]);
    // The step's environment may claim GPUs or shards; only the prolog's
    // record, which users cannot write, says whether Slurm accounts one.
    let claimed = StepFacts { shards_on_node: Some(1), ..f.clone() };
    for f in [f, claimed] {
        let err = resolve(&f, &NodeFacts::default(), &cfg).unwrap_err();
        assert!(err.contains("--gres=shard:1") && err.contains("--gres=gpu:N"), "{err}");
    }
    // A plain step (no options, no shards) is not refused: it is not CARMA's.
    assert_eq!(resolve(&facts(&[]), &NodeFacts::default(), &cfg).unwrap(), Resolution::Nothing);
}

/// `no_fit` decides the wait; only a batch step is handed back (a job
/// can be requeued; a step inside it cannot).
#[test]
fn no_fit_sets_the_wait_and_only_a_batch_step_is_handed_back() {
    let f = facts(&[(OptionName::Mem, "8G")]);
    let batch = StepFacts { batch_step: true, ..f.clone() };
    let wait = config("timeouts: {wait: 7s}\n");
    let p = plan(resolve(&batch, &held(), &wait).unwrap());
    assert_eq!((p.wait, p.hand_back), (Duration::from_secs(7), false));
    let fail = config("no_fit: fail\n");
    assert_eq!(plan(resolve(&batch, &held(), &fail).unwrap()).wait, Duration::ZERO);
    let back = config("no_fit: hand_back\ntimeouts: {wait: 7s}\n");
    let p = plan(resolve(&batch, &held(), &back).unwrap());
    assert_eq!((p.wait, p.hand_back), (Duration::from_secs(7), true));
    let p = plan(resolve(&f, &held(), &back).unwrap());
    assert_eq!((p.wait, p.hand_back), (Duration::from_secs(7), false), "a step of srun: it fails after its wait");
}
