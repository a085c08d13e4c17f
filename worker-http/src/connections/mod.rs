//! The listener's connections, served one by one so the worker keeps their limits: a deadline for
//! each request head (which also closes idle keep-alive connections), a connection limit with a
//! reserve for `/health` and `/metrics`, eviction of idle connections when the limit is reached,
//! and a write-stall timeout that drops clients that stopped reading (specs/HTTP.md,
//! "Connections").

mod limits;
mod service;
mod stall;

use std::collections::BTreeMap;
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

pub use limits::ConnectionLimits;
use service::ConnectionService;
use stall::{StallIo, WriteWatch};

/// The kernel send buffer of a connection. Token streams need a few KiB per second; bounding the
/// buffer (instead of letting the kernel grow it to MiBs) bounds the memory idle readers hold and
/// makes a client that stops reading show as a write stall after tens of KiB.
const SEND_BUFFER_BYTES: usize = 16 * 1024;

/// How long the accept loop pauses after an accept error such as `EMFILE`.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// One open connection, as the registry and the requests on it see it.
#[derive(Debug)]
pub struct Connection {
    id: u64,
    /// A reserve connection answers only `/health` and `/metrics`, once.
    reserve: bool,
    /// Requests whose response has not been fully sent.
    in_flight: AtomicUsize,
    /// Set when the client stopped reading for the stall timeout.
    stalled: AtomicBool,
    /// Wakes the connection's task to drop it (eviction).
    close: Notify,
}

impl Connection {
    /// Whether this connection was dropped because its client stopped reading.
    pub fn stalled(&self) -> bool {
        self.stalled.load(Ordering::Acquire)
    }

    /// Whether this connection serves only `/health` and `/metrics`.
    pub fn is_reserve(&self) -> bool {
        self.reserve
    }
}

/// Connection counters for `/metrics`.
#[derive(Debug, Default)]
pub struct ConnectionStats {
    open: AtomicUsize,
    accepted: AtomicU64,
    refused: AtomicU64,
    evicted: AtomicU64,
    stalled: AtomicU64,
}

impl ConnectionStats {
    /// Appends the connection metrics in Prometheus text.
    pub fn render(&self, out: &mut String) {
        use std::fmt::Write;
        let open = self.open.load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "# HELP worker_http_connections Open HTTP connections.\n# TYPE worker_http_connections gauge\nworker_http_connections {open}"
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
            let n = count.load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "worker_http_connections_closed_total{{reason=\"{reason}\"}} {n}"
            );
        }
        let accepted = self.accepted.load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "# HELP worker_http_connections_accepted_total Connections accepted.\n# TYPE worker_http_connections_accepted_total counter\nworker_http_connections_accepted_total {accepted}"
        );
    }
}

/// The open connections, oldest first.
#[derive(Debug, Default)]
struct Registry {
    next_id: u64,
    open: BTreeMap<u64, Arc<Connection>>,
}

/// Serves `app` on `listener` until `shutdown` resolves, then lets open requests finish.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    stats: Arc<ConnectionStats>,
    shutdown: impl Future<Output = ()>,
) {
    let registry = Arc::new(Mutex::new(Registry::default()));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = JoinSet::new();
    let mut shutdown = pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        while tasks.try_join_next().is_some() {}
        let stream = match accepted {
            Ok((stream, _peer)) => stream,
            Err(err) => {
                accept_failed(&err).await;
                continue;
            }
        };
        stats.accepted.fetch_add(1, Ordering::Relaxed);
        let Some(connection) = admit(&mut lock(&registry), &limits, &stats) else {
            stats.refused.fetch_add(1, Ordering::Relaxed);
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

/// Takes a place for a new connection: a general one, else one of the reserve, else the place of
/// the oldest idle connection; `None` when every place is busy.
fn admit(
    registry: &mut Registry,
    limits: &ConnectionLimits,
    stats: &ConnectionStats,
) -> Option<Arc<Connection>> {
    if registry.open.len() >= limits.max {
        let idle = registry
            .open
            .values()
            .find(|c| c.in_flight.load(Ordering::Acquire) == 0)?
            .id;
        let victim = registry.open.remove(&idle)?;
        victim.close.notify_one();
        stats.evicted.fetch_add(1, Ordering::Relaxed);
    }
    let reserve = registry.open.len() >= limits.max.saturating_sub(limits.reserve);
    let id = registry.next_id;
    registry.next_id += 1;
    let connection = Arc::new(Connection {
        id,
        reserve,
        in_flight: AtomicUsize::new(0),
        stalled: AtomicBool::new(false),
        close: Notify::new(),
    });
    registry.open.insert(id, connection.clone());
    stats.open.store(registry.open.len(), Ordering::Relaxed);
    Some(connection)
}

fn lock(registry: &Mutex<Registry>) -> MutexGuard<'_, Registry> {
    // The registry holds no invariant a panicking holder could break half-way.
    registry
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `EMFILE` and friends: wait for descriptors to free up instead of spinning.
async fn accept_failed(err: &std::io::Error) {
    use std::io::ErrorKind;
    if matches!(
        err.kind(),
        ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset | ErrorKind::ConnectionRefused
    ) {
        return;
    }
    tracing::warn!(event = "error", "accepting a connection: {err}");
    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
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
    /// Serves HTTP/1.1 on `stream` until the client or the server closes it, it is evicted, or
    /// its client stops reading.
    async fn run(mut self, stream: TcpStream) {
        let _ = stream.set_nodelay(true);
        let _ = socket2::SockRef::from(&stream).set_send_buffer_size(SEND_BUFFER_BYTES);
        let watch = Arc::new(WriteWatch::default());
        let io = TokioIo::new(StallIo::new(stream, watch.clone()));
        let service = ConnectionService::new(
            self.app.clone(),
            self.connection.clone(),
            self.limits.idle_timeout,
        );
        let mut builder = http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(self.limits.idle_timeout)
            .keep_alive(!self.connection.reserve);
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
        let mut registry = lock(&self.registry);
        registry.open.remove(&self.connection.id);
        self.stats
            .open
            .store(registry.open.len(), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests;
