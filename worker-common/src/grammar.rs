//! Constrained decoding: a grammar (any JSON object, a JSON schema, Lark, a regular
//! expression) enforced at every step by a token mask from llguidance, the engine llama.cpp and
//! mistral.rs use, built once per model from our vocabulary. A [`Constraint`] is one job's
//! parser state: it says which tokens may come next and takes each chosen token.

use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, OnceLock};

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use serde_json::{Value, json};

use crate::backend::AllowedIds;
use crate::tokenizer::Tokenizer;

/// A grammar a job's output must follow.
#[derive(Debug, Clone, PartialEq)]
pub enum GrammarSpec {
    /// Any JSON object (OpenAI's `json_object`).
    JsonObject,
    /// JSON valid against this schema.
    JsonSchema(Value),
    /// A Lark grammar (llguidance's dialect).
    Lark(String),
    /// Text matching this regular expression.
    Regex(String),
}

/// Why a grammar could not be built or followed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GrammarError {
    /// The vocabulary cannot back a token trie.
    #[error("the vocabulary cannot back a grammar: {0}")]
    Vocabulary(String),
    /// The grammar does not compile (an unsupported schema feature, a syntax error).
    #[error("the grammar does not compile: {0}")]
    Compile(String),
    /// The parser failed on a token (a bug, or a grammar beyond llguidance's limits).
    #[error("the grammar parser failed: {0}")]
    Step(String),
}

/// Builds the [`Constraint`]s of one model's jobs.
pub struct Grammars {
    factory: ParserFactory,
    /// The end-of-generation ids, allowed wherever a grammar may end.
    end: Arc<[u32]>,
}

impl fmt::Debug for Grammars {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Grammars")
    }
}

/// JSON output is compact, one space after `,` and `:` (llguidance's default lets the model
/// write any whitespace, which a small model can fill until `max_tokens` cuts the value off);
/// a schema's own `x-guidance` options win.
fn compact_json(schema: &Value) -> Value {
    let mut schema = schema.clone();
    if let Value::Object(object) = &mut schema
        && !object.contains_key("x-guidance")
    {
        let options =
            json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "});
        object.insert("x-guidance".into(), options);
    }
    schema
}

impl Grammars {
    /// The token trie of `tokenizer`'s vocabulary: each token's bytes, special tokens behind
    /// llguidance's marker byte so that text never matches them.
    pub fn new(tokenizer: &Tokenizer) -> Result<Self, GrammarError> {
        let vocab = tokenizer.vocab();
        let size =
            u32::try_from(vocab.len()).map_err(|e| GrammarError::Vocabulary(e.to_string()))?;
        let words: Vec<Vec<u8>> = (0..size)
            .map(|id| match vocab.is_special(id) {
                true => {
                    let text = vocab.text(id).unwrap_or_default().as_bytes();
                    [&[TokTrie::SPECIAL_TOKEN_MARKER][..], text].concat()
                }
                false => tokenizer.token_bytes(id),
            })
            .collect();
        let end: Vec<u32> = vocab.end_of_generation().iter().copied().collect();
        let eos = vocab
            .special()
            .eos
            .filter(|id| end.contains(id))
            .or_else(|| end.first().copied())
            .ok_or_else(|| GrammarError::Vocabulary("no end-of-generation token".into()))?;
        let info = TokRxInfo::new(size, eos);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&end);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| GrammarError::Vocabulary(e.to_string()))?;
        factory.quiet();
        Ok(Self {
            factory,
            end: end.into(),
        })
    }

    /// A fresh parser for `spec`.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Constraint, GrammarError> {
        let grammar = match spec {
            GrammarSpec::JsonObject => {
                TopLevelGrammar::from_json_schema(compact_json(&json!({"type": "object"})))
            }
            GrammarSpec::JsonSchema(schema) => {
                TopLevelGrammar::from_json_schema(compact_json(schema))
            }
            GrammarSpec::Lark(lark) => TopLevelGrammar::from_lark(lark.clone()),
            GrammarSpec::Regex(regex) => TopLevelGrammar::from_regex(regex),
        };
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| GrammarError::Compile(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(error) = matcher.get_error() {
            return Err(GrammarError::Compile(error));
        }
        Ok(Constraint {
            matcher,
            end: self.end.clone(),
        })
    }
}

/// A parser failure (llguidance reports `anyhow` errors) as a [`GrammarError::Step`].
fn step(error: impl fmt::Display) -> GrammarError {
    GrammarError::Step(error.to_string())
}

/// One job's compiled grammar, before it runs (a job's request is cloned, so this is `Clone`;
/// [`Constraint::start`] makes the running [`Guide`]).
#[derive(Clone)]
pub struct Constraint {
    matcher: Matcher,
    end: Arc<[u32]>,
}

impl fmt::Debug for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Constraint")
            .field("stopped", &self.matcher.is_stopped())
            .finish()
    }
}

impl Constraint {
    /// The running grammar of a job, its first mask computing in the background.
    pub fn start(self) -> Guide {
        Guide {
            next: Next::compute(Box::new(self.matcher), self.end.clone()),
            end: self.end,
        }
    }
}

/// The mask of the next token and the parser, handed back by the background computation.
struct Next {
    /// Set once the mask is computed (or lost).
    mask: OnceLock<Result<Vec<u32>, GrammarError>>,
    /// The parser, put back before `mask` is set.
    matcher: Mutex<Option<Box<Matcher>>>,
}

impl Next {
    /// Starts computing `matcher`'s next mask on rayon's pool. A panic inside llguidance
    /// (rayon would abort the process on it) becomes this mask's error, and the parser is
    /// dropped: the job ends with `GrammarError::Step`, nobody waits forever.
    fn compute(mut matcher: Box<Matcher>, end: Arc<[u32]>) -> Arc<Next> {
        let next = Arc::new(Next {
            mask: OnceLock::new(),
            matcher: Mutex::new(None),
        });
        let slot = next.clone();
        rayon::spawn(move || {
            let computed = catch_unwind(AssertUnwindSafe(|| compute(&mut matcher, &end)));
            let mask = match computed {
                Ok(mask) => {
                    if let Ok(mut parser) = slot.matcher.lock() {
                        *parser = Some(matcher);
                    }
                    mask
                }
                Err(_) => Err(GrammarError::Step("the mask computation panicked".into())),
            };
            let _ = slot.mask.set(mask);
        });
        next
    }
}

/// A running grammar: after each accepted token the next mask is computed in the background
/// (llguidance's advice: a mask costs tens to hundreds of microseconds on a large vocabulary,
/// a GPU step about a millisecond), and [`Guide::allowed`] waits for it — or a GPU backend
/// does, through [`AllowedIds`], once the step's logits are queued.
pub struct Guide {
    next: Arc<Next>,
    end: Arc<[u32]>,
}

impl fmt::Debug for Guide {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Guide")
    }
}

/// The mask of `matcher`'s next token as a bitset over ids (bit `id % 32` of word `id / 32`);
/// where the grammar may end, every id of `end` is allowed.
fn compute(matcher: &mut Matcher, end: &[u32]) -> Result<Vec<u32>, GrammarError> {
    let mut mask = matcher.compute_mask_or_eos().map_err(step)?;
    if matcher.is_stopped() || matcher.is_accepting().map_err(step)? {
        for &id in end {
            if (id as usize) < mask.len() {
                mask.allow_token(id);
            }
        }
    }
    Ok(mask.as_slice().to_vec())
}

impl Guide {
    /// The tokens that may come next, as a bitset over ids (bit `id % 32` of word `id / 32`);
    /// where the grammar may end, every end-of-generation id is allowed. Waits for the
    /// background computation.
    pub fn allowed(&self) -> Result<&[u32], GrammarError> {
        match self.next.mask.wait() {
            Ok(mask) => Ok(mask),
            Err(err) => Err(err.clone()),
        }
    }

    /// Advances past `token` and starts computing the next mask in the background.
    pub fn accept(&mut self, token: u32) -> Result<(), GrammarError> {
        self.allowed()?;
        let matcher = self
            .next
            .matcher
            .lock()
            .ok()
            .and_then(|mut slot| slot.take());
        let mut matcher =
            matcher.ok_or_else(|| GrammarError::Step("the grammar parser was lost".into()))?;
        matcher.consume_token(token).map_err(step)?;
        self.next = Next::compute(matcher, self.end.clone());
        Ok(())
    }
}

impl AllowedIds for Guide {
    fn wait(&self) -> Option<&[u32]> {
        self.allowed().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{TINY_EOS, tiny_tokenizer};

    fn allowed_ids(guide: &mut Guide) -> Vec<u32> {
        let mask = guide.allowed().unwrap();
        (0..10u32)
            .filter(|&id| mask[id as usize / 32] & (1 << (id % 32)) != 0)
            .collect()
    }

    #[test]
    fn a_regex_allows_only_the_tokens_that_continue_it() {
        let tokenizer = tiny_tokenizer();
        let grammars = Grammars::new(&tokenizer).unwrap();
        let constraint = grammars.compile(&GrammarSpec::Regex("ab+".into())).unwrap();
        let mut guide = constraint.start();
        assert_eq!(allowed_ids(&mut guide), [1], "only `a` starts it");
        guide.accept(1).unwrap();
        assert_eq!(allowed_ids(&mut guide), [2], "then `b`, not the end yet");
        guide.accept(2).unwrap();
        assert_eq!(
            allowed_ids(&mut guide),
            [TINY_EOS, 2],
            "more `b` or the end"
        );
        guide.accept(2).unwrap();
        guide.accept(2).unwrap();
        let waited = allowed_ids(&mut guide);
        assert_eq!(
            waited,
            [TINY_EOS, 2],
            "two accepts in a row wait for the mask"
        );
    }

    #[test]
    fn grammars_that_do_not_compile_say_why() {
        let grammars = Grammars::new(&tiny_tokenizer()).unwrap();
        let bad_schema = GrammarSpec::JsonSchema(json!({"type": "no-such-type"}));
        let error = grammars.compile(&bad_schema).unwrap_err();
        assert!(matches!(error, GrammarError::Compile(_)), "{error}");
        let bad_lark = grammars.compile(&GrammarSpec::Lark("start: (".into()));
        assert!(matches!(bad_lark, Err(GrammarError::Compile(_))));
    }
}
