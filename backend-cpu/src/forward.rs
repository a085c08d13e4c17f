//! The transformer forward pass of every architecture: one code path whose per-architecture
//! differences (biases, fused projections, Gemma's norms and scales, sliding windows, sinks,
//! routed experts) come from the loaded [`Weights`] and the [`ModelPlan`].

use worker_common::backend::{BackendError, Chunk};
use worker_common::model::{Ffn, GateUp, ModelPlan, Qkv, RopePlan};

use crate::attention::{Query, Row, attention};
use crate::kv::{KvPool, pool_row};
use crate::matmul::{MatmulScratch, matmul, matmul_group};
use crate::moe::MoeBuffers;
use crate::ops;
use crate::quant;
use crate::team::Team;
use crate::weights::{Layer, Matrix, Weights};

/// Activation buffers, reused across steps so decode steps do not allocate. Row `r` of every
/// activation is row `r` of the step: the chunks' tokens concatenated.
#[derive(Debug, Default)]
pub struct Buffers {
    rows: Vec<Row>,
    /// The rows whose logits the step computes, in order.
    output_rows: Vec<usize>,
    x: Vec<f32>,
    normed: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    fused: Vec<f32>,
    attn: Vec<f32>,
    projected: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    angles: StepAngles,
    /// The logits of the output rows, row-major.
    pub logits: Vec<f32>,
    matmul: MatmulScratch,
    moe: MoeBuffers,
}

impl Buffers {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        let floats = [
            &self.x,
            &self.normed,
            &self.q,
            &self.k,
            &self.v,
            &self.fused,
            &self.attn,
            &self.projected,
            &self.gate,
            &self.up,
            &self.logits,
        ]
        .iter()
        .map(|v| v.capacity())
        .sum::<usize>();
        floats * size_of::<f32>()
            + self.rows.capacity() * size_of::<Row>()
            + self.output_rows.capacity() * size_of::<usize>()
            + self.matmul.bytes()
            + self.moe.bytes()
    }
}

/// Everything one forward call reads.
pub struct Model<'a> {
    /// Derived constants.
    pub plan: &'a ModelPlan,
    /// Tensor locations.
    pub weights: &'a Weights,
    /// The mapped file.
    pub file: &'a [u8],
    /// The threads the step's parallel regions run on.
    pub team: &'a Team,
}

impl Model<'_> {
    /// Runs every token of `chunks` (validated) and leaves in `buf.logits` the logits of each
    /// chunk's output rows ([`Want::output_rows`](worker_common::backend::Want::output_rows)),
    /// in order, or with `all_rows` of every position of every chunk.
    pub fn forward(
        &self,
        chunks: &[Chunk<'_>],
        all_rows: bool,
        kv: &mut KvPool,
        buf: &mut Buffers,
    ) -> Result<(), BackendError> {
        buf.rows.clear();
        buf.output_rows.clear();
        for (index, chunk) in chunks.iter().enumerate() {
            let rows = (chunk.start_pos..chunk.end_pos()).map(|pos| Row { pos, chunk: index });
            buf.rows.extend(rows);
            let outputs = if all_rows {
                chunk.tokens.len()
            } else {
                chunk.want.output_rows(chunk.tokens.len())
            };
            buf.output_rows
                .extend(buf.rows.len() - outputs..buf.rows.len());
        }
        let n = buf.rows.len();
        if n == 0 {
            buf.logits.clear();
            return Ok(());
        }
        buf.angles.forget();
        self.embed(chunks, buf)?;
        let layers = &self.weights.layers;
        if let Some(first) = layers.first() {
            self.norm_rows(&buf.x, &first.attn_norm, &mut buf.normed);
        }
        for (il, layer) in layers.iter().enumerate() {
            self.attention_block(il, layer, chunks, kv, buf)?;
            let post = layer.post_attn_norm.as_deref();
            self.residual(post, Some(&layer.ffn_norm), buf);
            self.ffn_block(layer, n, buf)?;
            let next = layers.get(il + 1).map(|next| &next.attn_norm[..]);
            self.residual(layer.post_ffn_norm.as_deref(), next, buf);
        }
        self.logits(buf)
    }

    /// The final norm and output projection of the output rows only.
    fn logits(&self, buf: &mut Buffers) -> Result<(), BackendError> {
        let hp = &self.plan.hp;
        let outputs = buf.output_rows.len();
        buf.logits.resize(outputs * hp.vocab_size, 0.0);
        if outputs == 0 {
            return Ok(());
        }
        buf.normed.clear();
        for &row in &buf.output_rows {
            buf.normed
                .extend_from_slice(&buf.x[row * hp.n_embd..(row + 1) * hp.n_embd]);
        }
        ops::rms_norm(&mut buf.normed, &self.weights.output_norm, hp.norm_eps);
        let output = &self.weights.output;
        matmul(
            self.team,
            output,
            self.file,
            &buf.normed,
            outputs,
            &mut buf.logits,
            &mut buf.matmul,
        )?;
        if let Some(bias) = &self.weights.output_bias {
            ops::add_bias(&mut buf.logits, bias);
        }
        if let Some(cap) = hp.final_logit_softcapping {
            ops::softcap(&mut buf.logits, cap);
        }
        Ok(())
    }

    fn embed(&self, chunks: &[Chunk<'_>], buf: &mut Buffers) -> Result<(), BackendError> {
        let table = &self.weights.token_embd;
        let n_embd = self.plan.hp.n_embd;
        buf.x.resize(buf.rows.len() * n_embd, 0.0);
        let tokens = chunks.iter().flat_map(|chunk| chunk.tokens);
        for (&token, row) in tokens.zip(buf.x.chunks_exact_mut(n_embd)) {
            let id = token as usize;
            if id >= table.rows {
                return Err(BackendError::InvalidInput(format!(
                    "token id {id} is outside the vocabulary of {}",
                    table.rows
                )));
            }
            let bytes = table
                .rows_data(self.file)
                .and_then(|rows| rows.get(id * table.row_bytes..(id + 1) * table.row_bytes))
                .ok_or_else(|| {
                    BackendError::InvalidModel(format!("{}: row {id} is not held", table.name))
                })?;
            quant::dequantize(table.ggml_type, bytes, row)
                .map_err(|e| BackendError::InvalidModel(format!("{}: {e}", table.name)))?;
            if let Some(scale) = self.plan.embedding_scale {
                row.iter_mut().for_each(|v| *v *= scale);
            }
        }
        Ok(())
    }

    fn project(
        &self,
        w: &Matrix,
        input: &[f32],
        n: usize,
        out: &mut Vec<f32>,
        scratch: &mut MatmulScratch,
    ) -> Result<(), BackendError> {
        out.resize(n * w.rows, 0.0);
        matmul(self.team, w, self.file, input, n, out, scratch)
    }

    /// [`Self::project`] for matrices sharing their input, in one parallel region.
    fn project_group<const N: usize>(
        &self,
        ws: &[&Matrix; N],
        input: &[f32],
        n: usize,
        mut outs: [&mut Vec<f32>; N],
        scratch: &mut MatmulScratch,
    ) -> Result<(), BackendError> {
        for (out, w) in outs.iter_mut().zip(ws) {
            out.resize(n * w.rows, 0.0);
        }
        let mut outs = outs.map(|out| out.as_mut_slice());
        matmul_group(self.team, ws, self.file, input, n, &mut outs, scratch)
    }

    fn attention_block(
        &self,
        il: usize,
        layer: &Layer,
        chunks: &[Chunk<'_>],
        kv: &mut KvPool,
        buf: &mut Buffers,
    ) -> Result<(), BackendError> {
        let hp = &self.plan.hp;
        let n = buf.rows.len();
        self.qkv(layer, n, buf)?;
        if let Some((q_norm, k_norm)) = &layer.qk_norm {
            ops::rms_norm(&mut buf.q, q_norm, hp.norm_eps);
            ops::rms_norm(&mut buf.k, k_norm, hp.norm_eps);
        }
        let layer_plan = &self.plan.layers[il];
        let rope = &layer_plan.rope;
        let (qw, kw, vw) = (hp.q_width(), hp.k_width(), hp.v_width());
        let angles = buf
            .angles
            .of(rope, self.plan.rope_factors.as_deref(), &buf.rows);
        let pairs = rope.dims / 2;
        let g = self.row_group(n);
        let groups = buf
            .q
            .chunks_mut(qw * g)
            .zip(buf.k.chunks_mut(kw * g))
            .zip(angles.chunks(pairs * g));
        self.each_group(groups, |((q, k), angles)| {
            let rows = q.chunks_exact_mut(qw).zip(k.chunks_exact_mut(kw));
            for ((q_row, k_row), angles) in rows.zip(angles.chunks_exact(pairs)) {
                for head in q_row.chunks_exact_mut(hp.head_dim_k) {
                    ops::rope_apply(rope, head, angles);
                }
                for head in k_row.chunks_exact_mut(hp.head_dim_k) {
                    ops::rope_apply(rope, head, angles);
                }
            }
        });
        // Every row's keys and values are stored before any row attends: a prefill row
        // reads those of the rows before it in its chunk.
        for (t, row) in buf.rows.iter().enumerate() {
            let slot = pool_row(chunks[row.chunk].pages, row.pos);
            kv.store(il, slot, &buf.k[t * kw..][..kw], &buf.v[t * vw..][..vw]);
        }
        buf.attn.resize(n * hp.attn_out_width(), 0.0);
        let query = Query {
            shape: &layer_plan.attention,
            q: &buf.q,
            kv: kv.layer(il),
            rows: &buf.rows,
            chunks,
            sinks: layer.attn_sinks.as_deref(),
        };
        attention(self.team, query, &mut buf.attn);
        let attn = std::mem::take(&mut buf.attn);
        let result = self.project(
            &layer.attn_output,
            &attn,
            n,
            &mut buf.projected,
            &mut buf.matmul,
        );
        buf.attn = attn;
        result?;
        if let Some(bias) = &layer.attn_output_bias {
            ops::add_bias(&mut buf.projected, bias);
        }
        Ok(())
    }

    /// `normed = norm(x) · weight` of every row.
    fn norm_rows(&self, x: &[f32], weight: &[f32], normed: &mut Vec<f32>) {
        let eps = self.plan.hp.norm_eps;
        normed.clear();
        normed.extend_from_slice(x);
        let g = self.row_group(x.len() / weight.len());
        let groups = normed.chunks_mut(weight.len() * g);
        self.each_group(groups, |rows| ops::rms_norm(rows, weight, eps));
    }

    /// Rows per group of the per-row work of a step of `n` rows: all of them for a decode
    /// step's few, whose per-row work (a few microseconds) costs less than handing half of it
    /// to another core (split, a four-sequence SmolLM2 step took 2.5–3 % longer, steps
    /// alternated); [`ROWS_PER_TASK`] for a prefill's many, spread over the team. Rows stay
    /// together so that the norms' per-row sums run side by side (`ops::rms_norm`).
    fn row_group(&self, n: usize) -> usize {
        if n >= PARALLEL_ROWS {
            ROWS_PER_TASK
        } else {
            n.max(1)
        }
    }

    /// Runs `body` on each group of rows of `groups` (see [`Self::row_group`]): over the team
    /// when there are several.
    fn each_group<T: Send>(
        &self,
        groups: impl ExactSizeIterator<Item = T>,
        body: impl Fn(&mut T) + Sync,
    ) {
        if groups.len() > 1 {
            let mut groups: Vec<T> = groups.collect();
            self.team.for_each(&mut groups, body);
        } else {
            groups.for_each(|mut group| body(&mut group));
        }
    }

    /// A block's residual: `x += post_norm(projected)` (Gemma's norm of the block output, when
    /// the model has one), then `normed = next_norm(x)` for the next block, if there is one.
    fn residual(&self, post_norm: Option<&[f32]>, next_norm: Option<&[f32]>, buf: &mut Buffers) {
        let eps = self.plan.hp.norm_eps;
        let width = self.plan.hp.n_embd * self.row_group(buf.rows.len());
        buf.normed.resize(buf.x.len(), 0.0);
        let groups = buf
            .x
            .chunks_mut(width)
            .zip(buf.projected.chunks_mut(width))
            .zip(buf.normed.chunks_mut(width));
        self.each_group(groups, |((x, projected), normed)| {
            if let Some(norm) = post_norm {
                ops::rms_norm(projected, norm, eps);
            }
            ops::add_in_place(x, projected);
            if let Some(norm) = next_norm {
                normed.copy_from_slice(x);
                ops::rms_norm(normed, norm, eps);
            }
        });
    }

    /// Fills `buf.q`, `buf.k`, `buf.v` (biases added) from `buf.normed`.
    fn qkv(&self, layer: &Layer, n: usize, buf: &mut Buffers) -> Result<(), BackendError> {
        let hp = &self.plan.hp;
        let (qw, kw, vw) = (hp.q_width(), hp.k_width(), hp.v_width());
        match &layer.qkv {
            Qkv::Separate { q, k, v } => {
                let outs = [&mut buf.q, &mut buf.k, &mut buf.v];
                self.project_group(&[q, k, v], &buf.normed, n, outs, &mut buf.matmul)?;
            }
            Qkv::Fused(qkv) => {
                self.project(qkv, &buf.normed, n, &mut buf.fused, &mut buf.matmul)?;
                let mut parts = [&mut buf.q, &mut buf.k, &mut buf.v];
                split(&buf.fused, &[qw, kw, vw], &mut parts);
            }
        }
        let (q_bias, k_bias, v_bias) = match &layer.qkv_bias {
            Some(Qkv::Separate { q, k, v }) => (&q[..], &k[..], &v[..]),
            Some(Qkv::Fused(bias)) => (&bias[..qw], &bias[qw..qw + kw], &bias[qw + kw..]),
            None => return Ok(()),
        };
        ops::add_bias(&mut buf.q, q_bias);
        ops::add_bias(&mut buf.k, k_bias);
        ops::add_bias(&mut buf.v, v_bias);
        Ok(())
    }

    /// `buf.projected` = the FFN of `buf.normed`.
    fn ffn_block(&self, layer: &Layer, n: usize, buf: &mut Buffers) -> Result<(), BackendError> {
        match &layer.ffn {
            Ffn::Dense { gate_up, down } => self.dense_ffn(gate_up, down, n, buf)?,
            Ffn::Experts(moe) => {
                let (normed, projected) = (&buf.normed, &mut buf.projected);
                self.experts_ffn(moe, normed, n, &mut buf.moe, &mut buf.matmul, projected)?;
            }
        }
        Ok(())
    }

    /// `buf.projected` = `down(act(gate) · up)` of `buf.normed`.
    fn dense_ffn(
        &self,
        gate_up: &GateUp<Matrix>,
        down: &Matrix,
        n: usize,
        buf: &mut Buffers,
    ) -> Result<(), BackendError> {
        match gate_up {
            GateUp::Separate { gate, up } => {
                let outs = [&mut buf.gate, &mut buf.up];
                self.project_group(&[gate, up], &buf.normed, n, outs, &mut buf.matmul)?;
            }
            GateUp::Fused(gate_up) => {
                self.project(gate_up, &buf.normed, n, &mut buf.fused, &mut buf.matmul)?;
                let half = gate_up.rows / 2;
                let mut parts = [&mut buf.gate, &mut buf.up];
                split(&buf.fused, &[half, half], &mut parts);
            }
        }
        let activation = self.plan.activation;
        let width = buf.gate.len() / n * self.row_group(n);
        let groups = buf.gate.chunks_mut(width).zip(buf.up.chunks(width));
        self.each_group(groups, |(gate, up)| ops::gated(activation, gate, up));
        let gate = std::mem::take(&mut buf.gate);
        let result = self.project(down, &gate, n, &mut buf.projected, &mut buf.matmul);
        buf.gate = gate;
        result
    }
}

/// The RoPE angles of a step's rows, computed once per step for each distinct RoPE of the
/// model (every layer, or Gemma's two kinds) instead of once per layer: each is a function of
/// the position and the RoPE alone. Kept between steps so a warm decode step does not allocate.
#[derive(Debug, Default)]
struct StepAngles {
    /// Per RoPE met this step, in `ropes[..current]`: the angles of every row, `[row][pair]`.
    ropes: Vec<(RopePlan, Vec<(f32, f32)>)>,
    current: usize,
    /// One row's angles.
    row: Vec<(f32, f32)>,
}

impl StepAngles {
    /// Starts a step: every row may have changed.
    fn forget(&mut self) {
        self.current = 0;
    }

    /// The angles of `rope` for every row of `rows` (this step's), `rope.dims / 2` per row.
    fn of(&mut self, rope: &RopePlan, factors: Option<&[f32]>, rows: &[Row]) -> &[(f32, f32)] {
        let known = self.ropes[..self.current]
            .iter()
            .position(|(r, _)| r == rope);
        let at = match known {
            Some(at) => at,
            None => {
                if self.current == self.ropes.len() {
                    self.ropes.push((*rope, Vec::new()));
                }
                let (plan, angles) = &mut self.ropes[self.current];
                *plan = *rope;
                angles.clear();
                for row in rows {
                    ops::rope_angles(rope, factors, row.pos, &mut self.row);
                    angles.extend_from_slice(&self.row);
                }
                self.current += 1;
                self.current - 1
            }
        };
        &self.ropes[at].1
    }
}

/// Rows from which the per-row work of a step is spread over the team, and how many rows each
/// task takes (see `Model::row_group`).
const PARALLEL_ROWS: usize = 16;
const ROWS_PER_TASK: usize = 8;

/// Splits each row of `fused` (the concatenation of parts of `widths`) into `outs`.
fn split(fused: &[f32], widths: &[usize], outs: &mut [&mut Vec<f32>]) {
    for out in outs.iter_mut() {
        out.clear();
    }
    let row_width: usize = widths.iter().sum();
    for row in fused.chunks_exact(row_width) {
        let mut offset = 0;
        for (out, &width) in outs.iter_mut().zip(widths) {
            out.extend_from_slice(&row[offset..offset + width]);
            offset += width;
        }
    }
}
