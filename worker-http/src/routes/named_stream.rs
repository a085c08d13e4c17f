//! The streams of the two APIs whose events are named (`event: <type>` then `data: <json>`):
//! Anthropic's Messages and OpenAI's Responses. Each says what a piece of the reply, the job's
//! end and its failure send ([`NamedEvents`]); the job's events reach it through one
//! [`TextParser`] and one stream here.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::response::sse::Event;
use futures_util::Stream;
use serde_json::Value;
use worker_common::generate::{Finished, GenerateEvent};

use super::reply::TextParser;
use crate::api::ErrorCode;
use crate::api::openai::Piece;
use crate::job_end::{JobEnd, JobEvent};
use crate::submit::JobEvents;

/// An event's type and its data.
pub(super) type Named = (&'static str, Value);

/// What an API's stream sends for a job.
pub(super) trait NamedEvents {
    /// The events a piece of the reply sends.
    fn piece(&mut self, piece: Piece) -> Vec<Named>;
    /// The events the job's end sends.
    fn finish(&mut self, done: &Finished) -> Vec<Named>;
    /// The events a failed job sends instead.
    fn fail(&mut self, code: ErrorCode, message: &str) -> Vec<Named>;
}

/// A job's events as `N` names them. Dropping it cancels the job ([`JobEvents`]).
pub(super) struct NamedStream<N> {
    named: N,
    events: JobEvents,
    /// Cuts reasoning and tool calls out of the text.
    parser: TextParser,
    ready: VecDeque<Event>,
    ended: bool,
}

impl<N: NamedEvents> NamedStream<N> {
    /// The stream of `events` through `parser` and `named`, opening with `first`.
    pub(super) fn new(named: N, events: JobEvents, parser: TextParser, first: Vec<Named>) -> Self {
        Self {
            named,
            events,
            parser,
            ready: first.into_iter().map(event).collect(),
            ended: false,
        }
    }

    /// Queues what `job_event` sends; true when it was the last.
    fn push(&mut self, job_event: JobEvent) -> bool {
        let (pieces, end) = match job_event {
            JobEvent::Generate(GenerateEvent::Token { text, .. }) => (self.parser.push(text), None),
            JobEvent::Generate(GenerateEvent::Metrics { .. }) => (Vec::new(), None),
            JobEvent::End(JobEnd::Finished(done)) => (self.parser.finish(), Some(Ok(done))),
            JobEvent::End(JobEnd::Failed { code, message, .. }) => {
                (Vec::new(), Some(Err((code, message))))
            }
        };
        for piece in pieces {
            let events = self.named.piece(piece);
            self.ready.extend(events.into_iter().map(event));
        }
        let last = match &end {
            None => return false,
            Some(Ok(done)) => self.named.finish(done),
            Some(Err((code, message))) => self.named.fail(*code, message),
        };
        self.ready.extend(last.into_iter().map(event));
        true
    }
}

/// `event: <type>` then `data: <json>`.
fn event((name, data): Named) -> Event {
    Event::default().event(name).data(data.to_string())
}

impl<N: NamedEvents + Unpin> Stream for NamedStream<N> {
    type Item = Result<Event, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if let Some(event) = self.ready.pop_front() {
                return Poll::Ready(Some(Ok(event)));
            }
            if self.ended {
                return Poll::Ready(None);
            }
            match std::task::ready!(Pin::new(&mut self.events).poll_next(cx)) {
                Some(job_event) => self.ended = self.push(job_event),
                None => self.ended = true,
            }
        }
    }
}
