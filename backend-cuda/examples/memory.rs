//! What the CUDA backend reports as its memory against what the driver shows for the process
//! (nvidia-smi), bare context first, then after load (with a KV pool of 1 GiB) and after each
//! of three jobs:
//! `cargo run --release -p backend-cuda --example memory -- <model.gguf> [device]`.
//!
//! nvidia-smi's figure includes the CUDA context, which the backend does not report; the
//! difference of the two columns should stay at the bare context's figure.

use std::process::Command;
use std::sync::Arc;

use backend_cuda::{CudaBackend, CudaOptions};
use cudarc::driver::CudaContext;
use worker_common::backend::{InferenceBackend, Load, LoadConfig, SingleSequence};
use worker_common::model::ModelFile;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or("usage: memory <model.gguf> [device]")?;
    let device: u32 = args.next().map(|d| d.parse()).transpose()?.unwrap_or(0);
    // The primary context, which the backend then shares: nvidia-smi's figure for it alone.
    let ctx = CudaContext::new(device as usize)?;
    println!("bare context: nvidia-smi {} MiB", process_mib()?);
    let model = Arc::new(ModelFile::open(&path)?);
    let config = LoadConfig {
        context_length: 2048,
        kv_cache_bytes: Some(1 << 30),
        parallel: None,
    };
    let mut backend = CudaBackend::load(
        model.clone(),
        &CudaOptions::on_device(device),
        &config,
        &mut |_| {},
    )?;
    report("loaded", &backend)?;
    let vocab = model.spec.hparams.vocab_size as u32;
    let prompt: Vec<u32> = (0..512u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 8) % vocab)
        .collect();
    for (job, prompt_len) in [(1, 32), (2, 512), (3, 32)] {
        let mut sequence = SingleSequence::begin(&mut backend, 2048)?;
        sequence.forward(&prompt[..prompt_len], 0)?;
        for pos in prompt_len..prompt_len + 16 {
            sequence.forward(&[1], pos)?;
        }
        report(&format!("job {job} ({prompt_len}-token prompt)"), &backend)?;
    }
    drop(backend);
    drop(ctx);
    Ok(())
}

fn report(stage: &str, backend: &CudaBackend) -> Result<(), Box<dyn std::error::Error>> {
    let memory = backend.info().memory;
    println!(
        "{stage}: memory_bytes {} MiB (weights {}, kv {}, scratch {}) | nvidia-smi {} MiB",
        memory.total() >> 20,
        memory.weights >> 20,
        memory.kv >> 20,
        memory.scratch >> 20,
        process_mib()?
    );
    Ok(())
}

/// nvidia-smi's used memory of this process in MiB (of the only compute process where the
/// process ids seen inside a container differ from the driver's).
fn process_mib() -> Result<u64, Box<dyn std::error::Error>> {
    let output = Command::new("nvidia-smi")
        .args([
            "--query-compute-apps=pid,used_memory",
            "--format=csv,noheader,nounits",
        ])
        .output()?;
    let text = String::from_utf8(output.stdout)?;
    let rows: Vec<(u32, u64)> = text
        .lines()
        .filter_map(|line| {
            let (pid, mib) = line.split_once(',')?;
            Some((pid.trim().parse().ok()?, mib.trim().parse().ok()?))
        })
        .collect();
    let own = rows.iter().find(|(pid, _)| *pid == std::process::id());
    match (own, rows.as_slice()) {
        (Some(&(_, mib)), _) | (None, &[(_, mib)]) => Ok(mib),
        _ => Err(format!("no nvidia-smi row for this process in {text:?}").into()),
    }
}
