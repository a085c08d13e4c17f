use std::convert::Infallible;
use std::io::{Read, Write};
use std::net::TcpStream as StdStream;

use axum::Extension;
use axum::body::Body;
use axum::routing::get;

use super::*;

fn limits(max: usize) -> ConnectionLimits {
    ConnectionLimits::new(
        Some(max),
        Duration::from_millis(300),
        Duration::from_millis(400),
    )
}

fn places(max: usize) -> (Registry, Arc<ConnectionStats>) {
    let stats = Arc::new(ConnectionStats::default());
    (Registry::new(limits(max), stats.clone()), stats)
}

fn open(registry: &mut Registry, n: usize) -> Vec<Arc<Connection>> {
    (0..n).map(|_| registry.admit().unwrap()).collect()
}

/// Whether `connection` was told to close (its place given to another).
fn told_to_close(connection: &Connection) -> bool {
    use futures_util::FutureExt;
    connection.close.notified().now_or_never().is_some()
}

#[test]
fn silent_connections_give_their_places_to_new_ones_and_never_refuse_a_job() {
    // The case: a descriptor limit of 1,024 gives 960 places, 944 of them for jobs.
    let (mut registry, stats) = places(960);
    let silent = open(&mut registry, 960);
    let client = registry.admit().expect("a silent connection gives way");
    assert!(told_to_close(&silent[0]), "the oldest silent one");
    assert!(!told_to_close(&silent[1]));
    assert_eq!(registry.claim(client.id, false, false), Place::Job);
    let more = open(&mut registry, 2000);
    assert!(
        !told_to_close(&client),
        "a connection with a request keeps its place"
    );
    assert_eq!(registry.claim(more[1999].id, true, false), Place::Status);
    assert_eq!(stats.evicted.load(Ordering::Relaxed), 2001);
    assert_eq!(stats.open.load(Ordering::Relaxed), 960);
    assert_eq!(stats.refused.load(Ordering::Relaxed), 0);
}

#[test]
fn the_least_recently_active_unidentified_connection_goes_first() {
    let (mut registry, _stats) = places(8);
    let opened = open(&mut registry, 8);
    let place = registry.claim(opened[0].id, true, false);
    registry.release(opened[0].id, place);
    registry.admit().unwrap();
    registry.admit().unwrap();
    let closed: Vec<bool> = opened.iter().map(|c| told_to_close(c)).collect();
    assert_eq!(
        closed,
        [false, true, true, false, false, false, false, false],
        "the one that just had a request stays"
    );
}

#[test]
fn job_requests_never_take_the_reserve() {
    let (mut registry, stats) = places(8);
    assert_eq!(registry.limits().job_places(), 6);
    let opened = open(&mut registry, 8);
    for connection in &opened[..6] {
        assert_eq!(registry.claim(connection.id, false, false), Place::Job);
    }
    let refused = registry.claim(opened[6].id, false, false);
    assert_eq!(refused, Place::JobsFull { places: 6 });
    assert_eq!(stats.jobs_full.load(Ordering::Relaxed), 1);
    registry.release(opened[6].id, refused);
    assert_eq!(registry.claim(opened[6].id, true, false), Place::Status);
    let health = registry.admit().expect("the idle one gives way");
    assert!(told_to_close(&opened[7]));
    assert_eq!(registry.claim(health.id, true, false), Place::Status);
    assert!(registry.admit().is_none(), "every place holds a request");
    assert_eq!(stats.refused.load(Ordering::Relaxed), 1);
    registry.release(opened[6].id, Place::Status);
    assert!(
        registry.admit().is_some(),
        "a finished status request gives way"
    );
    registry.release(opened[0].id, Place::Job);
    registry.close(opened[1].id);
    let next = open(&mut registry, 2);
    assert_eq!(registry.claim(next[0].id, false, false), Place::Job);
    assert_eq!(registry.claim(next[1].id, false, false), Place::Job);
}

#[test]
fn a_job_request_whose_body_is_still_arriving_gives_its_place_to_a_complete_one() {
    let (mut registry, _stats) = places(8);
    let slow = open(&mut registry, 7);
    for connection in &slow[..6] {
        assert_eq!(registry.claim(connection.id, false, true), Place::Job);
    }
    assert_eq!(registry.claim(slow[6].id, false, false), Place::Job);
    assert!(told_to_close(&slow[0]), "the least recent slow body");
    registry.received(slow[1].id);
    let next = registry.admit().unwrap();
    assert_eq!(registry.claim(next.id, false, false), Place::Job);
    assert!(!told_to_close(&slow[1]), "its body has arrived");
    assert!(told_to_close(&slow[2]));
    // The evicted requests end later; their places were given back already.
    registry.release(slow[0].id, Place::Job);
    registry.release(slow[2].id, Place::Job);
    for connection in &slow[3..6] {
        registry.received(connection.id);
    }
    let last = registry.admit().unwrap();
    assert_eq!(
        registry.claim(last.id, false, false),
        Place::JobsFull { places: 6 }
    );
}

#[test]
fn a_lowered_descriptor_limit_sheds_connections_without_a_request() {
    let (mut registry, stats) = places(960);
    let opened = open(&mut registry, 300);
    for connection in &opened[290..] {
        registry.claim(connection.id, false, false);
    }
    assert_eq!(registry.shed_for_descriptors(Some(256)), (true, 109));
    assert_eq!(registry.limits().max, 192);
    assert_eq!(stats.limit.load(Ordering::Relaxed), 192);
    assert_eq!(stats.open.load(Ordering::Relaxed), 191);
    assert!(opened[290..].iter().all(|c| !told_to_close(c)));
    assert_eq!(registry.shed_for_descriptors(Some(20_000)), (false, 1));
    assert_eq!(registry.shed_for_descriptors(None), (false, 1));
    assert_eq!(registry.limits().max, 192, "never raised");

    let (mut full, _stats) = places(8);
    for connection in open(&mut full, 8) {
        full.claim(connection.id, true, false);
    }
    assert_eq!(full.shed_for_descriptors(None), (false, 0));
}

#[test]
fn accept_pauses_double_to_a_bound_and_start_over_after_a_success() {
    let mut backoff = Backoff::default();
    assert!(backoff.calm());
    let pauses: Vec<u128> = (0..9).map(|_| backoff.pause().as_millis()).collect();
    assert_eq!(pauses, [1, 2, 4, 8, 16, 32, 64, 100, 100]);
    assert!(!backoff.calm());
    backoff.reset();
    assert_eq!(backoff.pause(), FIRST_ACCEPT_PAUSE);
}

/// Serves a router with a quick route, an endless stream, a status route with a 1 MiB answer and
/// an echo of the body's length (and of the place its request held) on a free port.
async fn start(limits: ConnectionLimits) -> (std::net::SocketAddr, Arc<ConnectionStats>) {
    let endless = || async {
        let chunks = futures_util::stream::repeat_with(|| {
            Ok::<_, Infallible>(bytes::Bytes::from(vec![b'x'; 64 * 1024]))
        });
        Body::from_stream(chunks)
    };
    let echo =
        |Extension(place): Extension<Place>,
         body: Result<bytes::Bytes, axum::extract::rejection::BytesRejection>| async move {
            match body {
                Ok(bytes) => (
                    axum::http::StatusCode::OK,
                    format!("{place:?}: {} bytes", bytes.len()),
                ),
                Err(rejection) => (rejection.status(), rejection.body_text()),
            }
        };
    let app = Router::new()
        .route("/quick", get(|| async { "ok" }))
        .route("/health", get(|| async { vec![b'h'; 1 << 20] }))
        .route("/endless", get(endless))
        .route("/echo", axum::routing::post(echo));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let stats = Arc::new(ConnectionStats::default());
    let served = serve(listener, app, limits, stats.clone(), std::future::pending());
    tokio::spawn(served);
    (address, stats)
}

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
        let whole = post_echo(address, "hello");
        assert!(whole.ends_with("Job: 5 bytes"), "{whole}");
        let withheld = post_echo(address, "he");
        assert!(withheld.starts_with("HTTP/1.1 400"), "{withheld}");
        assert!(withheld.contains("did not arrive within"), "{withheld}");
    })
    .await;
    result.unwrap();
}

/// The head of a POST to `/echo` with a 5-byte body.
const ECHO_HEAD: &str =
    "POST /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 5\r\n\r\n";

/// POSTs `body` (5 bytes announced) to `/echo` on a new connection: the answer, read for at
/// most 10 s.
fn post_echo(address: std::net::SocketAddr, body: &str) -> String {
    let mut stream = StdStream::connect(address).unwrap();
    stream.write_all(ECHO_HEAD.as_bytes()).unwrap();
    stream.write_all(body.as_bytes()).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_that_never_arrive_give_their_places_to_a_whole_request() {
    // Bodies may take 30 s: were the slow ones to keep their places, the whole request would
    // be refused (and its read time out after 10 s).
    let thirty = Duration::from_secs(30);
    let (address, stats) = start(ConnectionLimits::new(Some(8), thirty, thirty)).await;
    let result = tokio::task::spawn_blocking(move || {
        let slow: Vec<StdStream> = (0..12)
            .map(|_| {
                let mut stream = StdStream::connect(address).unwrap();
                stream.write_all(ECHO_HEAD.as_bytes()).unwrap();
                stream
            })
            .collect();
        // Let the worker read their heads first.
        std::thread::sleep(Duration::from_millis(200));
        let whole = post_echo(address, "hello");
        assert!(whole.ends_with("Job: 5 bytes"), "{whole}");
        drop(slow);
    })
    .await;
    result.unwrap();
    assert!(stats.evicted.load(Ordering::Relaxed) >= 5);
    assert_eq!(stats.refused.load(Ordering::Relaxed), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_requests_whose_clients_stopped_reading_give_way() {
    // A status answer is one frame: its request ends when hyper takes it, sent or not, and its
    // connection gives way like an idle one. Were it held until sent, the unread ones would keep
    // every place for the 30 s stall timeout and the new request would be refused.
    let thirty = Duration::from_secs(30);
    let (address, stats) = start(ConnectionLimits::new(Some(8), thirty, thirty)).await;
    let result = tokio::task::spawn_blocking(move || {
        let unread: Vec<StdStream> = (0..8)
            .map(|_| {
                // A small window, so that the answer cannot fit in the buffers.
                let socket =
                    socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
                        .unwrap();
                socket.set_recv_buffer_size(4096).unwrap();
                socket.connect(&address.into()).unwrap();
                let mut stream = StdStream::from(socket);
                stream
                    .write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                    .unwrap();
                stream
            })
            .collect();
        // Let the worker fill their buffers.
        std::thread::sleep(Duration::from_millis(300));
        assert!(get_once(address, "/quick").ends_with("ok"));
        drop(unread);
    })
    .await;
    result.unwrap();
    assert!(stats.evicted.load(Ordering::Relaxed) >= 1);
    assert_eq!(stats.refused.load(Ordering::Relaxed), 0);
}
