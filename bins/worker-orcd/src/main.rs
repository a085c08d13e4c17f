//! `worker-orcd`: the CUDA worker. Flags → `worker_http::run::<CudaBackend>`; nothing else.
//!
//! Without an NVIDIA driver the backend's load fails cleanly ("no CUDA driver found", exit 1).

use std::process::ExitCode;

use backend_cuda::{CudaBackend, CudaOptions};
use clap::Parser;
use worker_common::tokenizer::render_process::{BudgetAllocator, serve_if_renderer};
use worker_http::CommonFlags;

/// Chat templates render in a child process of this executable under a heap cap
/// (`worker_common::tokenizer::render_process`); the cap needs this allocator.
#[global_allocator]
static ALLOCATOR: BudgetAllocator = BudgetAllocator;

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
    serve_if_renderer();
    let cli = Cli::parse();
    let options = CudaOptions::on_device(cli.gpu_device);
    worker_http::run::<CudaBackend>(cli.common, options)
}
