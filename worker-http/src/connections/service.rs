//! The per-connection service: the router, with the connection made known to the request and its
//! response counted as in flight until its body has been sent or dropped.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

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
}

impl ConnectionService {
    /// The service for `connection`.
    pub fn new(app: Router, connection: Arc<Connection>) -> Self {
        Self { app, connection }
    }
}

impl hyper::service::Service<hyper::Request<Incoming>> for ConnectionService {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn call(&self, request: hyper::Request<Incoming>) -> Self::Future {
        let busy = Busy::new(self.connection.clone());
        let mut request = request.map(Body::new);
        request.extensions_mut().insert(self.connection.clone());
        let app = self.app.clone();
        Box::pin(async move {
            let response = app.oneshot(request).await?;
            Ok(response.map(|body| Body::new(CountedBody { body, _busy: busy })))
        })
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
