//! Error codes and the one place they become HTTP responses.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::correlation::CORRELATION_HEADER;

/// The contract's stable error codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// The request failed validation (400; 413 for an oversized body).
    InvalidRequest,
    /// The model is still loading or failed to, or the worker failed and is exiting (503).
    WorkerNotReady,
    /// The job queue is full (503, retriable).
    WorkerBusy,
    /// The worker is shutting down (503, retriable elsewhere).
    WorkerDraining,
    /// An allocation for the job failed; the worker keeps serving (retriable).
    VramOom,
    /// The device failed.
    CudaError,
    /// The model computed non-finite logits for the job (broken weights; not retriable).
    ModelNumerics,
    /// The job ran past `--inference-timeout-sec` (retriable).
    InferenceTimeout,
    /// The job was cancelled (`/cancel`, disconnect, shutdown).
    Cancelled,
    /// The request lacks the worker's API key (401).
    Unauthorized,
    /// Anything else; a bug.
    Internal,
}

impl ErrorCode {
    /// The UPPER_SNAKE spelling on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidRequest => "INVALID_REQUEST",
            ErrorCode::WorkerNotReady => "WORKER_NOT_READY",
            ErrorCode::WorkerBusy => "WORKER_BUSY",
            ErrorCode::WorkerDraining => "WORKER_DRAINING",
            ErrorCode::VramOom => "VRAM_OOM",
            ErrorCode::CudaError => "CUDA_ERROR",
            ErrorCode::ModelNumerics => "MODEL_NUMERICS",
            ErrorCode::InferenceTimeout => "INFERENCE_TIMEOUT",
            ErrorCode::Cancelled => "CANCELLED",
            ErrorCode::Unauthorized => "UNAUTHORIZED",
            ErrorCode::Internal => "INTERNAL",
        }
    }

    /// Whether the same request may succeed if sent again (here later, or to another worker).
    pub fn retriable(self) -> bool {
        matches!(
            self,
            ErrorCode::WorkerNotReady
                | ErrorCode::WorkerBusy
                | ErrorCode::WorkerDraining
                | ErrorCode::VramOom
                | ErrorCode::InferenceTimeout
        )
    }

    /// The HTTP status of a response that fails with this code.
    pub fn status(self) -> StatusCode {
        match self {
            ErrorCode::InvalidRequest => StatusCode::BAD_REQUEST,
            ErrorCode::Unauthorized => StatusCode::UNAUTHORIZED,
            ErrorCode::WorkerNotReady | ErrorCode::WorkerBusy | ErrorCode::WorkerDraining => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            // Only a whole (non-streamed) OpenAI reply can end this way before its status is
            // sent: the job ran out of time, or was cancelled (nginx's "client closed request").
            ErrorCode::InferenceTimeout => StatusCode::GATEWAY_TIMEOUT,
            ErrorCode::Cancelled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// One violated rule of a request.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FieldError {
    /// The field (`prompt`, `stop[2]`, or `body` for the request as a whole).
    pub field: String,
    /// The rule, as a constraint token (`range(1..=2048)`, `required`, `type(string)`, …).
    pub constraint: String,
    /// What is wrong, for a person.
    pub message: String,
    /// The offending value, when short enough to echo.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<serde_json::Value>,
}

/// A prompt that leaves the context no room for the tokens the job may generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextOverflow {
    /// The prompt's tokens, after templating.
    pub prompt_tokens: usize,
    /// The tokens the job may generate (`max_tokens`, or its default).
    pub max_tokens: usize,
    /// The context length.
    pub context: usize,
}

impl ContextOverflow {
    /// The most prompt tokens the context has room for beside `max_tokens`.
    pub fn room(&self) -> usize {
        self.context.saturating_sub(self.max_tokens)
    }
}

/// A prompt over the context in OpenAI's wordings, naming the request's `budget` field: its
/// classic one ("This model's maximum context length is", which LiteLLM and most clients match
/// on) and its newer one ("Input tokens exceed the configured limit", which LangChain's
/// `langchain-openai` matches on: on `openai` 3's errors, whose text no longer carries the
/// body's `code`, the message is all it sees).
fn overflow_message(overflow: &ContextOverflow, budget: &str) -> String {
    let ContextOverflow {
        prompt_tokens,
        max_tokens,
        context,
    } = *overflow;
    format!(
        "This model's maximum context length is {context} tokens. However, you requested {} tokens ({prompt_tokens} in the prompt, {max_tokens} for the completion): the prompt has room for {room}. Input tokens exceed the configured limit of {room} tokens. Please shorten the prompt or lower {budget}.",
        prompt_tokens + max_tokens,
        room = overflow.room()
    )
}

/// A non-stream error response: `{"errors":[…], "error":{code, message, correlation_id}}`.
#[derive(Debug)]
pub struct ApiError {
    code: ErrorCode,
    status: StatusCode,
    message: String,
    errors: Vec<FieldError>,
    correlation_id: String,
    overflow: Option<ContextOverflow>,
}

impl ApiError {
    /// An error with its code's status.
    pub fn new(code: ErrorCode, message: impl Into<String>, correlation_id: &str) -> Self {
        Self {
            code,
            status: code.status(),
            message: message.into(),
            errors: Vec::new(),
            correlation_id: correlation_id.to_owned(),
            overflow: None,
        }
    }

    /// 400 `INVALID_REQUEST` for one field: `field` breaks `constraint`, as `message` says.
    pub fn invalid_field(
        field: &str,
        constraint: &str,
        message: String,
        correlation_id: &str,
    ) -> Self {
        let error = FieldError {
            field: field.into(),
            constraint: constraint.into(),
            message,
            value: None,
        };
        Self::invalid(vec![error], correlation_id)
    }

    /// A 400 listing every violated rule.
    pub fn invalid(errors: Vec<FieldError>, correlation_id: &str) -> Self {
        let message = match errors.as_slice() {
            [one] => format!("{}: {}", one.field, one.message),
            many => format!("{} fields are invalid", many.len()),
        };
        Self {
            errors,
            ..Self::new(ErrorCode::InvalidRequest, message, correlation_id)
        }
    }

    /// 400 for a prompt (in `field`) that does not fit the context with `max_tokens`:
    /// constraint `context_length(<room>)`, in OpenAI's wording ("maximum context length"),
    /// which clients match on; the numbers stay in the error for the other APIs' wordings.
    pub fn context_overflow(field: &str, overflow: ContextOverflow, correlation_id: &str) -> Self {
        let message = overflow_message(&overflow, "max_tokens");
        let constraint = format!("context_length({})", overflow.room());
        Self {
            overflow: Some(overflow),
            ..Self::invalid_field(field, &constraint, message, correlation_id)
        }
    }

    /// The same error for a request whose prompt came in `field` and its budget in `budget`
    /// (the Responses API's `input` and `max_output_tokens`): a submitted job's errors name a
    /// chat prompt's fields, `messages` and `max_tokens`.
    pub fn prompt_in(mut self, field: &str, budget: &str) -> Self {
        let mut renamed = false;
        for error in &mut self.errors {
            if error.field == "messages" {
                error.field = field.into();
                if let Some(overflow) = &self.overflow {
                    error.message = overflow_message(overflow, budget);
                }
                renamed = true;
            }
        }
        if let ([one], true) = (self.errors.as_slice(), renamed) {
            self.message = format!("{}: {}", one.field, one.message);
        }
        self
    }

    /// A body over the size limit (413, in the same shape).
    pub fn too_large(limit: usize, correlation_id: &str) -> Self {
        let error = FieldError {
            field: "body".into(),
            constraint: format!("max_bytes({limit})"),
            message: format!("request bodies are limited to {limit} bytes"),
            value: None,
        };
        Self {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            ..Self::invalid(vec![error], correlation_id)
        }
    }

    /// An unknown endpoint (404, code `INVALID_REQUEST`).
    pub fn not_found(message: String, correlation_id: &str) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            ..Self::new(ErrorCode::InvalidRequest, message, correlation_id)
        }
    }

    /// The same error with another HTTP status (405, 421, …), code unchanged.
    pub fn with_status(self, status: StatusCode) -> Self {
        Self { status, ..self }
    }

    /// The error code.
    pub fn code(&self) -> ErrorCode {
        self.code
    }
}

/// An error response's parts, kept in the response's extensions so that OpenAI's routes can
/// render the same error in OpenAI's shape ([`super::openai::reshape_error`]).
#[derive(Debug, Clone)]
pub struct ErrorParts {
    /// The contract's code.
    pub code: ErrorCode,
    /// What is wrong, for a person.
    pub message: String,
    /// The first violated field, if any.
    pub field: Option<String>,
    /// That field's constraint (`context_length(N)`, …), if any.
    pub constraint: Option<String>,
    /// The numbers of a prompt over the context ([`ApiError::context_overflow`]).
    pub overflow: Option<ContextOverflow>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let parts = ErrorParts {
            code: self.code,
            message: self.message.clone(),
            field: self.errors.first().map(|error| error.field.clone()),
            constraint: self.errors.first().map(|error| error.constraint.clone()),
            overflow: self.overflow,
        };
        let body = serde_json::json!({
            "errors": self.errors,
            "error": {
                "code": self.code.as_str(),
                "message": self.message,
                "correlation_id": self.correlation_id,
                "retriable": self.code.retriable(),
            },
        });
        let mut response = (self.status, axum::Json(body)).into_response();
        response.extensions_mut().insert(parts);
        if let Ok(value) = HeaderValue::from_str(&self.correlation_id) {
            response.headers_mut().insert(CORRELATION_HEADER, value);
        }
        if self.status == StatusCode::UNAUTHORIZED {
            let challenge = HeaderValue::from_static("Bearer");
            response
                .headers_mut()
                .insert(axum::http::header::WWW_AUTHENTICATE, challenge);
        }
        response
    }
}
