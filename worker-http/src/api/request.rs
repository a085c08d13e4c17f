//! `/execute` and `/cancel` request bodies: parsed field by field so every violation is reported
//! with its field and constraint token, never with serde's or axum's own wording.

use worker_common::grammar::GrammarSpec;
use worker_common::sampling::SamplingParams;

use super::FieldError;
use super::fields::{Fields, json_object};
use super::job::{Grammar, JobSpec, Prompt};

/// Largest `max_tokens` a request may name.
pub const MAX_TOKENS_LIMIT: u64 = 2048;
/// Most stop strings.
pub const MAX_STOPS: usize = 4;
/// Longest stop string, in bytes.
pub const MAX_STOP_BYTES: usize = 100;
/// Longest job id, in bytes.
pub const MAX_JOB_ID_BYTES: usize = 256;

/// Worker-side limits that shape a request.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// `--max-tokens-out`: the cap on `max_tokens`, and its default.
    pub max_tokens_out: u32,
}

/// A validated `/execute` request (context length is checked after tokenizing).
#[derive(Debug, Clone, PartialEq)]
pub struct ExecuteRequest {
    /// The caller's job id.
    pub job_id: String,
    /// The prompt text.
    pub prompt: String,
    /// Tokens to generate at most, already capped by `--max-tokens-out`.
    pub max_tokens: u32,
    /// Sampler settings (`seed` is 0 here: see [`ExecuteRequest::seed`]).
    pub sampling: SamplingParams,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Sampler seed, when the caller chose one.
    pub seed: Option<u64>,
    /// Tokenize the prompt as is, without the chat template.
    pub raw: bool,
    /// An end-of-generation token does not end the job (benchmarks; llama-server's field).
    pub ignore_eos: bool,
    /// The grammar the output must follow.
    pub grammar: Option<GrammarSpec>,
    /// Whether the job may speculate (`speculative`, default true).
    pub speculative: bool,
}

impl ExecuteRequest {
    /// Parses and validates a body sent with `content_type`.
    pub fn parse(
        content_type: Option<&str>,
        body: &[u8],
        limits: Limits,
    ) -> Result<Self, Vec<FieldError>> {
        let object = json_object(content_type, body)?;
        let mut fields = Fields::new(&object);
        let job_id = fields.job_id();
        let prompt = fields.prompt();
        let max_tokens = fields.integer("max_tokens", 1, MAX_TOKENS_LIMIT, "range(1..=2048)");
        let mut sampling = fields.sampling();
        sampling.logprobs = fields.top_logprobs("logprobs");
        let stop = fields.stop("stop", false);
        let seed = fields.seed();
        let raw = fields.boolean("raw");
        let ignore_eos = fields.boolean("ignore_eos");
        let grammar = fields.grammar();
        fields.check_grammar_end(grammar.as_ref(), ignore_eos);
        let speculative = fields.boolean_or("speculative", true);
        if !fields.errors.is_empty() {
            return Err(fields.errors);
        }
        let default_max = MAX_TOKENS_LIMIT.min(u64::from(limits.max_tokens_out));
        let max_tokens = max_tokens.unwrap_or(default_max).min(default_max);
        Ok(Self {
            job_id: job_id.unwrap_or_default(),
            prompt: prompt.unwrap_or_default(),
            max_tokens: u32::try_from(max_tokens).unwrap_or(limits.max_tokens_out),
            sampling,
            stop,
            seed,
            raw,
            ignore_eos,
            grammar,
            speculative,
        })
    }

    /// The job this request asks for, and its id.
    pub fn into_job(self) -> (String, JobSpec) {
        let job = JobSpec {
            prompt: Prompt::Text {
                text: self.prompt,
                raw: self.raw,
            },
            max_tokens: Some(self.max_tokens),
            sampling: self.sampling,
            seed: self.seed,
            stop: self.stop,
            ignore_eos: self.ignore_eos,
            grammar: self.grammar.map(|spec| Grammar {
                spec,
                field: "grammar",
            }),
            speculative: self.speculative,
        };
        (self.job_id, job)
    }
}

/// A `/cancel` body: `{"job_id": …}`.
#[derive(Debug, Clone, PartialEq)]
pub struct CancelRequest {
    /// The job to cancel.
    pub job_id: String,
}

impl CancelRequest {
    /// Parses and validates a body sent with `content_type`.
    pub fn parse(content_type: Option<&str>, body: &[u8]) -> Result<Self, Vec<FieldError>> {
        let object = json_object(content_type, body)?;
        let mut fields = Fields::new(&object);
        match fields.job_id() {
            Some(job_id) if fields.errors.is_empty() => Ok(Self { job_id }),
            _ => Err(fields.errors),
        }
    }
}

#[cfg(test)]
mod tests;
