//! `/cancel` (body and path forms) and `/shutdown`.

use std::sync::Arc;

use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use bytes::Bytes;

use super::{body_or_error, content_type};
use crate::api::{ApiError, CancelRequest, ErrorCode, FieldError, MAX_JOB_ID_BYTES};
use crate::correlation::CorrelationId;
use crate::job_end::{JobEnd, end_job};
use crate::state::Shared;

/// `POST /cancel` with `{"job_id": …}`.
pub async fn cancel_body(
    State(shared): State<Arc<Shared>>,
    CorrelationId(correlation_id): CorrelationId,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, ApiError> {
    let body = body_or_error(&shared, body, &correlation_id)?;
    let request = CancelRequest::parse(content_type(&headers), &body)
        .map_err(|errors| ApiError::invalid(errors, &correlation_id))?;
    Ok(cancel(&shared, &request.job_id, &correlation_id))
}

/// `POST /cancel/{job_id}`.
pub async fn cancel_path(
    State(shared): State<Arc<Shared>>,
    CorrelationId(correlation_id): CorrelationId,
    job_id: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let Path(job_id) = job_id.map_err(|rejection| {
        let error = FieldError {
            field: "job_id".into(),
            constraint: "utf8".into(),
            message: format!(
                "the job id in the path is unreadable: {}",
                rejection.body_text()
            ),
            value: None,
        };
        ApiError::invalid(vec![error], &correlation_id)
    })?;
    // The same bound as the body form's (no job can have a longer id).
    if job_id.len() > MAX_JOB_ID_BYTES {
        let message = format!(
            "the job id in the path is {} bytes, at most {MAX_JOB_ID_BYTES}",
            job_id.len()
        );
        return Err(ApiError::invalid_field(
            "job_id",
            "max_length(256)",
            message,
            &correlation_id,
        ));
    }
    Ok(cancel(&shared, &job_id, &correlation_id))
}

/// Idempotent: unknown and finished jobs are a no-op, answered 202 all the same.
fn cancel(shared: &Shared, job_id: &str, correlation_id: &str) -> StatusCode {
    tracing::info!(
        event = "cancel",
        worker_id = %shared.settings.worker_id,
        job_id,
        correlation_id,
        "cancel requested"
    );
    for job in shared.queue.cancel(job_id) {
        let end = JobEnd::failed(ErrorCode::Cancelled, "cancelled before it started");
        end_job(shared, job, end, 0.0);
    }
    StatusCode::ACCEPTED
}

/// `POST /shutdown`: drain as on SIGTERM.
pub async fn shutdown(
    State(shared): State<Arc<Shared>>,
    CorrelationId(correlation_id): CorrelationId,
) -> StatusCode {
    tracing::info!(
        event = "shutdown",
        worker_id = %shared.settings.worker_id,
        correlation_id,
        "shutdown requested over HTTP"
    );
    shared.shutdown.notify_one();
    StatusCode::ACCEPTED
}
