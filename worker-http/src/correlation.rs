//! `X-Correlation-Id`: taken from the request when it is a UUID, generated otherwise, echoed on
//! every response and handed to handlers as an extractor.

use std::convert::Infallible;

use axum::extract::{FromRequestParts, Request};
use axum::http::HeaderValue;
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::Response;

/// The header's name.
pub const CORRELATION_HEADER: &str = "x-correlation-id";

/// The request's correlation id.
#[derive(Debug, Clone)]
pub struct CorrelationId(pub String);

/// Middleware: settles the id before the handler runs and sets the response header after.
pub async fn correlate(mut request: Request, next: Next) -> Response {
    let id = request
        .headers()
        .get(CORRELATION_HEADER)
        .and_then(|value| value.to_str().ok())
        .and_then(|text| uuid::Uuid::parse_str(text.trim()).ok())
        .unwrap_or_else(uuid::Uuid::new_v4)
        .to_string();
    request.extensions_mut().insert(CorrelationId(id.clone()));
    let mut response = next.run(request).await;
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(CORRELATION_HEADER, value);
    }
    response
}

impl<S: Send + Sync> FromRequestParts<S> for CorrelationId {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(parts
            .extensions
            .get::<CorrelationId>()
            .cloned()
            .unwrap_or_else(|| CorrelationId(uuid::Uuid::new_v4().to_string())))
    }
}
