//! IQ3_XXS's [`SignedGrid`] for the IQ3_S sums of [`super::iq3_s`]: the grid entries of its
//! 8-bit indices from [`IQ3XXS_GRID`](crate::quant::IQ3XXS_GRID) (magnitudes at most 62, so
//! each `vpmaddubsw` pair sum is at most `2 · 128 · 62` and a lane gathers at most
//! `8 · 2 · 15872 · 31 < 2^23` a super-block), and its 32 sign bits the four `ksigns_iq2xs`
//! bytes of the sub-block's 7-bit sign indices, looked up in scalar code once per sub-block
//! and row (the tile's `C` tokens share them).

use std::arch::x86_64::*;

use super::iq3_s::{SignedGrid, signed};
use crate::quant::{IQ3_XXS_BYTES, iq3_xxs_entry, iq3_xxs_scales, iq3_xxs_signs};

/// IQ3_XXS's [`SignedGrid`].
pub(super) struct Iq3Xxs;

impl SignedGrid<IQ3_XXS_BYTES> for Iq3Xxs {
    #[inline(always)]
    fn multipliers(block: &[u8; IQ3_XXS_BYTES]) -> [u8; 8] {
        iq3_xxs_scales(block)
    }

    #[inline(always)]
    unsafe fn values(block: &[u8; IQ3_XXS_BYTES], ib: usize) -> __m256i {
        let mut entries = [0; 8];
        for (k, e) in entries.iter_mut().enumerate() {
            *e = iq3_xxs_entry(block, ib, k);
        }
        // SAFETY: the caller guarantees AVX2.
        unsafe { signed(entries, iq3_xxs_signs(block, ib)) }
    }
}
