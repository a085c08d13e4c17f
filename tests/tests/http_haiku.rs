//! The haiku test (M0-W-1800, made robust): Qwen2.5-Coder-1.5B through the real worker binary
//! writes a haiku that must contain the current UTC minute spelled out, which it cannot have
//! memorised. The transcript (SSE events as NDJSON, and the verification) goes to
//! `target/haiku/`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use llorch_tests::assets::Model;
use llorch_tests::http;
use llorch_tests::stream::{job, run, terminal, text};
use llorch_tests::worker::{Worker, worker_binary};
use serde_json::json;

const ONES: [&str; 20] = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
];
const TENS: [&str; 6] = ["", "", "twenty", "thirty", "forty", "fifty"];

/// 0..=59 in words: `twenty-nine`.
fn minute_word(minute: u64) -> String {
    let minute = (minute % 60) as usize;
    match (minute / 10, minute % 10) {
        (0 | 1, _) => ONES[minute].to_owned(),
        (tens, 0) => TENS[tens].to_owned(),
        (tens, ones) => format!("{}-{}", TENS[tens], ONES[ones]),
    }
}

/// Whether `text` holds `word` on word boundaries, case-insensitively, with its hyphen written
/// as a hyphen or a space.
fn contains_word(text: &str, word: &str) -> bool {
    let text = text.to_lowercase();
    let variants = [word.to_owned(), word.replace('-', " ")];
    variants.iter().any(|variant| {
        text.match_indices(variant.as_str()).any(|(at, found)| {
            let before = text[..at].chars().next_back();
            let after = text[at + found.len()..].chars().next();
            let boundary = |c: Option<char>| c.is_none_or(|c| !c.is_alphanumeric());
            boundary(before) && boundary(after)
        })
    })
}

fn unix_now() -> Duration {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap()
}

fn nonce() -> String {
    let mut state = unix_now().as_nanos() as u64 ^ u64::from(std::process::id()).rotate_left(32);
    (0..8)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            char::from(b"abcdefghijklmnopqrstuvwxyz0123456789"[(state >> 33) as usize % 36])
        })
        .collect()
}

fn transcript_dir() -> PathBuf {
    // target/<profile>/deps/<test> → target/haiku
    let exe = std::env::current_exe().unwrap();
    let target = exe
        .ancestors()
        .nth(3)
        .map(PathBuf::from)
        .unwrap_or_default();
    target.join("haiku")
}

fn tokens_out_total(worker: &Worker) -> u64 {
    let metrics = http::get(worker.addr, "/metrics").unwrap().text();
    metrics
        .lines()
        .find_map(|line| line.strip_prefix("tokens_out_total "))
        .and_then(|value| value.parse().ok())
        .expect("tokens_out_total")
}

#[test]
fn minute_words_are_spelled_out() {
    assert_eq!(minute_word(0), "zero");
    assert_eq!(minute_word(13), "thirteen");
    assert_eq!(minute_word(20), "twenty");
    assert_eq!(minute_word(29), "twenty-nine");
    assert_eq!(minute_word(59), "fifty-nine");
    assert!(contains_word("Twenty nine cores hum", "twenty-nine"));
    assert!(contains_word("at twenty-nine.", "twenty-nine"));
    assert!(!contains_word("seventy", "seven"));
    assert!(!contains_word("twenty-ninety", "twenty-nine"));
}

/// Haikus the test asks for before a missing word fails it: each is a new prompt (the minute's
/// word, a new nonce) and a new seed. One haiku in about thirty writes the number in digits
/// (specs/HTTP.md), so one attempt failed CI about once in thirty runs; three fail about once in
/// 30,000, while a worker that ignores the prompt still fails every time.
const ATTEMPTS: u32 = 3;

#[test]
fn qwen_writes_a_haiku_with_the_minute_word() {
    let worker = Worker::ready(&Model::Qwen15.path(), &threads());
    let dir = transcript_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let mut attempt = 0;
    loop {
        attempt += 1;
        let now = unix_now().as_secs();
        let minute = now / 60;
        let word = minute_word(minute);
        let prompt = format!(
            "Write a haiku about GPU computing that includes the word \"{word}\" (nonce: {})",
            nonce()
        );
        let before = tokens_out_total(&worker);
        let begun = Instant::now();
        let body = job("haiku", &prompt, sampling(now));
        let events = run(worker.addr, &body);
        let elapsed = begun.elapsed();
        let haiku = text(&events);
        let grew = tokens_out_total(&worker) > before;
        let found = contains_word(&haiku, &word);
        let verification = json!({
            "worker": worker_binary(), "attempt": attempt, "minute_word": word, "prompt": prompt,
            "seed": now, "haiku": haiku, "word_found": found, "tokens_out_total_grew": grew,
            "elapsed_ms": elapsed.as_millis() as u64, "end": terminal(&events),
        });
        let ndjson: String = events.iter().map(|e| format!("{}\n", e.data)).collect();
        std::fs::write(
            dir.join(format!("{}-events.ndjson", worker_binary())),
            ndjson,
        )
        .unwrap();
        let report = serde_json::to_string_pretty(&verification).unwrap();
        std::fs::write(
            dir.join(format!("{}-verification.json", worker_binary())),
            &report,
        )
        .unwrap();
        eprintln!("{report}");
        if !found && attempt < ATTEMPTS {
            continue;
        }
        assert_eq!(terminal(&events)["type"], "end");
        assert!(found, "\"{word}\" not in the haiku: {haiku:?}");
        assert!(grew, "tokens_out_total did not grow");
        assert!(elapsed < Duration::from_secs(30), "took {elapsed:?}");
        return;
    }
}

/// The temperature 0.7, seed and max_tokens, with llama.cpp server's default truncation
/// (top-k 40, top-p 0.95, min-p 0.05), which is what a llama.cpp user sending temperature 0.7
/// gets. Without it the 152k-token tail sometimes turns the word into digits ("11"): measured
/// 26 of 28 haikus with the word, against 32 of 33 with it (specs/HTTP.md).
fn sampling(seed: u64) -> serde_json::Value {
    json!({
        "temperature": 0.7, "seed": seed, "max_tokens": 100,
        "top_k": 40, "top_p": 0.95, "min_p": 0.05,
    })
}

/// Both cores for the CPU worker: the 1.5B model is the slowest the tests run.
fn threads() -> Vec<&'static str> {
    if worker_binary() == "llorch-cpud" {
        vec!["--threads", "2"]
    } else {
        Vec::new()
    }
}
