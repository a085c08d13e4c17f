//! The draft model of speculative decoding (`--draft-model`, specs/SPECULATIVE.md): loaded on
//! the same backend as the model, refused unless it shares the model's vocabulary.

use std::path::Path;
use std::sync::Arc;

use worker_common::backend::{Load, LoadConfig};
use worker_common::model::ModelFile;
use worker_common::tokenizer::Tokenizer;

use super::LoadError;

/// Loads the draft model at `path` for a model whose tokenizer is `tokenizer`, with the
/// model's context and, by default, the backend's own KV pool size for it.
pub(super) fn load<B: Load>(
    path: &Path,
    tokenizer: &Tokenizer,
    options: &B::Options,
    config: &LoadConfig,
) -> Result<B, LoadError> {
    let model = Arc::new(ModelFile::open(path)?);
    let draft_tokenizer = Tokenizer::for_model(&model.gguf, path, None)?;
    if let Some(difference) = vocabulary_difference(tokenizer, &draft_tokenizer) {
        return Err(LoadError::DraftVocabulary {
            path: path.display().to_string(),
            difference,
        });
    }
    let config = LoadConfig {
        kv_cache_bytes: None,
        ..config.clone()
    };
    Ok(B::load(model, options, &config, &mut |_| {})?)
}

/// Where two vocabularies differ (their sizes, or the first id whose bytes differ); `None`
/// when they are the same.
fn vocabulary_difference(model: &Tokenizer, draft: &Tokenizer) -> Option<String> {
    let (size, draft_size) = (model.vocab().len(), draft.vocab().len());
    if size != draft_size {
        return Some(format!("{draft_size} tokens against the model's {size}"));
    }
    let differing = (0..size as u32).find(|&id| model.token_bytes(id) != draft.token_bytes(id))?;
    Some(format!("token {differing} differs"))
}
