//! Tool calls out of a model's text, as it streams: text before a call goes out as content
//! (holding back what could still open a call), a call's text is buffered until it closes and
//! then parsed into a name and JSON arguments. Text that only looked like a call goes out as
//! content unchanged.
//!
//! A streaming parser ([`ToolCallParser::streaming`]) sends a Hermes call as OpenAI streams
//! one: once the call's text reads `{"name": "…", "arguments": {`, its start (id and name),
//! then its arguments' text as it comes, up to the object's closing brace. A call written any
//! other way (arguments first, arguments as a string) is still buffered and parsed whole.
//! Either way a call's arguments are the model's own text of the object, so a reply streamed
//! and a reply answered whole carry the same string.

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
    /// Text for the reply's `reasoning_content` (only from a
    /// [`ReasoningParser`](super::ReasoningParser); this parser never makes it).
    Reasoning(String),
    /// A call.
    Call(ToolCall),
    /// A streamed call's start: its id and name, with empty arguments.
    CallStart(ToolCall),
    /// More of the streamed call's arguments text.
    Arguments(String),
}

/// Where a streamed call is.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Streamed {
    /// Before its arguments: waiting for `{"name": …, "arguments": `.
    Header,
    /// Written another way: buffered and parsed whole.
    Whole,
    /// Inside its arguments object.
    Arguments(ObjectScan),
    /// After the arguments, until the wrapper closes.
    Tail,
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
    /// Whether Hermes calls are sent as they are written ([`Self::streaming`]).
    streaming: bool,
    /// The current streamed call's progress.
    streamed: Streamed,
    /// The functions the request offered ([`Self::offering`]); a "call" to any other is text
    /// (small models invent functions: `say`, `sayHelloWorld`). `None`: any name.
    offered: Option<Vec<String>>,
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
            streaming: false,
            streamed: Streamed::Header,
            offered: None,
        }
    }

    /// The parser taking calls to `names` only: a call to another function stays content.
    pub fn offering(self, names: Vec<String>) -> Self {
        Self {
            offered: Some(names),
            ..self
        }
    }

    /// Whether a call to `name` is one the request offered.
    fn offers(&self, name: &str) -> bool {
        self.offered
            .as_ref()
            .is_none_or(|names| names.iter().any(|n| n == name))
    }

    /// A parser for a streamed reply: Hermes calls come out as [`Piece::CallStart`] and
    /// [`Piece::Arguments`] while they are written.
    pub fn streaming(format: ToolFormat) -> Self {
        Self {
            streaming: true,
            ..Self::new(format)
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
        if self.in_call.is_some() && self.streaming {
            match self.streamed {
                Streamed::Arguments(_) => return vec![Piece::Arguments(held)],
                Streamed::Tail => return Vec::new(),
                Streamed::Header | Streamed::Whole => {}
            }
        }
        if let Some(wrapper) = self.in_call {
            let body = match self.format {
                ToolFormat::Hermes => held.strip_prefix(WRAPPERS[wrapper].0).unwrap_or(&held),
                ToolFormat::Llama3 => &held,
            };
            if let Some(calls) = self.parse_calls(body) {
                return calls.into_iter().map(Piece::Call).collect();
            }
        }
        vec![Piece::Content(held)]
    }

    fn hermes(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        loop {
            if let Some(wrapper) = self.in_call
                && self.streaming
                && self.streamed != Streamed::Whole
            {
                match self.stream_call(wrapper, &mut out) {
                    Flow::Wait => return out,
                    Flow::Closed => continue,
                    Flow::Whole => self.streamed = Streamed::Whole,
                }
            }
            if let Some(wrapper) = self.in_call {
                let (open, close) = WRAPPERS[wrapper];
                let Some(end) = self.held[open.len()..]
                    .find(close)
                    .map(|at| at + open.len())
                else {
                    return out;
                };
                let text: String = self.held.drain(..end + close.len()).collect();
                match self.parse_calls(&text[open.len()..end]) {
                    Some(calls) => out.extend(calls.into_iter().map(Piece::Call)),
                    None => out.push(Piece::Content(text)),
                }
                self.in_call = None;
                self.streamed = Streamed::Header;
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

    /// Moves the call opened by wrapper `wrapper` on as far as the held text allows.
    fn stream_call(&mut self, wrapper: usize, out: &mut Vec<Piece>) -> Flow {
        let (open, close) = WRAPPERS[wrapper];
        loop {
            match self.streamed {
                Streamed::Header => {
                    let body = &self.held[open.len()..];
                    if body.contains(close) {
                        return Flow::Whole;
                    }
                    match header(body) {
                        Header::NeedMore => return Flow::Wait,
                        Header::NoMatch => return Flow::Whole,
                        // A function never offered: the whole text, once closed, is content.
                        Header::Match { name, .. } if !self.offers(&name) => return Flow::Whole,
                        Header::Match { name, arguments_at } => {
                            self.held.drain(..open.len() + arguments_at);
                            out.push(Piece::CallStart(self.new_call(name, String::new())));
                            self.streamed = Streamed::Arguments(ObjectScan::default());
                        }
                    }
                }
                Streamed::Arguments(mut scan) => {
                    let end = scan.feed(self.held.as_bytes());
                    let taken: String = self.held.drain(..end.unwrap_or(self.held.len())).collect();
                    if !taken.is_empty() {
                        out.push(Piece::Arguments(taken));
                    }
                    if end.is_none() {
                        self.streamed = Streamed::Arguments(scan);
                        return Flow::Wait;
                    }
                    self.streamed = Streamed::Tail;
                }
                Streamed::Tail => {
                    // After the arguments, the call's own closing brace; then either the
                    // wrapper's end or another call in the same wrapper (Qwen fences its
                    // parallel calls together), which streams as a call of its own.
                    let trimmed = self.held.trim_start();
                    let next = trimmed.strip_prefix('}').map(|after| {
                        after.trim_start_matches(|c: char| c.is_whitespace() || c == ',')
                    });
                    match next {
                        Some(next) if next.starts_with('{') => {
                            self.held = format!("{open}{next}");
                            self.streamed = Streamed::Header;
                            continue;
                        }
                        Some("") => return Flow::Wait,
                        _ if trimmed.is_empty() => return Flow::Wait,
                        _ => {}
                    }
                    let Some(at) = self.held.find(close) else {
                        return Flow::Wait;
                    };
                    self.held.drain(..at + close.len());
                    self.in_call = None;
                    self.streamed = Streamed::Header;
                    return Flow::Closed;
                }
                Streamed::Whole => return Flow::Whole,
            }
        }
    }

    /// The calls of one wrapper's body: one call object, several one after another (Qwen's
    /// parallel calls in one fence), or an array of them; `None` unless every one is a call.
    fn parse_calls(&mut self, body: &str) -> Option<Vec<ToolCall>> {
        let trimmed = body.trim();
        let trimmed = trimmed.strip_prefix("<|python_tag|>").unwrap_or(trimmed);
        let pieces: Vec<String> = if trimmed.starts_with('[') {
            match serde_json::from_str::<Value>(trimmed).ok()? {
                Value::Array(items) => items.iter().map(Value::to_string).collect(),
                _ => return None,
            }
        } else {
            let mut stream = serde_json::Deserializer::from_str(trimmed).into_iter::<Value>();
            let mut pieces = Vec::new();
            let mut start = 0;
            while let Some(value) = stream.next() {
                value.ok()?;
                let end = stream.byte_offset();
                let piece =
                    trimmed[start..end].trim_start_matches(|c: char| c.is_whitespace() || c == ',');
                pieces.push(piece.to_owned());
                start = end;
            }
            pieces
        };
        if pieces.is_empty() {
            return None;
        }
        // Checked before any call is counted: a reply with one invented call is content whole.
        let all_calls = pieces.iter().all(|piece| {
            serde_json::from_str::<Value>(piece)
                .ok()
                .and_then(|v| v.get("name")?.as_str().map(|name| self.offers(name)))
                .unwrap_or(false)
        });
        if !all_calls {
            return None;
        }
        pieces.iter().map(|piece| self.parse(piece)).collect()
    }

    /// A call's JSON: `{"name": …, "arguments"|"parameters": {…}}`.
    fn parse(&mut self, body: &str) -> Option<ToolCall> {
        let body = body.trim();
        let body = body.strip_prefix("<|python_tag|>").unwrap_or(body);
        let value: Value = serde_json::from_str(body).ok()?;
        let name = value.get("name")?.as_str()?.to_owned();
        if !self.offers(&name) {
            return None;
        }
        let arguments = value
            .get("arguments")
            .or_else(|| value.get("parameters"))
            .cloned()
            .unwrap_or_else(|| serde_json::json!({}));
        let arguments = match (arguments, raw_arguments(body)) {
            (Value::Object(_), Some(raw)) => raw.to_owned(),
            (Value::String(text), _) => text,
            (other, _) => other.to_string(),
        };
        Some(self.new_call(name, arguments))
    }

    /// A call with a fresh id, counted.
    fn new_call(&mut self, name: String, arguments: String) -> ToolCall {
        self.calls += 1;
        let id = format!("call_{}", &uuid::Uuid::new_v4().simple().to_string()[..24]);
        ToolCall {
            id,
            name,
            arguments,
        }
    }
}

/// What [`ToolCallParser::stream_call`] did.
enum Flow {
    /// It needs more text.
    Wait,
    /// The call closed; text after it may follow.
    Closed,
    /// The call is not written as a streamable header: parse it whole.
    Whole,
}

/// How far a call's text matches `{"name": "…", "arguments": ` (or `"parameters"`).
#[derive(Debug, PartialEq)]
enum Header {
    /// It may still match.
    NeedMore,
    /// It does not.
    NoMatch,
    /// It does: the name, and where the arguments' value begins.
    Match { name: String, arguments_at: usize },
}

/// Matches the head of a call's JSON, with JSON's whitespace anywhere between tokens; a name
/// with escapes is not matched (the call is then parsed whole).
fn header(text: &str) -> Header {
    let mut at = 0;
    let bytes = text.as_bytes();
    let skip_space = |at: &mut usize| {
        while bytes.get(*at).is_some_and(|b| b.is_ascii_whitespace()) {
            *at += 1;
        }
    };
    // Each literal in turn; a text that ends inside one may still match.
    let literal = |at: &mut usize, options: &[&str]| -> Result<(), Header> {
        skip_space(at);
        let rest = &text[*at..];
        for option in options {
            if rest.starts_with(option) {
                *at += option.len();
                return Ok(());
            }
        }
        if options.iter().any(|option| option.starts_with(rest)) {
            Err(Header::NeedMore)
        } else {
            Err(Header::NoMatch)
        }
    };
    let matched = (|| {
        literal(&mut at, &["{"])?;
        literal(&mut at, &["\"name\""])?;
        literal(&mut at, &[":"])?;
        literal(&mut at, &["\""])?;
        let name_len = text[at..].find(['"', '\\']).ok_or(Header::NeedMore)?;
        if text[at + name_len..].starts_with('\\') {
            return Err(Header::NoMatch);
        }
        let name = text[at..at + name_len].to_owned();
        at += name_len + 1;
        literal(&mut at, &[","])?;
        literal(&mut at, &["\"arguments\"", "\"parameters\""])?;
        literal(&mut at, &[":"])?;
        skip_space(&mut at);
        match bytes.get(at) {
            None => Err(Header::NeedMore),
            Some(b'{') => Ok(name),
            Some(_) => Err(Header::NoMatch),
        }
    })();
    match matched {
        Ok(name) => Header::Match {
            name,
            arguments_at: at,
        },
        Err(header) => header,
    }
}

/// The text of a call's arguments object, when the call's JSON starts with its name.
fn raw_arguments(body: &str) -> Option<&str> {
    let Header::Match { arguments_at, .. } = header(body) else {
        return None;
    };
    let rest = &body[arguments_at..];
    let end = ObjectScan::default().feed(rest.as_bytes())?;
    Some(&rest[..end])
}

/// Finds where a JSON object ends, fed in pieces: brace depth outside strings.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct ObjectScan {
    depth: usize,
    in_string: bool,
    escaped: bool,
}

impl ObjectScan {
    /// Scans the next bytes of the object (the first piece starting at its `{`); returns one
    /// past its closing `}` if it is in `bytes`. JSON's structural characters are ASCII, and
    /// UTF-8 never repeats them inside a multi-byte character, so bytes suffice.
    fn feed(&mut self, bytes: &[u8]) -> Option<usize> {
        for (i, &b) in bytes.iter().enumerate() {
            if self.in_string {
                match (self.escaped, b) {
                    (true, _) => self.escaped = false,
                    (false, b'\\') => self.escaped = true,
                    (false, b'"') => self.in_string = false,
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' => self.in_string = true,
                b'{' | b'[' => self.depth += 1,
                b'}' | b']' => {
                    self.depth = self.depth.saturating_sub(1);
                    if self.depth == 0 {
                        return Some(i + 1);
                    }
                }
                _ => {}
            }
        }
        None
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
        feed(ToolCallParser::new(format), pieces).0
    }

    /// [`run`] for a streaming parser; also counts the argument pieces before merging them.
    fn run_streaming(format: ToolFormat, pieces: &[&str]) -> (Vec<Piece>, usize) {
        feed(ToolCallParser::streaming(format), pieces)
    }

    fn feed(mut parser: ToolCallParser, pieces: &[&str]) -> (Vec<Piece>, usize) {
        let mut out: Vec<Piece> = Vec::new();
        let mut all: Vec<Piece> = pieces.iter().flat_map(|piece| parser.push(piece)).collect();
        all.extend(parser.finish());
        let argument_pieces = all
            .iter()
            .filter(|piece| matches!(piece, Piece::Arguments(_)))
            .count();
        for piece in all {
            match (out.last_mut(), piece) {
                (Some(Piece::Content(text)), Piece::Content(more))
                | (Some(Piece::Arguments(text)), Piece::Arguments(more)) => text.push_str(&more),
                (_, piece) => out.push(piece),
            }
        }
        (out, argument_pieces)
    }

    /// `text` cut into pieces of `split` bytes.
    fn split(text: &str, split: usize) -> Vec<&str> {
        text.as_bytes()
            .chunks(split)
            .map(|c| std::str::from_utf8(c).unwrap())
            .collect()
    }

    fn call(piece: &Piece) -> (&str, &str) {
        match piece {
            Piece::Call(call) => (call.name.as_str(), call.arguments.as_str()),
            other => panic!("not a call: {other:?}"),
        }
    }

    #[test]
    fn several_calls_in_one_fence_are_each_a_call() {
        let fenced = "```json\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n{\"name\": \"b\", \"arguments\": {\"y\": [2]}}\n```";
        let expected = [("a", r#"{"x": 1}"#), ("b", r#"{"y": [2]}"#)];
        let whole = run(ToolFormat::Hermes, &[fenced]);
        let calls: Vec<(&str, &str)> = whole.iter().map(call).collect();
        assert_eq!(calls, expected, "{whole:?}");
        for size in [1, 3, 8, 1000] {
            let (out, _) = run_streaming(ToolFormat::Hermes, &split(fenced, size));
            let mut calls: Vec<(String, String)> = Vec::new();
            for piece in &out {
                match piece {
                    Piece::CallStart(start) => calls.push((start.name.clone(), String::new())),
                    Piece::Arguments(text) => calls.last_mut().unwrap().1.push_str(text),
                    Piece::Call(c) => calls.push((c.name.clone(), c.arguments.clone())),
                    Piece::Content(text) | Piece::Reasoning(text) => {
                        assert!(text.trim().is_empty(), "{out:?}")
                    }
                }
            }
            let calls: Vec<(&str, &str)> = calls
                .iter()
                .map(|(n, a)| (n.as_str(), a.as_str()))
                .collect();
            assert_eq!(calls, expected, "pieces of {size}: {out:?}");
        }
        let array = "<tool_call>\n[{\"name\": \"a\", \"arguments\": {}}, {\"name\": \"b\", \"arguments\": {}}]\n</tool_call>";
        let out = run(ToolFormat::Hermes, &[array]);
        let names: Vec<&str> = out.iter().map(|p| call(p).0).collect();
        assert_eq!(names, ["a", "b"], "{out:?}");
    }

    #[test]
    fn a_call_to_a_function_never_offered_is_content() {
        let text =
            "<tool_call>\n{\"name\": \"say\", \"arguments\": {\"text\": \"hi\"}}\n</tool_call>";
        for streaming in [false, true] {
            let parser = match streaming {
                false => ToolCallParser::new(ToolFormat::Hermes),
                true => ToolCallParser::streaming(ToolFormat::Hermes),
            };
            let offered = vec!["get_weather".to_owned()];
            let (out, _) = feed(parser.offering(offered.clone()), &split(text, 7));
            assert_eq!(
                out,
                [Piece::Content(text.to_owned())],
                "streaming {streaming}"
            );
            let parser = match streaming {
                false => ToolCallParser::new(ToolFormat::Hermes),
                true => ToolCallParser::streaming(ToolFormat::Hermes),
            };
            let weather = text.replace("say", "get_weather");
            let (out, _) = feed(parser.offering(offered), &split(&weather, 7));
            let names: Vec<&str> = out
                .iter()
                .filter_map(|p| match p {
                    Piece::Call(call) | Piece::CallStart(call) => Some(call.name.as_str()),
                    _ => None,
                })
                .collect();
            assert_eq!(names, ["get_weather"], "streaming {streaming}: {out:?}");
        }
        let llama = "{\"name\": \"say\", \"parameters\": {}}";
        let parser = ToolCallParser::new(ToolFormat::Llama3).offering(vec!["f".into()]);
        let (out, _) = feed(parser, &[llama]);
        assert_eq!(out, [Piece::Content(llama.to_owned())]);
    }

    #[test]
    fn hermes_calls_are_cut_out_of_the_stream_whatever_the_pieces() {
        let text = "Let me check.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        for bytes in [1, 3, 7, text.len()] {
            let out = run(ToolFormat::Hermes, &split(text, bytes));
            assert_eq!(
                out[0],
                Piece::Content("Let me check.".into()),
                "split {bytes}"
            );
            assert_eq!(call(&out[1]), ("get_weather", r#"{"city": "Paris"}"#));
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
            ("b", r#"{"x": 1}"#),
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
        assert_eq!(call(&out[0]), ("f", r#"{"a": 1}"#));
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
        assert_eq!(call(&out[0]), ("f", r#"{"q": "x"}"#));
        let text = run(ToolFormat::Llama3, &["Hello ", "there"]);
        assert_eq!(text, [Piece::Content("Hello there".into())]);
    }

    #[test]
    fn a_streamed_hermes_call_sends_its_start_then_its_arguments_as_they_come() {
        let arguments = r#"{"city": "Paris \"}{\" ", "days": [1, {"n": 2}]}"#;
        let text = format!(
            "Let me check.<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {arguments}}}\n</tool_call> Done."
        );
        // Arriving whole (closed in the same piece), the call goes out whole.
        let (out, _) = run_streaming(ToolFormat::Hermes, &[&text]);
        assert_eq!(call(&out[1]), ("get_weather", arguments));
        for bytes in [1, 3, 7, 60] {
            let (out, argument_pieces) = run_streaming(ToolFormat::Hermes, &split(&text, bytes));
            let [
                content,
                Piece::CallStart(start),
                Piece::Arguments(sent),
                after,
            ] = &out[..]
            else {
                panic!("split {bytes}: {out:?}");
            };
            assert_eq!(content, &Piece::Content("Let me check.".into()));
            assert_eq!(
                (start.name.as_str(), start.arguments.as_str()),
                ("get_weather", "")
            );
            assert_eq!(sent, arguments, "split {bytes}");
            assert_eq!(after, &Piece::Content(" Done.".into()));
            if bytes == 1 {
                assert!(argument_pieces > 10, "{argument_pieces} argument pieces");
            }
        }
    }

    #[test]
    fn a_call_not_written_name_first_is_still_parsed_whole_when_streaming() {
        let text = r#"<tool_call>{"arguments": {"a": 1}, "name": "f"}</tool_call>"#;
        let (out, _) = run_streaming(ToolFormat::Hermes, &split(text, 2));
        assert_eq!(out.len(), 1);
        assert_eq!(call(&out[0]), ("f", r#"{"a":1}"#));
        let (broken, _) = run_streaming(ToolFormat::Hermes, &["<tool_call>not json</tool_call>"]);
        assert_eq!(
            broken,
            [Piece::Content("<tool_call>not json</tool_call>".into())]
        );
    }

    #[test]
    fn a_reply_ending_inside_streamed_arguments_sends_what_came() {
        let (out, _) = run_streaming(
            ToolFormat::Hermes,
            &[r#"<tool_call>{"name": "f", "arguments": {"q": "ab"#],
        );
        assert!(
            matches!(&out[0], Piece::CallStart(call) if call.name == "f"),
            "{out:?}"
        );
        assert_eq!(out[1], Piece::Arguments(r#"{"q": "ab"#.into()));
        assert_eq!(out.len(), 2);
    }

    #[test]
    fn the_header_matches_prefixes_and_refuses_other_shapes() {
        let full = r#" { "name" : "f" , "parameters" : {"#;
        for end in 0..full.len() - 1 {
            assert_eq!(header(&full[..end]), Header::NeedMore, "{:?}", &full[..end]);
        }
        assert_eq!(
            header(full),
            Header::Match {
                name: "f".into(),
                arguments_at: full.len() - 1
            }
        );
        for other in [
            r#"{"nam3""#,
            r#"{"name": "a\"b""#,
            r#"{"name": "f", "arguments": "{}"#,
            "[1]",
        ] {
            assert_eq!(header(other), Header::NoMatch, "{other}");
        }
    }
}
