//! Token sampling: the contract's chain, seeded and bit-for-bit reproducible.
//!
//! The order is fixed by `specs/CONTRACT.md`: repetition penalty (over prompt and generated ids)
//! → temperature → top-k → top-p → min-p → draw, greedy at T = 0, normalising in f64. Where the
//! contract is silent the stages follow llama.cpp's samplers:
//!
//! 1. **Penalty** (`penalty_repeat`): each *distinct* id in `history` (ids outside the vocabulary
//!    are ignored) has its logit divided by the penalty when > 0, multiplied otherwise.
//! 2. **Temperature**: logits are divided by T. At T = 0 the sampler returns the argmax of the
//!    penalised logits (lowest id on ties) and skips everything below, drawing no random number.
//! 3. **Top-k**: keeps the k highest logits, ties to the lower id, by `select_nth_unstable_by`
//!    (O(V)); only the k survivors are ever sorted.
//! 4. **Softmax** over the survivors in f64, after subtracting their maximum.
//! 5. **Top-p**: keeps the smallest prefix, by probability descending (ties: lower id), whose
//!    cumulative probability is ≥ p, at least one token. The probabilities are those after top-k,
//!    as in llama.cpp. Only the most probable candidates are sorted, in a prefix that widens until
//!    it reaches p; a flat distribution with top-k off degrades to a full sort, O(V log V).
//! 6. **Min-p**: keeps tokens with p ≥ min_p × p_max (a ratio, so it needs no renormalisation).
//! 7. **Draw**: one uniform f64 `u` in [0, 1) from the generator; the first survivor whose
//!    cumulative probability exceeds `u` × (sum of survivors' probabilities) is returned, which is
//!    the renormalised distribution without a division per token.
//!
//! **Walk order.** When top-k or top-p ran, survivors are sorted by probability descending, ties
//! to the lower id, and the draw walks that order. When neither ran (the contract's defaults) the
//! draw walks ascending ids: sorting 150k–262k candidates per token would cost more than the rest
//! of the chain, and the sampled distribution is the same. Either way the order is a function of
//! the request alone.
//!
//! **Determinism.** Every sum, maximum and sort is sequential over a fixed order with a total
//! tie-break on the id; there is no hashing and no threading. The generator is ChaCha20
//! ([`rand_chacha::ChaCha20Rng::seed_from_u64`]), whose output does not depend on the platform.
//! Each non-greedy call consumes exactly one `u64`, so draw *n* is always the *n*-th output.
//!
//! **Hostile logits.** NaN counts as -inf; +inf counts as `f32::MAX` (all arithmetic is in f64,
//! where that stays finite through penalty and temperature). If every logit is -inf the lowest
//! id, 0, is returned. An empty `logits` slice returns 0 (a caller bug, but not a panic).
//!
//! **Use.** Build one [`Sampler`] per request from the request's parameters and seed, and feed
//! it the full history (prompt + generated ids) at each step. There is deliberately no `reset`:
//! a fresh sampler per request cannot leak generator state from one request into another.

mod params;
mod process;
#[cfg(test)]
mod tests;

use std::cmp::Ordering;

use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};

use params::Resolved;
pub use params::SamplingParams;
pub use process::{Context, Logprobs};

/// One vocabulary entry on its way through the chain.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Candidate {
    id: u32,
    /// Penalised, then temperature-scaled logit; never NaN, never +inf.
    logit: f64,
    /// Probability after the softmax (0 before it).
    p: f64,
}

/// The sampler of one request: its settings, its seeded generator and reusable buffers.
///
/// After the first call with a given vocabulary size, [`Sampler::sample`] allocates nothing.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    cfg: Resolved,
    rng: ChaCha20Rng,
    candidates: Vec<Candidate>,
    /// Bit per vocabulary id: "already penalised in this call"; all zero between calls.
    seen: Vec<u64>,
    /// The processed logits by id, kept through the chain when log-probabilities are asked.
    processed: Vec<f64>,
}

/// A chosen token, with its log-probabilities when they were asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    /// The token id.
    pub token: u32,
    /// `SamplingParams::logprobs`' answer.
    pub logprobs: Option<Logprobs>,
}

impl Sampler {
    /// A sampler for one request; its generator is seeded from `params.seed`.
    pub fn new(params: SamplingParams) -> Self {
        Self {
            cfg: params.resolve(),
            rng: ChaCha20Rng::seed_from_u64(params.seed),
            params,
            candidates: Vec::new(),
            seen: Vec::new(),
            processed: Vec::new(),
        }
    }

    /// The settings this sampler was built from.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Whether [`sample`](Self::sample) is the plain argmax of the logits (T = 0 and nothing
    /// processes the logits), which a backend may have computed already.
    pub fn is_plain_greedy(&self) -> bool {
        self.cfg.temperature.is_none() && self.processes_only_repeats() && !self.penalizes()
    }

    /// Whether a repetition penalty is on.
    fn penalizes(&self) -> bool {
        self.cfg.penalties.repeat.is_some()
    }

    /// Whether nothing but the repetition penalty processes the logits before the chain.
    fn processes_only_repeats(&self) -> bool {
        let params = &self.params;
        params.logit_bias.is_empty()
            && params.min_tokens == 0
            && params.logprobs.is_none()
            && !self.cfg.has_additive_penalties()
    }

    /// Picks the next token id from `logits` (one per vocabulary id), given `history`: the
    /// prompt's ids followed by those generated so far, all counted as generated by the
    /// frequency and presence penalties. See the module doc for the chain.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        let no_end = std::collections::BTreeSet::new();
        let context = Context {
            history,
            prompt_len: 0,
            end_of_generation: &no_end,
            allowed: None,
        };
        self.choose(logits, &context).token
    }

    /// Picks the next token id from `logits` for the sequence `context` describes, with the
    /// log-probabilities when [`SamplingParams::logprobs`] asks for them.
    pub fn choose(&mut self, logits: &[f32], context: &Context<'_>) -> Choice {
        let window = context.window(self.params.penalty_last_n);
        if logits.is_empty() {
            return Choice {
                token: 0,
                logprobs: None,
            };
        }
        let plain_greedy = self.cfg.temperature.is_none() && self.processes_only_repeats();
        match context.allowed {
            None if plain_greedy => {
                let token = self.greedy(logits, window.0);
                return Choice {
                    token,
                    logprobs: None,
                };
            }
            Some(allowed) if plain_greedy && !self.penalizes() => {
                let token = masked_greedy_choice(logits, allowed);
                return Choice {
                    token,
                    logprobs: None,
                };
            }
            _ => {}
        }
        self.load(logits);
        self.process(context, window);
        let logprobs = self.params.logprobs.map(|n| {
            let lse = process::log_sum_exp(&self.candidates);
            (
                lse,
                process::top_logprobs(&self.candidates, n as usize, lse),
            )
        });
        let (token, chosen_logit) = match self.cfg.temperature {
            None => {
                let token = argmax_candidates(&self.candidates);
                let logit = self.candidates.get(token as usize).map(|c| c.logit);
                (token, logit)
            }
            Some(temperature) => {
                // The chain scales, reorders and cuts the candidates: the processed logits
                // are kept first (only when log-probabilities are asked for).
                self.processed.clear();
                if logprobs.is_some() {
                    self.processed
                        .extend(self.candidates.iter().map(|c| c.logit));
                }
                let token = self.draw_with(temperature);
                (token, self.processed.get(token as usize).copied())
            }
        };
        let logprobs = logprobs.map(|(lse, top)| Logprobs {
            logprob: chosen_logit.map_or(f64::NEG_INFINITY, |logit| logit - lse),
            top,
        });
        Choice { token, logprobs }
    }

    /// Logit bias, the end-of-generation mask, the penalties and the grammar's mask, on the
    /// loaded candidates.
    fn process(&mut self, context: &Context<'_>, window: (&[u32], usize)) {
        process::bias(&mut self.candidates, &self.params.logit_bias);
        process::mask_end(&mut self.candidates, context, self.params.min_tokens);
        process::penalize_window(
            &mut self.candidates,
            &mut self.seen,
            window,
            context.prompt_len,
            self.cfg.penalties,
        );
        if let Some(allowed) = context.allowed {
            process::mask_grammar(&mut self.candidates, allowed);
        }
    }

    /// The chain from temperature on, over the processed candidates.
    fn draw_with(&mut self, temperature: f64) -> u32 {
        // Drawn first so that every non-greedy call consumes exactly one output, whatever the
        // logits: the n-th draw of a request never depends on earlier degenerate steps.
        let u = unit_f64(&mut self.rng);
        let c = &mut self.candidates;
        c.iter_mut().for_each(|x| x.logit /= temperature);
        let top_k_ran = top_k(c, self.cfg.top_k);
        if !softmax(c) {
            return 0;
        }
        if let Some(p) = self.cfg.top_p {
            top_p(c, p);
        } else if top_k_ran {
            c.sort_unstable_by(by_probability);
        }
        if let Some(m) = self.cfg.min_p {
            min_p(c, m);
        }
        draw(c, u)
    }

    /// The argmax of the sanitized (and penalized) logits, lowest id on ties: the chain's
    /// result at T = 0, computed from the logits directly. Building the candidate list first
    /// would write 24 bytes per vocabulary entry on every token (3.6 MB at V = 152k), which
    /// cost more than the rest of a GPU decode step's host work.
    fn greedy(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        let Some(penalty) = self.cfg.penalties.repeat else {
            return argmax_f32(logits);
        };
        mark_distinct(&mut self.seen, logits.len(), history);
        let mut best = (f64::NEG_INFINITY, 0u32);
        for (i, &logit) in logits.iter().enumerate() {
            let mut value = sanitize(logit);
            if self.seen[i / 64] & (1 << (i % 64)) != 0 {
                value = penalize(value, penalty);
            }
            // Strictly greater: an earlier (lower) id keeps a tie. The first id always
            // replaces the -inf start, so id 0 wins when every value is -inf.
            if value > best.0 || i == 0 {
                best = (value, i as u32);
            }
        }
        best.1
    }

    /// Fills the candidate buffer in id order, NaN → -inf and +inf → `f32::MAX`.
    fn load(&mut self, logits: &[f32]) {
        self.candidates.clear();
        self.candidates
            .extend(logits.iter().enumerate().map(|(i, &l)| Candidate {
                // Vocabularies are far below 2^32 entries; ids are u32 throughout the workers.
                id: i as u32,
                logit: sanitize(l),
                p: 0.0,
            }));
    }
}

fn sanitize(logit: f32) -> f64 {
    if logit.is_nan() {
        f64::NEG_INFINITY
    } else if logit == f32::INFINITY {
        f64::from(f32::MAX)
    } else {
        f64::from(logit)
    }
}

/// Uniform in [0, 1) with 53 random bits: the top bits of one `u64`, the same construction
/// `rand` uses for `f64`, written out so the mapping is pinned here and not in a dependency.
fn unit_f64(rng: &mut ChaCha20Rng) -> f64 {
    const SCALE: f64 = 1.0 / (1u64 << 53) as f64;
    (rng.next_u64() >> 11) as f64 * SCALE
}

/// Descending by value, ties to the lower id: the one total order every stage sorts by.
/// Values are never NaN here, so `partial_cmp` is total (and -0.0 ties with 0.0).
fn desc_then_id(a: f64, a_id: u32, b: f64, b_id: u32) -> Ordering {
    b.partial_cmp(&a)
        .unwrap_or(Ordering::Equal)
        .then(a_id.cmp(&b_id))
}

/// Probability descending, ties to the lower id: the order top-p cuts and the draw walks.
fn by_probability(a: &Candidate, b: &Candidate) -> Ordering {
    desc_then_id(a.p, a.id, b.p, b.id)
}

/// The highest sanitized logit among the ids `allowed` (a bitset: bit `id % 32` of word
/// `id / 32`) sets, the lowest id on ties (0 when none is allowed or every allowed one is
/// -inf): what [`Sampler`] picks at T = 0 without a penalty under a grammar's mask, without
/// building the candidate list. A backend answering
/// [`Want::GreedyAmong`](crate::backend::Want::GreedyAmong) on the host calls this.
pub fn masked_greedy_choice(logits: &[f32], allowed: &[u32]) -> u32 {
    let mut best = (f64::NEG_INFINITY, 0u32);
    for (w, &word) in allowed.iter().enumerate() {
        let mut bits = word;
        while bits != 0 {
            let i = w * 32 + bits.trailing_zeros() as usize;
            bits &= bits - 1;
            match logits.get(i) {
                Some(&logit) if sanitize(logit) > best.0 => best = (sanitize(logit), i as u32),
                _ => {}
            }
        }
    }
    best.1
}

/// The highest processed logit, the lowest id on ties (0 when every one is -inf): the chain's
/// choice at T = 0. `candidates` are in id order.
fn argmax_candidates(candidates: &[Candidate]) -> u32 {
    let mut best = (f64::NEG_INFINITY, 0u32);
    for c in candidates {
        if c.logit > best.0 {
            best = (c.logit, c.id);
        }
    }
    best.1
}

/// Sets bit `id` of `seen` for every in-vocabulary id of `history` (a bitset rather than a set
/// type: O(V/64) to clear, no hashing, no allocation once sized).
fn mark_distinct(seen: &mut Vec<u64>, vocab: usize, history: &[u32]) {
    seen.clear();
    seen.resize(vocab.div_ceil(64), 0);
    for &id in history {
        let i = id as usize;
        if i < vocab {
            seen[i / 64] |= 1 << (i % 64);
        }
    }
}

/// llama.cpp's repetition penalty of one logit.
fn penalize(logit: f64, penalty: f64) -> f64 {
    if logit > 0.0 {
        logit / penalty
    } else {
        logit * penalty
    }
}

/// The greedy choice over `logits`: what [`Sampler::sample`] picks at T = 0 without a penalty
/// (the highest logit, NaN as -inf and +inf as `f32::MAX`, the lowest id on ties; 0 for none).
/// A backend answering [`Want::Greedy`](crate::backend::Want::Greedy) on the host calls this.
pub fn greedy_choice(logits: &[f32]) -> u32 {
    argmax_f32(logits)
}

crate::simd::avx2_where_present! {
    /// The highest sanitized logit, the lowest id on ties. Two passes whose loops vectorize:
    /// the maximum over sixteen interleaved lanes, then the first id holding it, sixteen
    /// equality tests at a time (one pass that also tracked each lane's id compiled to a scalar
    /// select per lane). Comparing f32s is comparing their f64 widenings, so this is the argmax
    /// of the chain's f64 logits: a NaN never compares greater (as -inf, it wins only where
    /// everything is -inf, and then id 0 does); only +inf, which sanitizing turns into a tie
    /// with f32::MAX, needs the sanitized scan. This runs once per greedy sequence per step,
    /// over 49k to 152k logits.
    fn argmax_f32(logits: &[f32]) -> u32 = argmax_f32_lanes;
}

/// [`argmax_f32`]'s body, inlined into each build.
#[inline(always)]
fn argmax_f32_lanes(logits: &[f32]) -> u32 {
    const LANES: usize = 16;
    let mut best = [f32::NEG_INFINITY; LANES];
    let mut blocks = logits.chunks_exact(LANES);
    for block in &mut blocks {
        for (b, &v) in best.iter_mut().zip(block) {
            *b = if v > *b { v } else { *b };
        }
    }
    let max = best
        .iter()
        .chain(blocks.remainder())
        .fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m });
    if max == f32::INFINITY {
        return argmax_sanitized(logits);
    }
    if max == f32::NEG_INFINITY {
        return 0;
    }
    let mut first = 0;
    for block in logits.chunks(LANES) {
        if block.iter().fold(false, |hit, &v| hit | (v == max)) {
            let at = block.iter().position(|&v| v == max).unwrap_or(0);
            return (first + at) as u32;
        }
        first += block.len();
    }
    0
}

/// [`argmax_f32`]'s exact scan: NaN as -inf, +inf as f32::MAX, the lowest id on ties.
fn argmax_sanitized(logits: &[f32]) -> u32 {
    let mut best = (f64::NEG_INFINITY, 0u32);
    for (i, &v) in logits.iter().enumerate() {
        if sanitize(v) > best.0 {
            best = (sanitize(v), i as u32);
        }
    }
    best.1
}

/// Keeps the `k` highest logits (ties: lower id), unordered; returns whether it cut anything.
fn top_k(candidates: &mut Vec<Candidate>, k: usize) -> bool {
    if k == 0 || k >= candidates.len() {
        return false;
    }
    candidates.select_nth_unstable_by(k - 1, |a, b| desc_then_id(a.logit, a.id, b.logit, b.id));
    candidates.truncate(k);
    true
}

/// Softmax in f64 with max subtraction; `false` when every logit is -inf (nothing to sample).
fn softmax(candidates: &mut [Candidate]) -> bool {
    let max = candidates
        .iter()
        .fold(f64::NEG_INFINITY, |m, c| m.max(c.logit));
    // Logits are never NaN or +inf here, so "not finite" means every one is -inf.
    if !max.is_finite() {
        return false;
    }
    let mut sum = 0.0;
    for c in candidates.iter_mut() {
        c.p = (c.logit - max).exp();
        sum += c.p;
    }
    // sum ≥ 1: the maximum contributes exp(0).
    candidates.iter_mut().for_each(|c| c.p /= sum);
    true
}

/// Keeps the smallest prefix, by probability descending (ties: lower id), whose cumulative
/// probability is ≥ `p` (at least one token), and leaves it sorted.
///
/// Rather than sorting every candidate, it sorts the `n` most probable (`select_nth_unstable_by`,
/// O(V)) and widens `n` eightfold until their prefix reaches `p`. The first `n` of the total
/// order and their sequential prefix sums are exactly those of a full sort, so the result is
/// bit-identical to one; a flat distribution degrades to a full sort, O(V log V).
fn top_p(candidates: &mut Vec<Candidate>, p: f64) {
    let len = candidates.len();
    let mut n = TOP_P_FIRST_PREFIX.min(len);
    while n > 0 {
        if n < len {
            candidates.select_nth_unstable_by(n - 1, by_probability);
        }
        let prefix = &mut candidates[..n];
        prefix.sort_unstable_by(by_probability);
        if let Some(keep) = nucleus_len(prefix, p) {
            candidates.truncate(keep);
            return;
        }
        // Rounding can leave the total just under p: then every token stays.
        if n == len {
            return;
        }
        n = n.saturating_mul(8).min(len);
    }
}

/// How many candidates top-p sorts first: nuclei are usually far smaller.
const TOP_P_FIRST_PREFIX: usize = 1024;

/// The length of the shortest prefix of sorted `candidates` whose cumulative probability is ≥ `p`.
fn nucleus_len(candidates: &[Candidate], p: f64) -> Option<usize> {
    let mut cumulative = 0.0;
    for (i, c) in candidates.iter().enumerate() {
        cumulative += c.p;
        if cumulative >= p {
            return Some(i + 1);
        }
    }
    None
}

/// Keeps tokens with probability ≥ `min_p` × the highest; order is preserved.
fn min_p(candidates: &mut Vec<Candidate>, min_p: f64) {
    let p_max = candidates.iter().fold(0.0_f64, |m, c| m.max(c.p));
    let threshold = min_p * p_max;
    candidates.retain(|c| c.p >= threshold);
}

/// Walks the survivors in their order; returns the first whose cumulative probability exceeds
/// `u` × total. Zero-probability tokens are never returned.
fn draw(candidates: &[Candidate], u: f64) -> u32 {
    let total = candidates.iter().fold(0.0, |s, c| s + c.p);
    let target = u * total;
    let mut cumulative = 0.0;
    let mut last = candidates.first().map_or(0, |c| c.id);
    for c in candidates.iter().filter(|c| c.p > 0.0) {
        cumulative += c.p;
        last = c.id;
        if target < cumulative {
            return c.id;
        }
    }
    // Only reachable when u × total rounds up to total: the last token with mass is the answer.
    last
}
