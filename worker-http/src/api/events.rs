//! The SSE events of an `/execute` stream, serialized with their `type`.

use serde::Serialize;

use super::ErrorCode;

/// `started`: sent when the job is accepted.
#[derive(Debug, Clone, Serialize)]
pub struct StartedEvent {
    /// The request's job id.
    pub job_id: String,
    /// The model's `general.name`.
    pub model: String,
    /// Acceptance time, RFC 3339 UTC.
    pub started_at: String,
    /// The sampler seed (the request's, or the one generated for it).
    pub seed: u64,
    /// Prompt length in tokens after templating.
    pub prompt_tokens: usize,
    /// Prompt tokens whose pages the prefix cache held on acceptance (`end` says how many were
    /// really reused: pages can be evicted or added while the job waits).
    pub cached_tokens: usize,
    /// Jobs that must start or end before this one starts (0: a slot is free, it runs now).
    pub queue_position: usize,
    /// The request's correlation id.
    pub correlation_id: String,
}

/// `end`: the job finished normally.
#[derive(Debug, Clone, Serialize)]
pub struct EndEvent {
    /// Tokens generated (an end-of-generation token not counted).
    pub tokens_out: usize,
    /// Prompt tokens whose keys and values came from the prefix cache (not prefilled again).
    pub cached_tokens: usize,
    /// From the first generated token to the end.
    pub decode_time_ms: f64,
    /// From the prompt's first prefill step to the first token's choice.
    pub prefill_time_ms: f64,
    /// From the start of the job to the first generated token.
    pub time_to_first_token_ms: f64,
    /// `MAX_TOKENS`, `EOS` or `STOP_SEQUENCE`.
    pub stop_reason: &'static str,
    /// The stop string that ended the job, for `STOP_SEQUENCE`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_sequence_matched: Option<String>,
}

/// A token and its log-probability on the wire; `top` lists the most probable alternatives.
#[derive(Debug, Clone, Serialize)]
pub struct TokenLogprobWire {
    /// The token id.
    pub id: u32,
    /// Its text (invalid UTF-8 of a partial character replaced by U+FFFD).
    pub token: String,
    /// Its log-probability (natural log; after logit bias and penalties, before temperature).
    pub logprob: f64,
    /// The most probable tokens at this step, most probable first (absent in `top` itself).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top: Option<Vec<TokenLogprobWire>>,
}

impl TokenLogprobWire {
    /// The wire form of a generated token's log-probabilities.
    pub fn of(entry: &worker_common::generate::TokenLogprob) -> Self {
        let wire = |e: &worker_common::generate::LogprobEntry| TokenLogprobWire {
            id: e.id,
            token: String::from_utf8_lossy(&e.bytes).into_owned(),
            logprob: e.logprob,
            top: None,
        };
        TokenLogprobWire {
            top: Some(entry.top.iter().map(wire).collect()),
            ..wire(&entry.chosen)
        }
    }
}

/// One event of the stream.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum StreamEvent {
    /// The job was accepted.
    Started(StartedEvent),
    /// New text.
    Token {
        /// UTF-8 text, never a partial code point.
        t: String,
        /// Event index, contiguous from 0.
        i: usize,
        /// With `logprobs` asked: the tokens sampled since the previous event.
        #[serde(skip_serializing_if = "Vec::is_empty")]
        logprobs: Vec<TokenLogprobWire>,
    },
    /// Decode progress.
    Metrics {
        /// The job.
        job_id: String,
        /// Tokens generated so far.
        tokens_out: usize,
        /// Decode time so far.
        decode_time_ms: u64,
        /// `tokens_out` per second of decode time.
        tokens_per_sec: f64,
        /// Memory the backend holds.
        memory_bytes: u64,
    },
    /// Normal end.
    End(EndEvent),
    /// Abnormal end.
    Error {
        /// The error code.
        code: &'static str,
        /// What happened.
        message: String,
        /// Whether sending the request again may succeed.
        retriable: bool,
    },
}

impl StreamEvent {
    /// An `error` event for `code`.
    pub fn error(code: ErrorCode, message: impl Into<String>) -> Self {
        StreamEvent::Error {
            code: code.as_str(),
            message: message.into(),
            retriable: code.retriable(),
        }
    }

    /// The SSE `event:` name.
    pub fn name(&self) -> &'static str {
        match self {
            StreamEvent::Started(_) => "started",
            StreamEvent::Token { .. } => "token",
            StreamEvent::Metrics { .. } => "metrics",
            StreamEvent::End(_) => "end",
            StreamEvent::Error { .. } => "error",
        }
    }

    /// Whether this event ends the stream.
    pub fn is_terminal(&self) -> bool {
        matches!(self, StreamEvent::End(_) | StreamEvent::Error { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_carry_their_type() {
        let token = serde_json::to_value(StreamEvent::Token {
            t: "hi".into(),
            i: 3,
            logprobs: Vec::new(),
        })
        .unwrap();
        assert_eq!(
            token,
            serde_json::json!({"type": "token", "t": "hi", "i": 3})
        );
        let error = serde_json::to_value(StreamEvent::error(ErrorCode::Cancelled, "x")).unwrap();
        assert_eq!(error["type"], "error");
        assert_eq!(error["code"], "CANCELLED");
        assert_eq!(error["retriable"], false);
    }
}
