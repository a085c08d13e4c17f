//! The grammar fields: `/execute`'s `grammar` and OpenAI's `response_format`, read into one
//! [`GrammarSpec`] (compiled at submission, when the model's vocabulary is at hand).

use serde_json::{Map, Value};
use worker_common::grammar::GrammarSpec;

use super::fields::Fields;

/// Longest Lark grammar or regular expression, in bytes.
const MAX_GRAMMAR_BYTES: usize = 64 << 10;

impl Fields<'_> {
    /// `/execute`'s `grammar`: `{"type": "json_object"}`, `{"type": "json_schema", "schema":
    /// {…}}`, `{"type": "lark", "grammar": "…"}` or `{"type": "regex", "pattern": "…"}`.
    pub(super) fn grammar(&mut self) -> Option<GrammarSpec> {
        let value = self.get("grammar")?;
        let Value::Object(object) = value else {
            self.wrong_type("grammar", "object", value);
            return None;
        };
        match object.get("type").and_then(Value::as_str) {
            Some("json_object") => Some(GrammarSpec::JsonObject),
            Some("json_schema") => self.schema("grammar.schema", object.get("schema")),
            Some("lark") => self
                .grammar_text("grammar.grammar", object.get("grammar"))
                .map(GrammarSpec::Lark),
            Some("regex") => self
                .grammar_text("grammar.pattern", object.get("pattern"))
                .map(GrammarSpec::Regex),
            _ => {
                let message = "grammar.type must be json_object, json_schema, lark or regex";
                self.fail(
                    "grammar.type",
                    "one_of(grammar types)",
                    message.into(),
                    None,
                );
                None
            }
        }
    }

    /// OpenAI's `response_format`: `text` (no grammar), `json_object`, or `json_schema` with
    /// `json_schema.schema`.
    pub(super) fn response_format(&mut self) -> Option<GrammarSpec> {
        let value = self.get("response_format")?;
        let Value::Object(object) = value else {
            self.wrong_type("response_format", "object", value);
            return None;
        };
        match object.get("type").and_then(Value::as_str) {
            Some("text") => None,
            Some("json_object") => Some(GrammarSpec::JsonObject),
            Some("json_schema") => {
                let inner = object.get("json_schema").and_then(Value::as_object);
                let schema = inner.and_then(|inner: &Map<String, Value>| inner.get("schema"));
                self.schema("response_format.json_schema.schema", schema)
            }
            _ => {
                let message = "response_format.type must be text, json_object or json_schema";
                let field = "response_format.type";
                self.fail(
                    field,
                    "one_of(text, json_object, json_schema)",
                    message.into(),
                    None,
                );
                None
            }
        }
    }

    /// A JSON schema in `field`: an object (or `true`), required.
    pub(super) fn schema(&mut self, field: &str, value: Option<&Value>) -> Option<GrammarSpec> {
        match value {
            Some(schema @ (Value::Object(_) | Value::Bool(true))) => {
                Some(GrammarSpec::JsonSchema(schema.clone()))
            }
            Some(other) => {
                self.wrong_type(field, "object", other);
                None
            }
            None => {
                self.fail(field, "required", format!("{field} is required"), None);
                None
            }
        }
    }

    fn grammar_text(&mut self, field: &str, value: Option<&Value>) -> Option<String> {
        match value {
            Some(Value::String(text)) if !text.is_empty() && text.len() <= MAX_GRAMMAR_BYTES => {
                Some(text.clone())
            }
            Some(Value::String(text)) => {
                let message = format!("{} bytes, must be 1 to {MAX_GRAMMAR_BYTES}", text.len());
                self.fail(field, "length(1..=65536)", message, None);
                None
            }
            Some(other) => {
                self.wrong_type(field, "string", other);
                None
            }
            None => {
                self.fail(field, "required", format!("{field} is required"), None);
                None
            }
        }
    }

    /// A grammar decides where the output ends: `ignore_eos` cannot go with one.
    pub(super) fn check_grammar_end(&mut self, grammar: Option<&GrammarSpec>, ignore_eos: bool) {
        if grammar.is_some() && ignore_eos {
            let message = "ignore_eos cannot be combined with a grammar or response_format".into();
            self.fail("ignore_eos", "conflicts(grammar)", message, None);
        }
    }
}
