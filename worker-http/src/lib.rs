//! The worker shell shared by `worker-orcd` and `llorch-cpud`.
//!
//! At this stage it holds the command line of the wire contract (`specs/CONTRACT.md`); the HTTP
//! server generic over the backend arrives with the worker-http issue.

mod flags;

pub use flags::{CommonFlags, LogFormat};
