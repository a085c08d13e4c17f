//! Unit tests: each stage on hand-computed examples, the chain order, determinism and hostile input.

use super::*;

fn params(temperature: f32) -> SamplingParams {
    SamplingParams {
        temperature,
        ..SamplingParams::default()
    }
}

/// A fixed pseudo-random sequence of `u64`s from `seed` (xorshift64).
fn xorshift(mut state: u64) -> impl FnMut() -> u64 {
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    }
}

fn candidates(logits: &[f64]) -> Vec<Candidate> {
    logits
        .iter()
        .enumerate()
        .map(|(i, &logit)| Candidate {
            id: i as u32,
            logit,
            p: 0.0,
        })
        .collect()
}

fn ids(c: &[Candidate]) -> Vec<u32> {
    c.iter().map(|c| c.id).collect()
}

fn sorted_ids(c: &[Candidate]) -> Vec<u32> {
    let mut v = ids(c);
    v.sort_unstable();
    v
}

/// Runs softmax and the descending sort, as the chain does before top-p.
fn probabilities(logits: &[f64]) -> Vec<Candidate> {
    let mut c = candidates(logits);
    assert!(softmax(&mut c));
    c.sort_unstable_by(by_probability);
    c
}

/// The repetition penalty alone over the whole of `history`.
fn apply_penalty(candidates: &mut [Candidate], seen: &mut Vec<u64>, history: &[u32], penalty: f64) {
    let penalties = process::Penalties {
        repeat: Some(penalty),
        frequency: 0.0,
        presence: 0.0,
    };
    process::penalize_window(candidates, seen, (history, 0), 0, penalties);
}

fn frequencies(sampler: &mut Sampler, logits: &[f32], n: usize) -> Vec<f64> {
    let mut counts = vec![0usize; logits.len()];
    for _ in 0..n {
        counts[sampler.sample(logits, &[]) as usize] += 1;
    }
    counts.iter().map(|&c| c as f64 / n as f64).collect()
}

#[test]
fn greedy_picks_argmax() {
    let mut s = Sampler::new(params(0.0));
    assert_eq!(s.sample(&[0.1, 2.5, -1.0, 2.4], &[]), 1);
}

#[test]
fn greedy_ties_go_to_lowest_id() {
    let mut s = Sampler::new(params(0.0));
    assert_eq!(s.sample(&[1.0, 3.0, 3.0, 3.0], &[]), 1);
    // -0.0 and 0.0 are equal logits, so the lower id wins.
    assert_eq!(s.sample(&[-1.0, -0.0, 0.0], &[]), 1);
}

#[test]
fn greedy_ignores_filters_and_uses_the_penalty() {
    let p = SamplingParams {
        temperature: 0.0,
        top_k: 1,
        top_p: 0.1,
        min_p: 0.9,
        repetition_penalty: 2.0,
        seed: 7,
        ..SamplingParams::default()
    };
    let mut s = Sampler::new(p);
    // Token 0 (4.0) is penalised to 2.0, under token 1 (3.0).
    assert_eq!(s.sample(&[4.0, 3.0, 1.0], &[0]), 1);
    assert_eq!(s.sample(&[4.0, 3.0, 1.0], &[]), 0);
}

/// The greedy fast path against the chain's definition (sanitize, penalize the candidates,
/// highest logit with the lowest id on ties), over values that tie, NaN, ±inf and f32::MAX.
#[test]
fn greedy_equals_the_argmax_of_the_penalized_candidates() {
    let specials = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MAX,
        0.0,
        -0.0,
        2.5,
        -2.5,
    ];
    let mut next = xorshift(0x1234_5678_9abc_def0u64);
    for round in 0..400 {
        let len = 1 + (next() % 70) as usize;
        let logits: Vec<f32> = (0..len)
            .map(|_| specials[(next() % specials.len() as u64) as usize])
            .collect();
        let history: Vec<u32> = (0..next() % 6).map(|_| (next() % 80) as u32).collect();
        let penalty = [1.0, 1.3, 0.7][round % 3];
        let mut sampler = Sampler::new(SamplingParams {
            temperature: 0.0,
            repetition_penalty: penalty,
            ..SamplingParams::default()
        });
        let mut c: Vec<Candidate> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| Candidate {
                id: i as u32,
                logit: sanitize(l),
                p: 0.0,
            })
            .collect();
        if penalty != 1.0 {
            apply_penalty(&mut c, &mut Vec::new(), &history, f64::from(penalty));
        }
        let want = c
            .iter()
            .fold(c[0], |best, x| if x.logit > best.logit { *x } else { best })
            .id;
        let got = sampler.sample(&logits, &history);
        assert_eq!(
            got, want,
            "logits {logits:?}, history {history:?}, penalty {penalty}"
        );
    }
}

#[test]
fn greedy_draws_nothing_from_the_generator() {
    let mut s = Sampler::new(params(0.0));
    let before = s.rng.clone();
    s.sample(&[1.0, 2.0], &[]);
    assert_eq!(s.rng, before);
}

#[test]
fn penalty_divides_positive_and_multiplies_non_positive_logits_once_per_id() {
    let mut c = candidates(&[2.0, -1.0, 0.0, 3.0, 1.0]);
    let mut seen = Vec::new();
    // Repeated ids are penalised once; out-of-vocabulary ids are ignored.
    apply_penalty(&mut c, &mut seen, &[0, 1, 0, 2, 1, 0, 99], 2.0);
    let logits: Vec<f64> = c.iter().map(|c| c.logit).collect();
    assert_eq!(logits, vec![1.0, -2.0, 0.0, 3.0, 1.0]);
    assert!(
        seen.iter().all(|&w| w != 0),
        "bits stay set until the next call clears them"
    );
    // The next call starts from a clean bitset.
    let mut c = candidates(&[2.0, 2.0]);
    apply_penalty(&mut c, &mut seen, &[1], 2.0);
    assert_eq!(c[0].logit, 2.0);
    assert_eq!(c[1].logit, 1.0);
}

#[test]
fn penalty_below_one_boosts() {
    let mut c = candidates(&[2.0, -2.0]);
    apply_penalty(&mut c, &mut Vec::new(), &[0, 1], 0.5);
    assert_eq!((c[0].logit, c[1].logit), (4.0, -1.0));
}

#[test]
fn temperature_scales_the_distribution() {
    // logits ln 1 and ln 4: p = 0.2/0.8 at T = 1; at T = 2 they are ln 1 and ln 2, p = 1/3, 2/3.
    let logits = [0.0f32, 4.0f32.ln()];
    let at_1 = frequencies(&mut Sampler::new(params(1.0)), &logits, 50_000);
    let at_2 = frequencies(&mut Sampler::new(params(2.0)), &logits, 50_000);
    assert!((at_1[1] - 0.8).abs() < 0.01, "{at_1:?}");
    assert!((at_2[1] - 2.0 / 3.0).abs() < 0.01, "{at_2:?}");
}

#[test]
fn top_k_keeps_the_k_highest_with_ties_to_lower_ids() {
    let mut c = candidates(&[1.0, 5.0, 3.0, 5.0, 3.0, -1.0]);
    assert!(top_k(&mut c, 3));
    assert_eq!(sorted_ids(&c), vec![1, 2, 3]);
    let mut c = candidates(&[1.0, 2.0]);
    assert!(!top_k(&mut c, 0), "0 = off");
    assert!(!top_k(&mut c, 2), "k ≥ vocabulary = off");
    assert_eq!(c.len(), 2);
}

#[test]
fn softmax_is_normalised_and_stable_for_large_logits() {
    let mut c = candidates(&[1000.0, 1000.0 + 3.0f64.ln()]);
    assert!(softmax(&mut c));
    assert!((c[0].p - 0.25).abs() < 1e-12 && (c[1].p - 0.75).abs() < 1e-12);
    let mut c = candidates(&[f64::NEG_INFINITY; 3]);
    assert!(!softmax(&mut c));
}

#[test]
fn top_p_keeps_the_smallest_prefix_reaching_p() {
    let logits = [0.2f64.ln(), 0.5f64.ln(), 0.3f64.ln()];
    let mut c = probabilities(&logits);
    top_p(&mut c, 0.75);
    assert_eq!(ids(&c), vec![1, 2]);
    let mut c = probabilities(&logits);
    top_p(&mut c, 0.85);
    assert_eq!(ids(&c), vec![1, 2, 0]);
    let mut c = probabilities(&logits);
    top_p(&mut c, 0.4);
    assert_eq!(ids(&c), vec![1]);
    let mut c = probabilities(&logits);
    top_p(&mut c, 0.0);
    assert_eq!(ids(&c), vec![1], "at least one token");
}

#[test]
fn top_p_breaks_probability_ties_by_id() {
    let mut c = probabilities(&[0.0, 1.0, 1.0, 1.0]);
    top_p(&mut c, 0.5);
    assert_eq!(ids(&c), vec![1, 2]);
}

#[test]
fn top_p_prefix_matches_a_full_sort() {
    // Flat enough that the nucleus needs several widenings of the sorted prefix (1024 → 8192 → …),
    // with many tied probabilities to exercise the id tie-break.
    for (width, p) in [
        (20_000, 0.9),
        (20_000, 0.05),
        (20_000, 1.0 - 1e-12),
        (500, 0.5),
    ] {
        let logits: Vec<f64> = (0..width)
            .map(|i| f64::from((i * 7919) % 97) / 40.0)
            .collect();
        let mut reference = probabilities(&logits);
        let keep = nucleus_len(&reference, p).unwrap_or(reference.len());
        reference.truncate(keep);
        let mut c = candidates(&logits);
        assert!(softmax(&mut c));
        top_p(&mut c, p);
        assert_eq!(c, reference, "width {width}, p {p}");
    }
}

#[test]
fn min_p_keeps_tokens_near_the_maximum() {
    // p = 0.5, 0.3, 0.15, 0.05; threshold 0.5 × 0.5 = 0.25.
    let mut c = candidates(&[0.5f64.ln(), 0.3f64.ln(), 0.15f64.ln(), 0.05f64.ln()]);
    assert!(softmax(&mut c));
    min_p(&mut c, 0.5);
    assert_eq!(ids(&c), vec![0, 1]);
    let mut c = candidates(&[0.0, 0.0, -1.0]);
    assert!(softmax(&mut c));
    min_p(&mut c, 1.0);
    assert_eq!(ids(&c), vec![0, 1], "the maxima always survive");
}

#[test]
fn draw_walks_cumulative_probabilities_in_order() {
    let mut c = candidates(&[0.5f64.ln(), f64::NEG_INFINITY, 0.3f64.ln(), 0.2f64.ln()]);
    assert!(softmax(&mut c));
    assert_eq!(draw(&c, 0.0), 0);
    assert_eq!(draw(&c, 0.49), 0);
    assert_eq!(draw(&c, 0.51), 2);
    assert_eq!(draw(&c, 0.79), 2);
    assert_eq!(draw(&c, 0.81), 3);
    assert_eq!(
        draw(&c, 1.0),
        3,
        "never the zero-probability token, even at the end"
    );
}

#[test]
fn penalty_runs_before_top_k() {
    // Without the penalty top-1 keeps token 0; penalised to 1.5 it loses to token 1.
    let p = SamplingParams {
        temperature: 1.0,
        top_k: 1,
        repetition_penalty: 2.0,
        ..SamplingParams::default()
    };
    let mut s = Sampler::new(p);
    for _ in 0..100 {
        assert_eq!(s.sample(&[3.0, 2.9, 1.0], &[0]), 1);
        assert_eq!(s.sample(&[3.0, 2.9, 1.0], &[2]), 0);
    }
}

#[test]
fn temperature_runs_before_top_p() {
    // p = 0.8/0.2 at T = 1: top-p 0.75 keeps one token. At T = 2 (p = 2/3, 1/3) it keeps both.
    let logits = [4.0f32.ln(), 0.0];
    let top_p = |temperature| SamplingParams {
        temperature,
        top_p: 0.75,
        ..SamplingParams::default()
    };
    let at_1 = frequencies(&mut Sampler::new(top_p(1.0)), &logits, 10_000);
    let at_2 = frequencies(&mut Sampler::new(top_p(2.0)), &logits, 10_000);
    assert_eq!(at_1, vec![1.0, 0.0]);
    assert!((at_2[1] - 1.0 / 3.0).abs() < 0.02, "{at_2:?}");
}

#[test]
fn top_k_probabilities_feed_top_p() {
    // After top-2, p = 0.5/0.5 over ids 0 and 1, so top-p 0.5 keeps only id 0 (tie → lower id).
    let p = SamplingParams {
        top_k: 2,
        top_p: 0.5,
        ..SamplingParams::default()
    };
    let mut s = Sampler::new(p);
    for _ in 0..100 {
        assert_eq!(s.sample(&[1.0, 1.0, 0.9], &[]), 0);
    }
}

fn all_filters(seed: u64) -> SamplingParams {
    SamplingParams {
        temperature: 0.8,
        top_k: 40,
        top_p: 0.95,
        min_p: 0.02,
        repetition_penalty: 1.1,
        seed,
        ..SamplingParams::default()
    }
}

/// 1,000 draws over a 256-token vocabulary, the history growing with each draw.
fn run(seed: u64) -> Vec<u32> {
    let logits: Vec<f32> = (0..256).map(|i| ((i * 37) % 101) as f32 / 20.0).collect();
    let mut sampler = Sampler::new(all_filters(seed));
    let mut history = vec![3, 5, 7];
    for _ in 0..1_000 {
        let id = sampler.sample(&logits, &history);
        history.push(id);
    }
    history.split_off(3)
}

#[test]
fn same_seed_same_sequence() {
    let a = run(42);
    assert_eq!(a, run(42));
    let distinct = {
        let mut d = a.clone();
        d.sort_unstable();
        d.dedup();
        d.len()
    };
    assert!(
        distinct > 5,
        "the filters leave room to vary: {distinct} distinct ids"
    );
}

#[test]
fn different_seeds_different_sequences() {
    assert_ne!(run(1), run(2));
}

#[test]
fn temperature_one_reproduces_the_distribution() {
    let logits = [0.5f32.ln(), 0.3f32.ln(), 0.2f32.ln()];
    let f = frequencies(&mut Sampler::new(params(1.0)), &logits, 100_000);
    for (got, want) in f.iter().zip([0.5, 0.3, 0.2]) {
        assert!((got - want).abs() < 0.01, "{f:?}");
    }
}

#[test]
fn nan_and_inf_logits_do_not_panic() {
    let nan = f32::NAN;
    let inf = f32::INFINITY;
    let mut greedy = Sampler::new(params(0.0));
    assert_eq!(greedy.sample(&[nan, 1.0, nan], &[]), 1);
    assert_eq!(greedy.sample(&[nan, -inf, nan], &[]), 0);
    assert_eq!(
        greedy.sample(&[1.0, inf, inf], &[1]),
        1,
        "+inf survives penalty as f32::MAX"
    );
    let mut s = Sampler::new(all_filters(3));
    for _ in 0..100 {
        assert_eq!(
            s.sample(&[nan, 0.5, nan, -inf], &[1]),
            1,
            "NaN is -inf, never drawn"
        );
        assert_eq!(s.sample(&[-inf, -inf, nan], &[]), 0, "all -inf → lowest id");
        let id = s.sample(&[0.0, inf, -inf, inf], &[]);
        assert!(
            id == 1 || id == 3,
            "+inf tokens take all the mass, got {id}"
        );
    }
    assert_eq!(s.sample(&[], &[]), 0);
}

#[test]
fn out_of_range_parameters_do_not_panic() {
    let p = SamplingParams {
        temperature: f32::INFINITY,
        top_k: u32::MAX,
        top_p: f32::NAN,
        min_p: 5.0,
        repetition_penalty: -1.0,
        seed: 0,
        ..SamplingParams::default()
    };
    let mut s = Sampler::new(p);
    // T = inf flattens the finite logits; min-p above 1 acts as 1, so all tie and survive.
    let f = frequencies(&mut s, &[10.0, -10.0, f32::NEG_INFINITY], 10_000);
    assert!((f[0] - 0.5).abs() < 0.02 && f[2] == 0.0, "{f:?}");
    let mut nan_t = Sampler::new(params(f32::NAN));
    assert_eq!(
        nan_t.sample(&[0.0, 1.0], &[]),
        1,
        "NaN temperature is greedy"
    );
}

#[test]
fn full_width_vocabulary() {
    const V: usize = 262_144;
    let logits: Vec<f32> = (0..V).map(|i| ((i * 7919) % 1000) as f32 / 100.0).collect();
    let history: Vec<u32> = (0..2_000).map(|i| (i * 131) % V as u32).collect();
    let mut all = Sampler::new(all_filters(9));
    let mut top_p_only = Sampler::new(SamplingParams {
        top_p: 0.9,
        ..SamplingParams::default()
    });
    let mut defaults = Sampler::new(SamplingParams::default());
    let mut greedy = Sampler::new(params(0.0));
    for _ in 0..3 {
        for s in [&mut all, &mut top_p_only, &mut defaults, &mut greedy] {
            assert!((s.sample(&logits, &history) as usize) < V);
        }
    }
    // The buffers keep their capacity: no allocation per token after the first.
    let capacity = all.candidates.capacity();
    all.sample(&logits, &history);
    assert_eq!(all.candidates.capacity(), capacity);
}

#[test]
fn widening_keeps_the_decimal_value() {
    assert_eq!(params::widen(0.8), 0.8);
    assert_eq!(params::widen(1.0), 1.0);
    assert!(params::widen(f32::NAN).is_nan());
}

#[test]
fn defaults_match_the_contract() {
    let d = SamplingParams::default();
    assert_eq!(
        (d.temperature, d.top_k, d.top_p, d.min_p),
        (1.0, 0, 1.0, 0.0)
    );
    assert_eq!(d.repetition_penalty, 1.0);
    assert!(!d.is_greedy() && params(0.0).is_greedy());
    let r = d.resolve();
    assert_eq!((r.top_p, r.min_p, r.penalties.repeat), (None, None, None));
}

/// The vectorized greedy scan (AVX2 where the CPU has it, and the baseline build) against the
/// sanitized definition over long rows: ties far apart, NaN and ±inf scattered, maxima in the
/// tail past the last whole sixteen, all -inf and all NaN.
#[test]
fn vectorized_argmax_equals_the_sanitized_scan() {
    let mut next = xorshift(0x0BAD_5EED_1234_5678u64);
    let specials = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MAX,
        3.0,
        -0.0,
    ];
    for round in 0..300 {
        let len = 1 + (next() % 3000) as usize;
        let mut logits: Vec<f32> = (0..len)
            .map(|_| ((next() % 2001) as f32 - 1000.0) / 7.0)
            .collect();
        for _ in 0..round % 5 {
            let at = (next() % len as u64) as usize;
            logits[at] = specials[(next() % specials.len() as u64) as usize];
        }
        if round % 7 == 0 {
            let at = len - 1 - (next() % 15.min(len as u64)) as usize;
            logits[at] = 1e6;
        }
        let want = argmax_sanitized(&logits);
        assert_eq!(argmax_f32(&logits), want, "round {round}");
        assert_eq!(argmax_f32_lanes(&logits), want, "round {round}, baseline");
    }
    for special in [f32::NEG_INFINITY, f32::NAN] {
        let logits = vec![special; 100];
        assert_eq!(argmax_f32(&logits), 0);
    }
}
