//! The KV page pool on the device, allocated once at load, and its default size.

use worker_common::backend::{BackendError, PAGE_SIZE};
use worker_common::model::HyperParams;

use crate::device::{Buffer, Gpu};
use crate::params::DevPtr;

/// VRAM the default pool leaves free beyond the weights, at least: the module and the
/// activations.
pub const MIN_HEADROOM: u64 = 1 << 30;
/// Most bytes the default pool takes without `--parallel`.
const MAX_DEFAULT_BYTES: u64 = 16 << 30;
/// Most full contexts the default pool holds without `--parallel`: more sequences than a step
/// ever runs at once.
const MAX_DEFAULT_CONTEXTS: u64 = 64;

/// The pool: f16, `[layer][row][kv_width]` keys, then values in the same layout, where the row
/// of slot `s` of page `p` is `p * PAGE_SIZE + s`.
pub struct KvPool {
    buffer: Buffer,
    /// Pages in the pool.
    pub pages: usize,
    /// Most positions one sequence reaches (the load's context length).
    pub context_length: usize,
}

/// Bytes of one position of every layer's keys and values.
pub fn position_bytes(hp: &HyperParams) -> u64 {
    (hp.n_layers * (hp.k_width() + hp.v_width()) * 2) as u64
}

/// The default pool size: with `parallel` (`--parallel N`), N full contexts, as llama-server
/// sizes its cache for `-np N -c N·ctx`; without, 64 contexts capped at 16 GiB, or one context
/// where one is larger (a 128k-token context of an 8B model takes 16 GiB). A context counts
/// whole pages: a sequence holds its last positions in a page of its own. Either way at most
/// what is free after the weights less a headroom (the larger of [`MIN_HEADROOM`] and a tenth
/// of the device). The caller checks that it holds at least one context.
pub fn default_bytes(
    free: u64,
    total: u64,
    (context_length, parallel): (usize, Option<usize>),
    position: u64,
) -> u64 {
    let context = (context_length.div_ceil(PAGE_SIZE) * PAGE_SIZE) as u64;
    let context = context.saturating_mul(position);
    let wanted = match parallel {
        Some(parallel) => (parallel as u64).saturating_mul(context),
        None => MAX_DEFAULT_CONTEXTS
            .saturating_mul(context)
            .min(MAX_DEFAULT_BYTES)
            .max(context),
    };
    free.saturating_sub(headroom(total)).min(wanted)
}

/// VRAM the default pool leaves free on a device of `total` bytes.
pub fn headroom(total: u64) -> u64 {
    MIN_HEADROOM.max(total / 10)
}

impl KvPool {
    /// Allocates `pages` pages for sequences of up to `context_length` positions.
    pub fn new(
        gpu: &Gpu,
        hp: &HyperParams,
        pages: usize,
        context_length: usize,
    ) -> Result<Self, BackendError> {
        let bytes = (pages as u64)
            .checked_mul(PAGE_SIZE as u64 * position_bytes(hp))
            .and_then(|b| usize::try_from(b).ok())
            .ok_or(BackendError::OutOfMemory {
                what: "KV pool",
                bytes: u64::MAX,
            })?;
        Ok(Self {
            buffer: gpu.alloc(bytes, "KV pool")?,
            pages,
            context_length,
        })
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.buffer.bytes()
    }

    /// Layer `il`'s keys and values (f16 rows: all layers' keys, then all layers' values).
    pub fn layer(&self, hp: &HyperParams, il: usize) -> (DevPtr<u16>, DevPtr<u16>) {
        let rows = self.pages * PAGE_SIZE;
        let (k_layer, v_layer) = (rows * hp.k_width(), rows * hp.v_width());
        let keys: DevPtr<u16> = self.buffer.ptr();
        let values = keys.offset(k_layer * hp.n_layers);
        (keys.offset(k_layer * il), values.offset(v_layer * il))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn the_default_pool_keeps_a_headroom_and_its_caps() {
        // 80 GiB device, 70 GiB free: 8 GiB headroom, then the 16 GiB cap.
        assert_eq!(
            default_bytes(70 * GIB, 80 * GIB, (8192, None), 1 << 20),
            16 * GIB
        );
        // 64 contexts of 8192 positions of 1 KiB: 512 MiB.
        assert_eq!(
            default_bytes(70 * GIB, 80 * GIB, (8192, None), 1024),
            512 << 20
        );
        // --parallel N: N contexts, beyond 16 GiB and 64 contexts when memory allows.
        assert_eq!(
            default_bytes(70 * GIB, 80 * GIB, (8192, Some(128)), 1024),
            GIB
        );
        assert_eq!(
            default_bytes(70 * GIB, 80 * GIB, (8192, Some(1)), 1 << 20),
            8 * GIB
        );
        assert_eq!(
            default_bytes(70 * GIB, 80 * GIB, (8192, Some(4)), 1 << 20),
            32 * GIB
        );
        assert_eq!(
            default_bytes(70 * GIB, 80 * GIB, (8192, Some(16)), 1 << 20),
            62 * GIB
        );
        // A small device: at least 1 GiB stays free.
        assert_eq!(
            default_bytes(3 * GIB, 4 * GIB, (8192, None), 1 << 20),
            2 * GIB
        );
        assert_eq!(default_bytes(GIB / 2, 4 * GIB, (8192, None), 1 << 20), 0);
    }

    #[test]
    fn the_default_pool_holds_whole_pages_of_a_context_of_any_length() {
        // Llama-3.1-8B: 128 KiB a position. A context of 9,000 positions takes 563 pages
        // (9,008 positions): the pool sized for 9,000 would hold none (found on an H100:
        // `--ctx-size 9000 --parallel 1` failed to load with INSUFFICIENT_VRAM).
        let position = 128 << 10;
        let one = 9000_usize.div_ceil(PAGE_SIZE) * PAGE_SIZE;
        for parallel in [Some(1), Some(3), None] {
            let bytes = default_bytes(70 * GIB, 80 * GIB, (9000, parallel), position);
            assert!(
                bytes >= one as u64 * position,
                "{parallel:?}: {bytes} bytes hold no context of 9,000 positions"
            );
        }
        // Its trained 131,072 positions (16 GiB) without --parallel: one context, above the cap.
        assert_eq!(
            default_bytes(70 * GIB, 80 * GIB, (131_072, None), position),
            16 * GIB
        );
        assert_eq!(
            default_bytes(70 * GIB, 80 * GIB, (131_073, None), position),
            16 * GIB + PAGE_SIZE as u64 * position
        );
    }
}
