//! Access control on the real worker binary (`LLORCH_TEST_WORKER`, default `llorch-cpud`) on
//! SmolLM2: with `--api-key`, every kind of request without the right key gets 401 in the
//! contract's shape and reaches no handler, while `/health` and `/metrics` stay open.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use llorch_tests::http::{self, Response, request};
use llorch_tests::stream::job;
use llorch_tests::worker::{serial, smollm2};
use serde_json::json;

const KEY: &str = "s3cret-k3y";

/// One unauthenticated attempt: method, path, headers, body.
type Attempt = (
    &'static str,
    &'static str,
    Vec<(&'static str, String)>,
    Vec<u8>,
);

fn attempts() -> Vec<Attempt> {
    let body = job("sneak", "Hello", json!({"raw": true, "max_tokens": 4}))
        .to_string()
        .into_bytes();
    let json = || ("Content-Type", "application/json".to_owned());
    let auth = |value: &str| ("Authorization", value.to_owned());
    let execute =
        |headers: Vec<(&'static str, String)>| ("POST", "/execute", headers, body.clone());
    vec![
        execute(vec![json()]),
        execute(vec![json(), auth("Bearer wrong")]),
        execute(vec![json(), auth(&format!("Basic {KEY}"))]),
        execute(vec![json(), auth("Bearer")]),
        execute(vec![json(), auth(&format!("Bearer {}", &KEY[..4]))]),
        execute(vec![json(), auth(&format!("Bearer {KEY}x"))]),
        execute(vec![
            json(),
            auth(&format!("Bearer {}", KEY.to_uppercase())),
        ]),
        execute(vec![json(), auth(&format!("Token {KEY}"))]),
        execute(vec![json(), auth(KEY)]),
        execute(vec![
            json(),
            auth(&format!("Bearer {KEY}")),
            auth("Bearer wrong"),
        ]),
        // `x-api-key` is a way to send the key (Anthropic's clients use it): a wrong one is not.
        execute(vec![json(), ("X-API-Key", format!("{KEY}x"))]),
        execute(vec![json(), ("X-API-Key", format!("Bearer {KEY}"))]),
        (
            "POST",
            "/execute?api_key=s3cret-k3y",
            vec![json()],
            body.clone(),
        ),
        (
            "POST",
            "/execute",
            vec![("Content-Type", "text/plain".into())],
            body.clone(),
        ),
        ("POST", "/execute", vec![json()], b"{\"job_id\": ".to_vec()),
        (
            "POST",
            "/cancel",
            vec![json()],
            br#"{"job_id":"sneak"}"#.to_vec(),
        ),
        ("POST", "/cancel/sneak", vec![json()], Vec::new()),
        ("POST", "/shutdown", vec![json()], Vec::new()),
        (
            "POST",
            "/shutdown",
            vec![json(), auth("Bearer wrong")],
            Vec::new(),
        ),
        ("GET", "/execute", Vec::new(), Vec::new()),
        ("GET", "/v1/models", Vec::new(), Vec::new()),
        (
            "POST",
            "/v1/chat/completions",
            vec![json(), auth("Bearer wrong")],
            b"{}".to_vec(),
        ),
        ("OPTIONS", "/execute", Vec::new(), Vec::new()),
    ]
}

fn send(addr: std::net::SocketAddr, (method, path, headers, body): &Attempt) -> Response {
    let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
    request(addr, method, path, &headers, body).unwrap()
}

#[test]
fn without_the_key_nothing_but_health_and_metrics_answers() {
    let _serial = serial();
    let worker = smollm2(&["--api-key", KEY]);
    let attempts = attempts();
    assert!(attempts.len() >= 20);
    for attempt in &attempts {
        let response = send(worker.addr, attempt);
        let (method, path, headers, _) = attempt;
        let what = format!("{method} {path} {headers:?}");
        assert_eq!(response.status, 401, "{what}: {}", response.text());
        // `/v1/…` answers in OpenAI's shape, with the contract's code in lower case.
        let code = match path.starts_with("/v1/") {
            true => "unauthorized",
            false => "UNAUTHORIZED",
        };
        assert_eq!(response.json()["error"]["code"], code, "{what}");
        assert_eq!(
            response.header("www-authenticate"),
            Some("Bearer"),
            "{what}"
        );
    }
    assert_eq!(http::get(worker.addr, "/health").unwrap().status, 200);
    assert_eq!(http::get(worker.addr, "/metrics").unwrap().status, 200);
    let handled = worker.logs().into_iter().find(|line| {
        ["cancel", "shutdown", "execute_start", "job_start"]
            .contains(&line["event"].as_str().unwrap_or(""))
    });
    assert!(
        handled.is_none(),
        "a refused request reached a handler: {handled:?}"
    );
    assert!(
        worker.log_lines().iter().all(|line| !line.contains(KEY)),
        "the key was logged"
    );

    // With the key, as a bearer token or in `x-api-key`, the same worker serves.
    let bearer = format!("Bearer {KEY}");
    for (i, key_header) in [("Authorization", bearer.as_str()), ("x-api-key", KEY)]
        .into_iter()
        .enumerate()
    {
        let keyed = [("Content-Type", "application/json"), key_header];
        let body = job(
            &format!("allowed-{i}"),
            "Hello",
            json!({"raw": true, "max_tokens": 2}),
        );
        let response = request(
            worker.addr,
            "POST",
            "/execute",
            &keyed,
            body.to_string().as_bytes(),
        )
        .unwrap();
        assert_eq!(response.status, 200, "{key_header:?}: {}", response.text());
        assert!(
            response.text().contains("event: end"),
            "{}",
            response.text()
        );
    }
}
