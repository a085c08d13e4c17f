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

/// A step with prompt tokens beside decodes takes at most this many times a decode-only step.
pub const BESIDE_DECODES: f64 = 1.5;

/// Steps beside decodes are never paced below this: a GPU step holding a few hundred prompt
/// tokens beside its decodes stays under it, so pacing leaves the GPU's prompt throughput be.
pub const STEP_FLOOR: Duration = Duration::from_millis(30);

/// A step of prompt tokens alone takes at most this many times a decode-only step: what a job
/// arriving during it waits before it joins, a few of its own tokens' time.
pub const LONE_DECODES: f64 = 4.0;

/// Steps of prompt tokens alone are never paced below this (nor before a decode was timed).
pub const LONE_FLOOR: Duration = Duration::from_millis(100);

/// Weight of the newest measurement in the running averages: the last few steps' costs.
const NEWEST: f64 = 0.5;

/// The running measurements and the allowance they give.
#[derive(Debug, Clone, Default)]
pub(super) struct PrefillPacer {
    /// Seconds a step of decodes alone takes (averaged; none measured yet: `None`).
    decode_step: Option<f64>,
    /// Seconds one prompt token adds to a step (averaged; none measured yet: `None`).
    per_prompt_token: Option<f64>,
}

impl PrefillPacer {
    /// Prompt tokens the next step may hold beside `decodes` decodes, at most `budget` and at
    /// least one (a prompt always advances). Before any prompt token was timed: `budget`.
    pub(super) fn allowance(&self, decodes: usize, budget: usize) -> usize {
        let Some(per_token) = self.per_prompt_token else {
            return budget.max(1);
        };
        let decode_part = if decodes == 0 {
            0.0
        } else {
            self.decode_step.unwrap_or(0.0)
        };
        let decode_step = self.decode_step.unwrap_or(0.0);
        let target = if decodes == 0 {
            (LONE_DECODES * decode_step).max(LONE_FLOOR.as_secs_f64())
        } else {
            (BESIDE_DECODES * decode_step).max(STEP_FLOOR.as_secs_f64())
        };
        let tokens = (target - decode_part) / per_token.max(f64::MIN_POSITIVE);
        // A float cast saturates, so a tiny cost gives the budget rather than wrapping.
        (tokens.floor() as usize).clamp(1, budget.max(1))
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
        // 80 ms of decodes (measured alone) plus 16 prompt tokens: 9 ms a token.
        pacer.observe(4, 16, ms(224));
        // 1.5 x 80 = 120 ms: 40 ms left for the prompt, four tokens.
        assert_eq!(pacer.allowance(4, 512), 4);
        // Alone, a prompt gets four decode steps: 320 ms, 35 tokens.
        assert_eq!(pacer.allowance(0, 512), 35);
    }

    #[test]
    fn quick_steps_are_not_paced_and_a_prompt_always_advances() {
        let mut pacer = PrefillPacer::default();
        pacer.observe(16, 0, ms(13));
        pacer.observe(16, 512, Duration::from_micros(13_000 + 512 * 20));
        // The 30 ms floor: 17 ms left at 20 us a token, more than the budget.
        assert_eq!(pacer.allowance(16, 512), 512);
        let mut slow = PrefillPacer::default();
        slow.observe(1, 0, ms(100));
        slow.observe(1, 1, ms(2_000));
        assert_eq!(slow.allowance(1, 512), 1);
    }

    #[test]
    fn the_cost_follows_the_latest_chunks() {
        let mut pacer = PrefillPacer::default();
        // 2^-10 s a token; no decode timed: LONE_FLOOR, 102 tokens in 100 ms.
        pacer.observe(0, 128, ms(125));
        assert_eq!(pacer.allowance(0, 512), 102);
        // Later chunks of the prompt attend to more keys: 4 x 2^-10 s a token, then 8 x.
        pacer.observe(0, 64, ms(250));
        pacer.observe(0, 32, ms(250));
        // Averaged: 2.5 x 2^-10 s, then 5.25 x 2^-10 s: 19 tokens in 100 ms.
        assert_eq!(pacer.allowance(0, 512), 19);
    }

    #[test]
    fn a_stale_decode_average_cannot_make_prompt_tokens_free() {
        let mut pacer = PrefillPacer::default();
        pacer.observe(8, 0, ms(500));
        pacer.observe(8, 10, ms(100));
        // A tenth of the step is the prompt's: 1 ms a token, about 2,000 in four 500 ms steps.
        assert_eq!(pacer.allowance(0, 512), 512);
        // Beside decodes: 750 ms less the 500 of the decodes, about 250 tokens.
        assert!((249..=250).contains(&pacer.allowance(8, 512)));
    }
}
