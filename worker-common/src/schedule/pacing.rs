//! How many prompt tokens a step may hold, from the steps' measured times (specs/BATCHING.md,
//! "Prefill pacing").
//!
//! A decoding sequence waits for the whole step its token is in, so a step's prompt tokens are
//! its decodes' inter-token latency. The pacer keeps two measurements: how long a step of
//! decodes alone takes, and what a prompt token costs on top (the last chunks', so it follows
//! a long prompt whose late tokens attend to more keys). A step beside decodes may take
//! [`BESIDE_DECODES`] times a decode-only step (never less than [`STEP_FLOOR`]); a step with no
//! decode waiting [`LONE_DECODES`] times one (never less than [`LONE_FLOOR`]), so a job that
//! arrives while a long prompt is prefilling waits a few of its own tokens' time, not a grid
//! chunk's seconds.
//!
//! Only a backend whose results do not depend on where a prompt is cut is paced: on another,
//! the grid fixes the cuts and a paced chunk would change the tokens.

use std::time::Duration;

/// A step with prompt tokens beside decodes takes at most this many times a decode-only step:
/// a short job beside a long prompt keeps most of its speed (on one CPU thread SmolLM2's
/// four-job decode step takes 12 ms, so even 50 ms more made a 16-token job four times slower).
pub const BESIDE_DECODES: f64 = 1.25;

/// Steps beside decodes are never paced below this: timer noise, not latency anyone sees.
pub const STEP_FLOOR: Duration = Duration::from_millis(5);

/// A step of prompt tokens alone takes at most this many times a decode-only step: what a job
/// arriving during it waits before it joins, a few of its own tokens' time.
pub const LONE_DECODES: f64 = 3.0;

/// Steps of prompt tokens alone are never paced below this (nor before a decode was timed).
pub const LONE_FLOOR: Duration = Duration::from_millis(20);

/// A step of prompt tokens alone holds at least this many (or what is left of the prompt): in
/// shorter chunks a long prompt alone re-reads the weights too often and the CPU attention's
/// tiles of prompt rows run part-empty (one thread, SmolLM2, 5,000 tokens: 79 s in chunks of a
/// few tokens against 46 s).
pub const LONE_MIN_TOKENS: usize = 16;

/// A prompt whose remaining tokens cost at most this many decode-only steps, or
/// [`FINISH_FLOOR`], ends in one step from the step's budget rather than the allowance: when many
/// clients arrive at once, holding each short prompt back for the few running decodes kept the
/// later ones waiting far longer than one longer step costs the decodes (16 clients of 64
/// tokens on two CPU threads, after a one-client warm-up: time to the first token 2x the
/// grid's, aggregate a third lower).
pub const FINISH_DECODES: f64 = 4.0;

/// See [`FINISH_DECODES`]: a one-row decode step (a few ms) must not make every prompt
/// "costly"; a 100 ms step is a stall the decodes beside it feel once, not for the prompt's
/// whole length.
pub const FINISH_FLOOR: Duration = Duration::from_millis(100);

/// Weight of the newest measurement in the running averages: the last few steps' costs.
const NEWEST: f64 = 0.5;

/// The running measurements and the allowance they give.
#[derive(Debug, Clone, Default)]
pub(super) struct PrefillPacer {
    /// Seconds a step of decodes alone takes (averaged; none measured yet: `None`).
    decode_step: Option<f64>,
    /// Seconds one prompt token adds to a step (averaged; none measured yet: `None`).
    per_prompt_token: Option<f64>,
    /// Prompt tokens earned beside decodes and not yet spent: where a prompt token costs more
    /// than a step's share (a long prompt's late tokens on a slow CPU), it runs every few steps
    /// rather than stretching every one.
    credit: f64,
}

impl PrefillPacer {
    /// Prompt tokens the next step may hold beside `decodes` decodes, at most `budget`. Alone,
    /// at least [`LONE_MIN_TOKENS`]; beside decodes what the credit has reached (zero: the
    /// prompts sit this step out). Before any prompt token was timed: `budget`.
    pub(super) fn allowance(&mut self, decodes: usize, budget: usize) -> usize {
        let Some(per_token) = self.per_prompt_token else {
            return budget;
        };
        let per_token = per_token.max(f64::MIN_POSITIVE);
        let decode_step = self.decode_step.unwrap_or(0.0);
        if decodes == 0 {
            self.credit = 0.0;
            let target = (LONE_DECODES * decode_step).max(LONE_FLOOR.as_secs_f64());
            // A float cast saturates, so a tiny cost gives the budget rather than wrapping.
            let tokens = (target / per_token).floor() as usize;
            return tokens.max(LONE_MIN_TOKENS).min(budget);
        }
        let target = (BESIDE_DECODES * decode_step).max(STEP_FLOOR.as_secs_f64());
        let earned = ((target - decode_step) / per_token).max(0.0);
        // Never more banked than one step's share or one token: no burst after idle steps.
        self.credit = (self.credit + earned).min(earned.max(1.0));
        (self.credit.floor() as usize).min(budget)
    }

    /// Whether a prompt with `prompt_tokens` left may end in this step whatever the allowance:
    /// if they cost at most [`FINISH_DECODES`] decode-only steps or [`FINISH_FLOOR`]. Before
    /// any prompt token was timed: yes.
    pub(super) fn may_finish(&self, prompt_tokens: usize) -> bool {
        let Some(per_token) = self.per_prompt_token else {
            return true;
        };
        let decode_step = self.decode_step.unwrap_or(0.0);
        let bound = (FINISH_DECODES * decode_step).max(FINISH_FLOOR.as_secs_f64());
        prompt_tokens as f64 * per_token <= bound
    }

    /// The chance of agreement a drafted token must have to pay for itself in a step of
    /// `decodes` decodes: it costs what a prompt token adds to a step, plus its share of a
    /// draft model's step (`draft_step` seconds, shared by the step's decodes; 0 for prompt
    /// lookup), and yields one token when the model agrees, where the step yields `decodes`
    /// tokens in a decode-only step's time. Before both were timed: 0 (draft freely; the steps
    /// time it).
    pub(super) fn draft_cost(&self, decodes: usize, draft_step: f64) -> f64 {
        match (self.per_prompt_token, self.decode_step) {
            (Some(per_token), Some(step)) if step > 0.0 => {
                (per_token * decodes.max(1) as f64 + draft_step) / step
            }
            _ => 0.0,
        }
    }

    /// Takes the prompt tokens a step planned from its allowance off the credit.
    pub(super) fn spend(&mut self, prompt_tokens: usize) {
        self.credit = (self.credit - prompt_tokens as f64).max(0.0);
    }

    /// Takes a finished step's measurement: `decodes` decode tokens and `prompt_tokens` prompt
    /// tokens in `took`.
    pub(super) fn observe(&mut self, decodes: usize, prompt_tokens: usize, took: Duration) {
        let took = took.as_secs_f64();
        if prompt_tokens == 0 {
            if decodes > 0 {
                self.decode_step = Some(average(self.decode_step, took));
            }
            return;
        }
        let decode_part = if decodes == 0 {
            0.0
        } else {
            self.decode_step.unwrap_or(0.0)
        };
        // The decodes' share as measured alone; what is left is the prompt's (at least a tenth
        // of the step, should the decode average be stale and larger than this whole step).
        let prompt_part = (took - decode_part).max(took / 10.0);
        let per_token = prompt_part / prompt_tokens as f64;
        self.per_prompt_token = Some(average(self.per_prompt_token, per_token));
    }
}

fn average(old: Option<f64>, new: f64) -> f64 {
    match old {
        Some(old) => old + NEWEST * (new - old),
        None => new,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn before_any_prompt_is_timed_the_budget_holds() {
        let mut pacer = PrefillPacer::default();
        assert_eq!(pacer.allowance(4, 512), 512);
        pacer.observe(4, 0, ms(40));
        assert_eq!(pacer.allowance(4, 512), 512);
    }

    #[test]
    fn beside_decodes_a_step_takes_at_most_its_share_over_a_decode_step() {
        let mut pacer = PrefillPacer::default();
        pacer.observe(4, 0, ms(80));
        // 80 ms of decodes (measured alone) plus 16 prompt tokens: 4 ms a token.
        pacer.observe(4, 16, ms(144));
        // 1.25 x 80 = 100 ms: 20 ms left for the prompt, five tokens a step.
        assert_eq!(pacer.allowance(4, 512), 5);
        pacer.spend(5);
        assert_eq!(pacer.allowance(4, 512), 5);
        // Alone, a prompt gets three decode steps: 240 ms, 60 tokens.
        assert_eq!(pacer.allowance(0, 512), 60);
    }

    #[test]
    fn a_costly_prompt_token_runs_every_few_steps_and_alone_in_a_tile() {
        let mut pacer = PrefillPacer::default();
        pacer.observe(4, 0, ms(12));
        // Late in a long prompt on one thread: 15 ms a token, the share is 3 ms a step.
        pacer.observe(4, 1, ms(27));
        let steps: Vec<usize> = (0..10)
            .map(|_| {
                let tokens = pacer.allowance(4, 512);
                pacer.spend(tokens);
                tokens
            })
            .collect();
        // A fifth of a token a step: one token every five steps or so.
        let total: usize = steps.iter().sum();
        assert!(
            steps.iter().all(|&n| n <= 1) && (1..=2).contains(&total),
            "{steps:?}"
        );
        // Alone: 36 ms is two tokens, but a step alone holds at least a tile.
        assert_eq!(pacer.allowance(0, 512), LONE_MIN_TOKENS);
    }

    #[test]
    fn credit_left_unspent_does_not_pile_up() {
        let mut pacer = PrefillPacer::default();
        pacer.observe(4, 0, ms(12));
        pacer.observe(4, 1, ms(27));
        // No prompt took the tokens offered over many steps: still at most one.
        for _ in 0..100 {
            pacer.allowance(4, 512);
        }
        assert_eq!(pacer.allowance(4, 512), 1);
    }

    #[test]
    fn a_prompt_that_costs_a_few_decode_steps_may_end_at_once() {
        let mut pacer = PrefillPacer::default();
        assert!(pacer.may_finish(100_000));
        pacer.observe(4, 0, ms(40));
        pacer.observe(4, 10, ms(50));
        // 1 ms a token (give or take a rounding), four 40 ms decode steps: 160 tokens.
        assert!(pacer.may_finish(159));
        assert!(!pacer.may_finish(162));
        // A 5 ms decode step: still 100 ms' worth (FINISH_FLOOR).
        let mut pacer = PrefillPacer::default();
        pacer.observe(1, 0, ms(5));
        pacer.observe(1, 10, ms(15));
        assert!(pacer.may_finish(99));
        assert!(!pacer.may_finish(102));
    }

    #[test]
    fn cheap_prompt_tokens_come_by_the_hundred() {
        // A GPU's 16-job decode step of 13 ms, a prompt token 20 us on top.
        let mut pacer = PrefillPacer::default();
        pacer.observe(16, 0, ms(13));
        pacer.observe(16, 512, Duration::from_micros(13_000 + 512 * 20));
        // 3.25 ms left at 20 us a token.
        assert_eq!(pacer.allowance(16, 512), 162);
    }

    #[test]
    fn the_cost_follows_the_latest_chunks() {
        let mut pacer = PrefillPacer::default();
        // 2^-10 s a token; no decode timed: LONE_FLOOR, 20 tokens in 20 ms.
        pacer.observe(0, 128, ms(125));
        assert_eq!(pacer.allowance(0, 512), 20);
        // Later chunks of the prompt attend to more keys: 4 x 2^-10 s a token, then 8 x.
        pacer.observe(0, 64, ms(250));
        pacer.observe(0, 32, ms(250));
        // Averaged: 2.5 x 2^-10 s, then 5.25 x 2^-10 s: 3 tokens in 20 ms, so a tile.
        assert_eq!(pacer.allowance(0, 512), LONE_MIN_TOKENS);
    }

    #[test]
    fn a_stale_decode_average_cannot_make_prompt_tokens_free() {
        let mut pacer = PrefillPacer::default();
        pacer.observe(8, 0, ms(500));
        pacer.observe(8, 10, ms(100));
        // A tenth of the step is the prompt's: 1 ms a token, about 1,500 in three 500 ms steps.
        assert_eq!(pacer.allowance(0, 512), 512);
        // Beside decodes: 625 ms less the 500 of the decodes, about 125 tokens.
        assert!((124..=125).contains(&pacer.allowance(8, 512)));
    }
}
