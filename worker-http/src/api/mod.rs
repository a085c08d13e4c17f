//! The wire types of `specs/CONTRACT.md`: the `/execute` request and its validation, the stream
//! events, and the error codes with their HTTP mapping. They exist once, here.

mod error;
mod events;
mod request;

pub use error::{ApiError, ErrorCode, FieldError};
pub use events::{EndEvent, StartedEvent, StreamEvent};
pub use request::{CancelRequest, ExecuteRequest, Limits, require_json};
