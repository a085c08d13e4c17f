//! How a job ends, decided once. The engine speaks domain events ([`JobEvent`]): generation
//! events while the job runs, then one [`JobEnd`]. [`end_job`] is the only way a job ends,
//! whoever ends it (the engine, `/cancel` of a waiting job, the drain): it records the metrics,
//! writes the log line and then hands the end to the job's stream. Turning events into SSE
//! frames and error codes happens in [`render`], on the HTTP side.

use worker_common::backend::BackendError;
use worker_common::generate::{Finished, GenerateError, GenerateEvent};

use crate::api::{EndEvent, ErrorCode, StreamEvent, TokenLogprobWire};
use crate::metrics::{JobRecord, Outcome};
use crate::queue::Job;
use crate::state::Shared;

/// What the engine sends a job's stream.
#[derive(Debug)]
pub enum JobEvent {
    /// A token or metrics event.
    Generate(GenerateEvent),
    /// The job ended; nothing follows.
    End(JobEnd),
}

/// How a job ended.
#[derive(Debug)]
pub enum JobEnd {
    /// Normally: `end`.
    Finished(Finished),
    /// With an error code: `error`.
    Failed {
        /// The contract's code.
        code: ErrorCode,
        /// What happened, for the client.
        message: String,
        /// Whether the request may succeed if sent again: the code's own answer, except for
        /// jobs ended by a failure of the worker (a device fault's `CUDA_ERROR`, a panic's
        /// `INTERNAL`: retriable on another worker, the request is not at fault).
        retriable: bool,
    },
}

impl From<Result<Finished, GenerateError>> for JobEnd {
    fn from(result: Result<Finished, GenerateError>) -> Self {
        match result {
            Ok(done) => JobEnd::Finished(done),
            Err(err) => JobEnd::Failed {
                code: ErrorCode::from(&err),
                message: err.to_string(),
                retriable: match &err {
                    GenerateError::Backend(backend) if backend.poisons_device() => true,
                    _ => ErrorCode::from(&err).retriable(),
                },
            },
        }
    }
}

impl From<&GenerateError> for ErrorCode {
    fn from(err: &GenerateError) -> Self {
        match err {
            GenerateError::Cancelled => ErrorCode::Cancelled,
            GenerateError::Timeout => ErrorCode::InferenceTimeout,
            GenerateError::ContextLength { .. } | GenerateError::InvalidRequest(_) => {
                ErrorCode::InvalidRequest
            }
            GenerateError::Backend(BackendError::OutOfMemory { .. }) => ErrorCode::VramOom,
            GenerateError::Backend(BackendError::Device(_) | BackendError::DeviceLost(_)) => {
                ErrorCode::CudaError
            }
            GenerateError::Backend(BackendError::NonFiniteLogits { .. }) => {
                ErrorCode::ModelNumerics
            }
            GenerateError::Backend(_) | GenerateError::Grammar(_) => ErrorCode::Internal,
        }
    }
}

impl JobEnd {
    /// A failure with `code`.
    pub fn failed(code: ErrorCode, message: impl Into<String>) -> Self {
        JobEnd::Failed {
            code,
            message: message.into(),
            retriable: code.retriable(),
        }
    }

    /// A job the worker could not finish because the worker failed for good (its device, or
    /// a panic in its engine): `code`, retriable on another worker (the request is not at fault).
    pub fn worker_failed(code: ErrorCode, message: impl Into<String>) -> Self {
        JobEnd::Failed {
            code,
            message: message.into(),
            retriable: true,
        }
    }

    /// What the job adds to the metrics, having run for `duration` seconds.
    fn record(&self, duration: f64) -> JobRecord {
        match self {
            JobEnd::Finished(done) => {
                let tokens_out = done.tokens.len();
                JobRecord {
                    outcome: Outcome::Success,
                    tokens_out: tokens_out as u64,
                    time_to_first_token: Some(done.time_to_first_token_ms / 1e3),
                    inter_token_latency: (tokens_out > 1)
                        .then(|| done.decode_time_ms / 1e3 / (tokens_out - 1) as f64),
                    duration,
                    acceptance: (done.speculation.drafted > 0).then(|| {
                        done.speculation.accepted as f64 / done.speculation.drafted as f64
                    }),
                }
            }
            JobEnd::Failed { code, .. } => JobRecord {
                outcome: match code {
                    ErrorCode::Cancelled => Outcome::Cancelled,
                    ErrorCode::InferenceTimeout => Outcome::Timeout,
                    _ => Outcome::Error,
                },
                tokens_out: 0,
                time_to_first_token: None,
                inter_token_latency: None,
                duration,
                acceptance: None,
            },
        }
    }
}

/// Ends `job`: metrics, the log line, then the terminal event to its stream (last, so a client
/// holding it sees the job in /metrics). `ran_for` is the seconds it ran (0 if it never started).
pub fn end_job(shared: &Shared, job: Job, end: JobEnd, ran_for: f64) {
    let record = end.record(ran_for);
    log_end(shared, &job, &end, &record);
    shared.metrics.record(record);
    if matches!(
        end,
        JobEnd::Failed {
            code: ErrorCode::ModelNumerics,
            ..
        }
    ) {
        shared.metrics.record_numerics();
    }
    let _ = job.events.send(JobEvent::End(end));
}

fn log_end(shared: &Shared, job: &Job, end: &JobEnd, record: &JobRecord) {
    let worker_id = shared.settings.worker_id.as_str();
    let (job_id, correlation_id) = (job.id.as_str(), job.correlation_id.as_str());
    match end {
        JobEnd::Failed { code, message, .. } => {
            let kind = if *code == ErrorCode::Cancelled {
                "cancel"
            } else {
                "error"
            };
            let code = code.as_str();
            tracing::info!(event = kind, worker_id, job_id, correlation_id, code, detail = %message, "job ended with {code}");
        }
        JobEnd::Finished(done) => tracing::info!(
            event = "execute_end",
            worker_id,
            job_id,
            correlation_id,
            tokens_out = record.tokens_out,
            cached_tokens = done.cached_tokens,
            duration_ms = record.duration * 1e3,
            decode_steps_ms = micros(done.decode_steps_ms),
            "job finished"
        ),
    }
}

/// The wire form of an engine event of job `job_id`.
pub fn render(event: JobEvent, job_id: &str) -> StreamEvent {
    match event {
        JobEvent::Generate(GenerateEvent::Token {
            text,
            index,
            logprobs,
        }) => StreamEvent::Token {
            t: text,
            i: index,
            logprobs: logprobs.iter().map(TokenLogprobWire::of).collect(),
        },
        JobEvent::Generate(GenerateEvent::Metrics {
            tokens_out,
            decode_time_ms,
            tokens_per_sec,
            memory_bytes,
        }) => StreamEvent::Metrics {
            job_id: job_id.to_owned(),
            tokens_out,
            decode_time_ms,
            tokens_per_sec,
            memory_bytes,
        },
        JobEvent::End(JobEnd::Finished(done)) => StreamEvent::End(EndEvent {
            tokens_out: done.tokens.len(),
            cached_tokens: done.cached_tokens,
            decode_time_ms: micros(done.decode_time_ms),
            prefill_time_ms: micros(done.prefill_time_ms),
            time_to_first_token_ms: micros(done.time_to_first_token_ms),
            stop_reason: done.stop_reason.as_str(),
            stop_sequence_matched: done.stop_sequence_matched,
        }),
        JobEvent::End(JobEnd::Failed {
            code,
            message,
            retriable,
        }) => StreamEvent::Error {
            code: code.as_str(),
            message,
            retriable,
        },
    }
}

/// Milliseconds rounded to the microsecond, for readable events.
fn micros(ms: f64) -> f64 {
    (ms * 1e3).round() / 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_finite_logits_end_the_job_with_model_numerics_not_retriable() {
        let err = GenerateError::Backend(BackendError::NonFiniteLogits {
            first: Some((7, f32::NAN)),
        });
        let end = JobEnd::from(Err(err));
        let JobEnd::Failed { code, message, .. } = &end else {
            panic!("{end:?}");
        };
        assert_eq!(*code, ErrorCode::ModelNumerics);
        assert_eq!(code.as_str(), "MODEL_NUMERICS");
        assert!(!code.retriable());
        assert!(message.contains("NaN for token 7"), "{message}");
        assert_eq!(end.record(0.5).outcome, Outcome::Error);
        let device = GenerateError::Backend(BackendError::NonFiniteLogits { first: None });
        assert_eq!(ErrorCode::from(&device), ErrorCode::ModelNumerics);
    }

    #[test]
    fn device_errors_are_cuda_error_and_only_a_lost_device_is_retriable() {
        let recoverable = JobEnd::from(Err(GenerateError::Backend(BackendError::Device(
            "a launch".into(),
        ))));
        let lost = JobEnd::from(Err(GenerateError::Backend(BackendError::DeviceLost(
            "an illegal address".into(),
        ))));
        for (end, expected) in [(recoverable, false), (lost, true)] {
            let StreamEvent::Error {
                code, retriable, ..
            } = render(JobEvent::End(end), "j")
            else {
                panic!("not an error event");
            };
            assert_eq!((code, retriable), ("CUDA_ERROR", expected));
        }
    }
}
