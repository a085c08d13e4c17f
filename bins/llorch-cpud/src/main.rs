//! `llorch-cpud`: the CPU worker. Flags → `worker_http::run::<CpuBackend>`; nothing else.

use std::process::ExitCode;

use backend_cpu::{CpuBackend, CpuOptions, physical_cores};
use clap::Parser;
use worker_common::tokenizer::render_process::{BudgetAllocator, serve_if_renderer};
use worker_http::CommonFlags;

/// Chat templates render in a child process of this executable under a heap cap
/// (`worker_common::tokenizer::render_process`); the cap needs this allocator.
#[global_allocator]
static ALLOCATOR: BudgetAllocator = BudgetAllocator;

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
    serve_if_renderer();
    let cli = Cli::parse();
    let threads = cli.threads.map_or_else(physical_cores, |n| n as usize);
    worker_http::run::<CpuBackend>(cli.common, CpuOptions { threads })
}
