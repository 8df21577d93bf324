//! Command lines of the tools (clap): `carma`'s subcommands and options, and
//! the one-line usage error every binary in tools/ prints.

use crate::simulate::{ReportArgs, SimulateArgs};
use carma_config::Config;
use clap::error::ErrorKind;
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::ffi::OsString;
use std::path::PathBuf;

/// CARMA's admin command: the node's GPUs and reservations, memory
/// estimates, where a job would be placed, the scopes job_submit.lua reads,
/// and the cluster simulator.
#[derive(Parser, Debug)]
#[command(name = "carma", version, arg_required_else_help = true, help_expected = true, args_override_self = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// GPUs, memory, SM activity, busy time, reservations and the monitor's state
    Status(StatusArgs),
    /// The GPU memory estimate for a model file (as srun/sbatch make it), and why
    #[command(arg_required_else_help = true)]
    Estimate(EstimateArgs),
    /// Where a job would go now, and why not elsewhere; nothing is reserved
    Place(PlaceArgs),
    /// The scopes job_submit.lua rewrites and admits by memory, one line each
    TransparentScopes(ScopesArgs),
    /// Replay a job trace under CARMA's policies
    #[command(arg_required_else_help = true)]
    Simulate(Box<SimulateArgs>),
    /// Write the simulation report (docs/simulation.md) from the repository's data/
    #[command(arg_required_else_help = true)]
    SimulateReport(ReportArgs),
    /// Check the slowdown model on measured sets (collocation.csv's format), job by job
    #[command(arg_required_else_help = true)]
    Calibrate(crate::calibrate::CalibrateArgs),
    /// Make a job trace into a test cluster's submissions (tests/scale.sh replay)
    #[command(arg_required_else_help = true)]
    ReplayPlan(crate::replay::PlanArgs),
    /// Hold what a test cluster did with a replayed trace against the simulator
    #[command(arg_required_else_help = true)]
    ReplayCompare(crate::replay::CompareArgs),
    /// Print a shell completion script for carma
    #[command(arg_required_else_help = true)]
    Completions(CompletionsArgs),
}

/// `--config FILE`, shared by the commands that read carma.yaml.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct ConfigArg {
    /// carma.yaml to read
    #[arg(long = "config", value_name = "FILE", default_value = carma_config::DEFAULT_CONFIG_PATH)]
    pub path: PathBuf,
}

impl ConfigArg {
    /// Loads carma.yaml; the tool's log lines then also go to its `log_file`.
    pub fn load(&self) -> Result<Config, String> {
        let cfg = Config::load(&self.path).map_err(|e| e.to_string())?;
        crate::cli_log::set_file(cfg.log_file.clone());
        Ok(cfg)
    }
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Print JSON instead of lines and a table
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub config: ConfigArg,
}

#[derive(Args, Debug)]
pub struct EstimateArgs {
    /// The model: ONNX, a torchsummary table, a module listing or a Hugging Face config.json
    #[arg(long, value_name = "FILE")]
    pub model: String,
    /// Batch size, 1 to 1048576 (as --carma-batch-size; needed unless the file gives one)
    #[arg(long, allow_negative_numbers = true, value_name = "N", value_parser = batch_size)]
    pub batch_size: Option<u64>,
    /// Sequence length of a transformer (as --carma-seq-len)
    #[arg(long, value_name = "N")]
    pub seq_len: Option<String>,
    /// Training precision (as --carma-precision)
    #[arg(long, value_name = "fp32|mixed|bf16")]
    pub precision: Option<String>,
    /// Print JSON instead of lines
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub config: ConfigArg,
}

#[derive(Args, Debug)]
pub struct PlaceArgs {
    /// Required: only answer what the plugin would decide (jobs are placed by the plugin)
    #[arg(long)]
    pub dry_run: bool,
    /// Memory per GPU (as --carma-mem), e.g. 12G
    #[arg(long, value_name = "SIZE")]
    pub mem: Option<String>,
    /// Placement policy (as --carma-policy): exclusive, rr, magm, ff, bf, ...
    #[arg(long, value_name = "POLICY")]
    pub policy: Option<String>,
    /// Number of GPUs (as --carma-gpus)
    #[arg(long, value_name = "N")]
    pub gpus: Option<String>,
    /// The job's busy share alone, 0-1, with --sm: its profile, as the guard learns it (default: not yet profiled, as a first run)
    #[arg(long, value_name = "X", requires = "sm")]
    pub busy: Option<f64>,
    /// The job's SM activity alone, 0-1, with --busy
    #[arg(long, value_name = "X", requires = "busy")]
    pub sm: Option<f64>,
    #[command(flatten)]
    pub config: ConfigArg,
}

#[derive(Args, Debug)]
pub struct ScopesArgs {
    /// Write the list atomically to FILE (the file slurmctld's Lua reads, /etc/slurm/carma-scopes) instead of stdout
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    #[command(flatten)]
    pub config: ConfigArg,
}

#[derive(Args, Debug)]
pub struct CompletionsArgs {
    /// The shell to complete for
    pub shell: Shell,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq)]
pub enum Shell {
    Bash,
    Zsh,
    Fish,
}

impl From<Shell> for clap_complete::Shell {
    fn from(s: Shell) -> Self {
        match s {
            Shell::Bash => clap_complete::Shell::Bash,
            Shell::Zsh => clap_complete::Shell::Zsh,
            Shell::Fish => clap_complete::Shell::Fish,
        }
    }
}

fn batch_size(v: &str) -> Result<u64, String> {
    v.parse::<u64>()
        .ok()
        .filter(|b| (1..=1 << 20).contains(b))
        .ok_or_else(|| "not a whole number from 1 to 1048576".to_string())
}

/// Parses this process's command line with [`parse_from`].
pub fn parse<P: Parser>() -> Result<P, String> {
    parse_from(std::env::args_os())
}

/// `--help` and `--version` print and exit 0; a command given without the
/// arguments it needs prints its help and exits 2. A usage error comes back
/// as one line, for the binary to report as it reports its other errors.
pub fn parse_from<P, I, T>(argv: I) -> Result<P, String>
where
    P: Parser,
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    P::try_parse_from(argv).map_err(|e| match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            e.exit()
        }
        _ => one_line(&e),
    })
}

/// clap's error in one line: what is wrong, clap's suggestion if any, and
/// which `--help` tells more (clap's own spreads these over several lines).
pub fn one_line(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let mut parts: Vec<String> = Vec::new();
    let mut help = None;
    for raw in text.lines().filter(|l| !l.trim().is_empty()) {
        let line = raw.trim();
        if let Some(usage) = line.strip_prefix("Usage: ") {
            // The command's path: the words before its first argument.
            let path: Vec<&str> = usage.split_whitespace().take_while(|w| !w.starts_with(['[', '<', '-'])).collect();
            help.get_or_insert_with(|| format!("see '{} --help'", path.join(" ")));
        } else if line.starts_with("For more information") || line.contains("as a value, use '--") {
            // Pointers `see ... --help` replaces, and a tip for arguments we have no use for.
        } else if let (true, Some(last)) = (raw.starts_with("  ") && !line.starts_with("tip:"), parts.last_mut()) {
            // An item of the list the line before announces (missing arguments, possible values).
            last.push(' ');
            last.push_str(line);
        } else {
            let line = line.strip_prefix("error: ").unwrap_or(line);
            parts.push(line.strip_prefix("tip: ").unwrap_or(line).to_string());
        }
    }
    parts.extend(help);
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(argv: &[&str]) -> Result<Command, String> {
        let argv = std::iter::once("carma").chain(argv.iter().copied());
        Cli::try_parse_from(argv).map(|c| c.command).map_err(|e| one_line(&e))
    }

    fn config(path: &str) -> ConfigArg {
        ConfigArg { path: PathBuf::from(path) }
    }

    #[test]
    fn the_command_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn status_and_scopes_take_their_options_in_either_form() {
        let Ok(Command::Status(a)) = parse(&["status"]) else { panic!() };
        assert!(!a.json);
        assert_eq!(a.config, config(carma_config::DEFAULT_CONFIG_PATH));
        for argv in [&["status", "--json", "--config", "/x.yaml"][..], &["status", "--config=/x.yaml", "--json"]] {
            let Ok(Command::Status(a)) = parse(argv) else { panic!("{argv:?}") };
            assert!(a.json);
            assert_eq!(a.config, config("/x.yaml"));
        }
        // The last of a repeated option counts.
        let Ok(Command::Status(a)) = parse(&["status", "--config", "/a", "--config", "/b"]) else { panic!() };
        assert_eq!(a.config, config("/b"));
        let Ok(Command::TransparentScopes(a)) = parse(&["transparent-scopes", "--output", "/etc/slurm/carma-scopes"])
        else {
            panic!()
        };
        assert_eq!(a.output, Some(PathBuf::from("/etc/slurm/carma-scopes")));
        assert_eq!(a.config, config(carma_config::DEFAULT_CONFIG_PATH));
    }

    #[test]
    fn estimate_parses_as_before() {
        let argv = ["estimate", "--model", "m.onnx", "--batch-size=64", "--seq-len", "2048", "--precision", "bf16"];
        let Ok(Command::Estimate(a)) = parse(&argv) else { panic!() };
        assert_eq!((a.model.as_str(), a.batch_size), ("m.onnx", Some(64)));
        assert_eq!((a.seq_len.as_deref(), a.precision.as_deref(), a.json), (Some("2048"), Some("bf16"), false));
        let Ok(Command::Estimate(a)) = parse(&["estimate", "--json", "--model", "m"]) else { panic!() };
        assert_eq!((a.batch_size, a.seq_len, a.precision, a.json), (None, None, None, true));
        assert!(parse(&["estimate", "--model", "m", "--batch-size", "1048576"]).is_ok());
        for bad in ["0", "1048577", "x", "-1"] {
            let e = parse(&["estimate", "--model", "m", "--batch-size", bad]).unwrap_err();
            assert!(e.contains("--batch-size") && e.contains("from 1 to 1048576"), "{e}");
        }
        let e = parse(&["estimate", "--json"]).unwrap_err();
        assert!(e.contains("--model <FILE>") && e.ends_with("see 'carma estimate --help'"), "{e}");
    }

    #[test]
    fn place_leaves_the_values_to_the_job_options_checks() {
        let argv = ["place", "--dry-run", "--mem", "12G", "--policy", "ff", "--gpus", "2", "--config", "/c"];
        let Ok(Command::Place(a)) = parse(&argv) else { panic!() };
        assert!(a.dry_run);
        assert_eq!((a.mem.as_deref(), a.policy.as_deref(), a.gpus.as_deref()), (Some("12G"), Some("ff"), Some("2")));
        assert_eq!(a.config, config("/c"));
        // Without --dry-run it parses; the command then says why it answers only that.
        let Ok(Command::Place(a)) = parse(&["place", "--mem=1G"]) else { panic!() };
        assert!(!a.dry_run && a.gpus.is_none());
    }

    #[test]
    fn usage_errors_are_one_line_naming_the_option() {
        let e = parse(&["status", "--bogus"]).unwrap_err();
        assert_eq!(e, "unexpected argument '--bogus' found; see 'carma status --help'");
        let e = parse(&["status", "--jsn"]).unwrap_err();
        assert!(e.contains("'--jsn'") && e.contains("'--json'"), "{e}");
        let e = parse(&["place", "--mem"]).unwrap_err();
        assert!(e.contains("'--mem <SIZE>'") && e.contains("a value is required"), "{e}");
        let e = parse(&["status", "--json=yes"]).unwrap_err();
        assert!(e.contains("--json"), "{e}");
        let e = parse(&["completions", "ksh"]).unwrap_err();
        assert!(e.contains("'ksh'") && e.contains("bash, zsh, fish"), "{e}");
        let e = parse(&["stat"]).unwrap_err();
        assert!(e.contains("'stat'") && e.contains("'status'"), "{e}");
        for e in [e, parse(&["simulate", "--trace"]).unwrap_err(), parse(&["simulate", "--trace", "t"]).unwrap_err()] {
            assert!(!e.contains('\n') && !e.contains("error:") && !e.is_empty(), "{e}");
        }
    }

    #[test]
    fn completions_are_offered_for_three_shells() {
        for (name, shell) in [("bash", Shell::Bash), ("zsh", Shell::Zsh), ("fish", Shell::Fish)] {
            let Ok(Command::Completions(a)) = parse(&["completions", name]) else { panic!() };
            assert_eq!(a.shell, shell);
        }
    }
}
