//! Shared test support: where the real test assets live, the real binaries, and the HTTP
//! pieces the black-box tests talk to them with.
//!
//! The black-box tests of this crate (in `tests/tests/`) run against the real models and
//! llama.cpp's vocab files that `scripts/fetch-assets.sh` puts in the asset cache.

pub mod assets;
pub mod bins;
pub mod fixtures;
pub mod gguf_writer;
pub mod http;
pub mod invariance;
pub mod pool;
pub mod stream;
pub mod synthetic;
pub mod worker;
