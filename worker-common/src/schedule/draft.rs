//! Where drafts come from (specs/SPECULATIVE.md): prompt lookup, or a draft model
//! ([`DraftModel`]) that runs on the same kind of backend with its own KV pages, and the
//! scheduler's part: which decodes of a step draft, and how many tokens.

use std::collections::HashMap;
use std::time::Instant;

use super::pages::PagePool;
use super::{Entry, Scheduler, pages_for};
use crate::backend::{Chunk, ChunkOutput, InferenceBackend, PageId, StepOutputs, Want};
use crate::generate::EventSink;
use crate::generate::speculation::{NGRAMS, prompt_lookup};

/// A sequence's request for drafts from a [`Drafter`].
#[derive(Debug, Clone, Copy)]
pub struct DraftWant<'a> {
    /// The sequence (its admission number: stable while it lives).
    pub id: u64,
    /// Its tokens so far: prompt and generated.
    pub history: &'a [u32],
    /// Most tokens to draft.
    pub most: usize,
}

/// A source of drafts beside prompt lookup: a draft model.
pub trait Drafter: Send {
    /// Drafts up to `want.most` tokens after each `want.history`, in order; empty where it has
    /// none (still catching up with a long history, or out of pages).
    fn draft(&mut self, wants: &[DraftWant<'_>]) -> Vec<Vec<u32>>;
    /// Sequence `id`'s history from position `valid` on is no longer what was drafted from
    /// (refused drafts, or a preemption): those positions are recomputed when needed.
    fn truncate(&mut self, id: u64, valid: usize);
    /// Sequence `id` ended or was preempted: its pages go back.
    fn release(&mut self, id: u64);
    /// Seconds one draft step takes (measured; 0 before any).
    fn step_seconds(&self) -> f64;
}

/// Tokens of a sequence's history a draft model catches up with per step before it drafts
/// for it: a long prompt is taken in pieces, so no step holds its whole prefill.
pub const CATCH_UP: usize = 64;

/// What a draft model keeps for one sequence.
#[derive(Debug, Default)]
struct Drafted {
    pages: Vec<PageId>,
    /// Positions of the history whose keys and values the draft model holds.
    computed: usize,
}

/// A draft model on a backend: greedy drafts, one backend step per drafted position for all
/// the sequences that draft (batched), its KV in its own page pool.
pub struct DraftModel<B> {
    backend: B,
    pool: PagePool,
    seqs: HashMap<u64, Drafted>,
    outputs: StepOutputs,
    /// Seconds a draft step takes, averaged.
    step: Option<f64>,
    /// Set once a step failed: the model drafts no more (the target runs on without it).
    failed: bool,
}

impl<B: InferenceBackend> DraftModel<B> {
    /// A drafter over a loaded draft `backend`.
    pub fn new(backend: B) -> Self {
        Self {
            pool: PagePool::new(backend.kv_pages(), false),
            outputs: StepOutputs::new(backend.vocab_size()),
            backend,
            seqs: HashMap::new(),
            step: None,
            failed: false,
        }
    }

    /// Runs one draft step; each chunk's greedy choice, or `None` on a failure.
    fn run(&mut self, chunks: &[Chunk<'_>]) -> Option<Vec<Option<u32>>> {
        let started = Instant::now();
        if let Err(err) = self.backend.step(chunks, &mut self.outputs) {
            tracing::warn!(event = "draft_model_failed", error = %err, "the draft model failed, speculation stops: {err}");
            self.failed = true;
            return None;
        }
        let took = started.elapsed().as_secs_f64();
        self.step = Some(self.step.map_or(took, |old| old + 0.5 * (took - old)));
        Some(
            (0..chunks.len())
                .map(|i| match self.outputs.get(i) {
                    Ok(ChunkOutput::Greedy(token)) => Some(token),
                    _ => None,
                })
                .collect(),
        )
    }

    /// Gives sequence `id` pages for `positions`; false when the pool is short.
    fn reserve(&mut self, id: u64, positions: usize) -> bool {
        let seq = self.seqs.entry(id).or_default();
        let missing = pages_for(positions).saturating_sub(seq.pages.len());
        if missing > self.pool.available() {
            return false;
        }
        seq.pages
            .extend((0..missing).filter_map(|_| self.pool.allocate()));
        seq.pages.len() >= pages_for(positions)
    }
}

impl<B: InferenceBackend> Drafter for DraftModel<B> {
    fn draft(&mut self, wants: &[DraftWant<'_>]) -> Vec<Vec<u32>> {
        let mut drafts: Vec<Vec<u32>> = wants.iter().map(|_| Vec::new()).collect();
        if self.failed {
            return drafts;
        }
        // Catch up with each history (a piece of it when it is long): who drafts, from where.
        let mut drafting = Vec::new();
        for (i, want) in wants.iter().enumerate() {
            let computed = self.seqs.get(&want.id).map_or(0, |s| s.computed);
            let from = computed.min(want.history.len().saturating_sub(1));
            let to = want.history.len().min(from + CATCH_UP);
            let finishing = to == want.history.len();
            let positions = if finishing { to + want.most } else { to };
            if want.most == 0 || !self.reserve(want.id, positions) {
                continue;
            }
            drafting.push((i, from, to, finishing));
        }
        let tables: Vec<Vec<PageId>> = drafting
            .iter()
            .map(|&(i, ..)| self.seqs[&wants[i].id].pages.clone())
            .collect();
        let chunks: Vec<Chunk<'_>> = drafting
            .iter()
            .zip(&tables)
            .map(|(&(i, from, to, finishing), pages)| Chunk {
                tokens: &wants[i].history[from..to],
                start_pos: from,
                pages,
                want: if finishing {
                    Want::Greedy
                } else {
                    Want::Nothing
                },
            })
            .collect();
        // No step when nobody drafts: an empty step's time would pull the measured cost down.
        if chunks.is_empty() {
            return drafts;
        }
        let Some(first) = self.run(&chunks) else {
            return drafts;
        };
        for (&(i, _, to, _), choice) in drafting.iter().zip(first) {
            if let Some(seq) = self.seqs.get_mut(&wants[i].id) {
                seq.computed = to;
            }
            drafts[i].extend(choice);
        }
        self.extend(wants, &tables, &drafting, &mut drafts);
        drafts
    }

    fn truncate(&mut self, id: u64, valid: usize) {
        if let Some(seq) = self.seqs.get_mut(&id) {
            seq.computed = seq.computed.min(valid);
        }
    }

    fn release(&mut self, id: u64) {
        if let Some(seq) = self.seqs.remove(&id) {
            self.pool.release(&seq.pages);
        }
    }

    fn step_seconds(&self) -> f64 {
        self.step.unwrap_or(0.0)
    }
}

impl<B: InferenceBackend> DraftModel<B> {
    /// Drafts the second token on, one step per position, for the sequences that drafted a
    /// first one and want more.
    fn extend(
        &mut self,
        wants: &[DraftWant<'_>],
        tables: &[Vec<PageId>],
        drafting: &[(usize, usize, usize, bool)],
        drafts: &mut [Vec<u32>],
    ) {
        let most = wants.iter().map(|w| w.most).max().unwrap_or(0);
        for round in 1..most {
            let going: Vec<usize> = (0..drafting.len())
                .filter(|&k| {
                    let i = drafting[k].0;
                    drafts[i].len() == round && wants[i].most > round
                })
                .collect();
            if going.is_empty() {
                return;
            }
            let chunks: Vec<Chunk<'_>> = going
                .iter()
                .map(|&k| {
                    let i = drafting[k].0;
                    Chunk {
                        tokens: &drafts[i][round - 1..round],
                        start_pos: wants[i].history.len() + round - 1,
                        pages: &tables[k],
                        want: Want::Greedy,
                    }
                })
                .collect();
            let Some(choices) = self.run(&chunks) else {
                return;
            };
            for (&k, choice) in going.iter().zip(choices) {
                let i = drafting[k].0;
                if let Some(seq) = self.seqs.get_mut(&wants[i].id) {
                    seq.computed += 1;
                }
                drafts[i].extend(choice);
            }
        }
    }
}

impl<J: EventSink> Scheduler<J> {
    /// Gives the decodes of `plan` drafts (prompt lookup, or the draft model when there is
    /// one), within `budget` tokens, each as many as its agreement so far makes worth a
    /// draft's measured cost; returns the tokens drafted. A sequence whose drafts would need a
    /// page the pool lacks drafts nothing.
    pub(super) fn draft(&mut self, plan: &mut [(usize, usize)], mut budget: usize) -> usize {
        let draft_step = self.drafter.as_ref().map_or(0.0, |d| d.step_seconds());
        let cost = self.pacer.draft_cost(plan.len(), draft_step);
        let mosts: Vec<usize> = plan
            .iter()
            .map(|&(i, _)| self.running[i].seq.draft_len(cost, self.config.draft_max))
            .collect();
        let wants: Vec<DraftWant<'_>> = plan
            .iter()
            .zip(mosts)
            .map(|(&(i, _), most)| {
                let entry: &Entry<J> = &self.running[i];
                DraftWant {
                    id: entry.order,
                    history: entry.seq.history(),
                    most,
                }
            })
            .collect();
        let proposed: Vec<Vec<u32>> = match &mut self.drafter {
            Some(drafter) if wants.iter().any(|w| w.most > 0) => drafter.draft(&wants),
            Some(_) => Vec::new(),
            None => wants
                .iter()
                .map(|w| prompt_lookup(w.history, NGRAMS, w.most).to_vec())
                .collect(),
        };
        let mut drafted = 0;
        for ((i, len), mut drafts) in plan.iter_mut().zip(proposed) {
            drafts.truncate(budget);
            let end = self.running[*i].seq.computed() + 1 + drafts.len();
            if drafts.is_empty() || !self.grow(*i, end) {
                continue;
            }
            let seq = &mut self.running[*i].seq;
            seq.propose(&drafts);
            *len += seq.drafted();
            budget -= seq.drafted();
            drafted += seq.drafted();
        }
        self.stats.drafted_tokens += drafted as u64;
        drafted
    }
}
