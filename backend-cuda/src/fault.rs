//! The test-only device fault: `LLORCH_TEST_DEVICE_FAULT=<step index>` makes the backend, at
//! that step (0 = the first since load), launch a kernel that writes through an invalid
//! address (`kernels/test_fault.cu`) before the step's own kernels. The context then holds a
//! real sticky CUDA error (illegal address), which the step reports as it would any fault, so
//! the worker's handling of a lost device can be tested end to end on a GPU. Unset in
//! production; nothing else reads it.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaModule};
use cudarc::nvrtc::Ptx;
use worker_common::backend::BackendError;

use crate::device::Gpu;
use crate::module;
use crate::params::DevPtr;

/// The variable that arms the trigger.
pub const ENV: &str = "LLORCH_TEST_DEVICE_FAULT";

/// The kernel, its own NVRTC program (never part of the worker's kernels).
const SOURCE: &str = include_str!("../kernels/test_fault.cu");

/// An address in the never-mapped first page of the device's address space.
const INVALID_ADDRESS: u64 = 0x10;

/// Why the trigger's value is unusable.
#[derive(Debug, thiserror::Error)]
#[error("{ENV}={value:?} is not a step index (a non-negative integer)")]
pub struct BadTrigger {
    value: String,
}

/// Parses the variable's value: `None` when unset or empty.
pub fn parse(value: Option<&str>) -> Result<Option<u64>, BadTrigger> {
    match value.map(str::trim) {
        None | Some("") => Ok(None),
        Some(text) => text.parse().map(Some).map_err(|_| BadTrigger {
            value: text.to_owned(),
        }),
    }
}

/// An armed trigger: counts steps and faults the device at its step.
pub struct FaultTrigger {
    at_step: u64,
    steps: u64,
    kernel: CudaFunction,
    _module: Arc<CudaModule>,
}

impl FaultTrigger {
    /// Reads [`ENV`] and, when set, compiles the fault kernel for `gpu`'s device.
    pub fn from_env(gpu: &Gpu) -> Result<Option<Self>, BackendError> {
        let value = std::env::var(ENV).ok();
        let Some(at_step) =
            parse(value.as_deref()).map_err(|e| BackendError::InvalidInput(e.to_string()))?
        else {
            return Ok(None);
        };
        let options = module::compile_options(&format!("sm_{}", gpu.sm.replace('.', "")));
        let cubin = module::compile(SOURCE, c"llorch_test_fault.cu", &options)?;
        let loaded = gpu
            .ctx
            .load_module(Ptx::from_binary(cubin))
            .map_err(|e| BackendError::Device(format!("loading the fault kernel: {e}")))?;
        let kernel = loaded
            .load_function("llorch_test_fault")
            .map_err(|e| BackendError::Device(format!("kernel llorch_test_fault: {e}")))?;
        tracing::warn!(
            at_step,
            "{ENV} is set: a test-only device fault will poison the GPU at step {at_step}"
        );
        Ok(Some(Self {
            at_step,
            steps: 0,
            kernel,
            _module: loaded,
        }))
    }

    /// Counts a step; at the armed one, launches the faulting kernel on the step's stream, so
    /// the step's next synchronizing call reports the illegal address.
    pub fn before_step(&mut self, gpu: &Gpu) -> Result<(), BackendError> {
        let step = self.steps;
        self.steps += 1;
        if step != self.at_step {
            return Ok(());
        }
        tracing::warn!(step, "{ENV}: faulting the device now");
        let target = DevPtr::<f32>::from_addr(INVALID_ADDRESS);
        gpu.launch(&self.kernel, (1, 1), 1, &target)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trigger_is_a_step_index_or_unset() {
        assert_eq!(parse(None).ok(), Some(None));
        assert_eq!(parse(Some("")).ok(), Some(None));
        assert_eq!(parse(Some(" 3 ")).ok(), Some(Some(3)));
        assert!(parse(Some("-1")).is_err());
        assert!(parse(Some("soon")).unwrap_err().to_string().contains(ENV));
    }

    #[test]
    fn the_fault_kernel_is_not_part_of_the_worker_program() {
        assert!(SOURCE.contains("llorch_test_fault"));
        assert!(!module::source().contains("llorch_test_fault"));
    }
}
