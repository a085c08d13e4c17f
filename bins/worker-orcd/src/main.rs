//! `worker-orcd`: the CUDA worker.
//!
//! At this stage it checks for the CUDA driver, validates the model named by `--model` and prints
//! its description; serving arrives with the CUDA and worker-http issues.

use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use worker_common::model::ModelFile;
use worker_http::CommonFlags;

/// Command line: the contract's common flags plus the GPU index.
#[derive(Debug, Parser)]
#[command(version, about = "llama-orch CUDA inference worker")]
struct Cli {
    #[command(flatten)]
    common: CommonFlags,

    /// GPU to run on.
    #[arg(long, alias = "gpu", env = "LLORCH_GPU_DEVICE", default_value_t = 0)]
    gpu_device: u32,
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
    backend_cuda::check_driver()
        .with_context(|| format!("MODEL_LOAD_FAILED: GPU {}", cli.gpu_device))?;
    let model = ModelFile::open(&cli.common.model)
        .with_context(|| format!("MODEL_LOAD_FAILED: model {}", cli.common.model.display()))?;
    println!("{}", model.spec);
    Ok(())
}
