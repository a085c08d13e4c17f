//! The queue against clients that misbehave, on the real worker binary (`LLORCH_TEST_WORKER`,
//! default `llorch-cpud`) on SmolLM2: clients that leave while their job waits give its place
//! back at once, and a cancel that arrives before its job is applied when the job comes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use llorch_tests::http::{self, EventStream, get};
use llorch_tests::stream::{job, open, run, terminal};
use llorch_tests::worker::{serial, smollm2};
use serde_json::{Value, json};

/// A job that keeps generating until cancelled.
fn long_job(id: &str) -> Value {
    job(
        id,
        "1, 2, 3, 4, 5, 6,",
        json!({"raw": true, "temperature": 0, "max_tokens": 2048, "ignore_eos": true}),
    )
}

/// The value of the unlabelled metric `name` in a /metrics text.
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn clients_that_leave_while_queued_free_their_places_at_once() {
    let _serial = serial();
    let worker = smollm2(&["--parallel", "1", "--queue-depth", "4"]);
    let mut running = open(worker.addr, &long_job("running"));
    assert_eq!(running.next_event().unwrap().event, "started");

    // Sixteen clients arrive together, see `started` (or a full queue) and leave.
    let leavers: Vec<_> = (0..16)
        .map(|i| {
            let addr = worker.addr;
            std::thread::spawn(move || {
                let mut stream =
                    EventStream::open(addr, "/execute", &long_job(&format!("gone-{i}"))).unwrap();
                if stream.status == 200 {
                    assert_eq!(stream.next_event().unwrap().event, "started");
                }
                stream.status
            })
        })
        .collect();
    let statuses: Vec<u16> = leavers.into_iter().map(|t| t.join().unwrap()).collect();
    // At least the queue's four places were taken (more when a leaver's place came free first).
    let accepted = statuses.iter().filter(|&&s| s == 200).count();
    assert!(accepted >= 4, "{statuses:?}");
    assert!(
        statuses.iter().all(|&s| s == 200 || s == 503),
        "{statuses:?}"
    );

    // Within a second the queue holds none of them: the next client gets a place.
    let deadline = Instant::now() + Duration::from_secs(1);
    let waiting = loop {
        let text = get(worker.addr, "/metrics").unwrap().text();
        let waiting = metric(&text, "worker_sequences_waiting").unwrap();
        if waiting == 0.0 || Instant::now() > deadline {
            break waiting;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(waiting, 0.0, "dead clients still hold queue places");
    let mut next = open(worker.addr, &long_job("next"));
    let started = next.next_event().unwrap();
    assert_eq!(started.data["queue_position"], 1, "{:?}", started.data);

    http::post_empty(worker.addr, "/cancel/running").unwrap();
    http::post_empty(worker.addr, "/cancel/next").unwrap();
    assert_eq!(terminal(&running.collect())["code"], "CANCELLED");
    assert_eq!(terminal(&next.collect())["code"], "CANCELLED");
    let events = run(worker.addr, &job("after", "Hi", json!({"max_tokens": 3})));
    assert_eq!(terminal(&events)["type"], "end");
}

#[test]
fn a_cancel_sent_before_the_job_arrives_cancels_it() {
    let _serial = serial();
    let worker = smollm2(&[]);
    let response = http::post_empty(worker.addr, "/cancel/early").unwrap();
    assert_eq!(response.status, 202);
    let events = run(worker.addr, &long_job("early"));
    assert_eq!(events[0].event, "started");
    let end = terminal(&events);
    assert_eq!(
        (end["type"].as_str(), end["code"].as_str()),
        (Some("error"), Some("CANCELLED")),
        "{end}"
    );
    assert_eq!(events.iter().filter(|e| e.event == "token").count(), 0);

    // Applied once: the same id later runs.
    let events = run(worker.addr, &job("early", "Hi", json!({"max_tokens": 3})));
    assert_eq!(terminal(&events)["type"], "end");
}
