//! Weight rows repacked at load for the SIMD kernels: [`GROUP`] rows interleaved block by
//! block, so that one 32-byte load holds four consecutive elements of each of eight rows and
//! one integer dot instruction (`vpdpbusd`, or `vpmaddubsw` + `vpmaddwd`) adds four products
//! for eight rows at once: a block's exact integer sum per (row, token) ends in one i32 lane.
//!
//! # Layout
//!
//! The rows are cut into groups of [`GROUP`] (the last one padded with zero rows, whose
//! scales are 0). A group stores its blocks in order; a group-block of eight rows is, for
//! every format, exactly eight raw blocks long:
//!
//! - `d[8]`: the rows' f16 scales (16 bytes); then `m[8]` (Q4_1, Q5_1; 16 bytes);
//! - Q5_0, Q5_1: `h[32]`, the fifth bits, byte `4r + i` holding in bit `k` the fifth bit of
//!   row `r`'s element `4k + i` (32 bytes);
//! - nibble formats (IQ4_NL's grid indices too): four 32-byte vectors; vector `p` holds in
//!   bytes `4r..4r+4` the quant bytes `4p..4p+4` of row `r`, whose low nibbles are elements
//!   `4p..4p+4` and high nibbles elements `16+4p..16+4p+4`;
//! - Q8_0: eight 32-byte vectors; vector `k` holds in bytes `4r..4r+4` row `r`'s elements
//!   `4k..4k+4`.

use std::sync::Arc;

use super::arena::{Arena, Region};
use super::{Legacy, ShapeError};

/// Rows interleaved together.
pub const GROUP: usize = 8;

/// A matrix interleaved in groups of [`GROUP`] rows, block by block, for the kernels of
/// format `F` ([`Legacy`] here, Q4_K and Q6_K in the sibling module `packed_k`).
#[derive(Debug)]
pub struct Packed<F> {
    format: F,
    rows: usize,
    blocks: usize,
    /// Bytes of one group-block (eight rows of one block).
    group_bytes: usize,
    data: Region,
}

/// A matrix of [`Legacy`] rows in the interleaved layout.
pub type PackedRows = Packed<Legacy>;

impl<F: Copy> Packed<F> {
    /// Interleaves `n_rows` row-major rows held in `raw`, blocks of `block_bytes`, into a
    /// region of `arena` (or of an arena of its own): `put(block, lane, group_block)` writes
    /// one raw block as row `lane` of a `group_bytes` group-block. `None` when `raw` is not
    /// `n_rows` rows of whole blocks or the arena is full.
    pub(super) fn interleave(
        arena: Option<&Arc<Arena>>,
        format: F,
        raw: &[u8],
        n_rows: usize,
        (block_bytes, group_bytes): (usize, usize),
        put: impl Fn(&[u8], usize, &mut [u8]),
    ) -> Option<Self> {
        let row_bytes = raw.len().checked_div(n_rows)?;
        if row_bytes == 0 || row_bytes * n_rows != raw.len() {
            return None;
        }
        if !row_bytes.is_multiple_of(block_bytes) {
            return None;
        }
        let blocks = row_bytes / block_bytes;
        let len = n_rows.div_ceil(GROUP) * blocks * group_bytes;
        let mut data = match arena {
            Some(arena) => arena.take(len)?,
            None => Arena::new(len)?.take(len)?,
        };
        for (r, row) in raw.chunks_exact(row_bytes).enumerate() {
            let (group, lane) = (r / GROUP, r % GROUP);
            for (i, block) in row.chunks_exact(block_bytes).enumerate() {
                let at = (group * blocks + i) * group_bytes;
                put(block, lane, &mut data[at..at + group_bytes]);
            }
        }
        Some(Self {
            format,
            rows: n_rows,
            blocks,
            group_bytes,
            data,
        })
    }

    /// The block format.
    pub fn format(&self) -> F {
        self.format
    }

    /// Rows (without the padding).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Blocks per row.
    pub fn blocks(&self) -> usize {
        self.blocks
    }

    /// Groups of [`GROUP`] rows.
    pub fn groups(&self) -> usize {
        self.rows.div_ceil(GROUP)
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// The group-blocks of group `group`, in block order.
    pub(super) fn group(&self, group: usize) -> &[u8] {
        let bytes = self.blocks * self.group_bytes;
        &self.data[group * bytes..(group + 1) * bytes]
    }
}

/// Byte offsets inside a group-block.
#[derive(Debug, Clone, Copy)]
pub(super) struct GroupLayout {
    /// Offset of `m[8]`, for the formats with an offset.
    pub m: Option<usize>,
    /// Offset of the fifth bits, for the 5-bit formats.
    pub h: Option<usize>,
    /// Offset of the quant vectors.
    pub qs: usize,
    /// Bytes of the group-block.
    pub bytes: usize,
}

/// Where things are in a group-block of `format`.
pub(super) const fn group_layout(format: Legacy) -> GroupLayout {
    let m = if format.uses_q8_1() { Some(16) } else { None };
    let after_m = if format.uses_q8_1() { 32 } else { 16 };
    let h = match format {
        Legacy::Q5_0 | Legacy::Q5_1 => Some(after_m),
        _ => None,
    };
    let qs = if h.is_some() { after_m + 32 } else { after_m };
    GroupLayout {
        m,
        h,
        qs,
        bytes: GROUP * format.block_bytes(),
    }
}

/// Byte offsets of the parts of a raw block: scale `d`, offset `m`, fifth bits `qh`, quants.
struct RawLayout {
    m: Option<usize>,
    qh: Option<usize>,
    qs: usize,
}

const fn raw_layout(format: Legacy) -> RawLayout {
    match format {
        Legacy::Q4_0 | Legacy::Q8_0 | Legacy::Iq4Nl => RawLayout {
            m: None,
            qh: None,
            qs: 2,
        },
        Legacy::Q4_1 => RawLayout {
            m: Some(2),
            qh: None,
            qs: 4,
        },
        Legacy::Q5_0 => RawLayout {
            m: None,
            qh: Some(2),
            qs: 6,
        },
        Legacy::Q5_1 => RawLayout {
            m: Some(2),
            qh: Some(4),
            qs: 8,
        },
    }
}

impl PackedRows {
    /// Repacks `n_rows` row-major rows of `format` (`blocks` blocks each) held in `raw`.
    pub fn pack(format: Legacy, raw: &[u8], n_rows: usize) -> Result<Self, ShapeError> {
        Self::pack_in(None, format, raw, n_rows)
    }

    /// [`Self::pack`] into a region of `arena` (an error too when the arena is full).
    pub fn pack_in(
        arena: Option<&Arc<Arena>>,
        format: Legacy,
        raw: &[u8],
        n_rows: usize,
    ) -> Result<Self, ShapeError> {
        let sizes = (format.block_bytes(), group_layout(format).bytes);
        let put = |block: &[u8], lane, out: &mut [u8]| put_block(format, block, lane, out);
        Self::interleave(arena, format, raw, n_rows, sizes, put).ok_or(ShapeError {
            format,
            weight_bytes: raw.len(),
            activation_blocks: 0,
            cols: 0,
            outputs: n_rows,
        })
    }

    /// Row `r`'s block `i` in its raw GGUF layout (the inverse of the packing).
    pub fn raw_block(&self, r: usize, i: usize) -> Vec<u8> {
        let layout = group_layout(self.format);
        let at = ((r / GROUP) * self.blocks + i) * layout.bytes;
        get_block(self.format, &self.data[at..at + layout.bytes], r % GROUP)
    }
}

/// Writes raw `block` as row `lane` of the group-block `out`.
fn put_block(format: Legacy, block: &[u8], lane: usize, out: &mut [u8]) {
    let (raw, packed) = (raw_layout(format), group_layout(format));
    out[2 * lane..2 * lane + 2].copy_from_slice(&block[..2]);
    if let (Some(from), Some(to)) = (raw.m, packed.m) {
        out[to + 2 * lane..to + 2 * lane + 2].copy_from_slice(&block[from..from + 2]);
    }
    if let (Some(from), Some(to)) = (raw.qh, packed.h) {
        let qh = u32::from_le_bytes([
            block[from],
            block[from + 1],
            block[from + 2],
            block[from + 3],
        ]);
        for i in 0..4 {
            let byte = (0..8).fold(0u8, |byte, k| {
                byte | ((((qh >> (4 * k + i)) & 1) as u8) << k)
            });
            out[to + 4 * lane + i] = byte;
        }
    }
    let quants = &block[raw.qs..];
    for (k, four) in quants.chunks_exact(4).enumerate() {
        let at = packed.qs + 32 * k + 4 * lane;
        out[at..at + 4].copy_from_slice(four);
    }
}

/// Reads row `lane` of the group-block `group_block` back as a raw block.
fn get_block(format: Legacy, group_block: &[u8], lane: usize) -> Vec<u8> {
    let (raw, packed) = (raw_layout(format), group_layout(format));
    let mut block = vec![0u8; format.block_bytes()];
    block[..2].copy_from_slice(&group_block[2 * lane..2 * lane + 2]);
    if let (Some(to), Some(from)) = (raw.m, packed.m) {
        block[to..to + 2].copy_from_slice(&group_block[from + 2 * lane..from + 2 * lane + 2]);
    }
    if let (Some(to), Some(from)) = (raw.qh, packed.h) {
        let mut qh = 0u32;
        for i in 0..4 {
            let byte = group_block[from + 4 * lane + i];
            for k in 0..8 {
                qh |= u32::from((byte >> k) & 1) << (4 * k + i);
            }
        }
        block[to..to + 4].copy_from_slice(&qh.to_le_bytes());
    }
    let vectors = (format.block_bytes() - raw.qs) / 4;
    for k in 0..vectors {
        let at = packed.qs + 32 * k + 4 * lane;
        block[raw.qs + 4 * k..raw.qs + 4 * k + 4].copy_from_slice(&group_block[at..at + 4]);
    }
    block
}
