//! A loaded CPU worker uses the weights in place and its KV page pool costs only the pages
//! written: after loading SmolLM2 (with the default pool of four contexts) and generating, the
//! process's resident memory grew by at most the file size + the request's KV + 64 MiB.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use backend_cpu::{CpuBackend, CpuOptions};
use llorch_tests::assets::Model;
use worker_common::backend::{InferenceBackend, Load, LoadConfig};
use worker_common::generate::{
    CancelToken, GenerateRequest, PromptFormatter, TemplateRendering, generate,
};
use worker_common::model::ModelFile;
use worker_common::sampling::SamplingParams;
use worker_common::tokenizer::Tokenizer;

/// `VmRSS` of this process, in bytes.
fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

#[test]
fn smollm2_resident_memory_is_file_plus_kv_plus_64_mib() {
    let path = Model::SmolLm2.path();
    let file_bytes = std::fs::metadata(&path).unwrap().len();
    let before = resident_bytes();
    let model = Arc::new(ModelFile::open(&path).unwrap());
    let tokenizer = Tokenizer::from_gguf(&model.gguf).unwrap();
    let config = LoadConfig {
        context_length: model.spec.hparams.context_length,
        kv_cache_bytes: None,
        parallel: None,
    };
    let options = CpuOptions { threads: 2 };
    let mut backend = CpuBackend::load(model.clone(), &options, &config, &mut |_| {}).unwrap();
    let formatter =
        PromptFormatter::from_model(&model.gguf, &tokenizer, TemplateRendering::InProcess).unwrap();
    let prompt = formatter
        .tokenize(&tokenizer, "Tell me about the sea.", false)
        .unwrap();
    let request = GenerateRequest {
        prompt_tokens: prompt,
        max_tokens: 64,
        sampling: SamplingParams::default(),
        stop: Vec::new(),
        deadline: None,
        ignore_eos: false,
        grammar: None,
        speculative: true,
    };
    // The KV this request writes: prompt + max_tokens positions, f16 K and V.
    let hp = &model.spec.hparams;
    let kv_bytes = ((request.prompt_tokens.len() + request.max_tokens)
        * hp.n_layers
        * (hp.k_width() + hp.v_width())
        * 2) as u64;
    let mut peak = 0;
    let mut sink = |_| {
        peak = peak.max(resident_bytes());
        true
    };
    generate(
        &mut backend,
        &tokenizer,
        2048,
        &request,
        &CancelToken::new(),
        &mut sink,
    )
    .unwrap();
    let after = resident_bytes().max(peak);
    let grown = after.saturating_sub(before);
    let limit = file_bytes + kv_bytes + (64 << 20);
    let info = backend.info();
    println!(
        "resident grew by {:.1} MiB (file {:.1} MiB, KV {:.1} MiB, limit {:.1} MiB); info: weights {:.1} MiB, KV pool {:.1} MiB, scratch {:.1} MiB",
        grown as f64 / 1048576.0,
        file_bytes as f64 / 1048576.0,
        kv_bytes as f64 / 1048576.0,
        limit as f64 / 1048576.0,
        info.memory.weights as f64 / 1048576.0,
        info.memory.kv as f64 / 1048576.0,
        info.memory.scratch as f64 / 1048576.0,
    );
    assert!(
        info.memory.kv > 4 * (64 << 20),
        "the default pool should be large enough for the test to show that it is not resident"
    );
    assert!(
        grown >= file_bytes / 2,
        "the weights should be resident after loading"
    );
    assert!(
        grown <= limit,
        "resident memory grew by {grown} bytes, limit {limit}"
    );
}
