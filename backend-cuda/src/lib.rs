//! CUDA backend of `worker-orcd`, on cudarc with every CUDA library loaded at run time, so this
//! crate builds on machines without CUDA.
//!
//! At this stage it only checks that the driver can be loaded; the backend itself arrives with
//! the CUDA issue.

/// Why the CUDA backend cannot start.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// `libcuda.so.1` could not be loaded.
    #[error(
        "no CUDA driver found (libcuda could not be loaded); worker-orcd needs an NVIDIA GPU with driver 580+"
    )]
    NoDriver,
}

/// Checks that the CUDA driver library is present, before any cudarc call that would panic
/// without it.
pub fn check_driver() -> Result<(), CudaError> {
    // SAFETY: `is_culib_present` only tries to dlopen the driver library and drops the handle.
    if unsafe { cudarc::driver::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(CudaError::NoDriver)
    }
}
