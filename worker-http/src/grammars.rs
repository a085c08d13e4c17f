//! The grammar compiler over the model's vocabulary (llguidance's token trie and parser
//! factory), built once per worker. Building it takes a while for a large vocabulary (0.4 s for
//! Qwen's 152k tokens, a quarter of the CPU worker's start-up), so it is not on the way to
//! `ready`: a thread of its own builds it right after the model is published, and a request
//! with a grammar that comes first builds it itself or waits for that thread.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use worker_common::grammar::Grammars;
use worker_common::tokenizer::Tokenizer;

use crate::state::Shared;

/// The compiler, or why structured output is unavailable for this model, once built.
#[derive(Debug, Default)]
pub struct GrammarCell(OnceLock<Result<Arc<Grammars>, String>>);

impl GrammarCell {
    /// A cell already holding `built` (in-process tests).
    #[cfg(test)]
    pub fn built(built: Result<Arc<Grammars>, String>) -> Self {
        Self(OnceLock::from(built))
    }

    /// The compiler over `tokenizer`'s vocabulary: built now if nobody has, else what was
    /// built (waiting while another thread builds it). Blocks: call it off the async threads.
    pub fn get(&self, worker_id: &str, tokenizer: &Tokenizer) -> Result<Arc<Grammars>, String> {
        self.0.get_or_init(|| build(worker_id, tokenizer)).clone()
    }
}

/// Builds the published model's compiler on a thread of its own (see the module docs); if the
/// thread cannot be had, the first request with a grammar builds it.
pub fn build_in_background(shared: &Shared) {
    let Some(loaded) = shared.loaded().cloned() else {
        return;
    };
    let worker_id = shared.settings.worker_id.clone();
    let spawned = std::thread::Builder::new()
        .name("grammars".into())
        .spawn(move || {
            let _ = loaded.grammars.get(&worker_id, &loaded.tokenizer);
        });
    if let Err(err) = spawned {
        tracing::warn!(
            event = "grammars_deferred",
            worker_id = shared.settings.worker_id.as_str(),
            "no thread for the grammar compiler ({err}); the first structured request builds it"
        );
    }
}

fn build(worker_id: &str, tokenizer: &Tokenizer) -> Result<Arc<Grammars>, String> {
    let started = Instant::now();
    match Grammars::new(tokenizer) {
        Ok(grammars) => {
            let ms = started.elapsed().as_secs_f64() * 1e3;
            tracing::info!(
                event = "grammars_ready",
                worker_id,
                ms,
                "grammar compiler built"
            );
            Ok(Arc::new(grammars))
        }
        Err(err) => {
            tracing::warn!(event = "grammars_unavailable", worker_id, error = %err, "structured output is unavailable");
            Err(err.to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use worker_common::testing::tiny_tokenizer;

    #[test]
    fn the_compiler_is_built_once_whoever_asks_first() {
        let cell = Arc::new(GrammarCell::default());
        let tokenizer = Arc::new(tiny_tokenizer());
        let askers: Vec<_> = (0..4)
            .map(|_| {
                let (cell, tokenizer) = (cell.clone(), tokenizer.clone());
                std::thread::spawn(move || cell.get("w", &tokenizer))
            })
            .collect();
        let built: Vec<Arc<Grammars>> = askers
            .into_iter()
            .map(|asker| asker.join().unwrap().unwrap())
            .collect();
        assert!(built.windows(2).all(|pair| Arc::ptr_eq(&pair[0], &pair[1])));
    }
}
