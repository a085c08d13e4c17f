//! The request's sampling fields and their resolution into the f64 settings the chain runs on.

use super::process::Penalties;

/// Sampling settings of one `/execute` request (contract: `specs/CONTRACT.md`).
///
/// Ranges are validated by the HTTP layer. The sampler never panics on values outside them: it
/// resolves each field as documented below (out-of-range values mostly mean "off").
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Divides the (penalised) logits before the softmax; < 1 sharpens, > 1 flattens.
    /// `0.0` (or anything not > 0, NaN included) = greedy: argmax of the penalised logits, lowest id
    /// on ties, every later stage skipped and no random number drawn. Contract range `0.0..=2.0`.
    pub temperature: f32,
    /// Keep only the `top_k` highest logits (ties: lower id first). `0` or ≥ vocabulary = off.
    pub top_k: u32,
    /// Nucleus: keep the smallest prefix of the candidates, by probability descending (ties: lower
    /// id first), whose cumulative probability is ≥ `top_p`; at least one token survives.
    /// `1.0` (or more, or NaN) = off; ≤ 0 keeps only the most probable token.
    pub top_p: f32,
    /// Keep tokens whose probability is ≥ `min_p` × the highest probability.
    /// `0.0` (or less, or NaN) = off; values above 1 act as 1.
    pub min_p: f32,
    /// llama.cpp's `penalty_repeat` over prompt and generated ids: each distinct id in the
    /// history has its logit divided by the penalty when positive, multiplied otherwise.
    /// `1.0` = off; values that are not finite and > 0 are treated as off. Contract range `(0, 2]`.
    pub repetition_penalty: f32,
    /// Seeds the ChaCha20 generator (`seed_from_u64`); the same seed replays the same draws.
    pub seed: u64,
    /// OpenAI's frequency penalty: subtracted from an id's logit once per time it was generated
    /// within the penalty window (prompt ids do not count). `0.0` = off; range `-2.0..=2.0`.
    pub frequency_penalty: f32,
    /// OpenAI's presence penalty: subtracted once from every id generated within the penalty
    /// window. `0.0` = off; range `-2.0..=2.0`.
    pub presence_penalty: f32,
    /// The penalty window (llama.cpp's `repeat_last_n`): the last `n` ids of the history;
    /// `None` = the whole history (prompt and generated), `Some(0)` = every penalty off.
    pub penalty_last_n: Option<u32>,
    /// Added to the logits of the given ids before anything else (OpenAI's `logit_bias`, range
    /// `-100.0..=100.0`); ids outside the vocabulary are ignored.
    pub logit_bias: Vec<(u32, f32)>,
    /// End-of-generation ids are masked until this many tokens are generated.
    pub min_tokens: u32,
    /// Report the chosen token's log-probability and this many most probable alternatives.
    pub logprobs: Option<u32>,
}

impl Default for SamplingParams {
    /// The contract's defaults (every filter off, T = 1) with seed 0; the HTTP layer generates and
    /// reports a seed when the request has none.
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            seed: 0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            penalty_last_n: None,
            logit_bias: Vec::new(),
            min_tokens: 0,
            logprobs: None,
        }
    }
}

impl SamplingParams {
    /// Whether these settings select greedy decoding (temperature not > 0).
    pub fn is_greedy(&self) -> bool {
        self.temperature.is_nan() || self.temperature <= 0.0
    }

    /// The settings as the chain applies them: widened to f64, "off" values as `None`.
    pub(super) fn resolve(&self) -> Resolved {
        let temperature = widen(self.temperature);
        let top_p = widen(self.top_p);
        let min_p = widen(self.min_p);
        let penalty = widen(self.repetition_penalty);
        let window_open = self.penalty_last_n != Some(0);
        let repeat = (penalty > 0.0 && penalty.is_finite() && penalty != 1.0).then_some(penalty);
        let finite_or_off = |x: f32| {
            let x = widen(x);
            if x.is_finite() && window_open { x } else { 0.0 }
        };
        Resolved {
            // +inf would turn -inf logits into NaN (-inf / inf); the largest finite value instead
            // gives the limit behaviour, a uniform draw over the finite logits.
            temperature: (temperature > 0.0).then_some(temperature.min(f64::MAX)),
            top_k: usize::try_from(self.top_k).unwrap_or(usize::MAX),
            top_p: (top_p < 1.0).then_some(top_p.max(0.0)),
            min_p: (min_p > 0.0).then_some(min_p.min(1.0)),
            penalties: Penalties {
                repeat: repeat.filter(|_| window_open),
                frequency: finite_or_off(self.frequency_penalty),
                presence: finite_or_off(self.presence_penalty),
            },
        }
    }
}

/// [`SamplingParams`] resolved for the chain; `None` = stage off.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Resolved {
    /// `None` = greedy.
    pub temperature: Option<f64>,
    /// `0` = off; compared with the vocabulary at each call.
    pub top_k: usize,
    pub top_p: Option<f64>,
    pub min_p: Option<f64>,
    pub penalties: Penalties,
}

impl Resolved {
    /// Whether the frequency or presence penalty is on.
    pub fn has_additive_penalties(&self) -> bool {
        self.penalties.frequency != 0.0 || self.penalties.presence != 0.0
    }
}

/// Widens through the shortest decimal that round-trips the f32, so that a request's `0.8`
/// compares as 0.8 in f64 and not as 0.800000011920929 (which would move top-p cut-offs that
/// fall exactly on a decimal boundary). Runs once per request, not per token.
pub(super) fn widen(x: f32) -> f64 {
    x.to_string().parse().unwrap_or(f64::from(x))
}
