//! Who may use the routes, checked once before any handler: a job request that found every job
//! place held is answered 503, the `Host` header must name the worker when it listens on loopback
//! (against DNS rebinding), every route but `/health` and `/metrics` needs the API key when one is
//! set, and every POST must be JSON (so browsers cannot send one cross-origin without a preflight).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::api::{ApiError, ErrorCode, FieldError, require_json};
use crate::connections::Place;
use crate::correlation::CorrelationId;
use crate::flags::ApiKey;
use crate::state::Shared;

/// Who may use the routes, fixed at start-up.
#[derive(Debug, Clone, Default)]
pub struct Access {
    /// The key every route but `/health` and `/metrics` requires (as a bearer token or in
    /// `x-api-key`).
    pub api_key: Option<ApiKey>,
    /// The `Host` names accepted (without port), when the worker listens on loopback; `None`
    /// accepts any.
    pub allowed_hosts: Option<Vec<String>>,
}

impl Access {
    /// The access rules for a worker bound to `bound`, advertised as `advertise_host`.
    pub fn new(
        api_key: Option<ApiKey>,
        bound: std::net::IpAddr,
        advertise_host: Option<&str>,
    ) -> Self {
        let allowed_hosts = bound.is_loopback().then(|| {
            let mut hosts = vec!["localhost".to_owned(), bound.to_string()];
            hosts.extend(["127.0.0.1", "::1"].map(str::to_owned));
            hosts.extend(advertise_host.map(str::to_ascii_lowercase));
            hosts
        });
        Self {
            api_key,
            allowed_hosts,
        }
    }
}

/// Routes anyone who can reach the port may read; they never hold a job place (the connection
/// limit's reserve is theirs).
pub fn is_status_route(path: &str) -> bool {
    matches!(path, "/health" | "/metrics")
}

/// The middleware.
pub async fn guard(
    State(shared): State<Arc<Shared>>,
    CorrelationId(correlation_id): CorrelationId,
    request: Request,
    next: Next,
) -> Response {
    match admit(&shared, &request) {
        Ok(()) => next.run(request).await,
        Err(refusal) => refusal.into_error(&correlation_id).into_response(),
    }
}

/// Why a request was refused before its handler.
#[derive(Debug, PartialEq)]
enum Refusal {
    JobsFull(usize),
    Host(String),
    Unauthorized(&'static str),
    NotJson(Vec<FieldError>),
}

impl Refusal {
    fn into_error(self, correlation_id: &str) -> ApiError {
        match self {
            Refusal::JobsFull(places) => ApiError::new(
                ErrorCode::WorkerBusy,
                format!(
                    "all {places} connections for job routes have a request in flight (the rest \
                     are kept for /health and /metrics); retry later"
                ),
                correlation_id,
            ),
            Refusal::Host(host) => {
                let error = FieldError {
                    field: "Host".into(),
                    constraint: "names_this_worker".into(),
                    message: format!(
                        "the worker listens on loopback and does not answer to the host {host:?}"
                    ),
                    value: None,
                };
                ApiError::invalid(vec![error], correlation_id)
                    .with_status(axum::http::StatusCode::MISDIRECTED_REQUEST)
            }
            Refusal::Unauthorized(why) => {
                ApiError::new(ErrorCode::Unauthorized, why, correlation_id)
            }
            Refusal::NotJson(errors) => ApiError::invalid(errors, correlation_id),
        }
    }
}

fn admit(shared: &Shared, request: &Request) -> Result<(), Refusal> {
    let status_route = is_status_route(request.uri().path());
    if let Some(&Place::JobsFull { places }) = request.extensions().get::<Place>() {
        return Err(Refusal::JobsFull(places));
    }
    let access = &shared.settings.access;
    if let Some(allowed) = &access.allowed_hosts {
        check_host(request.headers(), allowed)?;
    }
    if let Some(key) = &access.api_key
        && !status_route
    {
        check_key(request.headers(), key)?;
    }
    if request.method() == Method::POST {
        let content_type = super::content_type(request.headers());
        require_json(content_type).map_err(Refusal::NotJson)?;
    }
    Ok(())
}

/// A missing `Host` (HTTP/1.0 tools) passes: browsers always send one.
fn check_host(headers: &HeaderMap, allowed: &[String]) -> Result<(), Refusal> {
    let Some(value) = headers.get(header::HOST) else {
        return Ok(());
    };
    let host = String::from_utf8_lossy(value.as_bytes()).to_ascii_lowercase();
    let name = host_name(&host);
    if allowed.iter().any(|allowed| allowed == name) {
        Ok(())
    } else {
        Err(Refusal::Host(host))
    }
}

/// `name[:port]` or `[v6][:port]` → the name or the bare v6 address.
fn host_name(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    host.rsplit_once(':').map_or(host, |(name, _port)| name)
}

/// The key's header Anthropic's clients send (OpenAI's and the contract's send
/// `Authorization: Bearer`).
const X_API_KEY: &str = "x-api-key";

/// The key as `Authorization: Bearer <key>` or `x-api-key: <key>`: at least one of them, each
/// at most once, and every one given holds the key.
fn check_key(headers: &HeaderMap, key: &ApiKey) -> Result<(), Refusal> {
    let bearer: Vec<&[u8]> = headers
        .get_all(header::AUTHORIZATION)
        .iter()
        .map(|value| value.as_bytes())
        .collect();
    let api_key: Vec<&[u8]> = headers
        .get_all(X_API_KEY)
        .iter()
        .map(|value| value.as_bytes())
        .collect();
    if bearer.len() > 1 || api_key.len() > 1 || bearer.len() + api_key.len() == 0 {
        return Err(Refusal::Unauthorized(
            "this worker requires its key as `Authorization: Bearer <key>` or `x-api-key: <key>` (each header once)",
        ));
    }
    let bearer_ok = bearer.iter().all(|bytes| {
        let scheme_ok = bytes.len() > 7 && bytes[..7].eq_ignore_ascii_case(b"bearer ");
        scheme_ok && constant_time_eq(&bytes[7..], key.as_bytes())
    });
    let api_key_ok = api_key
        .iter()
        .all(|bytes| constant_time_eq(bytes, key.as_bytes()));
    if bearer_ok && api_key_ok {
        Ok(())
    } else {
        Err(Refusal::Unauthorized(
            "the key is wrong; send the worker's key as `Authorization: Bearer <key>` or `x-api-key: <key>`",
        ))
    }
}

/// Compares without an early exit, so the time taken does not tell how much of a guess was right.
fn constant_time_eq(given: &[u8], key: &[u8]) -> bool {
    let mut difference = u8::from(given.len() != key.len());
    for (i, &k) in key.iter().enumerate() {
        difference |= k ^ given.get(i).copied().unwrap_or(!k);
    }
    std::hint::black_box(difference) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_compare_whole() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abd", b"abc"));
        assert!(!constant_time_eq(b"ab", b"abc"));
        assert!(!constant_time_eq(b"abcd", b"abc"));
        assert!(!constant_time_eq(b"", b"abc"));
    }

    #[test]
    fn host_names_lose_their_port() {
        assert_eq!(host_name("localhost:8080"), "localhost");
        assert_eq!(host_name("127.0.0.1"), "127.0.0.1");
        assert_eq!(host_name("[::1]:80"), "::1");
        assert_eq!(host_name("evil.example"), "evil.example");
    }

    #[test]
    fn loopback_workers_accept_their_own_names_only() {
        let loopback = Access::new(None, [127, 0, 0, 1].into(), Some("Worker-7"));
        let allowed = loopback.allowed_hosts.unwrap();
        let mut headers = HeaderMap::new();
        for host in ["127.0.0.1:9", "localhost", "[::1]:9", "worker-7:9"] {
            headers.insert(header::HOST, host.parse().unwrap());
            assert_eq!(check_host(&headers, &allowed), Ok(()), "{host}");
        }
        headers.insert(header::HOST, "attacker.example:9".parse().unwrap());
        assert!(check_host(&headers, &allowed).is_err());
        assert!(
            Access::new(None, [0, 0, 0, 0].into(), None)
                .allowed_hosts
                .is_none()
        );
    }

    #[test]
    fn bearer_keys_are_required_exactly() {
        let key: ApiKey = "k3y".parse().unwrap();
        let with = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::AUTHORIZATION, value.parse().unwrap());
            check_key(&headers, &key)
        };
        assert_eq!(with("Bearer k3y"), Ok(()));
        assert_eq!(with("bearer k3y"), Ok(()));
        for wrong in [
            "Bearer k3",
            "Bearer k3y ",
            "Basic k3y",
            "k3y",
            "Bearer  k3y",
        ] {
            assert!(with(wrong).is_err(), "{wrong}");
        }
        assert!(check_key(&HeaderMap::new(), &key).is_err());
    }

    #[test]
    fn anthropics_x_api_key_header_carries_the_key_too() {
        let key: ApiKey = "k3y".parse().unwrap();
        let with = |pairs: &[(&str, &str)]| {
            let mut headers = HeaderMap::new();
            for (name, value) in pairs {
                let name: axum::http::HeaderName = name.parse().unwrap();
                headers.append(name, value.parse().unwrap());
            }
            check_key(&headers, &key)
        };
        assert_eq!(with(&[("x-api-key", "k3y")]), Ok(()));
        let both = [("x-api-key", "k3y"), ("authorization", "Bearer k3y")];
        assert_eq!(with(&both), Ok(()));
        for wrong in [
            &[("x-api-key", "k3")][..],
            &[("x-api-key", "Bearer k3y")],
            &[("x-api-key", "k3y"), ("authorization", "Bearer nope")],
            &[("x-api-key", "k3y"), ("x-api-key", "k3y")],
        ] {
            assert!(with(wrong).is_err(), "{wrong:?}");
        }
    }

    #[tokio::test]
    async fn a_job_request_without_a_job_place_is_503_worker_busy() {
        use crate::routes::tests::{
            counting, error_of, events, execute_body, send_request, worker,
        };
        let shared = worker(counting(), 1);
        let request = |place| {
            let mut request = Request::post("/execute")
                .header("content-type", "application/json")
                .body(axum::body::Body::from(execute_body("a", 2).to_string()))
                .unwrap();
            request.extensions_mut().insert(place);
            request
        };
        let (status, body) = send_request(&shared, request(Place::JobsFull { places: 6 })).await;
        assert_eq!(status, axum::http::StatusCode::SERVICE_UNAVAILABLE);
        let error = error_of(&body);
        assert_eq!(error["code"], "WORKER_BUSY");
        assert!(
            error["message"]
                .as_str()
                .unwrap()
                .contains("all 6 connections"),
            "{body}"
        );
        let (status, body) = send_request(&shared, request(Place::Job)).await;
        assert_eq!(status, axum::http::StatusCode::OK);
        assert_eq!(events(&body).last().unwrap()["type"], "end");
    }
}
