//! Backend-agnostic core of the llama-orch workers.
//!
//! - [`gguf`]: a zero-copy GGUF v3 reader that validates every offset before use.
//! - [`model`]: a validated [`model::ModelSpec`] built from a GGUF file's metadata and tensors.
//! - [`sampling`]: the contract's seeded sampler chain (penalty → temperature → top-k/p → min-p).

pub mod gguf;
pub mod model;
pub mod sampling;
pub mod tokenizer;
