//! Each processor's effect on the logits, and log-probabilities against a hand-computed
//! log-softmax.

use std::collections::BTreeSet;

use super::super::{Choice, Sampler, SamplingParams};
use super::Context;

fn greedy(extra: SamplingParams) -> Sampler {
    Sampler::new(SamplingParams {
        temperature: 0.0,
        ..extra
    })
}

fn choose(sampler: &mut Sampler, logits: &[f32], history: &[u32], prompt_len: usize) -> Choice {
    let end = BTreeSet::from([0]);
    let context = Context {
        history,
        prompt_len,
        end_of_generation: &end,
        allowed: None,
    };
    sampler.choose(logits, &context)
}

#[test]
fn logit_bias_can_force_or_ban_a_token() {
    let logits = [0.0, 5.0, 1.0, 2.0];
    let forced = SamplingParams {
        logit_bias: vec![(2, 100.0)],
        ..SamplingParams::default()
    };
    assert_eq!(choose(&mut greedy(forced), &logits, &[3], 1).token, 2);
    let banned = SamplingParams {
        logit_bias: vec![(1, -100.0), (99, 50.0)],
        ..SamplingParams::default()
    };
    assert_eq!(
        choose(&mut greedy(banned), &logits, &[3], 1).token,
        3,
        "the argmax is banned; an id outside the vocabulary is ignored"
    );
}

#[test]
fn frequency_and_presence_count_generated_ids_only() {
    // Token 1 leads by 2.5; the prompt holds it three times, the generated ids twice.
    let logits = [0.0, 4.5, 2.0];
    let history = [1, 1, 1, 1, 1];
    let frequency = SamplingParams {
        frequency_penalty: 1.0,
        ..SamplingParams::default()
    };
    let choice = choose(&mut greedy(frequency.clone()), &logits, &history, 3);
    assert_eq!(choice.token, 1, "4.5 - 2 × 1.0 = 2.5 > 2.0");
    let more = SamplingParams {
        frequency_penalty: 1.5,
        ..frequency
    };
    assert_eq!(
        choose(&mut greedy(more), &logits, &history, 3).token,
        2,
        "4.5 - 2 × 1.5 = 1.5 < 2.0"
    );
    let presence = |penalty| SamplingParams {
        presence_penalty: penalty,
        ..SamplingParams::default()
    };
    assert_eq!(
        choose(&mut greedy(presence(2.0)), &logits, &history, 3).token,
        1,
        "presence counts once: 4.5 - 2.0 = 2.5 > 2.0"
    );
    assert_eq!(
        choose(&mut greedy(presence(3.0)), &logits, &history, 3).token,
        2
    );
    let all_prompt = choose(&mut greedy(presence(3.0)), &logits, &history, 5);
    assert_eq!(all_prompt.token, 1, "prompt ids are not penalised");
}

#[test]
fn the_penalty_window_is_the_last_n_ids() {
    let logits = [0.0, 3.0, 2.0];
    let repeat = |last_n| SamplingParams {
        repetition_penalty: 2.0,
        penalty_last_n: last_n,
        ..SamplingParams::default()
    };
    // Token 1 is in the history, but only at its start: 3.0 / 2 = 1.5 < 2.0 when it counts.
    let history = [1, 0, 0, 0];
    assert_eq!(
        choose(&mut greedy(repeat(None)), &logits, &history, 4).token,
        2
    );
    assert_eq!(
        choose(&mut greedy(repeat(Some(2))), &logits, &history, 4).token,
        1,
        "outside the window of 2"
    );
    assert_eq!(
        choose(&mut greedy(repeat(Some(0))), &logits, &history, 4).token,
        1,
        "0 turns penalties off"
    );
}

#[test]
fn min_tokens_masks_the_end_of_generation_until_reached() {
    let logits = [9.0, 1.0, 2.0];
    let params = SamplingParams {
        min_tokens: 2,
        ..SamplingParams::default()
    };
    let mut sampler = greedy(params);
    assert_eq!(
        choose(&mut sampler, &logits, &[5, 7], 1).token,
        2,
        "1 generated"
    );
    assert_eq!(
        choose(&mut sampler, &logits, &[5, 7, 2], 1).token,
        0,
        "2 generated"
    );
}

/// log-softmax of `logits` in f64.
fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits
        .iter()
        .fold(f64::NEG_INFINITY, |m, &l| m.max(f64::from(l)));
    let sum: f64 = logits.iter().map(|&l| (f64::from(l) - max).exp()).sum();
    logits
        .iter()
        .map(|&l| f64::from(l) - max - sum.ln())
        .collect()
}

#[test]
fn logprobs_are_the_log_softmax_of_the_processed_logits() {
    let logits = [0.5, 3.0, -1.0, 2.0];
    let params = SamplingParams {
        logprobs: Some(2),
        ..SamplingParams::default()
    };
    let choice = choose(&mut greedy(params), &logits, &[3], 1);
    let expected = log_softmax(&logits);
    let logprobs = choice.logprobs.unwrap();
    assert_eq!(choice.token, 1);
    assert!((logprobs.logprob - expected[1]).abs() < 1e-12);
    let top: Vec<u32> = logprobs.top.iter().map(|&(id, _)| id).collect();
    assert_eq!(top, [1, 3]);
    assert!((logprobs.top[1].1 - expected[3]).abs() < 1e-12);

    let biased = SamplingParams {
        logprobs: Some(0),
        logit_bias: vec![(2, 4.0)],
        ..SamplingParams::default()
    };
    let choice = choose(&mut greedy(biased), &logits, &[3], 1);
    let expected = log_softmax(&[0.5, 3.0, 3.0, 2.0]);
    assert_eq!(choice.token, 1, "a tie goes to the lower id");
    let logprobs = choice.logprobs.unwrap();
    assert!((logprobs.logprob - expected[1]).abs() < 1e-12);
    assert!(logprobs.top.is_empty());
}

#[test]
fn asking_for_logprobs_does_not_change_the_draws() {
    let logits: Vec<f32> = (0..50).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
    let params = SamplingParams {
        temperature: 0.8,
        top_k: 20,
        top_p: 0.9,
        seed: 5,
        ..SamplingParams::default()
    };
    let mut plain = Sampler::new(params.clone());
    let mut with = Sampler::new(SamplingParams {
        logprobs: Some(3),
        ..params
    });
    for _ in 0..100 {
        let a = choose(&mut plain, &logits, &[1], 1);
        let b = choose(&mut with, &logits, &[1], 1);
        assert_eq!(a.token, b.token);
        assert!(a.logprobs.is_none() && b.logprobs.is_some());
    }
}

#[test]
fn a_constrained_greedy_step_takes_the_best_allowed_token() {
    let logits = [0.5, 3.0, f32::NAN, 2.0, 2.0];
    let allowed = [0b11100u32];
    let end = BTreeSet::new();
    let context = |allowed| Context {
        history: &[1],
        prompt_len: 1,
        end_of_generation: &end,
        allowed,
    };
    let mut plain = greedy(SamplingParams::default());
    assert_eq!(
        plain.choose(&logits, &context(Some(&allowed))).token,
        3,
        "NaN loses, a tie goes low"
    );
    let mut processed = greedy(SamplingParams {
        logprobs: Some(1),
        ..SamplingParams::default()
    });
    let choice = processed.choose(&logits, &context(Some(&allowed)));
    assert_eq!(choice.token, 3, "the candidate path agrees");
    assert_eq!(choice.logprobs.unwrap().top[0].0, 3);
}
