//! AVX2 (+FMA, F16C) kernels, with AVX-512 VNNI integer dots when the CPU has them (256-bit
//! `vpdpbusd`, `avx512vnni` + `avx512vl`), bit-identical to [`super::scalar`]: the lanes are
//! exact i32 sums and the f32 steps are the reference's, in the same order.
//!
//! Unsigned weight codes (all but Q8_0) go through `vpmaddubsw` (AVX2), whose i16 pair sums
//! cannot saturate here (at most 2·31·128), or `vpdpbusd` (VNNI), which sums four u8×i8 products
//! per lane exactly; the format's offset is subtracted as `offset·Σy` per lane, computed once
//! per activation block. Q8_0's signed weights are widened to i16 on AVX2 (`vpmaddubsw` needs
//! one unsigned operand and would saturate on 255·127 pairs); on VNNI they are made unsigned by
//! flipping the sign bit (`x + 128`) and `128·Σy` is subtracted, exact for every input.
//!
//! Intrinsics sit in `unsafe` blocks for older compilers, which treat them as unsafe to call.
#![allow(unused_unsafe)]

use std::arch::x86_64::*;
use std::sync::OnceLock;

use super::{Legacy, MAX_COLS, Q8Rows};
use crate::quant::activation::{BlockQ8_0, BlockQ8_1};

/// Which integer dot instructions this CPU has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    None,
    Avx2,
    Vnni,
}

/// Detected once, as the answer cannot change.
fn level() -> Level {
    static LEVEL: OnceLock<Level> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        let avx2 = is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c");
        let vnni = is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512vl");
        match (avx2, vnni) {
            (true, true) => Level::Vnni,
            (true, false) => Level::Avx2,
            _ => Level::None,
        }
    })
}

/// Whether the AVX2 path is forced even on a VNNI CPU (tests compare the two).
#[cfg(test)]
pub(super) static FORCE_AVX2: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

fn vnni() -> bool {
    #[cfg(test)]
    if FORCE_AVX2.load(std::sync::atomic::Ordering::Relaxed) {
        return false;
    }
    level() == Level::Vnni
}

/// Runs the AVX2 kernel if this CPU has AVX2, FMA and F16C; `false` otherwise. Shapes must
/// have been checked by the caller: `rows` holds `out.len() / cols` rows of `row_bytes`.
pub(super) fn dot_rows(
    format: Legacy,
    rows: &[u8],
    row_bytes: usize,
    activations: Q8Rows<'_>,
    cols: usize,
    out: &mut [f32],
) -> bool {
    if level() == Level::None {
        return false;
    }
    let vnni = vnni();
    // SAFETY: the features were detected above; the caller checked the shapes.
    unsafe {
        match activations {
            Q8Rows::Q8_0(a) => by_format(format, vnni, rows, row_bytes, a, cols, out),
            Q8Rows::Q8_1(a) => by_format(format, vnni, rows, row_bytes, a, cols, out),
        }
    }
    true
}

/// An activation block type: quants, scale bits, and the Q8_1 sum bits (0 for Q8_0).
trait ActBlock: Copy {
    fn qs(&self) -> &[i8; 32];
    fn d_bits(&self) -> u16;
    fn s_bits(&self) -> u16;
}

impl ActBlock for BlockQ8_0 {
    #[inline(always)]
    fn qs(&self) -> &[i8; 32] {
        &self.qs
    }
    #[inline(always)]
    fn d_bits(&self) -> u16 {
        self.d.to_bits()
    }
    #[inline(always)]
    fn s_bits(&self) -> u16 {
        0
    }
}

impl ActBlock for BlockQ8_1 {
    #[inline(always)]
    fn qs(&self) -> &[i8; 32] {
        &self.qs
    }
    #[inline(always)]
    fn d_bits(&self) -> u16 {
        self.d.to_bits()
    }
    #[inline(always)]
    fn s_bits(&self) -> u16 {
        self.s.to_bits()
    }
}

/// Monomorphises the tile loop per format and instruction set, so its inner loop has no
/// format branches.
unsafe fn by_format<A: ActBlock>(
    format: Legacy,
    vnni: bool,
    rows: &[u8],
    row_bytes: usize,
    a: &[A],
    cols: usize,
    out: &mut [f32],
) {
    macro_rules! run {
        ($code:literal) => {
            if vnni && cols >= WIDE_COLS {
                tiles_vnni_wide::<$code, A>(rows, row_bytes, a, cols, out)
            } else if vnni {
                tiles_vnni::<$code, A>(rows, row_bytes, a, cols, out)
            } else {
                tiles_avx2::<$code, A>(rows, row_bytes, a, cols, out)
            }
        };
    }
    // SAFETY: forwarded from the caller (VNNI only when detected).
    unsafe {
        match format {
            Legacy::Q4_0 => run!(0),
            Legacy::Q4_1 => run!(1),
            Legacy::Q5_0 => run!(2),
            Legacy::Q5_1 => run!(3),
            Legacy::Q8_0 => run!(4),
        }
    }
}

/// [`tiles`] compiled for AVX2.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tiles_avx2<const F: u8, A: ActBlock>(
    rows: &[u8],
    row_bytes: usize,
    a: &[A],
    cols: usize,
    out: &mut [f32],
) {
    // SAFETY: forwarded from the caller.
    unsafe { tiles::<F, A, false, false>(rows, row_bytes, a, cols, out) }
}

/// [`tiles`] compiled for AVX-512 VNNI (256-bit).
#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
unsafe fn tiles_vnni<const F: u8, A: ActBlock>(
    rows: &[u8],
    row_bytes: usize,
    a: &[A],
    cols: usize,
    out: &mut [f32],
) {
    // SAFETY: forwarded from the caller.
    unsafe { tiles::<F, A, true, false>(rows, row_bytes, a, cols, out) }
}

/// [`tiles`] with the wide prefill tile, compiled for AVX-512 VNNI: a function of its own, as
/// the wide tile inlined beside the decode loops made decode ≈ 30 % slower (measured on Zen 4,
/// Qwen2.5-0.5B, CPU time of 100 decode steps).
#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
unsafe fn tiles_vnni_wide<const F: u8, A: ActBlock>(
    rows: &[u8],
    row_bytes: usize,
    a: &[A],
    cols: usize,
    out: &mut [f32],
) {
    // SAFETY: forwarded from the caller.
    unsafe { tiles::<F, A, true, true>(rows, row_bytes, a, cols, out) }
}

/// The format a kernel code stands for (const generics cannot take the enum itself).
#[inline(always)]
const fn format_of(code: u8) -> Legacy {
    match code {
        0 => Legacy::Q4_0,
        1 => Legacy::Q4_1,
        2 => Legacy::Q5_0,
        3 => Legacy::Q5_1,
        _ => Legacy::Q8_0,
    }
}

/// Blocks ahead of the current one each row prefetches.
const PREFETCH_BLOCKS: usize = 16;

/// Whether decode (one token) runs four weight rows at a time, sharing each activation load.
/// Measured on Zen 4 (`examples/kernel_bench.rs`, 256 MB of rows): the nibble formats gain from
/// the four independent accumulation chains (Q4_1: ≈ 9 vs 5 GB/s); Q8_0 and the 5-bit formats
/// stream faster one row at a time (Q8_0: ≈ 14 vs 6.5 GB/s), as four interleaved row streams
/// defeat the memory prefetchers more than the shorter chains help.
const fn four_row_decode(format: Legacy) -> bool {
    matches!(format, Legacy::Q4_0 | Legacy::Q4_1)
}

/// Tokens of the prefill tile on VNNI CPUs, whose 32 vector registers hold its 16
/// accumulators: twice the tokens per unpacked weight block of the AVX2 tile.
const WIDE_COLS: usize = 8;

/// Covers the `rows × cols` outputs with register tiles: four rows at a time against one
/// column for the formats where that is faster (see [`four_row_decode`]), two rows against four
/// columns (prefill), and single rows or columns for the rest.
#[inline(always)]
unsafe fn tiles<const F: u8, A: ActBlock, const VNNI: bool, const WIDE: bool>(
    rows: &[u8],
    row_bytes: usize,
    a: &[A],
    cols: usize,
    out: &mut [f32],
) {
    let n_rows = out.len() / cols;
    let blocks = a.len() / cols;
    let row = |r: usize| &rows[r * row_bytes..(r + 1) * row_bytes];
    let col = |c: usize| &a[c * blocks..(c + 1) * blocks];
    // SAFETY: the caller guarantees the features and the shapes.
    unsafe {
        let mut r = 0;
        if cols == 1 && four_row_decode(format_of(F)) {
            while r + 4 <= n_rows {
                let quad = [row(r), row(r + 1), row(r + 2), row(r + 3)];
                for (i, sums) in tile::<F, A, VNNI, 4, 1>(quad, [col(0)]).iter().enumerate() {
                    out[r + i] = sums[0];
                }
                r += 4;
            }
        }
        while r < n_rows {
            let height = if cols >= MAX_COLS && r + 2 <= n_rows {
                2
            } else {
                1
            };
            let mut c = 0;
            while WIDE && height == 2 && c + WIDE_COLS <= cols {
                let group: [&[A]; WIDE_COLS] = std::array::from_fn(|k| col(c + k));
                let sums = tile::<F, A, VNNI, 2, WIDE_COLS>([row(r), row(r + 1)], group);
                out[r * cols + c..][..WIDE_COLS].copy_from_slice(&sums[0]);
                out[(r + 1) * cols + c..][..WIDE_COLS].copy_from_slice(&sums[1]);
                c += WIDE_COLS;
            }
            while c + MAX_COLS <= cols {
                let group = [col(c), col(c + 1), col(c + 2), col(c + 3)];
                if height == 2 {
                    let sums = tile::<F, A, VNNI, 2, MAX_COLS>([row(r), row(r + 1)], group);
                    out[r * cols + c..][..MAX_COLS].copy_from_slice(&sums[0]);
                    out[(r + 1) * cols + c..][..MAX_COLS].copy_from_slice(&sums[1]);
                } else {
                    let sums = tile::<F, A, VNNI, 1, MAX_COLS>([row(r)], group);
                    out[r * cols + c..][..MAX_COLS].copy_from_slice(&sums[0]);
                }
                c += MAX_COLS;
            }
            for rr in r..r + height {
                for cc in c..cols {
                    out[rr * cols + cc] = tile::<F, A, VNNI, 1, 1>([row(rr)], [col(cc)])[0][0];
                }
            }
            r += height;
        }
    }
}

/// f16 bits to f32 with one F16C instruction (the `half` crate's call is not inlined).
#[inline(always)]
fn f16_to_f32(bits: u16) -> f32 {
    // SAFETY: F16C was detected by every caller (these functions are only reached from
    // `#[target_feature]` kernels).
    unsafe { _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits)))) }
}

#[inline(always)]
fn le_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

/// The 32 weight codes of a block as unsigned bytes in element order (nibble formats).
#[inline(always)]
unsafe fn unsigned_codes(format: Legacy, b: &[u8]) -> __m256i {
    unsafe {
        let (qs_at, qh_at) = match format {
            Legacy::Q4_0 => (2, None),
            Legacy::Q4_1 => (4, None),
            Legacy::Q5_0 => (6, Some(2)),
            _ => (8, Some(4)),
        };
        let q = _mm_loadu_si128(b[qs_at..qs_at + 16].as_ptr().cast());
        let mask = _mm_set1_epi8(0x0F);
        let lo = _mm_and_si128(q, mask);
        let hi = _mm_and_si128(_mm_srli_epi16::<4>(q), mask);
        let codes = _mm256_set_m128i(hi, lo);
        match qh_at {
            None => codes,
            Some(at) => {
                let qh = u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
                _mm256_or_si256(codes, fifth_bits(qh))
            }
        }
    }
}

/// `0x10` in byte `j` where bit `j` of `qh` is set.
#[inline(always)]
unsafe fn fifth_bits(qh: u32) -> __m256i {
    unsafe {
        let spread = _mm256_shuffle_epi8(
            _mm256_set1_epi32(qh as i32),
            _mm256_setr_epi64x(
                0,
                0x0101_0101_0101_0101,
                0x0202_0202_0202_0202,
                0x0303_0303_0303_0303,
            ),
        );
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
        _mm256_and_si256(set, _mm256_set1_epi8(0x10))
    }
}

/// `−factor · Σ y` over elements `4g..4g+4` per lane (`factor` the offset, or 128 for VNNI's
/// Q8_0); computed once per activation block and shared by every weight row of a tile.
#[inline(always)]
unsafe fn negated_offsets<const VNNI: bool>(y: __m256i, factor: u8) -> __m256i {
    unsafe {
        let factor = _mm256_set1_epi8(factor as i8);
        let sums = if VNNI {
            _mm256_dpbusd_epi32(_mm256_setzero_si256(), factor, y)
        } else {
            let pairs = _mm256_maddubs_epi16(factor, y);
            _mm256_madd_epi16(pairs, _mm256_set1_epi16(1))
        };
        _mm256_sub_epi32(_mm256_setzero_si256(), sums)
    }
}

/// Lanes `Σ x·y` over elements `4g..4g+4` for unsigned codes `x`, plus `neg_offsets` (VNNI
/// starts its accumulation from them, saving the separate subtraction).
#[inline(always)]
unsafe fn unsigned_lanes<const VNNI: bool>(
    codes: __m256i,
    y: __m256i,
    neg_offsets: Option<__m256i>,
) -> __m256i {
    unsafe {
        if VNNI {
            let start = neg_offsets.unwrap_or(_mm256_setzero_si256());
            return _mm256_dpbusd_epi32(start, codes, y);
        }
        let lanes = _mm256_madd_epi16(_mm256_maddubs_epi16(codes, y), _mm256_set1_epi16(1));
        match neg_offsets {
            Some(offsets) => _mm256_add_epi32(lanes, offsets),
            None => lanes,
        }
    }
}

/// Lanes for signed Q8_0 weights. VNNI: `(x + 128)·y − 128·y` with `neg_offsets = −128·Σy`.
/// AVX2: exact i16 products, pairs, then groups of four in element order.
#[inline(always)]
unsafe fn signed_lanes<const VNNI: bool>(
    x: __m256i,
    y: __m256i,
    neg_offsets: Option<__m256i>,
) -> __m256i {
    unsafe {
        if VNNI {
            let unsigned = _mm256_xor_si256(x, _mm256_set1_epi8(i8::MIN));
            return unsigned_lanes::<true>(unsigned, y, neg_offsets);
        }
        let widen = |v: __m256i, hi: bool| {
            _mm256_cvtepi8_epi16(if hi {
                _mm256_extracti128_si256::<1>(v)
            } else {
                _mm256_castsi256_si128(v)
            })
        };
        let lo = _mm256_madd_epi16(widen(x, false), widen(y, false));
        let hi = _mm256_madd_epi16(widen(x, true), widen(y, true));
        // hadd yields groups [0, 1, 4, 5, 2, 3, 6, 7]; the permutation restores element order.
        let grouped = _mm256_hadd_epi32(lo, hi);
        _mm256_permutevar8x32_epi32(grouped, _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7))
    }
}

/// `((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7))`, the reference's reduction.
#[inline(always)]
unsafe fn reduce(acc: __m256) -> f32 {
    unsafe {
        let x = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps::<1>(acc));
        let x = _mm_add_ps(x, _mm_movehl_ps(x, x));
        let x = _mm_add_ss(x, _mm_movehdup_ps(x));
        _mm_cvtss_f32(x)
    }
}

/// `R` rows against `C` columns: `R·C` independent accumulations, each in the reference order.
#[inline(always)]
unsafe fn tile<const F: u8, A: ActBlock, const VNNI: bool, const R: usize, const C: usize>(
    rows: [&[u8]; R],
    cols: [&[A]; C],
) -> [[f32; C]; R] {
    // SAFETY: only reached from `tiles`, whose callers guarantee AVX2, FMA, F16C (and VNNI).
    unsafe {
        let format = format_of(F);
        let block_bytes = format.block_bytes();
        // Added as `−factor·Σy` per lane: the formats' code offsets, and VNNI's Q8_0 bias.
        let factor: u8 = match format {
            Legacy::Q4_0 => 8,
            Legacy::Q5_0 => 16,
            Legacy::Q8_0 if VNNI => 128,
            _ => 0,
        };
        let mut acc = [[_mm256_setzero_ps(); C]; R];
        let mut offsets = [[0.0f32; C]; R];
        for i in 0..cols[0].len() {
            let mut codes = [_mm256_setzero_si256(); R];
            let mut d_w = [_mm256_setzero_ps(); R];
            let mut m_w = [0.0f32; R];
            for r in 0..R {
                // The hardware prefetchers lose track of several interleaved row streams;
                // asking for the block 16 ahead keeps the loads from waiting on memory.
                let ahead = rows[r]
                    .as_ptr()
                    .wrapping_add((i + PREFETCH_BLOCKS) * block_bytes);
                _mm_prefetch::<_MM_HINT_T0>(ahead.cast());
                let w = &rows[r][i * block_bytes..(i + 1) * block_bytes];
                d_w[r] = _mm256_set1_ps(f16_to_f32(le_u16(w, 0)));
                if format.uses_q8_1() {
                    m_w[r] = f16_to_f32(le_u16(w, 2));
                }
                codes[r] = if format == Legacy::Q8_0 {
                    _mm256_loadu_si256(w[2..34].as_ptr().cast())
                } else {
                    unsigned_codes(format, w)
                };
            }
            let mut s_a = [0.0f32; C];
            for c in 0..C {
                let block = &cols[c][i];
                let y = _mm256_loadu_si256(block.qs().as_ptr().cast());
                let d_a = _mm256_set1_ps(f16_to_f32(block.d_bits()));
                if format.uses_q8_1() {
                    s_a[c] = f16_to_f32(block.s_bits());
                }
                let neg_offsets = (factor != 0).then(|| negated_offsets::<VNNI>(y, factor));
                for r in 0..R {
                    let lanes = if format == Legacy::Q8_0 {
                        signed_lanes::<VNNI>(codes[r], y, neg_offsets)
                    } else {
                        unsigned_lanes::<VNNI>(codes[r], y, neg_offsets)
                    };
                    // The exact product `d_w·d_a` (two f16 values) in every lane.
                    let scale = _mm256_mul_ps(d_w[r], d_a);
                    acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), scale, acc[r][c]);
                }
            }
            // Apart from the loop above, so that the compiler computes a row's offsets for all
            // columns in one vector multiply and add (each lane still rounds the product, then
            // the sum, as the reference does).
            if format.uses_q8_1() {
                for r in 0..R {
                    for c in 0..C {
                        offsets[r][c] += m_w[r] * s_a[c];
                    }
                }
            }
        }
        let mut sums = [[0.0f32; C]; R];
        for r in 0..R {
            for c in 0..C {
                sums[r][c] = reduce(acc[r][c]) + offsets[r][c];
            }
        }
        sums
    }
}
