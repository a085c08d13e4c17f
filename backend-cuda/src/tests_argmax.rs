//! The greedy choice on the device (`argmax_logits` in ops.cu) against the host sampler's, plain
//! and under a grammar's mask.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use worker_common::sampling::{greedy_choice, masked_greedy_choice};

use crate::ops::{AllowedMask, ArgmaxScratch, NON_FINITE_CHOICE};
use crate::tests::{Rng, get, gpu, put, to_bytes};

/// The device's greedy choice equals the sampler's at T = 0 on logits with ties and f32::MAX,
/// and is [`NON_FINITE_CHOICE`] wherever one logit is NaN or ±inf (one among 300,001, or in the
/// last slot), at vocabulary sizes around the block's stride.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn argmax_logits_matches_the_greedy_sampler() {
    use worker_common::sampling::{Sampler, SamplingParams};
    let gpu = gpu();
    let mut rng = Rng(0x0bad_cafe);
    let specials = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MAX,
        1.0,
        1.0,
    ];
    let out = gpu.alloc(4, "test").unwrap();
    let scratch = put(&gpu, &vec![0; ArgmaxScratch::bytes(1)]);
    let mut checked = [0usize; 2];
    for (round, n) in [1, 7, 1023, 2049, 4099, 151_936, 262_145, 300_001]
        .into_iter()
        .cycle()
        .take(28)
        .enumerate()
    {
        let mut logits = rng.floats(n);
        // Rounds take turns: plain values, a few specials, nothing but specials.
        for (i, v) in logits.iter_mut().enumerate() {
            let pick = (rng.next() % specials.len() as u64) as usize;
            match round % 3 {
                1 if i % 97 == 5 => *v = specials[pick],
                2 => *v = specials[pick],
                _ => {}
            }
        }
        // Every other plain round ends in one NaN, +inf or -inf.
        if round % 6 == 3 {
            logits[n - 1] = specials[(round / 6) % 3];
        }
        let buffer = put(&gpu, &to_bytes(&logits));
        let space = ArgmaxScratch {
            counts: scratch.ptr(),
            rows: 1,
        };
        gpu.argmax_logits(buffer.ptr(), n, 1, out.ptr(), space, None)
            .unwrap();
        let got = get(&gpu, &out, 1)[0].to_bits();
        let greedy = SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        };
        let want = if logits.iter().all(|v| v.is_finite()) {
            Sampler::new(greedy).sample(&logits, &[])
        } else {
            NON_FINITE_CHOICE
        };
        assert_eq!(got, want, "round {round}, {n} logits");
        checked[usize::from(want == NON_FINITE_CHOICE)] += 1;
    }
    assert!(
        checked[0] > 0 && checked[1] > 0,
        "both kinds of rounds: {checked:?}"
    );
    // Several rows in one launch, in scratch for more rows: 3 rows, then all 8 (whose counts
    // the first launch must have left zeroed).
    let (rows, n) = (8, 151_936);
    let logits = rng.floats(rows * n);
    let buffer = put(&gpu, &to_bytes(&logits));
    let scratch = put(&gpu, &vec![0; ArgmaxScratch::bytes(rows)]);
    let space = ArgmaxScratch {
        counts: scratch.ptr(),
        rows,
    };
    let out = gpu.alloc(4 * rows, "test").unwrap();
    for launched in [3, rows] {
        gpu.argmax_logits(buffer.ptr(), n, launched, out.ptr(), space, None)
            .unwrap();
        let got = get(&gpu, &out, launched);
        for (r, got) in got.iter().enumerate() {
            let want = greedy_choice(&logits[r * n..][..n]);
            assert_eq!(got.to_bits(), want, "row {r} of {launched}");
        }
    }
}

/// Under a mask the device's choice equals `masked_greedy_choice`'s: masks of every density
/// (one id, a few, about half, all), shorter than the vocabulary (the ids past them not
/// allowed), ties between allowed ids, a masked-out maximum, no allowed id (0); one row of
/// several, its mask at a row offset, as `Scratch::choose_among` launches it. A non-finite logit
/// among the masked-out ids still gives [`NON_FINITE_CHOICE`].
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn masked_argmax_matches_the_masked_greedy_sampler() {
    let gpu = gpu();
    let mut rng = Rng(0x5eed_1234);
    let (rows, n): (usize, usize) = (3, 151_936);
    let words = n.div_ceil(32);
    let scratch = put(&gpu, &vec![0; ArgmaxScratch::bytes(rows)]);
    let space = ArgmaxScratch {
        counts: scratch.ptr(),
        rows,
    };
    let out = gpu.alloc(4 * rows, "test").unwrap();
    let densities: [u64; 5] = [0, 1, 50, 500, 1000];
    for (round, &per_mille) in densities.iter().cycle().take(10).enumerate() {
        let mut logits = rng.floats(rows * n);
        let row = round % rows;
        let row_logits = &mut logits[row * n..][..n];
        // Ties: a run of equal values, some allowed, some not.
        for v in &mut row_logits[1000..1100] {
            *v = 9.0;
        }
        let mut mask: Vec<u32> = (0..words)
            .map(|_| {
                (0..32).fold(0u32, |word, bit| {
                    let on = rng.next() % 1000 < per_mille;
                    word | (u32::from(on) << bit)
                })
            })
            .collect();
        if per_mille == 1 {
            mask.iter_mut().for_each(|w| *w = 0);
            mask[n / 64] = 1 << 7;
        }
        // Every other round, a mask shorter than the vocabulary.
        if round % 2 == 1 {
            mask.truncate(words / 2);
        }
        let expected = masked_greedy_choice(row_logits, &mask);
        let buffer = put(&gpu, &to_bytes(&logits));
        let masks = put(&gpu, &to_bytes_u32(&mask));
        let allowed = AllowedMask {
            ptr: masks.ptr(),
            words: mask.len(),
        };
        let row_logits = buffer.ptr().offset(row * n);
        let row_out = out.ptr().offset(row);
        gpu.argmax_logits(row_logits, n, 1, row_out, space, Some(allowed))
            .unwrap();
        let got = get(&gpu, &out, rows)[row].to_bits();
        assert_eq!(
            got,
            expected,
            "round {round}: {per_mille}‰ allowed, {} words",
            mask.len()
        );
        if per_mille == 1000 && round % 2 == 0 {
            assert_eq!(expected, greedy_choice(&logits[row * n..][..n]));
        }
    }
    // A NaN the mask hides still stops the choice.
    let mut logits = rng.floats(n);
    logits[77] = f32::NAN;
    let mut mask = vec![0u32; words];
    mask[0] = 1;
    let buffer = put(&gpu, &to_bytes(&logits));
    let masks = put(&gpu, &to_bytes_u32(&mask));
    let allowed = AllowedMask {
        ptr: masks.ptr(),
        words,
    };
    gpu.argmax_logits(buffer.ptr(), n, 1, out.ptr(), space, Some(allowed))
        .unwrap();
    assert_eq!(get(&gpu, &out, 1)[0].to_bits(), NON_FINITE_CHOICE);
}

fn to_bytes_u32(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}
