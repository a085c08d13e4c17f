//! Write-stall detection: a connection whose socket has refused bytes for the stall timeout
//! belongs to a client that stopped reading.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Since when the socket has refused writes, shared by the I/O and the connection's task.
#[derive(Debug)]
pub struct WriteWatch {
    origin: Instant,
    /// Milliseconds after `origin` plus one when a write was first refused; 0 while writes pass.
    blocked_since: AtomicU64,
}

impl Default for WriteWatch {
    fn default() -> Self {
        Self {
            origin: Instant::now(),
            blocked_since: AtomicU64::new(0),
        }
    }
}

impl WriteWatch {
    fn refused(&self) {
        let now = self.origin.elapsed().as_millis() as u64 + 1;
        let _ = self
            .blocked_since
            .compare_exchange(0, now, Ordering::AcqRel, Ordering::Acquire);
    }

    fn passed(&self) {
        self.blocked_since.store(0, Ordering::Release);
    }

    /// How long writes have been refused without a byte passing.
    fn blocked_for(&self) -> Duration {
        match self.blocked_since.load(Ordering::Acquire) {
            0 => Duration::ZERO,
            since => self
                .origin
                .elapsed()
                .saturating_sub(Duration::from_millis(since - 1)),
        }
    }

    /// Resolves once writes have been refused for `limit` without a byte passing; checked a few
    /// times per `limit`, so it fires between `limit` and 1.25 × `limit`.
    pub async fn stalled_for(&self, limit: Duration) {
        let tick = (limit / 4).max(Duration::from_millis(50));
        loop {
            tokio::time::sleep(tick).await;
            if self.blocked_for() >= limit {
                return;
            }
        }
    }
}

/// A TCP stream that reports refused and passed writes to its [`WriteWatch`].
#[derive(Debug)]
pub struct StallIo {
    stream: TcpStream,
    watch: std::sync::Arc<WriteWatch>,
}

impl StallIo {
    /// Wraps `stream`.
    pub fn new(stream: TcpStream, watch: std::sync::Arc<WriteWatch>) -> Self {
        Self { stream, watch }
    }

    fn observe<T>(&self, poll: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        match &poll {
            Poll::Pending => self.watch.refused(),
            Poll::Ready(_) => self.watch.passed(),
        }
        poll
    }
}

impl AsyncRead for StallIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for StallIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.observe(poll)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.observe(poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.stream).poll_flush(cx);
        self.observe(poll)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_starts_the_clock_and_a_passed_write_stops_it() {
        let watch = WriteWatch::default();
        assert_eq!(watch.blocked_for(), Duration::ZERO);
        watch.refused();
        std::thread::sleep(Duration::from_millis(20));
        watch.refused();
        assert!(watch.blocked_for() >= Duration::from_millis(20));
        watch.passed();
        assert_eq!(watch.blocked_for(), Duration::ZERO);
    }
}
