//! The mixture-of-experts FFN (gpt-oss): the router scores every expert for each row, the
//! row goes through its best few, and their outputs are summed weighted by a softmax over the
//! chosen scores — llama.cpp's `build_moe_ffn` with `SOFTMAX_WEIGHT` gating.

use worker_common::backend::BackendError;
use worker_common::model::{Expert, Experts};

use crate::forward::Model;
use crate::matmul::{MatmulScratch, matmul_group};
use crate::ops;

/// The experts' activation buffers, reused across steps.
#[derive(Debug, Default)]
pub struct MoeBuffers {
    /// Router logits, `[row][expert]`.
    logits: Vec<f32>,
    /// Each row's chosen experts with their weights, `[row][slot]`, best first.
    choices: Vec<(usize, f32)>,
    /// The (row, slot) pairs routed to the expert being run.
    routed: Vec<(usize, usize)>,
    /// Their inputs, gathered.
    input: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    down: Vec<f32>,
    /// Each (row, slot)'s weighted expert output, `[row][slot][n_embd]`.
    slots: Vec<f32>,
}

impl MoeBuffers {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        let floats = [
            &self.logits,
            &self.input,
            &self.gate,
            &self.up,
            &self.down,
            &self.slots,
        ]
        .iter()
        .map(|v| v.capacity())
        .sum::<usize>();
        floats * size_of::<f32>()
            + self.choices.capacity() * size_of::<(usize, f32)>()
            + self.routed.capacity() * size_of::<(usize, usize)>()
    }
}

/// Chooses `used` experts of `logits` (one row's router output): the highest first (the lower
/// index first among equals), weighted by the softmax of their logits.
fn route(logits: &[f32], used: usize, choices: &mut Vec<(usize, f32)>) {
    let start = choices.len();
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    let best = &order[..used];
    let max = logits[best[0]];
    let mut sum = 0.0f64;
    for &e in best {
        let weight = ops::exp(logits[e] - max);
        sum += f64::from(weight);
        choices.push((e, weight));
    }
    let inv_sum = (1.0 / sum) as f32;
    for choice in &mut choices[start..] {
        choice.1 *= inv_sum;
    }
}

impl Model<'_> {
    /// `out` (`[row][n_embd]`) = the mixture's output for the `n` rows of `normed`.
    pub(crate) fn experts_ffn(
        &self,
        moe: &Experts<crate::weights::Matrix, Vec<f32>>,
        normed: &[f32],
        n: usize,
        buf: &mut MoeBuffers,
        scratch: &mut MatmulScratch,
        out: &mut Vec<f32>,
    ) -> Result<(), BackendError> {
        let hp = &self.plan.hp;
        let n_embd = hp.n_embd;
        let used = hp.experts.map_or(1, |e| e.used);
        let count = moe.experts.len();
        buf.logits.resize(n * count, 0.0);
        matmul_group(
            self.team,
            &[&moe.router],
            self.file,
            normed,
            n,
            &mut [&mut buf.logits],
            scratch,
        )?;
        ops::add_bias(&mut buf.logits, &moe.router_bias);
        buf.choices.clear();
        for row in buf.logits.chunks_exact(count) {
            route(row, used, &mut buf.choices);
        }
        buf.slots.resize(n * used * n_embd, 0.0);
        for (e, expert) in moe.experts.iter().enumerate() {
            buf.routed.clear();
            let routed = buf.choices.iter().enumerate().filter(|(_, c)| c.0 == e);
            buf.routed
                .extend(routed.map(|(index, _)| (index / used, index % used)));
            if buf.routed.is_empty() {
                continue;
            }
            self.run_expert(expert, normed, buf, scratch)?;
            for (k, &(row, slot)) in buf.routed.iter().enumerate() {
                let weight = buf.choices[row * used + slot].1;
                let target = &mut buf.slots[(row * used + slot) * n_embd..][..n_embd];
                let result = &buf.down[k * n_embd..][..n_embd];
                for (t, r) in target.iter_mut().zip(result) {
                    *t = r * weight;
                }
            }
        }
        // Summed slot by slot, best first, as llama.cpp adds its views.
        out.clear();
        for row in buf.slots.chunks_exact(used * n_embd) {
            let start = out.len();
            out.extend_from_slice(&row[..n_embd]);
            for slot in row[n_embd..].chunks_exact(n_embd) {
                ops::add_in_place(&mut out[start..], slot);
            }
        }
        Ok(())
    }

    /// Runs `expert` on the rows of `normed` in `buf.routed`, leaving `down(act(gate) · up)`
    /// with its biases in `buf.down`, one row per routed pair.
    fn run_expert(
        &self,
        expert: &Expert<crate::weights::Matrix, Vec<f32>>,
        normed: &[f32],
        buf: &mut MoeBuffers,
        scratch: &mut MatmulScratch,
    ) -> Result<(), BackendError> {
        let n_embd = self.plan.hp.n_embd;
        let m = buf.routed.len();
        buf.input.clear();
        for &(row, _) in &buf.routed {
            buf.input
                .extend_from_slice(&normed[row * n_embd..][..n_embd]);
        }
        buf.gate.resize(m * expert.gate.rows, 0.0);
        buf.up.resize(m * expert.up.rows, 0.0);
        matmul_group(
            self.team,
            &[&expert.gate, &expert.up],
            self.file,
            &buf.input,
            m,
            &mut [&mut buf.gate, &mut buf.up],
            scratch,
        )?;
        ops::add_bias(&mut buf.gate, &expert.gate_bias);
        ops::add_bias(&mut buf.up, &expert.up_bias);
        ops::gated(self.plan.activation, &mut buf.gate, &buf.up);
        buf.down.resize(m * expert.down.rows, 0.0);
        matmul_group(
            self.team,
            &[&expert.down],
            self.file,
            &buf.gate,
            m,
            &mut [&mut buf.down],
            scratch,
        )?;
        ops::add_bias(&mut buf.down, &expert.down_bias);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_picks_the_best_and_softmaxes_their_logits() {
        let mut choices = Vec::new();
        route(&[0.5, 2.0, -1.0, 2.0 + 2f32.ln()], 2, &mut choices);
        assert_eq!(choices.iter().map(|c| c.0).collect::<Vec<_>>(), [3, 1]);
        assert!((choices[0].1 - 2.0 / 3.0).abs() < 1e-6, "{choices:?}");
        assert!((choices[1].1 - 1.0 / 3.0).abs() < 1e-6, "{choices:?}");
        // Equal logits: the lower index first.
        choices.clear();
        route(&[1.0, 1.0, 0.0], 1, &mut choices);
        assert_eq!(choices, [(0, 1.0)]);
    }
}
