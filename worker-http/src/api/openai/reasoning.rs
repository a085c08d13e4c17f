//! Reasoning out of a model's text, as it streams: a model that thinks before it answers writes
//! both into one stream of tokens, and the chat route sends the thinking as
//! `reasoning_content`, apart from the answer's `content` (llama-server's and vLLM's field).
//!
//! Harmony (gpt-oss) writes messages on channels. After the prompt's `<|start|>assistant` the
//! model writes e.g. `<|channel|>analysis<|message|>…<|end|><|start|>assistant<|channel|>final
//! <|message|>…` and stops at `<|return|>` (an end-of-generation token, absent from the text).
//! The markers are user-defined tokens, so they are in the text: a message's header (from
//! `<|start|>` or `<|channel|>` up to `<|message|>`: role, channel, ` to=<recipient>`,
//! `<|constrain|>json`) is read and dropped, and its body goes to reasoning (the `analysis`
//! channel) or to content (`final`, `commentary`, any other). A reply that does not open with
//! harmony's structure is passed through as content unchanged, as llama.cpp does when its
//! parse fails.

use super::tool_calls::Piece;

const CHANNEL: &str = "<|channel|>";
const MESSAGE: &str = "<|message|>";
const START: &str = "<|start|>";
const END: &str = "<|end|>";

/// What can open a message (a reply, or what follows `<|end|>`).
const OPENERS: [&str; 2] = [START, CHANNEL];

/// What ends a message's body: its end, or the next message's header (a model may skip
/// `<|end|>` before it).
const BODY_ENDS: [&str; 3] = [END, START, CHANNEL];

/// Most bytes of a header before `<|message|>`. Real headers are short (`<|start|>assistant
/// <|channel|>commentary to=functions.<name> <|constrain|>json`, names ≤ 64 bytes); a longer
/// one means the model left the format, and buffering it until the end would stall the
/// stream.
const MAX_HEADER: usize = 256;

/// How a model writes its reasoning, read from its chat template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningFormat {
    /// OpenAI's harmony (gpt-oss): messages on channels, reasoning on `analysis`.
    Harmony,
}

impl ReasoningFormat {
    /// The format of a model whose chat template is `source`, if it reasons in one we parse:
    /// harmony when the template writes both `<|channel|>` and `<|message|>`.
    pub fn of_template(source: &str) -> Option<Self> {
        (source.contains(CHANNEL) && source.contains(MESSAGE)).then_some(Self::Harmony)
    }
}

/// Which field a message's body goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Reasoning,
    Content,
}

/// Where the parser is in the reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing decided yet: whether the reply is harmony at all.
    Start,
    /// Not harmony: everything is content.
    Plain,
    /// In a header, up to `<|message|>`.
    Header,
    /// In a message's body.
    Body(Field),
    /// After `<|end|>`: a header is expected next.
    Between,
}

/// Splits one reply's text into reasoning and content.
#[derive(Debug)]
pub struct ReasoningParser {
    format: ReasoningFormat,
    state: State,
    /// Text not yet released: a header, or a tail that could still begin a marker.
    held: String,
}

impl ReasoningParser {
    /// A parser for a reply in `format`.
    pub fn new(format: ReasoningFormat) -> Self {
        Self {
            format,
            state: State::Start,
            held: String::new(),
        }
    }

    /// Takes the next text; returns what can be released ([`Piece::Reasoning`] and
    /// [`Piece::Content`] only).
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.held.push_str(text);
        match self.format {
            ReasoningFormat::Harmony => self.harmony(),
        }
    }

    /// The reply ended: a body still open goes to its field, a header cut off is dropped, and
    /// anything else held (the start of a marker that never came) is content.
    pub fn finish(&mut self) -> Vec<Piece> {
        let held = std::mem::take(&mut self.held);
        let mut out = Vec::new();
        match self.state {
            State::Header => {}
            State::Body(field) => release(&mut out, field, held),
            State::Start | State::Plain | State::Between => {
                release(&mut out, Field::Content, held);
            }
        }
        out
    }

    fn harmony(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        loop {
            let moved = match self.state {
                State::Start | State::Between => self.opening(),
                State::Plain => {
                    let text = std::mem::take(&mut self.held);
                    release(&mut out, Field::Content, text);
                    false
                }
                State::Header => self.header(&mut out),
                State::Body(field) => self.body(field, &mut out),
            };
            if !moved {
                return out;
            }
        }
    }

    /// Before a message: a header opens, or (once the text cannot be a marker) the reply is
    /// not harmony (at its start) or carries stray text between messages, which is content.
    /// True when the state changed.
    fn opening(&mut self) -> bool {
        if OPENERS.iter().any(|marker| self.held.starts_with(marker)) {
            self.state = State::Header;
            return true;
        }
        if OPENERS.iter().any(|marker| marker.starts_with(&*self.held)) {
            return false;
        }
        self.state = match self.state {
            State::Start => State::Plain,
            _ => State::Body(Field::Content),
        };
        true
    }

    /// A header is complete at `<|message|>`: it picks the body's field and is dropped. The
    /// decision depends only on the text, never on how it was cut into pieces.
    fn header(&mut self, out: &mut Vec<Piece>) -> bool {
        match self.held.find(MESSAGE) {
            Some(at) if at <= MAX_HEADER => {
                let field = field_of(&self.held[..at]);
                self.held.drain(..at + MESSAGE.len());
                self.state = State::Body(field);
                true
            }
            None if self.held.len() < MAX_HEADER + MESSAGE.len() => false,
            // Too long to be a header: the model left the format, its text goes out as is.
            _ => {
                let text = std::mem::take(&mut self.held);
                release(out, Field::Content, text);
                self.state = State::Plain;
                true
            }
        }
    }

    /// Releases a body's text up to its end, holding back a tail that could begin a marker.
    fn body(&mut self, field: Field, out: &mut Vec<Piece>) -> bool {
        let ended = BODY_ENDS
            .iter()
            .filter_map(|marker| self.held.find(marker).map(|at| (at, *marker)))
            .min();
        if let Some((at, marker)) = ended {
            let text: String = self.held.drain(..at).collect();
            release(out, field, text);
            if marker == END {
                self.held.drain(..END.len());
                self.state = State::Between;
            } else {
                self.state = State::Header;
            }
            return true;
        }
        // Markers are ASCII, so a matched tail starts on a character boundary.
        let keep = BODY_ENDS
            .iter()
            .filter_map(|marker| {
                (1..marker.len())
                    .rev()
                    .find(|&n| self.held.ends_with(&marker[..n]))
            })
            .max()
            .unwrap_or(0);
        let text: String = self.held.drain(..self.held.len() - keep).collect();
        release(out, field, text);
        false
    }
}

/// The field of a message from its header: reasoning on the `analysis` channel, content
/// otherwise. A message to a recipient (` to=functions.f`: a harmony tool call, not parsed
/// into `tool_calls` yet) is content too, so its text is not lost.
fn field_of(header: &str) -> Field {
    let channel = header
        .split(CHANNEL)
        .nth(1)
        .and_then(|rest| rest.split(|c: char| c.is_whitespace() || c == '<').next());
    match channel {
        Some("analysis") => Field::Reasoning,
        _ => Field::Content,
    }
}

fn release(out: &mut Vec<Piece>, field: Field, text: String) {
    if text.is_empty() {
        return;
    }
    out.push(match field {
        Field::Reasoning => Piece::Reasoning(text),
        Field::Content => Piece::Content(text),
    });
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const REPLY: &str = "<|channel|>analysis<|message|>The user says hi. <|end|>\
        <|start|>assistant<|channel|>final<|message|>Hello! <|x|> here.";

    /// Everything `pieces` become, reasoning and content each concatenated, and the pieces.
    fn run(pieces: &[&str]) -> (String, String, Vec<Piece>) {
        let mut parser = ReasoningParser::new(ReasoningFormat::Harmony);
        let mut all: Vec<Piece> = pieces.iter().flat_map(|piece| parser.push(piece)).collect();
        all.extend(parser.finish());
        let (mut reasoning, mut content) = (String::new(), String::new());
        for piece in &all {
            match piece {
                Piece::Reasoning(text) => reasoning.push_str(text),
                Piece::Content(text) => content.push_str(text),
                other => panic!("not text: {other:?}"),
            }
        }
        (reasoning, content, all)
    }

    /// `text` cut into its characters.
    fn chars(text: &str) -> Vec<String> {
        text.chars().map(String::from).collect()
    }

    fn run_chars(text: &str) -> (String, String) {
        let pieces = chars(text);
        let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
        let (reasoning, content, _) = run(&pieces);
        (reasoning, content)
    }

    #[test]
    fn the_format_is_read_from_the_template() {
        let harmony = "{{ '<|start|>assistant<|channel|>final<|message|>' }}";
        assert_eq!(
            ReasoningFormat::of_template(harmony),
            Some(ReasoningFormat::Harmony)
        );
        assert_eq!(ReasoningFormat::of_template("<|im_start|>assistant"), None);
        assert_eq!(ReasoningFormat::of_template("<|channel|> only"), None);
    }

    #[test]
    fn analysis_is_reasoning_and_final_is_content() {
        let (reasoning, content, pieces) = run(&[REPLY]);
        assert_eq!(reasoning, "The user says hi. ");
        assert_eq!(content, "Hello! <|x|> here.");
        assert_eq!(pieces.len(), 2, "{pieces:?}");
    }

    #[test]
    fn a_character_at_a_time_gives_the_same_text() {
        assert_eq!(
            run_chars(REPLY),
            ("The user says hi. ".into(), "Hello! <|x|> here.".into())
        );
        let unicode = "<|channel|>analysis<|message|>é<|🦀|><|end|><|start|>assistant<|channel|>final<|message|>ü<|";
        let (reasoning, content, _) = run(&[unicode]);
        assert_eq!((reasoning.as_str(), content.as_str()), ("é<|🦀|>", "ü<|"));
        assert_eq!(run_chars(unicode), (reasoning, content));
    }

    #[test]
    fn markers_split_across_pushes_and_sharing_pushes_with_text() {
        let (reasoning, content, _) = run(&[
            "<|chan",
            "nel|>analy",
            "sis<|mess",
            "age|>Think",
            "ing.<|e",
            "nd|><|start|>assistant<|channel|>final<|message|>An",
            "swer<",
            "|",
        ]);
        assert_eq!(
            (reasoning.as_str(), content.as_str()),
            ("Thinking.", "Answer<|")
        );
    }

    #[test]
    fn text_that_does_not_open_with_harmony_is_content_unchanged() {
        for text in [
            "Hello <|channel|>analysis<|message|>x",
            " <|channel|>final<|message|>x",
            "<|chat|>",
            "<",
        ] {
            assert_eq!(run(&[text]).1, text);
            assert_eq!(run_chars(text), (String::new(), text.to_owned()));
        }
        assert_eq!(run(&[]).2, []);
    }

    #[test]
    fn an_unterminated_analysis_is_flushed_as_reasoning_at_the_end() {
        let (reasoning, content, _) = run(&["<|channel|>analysis<|message|>Still thinking <|e"]);
        assert_eq!(
            (reasoning.as_str(), content.as_str()),
            ("Still thinking <|e", "")
        );
        // Cut inside a header: the header is dropped.
        let (reasoning, content, _) =
            run(&["<|channel|>analysis<|message|>a<|end|><|start|>assistant<|chan"]);
        assert_eq!((reasoning.as_str(), content.as_str()), ("a", ""));
    }

    #[test]
    fn headers_never_reach_either_field() {
        let text = "<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": 1}<|end|>\
            <|start|>assistant<|channel|>commentary<|message|> note<|end|>\n\
            <|channel|>analysis<|message|>r1<|channel|>analysis<|message|>r2<|channel|>final<|message|>done";
        let expected = ("r1r2".to_owned(), "{\"a\": 1} note\ndone".to_owned());
        let (reasoning, content, _) = run(&[text]);
        assert_eq!((reasoning, content), expected);
        assert_eq!(run_chars(text), expected);
    }

    #[test]
    fn an_overlong_header_is_passed_through() {
        let text = format!("<|start|>{}<|message|>x", "a".repeat(MAX_HEADER));
        let (reasoning, content, _) = run(&[&text]);
        assert_eq!((reasoning.as_str(), content.as_str()), ("", text.as_str()));
        assert_eq!(run_chars(&text), (String::new(), text.clone()));
        // A header that stops just short of the bound is one.
        let fits = format!(
            "<|channel|>analysis{}<|message|>x",
            " ".repeat(MAX_HEADER - 19)
        );
        assert_eq!(run_chars(&fits), ("x".into(), String::new()));
    }

    #[test]
    fn the_channel_name_picks_the_field() {
        assert_eq!(field_of("<|channel|>analysis"), Field::Reasoning);
        assert_eq!(
            field_of("<|start|>assistant<|channel|>analysis "),
            Field::Reasoning
        );
        assert_eq!(field_of("<|channel|>final"), Field::Content);
        assert_eq!(field_of("<|start|>assistant"), Field::Content);
        assert_eq!(
            field_of("<|channel|>commentary to=functions.f<|constrain|>json"),
            Field::Content
        );
    }
}
