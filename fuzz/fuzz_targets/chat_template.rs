//! Compiles an arbitrary chat template and renders it with a sample conversation, as a worker
//! does at load and per request: first in a renderer process (this fuzzer's own executable,
//! started again with the renderer variable set, as a worker does), where the heap cap and
//! deadline stop templates that grow a value without bound; then, unless the renderer stopped
//! it at a budget, again in this process, where libFuzzer sees the template engine's coverage.
//! Both must give the same answer. Hostile templates must fail with an error, never hang, crash
//! or exhaust memory: the fuel budget, recursion limit and output cap of `template.rs` and the
//! renderer's heap cap and deadline bound every render, and libFuzzer's `-timeout` and
//! `-rss_limit_mb` turn a miss into a crash.
//!
//! Input: byte 0 holds flags (bit 0 `add_generation_prompt`, bits 1-2 the conversation, bit 3
//! `add_bos`/`add_eos`), the rest is the template (lossy UTF-8).

#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use worker_common::tokenizer::render_process::{
    BudgetAllocator, TemplateProcess, serve_if_renderer,
};
use worker_common::tokenizer::template::{
    ChatMessage, ChatTemplate, MAX_RENDER_BYTES, TemplateError,
};

#[global_allocator]
static ALLOCATOR: BudgetAllocator = BudgetAllocator;

/// The renderer's heap cap here: smaller than a worker's (512 MiB), so that growing templates
/// end sooner, and far below `-rss_limit_mb` for the render repeated in this process.
const MEMORY_CAP: usize = 128 << 20;

/// One renderer process for the whole run (a new one after each render that kills it).
fn renderer() -> &'static TemplateProcess {
    static RENDERER: OnceLock<TemplateProcess> = OnceLock::new();
    RENDERER.get_or_init(
        || match TemplateProcess::start_capped("", "<s>", "</s>", MEMORY_CAP) {
            Ok(renderer) => renderer,
            Err(err) => panic!("the renderer does not start: {err}"),
        },
    )
}

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

/// The renderer's answer: the text, or why the template failed. The renderer crashing (a
/// panic, a stack overflow, a sanitizer report) or not starting is a bug.
fn in_renderer(source: &str, messages: &[ChatMessage], flags: u8) -> Result<String, TemplateError> {
    let (add_generation_prompt, add) = (flags & 1 != 0, flags & 8 != 0);
    let answer = renderer()
        .replace_template(source, "<s>", "</s>")
        .and_then(|()| renderer().render_prompt(messages, add_generation_prompt, add, add));
    if let Err(err @ TemplateError::Process(_)) = &answer {
        panic!("{err}");
    }
    answer
}

/// The same compile and render in this process.
fn in_process(source: &str, messages: &[ChatMessage], flags: u8) -> Result<String, TemplateError> {
    let (add_generation_prompt, add) = (flags & 1 != 0, flags & 8 != 0);
    ChatTemplate::new(source, "<s>", "</s>")?.render_prompt(
        messages,
        add_generation_prompt,
        add,
        add,
    )
}

fuzz_target!(
    init: {
        // First, so that a panic the renderer catches (MiniJinja's compiler) does not abort it.
        report_panics_only();
        // The renderer this target starts is this executable: it serves renders and exits here.
        serve_if_renderer();
    },
    |data: &[u8]| {
        let [flags, source @ ..] = data else {
            return;
        };
        let source = String::from_utf8_lossy(source);
        let messages = conversation(flags >> 1);
        let outside = in_renderer(&source, &messages, *flags);
        if let Ok(text) = &outside {
            assert!(text.len() <= MAX_RENDER_BYTES, "{} bytes", text.len());
        }
        if matches!(outside, Err(TemplateError::Budget(_))) {
            return;
        }
        let inside = in_process(&source, &messages, *flags);
        assert_eq!(format!("{inside:?}"), format!("{outside:?}"), "in and out of process");
    }
);
