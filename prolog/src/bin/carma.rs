//! carma: CARMA's admin command.
//!
//!   carma status [--json] [--config FILE]   GPUs, memory, SM activity, reservations
//!   carma simulate ...                       replay a job trace under CARMA's policies

use carma_config::Config;
use carma_placement::Placer;
use carma_tools::args::Args;
use carma_tools::status;
use std::path::Path;

const USAGE: &str = "usage: carma status [--json] [--config FILE]";

fn usage() -> String {
    format!("{USAGE}\n       {}", carma_tools::simulate::USAGE.replace('\n', "\n       "))
}

fn main() {
    let mut argv = std::env::args().skip(1);
    let cmd = argv.next().unwrap_or_default();
    let result = match cmd.as_str() {
        "status" => cmd_status(argv.collect()),
        "simulate" => carma_tools::simulate::cmd_simulate(argv.collect()),
        "simulate-report" => carma_tools::simulate::cmd_report(argv.collect()),
        "-h" | "--help" | "help" => {
            println!("{}", usage());
            Ok(())
        }
        other => Err(format!("unknown command '{other}'\n{}", usage())),
    };
    if let Err(e) = result {
        eprintln!("carma: {e}");
        std::process::exit(2);
    }
}

fn config(a: &Args) -> Result<Config, String> {
    Config::load(Path::new(a.get("config").unwrap_or(carma_config::DEFAULT_CONFIG_PATH))).map_err(|e| e.to_string())
}

fn cmd_status(argv: Vec<String>) -> Result<(), String> {
    let a = Args::parse(argv, &["config"], &["json"])?;
    let cfg = config(&a)?;
    let mut placer = Placer::from_config(&cfg, |m| eprintln!("carma: {m}")).map_err(|e| e.to_string())?;
    let (gpus, state) = placer.status().map_err(|e| e.to_string())?;
    if a.has("json") {
        println!("{}", serde_json::to_string_pretty(&status::to_json(&gpus, &state)).unwrap_or_default());
    } else {
        print!("{}", status::table(&gpus, &state));
    }
    Ok(())
}
