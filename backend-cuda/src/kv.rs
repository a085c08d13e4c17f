//! The KV cache of one sequence on the device.

use worker_common::backend::BackendError;
use worker_common::model::HyperParams;

use crate::device::{Buffer, Gpu};

/// The KV cache of one sequence: f16, `[layer][pos][kv_head][head_dim]`, keys then values.
pub struct KvCache {
    buffer: Buffer,
    /// Positions it holds.
    pub max_len: usize,
    /// Positions written so far.
    pub filled: usize,
}

impl KvCache {
    /// Allocates room for `max_len` positions; `OutOfMemory` when the GPU has no room.
    pub fn new(gpu: &Gpu, hp: &HyperParams, max_len: usize) -> Result<Self, BackendError> {
        let bytes = hp
            .n_layers
            .checked_mul(max_len)
            .and_then(|v| v.checked_mul(hp.k_width() + hp.v_width()))
            .and_then(|v| v.checked_mul(2))
            .ok_or(BackendError::OutOfMemory {
                what: "KV cache",
                bytes: u64::MAX,
            })?;
        Ok(Self {
            buffer: gpu.alloc(bytes, "KV cache")?,
            max_len,
            filled: 0,
        })
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.buffer.bytes()
    }

    /// What a captured decode step depends on: the cache's address and length.
    pub fn key(&self) -> (u64, usize) {
        (self.buffer.ptr(), self.max_len)
    }

    /// Device addresses of layer `il`'s keys and values.
    pub fn layer(&self, hp: &HyperParams, il: usize) -> (u64, u64) {
        let k_layer = (self.max_len * hp.k_width() * 2) as u64;
        let v_layer = (self.max_len * hp.v_width() * 2) as u64;
        let base = self.buffer.ptr();
        let values = base + k_layer * hp.n_layers as u64;
        (base + k_layer * il as u64, values + v_layer * il as u64)
    }
}
