//! The sampling fields both APIs share, read into one [`SamplingParams`]: the contract's
//! (`temperature`, `top_k`, `top_p`, `min_p`, `repetition_penalty`) and the OpenAI-era ones
//! (`frequency_penalty`, `presence_penalty`, `repeat_last_n`, `logit_bias`, `min_tokens`).
//! The seed and `logprobs` are read by each API (their shapes differ).

use serde_json::Value;
use worker_common::sampling::SamplingParams;

use super::fields::Fields;

/// Most `logit_bias` entries.
pub const MAX_LOGIT_BIAS: usize = 1024;
/// Most alternatives `logprobs` may ask for.
pub const MAX_TOP_LOGPROBS: u64 = 20;
/// Largest `min_tokens`.
const MAX_MIN_TOKENS: u64 = 2048;
/// Largest `repeat_last_n` (far beyond any context this worker serves).
const MAX_REPEAT_LAST_N: i64 = 1 << 20;

impl Fields<'_> {
    /// The shared sampling fields; `seed` and `logprobs` are left at their defaults.
    pub(super) fn sampling(&mut self) -> SamplingParams {
        let penalty = |p: f64| (-2.0..=2.0).contains(&p);
        SamplingParams {
            temperature: self.float("temperature", 1.0, |t| (0.0..=2.0).contains(&t)),
            top_k: self.top_k(),
            top_p: self.float("top_p", 1.0, |p| (0.0..=1.0).contains(&p)),
            min_p: self.float("min_p", 0.0, |p| (0.0..=1.0).contains(&p)),
            repetition_penalty: self.float("repetition_penalty", 1.0, |r| r > 0.0 && r <= 2.0),
            frequency_penalty: self.float("frequency_penalty", 0.0, penalty),
            presence_penalty: self.float("presence_penalty", 0.0, penalty),
            penalty_last_n: self.repeat_last_n(),
            logit_bias: self.logit_bias(),
            min_tokens: self
                .integer("min_tokens", 0, MAX_MIN_TOKENS, "range(0..=2048)")
                .map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX)),
            ..SamplingParams::default()
        }
    }

    /// `repeat_last_n` as llama.cpp reads it: -1 = the whole history, 0 = penalties off, n = the
    /// last n ids.
    fn repeat_last_n(&mut self) -> Option<u32> {
        let value = self.get("repeat_last_n")?;
        match value.as_i64() {
            Some(-1) => None,
            Some(n) if (0..=MAX_REPEAT_LAST_N).contains(&n) => u32::try_from(n).ok(),
            Some(_) => {
                let message =
                    format!("must be -1 (whole history), 0 (off) or up to {MAX_REPEAT_LAST_N}");
                self.fail("repeat_last_n", "range(-1..=1048576)", message, Some(value));
                None
            }
            None => {
                self.wrong_type("repeat_last_n", "integer", value);
                None
            }
        }
    }

    /// `logit_bias`: `{"<token id>": bias}` with biases in -100..=100, in id order (the ids are
    /// checked against the vocabulary after validation, when the model is known).
    fn logit_bias(&mut self) -> Vec<(u32, f32)> {
        let Some(value) = self.get("logit_bias") else {
            return Vec::new();
        };
        let Value::Object(entries) = value else {
            self.wrong_type("logit_bias", "object", value);
            return Vec::new();
        };
        if !self.within_count("logit_bias", entries.len(), MAX_LOGIT_BIAS, "entries") {
            return Vec::new();
        }
        let mut biases = Vec::with_capacity(entries.len());
        for (key, bias) in entries {
            let field = format!("logit_bias.{key}");
            let Ok(id) = key.parse::<u32>() else {
                let message = format!("keys are token ids (decimal integers), got {key:?}");
                self.fail(&field, "token_id", message, None);
                continue;
            };
            match bias.as_f64() {
                Some(b) if (-100.0..=100.0).contains(&b) => biases.push((id, b as f32)),
                Some(_) => {
                    let message = "must be between -100 and 100".into();
                    self.fail(&field, "range(-100.0..=100.0)", message, Some(bias));
                }
                None => self.wrong_type(&field, "number", bias),
            }
        }
        biases.sort_unstable_by_key(|&(id, _)| id);
        biases
    }

    /// An integer count of alternatives for `field` (`logprobs` or `top_logprobs`), 0..=20.
    pub(super) fn top_logprobs(&mut self, field: &str) -> Option<u32> {
        self.integer(field, 0, MAX_TOP_LOGPROBS, "range(0..=20)")
            .and_then(|n| u32::try_from(n).ok())
    }
}
