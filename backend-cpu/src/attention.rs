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
    let AttentionShape {
        n_head,
        n_head_kv,
        head_dim_k: dk,
        head_dim_v: dv,
        scale,
        window,
    } = *shape;
    let group = n_head / n_head_kv;
    let (k_width, v_width) = (n_head_kv * dk, n_head_kv * dv);
    out.par_chunks_mut(dv).enumerate().for_each_init(
        Scratch::default,
        |scratch, (index, head_out)| {
            let Scratch { scores, row } = scratch;
            row.resize(dk.max(dv), 0.0);
            let (t, h) = (index / n_head, index % n_head);
            let pos = start_pos + t;
            let first = window.map_or(0, |w| (pos + 1).saturating_sub(w));
            let query = &q[index * dk..(index + 1) * dk];
            let kv_head = h / group;
            scores.clear();
            scores.extend((first..=pos).map(|p| {
                let key = &mut row[..dk];
                keys[p * k_width + kv_head * dk..][..dk].convert_to_f32_slice(key);
                dot(query, key) * scale
            }));
            let max = scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
            let mut sum = 0.0f64;
            for s in scores.iter_mut() {
                *s = (*s - max).exp();
                sum += f64::from(*s);
            }
            let inv_sum = (1.0 / sum) as f32;
            head_out.fill(0.0);
            for (p, &weight) in (first..=pos).zip(scores.iter()) {
                let value = &mut row[..dv];
                values[p * v_width + kv_head * dv..][..dv].convert_to_f32_slice(value);
                for (o, v) in head_out.iter_mut().zip(value.iter()) {
                    *o += weight * v;
                }
            }
            for o in head_out.iter_mut() {
                *o *= inv_sum;
            }
        },
    );
}

/// Per-task buffers: the scores of one query, one key or value row in f32.
#[derive(Default)]
struct Scratch {
    scores: Vec<f32>,
    row: Vec<f32>,
}

/// `Σ a[i]·b[i]` over eight lanes, so the compiler can vectorise it without reassociating.
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
