//! The engine's bookkeeping and its failure against the real worker binary
//! (`LLORCH_TEST_WORKER`, default `llorch-cpud`) on SmolLM2:
//!
//! - an old job still prefilling a long prompt while two younger ones decode, all ending in the
//!   same step (the traffic that once panicked the engine): swept over the young jobs'
//!   `max_tokens` until they end after the long job, so that they end in every step of the long
//!   prefill; every job ends once with the text it gets alone, and the worker stays ready;
//! - a forced engine panic (the test-only `LLORCH_TEST_ENGINE_PANIC`, specs/HTTP.md): the
//!   worker turns `failed`, every job gets one retriable `INTERNAL` error, new jobs are
//!   refused, and the process exits 1 after `--shutdown-grace-sec`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use llorch_tests::assets::Model;
use llorch_tests::http::{EventStream, SseEvent, get, post_json};
use llorch_tests::stream::{assert_well_formed, job, run, terminal, text};
use llorch_tests::worker::{Worker, serial, smollm2, worker_binary};
use serde_json::{Value, json};

/// A prompt of several prefill steps: on the CPU about 300 tokens, paced beside the short jobs'
/// decodes (specs/BATCHING.md) over tens to hundreds of steps, as the machine's speed has it; on
/// the GPU about 6,000, in 512-token grid chunks (CUDA is not paced).
fn long_prompt() -> String {
    let items = if worker_binary() == "worker-orcd" {
        850
    } else {
        40
    };
    let words: String = (0..items)
        .map(|i| format!("step {i} of the plan, "))
        .collect();
    format!("Run. {words}")
}

/// The short jobs' token counts, tried in turn until they end after the long prefill: every
/// count up to 24 (so they end in each of its first steps beside their decodes), then coarser,
/// since how many steps the paced prefill takes depends on the machine's speed (2-core VM:
/// crossed at 512 alone, not within 512 under CI's load).
const SWEEP: [usize; 36] = [
    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 32, 48,
    64, 96, 128, 192, 256, 384, 512, 768, 1024, 2048,
];

fn greedy(id: &str, prompt: &str, max_tokens: usize) -> Value {
    job(
        id,
        prompt,
        json!({"raw": true, "temperature": 0, "max_tokens": max_tokens, "ignore_eos": true}),
    )
}

/// A job's events and when its terminal event came.
struct Finished {
    events: Vec<SseEvent>,
    at: Instant,
}

/// Reads `stream` to its end, after the events already read from it.
fn finish(read: Vec<SseEvent>, stream: EventStream) -> Finished {
    let mut events = read;
    events.extend(stream.collect());
    Finished {
        events,
        at: Instant::now(),
    }
}

/// Starts the long job, then the two short ones as soon as the long one is accepted; returns
/// the three in that order.
fn long_beside_two_short(addr: SocketAddr, bodies: &[Value; 3]) -> Vec<Finished> {
    let mut long = EventStream::open(addr, "/execute", &bodies[0]).unwrap();
    let started = long.next_event().unwrap();
    assert_eq!(started.event, "started", "{:?}", started.data);
    let shorts: Vec<_> = bodies[1..]
        .iter()
        .cloned()
        .map(|body| {
            std::thread::spawn(move || {
                finish(
                    Vec::new(),
                    EventStream::open(addr, "/execute", &body).unwrap(),
                )
            })
        })
        .collect();
    let mut all = vec![finish(vec![started], long)];
    all.extend(shorts.into_iter().map(|t| t.join().unwrap()));
    all
}

#[test]
fn an_old_prefill_ending_beside_young_decodes_gives_each_job_its_own_text() {
    let _serial = serial();
    // No prefix cache, so the same long prompt is prefilled in full every round.
    let worker = smollm2(&["--parallel", "4", "--threads", "2", "--no-prefix-cache"]);
    let addr = worker.addr;
    let shorts = ["Hello, my name is", "The weather today"];
    // What the long job gets alone: one token.
    let long_alone = text(&run(addr, &greedy("long", &long_prompt(), 1)));
    // Each round's short jobs (which short prompt, body, text), checked against the text alone
    // after the sweep.
    let mut short_texts = Vec::new();
    let mut short_first = Vec::new();
    // Until the short jobs end after the long one: then they have ended in every step of its
    // prefill, the one where it ends too among them.
    for max_tokens in SWEEP {
        let bodies = [
            greedy(&format!("long{max_tokens}"), &long_prompt(), 1),
            greedy(&format!("a{max_tokens}"), shorts[0], max_tokens),
            greedy(&format!("b{max_tokens}"), shorts[1], max_tokens),
        ];
        let together = long_beside_two_short(addr, &bodies);
        for (body, got) in bodies.iter().zip(&together) {
            assert_well_formed(&got.events);
            let end = terminal(&got.events);
            assert_eq!(end["type"], "end", "{body}: {end:?}");
        }
        assert_eq!(text(&together[0].events), long_alone, "{}", bodies[0]);
        for k in 0..shorts.len() {
            let got = &together[k + 1].events;
            assert_eq!(terminal(got)["tokens_out"], max_tokens, "{}", bodies[k + 1]);
            short_texts.push((k, bodies[k + 1].clone(), text(got)));
        }
        let health = get(addr, "/health").unwrap();
        assert_eq!(health.status, 200, "{}", health.text());
        assert_eq!(health.json()["state"], "ready");
        let first = together[1].at < together[0].at && together[2].at < together[0].at;
        short_first.push(first);
        if !first {
            break;
        }
    }
    eprintln!("short jobs ended before the long one, by max_tokens in SWEEP: {short_first:?}");
    assert!(
        short_first[0] && short_first.last() == Some(&false),
        "the sweep did not cross the long prefill's end: {short_first:?}"
    );
    // Each short prompt alone, at the most tokens the sweep gave it (not SWEEP's last, 2,048,
    // whose decodes took most of the test): greedy, a job of fewer tokens writes its beginning.
    let most = SWEEP[short_first.len() - 1];
    let shorts_alone: Vec<String> = shorts
        .iter()
        .map(|prompt| text(&run(addr, &greedy("alone", prompt, most))))
        .collect();
    for (k, body, got) in &short_texts {
        assert!(shorts_alone[*k].starts_with(got), "{body}: {got:?}");
    }
}

/// A long greedy job.
fn long_job(id: &str) -> Value {
    greedy(id, "The capital of France is", 2000)
}

/// The step after which the engine panics: the two running jobs are far into their decode, and
/// the third has long been queued.
const PANIC_STEP: u32 = 400;
/// `--shutdown-grace-sec`.
const GRACE: Duration = Duration::from_secs(2);

#[test]
fn a_forced_engine_panic_fails_the_worker_ends_every_job_once_and_exits_1() {
    let _serial = serial();
    let grace = GRACE.as_secs().to_string();
    let step = PANIC_STEP.to_string();
    let mut worker = Worker::spawn_with_env(
        &Model::SmolLm2.path(),
        &["--parallel", "2", "--shutdown-grace-sec", &grace],
        &[("LLORCH_TEST_ENGINE_PANIC", &step)],
    );
    worker.wait_ready();
    let addr = worker.addr;
    let mut streams: Vec<EventStream> = ["a", "b", "queued"]
        .iter()
        .map(|id| EventStream::open(addr, "/execute", &long_job(id)).unwrap())
        .collect();
    let positions: Vec<Value> = streams
        .iter_mut()
        .map(|s| s.next_event().unwrap().data["queue_position"].clone())
        .collect();
    assert_eq!(
        positions,
        [json!(0), json!(0), json!(1)],
        "two running, one queued"
    );
    let mut failed_at = None;
    for stream in streams {
        let events = stream.collect();
        let ends: Vec<&SseEvent> = events
            .iter()
            .filter(|e| e.event == "end" || e.event == "error")
            .collect();
        assert_eq!(ends.len(), 1, "one terminal event: {events:?}");
        let error = &ends[0].data;
        assert_eq!(
            (error["code"].as_str(), error["retriable"].as_bool()),
            (Some("INTERNAL"), Some(true)),
            "{error}"
        );
        // The worker failed before any job heard of it.
        let health = get(addr, "/health").unwrap();
        let body = health.json();
        assert_eq!(health.status, 503, "{body}");
        assert_eq!(body["state"], "failed", "{body}");
        assert_eq!(body["last_error"]["code"], "INTERNAL", "{body}");
        let message = body["last_error"]["message"].as_str().unwrap();
        assert!(message.contains("LLORCH_TEST_ENGINE_PANIC"), "{message}");
        failed_at.get_or_insert_with(Instant::now);
    }
    let refused = post_json(addr, "/execute", &long_job("late")).unwrap();
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert_eq!(refused.json()["error"]["code"], "WORKER_NOT_READY");
    let status = worker
        .wait_exit(GRACE + Duration::from_secs(20))
        .expect("the failed worker did not exit");
    let waited = failed_at.unwrap().elapsed();
    assert_eq!(status.code(), Some(1), "{:?}", worker.log_lines());
    assert!(
        waited + Duration::from_millis(500) >= GRACE,
        "exited {waited:?} after the failure, before the grace"
    );
    let logged = worker
        .logs()
        .into_iter()
        .filter(|line| line["event"] == "error" && line["code"] == "INTERNAL")
        .count();
    assert!(logged >= 2, "the panic and the exit are logged as INTERNAL");
}
