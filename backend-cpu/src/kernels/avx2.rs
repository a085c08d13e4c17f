//! AVX2 (+FMA, F16C) kernels over [`PackedRows`], with AVX-512 VNNI integer dots when the CPU
//! has them (256-bit `vpdpbusd`, `avx512vnni` + `avx512vl`), bit-identical to
//! [`super::scalar`]: lane `r` of a block's integer sum is row `r`'s exact `isum`, and the f32
//! steps are the reference's, in the same order, eight rows at a time.
//!
//! Each 32-byte quant vector holds four consecutive elements of each of eight rows; the four
//! matching activation quants are broadcast to every lane. Unsigned weight codes (all but
//! Q8_0) go through `vpdpbusd` (VNNI), which sums four u8×i8 products per lane exactly, or
//! `vpmaddubsw` + `vpmaddwd` (AVX2), whose i16 sums of four groups cannot saturate (at most
//! 8·31·128); the format's offset is subtracted as `offset·Σy`, `Σy` the activation block's
//! quant sum. Q8_0's signed weights are made unsigned by flipping the sign bit on VNNI
//! (`x + 128`, then `128·Σy` subtracted) and widened to i16 on AVX2 (`vpmaddubsw` would
//! saturate on 255·127 pairs); both exact for every input. IQ4_NL's indices become grid values
//! by one `vpshufb` of [`KVALUES_IQ4NL`]: on VNNI the codes `v + 128` (`1..=241`), with
//! `128·Σy` subtracted as for Q8_0; on AVX2 the signed values, multiplied as `|y|·(sign(y)·v)`
//! by `vpmaddubsw` (pairs at most `2·128·127`, inside i16) and widened per quad by `vpmaddwd`
//! ([`signed_dot`], IQ4_XS's too); both exact for every input.
//!
//! Intrinsics sit in `unsafe` blocks for older compilers, which treat them as unsafe to call.
#![allow(unused_unsafe)]

use std::arch::x86_64::*;

use std::ops::Range;

use super::formats::{self, LegacyType};
use super::packed::group_layout;
use super::{ActBlock, BlockMeta, GROUP, Legacy, MAX_COLS, PackedRows, Q8Rows, TokenOutputs};
use crate::quant::KVALUES_IQ4NL;

/// Which integer dot instructions this CPU has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    None,
    Avx2,
    Vnni,
}

/// The level of [`crate::isa::active`].
fn level() -> Level {
    if crate::isa::vnni() {
        Level::Vnni
    } else if crate::isa::avx2() {
        Level::Avx2
    } else {
        Level::None
    }
}

/// Runs the SIMD kernel if this CPU has AVX2, FMA and F16C; `false` otherwise. Shapes must
/// have been checked by the caller.
pub(super) fn dot_packed(
    w: &PackedRows,
    groups: Range<usize>,
    activations: Q8Rows<'_>,
    meta: &[BlockMeta],
    out: TokenOutputs<'_, '_>,
) -> bool {
    if level() == Level::None {
        return false;
    }
    let vnni = level() == Level::Vnni;
    // SAFETY: the features were detected above; the caller checked the shapes.
    unsafe {
        match activations {
            Q8Rows::Q8_0(a) => by_format(vnni, w, groups, a, meta, out),
            Q8Rows::Q8_1(a) => by_format(vnni, w, groups, a, meta, out),
        }
    }
    true
}

/// The operands of one call.
pub(super) struct Call<'a, A> {
    pub(super) w: &'a PackedRows,
    pub(super) a: &'a [A],
    pub(super) meta: &'a [BlockMeta],
    pub(super) cols: usize,
}

/// Monomorphises the tile loop per format and instruction set, so its inner loop has no
/// format branches.
unsafe fn by_format<A: ActBlock>(
    vnni: bool,
    w: &PackedRows,
    groups: Range<usize>,
    a: &[A],
    meta: &[BlockMeta],
    out: TokenOutputs<'_, '_>,
) {
    let call = Call {
        w,
        a,
        meta,
        cols: out.len(),
    };
    macro_rules! run {
        ($format:ty) => {
            if vnni {
                super::vnni512::tiles::<$format, A>(&call, groups, out)
            } else {
                tiles_avx2::<$format, A>(&call, groups, out)
            }
        };
    }
    // SAFETY: forwarded from the caller (VNNI only when detected).
    unsafe {
        match w.format() {
            Legacy::Q4_0 => run!(formats::Q4_0),
            Legacy::Q4_1 => run!(formats::Q4_1),
            Legacy::Q5_0 => run!(formats::Q5_0),
            Legacy::Q5_1 => run!(formats::Q5_1),
            Legacy::Q8_0 => run!(formats::Q8_0),
            Legacy::Iq4Nl => run!(formats::Iq4Nl),
        }
    }
}

/// [`tiles`] compiled for AVX2.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tiles_avx2<F: LegacyType, A: ActBlock>(
    call: &Call<'_, A>,
    groups: Range<usize>,
    out: TokenOutputs<'_, '_>,
) {
    // SAFETY: forwarded from the caller.
    unsafe { tiles::<F, A>(call, groups, out) }
}

/// Covers each group's eight rows × `cols` tokens with tiles of [`MAX_COLS`], 2 and 1 tokens
/// (`out[c][r]`).
#[inline(always)]
unsafe fn tiles<F: LegacyType, A: ActBlock>(
    call: &Call<'_, A>,
    groups: Range<usize>,
    out: TokenOutputs<'_, '_>,
) {
    let first_row = groups.start * GROUP;
    for g in groups {
        // SAFETY: forwarded from the caller.
        unsafe { group_tiles::<F, A, false>(call, g, g * GROUP - first_row, out) };
    }
}

/// Group `g`'s eight rows × every token, into rows `at..` of each token's outputs.
#[inline(always)]
pub(super) unsafe fn group_tiles<F: LegacyType, A: ActBlock, const VNNI: bool>(
    call: &Call<'_, A>,
    g: usize,
    at: usize,
    out: TokenOutputs<'_, '_>,
) {
    let cols = call.cols;
    let mut c = 0;
    // SAFETY: the caller guarantees the features and the shapes.
    unsafe {
        while c + MAX_COLS <= cols {
            store_group(&tile::<Ymm<VNNI>, F, A, MAX_COLS>(call, g, c), c, at, out);
            c += MAX_COLS;
        }
        if c + 2 <= cols {
            store_group(&tile::<Ymm<VNNI>, F, A, 2>(call, g, c), c, at, out);
            c += 2;
        }
        if c < cols {
            store_group(&tile::<Ymm<VNNI>, F, A, 1>(call, g, c), c, at, out);
        }
    }
}

/// Writes tokens `c..`'s sums of a one-group tile into rows `at..` of their outputs, leaving
/// out padding rows (a function, as [`codes`] explains).
#[inline(always)]
fn store_group(sums: &[__m256], c: usize, at: usize, out: TokenOutputs<'_, '_>) {
    for (&sum, token) in sums.iter().zip(&mut out[c..]) {
        let live = GROUP.min(token.len() - at);
        store_rows(sum, &mut token[at..][..live]);
    }
}

/// Writes the first `rows.len()` (at most eight) lanes of `sum` into `rows`.
#[inline(always)]
pub(super) fn store_rows(sum: __m256, rows: &mut [f32]) {
    if rows.len() == GROUP {
        // SAFETY: `rows` holds eight floats; AVX was detected by every caller.
        unsafe { _mm256_storeu_ps(rows.as_mut_ptr(), sum) };
        return;
    }
    let mut lanes = [0.0f32; GROUP];
    // SAFETY: as above, into the local array.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), sum) };
    rows.copy_from_slice(&lanes[..rows.len()]);
}

/// How far ahead of the group-block being read the kernels prefetch weights: the hardware
/// prefetchers alone leave a multi-token tile waiting on memory between its dot products
/// (measured: four tokens of 64 MB Q4_1 rows 4.0 instead of 5.0 ms, one thread). In the model,
/// two threads streaming the weights while computing four tokens, 16 KB ahead beat 4 KB: a
/// SmolLM2 4-sequence step 5.30 → 5.03 ms (median of ten interleaved runs; 32 KB in between),
/// Qwen2.5-0.5B's 25.5 → 22.1 ms; prefill and one-token steps unchanged.
const PREFETCH_AHEAD: usize = 16384;

/// Asks for the `bytes` weight bytes [`PREFETCH_AHEAD`] after `at` to be brought into L1.
#[inline(always)]
pub(super) fn prefetch_ahead(at: *const u8, bytes: usize) {
    let ahead = at.wrapping_add(PREFETCH_AHEAD);
    for line in (0..bytes).step_by(64) {
        // SAFETY: a prefetch never faults, whatever the address (past the end included).
        unsafe { _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line).cast()) };
    }
}

/// Eight f16 values at `p` as f32.
#[inline(always)]
pub(super) unsafe fn load_f16x8(p: *const u8) -> __m256 {
    // SAFETY: the caller guarantees 16 readable bytes and F16C.
    unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
}

/// Bit 4 of each byte of the fifth-bit vector `h` for quant vector `k`: `h`'s bit `k` moved
/// to bit 4 (16-bit shifts, whose bits crossing a byte boundary the mask drops).
#[inline(always)]
unsafe fn fifth(h: __m256i, k: usize) -> __m256i {
    unsafe {
        let moved = match k {
            0 => _mm256_slli_epi16::<4>(h),
            1 => _mm256_slli_epi16::<3>(h),
            2 => _mm256_slli_epi16::<2>(h),
            3 => _mm256_slli_epi16::<1>(h),
            4 => h,
            5 => _mm256_srli_epi16::<1>(h),
            6 => _mm256_srli_epi16::<2>(h),
            _ => _mm256_srli_epi16::<3>(h),
        };
        _mm256_and_si256(moved, _mm256_set1_epi8(0x10))
    }
}

/// The eight quant vectors of group-block `gb`: unsigned codes for the nibble formats (and
/// for Q8_0 and IQ4_NL on VNNI, sign bit flipped), signed bytes for Q8_0 and IQ4_NL on AVX2.
#[inline(always)]
unsafe fn codes<F: LegacyType, const VNNI: bool>(gb: *const u8) -> [__m256i; 8] {
    let format = F::FORMAT;
    let layout = group_layout(format);
    // SAFETY: `gb` points at a whole group-block of `format`.
    unsafe {
        // Plain loops, not closures: a closure is not compiled with the caller's target
        // features, and intrinsics it calls then stay function calls.
        let qs = gb.add(layout.qs);
        let mut codes = [_mm256_setzero_si256(); 8];
        if format == Legacy::Q8_0 {
            let flip = _mm256_set1_epi8(i8::MIN);
            for (k, code) in codes.iter_mut().enumerate() {
                let v = _mm256_loadu_si256(qs.add(32 * k).cast());
                *code = if VNNI { _mm256_xor_si256(v, flip) } else { v };
            }
            return codes;
        }
        let mask = _mm256_set1_epi8(0x0F);
        for p in 0..4 {
            let v = _mm256_loadu_si256(qs.add(32 * p).cast());
            codes[p] = _mm256_and_si256(v, mask);
            codes[p + 4] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), mask);
        }
        if format == Legacy::Iq4Nl {
            let grid = iq4nl_grid::<VNNI>();
            for code in &mut codes {
                *code = _mm256_shuffle_epi8(grid, *code);
            }
        }
        if let Some(at) = layout.h {
            let h = _mm256_loadu_si256(gb.add(at).cast());
            for (k, code) in codes.iter_mut().enumerate() {
                *code = _mm256_or_si256(*code, fifth(h, k));
            }
        }
        codes
    }
}

/// Four activation quants (elements `4k..4k+4` of `y`) in every lane.
#[inline(always)]
pub(super) unsafe fn broadcast(y: *const i8, k: usize) -> __m256i {
    // SAFETY: the callers pass `y` with at least `4k + 4` readable bytes.
    unsafe { _mm256_set1_epi32(y.add(4 * k).cast::<i32>().read_unaligned()) }
}

/// `start + Σ_k codes[k] · quad k of y` per lane, exactly, for unsigned codes: `vpdpbusd` in
/// two chains (so consecutive ones do not wait on each other), or `vpmaddubsw` pair sums of
/// `PER_MADD` groups added in i16 before each `vpmaddwd` by ones (exact while
/// `PER_MADD · 2 · max code · 128 < 2^15`: 4 for codes ≤ 31, 2 for codes ≤ 63).
#[inline(always)]
pub(super) unsafe fn dot_groups<const VNNI: bool, const G: usize, const PER_MADD: usize>(
    codes: &[__m256i; G],
    y: *const i8,
    start: __m256i,
) -> __m256i {
    // SAFETY: the callers guarantee AVX2 (and VNNI when `VNNI`) and `4G` bytes at `y`.
    unsafe {
        if VNNI {
            let (mut even, mut odd) = (start, _mm256_setzero_si256());
            for k in (0..G).step_by(2) {
                even = _mm256_dpbusd_epi32(even, codes[k], broadcast(y, k));
                odd = _mm256_dpbusd_epi32(odd, codes[k + 1], broadcast(y, k + 1));
            }
            return _mm256_add_epi32(even, odd);
        }
        let ones = _mm256_set1_epi16(1);
        let mut sum = start;
        for first in (0..G).step_by(PER_MADD) {
            let mut pairs = _mm256_setzero_si256();
            for (k, &code) in codes.iter().enumerate().skip(first).take(PER_MADD) {
                pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(code, broadcast(y, k)));
            }
            sum = _mm256_add_epi32(sum, _mm256_madd_epi16(pairs, ones));
        }
        sum
    }
}

/// The i-quants' 16-value grid ([`KVALUES_IQ4NL`]) in both 128-bit halves, for `vpshufb` by
/// 4-bit indices: the signed values, or with `CODES` the unsigned codes `v + 128` (the sign
/// bits flipped, `1..=241`) that `vpdpbusd` multiplies.
#[inline(always)]
pub(super) unsafe fn iq4nl_grid<const CODES: bool>() -> __m256i {
    // SAFETY: the callers guarantee AVX2; the grid is 16 bytes.
    unsafe {
        let grid = _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast()));
        if CODES {
            _mm256_xor_si256(grid, _mm256_set1_epi8(i8::MIN))
        } else {
            grid
        }
    }
}

/// `Σ_k values[k] · quad k of y` per lane, exactly, for signed values (never −128) and any
/// activation bytes: one `vpmaddubsw` of `|y|` by `sign(y)·v` and one `vpmaddwd` by ones per
/// quad (two pair sums, up to `2·32512`, would not fit i16).
#[inline(always)]
pub(super) unsafe fn signed_dot(values: &[__m256i; 8], y: *const i8) -> __m256i {
    // SAFETY: the callers guarantee AVX2 and 32 bytes at `y`.
    unsafe {
        let ones = _mm256_set1_epi16(1);
        let mut sum = _mm256_setzero_si256();
        for k in 0..8 {
            let (yk, vk) = quad(values, y, k);
            let pairs = _mm256_maddubs_epi16(yk, vk);
            sum = _mm256_add_epi32(sum, _mm256_madd_epi16(pairs, ones));
        }
        sum
    }
}

/// Quad `k` of `y` broadcast as magnitudes (u8), and `values[k]` with its signs: a function,
/// not a closure, so it is compiled with the callers' target features.
#[inline(always)]
unsafe fn quad(values: &[__m256i; 8], y: *const i8, k: usize) -> (__m256i, __m256i) {
    // SAFETY: as for `signed_dot`.
    unsafe {
        let yk = broadcast(y, k);
        (_mm256_abs_epi8(yk), _mm256_sign_epi8(values[k], yk))
    }
}

/// Row `r`'s exact `Σ codes·y` in lane `r`, plus `start` (codes ≤ 31, or Q8_0's, or
/// IQ4_NL's).
#[inline(always)]
unsafe fn block_isum<F: LegacyType, const VNNI: bool>(
    codes: &[__m256i; 8],
    y: &[i8; 32],
    start: __m256i,
) -> __m256i {
    // SAFETY: the callers guarantee AVX2 (and VNNI when `VNNI`).
    unsafe {
        if !VNNI && F::FORMAT == Legacy::Q8_0 {
            return _mm256_add_epi32(start, signed_isum(codes, y));
        }
        if !VNNI && F::FORMAT == Legacy::Iq4Nl {
            return _mm256_add_epi32(start, signed_dot(codes, y.as_ptr()));
        }
        dot_groups::<VNNI, 8, 4>(codes, y.as_ptr(), start)
    }
}

/// AVX2's exact signed Q8_0 sums: codes and activations widened to i16, products summed in
/// pairs per row half, then pairs added and put back in row order.
#[inline(always)]
unsafe fn signed_isum(codes: &[__m256i; 8], y: &[i8; 32]) -> __m256i {
    // SAFETY: the callers guarantee AVX2.
    unsafe {
        let (mut lo, mut hi) = (_mm256_setzero_si256(), _mm256_setzero_si256());
        for (k, &code) in codes.iter().enumerate() {
            let four = y.as_ptr().add(4 * k).cast::<i32>().read_unaligned();
            let y16 = _mm256_cvtepi8_epi16(_mm_set1_epi32(four));
            let rows_0_3 = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(code));
            let rows_4_7 = _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(code));
            lo = _mm256_add_epi32(lo, _mm256_madd_epi16(rows_0_3, y16));
            hi = _mm256_add_epi32(hi, _mm256_madd_epi16(rows_4_7, y16));
        }
        // hadd yields rows [0, 1, 4, 5, 2, 3, 6, 7]; the permutation restores row order.
        let rows = _mm256_hadd_epi32(lo, hi);
        _mm256_permutevar8x32_epi32(rows, _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7))
    }
}

/// What a tile subtracts as `−factor·Σy`: the format's code offset, and VNNI's bias of Q8_0
/// and IQ4_NL.
#[inline(always)]
fn tile_factor(format: Legacy, vnni: bool) -> i32 {
    match format {
        Legacy::Q4_0 => 8,
        Legacy::Q5_0 => 16,
        Legacy::Q8_0 | Legacy::Iq4Nl if vnni => 128,
        _ => 0,
    }
}

/// A tile's register width: one group of eight rows in 256-bit registers ([`Ymm`]) or two
/// groups side by side in 512-bit ones (`vnni512::Zmm`). [`tile`] runs the reference's steps
/// through it, so the tile's arithmetic is written once for both.
pub(super) trait Width {
    /// Eight or sixteen f32 lanes, one per row.
    type F: Copy;
    /// As many i32 lanes.
    type I: Copy;
    /// Where the tile's group-block `i` starts (one group's, or two groups').
    type At: Copy;
    /// Whether the integer dots are VNNI's (which sets Q8_0's bias).
    const VNNI: bool;
    /// The group-blocks at byte `offset` of group `g`'s (and `g + 1`'s) rows.
    unsafe fn at(w: &PackedRows, g: usize, offset: usize) -> Self::At;
    /// Prefetches ahead of the group-blocks at `at`.
    unsafe fn prefetch(at: Self::At, bytes: usize);
    /// The rows' f16 scales at byte `offset` of the group-blocks, widened.
    unsafe fn scales(at: Self::At, offset: usize) -> Self::F;
    /// The eight quant vectors of the group-blocks.
    unsafe fn codes<F: LegacyType>(at: Self::At) -> [Self::I; 8];
    /// `start + Σ codes·y` per row, exactly.
    unsafe fn isum<F: LegacyType>(codes: &[Self::I; 8], y: &[i8; 32], start: i32) -> Self::I;
    unsafe fn zero() -> Self::F;
    /// `acc + f32(isum) · (d_w · d)`, one fused multiply-add, the reference's block step.
    unsafe fn step(acc: Self::F, isum: Self::I, d_w: Self::F, d: f32) -> Self::F;
    /// `offsets + m_w · s`, one fused multiply-add.
    unsafe fn offset(offsets: Self::F, m_w: Self::F, s: f32) -> Self::F;
    /// `a + b` per lane.
    unsafe fn add(a: Self::F, b: Self::F) -> Self::F;
}

/// One group of eight rows at 256 bits, with AVX2 or VNNI integer dots.
pub(super) struct Ymm<const VNNI: bool>;

impl<const VNNI: bool> Width for Ymm<VNNI> {
    type F = __m256;
    type I = __m256i;
    type At = *const u8;
    const VNNI: bool = VNNI;

    #[inline(always)]
    unsafe fn at(w: &PackedRows, g: usize, offset: usize) -> *const u8 {
        // SAFETY: the callers pass an offset inside the group.
        unsafe { w.group(g).as_ptr().add(offset) }
    }
    #[inline(always)]
    unsafe fn prefetch(at: *const u8, bytes: usize) {
        prefetch_ahead(at, bytes);
    }
    #[inline(always)]
    unsafe fn scales(at: *const u8, offset: usize) -> __m256 {
        // SAFETY: the callers pass the offset of eight scales inside the group-block.
        unsafe { load_f16x8(at.add(offset)) }
    }
    #[inline(always)]
    unsafe fn codes<F: LegacyType>(at: *const u8) -> [__m256i; 8] {
        // SAFETY: forwarded from the caller.
        unsafe { codes::<F, VNNI>(at) }
    }
    #[inline(always)]
    unsafe fn isum<F: LegacyType>(codes: &[__m256i; 8], y: &[i8; 32], start: i32) -> __m256i {
        // SAFETY: forwarded from the caller.
        unsafe { block_isum::<F, VNNI>(codes, y, _mm256_set1_epi32(start)) }
    }
    #[inline(always)]
    unsafe fn zero() -> __m256 {
        unsafe { _mm256_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn step(acc: __m256, isum: __m256i, d_w: __m256, d: f32) -> __m256 {
        // SAFETY: the callers guarantee AVX2 and FMA.
        unsafe {
            let scale = _mm256_mul_ps(d_w, _mm256_set1_ps(d));
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale, acc)
        }
    }
    #[inline(always)]
    unsafe fn offset(offsets: __m256, m_w: __m256, s: f32) -> __m256 {
        unsafe { _mm256_fmadd_ps(m_w, _mm256_set1_ps(s), offsets) }
    }
    #[inline(always)]
    unsafe fn add(a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_add_ps(a, b) }
    }
}

/// Group `g`'s rows (and `g + 1`'s at 512 bits) against tokens `c..c + C`: `C` vectors of
/// outputs, each lane accumulated in the reference order.
#[inline(always)]
pub(super) unsafe fn tile<W: Width, F: LegacyType, A: ActBlock, const C: usize>(
    call: &Call<'_, A>,
    g: usize,
    c: usize,
) -> [W::F; C] {
    let layout = group_layout(F::FORMAT);
    let blocks = call.w.blocks();
    let factor = tile_factor(F::FORMAT, W::VNNI);
    // SAFETY: the callers guarantee the features; the groups hold `blocks` group-blocks and
    // the activations `blocks` blocks per token (checked by `super::dot_packed`).
    unsafe {
        let mut acc = [W::zero(); C];
        let mut offsets = [W::zero(); C];
        for i in 0..blocks {
            let at = W::at(call.w, g, i * layout.bytes);
            if C > 1 {
                W::prefetch(at, layout.bytes);
            }
            // The exact products `d_w·d_a` (two f16 values) are formed in `W::step`.
            let d_w = W::scales(at, 0);
            let m_w = match layout.m {
                Some(offset) => W::scales(at, offset),
                None => W::zero(),
            };
            let codes = W::codes::<F>(at);
            // Token by token, written out eight times rather than looped: a loop over `k` kept
            // `acc` and `offsets` in memory (a load and a store per token and block, and
            // their latency on each block's path); with constant indices they stay in
            // registers (prefill block dots, builds alternated on a noisy host: 0.26 and 0.20
            // ns before, 0.18 and 0.19 after).
            const { assert!(C <= 8, "tile: at most eight tokens") };
            macro_rules! token {
                ($k:literal) => {
                    if $k < C {
                        let index = (c + $k) * blocks + i;
                        // Unchecked: two bounds checks per token and block were a tenth of a
                        // four-token tile's instructions. SAFETY: `c + k < cols` and `i <
                        // blocks`, and `super::dot_packed` checked that both hold `cols ×
                        // blocks` blocks.
                        let (meta, a) =
                            (call.meta.get_unchecked(index), call.a.get_unchecked(index));
                        let isum = W::isum::<F>(&codes, a.qs(), -factor * meta.sum);
                        acc[$k] = W::step(acc[$k], isum, d_w, meta.d);
                        if layout.m.is_some() {
                            offsets[$k] = W::offset(offsets[$k], m_w, meta.s);
                        }
                    }
                };
            }
            token!(0);
            token!(1);
            token!(2);
            token!(3);
            token!(4);
            token!(5);
            token!(6);
            token!(7);
        }
        for k in 0..C {
            acc[k] = W::add(acc[k], offsets[k]);
        }
        acc
    }
}
