//! Device state besides the weights and the KV pool: activation buffers sized for the largest
//! pass seen, the page-locked logits, and the captured passes. It persists
//! across steps and sequences: every pass runs through the same buffers.

use cudarc::driver::PinnedHostSlice;
use worker_common::backend::{BackendError, Chunk, PAGE_SIZE};
use worker_common::model::ModelPlan;

use crate::device::{Buffer, Gpu, device_error};
use crate::graphs::Graphs;
use crate::moe::MoeLayout;
use crate::ops::{AllowedMask, ArgmaxScratch, SplitScratch};
use crate::params::{DevPtr, StepRows};
use crate::qgemm::SplitRoom;
use crate::qgemv::quantized_row_bytes;

/// Indices into the activation buffers.
#[derive(Clone, Copy)]
pub enum Act {
    /// Residual stream.
    X,
    /// Normalized input of a projection.
    Normed,
    /// Queries.
    Q,
    /// Keys.
    K,
    /// Values.
    V,
    /// Output of a fused projection.
    Fused,
    /// Attention output.
    Attn,
    /// Output projection before the residual add (float formats and post-norms).
    Projected,
    /// Gate, then the gated product.
    Gate,
    /// Up projection.
    Up,
    /// The pass's rows as `u32` arrays ([`Layout`]): token ids, positions, page-table
    /// offsets, the rows the head reads, then the page tables. The kernels read them from
    /// here, so a captured pass replays at any position of any sequence.
    Step,
    /// Logits of the head rows, then their greedy choices (one `u32` each).
    Logits,
    /// Partial results of the split decode attention.
    Partial,
    /// Per query and head counts of the split decode attention's finished blocks (zeroed).
    Counters,
    /// Input rows quantized once for the int8-activation GEMVs that read them.
    Quantized,
    /// The greedy choice's count and per-block bests ([`ArgmaxScratch`]; zeroed).
    Argmax,
    /// A grammar's mask of allowed ids per head row ([`Scratch::choose_among`]).
    Allowed,
    /// The tensor-core GEMM's segment totals ([`SplitRoom`]).
    SplitPartial,
    /// Its counts of finished segments per tile (zeroed).
    SplitCounters,
    /// The routed experts' logits, choices and activations ([`MoeLayout`]; 4 bytes without
    /// experts).
    Moe,
}

/// What a pass needs room for.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Need {
    /// Token rows.
    pub rows: usize,
    /// Rows the output head multiplies (chunks that want logits or a greedy choice).
    pub heads: usize,
    /// Rows of the split decode attention (the rows of a GEMV pass).
    pub split_rows: usize,
    /// Page-table entries of all the pass's chunks.
    pub table_entries: usize,
}

impl Need {
    /// The larger of each.
    pub fn max(self, other: Need) -> Need {
        Need {
            rows: self.rows.max(other.rows),
            heads: self.heads.max(other.heads),
            split_rows: self.split_rows.max(other.split_rows),
            table_entries: self.table_entries.max(other.table_entries),
        }
    }

    /// Whether `self` holds `other`.
    fn holds(self, other: Need) -> bool {
        self.max(other) == self
    }

    /// Room for `need` grown from `self`: each size that falls short at least doubles, so that
    /// sequences growing a page at a time (their page tables) reallocate rarely.
    fn grown(self, need: Need) -> Need {
        let grow = |have: usize, want: usize| {
            if want > have {
                want.max(2 * have)
            } else {
                have
            }
        };
        Need {
            rows: grow(self.rows, need.rows),
            heads: grow(self.heads, need.heads),
            split_rows: grow(self.split_rows, need.split_rows),
            table_entries: grow(self.table_entries, need.table_entries),
        }
    }
}

/// Byte offsets of the arrays in [`Act::Step`] for a capacity.
#[derive(Debug, Clone, Copy)]
struct Layout {
    pos: usize,
    tables: usize,
    heads: usize,
    pages: usize,
}

impl Layout {
    fn of(room: Need) -> Self {
        let pos = 4 * room.rows;
        let tables = pos + 4 * room.rows;
        let heads = tables + 4 * room.rows;
        Layout {
            pos,
            tables,
            heads,
            pages: heads + 4 * room.heads,
        }
    }

    fn bytes(&self, room: Need) -> usize {
        self.pages + 4 * room.table_entries
    }
}

/// Activation buffers, grown to the largest pass and reused.
pub struct Scratch {
    /// What the buffers hold.
    room: Need,
    /// The smallest room reserved: one token of one full context.
    floor: Need,
    /// Vocabulary size.
    vocab: usize,
    /// The host side of [`Act::Step`], kept so that a step allocates nothing.
    staging: Vec<u8>,
    buffers: Vec<Buffer>,
    /// Logits of the head rows, then their choices, copied here straight from the GPU.
    logits: Option<PinnedHostSlice<f32>>,
    /// Head rows of the last pass.
    heads: usize,
    /// The captured passes.
    pub graphs: Graphs,
    /// Bytes and counts of the GEMM's split room.
    split: (usize, usize),
    /// Where [`Act::Moe`] holds what, for a model with experts.
    moe: Option<MoeLayout>,
}

impl Scratch {
    /// No buffers yet; a pass will get room for at least one token with a page table of
    /// `table_pages` entries.
    pub fn new(table_pages: usize, vocab: usize) -> Self {
        Self {
            room: Need::default(),
            floor: Need {
                rows: 1,
                heads: 1,
                split_rows: 1,
                table_entries: table_pages,
            },
            vocab,
            staging: Vec::new(),
            buffers: Vec::new(),
            logits: None,
            heads: 0,
            graphs: Graphs::default(),
            split: (0, 0),
            moe: None,
        }
    }

    /// The layout of [`Act::Moe`], for a model with experts.
    pub fn moe_layout(&self) -> Option<MoeLayout> {
        self.moe
    }

    /// Bytes of VRAM held.
    pub fn bytes(&self) -> usize {
        self.buffers.iter().map(Buffer::bytes).sum()
    }

    /// An activation buffer as elements of `T` (f32 unless its [`Act`] says otherwise).
    pub fn ptr<T>(&self, act: Act) -> DevPtr<T> {
        self.buffers[act as usize].ptr()
    }

    /// The `int` array of [`Act::Step`] at byte `offset`.
    fn step_ints(&self, offset: usize) -> DevPtr<i32> {
        self.ptr::<u8>(Act::Step).offset(offset).cast()
    }

    /// Where the rows of the pass sit ([`Act::Step`]'s arrays).
    pub fn rows(&self) -> StepRows {
        let layout = Layout::of(self.room);
        StepRows {
            pos: self.step_ints(layout.pos),
            tables: self.step_ints(layout.tables),
            pages: self.step_ints(layout.pages),
        }
    }

    /// The pass's token ids ([`Act::Step`]'s first array).
    pub fn tokens(&self) -> DevPtr<u32> {
        self.ptr(Act::Step)
    }

    /// The head rows' indices in [`Act::Step`].
    pub fn heads_ptr(&self) -> DevPtr<i32> {
        self.step_ints(Layout::of(self.room).heads)
    }

    /// The tensor-core GEMM's room for the segments of wide matrices.
    pub fn split(&self) -> SplitRoom {
        SplitRoom {
            partial: self.ptr(Act::SplitPartial),
            partial_bytes: self.split.0,
            counters: self.ptr(Act::SplitCounters),
            counter_count: self.split.1,
        }
    }

    /// The greedy choice's scratch ([`Act::Argmax`]).
    pub fn argmax(&self) -> ArgmaxScratch {
        ArgmaxScratch {
            counts: self.ptr(Act::Argmax),
            rows: self.room.heads,
        }
    }

    /// Head row `head`'s logits in [`Act::Logits`].
    pub fn logits_row(&self, head: usize) -> DevPtr<f32> {
        self.ptr::<f32>(Act::Logits).offset(head * self.vocab)
    }

    /// The head rows' greedy choices (after their logits).
    pub fn choices_ptr(&self) -> DevPtr<u32> {
        self.logits_row(self.room.heads).cast()
    }

    /// Makes room for a pass; a reallocation drops the captured steps, whose launches name the
    /// old addresses.
    pub fn reserve(&mut self, gpu: &Gpu, plan: &ModelPlan, need: Need) -> Result<(), BackendError> {
        if !self.room.holds(need) || self.buffers.is_empty() {
            let room = self.room.grown(need).max(self.floor);
            self.allocate(gpu, plan, room)?;
        }
        Ok(())
    }

    fn allocate(&mut self, gpu: &Gpu, plan: &ModelPlan, room: Need) -> Result<(), BackendError> {
        let hp = &plan.hp;
        self.graphs.clear();
        self.buffers.clear();
        self.logits = None;
        self.room = Need::default();
        let n = room.rows;
        let fused = if plan.fused {
            (hp.q_width() + hp.k_width() + hp.v_width()).max(2 * hp.n_ff)
        } else {
            0
        };
        let widths = [
            hp.n_embd,
            hp.n_embd,
            hp.q_width(),
            hp.k_width(),
            hp.v_width(),
            fused,
            hp.attn_out_width(),
            hp.n_embd,
            hp.n_ff,
            hp.n_ff,
        ];
        for width in widths {
            self.buffers.push(gpu.alloc(n * width * 4, "activations")?);
        }
        let zeroed = |bytes: usize| -> Result<Buffer, BackendError> {
            let mut buffer = gpu.alloc(bytes, "activations")?;
            gpu.upload(&vec![0; bytes], &mut buffer, 0)?;
            Ok(buffer)
        };
        let layout = Layout::of(room);
        self.buffers
            .push(gpu.alloc(layout.bytes(room), "activations")?);
        let logits = room.heads * (self.vocab + 1) * 4;
        self.buffers.push(gpu.alloc(logits, "activations")?);
        let partial = SplitScratch::partial_floats(hp.n_head, hp.head_dim_v);
        let split = room.split_rows;
        self.buffers
            .push(gpu.alloc(split * partial * 4, "activations")?);
        self.buffers.push(zeroed(split * hp.n_head * 4)?);
        let widest = hp.n_ff.max(hp.n_embd).max(hp.attn_out_width());
        let quantized = n * quantized_row_bytes(widest);
        self.buffers.push(gpu.alloc(quantized, "activations")?);
        self.buffers.push(zeroed(ArgmaxScratch::bytes(room.heads))?);
        let mask_words = self.vocab.div_ceil(32);
        self.buffers
            .push(gpu.alloc(room.heads * mask_words * 4, "activations")?);
        let (split_bytes, split_counts) = SplitRoom::need(plan, room.rows);
        self.buffers
            .push(gpu.alloc(split_bytes.max(4), "activations")?);
        self.buffers.push(zeroed(split_counts.max(1) * 4)?);
        self.split = (split_bytes, split_counts);
        self.moe = MoeLayout::of(plan, n);
        let moe_bytes = self.moe.map_or(4, |layout| layout.bytes());
        self.buffers.push(gpu.alloc(moe_bytes, "activations")?);
        self.logits = Some(gpu.alloc_pinned(room.heads * (self.vocab + 1))?);
        self.room = room;
        Ok(())
    }

    /// Uploads the rows of a pass over `chunks` into [`Act::Step`], in one copy: each chunk's
    /// tokens at their positions with its page table (the entries it reaches), and as head
    /// rows the rows each chunk wants an output after ([`Want::output_rows`]: its last, or all
    /// of them for a verify pass), in chunk order. [`Scratch::reserve`] made room
    /// ([`Scratch::need`]).
    pub fn upload_step(&mut self, gpu: &Gpu, chunks: &[&Chunk<'_>]) -> Result<(), BackendError> {
        let need = Self::need(chunks, false);
        if !self.room.holds(need) {
            return Err(BackendError::InvalidInput(format!(
                "a pass of {need:?} exceeds the step buffer's {:?}",
                self.room
            )));
        }
        let layout = Layout::of(self.room);
        // Only what the pass uses: its rows' arrays, then its page tables.
        let mut words = vec![0u32; layout.pages / 4 + need.table_entries];
        let (mut row, mut entries, mut heads) = (0, 0, 0);
        for chunk in chunks {
            let table = &chunk.pages[..table_len(chunk)];
            for (j, &token) in chunk.tokens.iter().enumerate() {
                words[row] = token;
                // Positions and offsets fit an `int`: the step checked them.
                words[layout.pos / 4 + row] = (chunk.start_pos + j) as u32;
                words[layout.tables / 4 + row] = entries as u32;
                row += 1;
            }
            let outputs = chunk.want.output_rows(chunk.tokens.len());
            for k in 0..outputs {
                words[layout.heads / 4 + heads + k] = (row - outputs + k) as u32;
            }
            heads += outputs;
            for (k, page) in table.iter().enumerate() {
                words[layout.pages / 4 + entries + k] = page.0;
            }
            entries += table.len();
        }
        self.heads = heads;
        self.staging.clear();
        self.staging
            .extend(words.into_iter().flat_map(u32::to_le_bytes));
        gpu.upload(&self.staging, &mut self.buffers[Act::Step as usize], 0)
    }

    /// What a pass over `chunks` needs (`split`: it takes the split decode attention).
    pub fn need(chunks: &[&Chunk<'_>], split: bool) -> Need {
        let rows = chunks.iter().map(|c| c.tokens.len()).sum();
        Need {
            rows,
            heads: chunks
                .iter()
                .map(|c| c.want.output_rows(c.tokens.len()))
                .sum(),
            split_rows: if split { rows } else { 0 },
            table_entries: chunks.iter().map(|c| table_len(c)).sum(),
        }
    }

    /// Copies the logits of head rows `head..head + count` (one after another on the GPU) into
    /// the page-locked buffer in one copy and waits for them.
    pub fn download_logits(
        &mut self,
        gpu: &Gpu,
        head: usize,
        count: usize,
    ) -> Result<(), BackendError> {
        if head + count > self.heads {
            return Err(BackendError::InvalidInput(format!(
                "logits rows {head}..{} asked of a pass of {} head rows",
                head + count,
                self.heads
            )));
        }
        let vocab = self.vocab;
        let src = self.logits_row(head);
        let logits = self.logits.as_mut().ok_or_else(no_logits)?;
        gpu.download_pinned(src, logits, 0, count * vocab)
    }

    /// Copies the greedy choices of the last pass's head rows (after the logits' room in the
    /// page-locked buffer) and waits for them: a greedy step needs 4 bytes a row, not the
    /// vocabulary's logits.
    pub fn download_choices(&mut self, gpu: &Gpu) -> Result<(), BackendError> {
        let (src, offset, heads) = (
            self.choices_ptr().cast(),
            self.room.heads * self.vocab,
            self.heads,
        );
        let logits = self.logits.as_mut().ok_or_else(no_logits)?;
        gpu.download_pinned(src, logits, offset, heads)
    }

    /// Replaces head row `head`'s greedy choice (still on the device) by the choice among the
    /// ids `mask` allows (a bitset over ids; those past it are not allowed): the mask is
    /// uploaded and the choice made again over the row's logits, behind the pass in the stream.
    pub fn choose_among(
        &mut self,
        gpu: &Gpu,
        head: usize,
        mask: &[u32],
    ) -> Result<(), BackendError> {
        let words = mask.len().min(self.vocab.div_ceil(32));
        self.staging.clear();
        self.staging
            .extend(mask[..words].iter().flat_map(|w| w.to_le_bytes()));
        let offset = 4 * head * self.vocab.div_ceil(32);
        gpu.upload(
            &self.staging,
            &mut self.buffers[Act::Allowed as usize],
            offset,
        )?;
        let allowed = AllowedMask {
            ptr: self.ptr::<u8>(Act::Allowed).offset(offset).cast(),
            words,
        };
        let logits = self.logits_row(head);
        let out = self.choices_ptr().offset(head);
        // One row: it takes row 0's count and pairs, free once the pass's launch is done.
        gpu.argmax_logits(logits, self.vocab, 1, out, self.argmax(), Some(allowed))
    }

    /// Row `row` of the logits downloaded last.
    pub fn logits(&self, row: usize) -> Result<&[f32], BackendError> {
        let vocab = self.vocab;
        self.downloaded()?
            .get(row * vocab..(row + 1) * vocab)
            .ok_or_else(|| BackendError::InvalidInput(format!("no downloaded logits row {row}")))
    }

    /// The greedy choice of head row `head`, once downloaded.
    pub fn greedy(&self, head: usize) -> Option<u32> {
        let offset = self.room.heads * self.vocab + head;
        self.downloaded().ok()?.get(offset).map(|id| id.to_bits())
    }

    /// The page-locked buffer: logits, then the choices as bits.
    fn downloaded(&self) -> Result<&[f32], BackendError> {
        self.logits
            .as_ref()
            .ok_or_else(no_logits)?
            .as_slice()
            .map_err(|e| device_error("reading the logits", e))
    }
}

/// Page-table entries chunk `c` reaches.
fn table_len(c: &Chunk<'_>) -> usize {
    c.end_pos().div_ceil(PAGE_SIZE)
}

fn no_logits() -> BackendError {
    BackendError::Device("no logits: no chunk has run".to_owned())
}
