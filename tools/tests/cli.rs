//! The built binaries' command lines: help and version exit 0, a usage
//! error is one line on stderr with exit 2 (carma-monitor logs it and exits
//! 1, as it does any error), and the completion scripts.

use std::process::{Command, Output};

const CARMA: &str = env!("CARGO_BIN_EXE_carma");
const MONITOR: &str = env!("CARGO_BIN_EXE_carma-monitor");
const FAKEJOB: &str = env!("CARGO_BIN_EXE_carma-fakejob");

const SUBCOMMANDS: [&str; 10] = [
    "status",
    "estimate",
    "place",
    "transparent-scopes",
    "simulate",
    "simulate-report",
    "calibrate",
    "replay-plan",
    "replay-compare",
    "completions",
];

/// Every case here ends before carma.yaml is read.
fn run(bin: &str, args: &[&str]) -> Output {
    Command::new(bin).args(args).output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn every_command_answers_help_and_version() {
    for args in [&["--help"][..], &["-h"], &["help"]] {
        let out = run(CARMA, args);
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        let help = text(&out.stdout);
        assert!(help.contains("Usage: carma <COMMAND>"), "{help}");
        assert!(SUBCOMMANDS.iter().all(|s| help.contains(&format!("  {s} "))), "{help}");
    }
    for sub in SUBCOMMANDS {
        for args in [[sub, "--help"], ["help", sub]] {
            let out = run(CARMA, &args);
            assert_eq!(out.status.code(), Some(0), "{args:?}: {}", text(&out.stderr));
            assert!(text(&out.stdout).contains(&format!("Usage: carma {sub}")), "{}", text(&out.stdout));
        }
    }
    let out = run(CARMA, &["--version"]);
    assert_eq!((out.status.code(), text(&out.stdout)), (Some(0), format!("carma {}\n", env!("CARGO_PKG_VERSION"))));
    for bin in [MONITOR, FAKEJOB] {
        for args in [["--help"], ["--version"]] {
            let out = run(bin, &args);
            assert_eq!(out.status.code(), Some(0), "{bin} {args:?}");
            assert!(!out.stdout.is_empty());
        }
    }
}

#[test]
fn a_command_without_its_arguments_shows_its_help() {
    for args in [
        &[][..],
        &["estimate"],
        &["simulate"],
        &["simulate-report"],
        &["replay-plan"],
        &["replay-compare"],
        &["completions"],
    ] {
        let out = run(CARMA, args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(text(&out.stderr).contains("Usage: carma"), "{args:?}: {}", text(&out.stderr));
    }
}

#[test]
fn a_usage_error_is_one_line_naming_the_option() {
    let cases: [(&[&str], &str); 8] = [
        (&["status", "--bogus"], "'--bogus'"),
        (&["status", "--jsn"], "'--json'"),
        (&["estimate", "--model", "m", "--batch-size", "0"], "--batch-size"),
        (&["estimate", "--json"], "--model <FILE>"),
        (&["place", "--dry-run", "--mem"], "--mem <SIZE>"),
        (&["simulate", "--trace", "t", "--workloads", "w", "--sm-cap", "-1"], "--sm-cap"),
        (&["completions", "tcsh"], "bash, zsh, fish"),
        (&["statsu"], "'status'"),
    ];
    for (args, names) in cases {
        let out = run(CARMA, args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("carma: ") && err.contains(names), "{args:?}: {err}");
    }
    let out = run(FAKEJOB, &["--mem", "1G", "--sm", "2"]);
    let err = text(&out.stderr);
    assert_eq!((out.status.code(), err.lines().count()), (Some(2), 1), "{err}");
    assert!(err.starts_with("carma-fakejob: ") && err.contains("--sm"), "{err}");
    let out = run(MONITOR, &["--bogus"]);
    let err = text(&out.stderr);
    assert_eq!((out.status.code(), err.lines().count()), (Some(1), 1), "{err}");
    assert!(err.starts_with("carma-monitor: ") && err.contains("'--bogus'"), "{err}");
}

#[test]
fn place_still_answers_only_with_dry_run() {
    let out = run(CARMA, &["place", "--mem", "4G"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(text(&out.stderr), "carma: carma place only answers with --dry-run; jobs are placed by the plugin\n");
}

#[test]
fn completion_scripts_cover_the_subcommands_and_their_options() {
    for (shell, marker) in [("bash", "complete -F _carma"), ("zsh", "#compdef carma"), ("fish", "complete -c carma")] {
        let out = run(CARMA, &["completions", shell]);
        assert_eq!(out.status.code(), Some(0), "{shell}: {}", text(&out.stderr));
        let script = text(&out.stdout);
        assert!(script.contains(marker), "{shell}");
        for word in ["transparent-scopes", "simulate-report", "batch-size", "dry-run", "least-loaded"] {
            assert!(script.contains(word), "{shell} lacks {word}");
        }
    }
}

#[test]
fn calibrate_checks_the_slowdown_model_on_a_measurements_file() {
    let data = concat!(env!("CARGO_MANIFEST_DIR"), "/../data/h100/collocation.csv");
    let out = run(CARMA, &["calibrate", data]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report = text(&out.stdout);
    assert!(report.contains("all: per-job error median"), "{report}");
    assert!(report.contains("timeslice  resnet50_64+mobilenetv3_32") && !report.contains("disagrees"), "{report}");
    // A stricter bound: the pair measured at 1.45x is refused, as predicted.
    let strict = text(&run(CARMA, &["calibrate", data, "--max-slowdown", "1.3"]).stdout);
    assert!(strict.contains("worst measured 1.45x: refuse predicted 1.50x: refuse"), "{strict}");
    let bad = run(CARMA, &["calibrate", "/nonexistent.csv"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(text(&bad.stderr).contains("/nonexistent.csv"), "{}", text(&bad.stderr));
}
