//! OpenAI's API as users reach it: the official `openai` Python SDK (pinned in
//! `scripts/requirements-sdk.txt`, installed by `scripts/fetch-assets.sh python`) drives the
//! real worker on Qwen2.5-Coder-0.5B through `tests/openai/sdk_check.py`: chat and completions,
//! streamed and whole, usage, seeds, errors, and equality with `/execute`. Anthropic's SDK
//! drives `/v1/messages` the same way (`tests/openai/messages_check.py`), and the `openai` SDK
//! OpenAI's `/v1/responses` (`tests/openai/responses_check.py`); LangChain, LiteLLM and
//! instructor drive OpenAI's API as their users do (`tests/openai/clients_check.py`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

use llorch_tests::assets::{Model, python_sdk};
use llorch_tests::worker::{Worker, serial};

/// Runs `tests/openai/<script>` against `worker` with the SDK on the path (and the worker's API
/// key, if any, in `LLORCH_TEST_API_KEY`); returns its output and fails the test when it fails.
fn run_python(script: &str, worker: &Worker, args: &[&str], key: Option<&str>) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("openai")
        .join(script);
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let output = Command::new(&python)
        .arg(&script)
        .arg(format!("http://{}", worker.addr))
        .args(args)
        .env("PYTHONPATH", python_sdk())
        .env("LLORCH_TEST_API_KEY", key.unwrap_or("none"))
        .output()
        .unwrap_or_else(|err| panic!("cannot run {python}: {err}"));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stdout}");
    assert!(
        output.status.success(),
        "{} failed ({}):\n{stdout}\n{stderr}",
        script.display(),
        output.status
    );
    stdout
}

#[test]
fn the_official_openai_sdk_drives_the_worker() {
    let _serial = serial();
    let worker = Worker::ready(
        &Model::Qwen05.path(),
        &["--threads", "2", "--ctx-size", "1024"],
    );
    let stdout = run_python("sdk_check.py", &worker, &[], None);
    assert!(stdout.contains("every check passed"), "{stdout}");
}

/// 50 requests (five schemas: nested objects, enums, arrays, numbers) at T = 0.8, eight at a
/// time, on SmolLM2 and Qwen2.5-Coder-0.5B: every reply is JSON valid against its schema.
#[test]
fn structured_output_follows_its_json_schema() {
    let _serial = serial();
    for model in [Model::SmolLm2, Model::Qwen05] {
        let worker = Worker::ready(&model.path(), &["--threads", "2", "--parallel", "8"]);
        let stdout = run_python("structured_check.py", &worker, &["10"], None);
        assert!(stdout.contains("all 50 replies valid"), "{stdout}");
    }
}

/// The four checks that need Qwen2.5-Coder-1.5B (a model whose template renders tools), at once
/// against one worker (2,048-token contexts, four decoded together, an API key): each reply is
/// the same bits whatever runs beside it (specs/CPU_NUMERICS.md), so running them together checks
/// what running them one by one would, in about the time of the slowest.
///
/// - `tools_check.py`: two functions; a weather question gets a parsed, valid `get_weather` call
///   (whole and streamed), a named `tool_choice` forces a valid one at T = 0.8, and the tool's
///   answer in a follow-up turn becomes text.
/// - `messages_check.py`: Anthropic's Messages API as its users reach it, through the official
///   `anthropic` SDK (pinned in `scripts/requirements-sdk.txt`) with the key sent as `x-api-key`:
///   `messages.create` and `messages.stream`, stop sequences, a tool round trip, errors, every
///   reply and event validated against the SDK's types.
/// - `responses_check.py`: OpenAI's Responses API through the official `openai` SDK:
///   `responses.create` (instructions, usage, a `max_output_tokens` cut), `responses.parse` with
///   a pydantic `text_format`, a forced function call answered by resending the items and
///   through `previous_response_id`, `responses.stream` (text and a call's arguments), errors.
/// - `clients_check.py`: three third-party clients, offline: LangChain's `ChatOpenAI` (`invoke`,
///   `stream`, and a prompt over the context raising its `ContextOverflowError`),
///   `litellm.completion` (whole, streamed, and `ContextWindowExceededError`), and `instructor`
///   in its TOOLS mode (`create` and `create_iterable` returning a validated pydantic model).
#[test]
fn tools_messages_responses_and_third_party_clients_drive_one_worker_at_once() {
    const KEY: &str = "qwen15-checks-key";
    let _serial = serial();
    let worker = Worker::ready(
        &Model::Qwen15.path(),
        &[
            "--threads",
            "2",
            "--ctx-size",
            "2048",
            "--parallel",
            "4",
            "--api-key",
            KEY,
        ],
    );
    let worker = &worker;
    let checks = [
        ("tools_check.py", vec![]),
        ("messages_check.py", vec![KEY]),
        ("responses_check.py", vec![]),
        ("clients_check.py", vec![]),
    ];
    std::thread::scope(|scope| {
        let runs: Vec<_> = checks
            .iter()
            .map(|(script, args)| {
                (
                    script,
                    scope.spawn(move || run_python(script, worker, args, Some(KEY))),
                )
            })
            .collect();
        for (script, run) in runs {
            let stdout = run
                .join()
                .unwrap_or_else(|_| panic!("{script} failed (its output is above)"));
            assert!(stdout.contains("every check passed"), "{script}: {stdout}");
        }
    });
}

/// `logprobs` at T = 0 through the worker against a log-softmax of the logits the CPU backend
/// computes in this process for the same prompt: the chosen token is the argmax, and its
/// log-probability and the top five are the log-softmax's, to rounding.
#[test]
fn logprobs_are_the_log_softmax_of_our_own_logits() {
    use backend_cpu::{CpuBackend, CpuOptions};
    use llorch_tests::invariance::{Harness, chunk, pages};
    use llorch_tests::{assets, http};
    use serde_json::json;
    use worker_common::backend::{PAGE_SIZE, Want};

    let _serial = serial();
    let prompt = "The three primary colors are";
    let worker = Worker::ready(&Model::Qwen05.path(), &["--threads", "2"]);
    let body = json!({"prompt": prompt, "max_tokens": 1, "temperature": 0, "logprobs": 5,
        "return_tokens_as_token_ids": true});
    let response = http::post_json(worker.addr, "/v1/completions", &body).unwrap();
    assert_eq!(
        response.status,
        200,
        "{}",
        String::from_utf8_lossy(&response.body)
    );
    let reply: serde_json::Value = serde_json::from_slice(&response.body).unwrap();
    drop(worker);
    let logprobs = &reply["choices"][0]["logprobs"];
    let id = |name: &str| -> usize { name.trim_start_matches("token_id:").parse().unwrap() };
    let chosen = id(logprobs["tokens"][0].as_str().unwrap());
    let chosen_logprob = logprobs["token_logprobs"][0].as_f64().unwrap();
    let top: Vec<(usize, f64)> = logprobs["top_logprobs"][0]
        .as_object()
        .unwrap()
        .iter()
        .map(|(name, logprob)| (id(name), logprob.as_f64().unwrap()))
        .collect();

    let (backend, tokenizer) =
        assets::load::<CpuBackend>(Model::Qwen05, &CpuOptions { threads: 2 }, 256, None);
    let ids = tokenizer.encode(prompt, true, true).unwrap();
    let table = pages(&(0..ids.len().div_ceil(PAGE_SIZE) as u32).collect::<Vec<_>>());
    let mut harness = Harness::new(backend);
    let (_, logits) = harness
        .step(&[chunk(&ids, 0, &table, Want::Logits)])
        .remove(0);
    let max = logits
        .iter()
        .fold(f64::NEG_INFINITY, |m, &l| m.max(f64::from(l)));
    let sum: f64 = logits.iter().map(|&l| (f64::from(l) - max).exp()).sum();
    let log_softmax = |i: usize| f64::from(logits[i]) - max - sum.ln();
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));

    assert_eq!(chosen, order[0], "the greedy token is the argmax");
    assert!(
        (chosen_logprob - log_softmax(chosen)).abs() < 1e-9,
        "{chosen_logprob}"
    );
    let mut top_ids: Vec<usize> = top.iter().map(|&(i, _)| i).collect();
    let mut expected: Vec<usize> = order[..5].to_vec();
    top_ids.sort_unstable();
    expected.sort_unstable();
    assert_eq!(top_ids, expected, "the five most probable tokens");
    for (i, logprob) in top {
        assert!(
            (logprob - log_softmax(i)).abs() < 1e-9,
            "token {i}: {logprob} vs {}",
            log_softmax(i)
        );
    }
}

/// The token ids and finish reason of a `/v1/completions` (or chat) request with `extra`
/// fields, greedy unless `extra` says otherwise.
fn sampled(addr: std::net::SocketAddr, path: &str, extra: serde_json::Value) -> (Vec<u32>, String) {
    let mut body = serde_json::json!({"temperature": 0, "logprobs": 0,
        "return_tokens_as_token_ids": true});
    if path.ends_with("chat/completions") {
        body["logprobs"] = true.into();
    }
    for (key, value) in extra.as_object().unwrap() {
        body[key] = value.clone();
    }
    let response = llorch_tests::http::post_json(addr, path, &body).unwrap();
    assert_eq!(
        response.status,
        200,
        "{}",
        String::from_utf8_lossy(&response.body)
    );
    let reply: serde_json::Value = serde_json::from_slice(&response.body).unwrap();
    let choice = &reply["choices"][0];
    let names: Vec<&str> = match choice["logprobs"]["tokens"].as_array() {
        Some(tokens) => tokens.iter().map(|t| t.as_str().unwrap()).collect(),
        None => choice["logprobs"]["content"]
            .as_array()
            .unwrap()
            .iter()
            .map(|entry| entry["token"].as_str().unwrap())
            .collect(),
    };
    let ids = names
        .iter()
        .map(|name| name.trim_start_matches("token_id:").parse().unwrap())
        .collect();
    (ids, choice["finish_reason"].as_str().unwrap().to_owned())
}

/// How often the most frequent id occurs.
fn most_repeats(ids: &[u32]) -> usize {
    ids.iter()
        .map(|id| ids.iter().filter(|other| *other == id).count())
        .max()
        .unwrap_or(0)
}

/// Each sampling parameter the OpenAI work added changes what a real model says the way it
/// should, through the worker: logit bias, frequency and presence penalties, the penalty
/// window, min_tokens.
#[test]
fn sampling_parameters_change_what_the_model_says() {
    use serde_json::json;

    let _serial = serial();
    let worker = Worker::ready(&Model::SmolLm2.path(), &["--threads", "2"]);
    let completions = "/v1/completions";
    let looping = json!({"prompt": "1, 1, 1, 1, 1, 1, 1, 1, 1, 1,", "max_tokens": 16});
    let with = |extra: serde_json::Value| {
        let mut body = looping.clone();
        for (key, value) in extra.as_object().unwrap() {
            body[key] = value.clone();
        }
        sampled(worker.addr, completions, body)
    };
    let (plain, _) = with(json!({}));
    assert!(
        most_repeats(&plain) >= 5,
        "the prompt makes the model loop: {plain:?}"
    );

    let favourite = plain[0];
    let (banned, _) = with(json!({"logit_bias": {favourite.to_string(): -100}}));
    assert!(
        !banned.contains(&favourite),
        "a -100 bias bans {favourite}: {banned:?}"
    );
    let forced_id = 1000;
    let (forced, _) = with(json!({"logit_bias": {forced_id.to_string(): 100}}));
    assert!(
        forced.iter().all(|&id| id == forced_id),
        "a +100 bias forces {forced_id}: {forced:?}"
    );

    let (frequent, _) = with(json!({"frequency_penalty": 2.0}));
    assert!(
        most_repeats(&frequent) < most_repeats(&plain),
        "a frequency penalty breaks the loop: {frequent:?} vs {plain:?}"
    );
    // A loop's logits lead by more than a presence penalty can take (it counts once); a story's
    // do not.
    let story = json!({"prompt": "Once upon a time, in a village by the sea,", "max_tokens": 24});
    let distinct = |ids: &[u32]| ids.iter().collect::<std::collections::BTreeSet<_>>().len();
    let (told, _) = sampled(worker.addr, completions, story.clone());
    let mut present = story;
    present["presence_penalty"] = json!(2.0);
    let (varied, _) = sampled(worker.addr, completions, present);
    assert!(
        varied != told && distinct(&varied) >= distinct(&told),
        "a presence penalty varies the story: {varied:?} vs {told:?}"
    );

    let (repeat, _) = with(json!({"repetition_penalty": 2.0}));
    assert_ne!(repeat, plain, "a repetition penalty changes the loop");
    let (windowless, _) = with(json!({"repetition_penalty": 2.0, "repeat_last_n": 0}));
    assert_eq!(windowless, plain, "repeat_last_n 0 turns penalties off");
    let (short_window, _) = with(json!({"repetition_penalty": 2.0, "repeat_last_n": 1}));
    assert_ne!(
        short_window, repeat,
        "a one-id window penalises less than the whole history"
    );

    let chat = "/v1/chat/completions";
    let brief = json!({"messages": [{"role": "user", "content": "Say OK and nothing else."}],
        "max_tokens": 24});
    let (short, finish) = sampled(worker.addr, chat, brief.clone());
    assert_eq!(finish, "stop", "the model ends its answer: {short:?}");
    let mut at_least = brief;
    at_least["min_tokens"] = json!(short.len() + 5);
    let (longer, _) = sampled(worker.addr, chat, at_least);
    assert!(
        longer.len() >= short.len() + 5 && longer.starts_with(&short),
        "min_tokens holds the end back: {longer:?} vs {short:?}"
    );
}

/// `/health`'s `slots_busy`.
fn busy(worker: &Worker) -> u64 {
    let health = llorch_tests::http::get(worker.addr, "/health").unwrap();
    let health: serde_json::Value = serde_json::from_slice(&health.body).unwrap();
    health["slots_busy"].as_u64().unwrap()
}

/// Waits up to `seconds` for `slots_busy` to be `want`.
fn wait_busy(worker: &Worker, want: u64, seconds: u64) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(seconds);
    while std::time::Instant::now() < deadline {
        if busy(worker) == want {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    false
}

/// A client that closes its connection mid-job cancels it, whole or streamed, and its slot is
/// free at once (well before its 2,000 tokens).
#[test]
fn a_client_that_leaves_cancels_its_v1_job() {
    use std::io::Write;

    let _serial = serial();
    let worker = Worker::ready(&Model::SmolLm2.path(), &["--threads", "2"]);
    let long = serde_json::json!({"max_tokens": 2000, "ignore_eos": true});
    for (path, stream) in [("/v1/completions", false), ("/v1/chat/completions", true)] {
        let mut body = long.clone();
        body["stream"] = stream.into();
        match path {
            "/v1/completions" => body["prompt"] = "Once upon a time".into(),
            _ => {
                body["messages"] = serde_json::json!([{"role": "user", "content": "Tell a story."}])
            }
        }
        let body = body.to_string();
        let mut connection = std::net::TcpStream::connect(worker.addr).unwrap();
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        connection.write_all(head.as_bytes()).unwrap();
        connection.write_all(body.as_bytes()).unwrap();
        assert!(wait_busy(&worker, 1, 30), "{path}: the job did not start");
        drop(connection);
        assert!(
            wait_busy(&worker, 0, 5),
            "{path}: the job still runs after its client left"
        );
    }
    let metrics = llorch_tests::http::get(worker.addr, "/metrics").unwrap();
    let metrics = String::from_utf8_lossy(&metrics.body).into_owned();
    assert!(
        metrics
            .lines()
            .any(|line| line.contains("cancel") && line.trim_end().ends_with(" 2")),
        "two cancelled jobs in /metrics:\n{metrics}"
    );
}
