//! Backend-agnostic core of the llama-orch workers.
//!
//! - [`gguf`]: a zero-copy GGUF v3 reader that validates every offset before use.
//! - [`model`]: a validated [`model::ModelSpec`] built from a GGUF file's metadata and tensors.
//! - [`backend`]: the [`backend::InferenceBackend`] trait every compute backend implements.
//! - [`generate`]: the per-job generation logic ([`generate::Sequence`]) both workers run.
//! - [`schedule`]: the scheduler that steps many sequences together over a paged KV pool.
//! - [`sampling`]: the contract's seeded sampler chain (penalty → temperature → top-k/p → min-p).

pub mod backend;
pub mod calendar;
pub mod generate;
pub mod gguf;
pub mod grammar;
pub mod grammar_budget;
pub mod grammar_cache;
pub mod model;
pub mod sampling;
pub mod schedule;
mod simd;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod tokenizer;
