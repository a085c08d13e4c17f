//! OpenAI's Responses API (`/v1/responses`): a request's `instructions` and `input` items (the
//! previous response's conversation first, with `previous_response_id`) validated into the same
//! [`JobSpec`](crate::api::JobSpec) as `/v1/chat/completions` (the same chat template, tool
//! rendering, forced-call grammar, structured output and parsers), answered as a response object
//! or its typed stream events. specs/OPENAI.md ("Responses") states every field and decision.

mod events;
mod input;
mod output;
mod request;

pub use events::{NamedEvent, ResponseEvents};
pub use output::{ResponseHead, Status, usage};
pub use request::{PREVIOUS_RESPONSE_NOT_FOUND, PreviousLookup, ResponsesRequest};
