//! `/health` and `/metrics`: answered from cached state, never from the engine.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use serde_json::{Value, json};

use crate::metrics::Gauges;
use crate::state::{Lifecycle, Shared};

/// `GET /health`: 200 when ready or busy, 503 (same body) while loading, draining or failed;
/// `last_error` says why a failed worker failed (`null` otherwise).
pub async fn health(State(shared): State<Arc<Shared>>) -> (StatusCode, Json<Value>) {
    let lifecycle = shared.lifecycle();
    let serving = lifecycle == Lifecycle::Ready;
    let loaded = shared.loaded();
    let slots = loaded.map_or(0, |m| m.slots);
    let slots_busy = shared.queue.running();
    let scheduler = shared.scheduler();
    let state = match lifecycle {
        Lifecycle::Loading => "loading",
        Lifecycle::Ready if slots_busy >= slots => "busy",
        Lifecycle::Ready => "ready",
        Lifecycle::Draining => "draining",
        Lifecycle::Failed => "failed",
    };
    let settings = &shared.settings;
    let memory_bytes = shared.memory().total();
    let vram_bytes = if settings.memory_architecture == "vram-only" {
        memory_bytes
    } else {
        0
    };
    let mut body = json!({
        "status": if serving { "healthy" } else { "unhealthy" },
        "state": state,
        "worker_id": settings.worker_id,
        "model": loaded.map(|m| m.model_name.clone()),
        "model_ref": settings.model_ref.display().to_string(),
        "resident": loaded.is_some() && lifecycle != Lifecycle::Failed,
        "quant_kind": loaded.map(|m| m.quant_kind.clone()),
        "tokenizer_kind": loaded.map(|m| m.tokenizer_kind),
        "vocab_size": loaded.map(|m| m.vocab_size),
        "context_length": loaded.map(|m| m.context_length),
        "capabilities": crate::state::advertised_capabilities(loaded.map(Arc::as_ref)),
        "protocol": "sse",
        "worker_type": settings.worker_type,
        "memory_architecture": settings.memory_architecture,
        "memory_bytes": memory_bytes,
        "vram_bytes_used": vram_bytes,
        "vram_bytes": vram_bytes,
        "queue_len": shared.queue.len(),
        "slots": slots,
        "slots_busy": slots_busy,
        "kv_pages_total": scheduler.kv_pages_total,
        "kv_pages_free": scheduler.kv_pages_free,
        "uptime_seconds": shared.uptime().as_secs(),
        "version": env!("CARGO_PKG_VERSION"),
        "last_error": shared.failure().map(|failure| json!({
            "code": failure.code,
            "message": failure.message,
        })),
    });
    if let (Some(gpu), Some(object)) = (loaded.and_then(|m| m.gpu.as_ref()), body.as_object_mut()) {
        object.insert("device".into(), json!(gpu.ordinal));
        object.insert(
            "device_name".into(),
            json!(loaded.map(|m| m.device.clone())),
        );
        object.insert("sm".into(), json!(gpu.sm));
        object.insert(
            "cuda_runtime_version".into(),
            json!(gpu.cuda_runtime_version),
        );
    }
    if let (Some(cpu), Some(object)) = (loaded.and_then(|m| m.cpu.as_ref()), body.as_object_mut()) {
        object.insert(
            "device_name".into(),
            json!(loaded.map(|m| m.device.clone())),
        );
        object.insert("cpu_isa".into(), json!(cpu.isa));
    }
    let status = if serving {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body))
}

/// `GET /metrics`: Prometheus text.
pub async fn metrics(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    let gauges = Gauges {
        queue_len: shared.queue.len(),
        scheduler: shared.scheduler(),
        memory: shared.memory(),
        uptime_seconds: shared.uptime().as_secs_f64(),
    };
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        {
            let mut text = shared.metrics.render(gauges);
            shared.connections.render(&mut text);
            text
        },
    )
}
