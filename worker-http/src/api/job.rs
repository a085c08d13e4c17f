//! The job a request asks for, whichever API it came through (`/execute`, `/v1/completions`,
//! `/v1/chat/completions`): one validated shape, submitted one way (`crate::submit`).

use worker_common::grammar::GrammarSpec;
use worker_common::sampling::SamplingParams;
use worker_common::tokenizer::template::ChatMessage;

/// What the model is given.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// A text prompt: with `raw` tokenized as is, else as one user message through the chat
    /// template (when the model has one).
    Text {
        /// The prompt.
        text: String,
        /// Skip the chat template.
        raw: bool,
    },
    /// A conversation, rendered with the model's chat template and its generation prompt.
    Chat {
        /// The messages.
        messages: Vec<ChatMessage>,
        /// The tool list's JSON text, for the template's `tools` variable.
        tools: Option<String>,
        /// The reply continues the last message, the assistant's (a prefill), rather than
        /// opening a turn of its own.
        continue_final: bool,
    },
}

/// A validated job, before tokenizing (the context-length rules need the token count).
#[derive(Debug, Clone, PartialEq)]
pub struct JobSpec {
    /// The prompt.
    pub prompt: Prompt,
    /// Tokens to generate at most; `None`: what the context leaves after the prompt, at most
    /// `--max-tokens-out` (OpenAI's default).
    pub max_tokens: Option<u32>,
    /// Sampler settings; `seed` is set at submission from [`JobSpec::seed`] or a fresh one.
    pub sampling: SamplingParams,
    /// The caller's seed, if any.
    pub seed: Option<u64>,
    /// Stop strings.
    pub stop: Vec<String>,
    /// An end-of-generation token does not end the job.
    pub ignore_eos: bool,
    /// The grammar the output must follow.
    pub grammar: Option<Grammar>,
    /// Whether the job may speculate when the worker does (the `speculative` extension field,
    /// default true; specs/SPECULATIVE.md).
    pub speculative: bool,
}

/// A requested grammar and the field it came in (`grammar`, `response_format`), for errors.
#[derive(Debug, Clone, PartialEq)]
pub struct Grammar {
    /// The grammar.
    pub spec: GrammarSpec,
    /// The request field.
    pub field: &'static str,
}
