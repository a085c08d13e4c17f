//! `POST /tokenize` and `POST /detokenize`, as llama-server serves them: the loaded model's
//! tokenizer, no job.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::HeaderMap;
use bytes::Bytes;
use serde_json::{Value, json};
use worker_common::tokenizer::Tokenizer;

use super::{body_or_error, content_type};
use crate::api::{ApiError, DetokenizeRequest, TokenizeRequest};
use crate::correlation::CorrelationId;
use crate::state::Shared;
use crate::submit::accepting;

/// `POST /tokenize`: `{"tokens": [id, …]}`, or with `with_pieces` `[{"id", "piece"}, …]`.
pub async fn tokenize(
    State(shared): State<Arc<Shared>>,
    CorrelationId(correlation_id): CorrelationId,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let body = body_or_error(&shared, body, &correlation_id)?;
    let request = TokenizeRequest::parse(content_type(&headers), &body)
        .map_err(|errors| ApiError::invalid(errors, &correlation_id))?;
    let loaded = accepting(&shared, &correlation_id)?;
    let tokenizer = &loaded.tokenizer;
    let ids = tokenizer
        .encode(&request.content, request.add_special, request.parse_special)
        .map_err(|err| {
            ApiError::invalid_field("content", "tokenizable", err.to_string(), &correlation_id)
        })?;
    let tokens: Vec<Value> = if request.with_pieces {
        ids.iter()
            .map(|&id| json!({"id": id, "piece": piece(tokenizer, id)}))
            .collect()
    } else {
        ids.into_iter().map(Value::from).collect()
    };
    Ok(Json(json!({"tokens": tokens})))
}

/// `POST /detokenize`: `{"content": text}`, special tokens omitted (llama-server's default).
pub async fn detokenize(
    State(shared): State<Arc<Shared>>,
    CorrelationId(correlation_id): CorrelationId,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let body = body_or_error(&shared, body, &correlation_id)?;
    let request = DetokenizeRequest::parse(content_type(&headers), &body)
        .map_err(|errors| ApiError::invalid(errors, &correlation_id))?;
    let loaded = accepting(&shared, &correlation_id)?;
    let vocab = loaded.vocab_size;
    if let Some(&id) = request.tokens.iter().find(|&&id| id as usize >= vocab) {
        let message = format!("token id {id} is outside the vocabulary of {vocab}");
        let constraint = format!("vocabulary({vocab})");
        return Err(ApiError::invalid_field(
            "tokens",
            &constraint,
            message,
            &correlation_id,
        ));
    }
    Ok(Json(
        json!({"content": loaded.tokenizer.decode(&request.tokens)}),
    ))
}

/// A token's piece as llama-server writes it: its text (a control token's own text, such as
/// `<|im_end|>`), or its bytes as numbers when they are not UTF-8 on their own (a byte token
/// in the middle of a character).
fn piece(tokenizer: &Tokenizer, id: u32) -> Value {
    let vocab = tokenizer.vocab();
    if vocab.is_special(id) {
        return json!(vocab.text(id).unwrap_or_default());
    }
    let bytes = tokenizer.token_bytes(id);
    match String::from_utf8(bytes) {
        Ok(text) => json!(text),
        Err(err) => json!(err.into_bytes()),
    }
}
