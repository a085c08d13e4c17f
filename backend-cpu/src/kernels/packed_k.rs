//! Q2_K, Q3_K, Q4_K, Q6_K and IQ4_XS rows repacked at load, [`GROUP`](super::GROUP) rows interleaved per super-block as the
//! 32-element formats are ([`super::packed`]): one 32-byte quant vector holds four consecutive
//! elements of each of eight rows, so one integer dot instruction adds four products for eight
//! rows, and each row's exact super-block sums end in one i32 lane. The kernels keep the
//! k-quants' documented order (`super::rows`): exact `isum` (and `msum`) per (row,
//! token, super-block), then the same f32 step, so they are bit-identical to the one-row
//! reference.
//!
//! # Layout of a group-super-block (eight rows)
//!
//! Q4_K (1248 bytes): `d[8]`, `dmin[8]` (f16); `sc[8][8]` (u8, sub-block-major: the eight rows'
//! 6-bit scales of sub-block `j`); the mins as i16 pairs, pair `q` of row `r` at `4(8q + r)`
//! (sub-blocks `2q`, `2q + 1`, so one `vpmaddwd` against the activation's pair sums gives
//! two sub-blocks' `m·(b_2j + b_2j+1)`); then 32 quant vectors, vector `8p + k` holding in
//! bytes `4r..4r+4` the quant bytes `32p + 4k..+4` of row `r` (low nibbles: elements
//! `4k..4k+4` of sub-block `2p`; high: of sub-block `2p + 1`).
//!
//! Q6_K (1680 bytes, the eight raw super-blocks' size): `d[8]` (f16); `sc[16][8]` (i8,
//! sub-block-major); 32 vectors of `ql`, vector `v` holding in bytes `4r..4r+4` the `ql` bytes
//! `4v..4v+4` of row `r`; 16 vectors of `qh`, likewise. Elements `128h + 32j + 4m..+4` (half
//! `h`, quarter `j`, `m < 8`) take nibble `j / 2` of `ql` vector `16h + 8(j % 2) + m` and bits
//! `2j..2j + 2` of `qh` vector `8h + m`: eight rows' codes for four elements, unpacked with
//! a shift, masks and an or.
//!
//! Q3_K (912 bytes, 8 × 114): `d[8]` (f16); `sc[16][8]` (i8, sub-block-major: the six-bit
//! scales less 32, unpacked); 16 vectors of `qs`, vector `v` holding in bytes `4r..4r+4` the
//! `qs` bytes `4v..4v+4` of row `r`; 8 vectors of `hmask`, likewise. Elements
//! `128h + 32k + 4m..+4` (half `h`, quarter `k`, `m < 8`) take bits `2k..2k + 2` of `qs`
//! vector `8h + m` and bit `4h + k` of `hmask` vector `m`: codes `q + 4` in `0..8`.
//!
//! Q2_K (672 bytes, the eight raw super-blocks' size, as decode reads every byte once):
//! `d[8]`, `dmin[8]` (f16); `sc[16][8]` (u8, sub-block-major: the rows' scale bytes as stored,
//! scale in the low nibble, min in the high); 16 vectors of `qs`, vector `v` holding in bytes
//! `4r..4r+4` the `qs` bytes `4v..4v+4` of row `r`. Elements `128h + 32k + 4m..+4` (half `h`,
//! quarter `k`, `m < 8`) take bits `2k..2k + 2` of `qs` vector `8h + m`, as Q3_K's low bits.
//!
//! IQ4_XS (1104 bytes, 8 × 138): `d[8]` (f16); `sc[8][8]` (i8, sub-block-major: the six-bit
//! scales less 32, unpacked); 32 vectors of `qs`, vector `v` holding in bytes `4r..4r+4` the
//! `qs` bytes `4v..4v+4` of row `r`. Sub-block `ib` takes vectors `4ib..4ib + 4`: vector
//! `4ib + m` holds the indices of its elements `4m..4m+4` in the low nibbles and of
//! `16 + 4m..16 + 4m + 4` in the high ones.

use std::sync::Arc;

use super::arena::Arena;
use super::formats::{Iq4Xs, KType, Q2K, Q3K, Q4K, Q6K};
use super::packed::Packed;
use super::rows::{IQ4_XS_BYTES, Q2_K_BYTES, Q3_K_BYTES, Q4_K_BYTES, Q6_K_BYTES, scales_mins};
use crate::quant::{iq4_xs_scales, q3_k_scales};

/// A k-quant format with an interleaved layout and a packed kernel.
pub trait KLayout: KType + Default {
    /// Bytes of a super-block in the GGUF rows.
    const BLOCK_BYTES: usize;
    /// Bytes of a group-super-block (eight rows).
    const GROUP_BYTES: usize;
    /// Writes GGUF super-block `block` as row `lane` of the group-super-block `out`.
    fn put(block: &[u8], lane: usize, out: &mut [u8]);
}

/// Bytes of a Q4_K group-super-block.
pub(super) const Q4K_GROUP_BYTES: usize = Q4K_QS + 32 * 32;

/// Offsets inside a Q4_K group-super-block.
pub(super) const Q4K_SC: usize = 32;
pub(super) const Q4K_MINS: usize = Q4K_SC + 64;
pub(super) const Q4K_QS: usize = Q4K_MINS + 128;

/// Offsets inside a Q6_K group-super-block.
pub(super) const Q6K_SC: usize = 16;
pub(super) const Q6K_QL: usize = Q6K_SC + 128;
pub(super) const Q6K_QH: usize = Q6K_QL + 32 * 32;

/// Offsets inside a Q3_K group-super-block.
pub(super) const Q3K_SC: usize = 16;
pub(super) const Q3K_QS: usize = Q3K_SC + 128;
pub(super) const Q3K_HM: usize = Q3K_QS + 16 * 32;

impl KLayout for Q3K {
    const BLOCK_BYTES: usize = Q3_K_BYTES;
    const GROUP_BYTES: usize = Q3K_HM + 8 * 32;
    fn put(block: &[u8], lane: usize, out: &mut [u8]) {
        put_q3_k(block, lane, out);
    }
}

/// Offsets inside a Q2_K group-super-block.
pub(super) const Q2K_SC: usize = 32;
pub(super) const Q2K_QS: usize = Q2K_SC + 128;

impl KLayout for Q2K {
    const BLOCK_BYTES: usize = Q2_K_BYTES;
    const GROUP_BYTES: usize = Q2K_QS + 16 * 32;
    fn put(block: &[u8], lane: usize, out: &mut [u8]) {
        put_q2_k(block, lane, out);
    }
}

/// Offsets inside an IQ4_XS group-super-block.
pub(super) const IQ4_SC: usize = 16;
pub(super) const IQ4_QS: usize = IQ4_SC + 64;

impl KLayout for Iq4Xs {
    const BLOCK_BYTES: usize = IQ4_XS_BYTES;
    const GROUP_BYTES: usize = IQ4_QS + 32 * 32;
    fn put(block: &[u8], lane: usize, out: &mut [u8]) {
        put_iq4_xs(block, lane, out);
    }
}

impl KLayout for Q4K {
    const BLOCK_BYTES: usize = Q4_K_BYTES;
    const GROUP_BYTES: usize = Q4K_GROUP_BYTES;
    fn put(block: &[u8], lane: usize, out: &mut [u8]) {
        put_q4_k(block, lane, out);
    }
}

impl KLayout for Q6K {
    const BLOCK_BYTES: usize = Q6_K_BYTES;
    const GROUP_BYTES: usize = Q6K_QH + 16 * 32;
    fn put(block: &[u8], lane: usize, out: &mut [u8]) {
        put_q6_k(block, lane, out);
    }
}

/// A matrix of Q4_K rows in the interleaved layout.
pub type PackedK = Packed<Q4K>;

/// A matrix of Q6_K rows in the interleaved layout.
pub type PackedQ6K = Packed<Q6K>;

/// A matrix of Q3_K rows in the interleaved layout.
pub type PackedQ3K = Packed<Q3K>;

/// A matrix of Q2_K rows in the interleaved layout.
pub type PackedQ2K = Packed<Q2K>;

/// A matrix of IQ4_XS rows in the interleaved layout.
pub type PackedIq4Xs = Packed<Iq4Xs>;

/// Whether this CPU runs the packed k-quant kernels (AVX2, FMA, F16C); elsewhere the rows stay
/// in their GGUF layout for the reference kernels.
pub fn packed_k_available() -> bool {
    crate::isa::avx2()
}

impl<F: KLayout> Packed<F> {
    /// Repacks `n_rows` row-major rows of `F` held in `raw`; `None` for rows that are not
    /// whole super-blocks.
    pub fn pack(raw: &[u8], n_rows: usize) -> Option<Self> {
        Self::pack_in(None, raw, n_rows)
    }

    /// [`Self::pack`] into a region of `arena` (`None` too when the arena is full).
    pub fn pack_in(arena: Option<&Arc<Arena>>, raw: &[u8], n_rows: usize) -> Option<Self> {
        let sizes = (F::BLOCK_BYTES, F::GROUP_BYTES);
        Self::interleave(arena, F::default(), raw, n_rows, sizes, F::put)
    }
}

/// Copies the dword at `from` of `src` into lane `lane` of the 32-byte vector at `to`.
fn put_dword(src: &[u8], from: usize, lane: usize, out: &mut [u8], to: usize) {
    out[to + 4 * lane..to + 4 * lane + 4].copy_from_slice(&src[from..from + 4]);
}

fn put_q4_k(block: &[u8], lane: usize, out: &mut [u8]) {
    let Ok(block) = <&[u8; Q4_K_BYTES]>::try_from(block) else {
        return;
    };
    out[2 * lane..2 * lane + 2].copy_from_slice(&block[0..2]);
    out[16 + 2 * lane..16 + 2 * lane + 2].copy_from_slice(&block[2..4]);
    let (scales, mins) = scales_mins(block);
    for j in 0..8 {
        out[Q4K_SC + 8 * j + lane] = scales[j];
        let at = Q4K_MINS + 4 * (8 * (j / 2) + lane) + 2 * (j % 2);
        out[at..at + 2].copy_from_slice(&u16::from(mins[j]).to_le_bytes());
    }
    for v in 0..32 {
        put_dword(&block[16..], 4 * v, lane, out, Q4K_QS + 32 * v);
    }
}

fn put_q6_k(block: &[u8], lane: usize, out: &mut [u8]) {
    let Ok(block) = <&[u8; Q6_K_BYTES]>::try_from(block) else {
        return;
    };
    out[2 * lane..2 * lane + 2].copy_from_slice(&block[208..210]);
    for s in 0..16 {
        out[Q6K_SC + 8 * s + lane] = block[192 + s];
    }
    for v in 0..32 {
        put_dword(block, 4 * v, lane, out, Q6K_QL + 32 * v);
    }
    for u in 0..16 {
        put_dword(block, 128 + 4 * u, lane, out, Q6K_QH + 32 * u);
    }
}

fn put_q3_k(block: &[u8], lane: usize, out: &mut [u8]) {
    let Ok(block) = <&[u8; Q3_K_BYTES]>::try_from(block) else {
        return;
    };
    out[2 * lane..2 * lane + 2].copy_from_slice(&block[108..110]);
    let mut packed = [0; 12];
    packed.copy_from_slice(&block[96..108]);
    for (s, scale) in q3_k_scales(&packed).into_iter().enumerate() {
        out[Q3K_SC + 8 * s + lane] = scale.wrapping_sub(32);
    }
    for v in 0..16 {
        put_dword(block, 32 + 4 * v, lane, out, Q3K_QS + 32 * v);
    }
    for u in 0..8 {
        put_dword(block, 4 * u, lane, out, Q3K_HM + 32 * u);
    }
}

fn put_q2_k(block: &[u8], lane: usize, out: &mut [u8]) {
    let Ok(block) = <&[u8; Q2_K_BYTES]>::try_from(block) else {
        return;
    };
    out[2 * lane..2 * lane + 2].copy_from_slice(&block[80..82]);
    out[16 + 2 * lane..16 + 2 * lane + 2].copy_from_slice(&block[82..84]);
    for s in 0..16 {
        out[Q2K_SC + 8 * s + lane] = block[s];
    }
    for v in 0..16 {
        put_dword(block, 16 + 4 * v, lane, out, Q2K_QS + 32 * v);
    }
}

fn put_iq4_xs(block: &[u8], lane: usize, out: &mut [u8]) {
    let Ok(block) = <&[u8; IQ4_XS_BYTES]>::try_from(block) else {
        return;
    };
    out[2 * lane..2 * lane + 2].copy_from_slice(&block[0..2]);
    for (ib, scale) in iq4_xs_scales(block).into_iter().enumerate() {
        out[IQ4_SC + 8 * ib + lane] = scale.wrapping_sub(32);
    }
    for v in 0..32 {
        put_dword(block, 8 + 4 * v, lane, out, IQ4_QS + 32 * v);
    }
}
