//! The KV page pool: every layer's keys and values for [`PAGE_SIZE`]-position pages, f16, shared
//! by all sequences through their page tables.
//!
//! Keys and values are stored as f16, as llama.cpp and vLLM store them by default: half the
//! memory of f32, and the rounding llama.cpp's logits carry (Qwen's large key biases make the
//! difference visible in the parity tests).
//!
//! The pool is one zeroed allocation made at load (`alloc_zeroed`, which the system allocator
//! serves for a block this large with fresh anonymous pages, zero without being written): its
//! memory becomes resident only as steps write the pages, so an idle worker's pool costs
//! address space, not RSS, as the old per-sequence reservation did.

use half::f16;
use half::slice::HalfFloatSliceExt;
use worker_common::backend::{BackendError, LoadConfig, PAGE_SIZE, PageId};

/// Pool lengths, in units of whole default contexts.
const DEFAULT_CONTEXTS: usize = 4;

/// Keys `[page][slot][k_width]` then values `[page][slot][v_width]`, layer after layer.
#[derive(Debug)]
pub struct KvPool {
    data: Box<[f16]>,
    pages: usize,
    k_width: usize,
    v_width: usize,
    /// A key row rounded to f16 before it is spread over its page's transposed layout.
    key_row: Vec<f16>,
}

/// One layer's keys and values, whole pool.
#[derive(Debug, Clone, Copy)]
pub struct LayerKv<'a> {
    /// Keys, `[pool row][k_width]`.
    pub keys: &'a [f16],
    /// Values, `[pool row][v_width]`.
    pub values: &'a [f16],
}

/// Where element `element` (KV head × head size + dimension) of the key in pool row `row` is.
/// Keys are stored transposed within each page (`[page][element][slot]`): one dimension of a
/// page's [`PAGE_SIZE`] keys lies side by side, so attention scores a page's positions with one
/// vector operation per dimension, each score still summed over the dimensions in order.
pub fn key_index(row: usize, k_width: usize, element: usize) -> usize {
    ((row / PAGE_SIZE) * k_width + element) * PAGE_SIZE + row % PAGE_SIZE
}

/// The pool row (`page * PAGE_SIZE + slot`) of position `pos` of a sequence with `pages`.
/// Positions come from validated chunks, whose tables cover them.
#[inline(always)]
pub fn pool_row(pages: &[PageId], pos: usize) -> usize {
    pages[pos / PAGE_SIZE].index() * PAGE_SIZE + pos % PAGE_SIZE
}

impl KvPool {
    /// Sizes and allocates the pool for `n_layers` layers of keys `k_width` and values
    /// `v_width` wide: `config.kv_cache_bytes`, or by default [`DEFAULT_CONTEXTS`] contexts (or
    /// `config.parallel` contexts, if more) capped at a quarter of physical memory; never less than one context
    /// (`InvalidInput`, naming `device` and both figures, when the budget is smaller).
    pub fn new(
        n_layers: usize,
        (k_width, v_width): (usize, usize),
        config: &LoadConfig,
        device: &str,
    ) -> Result<Self, BackendError> {
        let page_elements = PAGE_SIZE * n_layers * (k_width + v_width);
        let page_bytes = (page_elements * size_of::<f16>()).max(1);
        let context_pages = config.context_length.max(1).div_ceil(PAGE_SIZE);
        let pages = match config.kv_cache_bytes {
            Some(budget) => usize::try_from(budget).unwrap_or(usize::MAX) / page_bytes,
            None => {
                let cap = physical_memory().map_or(usize::MAX, |bytes| bytes / 4 / page_bytes);
                let contexts = config.parallel.unwrap_or(0).max(DEFAULT_CONTEXTS);
                context_pages.saturating_mul(contexts).min(cap)
            }
        };
        let pages = match config.kv_cache_bytes {
            // A setting that cannot work, not a lack of device memory (`INSUFFICIENT_VRAM` is the
            // GPU's): the load fails with `MODEL_LOAD_FAILED`, naming both figures.
            Some(budget) if pages < context_pages => {
                return Err(BackendError::InvalidInput(format!(
                    "a KV cache of {budget} bytes on {device} holds {pages} pages of {PAGE_SIZE} positions, less than one context of {} positions ({} bytes): raise --kv-cache-mb or lower --ctx-size",
                    config.context_length,
                    context_pages * page_bytes
                )));
            }
            _ => pages.max(context_pages),
        };
        let elements = pages
            .checked_mul(page_elements)
            .ok_or(BackendError::OutOfMemory {
                what: "KV page pool",
                bytes: u64::MAX,
            })?;
        Ok(Self {
            data: zeroed(elements)?,
            pages,
            k_width,
            v_width,
            key_row: vec![f16::ZERO; k_width],
        })
    }

    /// Pages in the pool.
    pub fn pages(&self) -> usize {
        self.pages
    }

    /// Bytes allocated.
    pub fn bytes(&self) -> usize {
        self.data.len() * size_of::<f16>()
    }

    fn layer_range(&self, layer: usize) -> (usize, usize, usize) {
        let rows = self.pages * PAGE_SIZE;
        let (keys, values) = (rows * self.k_width, rows * self.v_width);
        (layer * (keys + values), keys, values)
    }

    /// Layer `layer`'s keys and values.
    pub fn layer(&self, layer: usize) -> LayerKv<'_> {
        let (start, keys, values) = self.layer_range(layer);
        let (k, v) = self.data[start..start + keys + values].split_at(keys);
        LayerKv { keys: k, values: v }
    }

    /// Writes the f32 key row `k` and value row `v` (`k_width` and `v_width` long) of layer
    /// `layer` into pool row `row`, rounded to f16 (eight at a time with F16C where the CPU has
    /// it: `half`'s slice conversion, the same rounding as one at a time).
    pub fn store(&mut self, layer: usize, row: usize, k: &[f32], v: &[f32]) {
        let (start, keys, _) = self.layer_range(layer);
        let (kw, vw) = (self.k_width, self.v_width);
        let layer_data = &mut self.data[start..];
        self.key_row.convert_from_f32_slice(&k[..kw]);
        for (element, &x) in self.key_row.iter().enumerate() {
            layer_data[key_index(row, kw, element)] = x;
        }
        layer_data[keys + row * vw..][..vw].convert_from_f32_slice(&v[..vw]);
    }
}

/// `len` zero f16 values in one fresh allocation; `OutOfMemory` when it cannot be had.
fn zeroed(len: usize) -> Result<Box<[f16]>, BackendError> {
    let oom = || BackendError::OutOfMemory {
        what: "KV page pool",
        bytes: (len as u64).saturating_mul(2),
    };
    if len == 0 {
        return Ok(Box::default());
    }
    let layout = std::alloc::Layout::array::<f16>(len).map_err(|_| oom())?;
    // SAFETY: the layout has a non-zero size (len > 0, f16 is two bytes).
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<f16>();
    if ptr.is_null() {
        return Err(oom());
    }
    let slice = std::ptr::slice_from_raw_parts_mut(ptr, len);
    // SAFETY: `ptr` is a live allocation of the global allocator with the layout of `[f16; len]`
    // (what `Box<[f16]>` frees it with), all-zero bytes are a valid f16 (+0.0), and the box
    // becomes its only owner.
    Ok(unsafe { Box::from_raw(slice) })
}

/// `MemTotal` of `/proc/meminfo`, in bytes.
fn physical_memory() -> Option<usize> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(kv_cache_bytes: Option<u64>, parallel: Option<usize>) -> LoadConfig {
        LoadConfig {
            context_length: 32,
            kv_cache_bytes,
            parallel,
        }
    }

    #[test]
    fn the_default_pool_holds_four_contexts_or_one_per_parallel_sequence() {
        let pages =
            |parallel| KvPool::new(1, (2, 2), &config(None, parallel), "cpu").map(|p| p.pages());
        assert_eq!(pages(None).ok(), Some(8), "4 contexts of 2 pages");
        assert_eq!(pages(Some(2)).ok(), Some(8));
        assert_eq!(pages(Some(16)).ok(), Some(32));
    }

    #[test]
    fn a_budget_below_one_context_is_refused() {
        // A page of one layer, 2 + 2 wide: 16 positions × 4 × 2 bytes = 128 bytes.
        let pool = KvPool::new(1, (2, 2), &config(Some(3 * 128), None), "cpu");
        assert!(matches!(pool, Ok(ref p) if p.pages() == 3));
        let small = KvPool::new(1, (2, 2), &config(Some(128), None), "cpu");
        let message = match small {
            Err(BackendError::InvalidInput(message)) => message,
            other => panic!("{:?}", other.map(|p| p.pages())),
        };
        assert!(
            message.contains("128 bytes") && message.contains("256 bytes"),
            "{message}"
        );
    }
}
