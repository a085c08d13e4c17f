//! What OpenAI's chat route and Anthropic's Messages route do alike with a job once its request
//! is valid: how the model writes tool calls (and the grammar that forces one), how it writes
//! its reasoning, the parser that cuts both out of its text, and the whole reply of a job that
//! is not streamed.

use futures_util::StreamExt;
use worker_common::generate::{Finished, GenerateEvent, TokenLogprob};
use worker_common::grammar::GrammarSpec;

use crate::api::openai::{
    Piece, ReasoningFormat, ReasoningParser, ToolCall, ToolCallParser, ToolFormat, Tools,
};
use crate::api::{ApiError, ErrorCode, Grammar, JobSpec};
use crate::job_end::{JobEnd, JobEvent};
use crate::state::Shared;
use crate::submit::{JobEvents, accepting};

/// With tools: how the model writes calls (from its chat template; a model whose template
/// renders no tools cannot take them), and for a choice that forces a call (`required`, a named
/// function), the grammar that makes the reply one such call, set on `job`.
pub(super) fn tool_format(
    shared: &Shared,
    tools: Option<&Tools>,
    job: &mut JobSpec,
    correlation_id: &str,
) -> Result<Option<ToolFormat>, ApiError> {
    let Some(tools) = tools else {
        return Ok(None);
    };
    let loaded = accepting(shared, correlation_id)?;
    let refuse = |field: &str, constraint: &str, message: String| {
        ApiError::invalid_field(field, constraint, message, correlation_id)
    };
    let format = loaded
        .formatter
        .template_source()
        .and_then(ToolFormat::of_template)
        .ok_or_else(|| {
            let message = "this model's chat template does not render tools".into();
            refuse("tools", "template_tools", message)
        })?;
    if let Some(lark) = tools.forced_call(format) {
        if job.grammar.is_some() {
            let message = "a forced tool call cannot be combined with response_format".into();
            return Err(refuse("tool_choice", "conflicts(response_format)", message));
        }
        job.grammar = Some(Grammar {
            spec: GrammarSpec::Lark(lark),
            field: "tool_choice",
        });
    }
    Ok(Some(format))
}

/// How the loaded model writes its reasoning, when its template says.
pub(super) fn reasoning_format(
    shared: &Shared,
    correlation_id: &str,
) -> Result<Option<ReasoningFormat>, ApiError> {
    let loaded = accepting(shared, correlation_id)?;
    let source = loaded.formatter.template_source();
    Ok(source.and_then(ReasoningFormat::of_template))
}

/// Cuts one reply's text into pieces: reasoning first (when the model's template has a
/// reasoning format), then the content through the tool-call parser (when the request has
/// tools), so a call written in the reasoning is not made.
pub(super) struct TextParser {
    reasoning: Option<ReasoningParser>,
    tools: Option<ToolCallParser>,
}

impl TextParser {
    /// The parser of a reply written with `reasoning` and calls in `format` to the functions
    /// of `tools` (a "call" to any other is content); `streaming` sends a call's arguments as
    /// they are written ([`ToolCallParser::streaming`]).
    pub(super) fn new(
        reasoning: Option<ReasoningFormat>,
        format: Option<ToolFormat>,
        tools: Option<&Tools>,
        streaming: bool,
    ) -> Self {
        let offered: Vec<String> = tools.map_or_else(Vec::new, |tools| {
            tools
                .functions
                .iter()
                .map(|(name, _)| name.clone())
                .collect()
        });
        let calls = format.map(|format| {
            let parser = match streaming {
                true => ToolCallParser::streaming(format),
                false => ToolCallParser::new(format),
            };
            parser.offering(offered)
        });
        Self {
            reasoning: reasoning.map(ReasoningParser::new),
            tools: calls,
        }
    }

    /// The pieces `text` releases.
    pub(super) fn push(&mut self, text: String) -> Vec<Piece> {
        let pieces = match &mut self.reasoning {
            Some(reasoning) => reasoning.push(&text),
            None => vec![Piece::Content(text)],
        };
        self.through_tools(pieces)
    }

    /// The reply ended: what both parsers still hold, in order.
    pub(super) fn finish(&mut self) -> Vec<Piece> {
        let rest = self.reasoning.as_mut().map(ReasoningParser::finish);
        let mut pieces = self.through_tools(rest.unwrap_or_default());
        pieces.extend(
            self.tools
                .as_mut()
                .map(ToolCallParser::finish)
                .unwrap_or_default(),
        );
        pieces
    }

    /// Content through the tool-call parser; other pieces as they are. Empty text is dropped.
    fn through_tools(&mut self, pieces: Vec<Piece>) -> Vec<Piece> {
        let mut out = Vec::with_capacity(pieces.len());
        for piece in pieces {
            match (&mut self.tools, piece) {
                (Some(tools), Piece::Content(text)) => out.extend(tools.push(&text)),
                (_, Piece::Content(text) | Piece::Reasoning(text)) if text.is_empty() => {}
                (_, piece) => out.push(piece),
            }
        }
        out
    }
}

/// A finished job's reply, cut by its [`TextParser`].
pub(super) struct Collected {
    /// The reply in order: [`Piece::Content`], [`Piece::Reasoning`] and whole [`Piece::Call`]s,
    /// adjacent text of one kind joined, a streamed call's start and arguments made one call.
    pub pieces: Vec<Piece>,
    /// Every token's log-probabilities, when they were asked for.
    pub tokens: Vec<TokenLogprob>,
    /// How the job ended.
    pub done: Finished,
}

impl Collected {
    /// The content text, calls cut out.
    pub(super) fn content(&self) -> String {
        self.text(|piece| matches!(piece, Piece::Content(_)))
    }

    /// The reasoning text.
    pub(super) fn reasoning(&self) -> String {
        self.text(|piece| matches!(piece, Piece::Reasoning(_)))
    }

    fn text(&self, kind: impl Fn(&Piece) -> bool) -> String {
        let pieces = self.pieces.iter().filter(|piece| kind(piece));
        pieces
            .filter_map(|piece| match piece {
                Piece::Content(text) | Piece::Reasoning(text) => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }

    /// The calls, in order.
    pub(super) fn calls(&self) -> Vec<ToolCall> {
        let calls = self.pieces.iter().filter_map(|piece| match piece {
            Piece::Call(call) => Some(call.clone()),
            _ => None,
        });
        calls.collect()
    }
}

/// Waits for the job's end and cuts its text with `parser`; a failed job answers its error.
pub(super) async fn collect(
    mut events: JobEvents,
    mut parser: TextParser,
    correlation_id: &str,
) -> Result<Collected, ApiError> {
    let (mut text, mut tokens) = (String::new(), Vec::new());
    while let Some(event) = events.next().await {
        match event {
            JobEvent::Generate(GenerateEvent::Token {
                text: piece,
                logprobs,
                ..
            }) => {
                text.push_str(&piece);
                tokens.extend(logprobs);
            }
            JobEvent::Generate(GenerateEvent::Metrics { .. }) => {}
            JobEvent::End(JobEnd::Finished(done)) => {
                let mut all = parser.push(text);
                all.extend(parser.finish());
                return Ok(gather(all, tokens, done));
            }
            JobEvent::End(JobEnd::Failed { code, message, .. }) => {
                return Err(ApiError::new(code, message, correlation_id));
            }
        }
    }
    let message = "the job's events ended without a terminal event";
    Err(ApiError::new(ErrorCode::Internal, message, correlation_id))
}

/// The pieces of a whole reply in order, merged as [`Collected::pieces`] says.
fn gather(pieces: Vec<Piece>, tokens: Vec<TokenLogprob>, done: Finished) -> Collected {
    let mut merged: Vec<Piece> = Vec::with_capacity(pieces.len());
    for piece in pieces {
        match (merged.last_mut(), piece) {
            (Some(Piece::Content(text)), Piece::Content(more))
            | (Some(Piece::Reasoning(text)), Piece::Reasoning(more)) => text.push_str(&more),
            (_, Piece::CallStart(call)) => merged.push(Piece::Call(call)),
            // More of the last call's arguments (reasoning may have come between).
            (_, Piece::Arguments(more)) => {
                let last = merged.iter_mut().rev().find_map(|piece| match piece {
                    Piece::Call(call) => Some(call),
                    _ => None,
                });
                if let Some(call) = last {
                    call.arguments.push_str(&more);
                }
            }
            (_, piece) => merged.push(piece),
        }
    }
    Collected {
        pieces: merged,
        tokens,
        done,
    }
}
