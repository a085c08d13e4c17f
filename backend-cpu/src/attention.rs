//! The KV cache of one sequence and causal (optionally sliding-window) attention over it.
//!
//! Keys and values are stored as f16, as llama.cpp and vLLM store them by default: half the
//! memory of f32, and the rounding llama.cpp's logits carry (Qwen's large key biases make the
//! difference visible in the parity tests). Attention itself runs in f32.

use half::f16;
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;
use worker_common::backend::BackendError;

/// Keys and values of every layer for positions `0..len`, f16, `[pos][kv_head][head_dim]`.
///
/// Capacity for the whole sequence is reserved up front (so a too-large request fails at
/// `begin_sequence`, not mid-generation), but pages are only touched as positions fill.
#[derive(Debug, Default)]
pub struct KvCache {
    keys: Vec<Vec<f16>>,
    values: Vec<Vec<f16>>,
    k_width: usize,
    v_width: usize,
    max_len: usize,
}

impl KvCache {
    /// Reserves room for `max_len` positions of `n_layers` layers.
    pub fn new(
        n_layers: usize,
        max_len: usize,
        k_width: usize,
        v_width: usize,
    ) -> Result<Self, BackendError> {
        let reserve = |width: usize| -> Result<Vec<f16>, BackendError> {
            let elements = max_len.saturating_mul(width);
            let mut buffer = Vec::new();
            buffer
                .try_reserve_exact(elements)
                .map_err(|_| BackendError::OutOfMemory {
                    what: "KV cache",
                    bytes: (elements as u64).saturating_mul(2),
                })?;
            Ok(buffer)
        };
        let mut cache = Self {
            k_width,
            v_width,
            max_len,
            ..Self::default()
        };
        for _ in 0..n_layers {
            cache.keys.push(reserve(k_width)?);
            cache.values.push(reserve(v_width)?);
        }
        Ok(cache)
    }

    /// Positions the cache has room for.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Bytes reserved.
    pub fn bytes(&self) -> usize {
        let reserved: usize = self
            .keys
            .iter()
            .chain(&self.values)
            .map(Vec::capacity)
            .sum();
        reserved * size_of::<f16>()
    }

    /// Writes the keys and values of positions `start_pos..` of `layer` (dropping any later
    /// positions) and returns all keys and values of positions `0..start_pos + n`.
    pub fn store(
        &mut self,
        layer: usize,
        start_pos: usize,
        k: &[f32],
        v: &[f32],
    ) -> Option<(&[f16], &[f16])> {
        let keys = self.keys.get_mut(layer)?;
        let values = self.values.get_mut(layer)?;
        keys.truncate(start_pos * self.k_width);
        values.truncate(start_pos * self.v_width);
        if keys.len() != start_pos * self.k_width || values.len() != start_pos * self.v_width {
            return None;
        }
        keys.extend(k.iter().map(|&x| f16::from_f32(x)));
        values.extend(v.iter().map(|&x| f16::from_f32(x)));
        Some((keys, values))
    }
}

/// Shape of one attention call.
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (grouped-query attention shares each among `n_head / n_head_kv`).
    pub n_head_kv: usize,
    /// Query/key head width.
    pub head_dim_k: usize,
    /// Value head width.
    pub head_dim_v: usize,
    /// Multiplier of `q · k`.
    pub scale: f32,
    /// Keys visible to a query at `p`: `p + 1 - window ..= p`; `None` for all of `0..=p`.
    pub window: Option<usize>,
}

/// Attention of `n` queries at positions `start_pos..start_pos + n` over `keys`/`values`
/// (positions `0..start_pos + n`), writing `out` as `[token][head][head_dim_v]`.
pub fn attention(
    shape: &AttentionShape,
    q: &[f32],
    keys: &[f16],
    values: &[f16],
    start_pos: usize,
    out: &mut [f32],
) {
    let group = shape.n_head / shape.n_head_kv;
    let inputs = Inputs {
        shape,
        q,
        keys,
        values,
        start_pos,
    };
    // One task per (token, KV head): each key and value row is widened once for the `group`
    // query heads that share it; each head's operations are those of a task of its own.
    out.par_chunks_mut(group * shape.head_dim_v)
        .enumerate()
        .for_each_init(Scratch::default, |scratch, (index, group_out)| {
            simd::group_task(&inputs, scratch, index, group_out)
        });
}

/// What every attention task reads.
struct Inputs<'a> {
    shape: &'a AttentionShape,
    q: &'a [f32],
    keys: &'a [f16],
    values: &'a [f16],
    start_pos: usize,
}

/// The attention of one token's query heads that share KV head `index % n_head_kv`, into
/// `group_out` (`group` rows of `head_dim_v`).
#[inline(always)]
fn group_task(inputs: &Inputs<'_>, scratch: &mut Scratch, index: usize, group_out: &mut [f32]) {
    let AttentionShape {
        n_head,
        n_head_kv,
        head_dim_k: dk,
        head_dim_v: dv,
        scale,
        window,
    } = *inputs.shape;
    let group = n_head / n_head_kv;
    let (k_width, v_width) = (n_head_kv * dk, n_head_kv * dv);
    let Scratch {
        scores,
        row,
        inv_sums,
    } = scratch;
    row.resize(dk.max(dv), 0.0);
    let (t, kv_head) = (index / n_head_kv, index % n_head_kv);
    let pos = inputs.start_pos + t;
    let first = window.map_or(0, |w| (pos + 1).saturating_sub(w));
    let len = pos + 1 - first;
    let queries = &inputs.q[(t * n_head + kv_head * group) * dk..][..group * dk];
    // Head `j`'s scores are `scores[j * len..(j + 1) * len]`.
    scores.clear();
    scores.resize(group * len, 0.0);
    for (i, p) in (first..=pos).enumerate() {
        let key = &mut row[..dk];
        inputs.keys[p * k_width + kv_head * dk..][..dk].convert_to_f32_slice(key);
        for (j, query) in queries.chunks_exact(dk).enumerate() {
            scores[j * len + i] = dot(query, key) * scale;
        }
    }
    inv_sums.clear();
    for head_scores in scores.chunks_exact_mut(len) {
        let max = head_scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
        let mut sum = 0.0f64;
        for s in head_scores.iter_mut() {
            *s = (*s - max).exp();
            sum += f64::from(*s);
        }
        inv_sums.push((1.0 / sum) as f32);
    }
    group_out.fill(0.0);
    for (i, p) in (first..=pos).enumerate() {
        let value = &mut row[..dv];
        inputs.values[p * v_width + kv_head * dv..][..dv].convert_to_f32_slice(value);
        for (j, head_out) in group_out.chunks_exact_mut(dv).enumerate() {
            let weight = scores[j * len + i];
            for (o, v) in head_out.iter_mut().zip(value.iter()) {
                *o += weight * v;
            }
        }
    }
    for (head_out, &inv_sum) in group_out.chunks_exact_mut(dv).zip(inv_sums.iter()) {
        for o in head_out.iter_mut() {
            *o *= inv_sum;
        }
    }
}

/// [`group_task`] compiled for AVX2 where the CPU has it, so its eight-lane dots and row
/// updates run as single vector operations: the same IEEE operations in the same order (Rust
/// never fuses a multiply and an add on its own), so the same bits as the plain build.
mod simd {
    use super::{Inputs, Scratch};

    pub(super) fn group_task(
        inputs: &Inputs<'_>,
        scratch: &mut Scratch,
        index: usize,
        group_out: &mut [f32],
    ) {
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            // SAFETY: the features were detected on this CPU.
            return unsafe { avx2(inputs, scratch, index, group_out) };
        }
        super::group_task(inputs, scratch, index, group_out)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn avx2(inputs: &Inputs<'_>, scratch: &mut Scratch, index: usize, out: &mut [f32]) {
        super::group_task(inputs, scratch, index, out)
    }
}

/// Per-task buffers: the scores of a group's queries, one key or value row in f32, and each
/// query's softmax normaliser.
#[derive(Default)]
struct Scratch {
    scores: Vec<f32>,
    row: Vec<f32>,
    inv_sums: Vec<f32>,
}

/// `Σ a[i]·b[i]` over eight lanes, so the compiler can vectorise it without reassociating.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let mut a_chunks = a.chunks_exact(8);
    let mut b_chunks = b.chunks_exact(8);
    for (x, y) in (&mut a_chunks).zip(&mut b_chunks) {
        for i in 0..8 {
            lanes[i] += x[i] * y[i];
        }
    }
    let tail: f32 = a_chunks
        .remainder()
        .iter()
        .zip(b_chunks.remainder())
        .map(|(x, y)| x * y)
        .sum();
    lanes.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;

    fn halves(values: &[f32]) -> Vec<f16> {
        values.iter().map(|&v| f16::from_f32(v)).collect()
    }

    fn shape(window: Option<usize>) -> AttentionShape {
        AttentionShape {
            n_head: 2,
            n_head_kv: 1,
            head_dim_k: 2,
            head_dim_v: 2,
            scale: 1.0,
            window,
        }
    }

    /// The dispatched (AVX2 where available) tasks give the plain build's bits, for grouped
    /// heads, a window and odd head sizes.
    #[test]
    fn simd_tasks_equal_the_plain_build() {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0
        };
        let shape = AttentionShape {
            n_head: 6,
            n_head_kv: 2,
            head_dim_k: 67,
            head_dim_v: 35,
            scale: 0.125,
            window: Some(9),
        };
        let (n, start_pos) = (5, 7);
        let positions = start_pos + n;
        let q: Vec<f32> = (0..n * 6 * 67).map(|_| next()).collect();
        let keys = halves(&(0..positions * 2 * 67).map(|_| next()).collect::<Vec<_>>());
        let values = halves(&(0..positions * 2 * 35).map(|_| next()).collect::<Vec<_>>());
        let mut fast = vec![0.0; n * 6 * 35];
        attention(&shape, &q, &keys, &values, start_pos, &mut fast);
        let inputs = Inputs {
            shape: &shape,
            q: &q,
            keys: &keys,
            values: &values,
            start_pos,
        };
        let mut scratch = Scratch::default();
        let mut plain = vec![0.0; fast.len()];
        for (index, out) in plain.chunks_exact_mut(3 * 35).enumerate() {
            group_task(&inputs, &mut scratch, index, out);
        }
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&fast), bits(&plain));
    }

    #[test]
    fn single_position_returns_its_value() {
        let mut out = vec![0.0; 4];
        attention(
            &shape(None),
            &[1.0, 2.0, 3.0, 4.0],
            &halves(&[0.5, 0.5]),
            &halves(&[7.0, -1.0]),
            0,
            &mut out,
        );
        assert_eq!(out, vec![7.0, -1.0, 7.0, -1.0]);
    }

    #[test]
    fn equal_scores_average_and_window_limits() {
        // Two cached positions with zero keys: equal scores, so the output is the mean value.
        let keys = halves(&[0.0; 4]);
        let values = halves(&[2.0, 0.0, 4.0, 2.0]);
        let mut out = vec![0.0; 4];
        attention(&shape(None), &[1.0; 4], &keys, &values, 1, &mut out);
        assert_eq!(out, vec![3.0, 1.0, 3.0, 1.0]);
        attention(&shape(Some(1)), &[1.0; 4], &keys, &values, 1, &mut out);
        assert_eq!(out, vec![4.0, 2.0, 4.0, 2.0]);
    }

    #[test]
    fn kv_cache_rewinds_and_rejects_gaps() {
        let mut cache = KvCache::new(1, 4, 1, 1).unwrap();
        assert!(cache.store(0, 0, &[1.0, 2.0], &[3.0, 4.0]).is_some());
        let (k, _) = cache.store(0, 1, &[9.0], &[9.0]).unwrap();
        assert_eq!(k, &halves(&[1.0, 9.0])[..]);
        assert!(cache.store(0, 5, &[0.0], &[0.0]).is_none());
        assert!(cache.store(1, 0, &[0.0], &[0.0]).is_none());
    }
}
