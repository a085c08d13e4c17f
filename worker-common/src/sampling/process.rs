//! The logit processors that run before the chain's temperature, in llama.cpp's order: logit
//! bias, the end-of-generation mask of `min_tokens`, then the penalties over the penalty
//! window (repetition over prompt and generated ids, frequency and presence over generated
//! ids only, as OpenAI and vLLM define them). Then, when asked, the log-probabilities of the
//! processed logits (OpenAI's `logprobs`: after penalties, before temperature and truncation).

use std::collections::BTreeSet;

use super::{Candidate, desc_then_id, mark_distinct, penalize};

/// What the sampler knows of a sequence besides its logits.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    /// The prompt's ids, then the generated ones.
    pub history: &'a [u32],
    /// How many ids of `history` are the prompt.
    pub prompt_len: usize,
    /// The vocabulary's end-of-generation ids (masked until `min_tokens` are generated).
    pub end_of_generation: &'a BTreeSet<u32>,
    /// A grammar's allowed ids, a bitset (bit `id % 32` of word `id / 32`); the others are
    /// masked after every other processor, and `min_tokens` does not apply.
    pub allowed: Option<&'a [u32]>,
}

impl Context<'_> {
    /// Ids generated so far.
    pub fn generated(&self) -> usize {
        self.history.len().saturating_sub(self.prompt_len)
    }

    /// The penalty window: the last `last_n` ids of the history (all when `None`).
    pub(super) fn window(&self, last_n: Option<u32>) -> (&[u32], usize) {
        let len = self.history.len();
        let start = last_n.map_or(0, |n| len.saturating_sub(n as usize));
        (&self.history[start..], start)
    }
}

/// The chosen token's log-probability and the most probable alternatives, each `(id,
/// log-probability)`, most probable first (ties: lower id).
#[derive(Debug, Clone, PartialEq)]
pub struct Logprobs {
    /// The chosen token's log-probability.
    pub logprob: f64,
    /// The `n` most probable tokens.
    pub top: Vec<(u32, f64)>,
}

/// Adds each `(id, bias)` to its logit; ids outside the vocabulary are skipped.
pub(super) fn bias(candidates: &mut [Candidate], logit_bias: &[(u32, f32)]) {
    for &(id, bias) in logit_bias {
        if let Some(c) = candidates.get_mut(id as usize) {
            c.logit += f64::from(bias);
        }
    }
}

/// Masks the end-of-generation ids while fewer than `min_tokens` tokens are generated (unless a
/// grammar decides where the output ends).
pub(super) fn mask_end(candidates: &mut [Candidate], context: &Context<'_>, min_tokens: u32) {
    if context.generated() >= min_tokens as usize || context.allowed.is_some() {
        return;
    }
    for &id in context.end_of_generation {
        if let Some(c) = candidates.get_mut(id as usize) {
            c.logit = f64::NEG_INFINITY;
        }
    }
}

/// Masks every id a grammar does not allow.
pub(super) fn mask_grammar(candidates: &mut [Candidate], allowed: &[u32]) {
    for (i, c) in candidates.iter_mut().enumerate() {
        let word = allowed.get(i / 32).copied().unwrap_or(0);
        if word & (1 << (i % 32)) == 0 {
            c.logit = f64::NEG_INFINITY;
        }
    }
}

/// The three penalties over one window of ids.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Penalties {
    /// llama.cpp's `penalty_repeat` (`None` = off).
    pub repeat: Option<f64>,
    /// Subtracted once per generated occurrence.
    pub frequency: f64,
    /// Subtracted once from every id generated at least once.
    pub presence: f64,
}

/// Applies `penalties` to `candidates` (in id order) over the ids of `window`, which starts at
/// history position `window_start`; `seen` is the sampler's scratch bitset.
pub(super) fn penalize_window(
    candidates: &mut [Candidate],
    seen: &mut Vec<u64>,
    (window, window_start): (&[u32], usize),
    prompt_len: usize,
    penalties: Penalties,
) {
    if let Some(repeat) = penalties.repeat {
        mark_distinct(seen, candidates.len(), window);
        for (i, c) in candidates.iter_mut().enumerate() {
            if seen[i / 64] & (1 << (i % 64)) != 0 {
                c.logit = penalize(c.logit, repeat);
            }
        }
    }
    if penalties.frequency == 0.0 && penalties.presence == 0.0 {
        return;
    }
    let generated_from = prompt_len.saturating_sub(window_start).min(window.len());
    let mut generated = window[generated_from..].to_vec();
    generated.sort_unstable();
    for run in generated.chunk_by(|a, b| a == b) {
        if let Some(c) = candidates.get_mut(run[0] as usize) {
            c.logit -= run.len() as f64 * penalties.frequency + penalties.presence;
        }
    }
}

/// The log-sum-exp of the candidates' logits (-inf when every one is -inf), summed in id order.
pub(super) fn log_sum_exp(candidates: &[Candidate]) -> f64 {
    let max = candidates
        .iter()
        .fold(f64::NEG_INFINITY, |m, c| m.max(c.logit));
    if !max.is_finite() {
        return max;
    }
    let sum: f64 = candidates.iter().map(|c| (c.logit - max).exp()).sum();
    max + sum.ln()
}

/// The `n` highest logits as `(id, logit - lse)`, most probable first, ties to the lower id:
/// one pass keeping a sorted list of at most `n` (n ≤ 20), no copy of the vocabulary.
pub(super) fn top_logprobs(candidates: &[Candidate], n: usize, lse: f64) -> Vec<(u32, f64)> {
    let mut top: Vec<(u32, f64)> = Vec::with_capacity(n + 1);
    if n == 0 {
        return top;
    }
    let before = |a: &(u32, f64), b: &(u32, f64)| desc_then_id(a.1, a.0, b.1, b.0).is_lt();
    for c in candidates {
        let entry = (c.id, c.logit);
        if top.len() == n && !top.last().is_some_and(|last| before(&entry, last)) {
            continue;
        }
        let at = top.partition_point(|kept| before(kept, &entry));
        top.insert(at, entry);
        top.truncate(n);
    }
    top.into_iter()
        .map(|(id, logit)| (id, logit - lse))
        .collect()
}

#[cfg(test)]
mod tests;
