//! The Prometheus counters and histograms of `/metrics`, kept in atomics so that reading them
//! never waits for the engine.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use worker_common::backend::MemoryUsage;

/// How a request ended, the `outcome` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// `end` was sent.
    Success,
    /// `error` other than cancel and timeout.
    Error,
    /// Cancelled by `/cancel`, a disconnect or shutdown.
    Cancelled,
    /// `INFERENCE_TIMEOUT`.
    Timeout,
}

const OUTCOMES: [(Outcome, &str); 4] = [
    (Outcome::Success, "success"),
    (Outcome::Error, "error"),
    (Outcome::Cancelled, "cancelled"),
    (Outcome::Timeout, "timeout"),
];

/// Bucket bounds in seconds, from sub-millisecond GPU steps to multi-minute jobs.
const LATENCY_BOUNDS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0, 300.0,
];

/// A fixed-bucket histogram of seconds.
#[derive(Debug, Default)]
struct Histogram {
    buckets: [AtomicU64; LATENCY_BOUNDS.len()],
    count: AtomicU64,
    sum_nanos: AtomicU64,
}

impl Histogram {
    fn observe(&self, seconds: f64) {
        for (bound, bucket) in LATENCY_BOUNDS.iter().zip(&self.buckets) {
            if seconds <= *bound {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let nanos = (seconds.max(0.0) * 1e9) as u64;
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (bound, bucket) in LATENCY_BOUNDS.iter().zip(&self.buckets) {
            let n = bucket.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {n}");
        }
        let count = self.count.load(Ordering::Relaxed);
        let sum = self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {count}");
    }
}

/// What a finished job adds to the metrics.
#[derive(Debug, Clone, Copy)]
pub struct JobRecord {
    /// How it ended.
    pub outcome: Outcome,
    /// Tokens generated.
    pub tokens_out: u64,
    /// Seconds to the first token, when one was produced.
    pub time_to_first_token: Option<f64>,
    /// Mean seconds between generated tokens, when there were at least two.
    pub inter_token_latency: Option<f64>,
    /// Seconds the job ran on the engine.
    pub duration: f64,
}

/// The worker's metrics.
#[derive(Debug, Default)]
pub struct Metrics {
    requests: [AtomicU64; 4],
    tokens_in: AtomicU64,
    tokens_out: AtomicU64,
    time_to_first_token: Histogram,
    inter_token_latency: Histogram,
    inference_duration: Histogram,
}

/// Gauges read from the rest of the worker at render time.
#[derive(Debug, Clone, Copy)]
pub struct Gauges {
    /// Jobs waiting.
    pub queue_len: usize,
    /// Backend memory by kind.
    pub memory: MemoryUsage,
    /// Seconds since start.
    pub uptime_seconds: f64,
}

impl Metrics {
    /// Counts the prompt tokens of an accepted job.
    pub fn add_tokens_in(&self, tokens: usize) {
        self.tokens_in.fetch_add(tokens as u64, Ordering::Relaxed);
    }

    /// Records a finished job.
    pub fn record(&self, job: JobRecord) {
        let slot = OUTCOMES
            .iter()
            .position(|(outcome, _)| *outcome == job.outcome)
            .unwrap_or(0);
        self.requests[slot].fetch_add(1, Ordering::Relaxed);
        self.tokens_out.fetch_add(job.tokens_out, Ordering::Relaxed);
        if let Some(seconds) = job.time_to_first_token {
            self.time_to_first_token.observe(seconds);
        }
        if let Some(seconds) = job.inter_token_latency {
            self.inter_token_latency.observe(seconds);
        }
        self.inference_duration.observe(job.duration);
    }

    /// The Prometheus text exposition.
    pub fn render(&self, gauges: Gauges) -> String {
        let mut out = String::with_capacity(4096);
        let _ = writeln!(
            out,
            "# HELP worker_requests_total Jobs ended, by outcome.\n# TYPE worker_requests_total counter"
        );
        for ((_, label), count) in OUTCOMES.iter().zip(&self.requests) {
            let n = count.load(Ordering::Relaxed);
            let _ = writeln!(out, "worker_requests_total{{outcome=\"{label}\"}} {n}");
        }
        let tokens_in = self.tokens_in.load(Ordering::Relaxed);
        let tokens_out = self.tokens_out.load(Ordering::Relaxed);
        counter(
            &mut out,
            "worker_tokens_in_total",
            "Prompt tokens of accepted jobs.",
            tokens_in,
        );
        counter(
            &mut out,
            "worker_tokens_generated_total",
            "Tokens generated.",
            tokens_out,
        );
        counter(
            &mut out,
            "tokens_out_total",
            "Alias of worker_tokens_generated_total.",
            tokens_out,
        );
        self.time_to_first_token.render(
            &mut out,
            "worker_time_to_first_token_seconds",
            "From the start of a job to its first token.",
        );
        self.inter_token_latency.render(
            &mut out,
            "worker_inter_token_latency_seconds",
            "Mean time between generated tokens, one observation per job.",
        );
        self.inference_duration.render(
            &mut out,
            "worker_inference_duration_seconds",
            "Time a job ran on the engine.",
        );
        gauge(
            &mut out,
            "worker_queue_len",
            "Jobs waiting.",
            gauges.queue_len as f64,
        );
        let _ = writeln!(
            out,
            "# HELP worker_memory_bytes Backend memory by kind.\n# TYPE worker_memory_bytes gauge"
        );
        let memory = gauges.memory;
        for (kind, bytes) in [
            ("weights", memory.weights),
            ("kv", memory.kv),
            ("scratch", memory.scratch),
        ] {
            let _ = writeln!(out, "worker_memory_bytes{{kind=\"{kind}\"}} {bytes}");
        }
        gauge(
            &mut out,
            "worker_uptime_seconds",
            "Seconds since start.",
            gauges.uptime_seconds,
        );
        out
    }
}

fn counter(out: &mut String, name: &str, help: &str, value: u64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
    );
}

fn gauge(out: &mut String, name: &str, help: &str, value: f64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_moves_its_counters_and_histograms() {
        let metrics = Metrics::default();
        metrics.add_tokens_in(7);
        metrics.record(JobRecord {
            outcome: Outcome::Cancelled,
            tokens_out: 5,
            time_to_first_token: Some(0.003),
            inter_token_latency: Some(0.02),
            duration: 0.2,
        });
        let text = metrics.render(Gauges {
            queue_len: 2,
            memory: MemoryUsage {
                weights: 10,
                kv: 20,
                scratch: 30,
            },
            uptime_seconds: 1.5,
        });
        assert!(text.contains("worker_requests_total{outcome=\"cancelled\"} 1\n"));
        assert!(text.contains("worker_requests_total{outcome=\"success\"} 0\n"));
        assert!(text.contains("worker_tokens_in_total 7\n"));
        assert!(text.contains("tokens_out_total 5\n"));
        assert!(text.contains("worker_time_to_first_token_seconds_bucket{le=\"0.0025\"} 0\n"));
        assert!(text.contains("worker_time_to_first_token_seconds_bucket{le=\"0.005\"} 1\n"));
        assert!(text.contains("worker_inter_token_latency_seconds_count 1\n"));
        assert!(text.contains("worker_memory_bytes{kind=\"kv\"} 20\n"));
        assert!(text.contains("worker_queue_len 2\n"));
    }
}
