//! Continuous batching against the real worker binary (`LLORCH_TEST_WORKER`, default
//! `llorch-cpud`) on SmolLM2: jobs decoded together give the tokens each gives alone, a shared
//! prefix is served from the KV cache, a cancel mid-batch leaves the others alone, and page
//! exhaustion preempts without losing a job.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Instant;

use llorch_tests::http::{self, EventStream, SseEvent};
use llorch_tests::stream::{assert_well_formed, job, open, run, terminal, text};
use llorch_tests::worker::{serial, smollm2, worker_binary};
use serde_json::{Value, json};

/// Runs every body at once, one client thread each; returns their events in body order.
fn run_together(addr: SocketAddr, bodies: &[Value]) -> Vec<Vec<SseEvent>> {
    let threads: Vec<_> = bodies
        .iter()
        .cloned()
        .map(|body| std::thread::spawn(move || run(addr, &body)))
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

fn metric(addr: SocketAddr, name: &str) -> f64 {
    let text = http::get(addr, "/metrics").unwrap().text();
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
}

fn health(addr: SocketAddr) -> Value {
    http::get(addr, "/health").unwrap().json()
}

/// Sixteen prompts, each with its own seed.
fn sampled_jobs(prefix: &str) -> Vec<Value> {
    (0..16)
        .map(|i| {
            job(
                &format!("{prefix}{i}"),
                &format!("Story {i}: once upon a time, a"),
                json!({"raw": true, "temperature": 0.8, "seed": 1000 + i, "max_tokens": 12}),
            )
        })
        .collect()
}

#[test]
fn sixteen_jobs_decoded_together_give_the_tokens_each_gives_alone() {
    let _serial = serial();
    let worker = smollm2(&["--parallel", "16"]);
    let addr = worker.addr;
    let alone: Vec<String> = sampled_jobs("alone")
        .iter()
        .map(|body| text(&run(addr, body)))
        .collect();
    let together = run_together(addr, &sampled_jobs("together"));
    for (i, events) in together.iter().enumerate() {
        assert_eq!(terminal(events)["type"], "end", "{:?}", terminal(events));
        assert_eq!(text(events), alone[i], "job {i}");
    }
    let health = health(addr);
    assert_eq!(
        (health["slots"].as_u64(), health["state"].as_str()),
        (Some(16), Some("ready"))
    );
    let batched = metric(addr, "worker_batch_size_sum") / metric(addr, "worker_batch_size_count");
    eprintln!("mean sequences per step over both runs: {batched:.2}");
    assert!(
        batched > 1.5,
        "the concurrent jobs were not batched: {batched}"
    );
}

/// About 1,000 tokens of text, the same for every job that shares it.
fn long_prefix() -> String {
    (0..250)
        .map(|i| format!("item {i} is "))
        .collect::<Vec<_>>()
        .concat()
}

fn first_token_ms(events: &[SseEvent]) -> f64 {
    terminal(events)["time_to_first_token_ms"].as_f64().unwrap()
}

#[test]
fn a_second_job_sharing_a_long_prefix_is_served_from_the_kv_cache() {
    let _serial = serial();
    let prefix = long_prefix();
    let body = |id: &str, tail: &str| {
        job(
            id,
            &format!("{prefix}{tail}"),
            json!({"raw": true, "temperature": 0, "max_tokens": 8}),
        )
    };
    let worker = smollm2(&["--threads", "2"]);
    let first = run(worker.addr, &body("first", "and the first"));
    let second = run(worker.addr, &body("second", "and the second"));
    let prompt_tokens = second[0].data["prompt_tokens"].as_u64().unwrap();
    let cached = terminal(&second)["cached_tokens"].as_u64().unwrap();
    let (cold, warm) = (first_token_ms(&first), first_token_ms(&second));
    eprintln!(
        "{}: prompt {prompt_tokens} tokens, {cached} from the cache; time to first token \
         {cold:.1} ms then {warm:.1} ms ({:.0} %)",
        worker_binary(),
        100.0 * warm / cold
    );
    assert!(prompt_tokens > 900, "{prompt_tokens}");
    assert_eq!(terminal(&first)["cached_tokens"], 0);
    assert!(cached >= 960, "only {cached} of {prompt_tokens} reused");
    assert_eq!(
        second[0].data["cached_tokens"].as_u64(),
        Some(cached),
        "announced on acceptance"
    );
    assert!(metric(worker.addr, "worker_prefix_cache_hit_tokens_total") >= cached as f64);
    drop(worker);
    let uncached = smollm2(&["--no-prefix-cache", "--threads", "2"]);
    run(uncached.addr, &body("first", "and the first"));
    let again = run(uncached.addr, &body("second", "and the second"));
    assert_eq!(terminal(&again)["cached_tokens"], 0);
    assert_eq!(text(&again), text(&second), "the cache changed the tokens");
}

#[test]
fn cancelling_one_job_mid_batch_leaves_the_others_unchanged_and_frees_its_pages() {
    let _serial = serial();
    let worker = smollm2(&["--parallel", "4"]);
    let addr = worker.addr;
    let body = |i: usize| {
        job(
            &format!("j{i}"),
            &format!("Count with me: {i}, {}, {},", i + 1, i + 2),
            json!({"raw": true, "temperature": 0, "max_tokens": 24}),
        )
    };
    let alone: Vec<String> = (0..3).map(|i| text(&run(addr, &body(i)))).collect();
    let idle_free = health(addr)["kv_pages_free"].as_u64().unwrap();
    let mut victim = open(
        addr,
        &json!({"job_id": "victim", "prompt": "1, 2, 3, 4,", "raw": true,
        "temperature": 0, "max_tokens": 2000}),
    );
    read_tokens(&mut victim, 2);
    let others =
        std::thread::spawn(move || run_together(addr, &(0..3).map(body).collect::<Vec<_>>()));
    read_tokens(&mut victim, 4);
    let response = http::post_empty(addr, "/cancel/victim").unwrap();
    assert_eq!(response.status, 202);
    let rest = victim.collect();
    assert_eq!(rest.last().unwrap().data["code"], "CANCELLED");
    for (i, events) in others.join().unwrap().iter().enumerate() {
        assert_eq!(text(events), alone[i], "job {i} changed");
    }
    let health = health(addr);
    assert_eq!(
        health["kv_pages_free"].as_u64(),
        Some(idle_free),
        "{health}"
    );
    assert_eq!(health["kv_pages_free"], health["kv_pages_total"]);
    assert_eq!(health["slots_busy"], 0);
}

fn read_tokens(stream: &mut EventStream, n: usize) {
    let mut seen = 0;
    while seen < n {
        let event = stream.next_event().expect("stream ended early");
        assert!(
            event.event != "end" && event.event != "error",
            "{:?}",
            event.data
        );
        seen += usize::from(event.event == "token");
    }
}

#[test]
fn two_hundred_jobs_on_a_small_kv_pool_all_end_once_with_preemptions_counted() {
    const MAX_TOKENS: u64 = 48;
    let _serial = serial();
    // 19 pages of 16 positions (SmolLM2: 360 KiB a page), 8 running. A job's prompt (8
    // tokens) takes one page and its 48 tokens three more: the eight jobs admitted together
    // hold 24 pages by their 32nd position, so preemption does not hang on timing (a job would
    // have to lag the others by 24 tokens to avoid it), and later waves, each job at its own
    // point, still want more than the pool on average.
    let worker = smollm2(&[
        "--ctx-size",
        "256",
        "--kv-cache-mb",
        "7",
        "--parallel",
        "8",
        "--queue-depth",
        "256",
        "--threads",
        "2",
    ]);
    let addr = worker.addr;
    let pages = health(addr)["kv_pages_total"].as_u64().unwrap();
    assert!((16..=22).contains(&pages), "{pages} pages");
    let begun = Instant::now();
    let bodies: Vec<Value> = (0..200)
        .map(|i| {
            let words: String = (0..3).map(|w| format!(" w{}", (i * 7 + w) % 50)).collect();
            job(
                &format!("p{i}"),
                &format!("Repeat:{words}"),
                json!({"raw": true, "temperature": 0.8, "seed": i, "max_tokens": MAX_TOKENS, "ignore_eos": true}),
            )
        })
        .collect();
    let threads: Vec<_> = bodies
        .iter()
        .cloned()
        .map(|body| std::thread::spawn(move || open(addr, &body).collect()))
        .collect();
    let mut texts = Vec::new();
    for thread in threads {
        let events: Vec<SseEvent> = thread.join().unwrap();
        texts.push(text(&events));
        assert_eq!(events.first().map(|e| e.event.as_str()), Some("started"));
        let terminals = events
            .iter()
            .filter(|e| e.event == "end" || e.event == "error")
            .count();
        assert_eq!(terminals, 1, "{events:?}");
        assert_eq!(terminal(&events)["type"], "end", "{:?}", terminal(&events));
        assert_eq!(terminal(&events)["tokens_out"], MAX_TOKENS);
        assert_well_formed(&events);
    }
    let preemptions = metric(addr, "worker_preemptions_total");
    eprintln!(
        "200 jobs in {:?}, {preemptions} preemptions",
        begun.elapsed()
    );
    assert!(preemptions > 0.0);
    assert_eq!(
        metric(addr, "worker_requests_total{outcome=\"success\"}"),
        200.0
    );
    let health = health(addr);
    assert_eq!(health["kv_pages_free"], health["kv_pages_total"]);
    // Preempted and re-prefilled or not, a job samples what it samples alone (every tenth
    // job, now run alone on the idle worker).
    for (i, body) in bodies.iter().enumerate().step_by(10) {
        assert_eq!(text(&run(addr, body)), texts[i], "job p{i}");
    }
}
