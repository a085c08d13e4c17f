//! The bodies of `POST /tokenize` and `POST /detokenize`, as llama-server takes them.

use serde_json::Value;

use super::FieldError;
use super::fields::{Fields, json_object};

/// Most ids one `/detokenize` takes (the body limit bounds `/tokenize`'s text).
pub const MAX_DETOKENIZE_IDS: usize = 1 << 20;

/// `{"content", "add_special"?, "parse_special"?, "with_pieces"?}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenizeRequest {
    /// The text.
    pub content: String,
    /// Add BOS/EOS as the vocabulary asks (default false, as llama-server).
    pub add_special: bool,
    /// Match control tokens written in the text (default true, as llama-server).
    pub parse_special: bool,
    /// Answer `{"id", "piece"}` objects rather than bare ids.
    pub with_pieces: bool,
}

impl TokenizeRequest {
    /// Parses and validates a body sent with `content_type`.
    pub fn parse(content_type: Option<&str>, body: &[u8]) -> Result<Self, Vec<FieldError>> {
        let object = json_object(content_type, body)?;
        let mut fields = Fields::new(&object);
        let content = fields.required_string("content").map(str::to_owned);
        let add_special = fields.boolean("add_special");
        let parse_special =
            fields.get("parse_special").is_none() || fields.boolean("parse_special");
        let with_pieces = fields.boolean("with_pieces");
        match content {
            Some(content) if fields.errors.is_empty() => Ok(Self {
                content,
                add_special,
                parse_special,
                with_pieces,
            }),
            _ => Err(fields.errors),
        }
    }
}

/// `{"tokens": [id, …]}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DetokenizeRequest {
    /// The ids, each checked against the vocabulary by the route.
    pub tokens: Vec<u32>,
}

impl DetokenizeRequest {
    /// Parses and validates a body sent with `content_type`.
    pub fn parse(content_type: Option<&str>, body: &[u8]) -> Result<Self, Vec<FieldError>> {
        let object = json_object(content_type, body)?;
        let mut fields = Fields::new(&object);
        let tokens = match fields.get("tokens") {
            None => {
                fields.fail("tokens", "required", "tokens is required".into(), None);
                None
            }
            Some(Value::Array(items)) => {
                let ids: Option<Vec<u32>> = items
                    .iter()
                    .map(|v| v.as_u64().and_then(|id| u32::try_from(id).ok()))
                    .collect();
                if ids.is_none() {
                    let message = "tokens must be token ids (integers from 0)".into();
                    fields.fail("tokens", "type(array of ids)", message, None);
                }
                ids.filter(|ids| {
                    fields.within_count("tokens", ids.len(), MAX_DETOKENIZE_IDS, "ids")
                })
            }
            Some(other) => {
                fields.wrong_type("tokens", "array", other);
                None
            }
        };
        match tokens {
            Some(tokens) if fields.errors.is_empty() => Ok(Self { tokens }),
            _ => Err(fields.errors),
        }
    }
}
