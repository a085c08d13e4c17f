//! `llorch-cpud`: the CPU worker.
//!
//! At this stage it validates the model named by `--model` and prints its description; serving
//! arrives with the worker-http issue.

use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use worker_common::model::ModelFile;
use worker_http::CommonFlags;

/// Command line: the contract's common flags plus the CPU thread count.
#[derive(Debug, Parser)]
#[command(version, about = "llama-orch CPU inference worker")]
struct Cli {
    #[command(flatten)]
    common: CommonFlags,

    /// Worker threads (default: physical cores).
    #[arg(long, env = "LLORCH_THREADS", value_parser = clap::value_parser!(u32).range(1..))]
    threads: Option<u32>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: &Cli) -> anyhow::Result<()> {
    let model = ModelFile::open(&cli.common.model)
        .with_context(|| format!("MODEL_LOAD_FAILED: model {}", cli.common.model.display()))?;
    println!("{}", model.spec);
    Ok(())
}
