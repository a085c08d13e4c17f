//! Hyper-parameters read from `{arch}.*` metadata, with llama.cpp's defaults and sanity checks.

use crate::gguf::{ArrayValue, Gguf, Value};

use super::{Architecture, ModelError, RopeStyle};

/// Rotary position embedding parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Rope {
    /// Pairing of dimensions.
    pub style: RopeStyle,
    /// Rotated dimensions per head (`{arch}.rope.dimension_count`, default: the key head dim).
    pub dimensions: usize,
    /// Frequency base of global layers (`{arch}.rope.freq_base`, default 10000).
    pub freq_base: f32,
    /// Frequency base of sliding-window layers (`{arch}.rope.freq_base_swa`, default 10000, or
    /// the global base where sliding layers rotate as global ones).
    pub freq_base_swa: f32,
    /// `{arch}.rope.scaling.type` (default `linear`, which with factor 1 is no scaling).
    pub scaling_type: String,
    /// `{arch}.rope.scaling.factor` (default 1).
    pub scaling_factor: f32,
    /// `{arch}.rope.scaling.attn_factor` (default 1): multiplies the rotated dimensions of
    /// queries and keys (ggml's `mscale`; Phi-3's long-context models carry it).
    pub attn_factor: f32,
    /// `{arch}.rope.scaling.original_context_length`: the context the model was trained for
    /// before its RoPE was stretched; Phi-3 takes its long factors beyond it.
    pub original_context_length: Option<usize>,
}

/// Sliding-window attention: which layers see only the last `size` positions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlidingWindow {
    /// Window length in tokens.
    pub size: usize,
    /// `true` for each layer that uses the window; the others attend globally.
    pub layers: Vec<bool>,
}

/// A mixture-of-experts FFN's routing: each token goes through `used` of `count` experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertCounts {
    /// Experts per layer (`{arch}.expert_count`).
    pub count: usize,
    /// Experts each token is routed to (`{arch}.expert_used_count`).
    pub used: usize,
}

/// The architecture's shape numbers.
#[derive(Debug, Clone, PartialEq)]
pub struct HyperParams {
    /// Transformer blocks.
    pub n_layers: usize,
    /// Width of the residual stream.
    pub n_embd: usize,
    /// Hidden width of the FFN (of each expert's, for a mixture of experts).
    pub n_ff: usize,
    /// The experts, for an architecture whose FFN is a mixture of them.
    pub experts: Option<ExpertCounts>,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (grouped-query attention when fewer than `n_head`).
    pub n_head_kv: usize,
    /// Dimensions of one key (and query) head.
    pub head_dim_k: usize,
    /// Dimensions of one value head.
    pub head_dim_v: usize,
    /// Tokens in the vocabulary (rows of `token_embd`).
    pub vocab_size: usize,
    /// Context length the model was trained for.
    pub context_length: usize,
    /// RMSNorm epsilon.
    pub norm_eps: f32,
    /// RoPE parameters.
    pub rope: Rope,
    /// Sliding-window layers, when the architecture has them.
    pub sliding_window: Option<SlidingWindow>,
    /// Tanh soft-capping of the final logits (`{arch}.final_logit_softcapping`), if any.
    pub final_logit_softcapping: Option<f32>,
}

/// Reads metadata with the `{arch}.` prefix and turns GGUF errors into model errors.
struct Keys<'g, B> {
    gguf: &'g Gguf<B>,
    prefix: &'static str,
}

impl<B: AsRef<[u8]>> Keys<'_, B> {
    fn key(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.prefix)
    }

    fn count(&self, suffix: &str) -> Result<Option<usize>, ModelError> {
        let key = self.key(suffix);
        let value = self.gguf.optional::<u64>(&key)?;
        value.map(|v| positive(&key, v)).transpose()
    }

    fn required_count(&self, suffix: &str) -> Result<usize, ModelError> {
        let key = self.key(suffix);
        positive(&key, self.gguf.require::<u64>(&key)?)
    }

    fn float(&self, suffix: &str) -> Result<Option<f32>, ModelError> {
        let key = self.key(suffix);
        let value = self.gguf.optional::<f32>(&key)?;
        match value {
            Some(v) if !v.is_finite() || v <= 0.0 => Err(ModelError::invalid(
                &key,
                v,
                "expected a finite positive number",
            )),
            other => Ok(other),
        }
    }
}

/// Largest count accepted for any hyper-parameter (16 Mi). Real models stay far below it (the
/// largest vocabularies are ~256 Ki); the bound keeps every product of two counts inside `u64`.
pub const MAX_COUNT: u64 = 1 << 24;

/// Counts must be in `1..=MAX_COUNT`.
fn positive(key: &str, value: u64) -> Result<usize, ModelError> {
    if (1..=MAX_COUNT).contains(&value) {
        Ok(value as usize)
    } else {
        Err(ModelError::invalid(
            key,
            value,
            &format!("expected a count in 1..={MAX_COUNT}"),
        ))
    }
}

impl HyperParams {
    /// Reads and checks the hyper-parameters of `arch` from `gguf`.
    pub(super) fn read<B: AsRef<[u8]>>(
        gguf: &Gguf<B>,
        arch: Architecture,
    ) -> Result<Self, ModelError> {
        let keys = Keys {
            gguf,
            prefix: arch.name(),
        };
        let n_layers = keys.required_count("block_count")?;
        // Each layer has several tensors, so a layer count above the tensor count is hostile or
        // corrupt; refusing it here keeps later per-layer allocations bounded by the file.
        if n_layers > gguf.tensor_count() {
            return Err(ModelError::invalid(
                &keys.key("block_count"),
                n_layers,
                &format!("the file has only {} tensors", gguf.tensor_count()),
            ));
        }
        let n_embd = keys.required_count("embedding_length")?;
        let n_head = uniform_count(gguf, &keys.key("attention.head_count"), n_layers)?
            .ok_or_else(|| ModelError::missing(&keys.key("attention.head_count")))?;
        // Without explicit key/value widths a head is embedding_length / head_count wide: more
        // heads than columns would make it 0, which later checks would blame on other keys.
        let explicit_widths = keys.count("attention.key_length")?.is_some()
            && keys.count("attention.value_length")?.is_some();
        if !explicit_widths && n_head > n_embd {
            return Err(ModelError::invalid(
                &keys.key("attention.head_count"),
                n_head,
                &format!("more heads than embedding_length = {n_embd} columns"),
            ));
        }
        let n_head_kv =
            uniform_count(gguf, &keys.key("attention.head_count_kv"), n_layers)?.unwrap_or(n_head);
        if n_head % n_head_kv != 0 {
            return Err(ModelError::invalid(
                &keys.key("attention.head_count_kv"),
                n_head_kv,
                &format!("must divide attention.head_count = {n_head}"),
            ));
        }
        let head_dim_k = keys
            .count("attention.key_length")?
            .unwrap_or(n_embd / n_head);
        let head_dim_v = keys
            .count("attention.value_length")?
            .unwrap_or(n_embd / n_head);
        let experts = if arch.has_experts() {
            Some(read_experts(&keys)?)
        } else {
            None
        };
        // An expert's width is its own key; the dense width, if the file has one, is unused.
        let n_ff = match experts {
            Some(_) => keys.required_count("expert_feed_forward_length")?,
            None => keys.required_count("feed_forward_length")?,
        };
        Ok(Self {
            n_layers,
            n_embd,
            n_ff,
            experts,
            n_head,
            n_head_kv,
            head_dim_k,
            head_dim_v,
            vocab_size: vocab_size(gguf, &keys)?,
            context_length: keys.required_count("context_length")?,
            norm_eps: keys
                .float("attention.layer_norm_rms_epsilon")?
                .ok_or_else(|| {
                    ModelError::missing(&keys.key("attention.layer_norm_rms_epsilon"))
                })?,
            rope: read_rope(&keys, arch, head_dim_k)?,
            sliding_window: read_sliding_window(&keys, arch, n_layers)?,
            final_logit_softcapping: keys.float("final_logit_softcapping")?,
        })
    }

    /// Query width: `n_head × head_dim_k`.
    pub fn q_width(&self) -> usize {
        self.n_head * self.head_dim_k
    }

    /// Key width: `n_head_kv × head_dim_k`.
    pub fn k_width(&self) -> usize {
        self.n_head_kv * self.head_dim_k
    }

    /// Value width: `n_head_kv × head_dim_v`.
    pub fn v_width(&self) -> usize {
        self.n_head_kv * self.head_dim_v
    }

    /// Attention output width: `n_head × head_dim_v`.
    pub fn attn_out_width(&self) -> usize {
        self.n_head * self.head_dim_v
    }
}

/// A per-model count that may be stored per layer as an array; all layers must agree.
fn uniform_count<B: AsRef<[u8]>>(
    gguf: &Gguf<B>,
    key: &str,
    n_layers: usize,
) -> Result<Option<usize>, ModelError> {
    match gguf.get(key) {
        None => Ok(None),
        Some(Value::Array(array)) => uniform_array(key, array, n_layers).map(Some),
        Some(_) => gguf
            .optional::<u64>(key)?
            .map(|v| positive(key, v))
            .transpose(),
    }
}

fn uniform_array(key: &str, array: ArrayValue<'_>, n_layers: usize) -> Result<usize, ModelError> {
    if array.len() != n_layers as u64 {
        return Err(ModelError::invalid(
            key,
            array.len(),
            &format!("expected one entry per layer ({n_layers})"),
        ));
    }
    let mut values = array.iter().map(|v| v.as_integer());
    let first = values
        .next()
        .flatten()
        .ok_or_else(|| ModelError::invalid(key, "[…]", "expected integers"))?;
    if values.any(|v| v != Some(first)) {
        return Err(ModelError::invalid(
            key,
            "[…]",
            "per-layer values differ; only uniform models are supported",
        ));
    }
    positive(key, u64::try_from(first).unwrap_or(0))
}

/// `{arch}.vocab_size`, else the length of `tokenizer.ggml.tokens`.
fn vocab_size<B: AsRef<[u8]>>(gguf: &Gguf<B>, keys: &Keys<'_, B>) -> Result<usize, ModelError> {
    if let Some(n) = keys.count("vocab_size")? {
        return Ok(n);
    }
    match gguf.optional::<ArrayValue>("tokenizer.ggml.tokens")? {
        Some(tokens) => positive("tokenizer.ggml.tokens", tokens.len()),
        None => Err(ModelError::missing(&format!(
            "{} (or tokenizer.ggml.tokens)",
            keys.key("vocab_size")
        ))),
    }
}

/// The expert counts, checked as llama.cpp does (`0 < used ≤ count`, at most 1024 experts: `LLAMA_MAX_EXPERTS`).
fn read_experts<B: AsRef<[u8]>>(keys: &Keys<'_, B>) -> Result<ExpertCounts, ModelError> {
    const MAX_EXPERTS: usize = 1024;
    let count = keys.required_count("expert_count")?;
    if count > MAX_EXPERTS {
        return Err(ModelError::invalid(
            &keys.key("expert_count"),
            count,
            &format!("expected at most {MAX_EXPERTS} experts"),
        ));
    }
    let used = keys.required_count("expert_used_count")?;
    if used > count {
        return Err(ModelError::invalid(
            &keys.key("expert_used_count"),
            used,
            &format!("expected at most expert_count = {count}"),
        ));
    }
    Ok(ExpertCounts { count, used })
}

fn read_rope<B: AsRef<[u8]>>(
    keys: &Keys<'_, B>,
    arch: Architecture,
    head_dim_k: usize,
) -> Result<Rope, ModelError> {
    let dimensions = keys.count("rope.dimension_count")?.unwrap_or(head_dim_k);
    if dimensions > head_dim_k || dimensions % 2 != 0 {
        return Err(ModelError::invalid(
            &keys.key("rope.dimension_count"),
            dimensions,
            &format!("expected an even number ≤ the head dimension {head_dim_k}"),
        ));
    }
    let freq_base = keys.float("rope.freq_base")?.unwrap_or(10_000.0);
    let default_base_swa = if arch.sliding_rope_is_global() {
        freq_base
    } else {
        10_000.0
    };
    let scaling_key = keys.key("rope.scaling.type");
    let scaling_type = keys
        .gguf
        .optional::<&str>(&scaling_key)?
        .unwrap_or("linear")
        .to_owned();
    Ok(Rope {
        style: arch.rope_style(),
        dimensions,
        freq_base,
        freq_base_swa: keys
            .float("rope.freq_base_swa")?
            .unwrap_or(default_base_swa),
        scaling_type,
        scaling_factor: keys.float("rope.scaling.factor")?.unwrap_or(1.0),
        attn_factor: keys.float("rope.scaling.attn_factor")?.unwrap_or(1.0),
        original_context_length: keys.count("rope.scaling.original_context_length")?,
    })
}

fn read_sliding_window<B: AsRef<[u8]>>(
    keys: &Keys<'_, B>,
    arch: Architecture,
    n_layers: usize,
) -> Result<Option<SlidingWindow>, ModelError> {
    if !arch.uses_sliding_window() {
        return Ok(None);
    }
    let Some(size) = keys.count("attention.sliding_window")? else {
        return Ok(None);
    };
    let pattern_key = keys.key("attention.sliding_window_pattern");
    let layers = match keys.gguf.get(&pattern_key) {
        Some(Value::Array(array)) => swa_layers_from_array(&pattern_key, array, n_layers)?,
        Some(_) => swa_layers_from_period(keys.gguf.require::<u32>(&pattern_key)?, n_layers),
        None => swa_layers_from_period(arch.default_swa_pattern(), n_layers),
    };
    Ok(Some(SlidingWindow { size, layers }))
}

/// llama.cpp's `set_swa_pattern(n, dense_first = false)`: the last layer of every period of `n`
/// is global; 0 makes every layer sliding.
fn swa_layers_from_period(period: u32, n_layers: usize) -> Vec<bool> {
    let period = period as usize;
    (0..n_layers)
        .map(|il| period == 0 || il % period < period - 1)
        .collect()
}

fn swa_layers_from_array(
    key: &str,
    array: ArrayValue<'_>,
    n_layers: usize,
) -> Result<Vec<bool>, ModelError> {
    if array.len() != n_layers as u64 {
        return Err(ModelError::invalid(
            key,
            array.len(),
            &format!("expected one entry per layer ({n_layers})"),
        ));
    }
    array
        .iter()
        .map(|v| match v {
            Value::Bool(b) => Ok(b),
            other => Err(ModelError::invalid(key, other, "expected an array of bool")),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemma3_period_six_makes_every_sixth_layer_global() {
        let layers = swa_layers_from_period(6, 18);
        let global: Vec<usize> = (0..18).filter(|&il| !layers[il]).collect();
        assert_eq!(global, vec![5, 11, 17]);
        assert!(swa_layers_from_period(0, 3).iter().all(|&swa| swa));
    }
}
