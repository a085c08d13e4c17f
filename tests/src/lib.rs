//! Shared test support: where the real test assets live.
//!
//! The black-box tests of this crate (in `tests/tests/`) run against the real models and
//! llama.cpp's vocab files that `scripts/fetch-assets.sh` puts in the asset cache.

pub mod assets;
pub mod bins;
pub mod fixtures;
pub mod gguf_writer;
