//! `/execute` and `/cancel` request bodies: parsed field by field so every violation is reported
//! with its field and constraint token, never with serde's or axum's own wording.

use serde_json::{Map, Value};

use super::FieldError;

/// Largest prompt, in characters.
pub const MAX_PROMPT_CHARS: usize = 32768;
/// Largest `max_tokens` a request may name.
pub const MAX_TOKENS_LIMIT: u64 = 2048;
/// Most stop strings.
pub const MAX_STOPS: usize = 4;
/// Longest stop string, in bytes.
pub const MAX_STOP_BYTES: usize = 100;
/// Longest job id, in bytes.
pub const MAX_JOB_ID_BYTES: usize = 256;

/// Worker-side limits that shape a request.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// `--max-tokens-out`: the cap on `max_tokens`, and its default.
    pub max_tokens_out: u32,
}

/// A validated `/execute` request (context length is checked after tokenizing).
#[derive(Debug, Clone, PartialEq)]
pub struct ExecuteRequest {
    /// The caller's job id.
    pub job_id: String,
    /// The prompt text.
    pub prompt: String,
    /// Tokens to generate at most, already capped by `--max-tokens-out`.
    pub max_tokens: u32,
    /// Sampling temperature (0 = greedy).
    pub temperature: f32,
    /// Top-k (0 = off).
    pub top_k: u32,
    /// Top-p (1 = off).
    pub top_p: f32,
    /// Min-p (0 = off).
    pub min_p: f32,
    /// Repetition penalty (1 = off).
    pub repetition_penalty: f32,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Sampler seed, when the caller chose one.
    pub seed: Option<u64>,
    /// Tokenize the prompt as is, without the chat template.
    pub raw: bool,
    /// An end-of-generation token does not end the job (benchmarks; llama-server's field).
    pub ignore_eos: bool,
}

impl ExecuteRequest {
    /// Parses and validates a body sent with `content_type`.
    pub fn parse(
        content_type: Option<&str>,
        body: &[u8],
        limits: Limits,
    ) -> Result<Self, Vec<FieldError>> {
        let object = json_object(content_type, body)?;
        let mut fields = Fields::new(&object);
        let job_id = fields.job_id();
        let prompt = fields.prompt();
        let max_tokens = fields.integer("max_tokens", 1, MAX_TOKENS_LIMIT, "range(1..=2048)");
        let temperature = fields.float("temperature", 1.0, |t| (0.0..=2.0).contains(&t));
        let top_k = fields.top_k();
        let top_p = fields.float("top_p", 1.0, |p| (0.0..=1.0).contains(&p));
        let min_p = fields.float("min_p", 0.0, |p| (0.0..=1.0).contains(&p));
        let repetition_penalty = fields.float("repetition_penalty", 1.0, |r| r > 0.0 && r <= 2.0);
        let stop = fields.stop();
        let seed = fields.seed();
        let raw = fields.boolean("raw");
        let ignore_eos = fields.boolean("ignore_eos");
        if !fields.errors.is_empty() {
            return Err(fields.errors);
        }
        let default_max = MAX_TOKENS_LIMIT.min(u64::from(limits.max_tokens_out));
        let max_tokens = max_tokens.unwrap_or(default_max).min(default_max);
        Ok(Self {
            job_id: job_id.unwrap_or_default(),
            prompt: prompt.unwrap_or_default(),
            max_tokens: u32::try_from(max_tokens).unwrap_or(limits.max_tokens_out),
            temperature,
            top_k,
            top_p,
            min_p,
            repetition_penalty,
            stop,
            seed,
            raw,
            ignore_eos,
        })
    }
}

/// A `/cancel` body: `{"job_id": …}`.
#[derive(Debug, Clone, PartialEq)]
pub struct CancelRequest {
    /// The job to cancel.
    pub job_id: String,
}

impl CancelRequest {
    /// Parses and validates a body sent with `content_type`.
    pub fn parse(content_type: Option<&str>, body: &[u8]) -> Result<Self, Vec<FieldError>> {
        let object = json_object(content_type, body)?;
        let mut fields = Fields::new(&object);
        match fields.job_id() {
            Some(job_id) if fields.errors.is_empty() => Ok(Self { job_id }),
            _ => Err(fields.errors),
        }
    }
}

fn body_error(constraint: &str, message: String) -> Vec<FieldError> {
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
fn json_object(
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

fn type_name(value: &Value) -> &'static str {
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
struct Fields<'a> {
    object: &'a Map<String, Value>,
    errors: Vec<FieldError>,
}

impl<'a> Fields<'a> {
    fn new(object: &'a Map<String, Value>) -> Self {
        Self {
            object,
            errors: Vec::new(),
        }
    }

    fn fail(&mut self, field: &str, constraint: &str, message: String, value: Option<&Value>) {
        self.errors.push(FieldError {
            field: field.into(),
            constraint: constraint.into(),
            message,
            value: value.cloned(),
        });
    }

    fn wrong_type(&mut self, field: &str, expected: &str, value: &Value) {
        let message = format!("must be {expected}, got {}", type_name(value));
        self.fail(field, &format!("type({expected})"), message, Some(value));
    }

    /// The value of an optional field; `null` counts as absent.
    fn get(&self, field: &str) -> Option<&'a Value> {
        self.object.get(field).filter(|value| !value.is_null())
    }

    fn required_string(&mut self, field: &str) -> Option<&'a str> {
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

    fn job_id(&mut self) -> Option<String> {
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

    fn prompt(&mut self) -> Option<String> {
        let prompt = self.required_string("prompt")?;
        let chars = prompt.chars().count();
        if !(1..=MAX_PROMPT_CHARS).contains(&chars) {
            let message = format!("prompt is {chars} characters, must be 1 to {MAX_PROMPT_CHARS}");
            self.fail("prompt", "length(1..=32768)", message, None);
            return None;
        }
        Some(prompt.to_owned())
    }

    /// A non-negative integer in `min..=max`; `None` when absent or invalid.
    fn integer(&mut self, field: &str, min: u64, max: u64, constraint: &str) -> Option<u64> {
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

    /// A number accepted by `valid`, or `default` when absent (and after an error).
    fn float(&mut self, field: &str, default: f32, valid: impl Fn(f64) -> bool) -> f32 {
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
            _ => ("range(0.0..=1.0)", "must be between 0.0 and 1.0"),
        };
        self.fail(field, constraint, message.into(), Some(value));
        default
    }

    fn top_k(&mut self) -> u32 {
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

    fn seed(&mut self) -> Option<u64> {
        let value = self.get("seed")?;
        let seed = value.as_u64();
        if seed.is_none() {
            self.wrong_type("seed", "u64", value);
        }
        seed
    }

    /// An optional boolean field, false when absent.
    fn boolean(&mut self, field: &str) -> bool {
        match self.get(field) {
            None => false,
            Some(Value::Bool(value)) => *value,
            Some(other) => {
                self.wrong_type(field, "boolean", other);
                false
            }
        }
    }

    fn stop(&mut self) -> Vec<String> {
        let Some(value) = self.get("stop") else {
            return Vec::new();
        };
        let Value::Array(items) = value else {
            self.wrong_type("stop", "array", value);
            return Vec::new();
        };
        if items.len() > MAX_STOPS {
            let message = format!("{} stop strings, at most {MAX_STOPS}", items.len());
            self.fail("stop", "max_count(4)", message, None);
            return Vec::new();
        }
        let mut stops = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let field = format!("stop[{i}]");
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

#[cfg(test)]
mod tests;
