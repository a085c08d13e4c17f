//! Captured passes: a pass of a few rows is launch-bound (two or three hundred small kernels,
//! each costing the host a few microseconds to launch), so it is recorded once as a CUDA graph
//! and replayed after for any sequences of the same shape. Positions, token ids and page
//! tables are read from device memory ([`Act::Step`](crate::scratch::Act::Step)), so what a
//! graph bakes in is the pass's [`PassShape`] and the buffers' addresses, fixed until the
//! activations grow (which drops every graph).

use std::collections::VecDeque;

use cudarc::driver::CudaGraph;

use crate::pass::Pass;

/// Passes of at most this many rows are captured; a larger pass keeps the GPU busy for longer
/// than its launches take, so it is launched kernel by kernel.
pub const MAX_GRAPH_ROWS: usize = 128;
/// Graphs kept at most; beyond it the least recently replayed one is dropped.
const MAX_GRAPHS: usize = 256;
/// Shapes remembered as seen once (a shape is captured the second time it comes, so a one-off
/// pass never pays for a capture).
const MAX_SEEN: usize = 512;

/// What a pass's launches depend on besides the buffers' addresses: two passes of one shape
/// replay one graph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PassShape {
    rows: usize,
    heads: usize,
    head_is_last: bool,
    /// Blocks per head of the split decode attention (a GEMV pass; 0 otherwise).
    splits: usize,
    /// A pass of long chunks (the prefill attention).
    long: bool,
}

impl PassShape {
    /// The shape of `pass`.
    pub fn of(pass: &Pass) -> Self {
        Self {
            rows: pass.rows,
            heads: pass.heads,
            head_is_last: pass.head_is_last,
            splits: if pass.long { 0 } else { pass.splits },
            long: pass.long,
        }
    }
}

/// One captured pass.
struct Kept {
    shape: PassShape,
    graph: CudaGraph,
    /// When it was last replayed ([`Graphs::clock`]).
    used: u64,
}

/// The captured passes of a [`Scratch`](crate::scratch::Scratch)'s buffers.
#[derive(Default)]
pub struct Graphs {
    kept: Vec<Kept>,
    seen: VecDeque<PassShape>,
    clock: u64,
    /// Captures invalidated from outside their pass (each pass then ran uncaptured).
    invalidated: usize,
}

// SAFETY: CUDA graphs may be launched from any thread as long as calls on one graph are
// serialized; the graphs live inside the backend and are only reached through `&mut self`.
unsafe impl Send for Graphs {}

impl Graphs {
    /// Drops every graph (their launches name buffers about to be freed).
    pub fn clear(&mut self) {
        self.kept.clear();
    }

    /// Graphs held.
    pub fn len(&self) -> usize {
        self.kept.len()
    }

    /// Counts a capture invalidated from outside its pass.
    pub fn note_invalidated(&mut self) {
        self.invalidated += 1;
    }

    /// Captures invalidated so far.
    pub fn invalidated(&self) -> usize {
        self.invalidated
    }

    /// The graph of `shape`, if captured.
    pub fn get(&mut self, shape: &PassShape) -> Option<&CudaGraph> {
        self.clock += 1;
        let clock = self.clock;
        let kept = self.kept.iter_mut().find(|k| k.shape == *shape)?;
        kept.used = clock;
        Some(&kept.graph)
    }

    /// Whether a pass of `shape`, not captured yet, is worth capturing now: it came before.
    /// Otherwise remembers it.
    pub fn seen_before(&mut self, shape: &PassShape) -> bool {
        if let Some(i) = self.seen.iter().position(|s| s == shape) {
            self.seen.remove(i);
            return true;
        }
        if self.seen.len() == MAX_SEEN {
            self.seen.pop_front();
        }
        self.seen.push_back(shape.clone());
        false
    }

    /// Keeps `graph` for `shape`, dropping the least recently replayed graph when full.
    pub fn keep(&mut self, shape: PassShape, graph: CudaGraph) {
        if self.kept.len() == MAX_GRAPHS
            && let Some(oldest) = (0..self.kept.len()).min_by_key(|&i| self.kept[i].used)
        {
            self.kept.swap_remove(oldest);
        }
        self.clock += 1;
        self.kept.push(Kept {
            shape,
            graph,
            used: self.clock,
        });
    }
}
