//! The listener's connections, served one by one so the worker keeps their limits: a deadline for
//! each request head (which also closes idle keep-alive connections), a connection limit whose
//! places are accounted by what each connection is doing (`places.rs`: connections without a
//! complete request give up their place first, job routes never hold the reserve kept for
//! `/health` and `/metrics`), accept errors that shed connections and back off, and a
//! write-stall timeout that drops clients that stopped reading (specs/HTTP.md, "Connections").

mod limits;
mod places;
mod service;
mod stall;

use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;

use crate::metrics::{counter, gauge};
pub use limits::ConnectionLimits;
pub use places::Place;
use places::Registry;
use service::ConnectionService;
use stall::{StallIo, WriteWatch};

/// The kernel send buffer of a connection. Token streams need a few KiB per second; bounding the
/// buffer (instead of letting the kernel grow it to MiBs) bounds the memory idle readers hold and
/// makes a client that stops reading show as a write stall after tens of KiB.
const SEND_BUFFER_BYTES: usize = 16 * 1024;

/// The first pause after an accept error: long enough for the connections shed to close.
const FIRST_ACCEPT_PAUSE: Duration = Duration::from_millis(1);
/// The longest pause between accepts while they keep failing.
const LONGEST_ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// One open connection, as the registry and the requests on it see it.
#[derive(Debug)]
pub struct Connection {
    id: u64,
    /// Set when the client stopped reading for the stall timeout.
    stalled: AtomicBool,
    /// Wakes the connection's task to drop it (its place was given to another).
    close: Notify,
}

impl Connection {
    fn new(id: u64) -> Self {
        Self {
            id,
            stalled: AtomicBool::new(false),
            close: Notify::new(),
        }
    }

    /// Whether this connection was dropped because its client stopped reading.
    pub fn stalled(&self) -> bool {
        self.stalled.load(Ordering::Acquire)
    }
}

/// Connection counters for `/metrics`.
#[derive(Debug, Default)]
pub struct ConnectionStats {
    open: AtomicUsize,
    /// The connection limit in force (lowered when the descriptor limit drops).
    limit: AtomicUsize,
    accepted: AtomicU64,
    refused: AtomicU64,
    evicted: AtomicU64,
    stalled: AtomicU64,
    /// Job requests answered 503 because every job place was held.
    jobs_full: AtomicU64,
    accept_errors: AtomicU64,
}

impl ConnectionStats {
    /// Appends the connection metrics in Prometheus text.
    pub fn render(&self, out: &mut String) {
        use std::fmt::Write;
        let load = |value: &AtomicU64| value.load(Ordering::Relaxed);
        let open = self.open.load(Ordering::Relaxed);
        gauge(
            out,
            "worker_http_connections",
            "Open HTTP connections.",
            open as f64,
        );
        let limit = self.limit.load(Ordering::Relaxed);
        gauge(
            out,
            "worker_http_connection_limit",
            "The connection limit in force (lowered when the descriptor limit drops).",
            limit as f64,
        );
        let _ = writeln!(
            out,
            "# HELP worker_http_connections_closed_total Connections the worker closed, by reason.\n# TYPE worker_http_connections_closed_total counter"
        );
        for (reason, count) in [
            ("limit", &self.refused),
            ("evicted_idle", &self.evicted),
            ("client_stalled", &self.stalled),
        ] {
            let n = load(count);
            let _ = writeln!(
                out,
                "worker_http_connections_closed_total{{reason=\"{reason}\"}} {n}"
            );
        }
        counter(
            out,
            "worker_http_connections_accepted_total",
            "Connections accepted.",
            load(&self.accepted),
        );
        counter(
            out,
            "worker_http_accept_errors_total",
            "Failed accepts (EMFILE and the like).",
            load(&self.accept_errors),
        );
        counter(
            out,
            "worker_http_job_places_full_total",
            "Job requests answered 503 because every job place held a request.",
            load(&self.jobs_full),
        );
    }
}

/// Serves `app` on `listener` until `shutdown` resolves, then lets open requests finish.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    stats: Arc<ConnectionStats>,
    shutdown: impl Future<Output = ()>,
) {
    let registry = Arc::new(Mutex::new(Registry::new(limits.clone(), stats.clone())));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = JoinSet::new();
    let mut shutdown = pin!(shutdown);
    let mut backoff = Backoff::default();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        while tasks.try_join_next().is_some() {}
        let stream = match accepted {
            Ok((stream, _peer)) => stream,
            Err(err) => {
                accept_failed(&err, &registry, &stats, &mut backoff).await;
                continue;
            }
        };
        backoff.reset();
        stats.accepted.fetch_add(1, Ordering::Relaxed);
        let Some(connection) = lock(&registry).admit() else {
            continue;
        };
        let task = ConnectionTask {
            connection,
            app: app.clone(),
            limits: limits.clone(),
            registry: registry.clone(),
            stats: stats.clone(),
            stop: stop_rx.clone(),
        };
        tasks.spawn(task.run(stream));
    }
    drop(listener);
    let _ = stop_tx.send(true);
    while tasks.join_next().await.is_some() {}
}

fn lock(registry: &Mutex<Registry>) -> MutexGuard<'_, Registry> {
    // The registry holds no invariant a panicking holder could break half-way.
    registry
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The pauses between failing accepts: from [`FIRST_ACCEPT_PAUSE`], doubling, to
/// [`LONGEST_ACCEPT_PAUSE`]; a successful accept starts over.
#[derive(Debug, Default)]
struct Backoff {
    next: Option<Duration>,
}

impl Backoff {
    /// The pause before the next accept.
    fn pause(&mut self) -> Duration {
        let pause = self.next.unwrap_or(FIRST_ACCEPT_PAUSE);
        self.next = Some((pause * 2).min(LONGEST_ACCEPT_PAUSE));
        pause
    }

    /// Whether no accept has failed since the last success (the first failure is logged).
    fn calm(&self) -> bool {
        self.next.is_none()
    }

    fn reset(&mut self) {
        self.next = None;
    }
}

/// An accept failed. Out of descriptors or memory (`EMFILE`, `ENFILE`, `ENOMEM`, `ENOBUFS`):
/// the limit is refitted to the descriptor limit (read again: it may have been lowered), and
/// connections without a complete request are closed to free descriptors, then the loop pauses
/// so that they close; the connections in the backlog, `/health` among them, are taken next.
async fn accept_failed(
    err: &std::io::Error,
    registry: &Mutex<Registry>,
    stats: &ConnectionStats,
    backoff: &mut Backoff,
) {
    use std::io::ErrorKind;
    if matches!(
        err.kind(),
        ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset | ErrorKind::ConnectionRefused
    ) {
        return;
    }
    stats.accept_errors.fetch_add(1, Ordering::Relaxed);
    let errno = err.raw_os_error();
    let first = backoff.calm();
    if matches!(
        errno,
        Some(libc::EMFILE | libc::ENFILE | libc::ENOMEM | libc::ENOBUFS)
    ) {
        let descriptors = (errno == Some(libc::EMFILE)).then(limits::descriptor_limit);
        let mut registry = lock(registry);
        let (lowered, shed) = registry.shed_for_descriptors(descriptors);
        let max = registry.limits().max;
        drop(registry);
        if first || lowered {
            let limit = if lowered {
                format!("; the connection limit is now {max}, to fit the descriptor limit")
            } else {
                String::new()
            };
            tracing::warn!(
                event = "error",
                max_connections = max,
                closed = shed,
                "accepting a connection: {err}; closed {shed} connections without a complete request{limit}"
            );
        }
    } else if first {
        tracing::warn!(event = "error", "accepting a connection: {err}");
    }
    tokio::time::sleep(backoff.pause()).await;
}

/// One connection's task and what it needs.
struct ConnectionTask {
    connection: Arc<Connection>,
    app: Router,
    limits: ConnectionLimits,
    registry: Arc<Mutex<Registry>>,
    stats: Arc<ConnectionStats>,
    stop: watch::Receiver<bool>,
}

impl ConnectionTask {
    /// Serves HTTP/1.1 on `stream` until the client or the server closes it, its place is given
    /// to another, or its client stops reading.
    async fn run(mut self, stream: TcpStream) {
        let _ = stream.set_nodelay(true);
        let _ = socket2::SockRef::from(&stream).set_send_buffer_size(SEND_BUFFER_BYTES);
        let watch = Arc::new(WriteWatch::default());
        let io = TokioIo::new(StallIo::new(stream, watch.clone()));
        let service = ConnectionService::new(
            self.app.clone(),
            self.connection.clone(),
            self.registry.clone(),
            self.limits.idle_timeout,
        );
        let mut builder = http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(self.limits.idle_timeout);
        let mut served = pin!(builder.serve_connection(io, service));
        let mut stopping = *self.stop.borrow();
        if stopping {
            served.as_mut().graceful_shutdown();
        }
        loop {
            tokio::select! {
                _ = served.as_mut() => break,
                () = self.connection.close.notified() => break,
                () = watch.stalled_for(self.limits.stream_stall) => {
                    self.connection.stalled.store(true, Ordering::Release);
                    self.stats.stalled.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                _ = self.stop.changed(), if !stopping => {
                    stopping = true;
                    served.as_mut().graceful_shutdown();
                }
            }
        }
        lock(&self.registry).close(self.connection.id);
    }
}

#[cfg(test)]
mod tests;
