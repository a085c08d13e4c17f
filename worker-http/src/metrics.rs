//! The Prometheus counters and histograms of `/metrics`, kept in atomics so that reading them
//! never waits for the engine.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use worker_common::backend::MemoryUsage;
use worker_common::schedule::SchedulerStats;

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

/// Bucket bounds of the per-job draft acceptance ratio.
const RATIO_BOUNDS: [f64; 10] = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0];

/// Bucket bounds of the step size histograms (sequences or tokens in one step).
const SIZE_BOUNDS: [f64; 12] = [
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0,
];

/// A fixed-bucket histogram.
#[derive(Debug)]
struct Histogram {
    bounds: &'static [f64],
    buckets: Vec<AtomicU64>,
    count: AtomicU64,
    /// The sum, in billionths of the unit.
    sum_nanos: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            buckets: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum_nanos: AtomicU64::new(0),
        }
    }

    fn observe(&self, value: f64) {
        for (bound, bucket) in self.bounds.iter().zip(&self.buckets) {
            if value <= *bound {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let nanos = (value.max(0.0) * 1e9) as u64;
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (bound, bucket) in self.bounds.iter().zip(&self.buckets) {
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
    /// Of its drafted tokens, the share the model agreed with; `None` when it drafted none.
    pub acceptance: Option<f64>,
}

/// The worker's metrics.
#[derive(Debug)]
pub struct Metrics {
    requests: [AtomicU64; 4],
    /// Jobs ended with `MODEL_NUMERICS` (also counted as `outcome="error"`).
    numerics: AtomicU64,
    tokens_in: AtomicU64,
    tokens_out: AtomicU64,
    time_to_first_token: Histogram,
    inter_token_latency: Histogram,
    inference_duration: Histogram,
    step_duration: Histogram,
    step_sequences: Histogram,
    step_tokens: Histogram,
    spec_acceptance: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            requests: Default::default(),
            numerics: AtomicU64::new(0),
            tokens_in: AtomicU64::new(0),
            tokens_out: AtomicU64::new(0),
            time_to_first_token: Histogram::new(&LATENCY_BOUNDS),
            inter_token_latency: Histogram::new(&LATENCY_BOUNDS),
            inference_duration: Histogram::new(&LATENCY_BOUNDS),
            step_duration: Histogram::new(&LATENCY_BOUNDS),
            step_sequences: Histogram::new(&SIZE_BOUNDS),
            step_tokens: Histogram::new(&SIZE_BOUNDS),
            spec_acceptance: Histogram::new(&RATIO_BOUNDS),
        }
    }
}

/// Gauges read from the rest of the worker at render time.
#[derive(Debug, Clone, Copy)]
pub struct Gauges {
    /// Jobs waiting in the queue (not yet admitted).
    pub queue_len: usize,
    /// The scheduler's state after its last step.
    pub scheduler: SchedulerStats,
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

    /// Records one engine step's size and duration.
    pub fn record_step(&self, sequences: usize, tokens: usize, seconds: f64) {
        self.step_sequences.observe(sequences as f64);
        self.step_tokens.observe(tokens as f64);
        self.step_duration.observe(seconds);
    }

    /// Counts a job that ended with `MODEL_NUMERICS` (non-finite logits), besides its
    /// [`record`](Self::record).
    pub fn record_numerics(&self) {
        self.numerics.fetch_add(1, Ordering::Relaxed);
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
        if let Some(ratio) = job.acceptance {
            self.spec_acceptance.observe(ratio);
        }
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
        counter(
            &mut out,
            "worker_model_numerics_errors_total",
            "Jobs ended with MODEL_NUMERICS: the model computed NaN or infinite logits (broken weights).",
            self.numerics.load(Ordering::Relaxed),
        );
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
        self.spec_acceptance.render(
            &mut out,
            "worker_spec_acceptance_ratio",
            "Of a job's drafted tokens, the share the model agreed with; jobs that drafted only.",
        );
        gauge(
            &mut out,
            "worker_queue_len",
            "Jobs waiting.",
            gauges.queue_len as f64,
        );
        self.render_scheduler(&mut out, &gauges);
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

impl Metrics {
    fn render_scheduler(&self, out: &mut String, gauges: &Gauges) {
        let stats = gauges.scheduler;
        gauge(
            out,
            "worker_sequences_running",
            "Sequences in the running batch.",
            stats.running as f64,
        );
        gauge(
            out,
            "worker_sequences_waiting",
            "Jobs not running: queued, or preempted for KV pages.",
            (gauges.queue_len + stats.preempted) as f64,
        );
        let used = stats.kv_pages_total.saturating_sub(stats.kv_pages_free);
        gauge(
            out,
            "worker_kv_cache_usage_ratio",
            "KV pages held by sequences over all pages (cached idle pages count as free).",
            used as f64 / stats.kv_pages_total.max(1) as f64,
        );
        counter(
            out,
            "worker_preemptions_total",
            "Sequences preempted for KV pages (re-prefilled later, their streams unbroken).",
            stats.preemptions,
        );
        counter(
            out,
            "worker_prefix_cache_hit_tokens_total",
            "Prompt tokens whose KV came from the prefix cache.",
            stats.cached_tokens,
        );
        counter(
            out,
            "worker_spec_draft_tokens_total",
            "Tokens drafted for speculative decoding (--spec-ngram).",
            stats.drafted_tokens,
        );
        counter(
            out,
            "worker_spec_accepted_tokens_total",
            "Drafted tokens the model agreed with: tokens that took no step of their own.",
            stats.accepted_tokens,
        );
        self.step_sequences
            .render(out, "worker_batch_size", "Sequences per engine step.");
        self.step_tokens
            .render(out, "worker_batch_tokens", "Tokens per engine step.");
        self.step_duration.render(
            out,
            "worker_step_duration_seconds",
            "Wall time of one engine step.",
        );
    }
}

/// Appends counter `name` with its help line in Prometheus text.
pub(crate) fn counter(out: &mut String, name: &str, help: &str, value: u64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
    );
}

/// Appends gauge `name` with its help line in Prometheus text.
pub(crate) fn gauge(out: &mut String, name: &str, help: &str, value: f64) {
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
            acceptance: Some(0.75),
        });
        metrics.record_step(3, 40, 0.004);
        metrics.record_numerics();
        let text = metrics.render(Gauges {
            queue_len: 2,
            scheduler: SchedulerStats {
                running: 3,
                preempted: 1,
                kv_pages_total: 10,
                kv_pages_free: 4,
                preemptions: 2,
                cached_tokens: 32,
                drafted_tokens: 9,
                accepted_tokens: 4,
                last_step: None,
            },
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
        assert!(text.contains("worker_model_numerics_errors_total 1\n"));
        assert!(text.contains("tokens_out_total 5\n"));
        assert!(text.contains("worker_time_to_first_token_seconds_bucket{le=\"0.0025\"} 0\n"));
        assert!(text.contains("worker_time_to_first_token_seconds_bucket{le=\"0.005\"} 1\n"));
        assert!(text.contains("worker_inter_token_latency_seconds_count 1\n"));
        assert!(text.contains("worker_memory_bytes{kind=\"kv\"} 20\n"));
        assert!(text.contains("worker_queue_len 2\n"));
        assert!(text.contains("worker_sequences_running 3\n"));
        assert!(text.contains("worker_sequences_waiting 3\n"));
        assert!(text.contains("worker_kv_cache_usage_ratio 0.6\n"));
        assert!(text.contains("worker_preemptions_total 2\n"));
        assert!(text.contains("worker_prefix_cache_hit_tokens_total 32\n"));
        assert!(text.contains("worker_spec_draft_tokens_total 9\n"));
        assert!(text.contains("worker_spec_accepted_tokens_total 4\n"));
        assert!(text.contains("worker_spec_acceptance_ratio_bucket{le=\"0.7\"} 0\n"));
        assert!(text.contains("worker_spec_acceptance_ratio_bucket{le=\"0.8\"} 1\n"));
        assert!(text.contains("worker_batch_size_bucket{le=\"2\"} 0\n"));
        assert!(text.contains("worker_batch_size_bucket{le=\"4\"} 1\n"));
        assert!(text.contains("worker_batch_tokens_sum 40\n"));
    }
}
