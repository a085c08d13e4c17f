//! OpenAI's shapes for one job's answer: the whole reply, the stream's chunks, `usage`.

use serde_json::{Map, Value, json};
use worker_common::generate::{Finished, LogprobEntry, StopReason, TokenLogprob};

use super::request::Endpoint;
use super::tool_calls::ToolCall;

/// OpenAI's `finish_reason` for how a job stopped, and whether its reply made tool calls.
pub fn finish_reason(reason: StopReason, called: bool) -> &'static str {
    match reason {
        StopReason::MaxTokens => "length",
        StopReason::Eos | StopReason::StopSequence if called => "tool_calls",
        StopReason::Eos | StopReason::StopSequence => "stop",
    }
}

/// A call as OpenAI writes it in a message (`index` only in stream deltas).
fn tool_call(call: &ToolCall, index: Option<usize>) -> Value {
    let mut value = json!({
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    });
    if let Some(index) = index {
        value["index"] = json!(index);
    }
    value
}

/// `usage` of a request's finished jobs (one per choice, all of one prompt): the prompt's tokens
/// after templating and those of them the prefix cache served, as the first choice's job saw
/// them (OpenAI counts the prompt once); the tokens every choice generated (an
/// end-of-generation token not counted).
pub fn usage(dones: &[&Finished]) -> Value {
    let (prompt_tokens, cached_tokens) = dones
        .first()
        .map_or((0, 0), |done| (done.prompt_tokens, done.cached_tokens));
    let completion_tokens: usize = dones.iter().map(|done| done.tokens.len()).sum();
    json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
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
    /// Whether the request asked for `logprobs` (else the field is `null`).
    pub logprobs: bool,
    /// Name tokens `token_id:<id>` in log-probability entries.
    pub tokens_as_ids: bool,
    /// The choice this reply's chunks carry (`index`: 0 unless the request asked for `n`).
    pub index: usize,
}

/// Log-probabilities of some of a reply's tokens, in the endpoint's shape.
#[derive(Debug, Clone, Copy)]
pub struct Logprobs<'a> {
    /// The tokens, in order.
    pub tokens: &'a [TokenLogprob],
    /// Characters of the reply before the first of them (completions' `text_offset`).
    pub offset: usize,
}

impl Reply {
    /// A token's name in log-probability entries: its text (a partial UTF-8 character
    /// replaced by U+FFFD), or `token_id:<id>`.
    fn token_name(&self, entry: &LogprobEntry) -> String {
        if self.tokens_as_ids {
            format!("token_id:{}", entry.id)
        } else {
            String::from_utf8_lossy(&entry.bytes).into_owned()
        }
    }

    /// Chat's `{"content": [{token, logprob, bytes, top_logprobs}]}`.
    fn chat_logprobs(&self, tokens: &[TokenLogprob]) -> Value {
        let entry = |e: &LogprobEntry| json!({"token": self.token_name(e), "logprob": e.logprob, "bytes": e.bytes});
        let content: Vec<Value> = tokens
            .iter()
            .map(|token| {
                let mut value = entry(&token.chosen);
                value["top_logprobs"] = token.top.iter().map(entry).collect();
                value
            })
            .collect();
        json!({"content": content})
    }

    /// Completions' `{tokens, token_logprobs, top_logprobs, text_offset}`; offsets count the
    /// tokens' text in characters.
    fn completion_logprobs(&self, logprobs: Logprobs<'_>) -> Value {
        let text = |e: &LogprobEntry| String::from_utf8_lossy(&e.bytes).chars().count();
        let mut offset = logprobs.offset;
        let mut text_offset = Vec::with_capacity(logprobs.tokens.len());
        for token in logprobs.tokens {
            text_offset.push(offset);
            offset += text(&token.chosen);
        }
        let top: Vec<Value> = logprobs
            .tokens
            .iter()
            .map(|token| {
                let alternatives: Map<String, Value> = token
                    .top
                    .iter()
                    .map(|e| (self.token_name(e), json!(e.logprob)))
                    .collect();
                Value::Object(alternatives)
            })
            .collect();
        let tokens = logprobs.tokens.iter();
        json!({
            "tokens": tokens.clone().map(|t| self.token_name(&t.chosen)).collect::<Vec<_>>(),
            "token_logprobs": tokens.map(|t| t.chosen.logprob).collect::<Vec<_>>(),
            "top_logprobs": top,
            "text_offset": text_offset,
        })
    }
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

    /// A choice's `logprobs`: `null` unless asked for.
    fn logprobs(&self, logprobs: Option<Logprobs<'_>>) -> Value {
        match (self.logprobs, logprobs, self.endpoint) {
            (true, Some(logprobs), Endpoint::Chat) => self.chat_logprobs(logprobs.tokens),
            (true, Some(logprobs), Endpoint::Completions) => self.completion_logprobs(logprobs),
            _ => Value::Null,
        }
    }

    /// The one choice, carrying `text` (chat: as the message, or as a delta in a chunk).
    fn choice(
        &self,
        chunk: bool,
        text: Option<&str>,
        logprobs: Option<Logprobs<'_>>,
        finish: Option<&str>,
    ) -> Value {
        let logprobs = self.logprobs(logprobs);
        let mut choice =
            json!({"index": self.index, "logprobs": logprobs, "finish_reason": finish});
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

    /// The whole reply of a non-streamed request around its `choices` ([`Reply::whole_choice`]
    /// of each), with the usage of their jobs.
    pub fn whole(&self, choices: Vec<Value>, dones: &[&Finished]) -> Value {
        let mut reply = self.envelope(false, Value::Array(choices));
        reply["usage"] = usage(dones);
        reply
    }

    /// This reply's choice of a non-streamed request: its text, its reasoning (chat's
    /// `reasoning_content`, present only when there is some), the tool calls parsed out of it,
    /// the tokens' log-probabilities.
    pub fn whole_choice(
        &self,
        text: &str,
        reasoning: &str,
        calls: &[ToolCall],
        tokens: &[TokenLogprob],
        done: &Finished,
    ) -> Value {
        let finish = finish_reason(done.stop_reason, !calls.is_empty());
        let logprobs = Logprobs { tokens, offset: 0 };
        let mut choice = self.choice(false, Some(text), Some(logprobs), Some(finish));
        if self.endpoint == Endpoint::Chat && !reasoning.is_empty() {
            choice["message"]["reasoning_content"] = json!(reasoning);
        }
        if !calls.is_empty() {
            let message = &mut choice["message"];
            message["tool_calls"] = calls.iter().map(|call| tool_call(call, None)).collect();
            if text.is_empty() {
                message["content"] = Value::Null;
            }
        }
        choice
    }

    /// A chat stream's first chunk, naming the role (OpenAI sends it before any text).
    pub fn role_chunk(&self) -> Option<Value> {
        (self.endpoint == Endpoint::Chat).then(|| {
            let delta = json!({"role": "assistant", "content": ""});
            let choice = json!({"index": self.index, "delta": delta, "logprobs": null, "finish_reason": null});
            self.envelope(true, json!([choice]))
        })
    }

    /// A chunk of new text, with its tokens' log-probabilities.
    pub fn text_chunk(&self, text: &str, logprobs: Logprobs<'_>) -> Value {
        let choice = self.choice(true, Some(text), Some(logprobs), None);
        self.envelope(true, json!([choice]))
    }

    /// A chat chunk of reasoning text: `delta {reasoning_content}`, no `content` (the
    /// reasoning tokens' log-probabilities are not sent).
    pub fn reasoning_chunk(&self, text: &str) -> Value {
        self.delta_chunk(json!({"reasoning_content": text}))
    }

    /// A chunk carrying the reply's `index`-th tool call: whole, or a streamed call's start
    /// (its arguments empty).
    pub fn tool_call_chunk(&self, index: usize, call: &ToolCall) -> Value {
        self.delta_chunk(json!({"tool_calls": [tool_call(call, Some(index))]}))
    }

    /// A chunk carrying more of the `index`-th tool call's arguments text.
    pub fn arguments_chunk(&self, index: usize, arguments: &str) -> Value {
        let call = json!({"index": index, "function": {"arguments": arguments}});
        self.delta_chunk(json!({"tool_calls": [call]}))
    }

    fn delta_chunk(&self, delta: Value) -> Value {
        let choice =
            json!({"index": self.index, "delta": delta, "logprobs": null, "finish_reason": null});
        self.envelope(true, json!([choice]))
    }

    /// The chunk that says why the job stopped (`called`: the reply made tool calls).
    pub fn finish_chunk(&self, done: &Finished, called: bool) -> Value {
        let finish = finish_reason(done.stop_reason, called);
        self.envelope(true, json!([self.choice(true, None, None, Some(finish))]))
    }

    /// `stream_options.include_usage`'s last chunk: no choices, the usage.
    pub fn usage_chunk(&self, dones: &[&Finished]) -> Value {
        let mut chunk = self.envelope(true, json!([]));
        chunk["usage"] = usage(dones);
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
            speculation: Default::default(),
        }
    }

    const NONE: Logprobs<'static> = Logprobs {
        tokens: &[],
        offset: 0,
    };

    /// The whole reply of one choice.
    fn whole_reply(
        reply: &Reply,
        text: &str,
        reasoning: &str,
        calls: &[ToolCall],
        tokens: &[TokenLogprob],
        done: &Finished,
    ) -> Value {
        let choice = reply.whole_choice(text, reasoning, calls, tokens, done);
        reply.whole(vec![choice], &[done])
    }

    fn reply(endpoint: Endpoint) -> Reply {
        Reply {
            endpoint,
            id: "chatcmpl-1".into(),
            created: 7,
            model: "m".into(),
            logprobs: false,
            tokens_as_ids: false,
            index: 0,
        }
    }

    #[test]
    fn a_whole_chat_reply_has_the_message_usage_and_finish_reason() {
        let whole = whole_reply(
            &reply(Endpoint::Chat),
            "hi",
            "",
            &[],
            &[],
            &done(StopReason::MaxTokens),
        );
        assert_eq!(whole["object"], "chat.completion");
        assert_eq!(whole["choices"][0]["message"]["content"], "hi");
        assert_eq!(whole["choices"][0]["message"]["role"], "assistant");
        assert_eq!(whole["choices"][0]["finish_reason"], "length");
        assert_eq!(whole["usage"]["total_tokens"], 13);
        assert_eq!(whole["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
    }

    #[test]
    fn reasoning_is_its_own_field_only_when_there_is_some() {
        let chat = reply(Endpoint::Chat);
        let whole = whole_reply(&chat, "4", "2+2", &[], &[], &done(StopReason::Eos));
        let message = &whole["choices"][0]["message"];
        assert_eq!(
            (
                message["content"].as_str(),
                message["reasoning_content"].as_str()
            ),
            (Some("4"), Some("2+2"))
        );
        let plain = whole_reply(&chat, "4", "", &[], &[], &done(StopReason::Eos));
        assert!(
            plain["choices"][0]["message"]
                .get("reasoning_content")
                .is_none()
        );
        let chunk = chat.reasoning_chunk("hm");
        assert_eq!(
            chunk["choices"][0]["delta"],
            json!({"reasoning_content": "hm"})
        );
        assert!(chunk["choices"][0]["logprobs"].is_null());
    }

    #[test]
    fn completion_chunks_carry_text_and_chat_chunks_deltas() {
        let completion = reply(Endpoint::Completions);
        assert!(completion.role_chunk().is_none());
        assert_eq!(completion.text_chunk("a", NONE)["choices"][0]["text"], "a");
        let finish = completion.finish_chunk(&done(StopReason::Eos), false);
        assert_eq!(finish["choices"][0]["finish_reason"], "stop");
        let chat = reply(Endpoint::Chat);
        let role = chat.role_chunk().unwrap();
        assert_eq!(role["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(
            chat.text_chunk("b", NONE)["choices"][0]["delta"]["content"],
            "b"
        );
        let finish = chat.finish_chunk(&done(StopReason::StopSequence), false);
        assert_eq!(finish["choices"][0]["delta"], json!({}));
        let usage = chat.usage_chunk(&[&done(StopReason::Eos)]);
        assert_eq!(usage["choices"], json!([]));
        assert_eq!(usage["usage"]["completion_tokens"], 3);
    }

    #[test]
    fn tool_calls_fill_the_message_and_the_finish_reason() {
        let call = ToolCall {
            id: "call_1".into(),
            name: "f".into(),
            arguments: "{}".into(),
        };
        let chat = reply(Endpoint::Chat);
        let whole = whole_reply(
            &chat,
            "",
            "",
            std::slice::from_ref(&call),
            &[],
            &done(StopReason::Eos),
        );
        let choice = &whole["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls");
        assert!(choice["message"]["content"].is_null());
        assert_eq!(choice["message"]["tool_calls"][0]["function"]["name"], "f");
        let chunk = chat.tool_call_chunk(1, &call);
        assert_eq!(chunk["choices"][0]["delta"]["tool_calls"][0]["index"], 1);
        let more = chat.arguments_chunk(1, "{\"a\"");
        assert_eq!(
            more["choices"][0]["delta"]["tool_calls"][0],
            json!({"index": 1, "function": {"arguments": "{\"a\""}})
        );
        let finish = chat.finish_chunk(&done(StopReason::Eos), true);
        assert_eq!(finish["choices"][0]["finish_reason"], "tool_calls");
        let cut = chat.finish_chunk(&done(StopReason::MaxTokens), true);
        assert_eq!(cut["choices"][0]["finish_reason"], "length");
    }

    fn entry(id: u32, text: &str, logprob: f64) -> LogprobEntry {
        LogprobEntry {
            id,
            bytes: text.as_bytes().to_vec(),
            logprob,
        }
    }

    #[test]
    fn logprobs_take_each_endpoints_shape() {
        let tokens = [
            TokenLogprob {
                chosen: entry(1, "é", -0.5),
                top: vec![entry(1, "é", -0.5), entry(2, "e", -1.5)],
            },
            TokenLogprob {
                chosen: entry(3, "x", -0.25),
                top: vec![entry(3, "x", -0.25), entry(4, "y", -2.0)],
            },
        ];
        let logprobs = Logprobs {
            tokens: &tokens,
            offset: 4,
        };
        let chat = Reply {
            logprobs: true,
            ..reply(Endpoint::Chat)
        };
        let chunk = chat.text_chunk("éx", logprobs);
        let content = &chunk["choices"][0]["logprobs"]["content"];
        assert_eq!(content[0]["token"], "é");
        assert_eq!(content[0]["bytes"], json!([0xC3, 0xA9]));
        assert_eq!(
            content[1]["top_logprobs"][1],
            json!({"token": "y", "logprob": -2.0, "bytes": [121]})
        );
        let completion = Reply {
            logprobs: true,
            ..reply(Endpoint::Completions)
        };
        let chunk = completion.text_chunk("éx", logprobs);
        let logprobs = &chunk["choices"][0]["logprobs"];
        assert_eq!(logprobs["tokens"], json!(["é", "x"]));
        assert_eq!(logprobs["token_logprobs"], json!([-0.5, -0.25]));
        assert_eq!(logprobs["top_logprobs"][0], json!({"é": -0.5, "e": -1.5}));
        assert_eq!(logprobs["text_offset"], json!([4, 5]));
        assert!(reply(Endpoint::Chat).text_chunk("a", NONE)["choices"][0]["logprobs"].is_null());
        let ids = Reply {
            tokens_as_ids: true,
            ..completion
        };
        let all = Logprobs {
            tokens: &tokens,
            offset: 0,
        };
        let chunk = ids.text_chunk("éx", all);
        assert_eq!(
            chunk["choices"][0]["logprobs"]["tokens"],
            json!(["token_id:1", "token_id:3"])
        );
    }
}
