//! The activation quantizers against ggml's reference formulas and each other.

use super::*;
use crate::kernels::Q8Rows;
use crate::quant::test_rng::Rng;

/// Random activations with zero blocks, ties, NaN and infinities mixed in.
fn inputs(rng: &mut Rng, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| match rng.next() % 64 {
            0 => f32::NAN,
            1 => f32::INFINITY,
            2 => -0.5,
            3 => 2.5,
            _ if (i / QK_K) % 5 == 4 => 0.0,
            _ => rng.unit() * 8.0,
        })
        .collect()
}

fn bits<T: std::fmt::Debug>(v: &[T]) -> Vec<String> {
    v.iter().map(|b| format!("{b:?}")).collect()
}

/// A quantizer that may split long inputs over a team, giving the bits of its blocks and of
/// what it computes beside them.
type OnTeam = fn(Option<&Team>, &[f32]) -> Vec<String>;

/// The metadata's exact bits.
fn meta_bits(meta: &[BlockMeta]) -> Vec<String> {
    let bits = |m: &BlockMeta| format!("{:08x} {:08x} {}", m.d.to_bits(), m.s.to_bits(), m.sum);
    meta.iter().map(bits).collect()
}

/// A Q8_0 or Q8_1 quantizer that writes the blocks' metadata beside them.
type WithMeta<B> =
    fn(Option<&Team>, &[f32], &mut Vec<B>, &mut Vec<BlockMeta>) -> Result<(), DotError>;

/// `quantize`'s blocks, checking that its metadata is `kernels::block_meta` of them (`rows`
/// views the blocks as the kernels do). The buffers start with `stale` blocks of other sizes,
/// as the matmul scratch holds them between calls.
fn with_meta<B: Copy + std::fmt::Debug>(
    quantize: WithMeta<B>,
    rows: fn(&[B]) -> Q8Rows<'_>,
    stale: B,
    team: Option<&Team>,
    x: &[f32],
) -> Vec<String> {
    let (mut q, mut meta) = (vec![stale; 7], vec![ZERO_META; 500]);
    quantize(team, x, &mut q, &mut meta).unwrap();
    let mut reference = Vec::new();
    crate::kernels::block_meta(rows(&q), &mut reference);
    assert_eq!(meta_bits(&meta), meta_bits(&reference), "metadata");
    bits(&q)
}

/// Q8_0 blocks, through [`with_meta`].
fn q8_0_on(team: Option<&Team>, x: &[f32]) -> Vec<String> {
    with_meta(quantize_q8_0_on, |q| Q8Rows::Q8_0(q), ZERO_Q8_0, team, x)
}

/// Q8_1 blocks, through [`with_meta`].
fn q8_1_on(team: Option<&Team>, x: &[f32]) -> Vec<String> {
    with_meta(quantize_q8_1_on, |q| Q8Rows::Q8_1(q), ZERO_Q8_1, team, x)
}

/// Q8_K super-blocks.
fn q8_k_on(team: Option<&Team>, x: &[f32]) -> Vec<String> {
    let mut q = vec![ZERO_Q8_K; 3];
    quantize_q8_k_on(team, x, &mut q).unwrap();
    bits(&q)
}

/// `quantize`'s bits on `team` and on the calling thread alone.
fn split_and_alone(quantize: OnTeam, team: &Team, x: &[f32]) -> (Vec<String>, Vec<String>) {
    (quantize(Some(team), x), quantize(None, x))
}

/// The vectorizable rounding equals `roundf` then the saturating cast for every kind of
/// value: halves either side of zero, the largest floats below a half, integers beyond the
/// i8 range, infinities and NaN.
#[test]
fn quant_rounds_as_roundf_and_saturates() {
    let below_half = 0.5f32.next_down();
    let mut values = vec![
        0.0,
        -0.0,
        0.5,
        -0.5,
        1.5,
        -1.5,
        2.5,
        126.5,
        -127.5,
        below_half,
        -below_half,
        1.0 + below_half,
        127.49,
        128.0,
        -129.0,
        1e10,
        -1e10,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        8_388_609.0,
    ];
    let mut rng = Rng(17);
    values.extend((0..10_000).map(|_| rng.unit() * 300.0));
    for v in values {
        assert_eq!(quant(v, 1.0), v.round() as i8, "{v:?}");
    }
}

/// The AVX2- and AVX-512-compiled loops give the bits of the plain per-block code, and split
/// over a team (long inputs: several tasks) the bits of the calling thread alone; the
/// metadata computed beside the blocks is `kernels::block_meta`'s at every level.
#[test]
fn simd_and_parallel_quantization_equal_the_plain_blocks() {
    let mut rng = Rng(0x5EED_0AC7_1A7E_0001);
    let team = Team::new(3).unwrap();
    // 18 Q8 blocks (a 576-wide row): the loops' last run of eight blocks is partial.
    for len in [18 * QK8, QK_K, 3 * QK_K, 2 * PARALLEL_ELEMENTS + 5 * QK_K] {
        let x = inputs(&mut rng, len);
        // Each level's bits: plain, AVX2, AVX-512 (as far as the CPU goes).
        let levels = |f: fn(&[f32]) -> Vec<String>| {
            let runs: Vec<Vec<String>> = (0..=2)
                .map(|level| {
                    simd::LEVEL.store(level, std::sync::atomic::Ordering::Relaxed);
                    f(&x)
                })
                .collect();
            simd::LEVEL.store(2, std::sync::atomic::Ordering::Relaxed);
            runs
        };
        let q8_0 = |x: &[f32]| q8_0_on(None, x);
        let q8_1 = |x: &[f32]| q8_1_on(None, x);
        let q8_k = |x: &[f32]| q8_k_on(None, x);
        let whole_super_blocks = len.is_multiple_of(QK_K);
        let (split, alone) = split_and_alone(q8_0_on, &team, &x);
        assert_eq!(split, alone, "{len} elements, Q8_0 over the team");
        let (split, alone) = split_and_alone(q8_1_on, &team, &x);
        assert_eq!(split, alone, "{len} elements, Q8_1 over the team");
        if whole_super_blocks {
            let (split, alone) = split_and_alone(q8_k_on, &team, &x);
            assert_eq!(split, alone, "{len} elements, Q8_K over the team");
        }
        let formats = [q8_0, q8_1, q8_k];
        let tested = if whole_super_blocks { 3 } else { 2 };
        for f in &formats[..tested] {
            let runs = levels(*f);
            assert_eq!(runs[0], runs[1], "{len} elements, AVX2");
            assert_eq!(runs[0], runs[2], "{len} elements, AVX-512");
        }
        let blocks: Vec<_> = x
            .chunks_exact(QK8)
            .map(|b| block_q8_0(b.try_into().unwrap()))
            .collect();
        assert_eq!(bits(&blocks), q8_0(&x));
        let blocks: Vec<_> = x
            .chunks_exact(QK8)
            .map(|b| block_q8_1(b.try_into().unwrap()))
            .collect();
        assert_eq!(bits(&blocks), q8_1(&x));
        if !whole_super_blocks {
            continue;
        }
        let blocks: Vec<_> = x
            .chunks_exact(QK_K)
            .map(|b| block_q8_k(b.try_into().unwrap()))
            .collect();
        assert_eq!(bits(&blocks), q8_k(&x));
    }
}
