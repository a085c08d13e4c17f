//! The wire types: `specs/CONTRACT.md`'s `/execute` request and its validation, the stream
//! events, the error codes with their HTTP mapping, OpenAI's `/v1` shapes (`specs/OPENAI.md`)
//! and Anthropic's `/v1/messages` shapes (`specs/MESSAGES.md`). They exist once, here; every
//! API validates into one [`JobSpec`].

pub mod anthropic;
mod error;
mod events;
mod fields;
mod grammar;
mod job;
pub mod openai;
mod request;
mod sampling;
mod tokens;

pub use error::{ApiError, ContextOverflow, ErrorCode, ErrorParts, FieldError};
pub use events::{EndEvent, StartedEvent, StreamEvent, TokenLogprobWire};
pub use fields::require_json;
pub use job::{Grammar, JobSpec, Prompt};
pub use request::{CancelRequest, ExecuteRequest, Limits, MAX_JOB_ID_BYTES, MAX_TOKENS_LIMIT};
pub use sampling::{MAX_LOGIT_BIAS, MAX_TOP_LOGPROBS};
pub use tokens::{DetokenizeRequest, MAX_DETOKENIZE_IDS, TokenizeRequest};
