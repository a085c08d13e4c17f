//! Tool calls out of a model's text, as it streams: text before a call goes out as content
//! (holding back what could still open a call), a call's text is buffered until it closes and
//! then parsed into a name and JSON arguments. Text that only looked like a call goes out as
//! content unchanged.

use serde_json::Value;

use super::tools::ToolFormat;

/// What a Hermes-style call is wrapped in: the format's tags, or a JSON code fence (Qwen2.5
/// Coder often fences its calls; llama.cpp's Hermes parser accepts fences too). A wrapped
/// body that is not a call is content.
const WRAPPERS: [(&str, &str); 2] = [("<tool_call>", "</tool_call>"), ("```json", "```")];

/// A parsed call.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// `call_<…>`.
    pub id: String,
    /// The function.
    pub name: String,
    /// Its arguments as a JSON object's text (OpenAI sends a string).
    pub arguments: String,
}

/// What a piece of model text becomes.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    /// Text for the reply's content.
    Content(String),
    /// A call.
    Call(ToolCall),
}

/// Splits one reply's text into content and calls.
#[derive(Debug)]
pub struct ToolCallParser {
    format: ToolFormat,
    /// Text not yet released: a possible start of a call, or a call being written.
    held: String,
    /// Inside a wrapper (Hermes: its index in [`WRAPPERS`]), or the whole reply is a JSON
    /// call (Llama 3: index 0).
    in_call: Option<usize>,
    /// Whether any non-space text came yet (Llama 3 calls are the whole reply).
    started: bool,
    calls: usize,
}

impl ToolCallParser {
    /// A parser for a reply in `format`.
    pub fn new(format: ToolFormat) -> Self {
        Self {
            format,
            held: String::new(),
            in_call: None,
            started: false,
            calls: 0,
        }
    }

    /// Whether the reply made any call so far.
    pub fn made_calls(&self) -> bool {
        self.calls > 0
    }

    /// Takes the next text; returns what can be released.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.held.push_str(text);
        match self.format {
            ToolFormat::Hermes => self.hermes(),
            ToolFormat::Llama3 => self.llama3(),
        }
    }

    /// The reply ended: what is still held, a call closed by the end or plain content.
    pub fn finish(&mut self) -> Vec<Piece> {
        let held = std::mem::take(&mut self.held);
        if held.is_empty() {
            return Vec::new();
        }
        if let Some(wrapper) = self.in_call {
            let body = match self.format {
                ToolFormat::Hermes => held.strip_prefix(WRAPPERS[wrapper].0).unwrap_or(&held),
                ToolFormat::Llama3 => &held,
            };
            if let Some(call) = self.parse(body) {
                return vec![Piece::Call(call)];
            }
        }
        vec![Piece::Content(held)]
    }

    fn hermes(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        loop {
            if let Some(wrapper) = self.in_call {
                let (open, close) = WRAPPERS[wrapper];
                let Some(end) = self.held[open.len()..]
                    .find(close)
                    .map(|at| at + open.len())
                else {
                    return out;
                };
                let text: String = self.held.drain(..end + close.len()).collect();
                match self.parse(&text[open.len()..end]) {
                    Some(call) => out.push(Piece::Call(call)),
                    None => out.push(Piece::Content(text)),
                }
                self.in_call = None;
                continue;
            }
            let opened = WRAPPERS
                .iter()
                .enumerate()
                .filter_map(|(i, (open, _))| self.held.find(open).map(|at| (at, i)))
                .min();
            if let Some((start, wrapper)) = opened {
                let before: String = self.held.drain(..start).collect();
                push_content(&mut out, before);
                self.in_call = Some(wrapper);
                continue;
            }
            // Release all but a tail that could still begin a wrapper.
            let keep = WRAPPERS
                .iter()
                .filter_map(|(open, _)| {
                    (1..open.len())
                        .rev()
                        .find(|&n| self.held.ends_with(&open[..n]))
                })
                .max()
                .unwrap_or(0);
            let release = self.held.len() - keep;
            let text: String = self.held.drain(..release).collect();
            push_content(&mut out, text);
            return out;
        }
    }

    fn llama3(&mut self) -> Vec<Piece> {
        if !self.started {
            let trimmed = self.held.trim_start();
            let trimmed = trimmed.strip_prefix("<|python_tag|>").unwrap_or(trimmed);
            if trimmed.is_empty() {
                return Vec::new();
            }
            self.started = true;
            self.in_call = trimmed.starts_with('{').then_some(0);
        }
        if self.in_call.is_some() {
            return Vec::new();
        }
        let text = std::mem::take(&mut self.held);
        let mut out = Vec::new();
        push_content(&mut out, text);
        out
    }

    /// A call's JSON: `{"name": …, "arguments"|"parameters": {…}}`.
    fn parse(&mut self, body: &str) -> Option<ToolCall> {
        let body = body.trim();
        let body = body.strip_prefix("<|python_tag|>").unwrap_or(body);
        let value: Value = serde_json::from_str(body).ok()?;
        let name = value.get("name")?.as_str()?.to_owned();
        let arguments = value
            .get("arguments")
            .or_else(|| value.get("parameters"))
            .cloned()
            .unwrap_or_else(|| serde_json::json!({}));
        let arguments = match arguments {
            Value::String(text) => text,
            other => other.to_string(),
        };
        self.calls += 1;
        let id = format!("call_{}", &uuid::Uuid::new_v4().simple().to_string()[..24]);
        Some(ToolCall {
            id,
            name,
            arguments,
        })
    }
}

fn push_content(out: &mut Vec<Piece>, text: String) {
    if !text.is_empty() {
        out.push(Piece::Content(text));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `pieces` one by one and collects everything, merging adjacent content.
    fn run(format: ToolFormat, pieces: &[&str]) -> Vec<Piece> {
        let mut parser = ToolCallParser::new(format);
        let mut out: Vec<Piece> = Vec::new();
        let mut all: Vec<Piece> = pieces.iter().flat_map(|piece| parser.push(piece)).collect();
        all.extend(parser.finish());
        for piece in all {
            match (out.last_mut(), piece) {
                (Some(Piece::Content(text)), Piece::Content(more)) => text.push_str(&more),
                (_, piece) => out.push(piece),
            }
        }
        out
    }

    fn call(piece: &Piece) -> (&str, &str) {
        match piece {
            Piece::Call(call) => (call.name.as_str(), call.arguments.as_str()),
            other => panic!("not a call: {other:?}"),
        }
    }

    #[test]
    fn hermes_calls_are_cut_out_of_the_stream_whatever_the_pieces() {
        let text = "Let me check.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        for split in [1, 3, 7, text.len()] {
            let pieces: Vec<&str> = text
                .as_bytes()
                .chunks(split)
                .map(|c| std::str::from_utf8(c).unwrap())
                .collect();
            let out = run(ToolFormat::Hermes, &pieces);
            assert_eq!(
                out[0],
                Piece::Content("Let me check.".into()),
                "split {split}"
            );
            assert_eq!(call(&out[1]), ("get_weather", r#"{"city":"Paris"}"#));
            assert_eq!(out.len(), 2);
        }
    }

    #[test]
    fn two_calls_an_unclosed_call_and_a_broken_one() {
        let out = run(
            ToolFormat::Hermes,
            &[
                "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\n<tool_call>{\"name\": \"b\"",
                ", \"arguments\": {\"x\": 1}}",
            ],
        );
        assert_eq!(call(&out[0]), ("a", "{}"));
        assert_eq!(out[1], Piece::Content("\n".into()));
        assert_eq!(
            call(&out[2]),
            ("b", r#"{"x":1}"#),
            "closed by the end of the reply"
        );
        let broken = run(
            ToolFormat::Hermes,
            &["a <tool_call>not json</tool_call> b <tool"],
        );
        assert_eq!(
            broken,
            [Piece::Content(
                "a <tool_call>not json</tool_call> b <tool".into()
            )]
        );
    }

    #[test]
    fn fenced_json_calls_count_and_other_code_blocks_stay_content() {
        let fenced = "```json\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n```";
        let out = run(ToolFormat::Hermes, &[&fenced[..5], &fenced[5..]]);
        assert_eq!(out.len(), 1);
        assert_eq!(call(&out[0]), ("f", r#"{"a":1}"#));
        let code = "Use this:\n```json\n{\"x\": 1}\n```\nDone.";
        let out = run(ToolFormat::Hermes, &[code]);
        assert_eq!(out, [Piece::Content(code.into())]);
    }

    #[test]
    fn llama3_calls_are_the_whole_reply() {
        let out = run(
            ToolFormat::Llama3,
            &[" {\"name\": \"f\", ", "\"parameters\": {\"q\": \"x\"}}"],
        );
        assert_eq!(call(&out[0]), ("f", r#"{"q":"x"}"#));
        let text = run(ToolFormat::Llama3, &["Hello ", "there"]);
        assert_eq!(text, [Piece::Content("Hello there".into())]);
    }
}
