//! A storm of jobs on the real worker binary (`LLORCH_TEST_WORKER`, default `llorch-cpud`) on
//! SmolLM2: 500 jobs from 16 clients, each one stays to the end, cancels at a random moment,
//! disconnects at a random moment, or is cancelled before it is sent. Every client that stays
//! sees exactly one terminal event, the next job succeeds, and the worker's memory returns to its
//! warm baseline.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;

use llorch_tests::http::{self, EventStream};
use llorch_tests::stream::{assert_well_formed, job, open};
use llorch_tests::worker::{serial, smollm2};
use serde_json::json;

const JOBS: usize = 500;
/// Jobs of the storm that warms the worker before its baseline.
const WARM_JOBS: usize = 64;
const CLIENTS: usize = 16;

/// What one client does with its job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Act {
    Stay,
    CancelAfter(usize),
    LeaveAfter(usize),
    CancelFirst,
}

/// xorshift64: the storm is the same on every run.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

fn act(state: &mut u64) -> Act {
    let events = (next(state) % 6) as usize;
    match next(state) % 20 {
        0..=9 => Act::Stay,
        10..=14 => Act::CancelAfter(events),
        15..=18 => Act::LeaveAfter(events),
        _ => Act::CancelFirst,
    }
}

fn body(id: &str, i: usize) -> serde_json::Value {
    let prompt = format!("Item {i}: the weather in city number {} is", i % 37);
    json!({"raw": true, "temperature": 0.7, "seed": i, "max_tokens": 12 + i % 9})
        .as_object()
        .map(|extra| job(id, &prompt, serde_json::Value::Object(extra.clone())))
        .unwrap()
}

/// Runs one job as `act` says; returns whether the client stayed to see its terminal event.
fn run_one(addr: SocketAddr, i: usize, act: Act) -> bool {
    let id = format!("storm-{i}");
    if act == Act::CancelFirst {
        http::post_empty(addr, &format!("/cancel/{id}")).unwrap();
    }
    let mut stream = EventStream::open(addr, "/execute", &body(&id, i)).unwrap();
    let status = stream.status;
    if status != 200 {
        panic!("{id}: {status} {}", stream.rest());
    }
    let mut events = Vec::new();
    loop {
        match act {
            Act::CancelAfter(n) if events.len() == n => {
                http::post_empty(addr, &format!("/cancel/{id}")).unwrap();
            }
            Act::LeaveAfter(n) if events.len() == n => return false,
            _ => {}
        }
        match stream.next_event() {
            Some(event) => events.push(event),
            None => break,
        }
    }
    assert_well_formed(&events);
    let terminal = &events[events.len() - 1];
    if act == Act::CancelFirst {
        assert_eq!(
            terminal.data["code"], "CANCELLED",
            "{id}: {:?}",
            terminal.data
        );
    }
    if terminal.event == "error" {
        assert_eq!(
            terminal.data["code"], "CANCELLED",
            "{id}: {:?}",
            terminal.data
        );
    }
    true
}

/// `jobs` jobs numbered from `first`, from [`CLIENTS`] clients at once, each with its
/// client's next [`act`]; returns how many stayed to the end.
fn storm(addr: SocketAddr, first: usize, jobs: usize) -> usize {
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            std::thread::spawn(move || {
                let mut state = 0x9E37_79B9_7F4A_7C15 ^ ((first + c) as u64 + 1);
                let mut stayed = 0;
                for i in (c..jobs).step_by(CLIENTS) {
                    stayed += usize::from(run_one(addr, first + i, act(&mut state)));
                }
                stayed
            })
        })
        .collect();
    clients.into_iter().map(|t| t.join().unwrap()).sum()
}

#[test]
fn five_hundred_jobs_with_random_cancels_and_disconnects() {
    let _serial = serial();
    let worker = smollm2(&[
        "--parallel",
        "4",
        "--queue-depth",
        "64",
        "--ctx-size",
        "512",
        "--kv-cache-mb",
        "16",
        "--threads",
        "2",
    ]);
    let addr = worker.addr;
    // Warm: every page of the small pool written once, then a small storm of the same mix, so
    // that the threads, buffers and allocator arenas the cancel and disconnect paths use have
    // grown before the baseline (after plain jobs alone it moved by 1–5 % between runs).
    let warm: Vec<_> = (0..32)
        .map(|i| std::thread::spawn(move || run_one(addr, 10_000 + i, Act::Stay)))
        .collect();
    warm.into_iter().for_each(|t| assert!(t.join().unwrap()));
    storm(addr, 20_000, WARM_JOBS);
    let baseline = worker.rss_bytes();

    let stayed = storm(addr, 0, JOBS);
    eprintln!("{stayed} of {JOBS} clients stayed to the end");

    let after = open(
        addr,
        &job(
            "after",
            "The capital of France is",
            json!({"raw": true, "max_tokens": 4}),
        ),
    )
    .collect();
    assert_eq!(after.last().unwrap().event, "end", "{after:?}");
    let health = http::get(addr, "/health").unwrap().json();
    assert_eq!(health["slots_busy"], 0, "{health}");
    assert_eq!(health["queue_len"], 0, "{health}");
    let rss = worker.rss_bytes();
    let growth = rss as f64 / baseline as f64 - 1.0;
    eprintln!(
        "RSS warm {baseline} B, after the storm {rss} B ({:+.2} %)",
        growth * 100.0
    );
    assert!(growth < 0.05, "RSS grew {:.2} %", growth * 100.0);
}
