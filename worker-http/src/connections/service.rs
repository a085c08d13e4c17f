//! The per-connection service: the router, with the connection made known to the request, its
//! body given a deadline, and its response counted as in flight until its body has been sent or
//! dropped.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::response::Response;
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use tower::ServiceExt;

use super::Connection;

/// Serves one connection's requests with the router.
#[derive(Debug, Clone)]
pub struct ConnectionService {
    app: Router,
    connection: Arc<Connection>,
    /// Time allowed for a request's whole body, from its head.
    body_timeout: Duration,
}

impl ConnectionService {
    /// The service for `connection`; bodies must arrive within `body_timeout`.
    pub fn new(app: Router, connection: Arc<Connection>, body_timeout: Duration) -> Self {
        Self {
            app,
            connection,
            body_timeout,
        }
    }
}

impl hyper::service::Service<hyper::Request<Incoming>> for ConnectionService {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn call(&self, request: hyper::Request<Incoming>) -> Self::Future {
        let busy = Busy::new(self.connection.clone());
        let deadline = Box::pin(tokio::time::sleep(self.body_timeout));
        let timeout = self.body_timeout;
        let mut request = request.map(|body| {
            Body::new(DeadlineBody {
                body,
                deadline,
                timeout,
            })
        });
        request.extensions_mut().insert(self.connection.clone());
        let app = self.app.clone();
        Box::pin(async move {
            let response = app.oneshot(request).await?;
            Ok(response.map(|body| Body::new(CountedBody { body, _busy: busy })))
        })
    }
}

/// A request body that fails once its deadline passes: a client that sends a head and then
/// trickles (or withholds) its body must not hold the connection and a handler forever.
struct DeadlineBody {
    body: Incoming,
    deadline: Pin<Box<tokio::time::Sleep>>,
    timeout: Duration,
}

/// The body did not arrive in time (the handler answers 400 with this text).
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {0:?} of its head")]
struct BodyTimeout(Duration);

impl HttpBody for DeadlineBody {
    type Data = bytes::Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.body).poll_frame(cx) {
            return Poll::Ready(frame.map(|frame| frame.map_err(axum::BoxError::from)));
        }
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(BodyTimeout(self.timeout).into()))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Counts one request in flight on its connection while alive.
#[derive(Debug)]
struct Busy(Arc<Connection>);

impl Busy {
    fn new(connection: Arc<Connection>) -> Self {
        connection.in_flight.fetch_add(1, Ordering::AcqRel);
        Self(connection)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that keeps its request counted in flight until sent or dropped.
struct CountedBody {
    body: Body,
    _busy: Busy,
}

impl HttpBody for CountedBody {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
