//! Reading a JSON body field by field, collecting every violation with its field and constraint
//! token, never with serde's or axum's own wording: shared by the contract's and OpenAI's bodies.

use serde_json::{Map, Value};

use super::FieldError;
use super::request::{Limits, MAX_JOB_ID_BYTES, MAX_STOP_BYTES, MAX_STOPS};

pub(super) fn body_error(constraint: &str, message: String) -> Vec<FieldError> {
    vec![FieldError {
        field: "body".into(),
        constraint: constraint.into(),
        message,
        value: None,
    }]
}

/// Every POST must say `Content-Type: application/json`: a browser cannot send that cross-origin
/// without a preflight the worker never grants.
pub fn require_json(content_type: Option<&str>) -> Result<(), Vec<FieldError>> {
    let media_type = content_type
        .and_then(|value| value.split(';').next())
        .map(str::trim);
    if media_type.is_some_and(|media| media.eq_ignore_ascii_case("application/json")) {
        return Ok(());
    }
    Err(body_error(
        "content_type(application/json)",
        format!(
            "Content-Type must be application/json, got {}",
            content_type.unwrap_or("none")
        ),
    ))
}

/// The body as a JSON object, after the content-type check.
pub(super) fn json_object(
    content_type: Option<&str>,
    body: &[u8],
) -> Result<Map<String, Value>, Vec<FieldError>> {
    require_json(content_type)?;
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(object)) => Ok(object),
        Ok(other) => Err(body_error(
            "type(object)",
            format!("the body must be a JSON object, got {}", type_name(&other)),
        )),
        Err(err) => Err(body_error("json", format!("malformed JSON: {err}"))),
    }
}

pub(super) fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Reads fields of one object, collecting every violation.
pub(super) struct Fields<'a> {
    object: &'a Map<String, Value>,
    /// Every violation found so far.
    pub(super) errors: Vec<FieldError>,
}

impl<'a> Fields<'a> {
    pub(super) fn new(object: &'a Map<String, Value>) -> Self {
        Self {
            object,
            errors: Vec::new(),
        }
    }

    pub(super) fn fail(
        &mut self,
        field: &str,
        constraint: &str,
        message: String,
        value: Option<&Value>,
    ) {
        self.errors.push(FieldError {
            field: field.into(),
            constraint: constraint.into(),
            message,
            value: value.cloned(),
        });
    }

    pub(super) fn wrong_type(&mut self, field: &str, expected: &str, value: &Value) {
        let message = format!("must be {expected}, got {}", type_name(value));
        self.fail(field, &format!("type({expected})"), message, Some(value));
    }

    /// The value of an optional field; `null` counts as absent.
    pub(super) fn get(&self, field: &str) -> Option<&'a Value> {
        self.object.get(field).filter(|value| !value.is_null())
    }

    pub(super) fn required_string(&mut self, field: &str) -> Option<&'a str> {
        match self.get(field) {
            None => {
                self.fail(field, "required", format!("{field} is required"), None);
                None
            }
            Some(Value::String(text)) => Some(text),
            Some(other) => {
                self.wrong_type(field, "string", other);
                None
            }
        }
    }

    pub(super) fn job_id(&mut self) -> Option<String> {
        let job_id = self.required_string("job_id")?;
        if job_id.is_empty() {
            self.fail(
                "job_id",
                "non_empty",
                "job_id must not be empty".into(),
                None,
            );
            return None;
        }
        if job_id.len() > MAX_JOB_ID_BYTES {
            let message = format!(
                "job_id is {} bytes, at most {MAX_JOB_ID_BYTES}",
                job_id.len()
            );
            self.fail("job_id", "max_length(256)", message, None);
            return None;
        }
        Some(job_id.to_owned())
    }

    /// The prompt: any non-empty text; its length is bounded in tokens by the context, once
    /// tokenized (`submit`), and in bytes by the body limit (`routes::body_limit`).
    pub(super) fn prompt(&mut self) -> Option<String> {
        let prompt = self.required_string("prompt")?;
        if prompt.is_empty() {
            self.fail("prompt", "non_empty", "prompt is empty".to_owned(), None);
            return None;
        }
        Some(prompt.to_owned())
    }

    /// A non-negative integer in `min..=max`; `None` when absent or invalid.
    pub(super) fn integer(
        &mut self,
        field: &str,
        min: u64,
        max: u64,
        constraint: &str,
    ) -> Option<u64> {
        let value = self.get(field)?;
        let number = match value {
            Value::Number(number) if number.is_u64() || number.is_i64() => number.as_u64(),
            other => {
                self.wrong_type(field, "integer", other);
                return None;
            }
        };
        match number {
            Some(n) if (min..=max).contains(&n) => Some(n),
            _ => {
                let message = format!("must be between {min} and {max}");
                self.fail(field, constraint, message, Some(value));
                None
            }
        }
    }

    /// A token budget in `field`: an integer of at least 1, however large, capped by
    /// `--max-tokens-out` (a budget the context has no room for is refused at submission, where
    /// the prompt's length is known); `None` when absent or invalid.
    pub(super) fn max_tokens(&mut self, field: &str, limits: Limits) -> Option<u32> {
        let constraint = "range(1..=4294967295)";
        let wanted = self.integer(field, 1, u64::from(u32::MAX), constraint)?;
        let capped = wanted.min(u64::from(limits.max_tokens_out));
        Some(u32::try_from(capped).unwrap_or(limits.max_tokens_out))
    }

    /// A number accepted by `valid`, or `default` when absent (and after an error).
    pub(super) fn float(&mut self, field: &str, default: f32, valid: impl Fn(f64) -> bool) -> f32 {
        let Some(value) = self.get(field) else {
            return default;
        };
        let Some(number) = value.as_f64() else {
            self.wrong_type(field, "number", value);
            return default;
        };
        if valid(number) {
            return number as f32;
        }
        let (constraint, message) = match field {
            "temperature" => ("range(0.0..=2.0)", "must be between 0.0 and 2.0"),
            "repetition_penalty" => (
                "range(0.0..=2.0)",
                "must be greater than 0.0 and at most 2.0 (1.0 = off)",
            ),
            "frequency_penalty" | "presence_penalty" => (
                "range(-2.0..=2.0)",
                "must be between -2.0 and 2.0 (0.0 = off)",
            ),
            _ => ("range(0.0..=1.0)", "must be between 0.0 and 1.0"),
        };
        self.fail(field, constraint, message.into(), Some(value));
        default
    }

    pub(super) fn top_k(&mut self) -> u32 {
        let Some(value) = self.get("top_k") else {
            return 0;
        };
        match value.as_u64() {
            // Any k at or above the vocabulary size means "off"; saturate rather than refuse.
            Some(k) => u32::try_from(k).unwrap_or(u32::MAX),
            None => {
                self.wrong_type("top_k", "integer", value);
                0
            }
        }
    }

    pub(super) fn seed(&mut self) -> Option<u64> {
        let value = self.get("seed")?;
        let seed = value.as_u64();
        if seed.is_none() {
            self.wrong_type("seed", "u64", value);
        }
        seed
    }

    /// An optional boolean field, false when absent.
    pub(super) fn boolean(&mut self, field: &str) -> bool {
        self.boolean_or(field, false)
    }

    /// Boolean `field`, `default` when absent; records the error if it is not a boolean.
    pub(super) fn boolean_or(&mut self, field: &str, default: bool) -> bool {
        match self.get(field) {
            None => default,
            Some(Value::Bool(value)) => *value,
            Some(other) => {
                self.wrong_type(field, "boolean", other);
                default
            }
        }
    }

    /// Whether `field`'s `count` entries (`what`) are at most `max`; records the error if not.
    pub(super) fn within_count(
        &mut self,
        field: &str,
        count: usize,
        max: usize,
        what: &str,
    ) -> bool {
        if count <= max {
            return true;
        }
        let message = format!("{count} {what}, at most {max}");
        self.fail(field, &format!("max_count({max})"), message, None);
        false
    }

    /// Stop strings in the field `name` (`stop`, Anthropic's `stop_sequences`): an array of at most
    /// [`MAX_STOPS`] non-empty strings; with `lone_string`, a single string is accepted too
    /// (OpenAI's form).
    pub(super) fn stop(&mut self, name: &str, lone_string: bool) -> Vec<String> {
        let Some(value) = self.get(name) else {
            return Vec::new();
        };
        let items = match value {
            Value::Array(items) => items.as_slice(),
            Value::String(_) if lone_string => std::slice::from_ref(value),
            _ => {
                self.wrong_type(name, "array", value);
                return Vec::new();
            }
        };
        if !self.within_count(name, items.len(), MAX_STOPS, "stop strings") {
            return Vec::new();
        }
        let mut stops = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let field = match value {
                Value::Array(_) => format!("{name}[{i}]"),
                _ => name.to_owned(),
            };
            match item {
                Value::String(text) if text.is_empty() => {
                    self.fail(
                        &field,
                        "non_empty",
                        "stop strings must not be empty".into(),
                        None,
                    );
                }
                Value::String(text) if text.len() > MAX_STOP_BYTES => {
                    let message = format!("{} bytes, at most {MAX_STOP_BYTES}", text.len());
                    self.fail(&field, "max_length(100)", message, Some(item));
                }
                Value::String(text) => stops.push(text.clone()),
                other => self.wrong_type(&field, "string", other),
            }
        }
        stops
    }
}
