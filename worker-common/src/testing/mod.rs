//! Test support (the `testing` feature): a [`ScriptedBackend`] whose logits follow a script, and
//! a [`tiny_tokenizer`], so the scheduler, the per-job logic and the HTTP routes get fast unit
//! tests without a model. Never used end to end: the black-box suite runs the real models.

pub mod schemas;
mod scripted;
mod tokenizer;

pub use scripted::{Script, ScriptedBackend, StepRecord};
pub use tokenizer::{TINY_EOS, ascii_tokenizer, harmony_tokenizer, tiny_tokenizer};
