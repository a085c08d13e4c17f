//! The GPU as the backend uses it: one context and stream, the kernels, and device
//! buffers that know their size, so memory is reported from actual allocations.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaGraph, CudaSlice, CudaStream, DevicePtr, DeviceRepr,
    DriverError, LaunchConfig, PinnedHostSlice, PushKernelArg, result as driver, sys,
};
use worker_common::backend::BackendError;

use crate::module::Kernels;
use crate::params::{DevPtr, KernelParams};

/// A device allocation of bytes; kernels see it through typed addresses ([`Buffer::ptr`]).
pub struct Buffer {
    slice: CudaSlice<u8>,
    ptr: u64,
}

impl Buffer {
    /// The first byte's address as one of `T` elements (every allocation is aligned for any
    /// element type).
    pub fn ptr<T>(&self) -> DevPtr<T> {
        DevPtr::from_addr(self.ptr)
    }

    /// Bytes allocated.
    pub fn bytes(&self) -> usize {
        self.slice.len()
    }
}

/// A kernel's parameter struct as cudarc pushes it: by value, its bytes copied at the launch.
#[repr(transparent)]
struct ByValue<P>(P);

// SAFETY: `P` is one of params.rs's `#[repr(C)]` structs of addresses and numbers, whose C++
// definition the kernels are compiled with, so its bytes are what the kernel reads.
unsafe impl<P: KernelParams> DeviceRepr for ByValue<P> {}

/// The device, its stream and kernels.
pub struct Gpu {
    /// The primary context of the device.
    pub ctx: Arc<CudaContext>,
    /// The one stream every operation runs on, in order.
    pub stream: Arc<CudaStream>,
    /// The compiled kernels.
    pub kernels: Kernels,
    /// Device-wide bytes in use once the context existed, before the module or any buffer: the
    /// baseline of [`Gpu::held_since_open`].
    used_at_open: u64,
    /// Device name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// Compute capability, e.g. `9.0`.
    pub sm: String,
    /// CUDA version the driver supports, e.g. `13.0`.
    pub driver_version: String,
    /// Set by tests: the next capture is invalidated as soon as it starts
    /// ([`Gpu::begin_capture`]).
    invalidate_next_capture: AtomicBool,
}

/// A driver error as a backend error, naming what failed: [`BackendError::DeviceLost`] when
/// the error is sticky ([`is_sticky`]), else [`BackendError::Device`].
pub fn device_error(what: &str, e: DriverError) -> BackendError {
    if is_sticky(e.0) {
        BackendError::DeviceLost(format!("{what}: {e}"))
    } else {
        BackendError::Device(format!("{what}: {e}"))
    }
}

/// Whether a driver error poisons the context for the life of the process: CUDA's "sticky"
/// errors, after which every call on the context returns the same error (a kernel faulted, or
/// the hardware did). Everything else (out of memory, a bad argument or launch configuration,
/// a capture error) leaves the context usable.
pub fn is_sticky(code: sys::CUresult) -> bool {
    use sys::CUresult as R;
    matches!(
        code,
        R::CUDA_ERROR_ILLEGAL_ADDRESS
            | R::CUDA_ERROR_LAUNCH_TIMEOUT
            | R::CUDA_ERROR_LAUNCH_FAILED
            | R::CUDA_ERROR_MISALIGNED_ADDRESS
            | R::CUDA_ERROR_INVALID_ADDRESS_SPACE
            | R::CUDA_ERROR_INVALID_PC
            | R::CUDA_ERROR_ILLEGAL_INSTRUCTION
            | R::CUDA_ERROR_HARDWARE_STACK_ERROR
            | R::CUDA_ERROR_ASSERT
            | R::CUDA_ERROR_TENSOR_MEMORY_LEAK
            | R::CUDA_ERROR_ECC_UNCORRECTABLE
            | R::CUDA_ERROR_NVLINK_UNCORRECTABLE
            | R::CUDA_ERROR_CONTAINED
            | R::CUDA_ERROR_EXTERNAL_DEVICE
            | R::CUDA_ERROR_CONTEXT_IS_DESTROYED
            | R::CUDA_ERROR_DEINITIALIZED
    )
}

/// Device-wide bytes in use (total minus free).
fn device_used(ctx: &CudaContext) -> Result<u64, BackendError> {
    let (free, total) = ctx
        .mem_get_info()
        .map_err(|e| device_error("cuMemGetInfo", e))?;
    Ok(total.saturating_sub(free) as u64)
}

/// Allocates `bytes` (uninitialised) on `stream`; a failure for lack of memory is `OutOfMemory`.
fn alloc_on(
    stream: &Arc<CudaStream>,
    bytes: usize,
    what: &'static str,
) -> Result<Buffer, BackendError> {
    // SAFETY: the memory is uninitialised; every user writes before reading.
    let slice = unsafe { stream.alloc::<u8>(bytes.max(1)) }.map_err(|e| {
        if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            BackendError::OutOfMemory {
                what,
                bytes: bytes as u64,
            }
        } else {
            device_error(&format!("allocating {bytes} bytes for {what}"), e)
        }
    })?;
    let ptr = slice.device_ptr(stream).0;
    Ok(Buffer { slice, ptr })
}

impl Gpu {
    /// Opens device `ordinal` and compiles or loads the kernels.
    pub fn open(ordinal: u32) -> Result<Self, BackendError> {
        let count = CudaContext::device_count().map_err(|e| device_error("cuDeviceGetCount", e))?;
        if i64::from(ordinal) >= i64::from(count) {
            return Err(BackendError::Device(format!(
                "GPU {ordinal} does not exist ({count} CUDA devices found)"
            )));
        }
        let ctx = CudaContext::new(ordinal as usize)
            .map_err(|e| device_error(&format!("opening GPU {ordinal}"), e))?;
        // One stream orders everything, so cudarc's per-buffer events would only add work.
        // SAFETY: no buffer exists yet and the backend never uses a second stream.
        unsafe { ctx.disable_event_tracking() };
        // A stream of its own, not the legacy default stream, which cannot be captured into a
        // CUDA graph.
        let stream = ctx
            .new_stream()
            .map_err(|e| device_error("creating a stream", e))?;
        let name = ctx.name().map_err(|e| device_error("cuDeviceGetName", e))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| device_error("compute capability", e))?;
        let mut version = 0;
        // SAFETY: `version` is valid for writes.
        unsafe { sys::cuDriverGetVersion(&mut version) }
            .result()
            .map_err(|e| device_error("cuDriverGetVersion", e))?;
        let used_at_open = device_used(&ctx)?;
        let kernels = Kernels::load(&ctx)?;
        Ok(Self {
            ctx,
            stream,
            kernels,
            used_at_open,
            name,
            sm: format!("{major}.{minor}"),
            driver_version: format!("{}.{}", version / 1000, (version % 1000) / 10),
            invalidate_next_capture: AtomicBool::new(false),
        })
    }

    /// Makes the context current on the calling thread (the worker may call from any thread).
    pub fn bind(&self) -> Result<(), BackendError> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| device_error("binding the CUDA context", e))
    }

    /// Bytes free and total on the device.
    pub fn memory(&self) -> Result<(u64, u64), BackendError> {
        let (free, total) = self
            .ctx
            .mem_get_info()
            .map_err(|e| device_error("cuMemGetInfo", e))?;
        Ok((free as u64, total as u64))
    }

    /// Device-wide bytes in use now minus those in use when the context had just been created:
    /// what this process added, as long as no other process allocated meanwhile.
    pub fn held_since_open(&self) -> Result<u64, BackendError> {
        Ok(device_used(&self.ctx)?.saturating_sub(self.used_at_open))
    }

    /// Bytes the device's memory pool, which every [`Gpu::alloc`] draws on, holds from the
    /// driver: freed buffers stay in it for the next sequence, and its chunks round sizes up.
    /// Zero where allocations bypass the pool.
    pub fn pool_reserved(&self) -> Result<u64, BackendError> {
        if !self.ctx.has_async_alloc() {
            return Ok(0);
        }
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        let mut reserved: u64 = 0;
        // SAFETY: `pool` and `reserved` are valid for writes of the types the calls write (the
        // attribute is a `cuuint64_t`); the pool is the device's current one, alive with the
        // context.
        unsafe {
            sys::cuDeviceGetMemPool(&mut pool, self.ctx.cu_device())
                .result()
                .map_err(|e| device_error("cuDeviceGetMemPool", e))?;
            sys::cuMemPoolGetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                (&mut reserved as *mut u64).cast(),
            )
        }
        .result()
        .map_err(|e| device_error("cuMemPoolGetAttribute", e))?;
        Ok(reserved)
    }

    /// Allocates `bytes` (uninitialised); a failure for lack of memory is `OutOfMemory`.
    pub fn alloc(&self, bytes: usize, what: &'static str) -> Result<Buffer, BackendError> {
        alloc_on(&self.stream, bytes, what)
    }

    /// Copies `data` into `buffer` at byte `offset`.
    pub fn upload(
        &self,
        data: &[u8],
        buffer: &mut Buffer,
        offset: usize,
    ) -> Result<(), BackendError> {
        let mut dst = buffer.slice.slice_mut(offset..offset + data.len());
        self.stream
            .memcpy_htod(data, &mut dst)
            .map_err(|e| device_error("copying to the device", e))
    }

    /// Copies the first `out.len()` floats of `buffer` to `out` and waits for them.
    #[cfg(test)]
    pub fn download_f32(&self, buffer: &Buffer, out: &mut [f32]) -> Result<(), BackendError> {
        self.download_f32_at(buffer, 0, out)
    }

    /// Copies `out.len()` floats of `buffer` from byte `offset` to `out` and waits for them.
    #[cfg(test)]
    pub fn download_f32_at(
        &self,
        buffer: &Buffer,
        offset: usize,
        out: &mut [f32],
    ) -> Result<(), BackendError> {
        let bytes = std::mem::size_of_val(out);
        let mut raw = vec![0u8; bytes];
        self.stream
            .memcpy_dtoh(&buffer.slice.slice(offset..offset + bytes), &mut raw)
            .map_err(|e| device_error("copying from the device", e))?;
        self.sync()?;
        for (o, chunk) in out.iter_mut().zip(raw.chunks_exact(4)) {
            *o = f32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        }
        Ok(())
    }

    /// Page-locked host memory for `len` floats, which the GPU copies into directly (cached:
    /// the host reads it, so not write-combined).
    pub fn alloc_pinned(&self, len: usize) -> Result<PinnedHostSlice<f32>, BackendError> {
        // SAFETY: the memory is uninitialised; it is only read after a copy into it.
        unsafe { self.ctx.alloc_pinned_with_flags::<f32>(len.max(1), 0) }
            .map_err(|e| device_error("allocating page-locked host memory", e))
    }

    /// Copies `count` floats from `src` into pinned `out` at `offset` and waits.
    pub fn download_pinned(
        &self,
        src: DevPtr<f32>,
        out: &mut PinnedHostSlice<f32>,
        offset: usize,
        count: usize,
    ) -> Result<(), BackendError> {
        let all = out
            .as_mut_slice()
            .map_err(|e| device_error("waiting for the host buffer", e))?;
        let dst = all.get_mut(offset..offset + count).ok_or_else(|| {
            BackendError::Device(format!(
                "{count} floats at {offset} do not fit the host buffer"
            ))
        })?;
        // SAFETY: `src` is a live device buffer of at least `dst.len()` floats; `dst` is
        // page-locked memory that stays borrowed until the copy is waited for below.
        unsafe { driver::memcpy_dtoh_async(dst, src.addr(), self.stream.cu_stream()) }
            .map_err(|e| device_error("copying from the device", e))?;
        self.sync()
    }

    /// Starts recording the stream's launches into a graph instead of running them.
    pub fn begin_capture(&self) -> Result<(), BackendError> {
        self.stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(|e| device_error("starting a graph capture", e))?;
        if self.invalidate_next_capture.swap(false, Ordering::Relaxed) {
            // Synchronizing a stream under capture is refused, and invalidates the capture:
            // what another thread's synchronizing call does to it.
            let _refused = self.stream.synchronize();
        }
        Ok(())
    }

    /// Makes the next capture fail as one invalidated from outside its pass would (tests of
    /// the fallback; nothing else calls it).
    pub fn invalidate_next_capture(&self) {
        self.invalidate_next_capture.store(true, Ordering::Relaxed);
    }

    /// Whether the recording under way was invalidated by an operation that synchronized the
    /// context (its launches then fail, and ending it returns no graph).
    pub fn capture_invalidated(&self) -> bool {
        matches!(
            self.stream.capture_status(),
            Ok(sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED)
        )
    }

    /// Ends the recording begun by [`Gpu::begin_capture`] and instantiates the graph.
    pub fn end_capture(&self) -> Result<CudaGraph, BackendError> {
        self.stream
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .map_err(|e| device_error("instantiating the captured graph", e))?
            .ok_or_else(|| BackendError::Device("the graph capture recorded nothing".to_owned()))
    }

    /// The sticky error the context holds, if any: after a call failed (one whose status does
    /// not say why), synchronizing the context tells a poisoned one apart, since a
    /// sticky error is returned by every call from then on.
    pub fn sticky_error(&self) -> Option<DriverError> {
        match self.ctx.synchronize() {
            Err(e) if is_sticky(e.0) => Some(e),
            _ => None,
        }
    }

    /// Waits for all queued work; surfaces asynchronous kernel faults.
    pub fn sync(&self) -> Result<(), BackendError> {
        self.stream
            .synchronize()
            .map_err(|e| device_error("running the kernels", e))
    }

    /// Launches `func` with its parameters on the stream.
    pub fn launch<P: KernelParams>(
        &self,
        func: &CudaFunction,
        grid: (u32, u32),
        block: u32,
        params: &P,
    ) -> Result<(), BackendError> {
        self.launch_shared(func, grid, (block, 0), params)
    }

    /// Launches `func` with its parameters on the stream, `block.1` bytes of dynamic shared
    /// memory for each block of `block.0` threads.
    pub fn launch_shared<P: KernelParams>(
        &self,
        func: &CudaFunction,
        grid: (u32, u32),
        block: (u32, u32),
        params: &P,
    ) -> Result<(), BackendError> {
        self.launch_grid(func, (grid.0, grid.1, 1), block, params)
    }

    /// [`Gpu::launch_shared`] over a grid of three dimensions.
    pub fn launch_grid<P: KernelParams>(
        &self,
        func: &CudaFunction,
        grid: (u32, u32, u32),
        block: (u32, u32),
        params: &P,
    ) -> Result<(), BackendError> {
        let config = LaunchConfig {
            grid_dim: grid,
            block_dim: (block.0, 1, 1),
            shared_mem_bytes: block.1,
        };
        let params = ByValue(*params);
        let mut builder = self.stream.launch_builder(func);
        builder.arg(&params);
        // SAFETY: every kernel takes one parameter struct, the one its wrapper in ops.rs,
        // qgemv.rs, qgemm.rs or moe.rs passes, and the addresses are of live buffers sized for
        // the launch.
        unsafe { builder.launch(config) }
            .map(|_| ())
            .map_err(|e| device_error("launching a kernel", e))
    }

    /// Whether the driver reports `buffer` as device memory (not host or managed memory).
    pub fn is_device_memory(buffer: &Buffer) -> Result<bool, BackendError> {
        let mut kind: u32 = 0;
        // SAFETY: `kind` is valid for a 4-byte write, the size of this attribute.
        unsafe {
            sys::cuPointerGetAttribute(
                (&mut kind as *mut u32).cast(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                buffer.ptr,
            )
        }
        .result()
        .map_err(|e| device_error("cuPointerGetAttribute", e))?;
        Ok(kind == sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32)
    }
}
