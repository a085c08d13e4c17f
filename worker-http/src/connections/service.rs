//! The per-connection service: the router, with the connection and the place its request holds
//! made known to the request, its body given a deadline, and the place held until its response
//! has been sent or dropped.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::response::Response;
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use tower::ServiceExt;

use super::{Connection, Place, Registry, lock};
use crate::routes::is_status_route;

/// Serves one connection's requests with the router.
#[derive(Debug, Clone)]
pub struct ConnectionService {
    app: Router,
    connection: Arc<Connection>,
    registry: Arc<Mutex<Registry>>,
    /// Time allowed for a request's whole body, from its head.
    body_timeout: Duration,
}

impl ConnectionService {
    /// The service for `connection`, whose requests claim their places in `registry`; bodies
    /// must arrive within `body_timeout`.
    pub fn new(
        app: Router,
        connection: Arc<Connection>,
        registry: Arc<Mutex<Registry>>,
        body_timeout: Duration,
    ) -> Self {
        Self {
            app,
            connection,
            registry,
            body_timeout,
        }
    }
}

impl hyper::service::Service<hyper::Request<Incoming>> for ConnectionService {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn call(&self, request: hyper::Request<Incoming>) -> Self::Future {
        let id = self.connection.id;
        let receiving = !request.body().is_end_stream();
        let status_route = is_status_route(request.uri().path());
        let place = lock(&self.registry).claim(id, status_route, receiving);
        let held = Held {
            registry: self.registry.clone(),
            id,
            place,
        };
        let arrival = receiving.then(|| Arrival {
            registry: self.registry.clone(),
            id,
        });
        let deadline = Box::pin(tokio::time::sleep(self.body_timeout));
        let timeout = self.body_timeout;
        let mut request = request.map(|body| {
            Body::new(DeadlineBody {
                body,
                deadline,
                timeout,
                arrival,
            })
        });
        request.extensions_mut().insert(self.connection.clone());
        request.extensions_mut().insert(place);
        let app = self.app.clone();
        Box::pin(async move {
            let response = app.oneshot(request).await?;
            Ok(response.map(|body| Body::new(HeldBody { body, _held: held })))
        })
    }
}

/// A request body that fails once its deadline passes: a client that sends a head and then
/// trickles (or withholds) its body must not hold the connection and a handler forever. Until it
/// has arrived its connection counts as unidentified (its place may go to another).
struct DeadlineBody {
    body: Incoming,
    deadline: Pin<Box<tokio::time::Sleep>>,
    timeout: Duration,
    /// Reports the body's end (or its drop) to the registry; `None` once reported.
    arrival: Option<Arrival>,
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
            if !matches!(frame, Some(Ok(_))) || self.body.is_end_stream() {
                self.arrival = None;
            }
            return Poll::Ready(frame.map(|frame| frame.map_err(axum::BoxError::from)));
        }
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => {
                self.arrival = None;
                Poll::Ready(Some(Err(BodyTimeout(self.timeout).into())))
            }
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

/// Tells the registry, when dropped, that a request's body has arrived (or will not).
struct Arrival {
    registry: Arc<Mutex<Registry>>,
    id: u64,
}

impl Drop for Arrival {
    fn drop(&mut self) {
        lock(&self.registry).received(self.id);
    }
}

/// A request's place, given back when dropped.
#[derive(Debug)]
struct Held {
    registry: Arc<Mutex<Registry>>,
    id: u64,
    place: Place,
}

impl Drop for Held {
    fn drop(&mut self) {
        lock(&self.registry).release(self.id, self.place);
    }
}

/// A response body that keeps its request's place held until sent or dropped.
struct HeldBody {
    body: Body,
    _held: Held,
}

impl HttpBody for HeldBody {
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
