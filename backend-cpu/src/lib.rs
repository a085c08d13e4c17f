//! CPU inference backend of `llorch-cpud`; the kernels arrive with the CPU inference issue.

pub mod quant;
