use std::io::{Read, Write};
use std::net::TcpStream as StdStream;

use axum::routing::get;

use super::*;

fn limits(max: usize) -> ConnectionLimits {
    ConnectionLimits::new(
        Some(max),
        Duration::from_millis(300),
        Duration::from_millis(400),
    )
}

#[test]
fn places_fill_general_then_reserve_then_evict_the_oldest_idle() {
    let (mut registry, stats, limits) =
        (Registry::default(), ConnectionStats::default(), limits(8));
    let opened: Vec<_> = (0..8)
        .map(|_| admit(&mut registry, &limits, &stats))
        .collect::<Option<_>>()
        .unwrap();
    let reserve: Vec<bool> = opened.iter().map(|c| c.reserve).collect();
    assert_eq!(
        reserve,
        [false, false, false, false, false, false, true, true]
    );
    opened[0].in_flight.store(1, Ordering::Release);
    let next = admit(&mut registry, &limits, &stats).unwrap();
    assert!(
        next.reserve,
        "a place freed at the limit is a reserve place"
    );
    assert!(
        registry.open.contains_key(&0),
        "a busy connection is never evicted"
    );
    assert!(!registry.open.contains_key(&1), "the oldest idle one is");
    assert_eq!(stats.evicted.load(Ordering::Relaxed), 1);
    for connection in registry.open.values() {
        connection.in_flight.store(1, Ordering::Release);
    }
    assert!(admit(&mut registry, &limits, &stats).is_none());
}

/// Serves a router with a quick route and an endless stream on a free port.
async fn start(limits: ConnectionLimits) -> (std::net::SocketAddr, Arc<ConnectionStats>) {
    let endless = || async {
        let chunks = futures_util::stream::repeat_with(|| {
            Ok::<_, Infallible>(bytes::Bytes::from(vec![b'x'; 64 * 1024]))
        });
        Body::from_stream(chunks)
    };
    let echo = |body: Result<bytes::Bytes, axum::extract::rejection::BytesRejection>| async move {
        match body {
            Ok(bytes) => (axum::http::StatusCode::OK, format!("{} bytes", bytes.len())),
            Err(rejection) => (rejection.status(), rejection.body_text()),
        }
    };
    let app = Router::new()
        .route("/quick", get(|| async { "ok" }))
        .route("/endless", get(endless))
        .route("/echo", axum::routing::post(echo));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let stats = Arc::new(ConnectionStats::default());
    let served = serve(listener, app, limits, stats.clone(), std::future::pending());
    tokio::spawn(served);
    (address, stats)
}

use std::convert::Infallible;

use axum::body::Body;

fn get_once(address: std::net::SocketAddr, path: &str) -> String {
    let mut stream = StdStream::connect(address).unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_close_and_a_full_house_still_answers() {
    let (address, stats) = start(limits(8)).await;
    let result = tokio::task::spawn_blocking(move || {
        let idle: Vec<_> = (0..20)
            .map(|_| StdStream::connect(address).unwrap())
            .collect();
        assert!(
            get_once(address, "/quick").ends_with("ok"),
            "evicts an idle one"
        );
        let mut first = idle.into_iter().next_back().unwrap();
        first
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut byte = [0u8; 1];
        assert_eq!(first.read(&mut byte).unwrap_or(0), 0, "closed when idle");
    })
    .await;
    result.unwrap();
    assert!(stats.evicted.load(Ordering::Relaxed) > 0 || stats.refused.load(Ordering::Relaxed) > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_dropped() {
    let (address, stats) = start(limits(8)).await;
    let mut stream = StdStream::connect(address).unwrap();
    let request = "GET /endless HTTP/1.1\r\nHost: x\r\n\r\n";
    stream.write_all(request.as_bytes()).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while stats.stalled.load(Ordering::Relaxed) == 0 {
        assert!(tokio::time::Instant::now() < deadline, "never dropped");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(stats.open.load(Ordering::Relaxed), 0);
    drop(stream);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_never_arrives_fails_the_request_and_a_prompt_one_does_not() {
    let (address, _stats) = start(limits(8)).await;
    let result = tokio::task::spawn_blocking(move || {
        let post = |body: &str| {
            let mut stream = StdStream::connect(address).unwrap();
            let head =
                "POST /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 5\r\n\r\n";
            stream.write_all(head.as_bytes()).unwrap();
            stream.write_all(body.as_bytes()).unwrap();
            stream
                .set_read_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            let mut answer = String::new();
            let _ = stream.read_to_string(&mut answer);
            answer
        };
        let whole = post("hello");
        assert!(whole.ends_with("5 bytes"), "{whole}");
        let withheld = post("he");
        assert!(withheld.starts_with("HTTP/1.1 400"), "{withheld}");
        assert!(withheld.contains("did not arrive within"), "{withheld}");
    })
    .await;
    result.unwrap();
}
