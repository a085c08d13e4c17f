//! The ready callback to the pool manager: one POST after the model is loaded and the listener
//! is bound, retried on connection errors and 5xx, fatal on 4xx or once the retries are spent.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, StatusCode, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// Retries after the first attempt.
pub const RETRIES: u32 = 3;
/// Delay before the first retry; doubled for each next one.
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// Time one attempt may take.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the callback failed (the worker exits 1).
#[derive(Debug, thiserror::Error)]
pub enum CallbackError {
    /// The URL is not a plain `http://` URL.
    #[error("callback URL {url:?} is not usable: {reason}")]
    BadUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The pool manager answered 4xx: the payload was refused.
    #[error("the pool manager refused the callback with {status}")]
    Refused {
        /// The status it answered.
        status: StatusCode,
    },
    /// Every attempt failed to connect, timed out or got a 5xx.
    #[error("the callback failed {attempts} times; last: {last}")]
    Exhausted {
        /// Attempts made.
        attempts: u32,
        /// The last failure.
        last: String,
    },
}

/// POSTs `payload` to `url`, calling `on_attempt` with each attempt's outcome for logging.
pub async fn send(
    url: &str,
    payload: &serde_json::Value,
    mut on_attempt: impl FnMut(u32, &str),
) -> Result<(), CallbackError> {
    let uri: Uri =
        url.parse()
            .map_err(|err: hyper::http::uri::InvalidUri| CallbackError::BadUrl {
                url: url.into(),
                reason: err.to_string(),
            })?;
    if uri.scheme_str() != Some("http") {
        return Err(CallbackError::BadUrl {
            url: url.into(),
            reason: "only http:// URLs are supported (terminate TLS in front of the pool manager)"
                .into(),
        });
    }
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let body = Bytes::from(payload.to_string());
    let mut backoff = FIRST_BACKOFF;
    let mut last = String::new();
    for attempt in 1..=RETRIES + 1 {
        let request = Request::post(uri.clone())
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(body.clone()))
            .map_err(|err| CallbackError::BadUrl {
                url: url.into(),
                reason: err.to_string(),
            })?;
        match tokio::time::timeout(ATTEMPT_TIMEOUT, client.request(request)).await {
            Ok(Ok(response)) if response.status().is_success() => {
                on_attempt(attempt, "accepted");
                return Ok(());
            }
            Ok(Ok(response)) if response.status().is_client_error() => {
                on_attempt(attempt, "refused");
                return Err(CallbackError::Refused {
                    status: response.status(),
                });
            }
            Ok(Ok(response)) => last = format!("status {}", response.status()),
            Ok(Err(err)) => last = format!("{err}: {}", source_chain(&err)),
            Err(_) => last = format!("no answer within {ATTEMPT_TIMEOUT:?}"),
        }
        on_attempt(attempt, &last);
        if attempt <= RETRIES {
            tokio::time::sleep(backoff).await;
            backoff *= 2;
        }
    }
    Err(CallbackError::Exhausted {
        attempts: RETRIES + 1,
        last,
    })
}

fn source_chain(err: &dyn std::error::Error) -> String {
    let mut causes = Vec::new();
    let mut source = err.source();
    while let Some(cause) = source {
        causes.push(cause.to_string());
        source = cause.source();
    }
    causes.join(": ")
}
