//! OpenAI's shapes for one job's answer: the whole reply, the stream's chunks, `usage`.

use serde_json::{Value, json};
use worker_common::generate::{Finished, StopReason};

use super::request::Endpoint;

/// OpenAI's `finish_reason` for how a job stopped.
pub fn finish_reason(reason: StopReason) -> &'static str {
    match reason {
        StopReason::MaxTokens => "length",
        StopReason::Eos | StopReason::StopSequence => "stop",
    }
}

/// `usage` of a finished job: prompt tokens after templating, generated tokens (an
/// end-of-generation token not counted) and the prompt tokens the prefix cache served.
pub fn usage(done: &Finished) -> Value {
    let completion_tokens = done.tokens.len();
    json!({
        "prompt_tokens": done.prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": done.prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": done.cached_tokens},
    })
}

/// What every chunk and the reply of one job repeat.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The route the request came to.
    pub endpoint: Endpoint,
    /// `chatcmpl-…` or `cmpl-…`: the job id (so `/cancel/{id}` reaches it too).
    pub id: String,
    /// Unix seconds of acceptance.
    pub created: u64,
    /// The loaded model's id.
    pub model: String,
}

impl Reply {
    /// The reply, or a chunk of it, around `choices`.
    fn envelope(&self, chunk: bool, choices: Value) -> Value {
        let object = match (self.endpoint, chunk) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completions, _) => "text_completion",
        };
        json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        })
    }

    /// The one choice, carrying `text` (chat: as the message, or as a delta in a chunk).
    fn choice(&self, chunk: bool, text: Option<&str>, finish: Option<&str>) -> Value {
        let mut choice = json!({"index": 0, "logprobs": null, "finish_reason": finish});
        let text = text.unwrap_or_default();
        match (self.endpoint, chunk) {
            (Endpoint::Completions, _) => choice["text"] = json!(text),
            (Endpoint::Chat, false) => {
                choice["message"] = json!({"role": "assistant", "content": text});
            }
            (Endpoint::Chat, true) if finish.is_some() => choice["delta"] = json!({}),
            (Endpoint::Chat, true) => choice["delta"] = json!({"content": text}),
        }
        choice
    }

    /// The whole reply of a non-streamed request.
    pub fn whole(&self, text: &str, done: &Finished) -> Value {
        let finish = finish_reason(done.stop_reason);
        let choice = self.choice(false, Some(text), Some(finish));
        let mut reply = self.envelope(false, json!([choice]));
        reply["usage"] = usage(done);
        reply
    }

    /// A chat stream's first chunk, naming the role (OpenAI sends it before any text).
    pub fn role_chunk(&self) -> Option<Value> {
        (self.endpoint == Endpoint::Chat).then(|| {
            let delta = json!({"role": "assistant", "content": ""});
            let choice =
                json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": null});
            self.envelope(true, json!([choice]))
        })
    }

    /// A chunk of new text.
    pub fn text_chunk(&self, text: &str) -> Value {
        self.envelope(true, json!([self.choice(true, Some(text), None)]))
    }

    /// The chunk that says why the job stopped.
    pub fn finish_chunk(&self, done: &Finished) -> Value {
        let finish = finish_reason(done.stop_reason);
        self.envelope(true, json!([self.choice(true, None, Some(finish))]))
    }

    /// `stream_options.include_usage`'s last chunk: no choices, the usage.
    pub fn usage_chunk(&self, done: &Finished) -> Value {
        let mut chunk = self.envelope(true, json!([]));
        chunk["usage"] = usage(done);
        chunk
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(stop_reason: StopReason) -> Finished {
        Finished {
            stop_reason,
            stop_sequence_matched: None,
            tokens: vec![5, 6, 7],
            prompt_tokens: 10,
            cached_tokens: 4,
            prefill_time_ms: 1.0,
            time_to_first_token_ms: 1.0,
            decode_time_ms: 1.0,
            decode_steps_ms: 1.0,
        }
    }

    fn reply(endpoint: Endpoint) -> Reply {
        Reply {
            endpoint,
            id: "chatcmpl-1".into(),
            created: 7,
            model: "m".into(),
        }
    }

    #[test]
    fn a_whole_chat_reply_has_the_message_usage_and_finish_reason() {
        let whole = reply(Endpoint::Chat).whole("hi", &done(StopReason::MaxTokens));
        assert_eq!(whole["object"], "chat.completion");
        assert_eq!(whole["choices"][0]["message"]["content"], "hi");
        assert_eq!(whole["choices"][0]["message"]["role"], "assistant");
        assert_eq!(whole["choices"][0]["finish_reason"], "length");
        assert_eq!(whole["usage"]["total_tokens"], 13);
        assert_eq!(whole["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
    }

    #[test]
    fn completion_chunks_carry_text_and_chat_chunks_deltas() {
        let completion = reply(Endpoint::Completions);
        assert!(completion.role_chunk().is_none());
        assert_eq!(completion.text_chunk("a")["choices"][0]["text"], "a");
        let finish = completion.finish_chunk(&done(StopReason::Eos));
        assert_eq!(finish["choices"][0]["finish_reason"], "stop");
        let chat = reply(Endpoint::Chat);
        let role = chat.role_chunk().unwrap();
        assert_eq!(role["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(chat.text_chunk("b")["choices"][0]["delta"]["content"], "b");
        let finish = chat.finish_chunk(&done(StopReason::StopSequence));
        assert_eq!(finish["choices"][0]["delta"], json!({}));
        let usage = chat.usage_chunk(&done(StopReason::Eos));
        assert_eq!(usage["choices"], json!([]));
        assert_eq!(usage["usage"]["completion_tokens"], 3);
    }
}
