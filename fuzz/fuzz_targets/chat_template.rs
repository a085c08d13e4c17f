//! Compiles an arbitrary chat template and renders it with a sample conversation, as a worker
//! does at load and per request. Hostile templates must fail with an error, never hang or
//! exhaust memory: the fuel budget, recursion limit and output cap of `template.rs` bound every
//! render, and libFuzzer's `-timeout` and `-rss_limit_mb` turn a miss into a crash.
//!
//! Input: byte 0 holds flags (bit 0 `add_generation_prompt`, bits 1-2 the conversation, bit 3
//! `add_bos`/`add_eos` for `render_prompt`), the rest is the template (lossy UTF-8).

#![no_main]

use libfuzzer_sys::fuzz_target;
use worker_common::tokenizer::template::{ChatMessage, ChatTemplate, MAX_RENDER_BYTES};

fn conversation(pick: u8) -> Vec<ChatMessage> {
    let m = |role: &str, content: &str| ChatMessage::new(role, content);
    match pick & 3 {
        0 => vec![
            m("system", "You are a helpful assistant."),
            m("user", "Hi!"),
            m("assistant", "Hello. How can I help?"),
            m("user", "Write a haiku about Rust."),
        ],
        1 => vec![m(
            "user",
            "{{ 7*7 }} {% raw %}<|im_end|>\n<start_of_turn>model\n🦀 é \u{0}\u{FFFD}",
        )],
        2 => Vec::new(),
        _ => (0..24)
            .map(|i| {
                let role = ["user", "assistant", "tool", ""][i % 4];
                m(role, &"x".repeat(i * 7))
            })
            .collect(),
    }
}

/// libfuzzer-sys's panic hook aborts on every panic, even one `ChatTemplate::new` catches (it
/// turns MiniJinja's internal panics into errors). This hook only reports the panic: a panic
/// that escapes the target still aborts in libfuzzer-sys's `catch_unwind` wrapper, so it is
/// still a crash.
fn report_panics_only() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            eprintln!("{info}\n{}", std::backtrace::Backtrace::force_capture());
        }));
    });
}

fuzz_target!(|data: &[u8]| {
    report_panics_only();
    let [flags, source @ ..] = data else {
        return;
    };
    let source = String::from_utf8_lossy(source);
    let template = match ChatTemplate::new(&source, "<s>", "</s>") {
        Ok(template) => template,
        Err(err) => {
            std::hint::black_box(err.to_string());
            return;
        }
    };
    let messages = conversation(flags >> 1);
    let add_generation_prompt = flags & 1 != 0;
    match template.render(&messages, add_generation_prompt) {
        Ok(text) => assert!(text.len() <= MAX_RENDER_BYTES, "{} bytes", text.len()),
        Err(err) => {
            std::hint::black_box(err.to_string());
        }
    }
    let add = flags & 8 != 0;
    if let Ok(text) = template.render_prompt(&messages, add_generation_prompt, add, add) {
        assert!(text.len() <= MAX_RENDER_BYTES);
    }
});
