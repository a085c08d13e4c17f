//! Constrained decoding: a grammar (any JSON object, a JSON schema, Lark, a regular
//! expression) enforced at every step by a token mask from llguidance, the engine llama.cpp and
//! mistral.rs use, built once per model from our vocabulary. A [`Constraint`] is one job's
//! parser state: it says which tokens may come next and takes each chosen token.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use llguidance::api::{StopReason, TopLevelGrammar};
use llguidance::earley::{CGrammar, CSymIdx};
use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use serde_json::{Value, json};

use crate::backend::AllowedIds;
use crate::grammar_budget;
use crate::grammar_cache::{CacheStats, GRAMMAR_CACHE_ENTRIES, LruCache, MAX_CACHED_GRAMMAR_BYTES};
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
    /// The grammar compiles but admits no output: a rule or `$ref` that only refers to
    /// itself, an impossible pattern, or text the vocabulary cannot start.
    #[error("the grammar cannot produce any output: {0}")]
    Unsatisfiable(&'static str),
    /// The grammar is too costly to compile or to mask: it reached a limit of the worker's
    /// budget (grammar_budget.rs), counted in work, not time.
    #[error(
        "the grammar is over this worker's budget ({0}); make it smaller: fewer optional properties, alternatives or repetitions"
    )]
    OverBudget(String),
    /// The parser failed on a token (a bug, or a grammar beyond llguidance's limits).
    #[error("the grammar parser failed: {0}")]
    Step(String),
}

/// Why a grammar has no string: every derivation loops back into itself.
const NO_STRING: &str = "a rule or $ref refers back to itself with no way to end";

/// Why a grammar allows no first token.
const NO_START: &str =
    "no token can start it (an impossible pattern, or text this model's vocabulary cannot write)";

/// Longest llguidance message a client is shown, in characters.
const MAX_MESSAGE_CHARS: usize = 300;

/// Builds the [`Constraint`]s of one model's jobs.
pub struct Grammars {
    factory: ParserFactory,
    /// The end-of-generation ids, allowed wherever a grammar may end.
    end: Arc<[u32]>,
    /// What compiling each recent grammar gave, by its text.
    cache: LruCache<Result<Constraint, GrammarError>>,
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

/// llguidance's token environment for `tokenizer`'s vocabulary, and its end-of-generation ids:
/// each token's bytes, special tokens behind llguidance's marker byte so that text never
/// matches them. (Also what `examples/grammar_cost.rs` builds llguidance's own factory on.)
pub fn token_env(tokenizer: &Tokenizer) -> Result<(TokEnv, Vec<u32>), GrammarError> {
    let vocab = tokenizer.vocab();
    let size = u32::try_from(vocab.len()).map_err(|e| GrammarError::Vocabulary(e.to_string()))?;
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
    Ok((env, end))
}

impl Grammars {
    /// The compiler for `tokenizer`'s vocabulary ([`token_env`]), under the worker's budget.
    pub fn new(tokenizer: &Tokenizer) -> Result<Self, GrammarError> {
        let (env, end) = token_env(tokenizer)?;
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| GrammarError::Vocabulary(e.to_string()))?;
        factory.quiet();
        // The worker's budget; verbose errors off (they carry llguidance's parser state, the
        // job's tokens so far, and the whole grammar: not for clients).
        *factory.limits_mut() = grammar_budget::limits();
        Ok(Self {
            factory,
            end: end.into(),
            cache: LruCache::new(GRAMMAR_CACHE_ENTRIES),
        })
    }

    /// A fresh parser for `spec`, its first mask computed. A grammar that admits no output
    /// is refused here ([`GrammarError::Unsatisfiable`]), before any job runs it: unrefused,
    /// it fails the job's first step; so is one over the budget ([`GrammarError::OverBudget`]).
    /// A grammar compiled before (the same text) is not compiled again: the parser is a copy of
    /// what that compile made, lexer state and first mask included, so it gives the same masks
    /// and ids; a grammar refused before is refused again the same way.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Constraint, GrammarError> {
        let top = top_level(spec);
        let key = serde_json::to_string(&top)
            .ok()
            .filter(|key| key.len() <= MAX_CACHED_GRAMMAR_BYTES);
        if let Some(cached) = key.as_deref().and_then(|key| self.cache.get(key)) {
            return match cached.as_ref() {
                Ok(constraint) => Ok(constraint.deep_clone()),
                Err(error) => Err(error.clone()),
            };
        }
        let compiled = self.compile_uncached(top);
        if let Some(key) = key {
            // The cache keeps its own copy: a job's parser shares its lexer with the parser it
            // was cloned from, and what jobs add to it must not reach the next request's copy.
            let kept = match &compiled {
                Ok(constraint) => Ok(constraint.deep_clone()),
                Err(error) => Err(error.clone()),
            };
            self.cache.insert(key, kept);
        }
        compiled
    }

    /// What the compiled-grammar cache has done so far.
    pub fn cache_stats(&self) -> CacheStats {
        self.cache.stats()
    }

    /// [`Grammars::compile`] without the cache.
    fn compile_uncached(&self, top: TopLevelGrammar) -> Result<Constraint, GrammarError> {
        let parser = self
            .factory
            .create_parser(top)
            .map_err(|e| refusal(&headline(&e)))?;
        if !derives_a_string(parser.parser.grammar()) {
            return Err(GrammarError::Unsatisfiable(NO_STRING));
        }
        let mut matcher = Matcher::new(Ok(parser));
        if let Some(error) = matcher.get_error() {
            return Err(refusal(&headline(&error)));
        }
        let started = Instant::now();
        let first = first_mask(&mut matcher, &self.end)?;
        let first_cost = started.elapsed();
        first_choice(&matcher, &first, &self.end)?;
        Ok(Constraint {
            matcher,
            first,
            first_cost,
            end: self.end.clone(),
            #[cfg(test)]
            mask_delay: Duration::ZERO,
        })
    }
}

/// Forced tokens [`first_choice`] follows at most: a tool call's markup and name take a few
/// dozen on small vocabularies.
const MAX_FORCED_TOKENS: usize = 128;

/// Checks the grammar's first real choice against the budget. A grammar that starts with
/// forced text (a tool call's `<tool_call>` and name, a schema's `{"`) has first masks of one
/// token each, which llguidance computes without its parser, so they say nothing of its cost:
/// on a copy of the parser, follows them to the first mask that allows more than one token (or
/// the end), and refuses the grammar if computing that mask is over the budget. The copy is
/// dropped; the job's parser starts where it was.
fn first_choice(matcher: &Matcher, first: &[u32], end: &[u32]) -> Result<(), GrammarError> {
    let mut mask = first.to_vec();
    let mut probe: Option<Matcher> = None;
    for _ in 0..MAX_FORCED_TOKENS {
        let Some(token) = only_token(&mask).filter(|token| !end.contains(token)) else {
            return Ok(());
        };
        let probe = probe.get_or_insert_with(|| matcher.deep_clone());
        probe
            .consume_token(token)
            .map_err(|e| refusal(&headline(&e)))?;
        mask = first_mask(probe, end)?;
    }
    Ok(())
}

/// The one token `mask` allows, if it allows exactly one.
fn only_token(mask: &[u32]) -> Option<u32> {
    let mut set = mask.iter().enumerate().filter(|(_, word)| **word != 0);
    let (index, &word) = set.next()?;
    match word.count_ones() == 1 && set.next().is_none() {
        true => u32::try_from(index * 32)
            .ok()
            .map(|base| base + word.trailing_zeros()),
        false => None,
    }
}

/// Why a grammar was refused at compile time, from llguidance's message: over the budget, or
/// not compiling.
fn refusal(message: &str) -> GrammarError {
    match grammar_budget::is_over_budget(message) {
        true => GrammarError::OverBudget(message.to_owned()),
        false => GrammarError::Compile(message.to_owned()),
    }
}

/// `spec` as llguidance's grammar (JSON compact, [`compact_json`]).
pub fn top_level(spec: &GrammarSpec) -> TopLevelGrammar {
    match spec {
        GrammarSpec::JsonObject => {
            TopLevelGrammar::from_json_schema(compact_json(&json!({"type": "object"})))
        }
        GrammarSpec::JsonSchema(schema) => TopLevelGrammar::from_json_schema(compact_json(schema)),
        GrammarSpec::Lark(lark) => TopLevelGrammar::from_lark(lark.clone()),
        GrammarSpec::Regex(regex) => TopLevelGrammar::from_regex(regex),
    }
}

/// The first mask of a fresh parser. llguidance stops with `NoExtensionBias` when it allows
/// no token at all: nothing can start the grammar. Any other failure (a limit of the budget,
/// mostly) is the grammar's too.
fn first_mask(matcher: &mut Matcher, end: &[u32]) -> Result<Vec<u32>, GrammarError> {
    let mask = compute(matcher, end).map_err(|error| match error {
        GrammarError::Step(why) if why == StopReason::NoExtensionBias.to_string() => {
            GrammarError::Unsatisfiable(NO_START)
        }
        GrammarError::Step(why) => refusal(&why),
        other => other,
    })?;
    match mask.iter().any(|&word| word != 0) {
        true => Ok(mask),
        false => Err(GrammarError::Unsatisfiable(NO_START)),
    }
}

/// Whether `grammar`'s start symbol derives any finite string: the symbols that do, found
/// from those that do alone (see [`derives_alone`]) up through every rule whose right-hand
/// symbols all do. Rule conditions are ignored and lexemes count as deriving, so this errs
/// towards yes: a grammar it refuses has no string at all (`{"$ref": "#"}`, `a: "x" a`).
/// Linear in the reachable rules, as a grammar may be large.
fn derives_a_string(grammar: &CGrammar) -> bool {
    let (symbols, rules) = reachable(grammar);
    // Per rule, how many of its right-hand symbols are not known to derive yet; per symbol,
    // the rules it appears in, once per occurrence.
    let mut missing: Vec<usize> = rules.iter().map(|(_, rhs)| rhs.len()).collect();
    let mut uses: HashMap<CSymIdx, Vec<usize>> = HashMap::new();
    for (rule, (_, rhs)) in rules.iter().enumerate() {
        rhs.iter()
            .for_each(|&sym| uses.entry(sym).or_default().push(rule));
    }
    let mut derives: HashSet<CSymIdx> = symbols
        .into_iter()
        .filter(|&sym| derives_alone(grammar, sym))
        .collect();
    let mut queue: Vec<CSymIdx> = derives.iter().copied().collect();
    while let Some(sym) = queue.pop() {
        for &rule in uses.get(&sym).into_iter().flatten() {
            missing[rule] = missing[rule].saturating_sub(1);
            let lhs = rules[rule].0;
            if missing[rule] == 0 && derives.insert(lhs) {
                queue.push(lhs);
            }
        }
    }
    derives.contains(&grammar.start())
}

/// Symbols, and rules as (left-hand symbol, right-hand symbols).
type Reachable = (Vec<CSymIdx>, Vec<(CSymIdx, Vec<CSymIdx>)>);

/// The symbols reachable from `grammar`'s start, and their rules (empty rules are not
/// stored: `is_nullable` says them).
fn reachable(grammar: &CGrammar) -> Reachable {
    let mut seen = HashSet::from([grammar.start()]);
    let mut stack = vec![grammar.start()];
    let mut rules = Vec::new();
    while let Some(sym) = stack.pop() {
        for &rule in grammar.rules_of(sym) {
            let rhs = grammar.rule_rhs(rule).0.to_vec();
            stack.extend(rhs.iter().copied().filter(|&next| seen.insert(next)));
            rules.push((sym, rhs));
        }
    }
    (seen.into_iter().collect(), rules)
}

/// A symbol that derives a string whatever its rules: a lexeme (an impossible pattern is
/// left to the first mask), one with an empty rule (under a condition too), or a nested
/// grammar's reference left unlinked.
fn derives_alone(grammar: &CGrammar, sym: CSymIdx) -> bool {
    let data = grammar.sym_data(sym);
    data.is_terminal
        || data.lexeme.is_some()
        || data.is_nullable
        || !data.cond_nullable.is_empty()
        || (data.gen_grammar.is_some() && data.rules.is_empty())
}

/// The first line of an llguidance message, cut to [`MAX_MESSAGE_CHARS`]: what went wrong,
/// never the parser state or grammar that may follow it.
fn headline(message: &impl fmt::Display) -> String {
    let message = message.to_string();
    let line = message.lines().next().unwrap_or_default();
    match line.char_indices().nth(MAX_MESSAGE_CHARS) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line.to_owned(),
    }
}

/// A parser failure (llguidance reports `anyhow` errors) as a [`GrammarError::Step`], its
/// headline only: it reaches the client in the job's error.
fn step(error: impl fmt::Display) -> GrammarError {
    GrammarError::Step(headline(&error))
}

/// One job's compiled grammar, before it runs (a job's request is cloned, so this is `Clone`;
/// [`Constraint::start`] makes the running [`Guide`]).
#[derive(Clone)]
pub struct Constraint {
    matcher: Matcher,
    /// The first mask, computed when the grammar was checked.
    first: Vec<u32>,
    /// What computing the first mask took: the guess for the next one's time.
    first_cost: Duration,
    end: Arc<[u32]>,
    /// Tests: how long each mask after the first takes at least (a slow grammar).
    #[cfg(test)]
    mask_delay: Duration,
}

impl fmt::Debug for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Constraint")
            .field("stopped", &self.matcher.is_stopped())
            .finish()
    }
}

impl Constraint {
    /// A copy whose parser owns its lexer (llguidance's `clone` shares the lexer's states with
    /// the original, `deep_clone` copies them): what the grammar cache keeps and hands out.
    fn deep_clone(&self) -> Self {
        Self {
            matcher: self.matcher.deep_clone(),
            first: self.first.clone(),
            first_cost: self.first_cost,
            end: self.end.clone(),
            #[cfg(test)]
            mask_delay: self.mask_delay,
        }
    }

    /// The running grammar of a job, its first mask the one [`Grammars::compile`] computed.
    pub fn start(self) -> Guide {
        Guide {
            next: Next::ready(Box::new(self.matcher), self.first, self.first_cost),
            end: self.end,
            #[cfg(test)]
            mask_delay: self.mask_delay,
        }
    }

    /// Tests: the same grammar, each of whose masks after the first takes at least `delay`.
    #[cfg(test)]
    pub(crate) fn with_mask_delay(mut self, delay: Duration) -> Self {
        self.mask_delay = delay;
        self.first_cost = self.first_cost.max(delay);
        self
    }
}

/// Runs `job` on the threads the masks are computed on: a rayon pool of its own at a lower
/// priority (nice 10) than the engine and the CPU backend's team, so that a grammar whose masks
/// are costly (within the budget, grammar_budget.rs: up to a few ms a mask) takes the cores the steps
/// leave, not the steps' share; its sequence waits alone (the scheduler leaves a sequence with
/// a late mask out of the step). Without that pool (threads refused), rayon's global one.
fn spawn_mask(job: impl FnOnce() + Send + 'static) {
    static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    let pool = POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .thread_name(|i| format!("grammar-mask-{i}"))
            .start_handler(|_| lower_this_threads_priority())
            .build()
            .ok()
    });
    match pool {
        Some(pool) => pool.spawn(job),
        None => rayon::spawn(job),
    }
}

/// Niceness of the mask threads: under Linux's scheduler a nice-10 thread gets about a tenth
/// of a core that nice-0 threads want.
const MASK_NICE: libc::c_int = 10;

/// Lowers the calling thread's priority to [`MASK_NICE`] (on Linux, `setpriority` with who = 0
/// applies to the calling thread alone). Best effort: a refusal leaves it as it was.
fn lower_this_threads_priority() {
    // SAFETY: setpriority takes plain integers and changes only the calling thread's niceness.
    let _ = unsafe { libc::setpriority(libc::PRIO_PROCESS as _, 0, MASK_NICE) };
}

/// A mask that took longer than this is expected to be late again: its sequence waits out
/// of the step until it is there. Masks of ordinary grammars take tens to hundreds of
/// microseconds on a 152k vocabulary; a decode step takes one to a few milliseconds.
pub const SLOW_MASK: Duration = Duration::from_millis(1);

/// The mask of the next token and the parser, handed back by the background computation.
struct Next {
    /// Set once the mask is computed (or lost).
    mask: OnceLock<Result<Vec<u32>, GrammarError>>,
    /// What computing it took, set before `mask`.
    cost: OnceLock<Duration>,
    /// What the grammar's previous mask took: the guess for this one's.
    expected: Duration,
    /// The parser, put back before `mask` is set.
    matcher: Mutex<Option<Box<Matcher>>>,
}

impl Next {
    /// A parser whose next mask is known already.
    fn ready(matcher: Box<Matcher>, mask: Vec<u32>, cost: Duration) -> Arc<Next> {
        Arc::new(Next {
            mask: OnceLock::from(Ok(mask)),
            cost: OnceLock::from(cost),
            expected: cost,
            matcher: Mutex::new(Some(matcher)),
        })
    }

    /// Starts computing `matcher`'s next mask on the mask threads. A panic inside llguidance
    /// (rayon would abort the process on it) becomes this mask's error, and the parser is
    /// dropped: the job ends with `GrammarError::Step`, nobody waits forever.
    fn compute(
        mut matcher: Box<Matcher>,
        end: Arc<[u32]>,
        expected: Duration,
        delay: Duration,
    ) -> Arc<Next> {
        let next = Arc::new(Next {
            mask: OnceLock::new(),
            cost: OnceLock::new(),
            expected,
            matcher: Mutex::new(None),
        });
        let slot = next.clone();
        spawn_mask(move || {
            let started = Instant::now();
            if !delay.is_zero() {
                std::thread::sleep(delay);
            }
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
            let _ = slot.cost.set(started.elapsed());
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
    #[cfg(test)]
    mask_delay: Duration,
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

    /// Whether the next mask is still being computed and the grammar's previous one took
    /// longer than [`SLOW_MASK`]: a step that waited for it would hold every other sequence.
    /// The scheduler leaves such a sequence out of the step; a mask expected to be quick is
    /// waited for inside the step (the CUDA backend queues the pass first), which keeps a lone
    /// structured job as fast as a plain one.
    pub fn is_late(&self) -> bool {
        self.next.mask.get().is_none() && self.next.expected > SLOW_MASK
    }

    /// Whether the grammar allows `token` next (waits for the mask, as [`allowed`](Self::allowed)).
    pub fn allows(&self, token: u32) -> Result<bool, GrammarError> {
        let mask = self.allowed()?;
        let word = mask.get(token as usize / 32).copied().unwrap_or(0);
        Ok(word >> (token % 32) & 1 == 1)
    }

    /// How many of `tokens`, from the first, the grammar allows in a row from here (a
    /// speculative sequence's drafts are cut there). Waits for the mask: the parser comes back
    /// with it.
    pub fn allowed_prefix(&self, tokens: &[u32]) -> Result<usize, GrammarError> {
        self.allowed()?;
        let mut slot = self
            .next
            .matcher
            .lock()
            .map_err(|_| GrammarError::Step("the grammar parser was lost".into()))?;
        let matcher = slot
            .as_mut()
            .ok_or_else(|| GrammarError::Step("the grammar parser was lost".into()))?;
        matcher.validate_tokens(tokens).map_err(step)
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
        let expected = self.next.cost.get().copied().unwrap_or_default();
        self.next = Next::compute(matcher, self.end.clone(), expected, self.mask_delay());
        Ok(())
    }
}

impl Guide {
    #[cfg(test)]
    fn mask_delay(&self) -> Duration {
        self.mask_delay
    }

    #[cfg(not(test))]
    fn mask_delay(&self) -> Duration {
        Duration::ZERO
    }
}

impl AllowedIds for Guide {
    fn wait(&self) -> Option<&[u32]> {
        self.allowed().ok()
    }
}

#[cfg(test)]
pub(crate) mod tests;
