//! Rendering as jinja2 renders for Hugging Face, budgets, errors, and the tool keys.

use super::*;

/// ChatML as SmolLM2 and Qwen2.5 ship it, trimmed to the parts that matter here.
const CHATML: &str = "{% for message in messages %}\
{% if loop.first and messages[0]['role'] != 'system' %}\
{{ '<|im_start|>system\nYou are helpful.<|im_end|>\n' }}{% endif %}\
{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}\
{% endfor %}\
{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

fn user(text: &str) -> ChatMessage {
    ChatMessage::new("user", text)
}

#[test]
fn chatml_single_user_message() {
    let t = ChatTemplate::new(CHATML, "", "<|im_end|>").unwrap();
    assert_eq!(
        t.render(&[user("Hi")], true).unwrap(),
        "<|im_start|>system\nYou are helpful.<|im_end|>\n\
         <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(
        t.render(&[user("Hi")], false).unwrap(),
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    );
}

#[test]
fn chatml_system_and_multi_turn() {
    let t = ChatTemplate::new(CHATML, "", "<|im_end|>").unwrap();
    let messages = [
        ChatMessage::new("system", "Be brief."),
        user("2+2?"),
        ChatMessage::new("assistant", "4"),
        user("And 3+3?"),
    ];
    assert_eq!(
        t.render(&messages, true).unwrap(),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n\
         <|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n\
         <|im_start|>assistant\n"
    );
}

#[test]
fn block_whitespace_follows_trim_and_lstrip_blocks() {
    // With trim_blocks the newline after `%}` goes; with lstrip_blocks the indentation before
    // `{%` goes; the text lines keep theirs.
    let source = "{% for m in messages %}\n    {% if m.role == 'user' %}\n  [{{ m.content }}]\n    {% endif %}\n{% endfor %}\n";
    let t = ChatTemplate::new(source, "", "").unwrap();
    assert_eq!(
        t.render(&[user("a"), user("b")], false).unwrap(),
        "  [a]\n  [b]\n"
    );
}

#[test]
fn python_string_methods_work() {
    let source = "{% for m in messages %}{{ m.content.strip() }}|{{ m.content.startswith(' x') }}|{{ m['content'].upper() }}{% endfor %}";
    let t = ChatTemplate::new(source, "", "").unwrap();
    assert_eq!(t.render(&[user(" xy ")], false).unwrap(), "xy|True| XY ");
}

#[test]
fn bos_and_eos_are_variables_and_render_prompt_strips_bos() {
    let source = "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}";
    let t = ChatTemplate::new(source, "<s>", "</s>").unwrap();
    assert_eq!(t.render(&[user("hi")], false).unwrap(), "<s>hi</s>");
    assert_eq!(
        t.render_prompt(&[user("hi")], None, false, true, false)
            .unwrap(),
        "hi</s>"
    );
    assert_eq!(
        t.render_prompt(&[user("hi")], None, false, true, true)
            .unwrap(),
        "hi"
    );
    assert_eq!(
        t.render_prompt(&[user("hi")], None, false, false, false)
            .unwrap(),
        "<s>hi</s>"
    );
}

#[test]
fn raise_exception_is_reported_with_its_message() {
    let source = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}ok";
    let t = ChatTemplate::new(source, "", "").unwrap();
    assert_eq!(t.render(&[user("x")], false).unwrap(), "ok");
    let err = t
        .render(&[ChatMessage::new("assistant", "x")], false)
        .unwrap_err();
    match &err {
        TemplateError::Raised(message) => assert_eq!(
            message,
            "Conversation roles must alternate user/assistant/user/assistant/..."
        ),
        other => panic!("expected Raised, got {other:?}"),
    }
    assert!(err.to_string().contains("roles must alternate"), "{err}");
}

#[test]
fn syntax_error_names_the_line() {
    let err = ChatTemplate::new("line one\n{% if x %}\n{{ oops(\n", "", "").unwrap_err();
    match &err {
        TemplateError::Syntax { line, .. } => assert_eq!(*line, Line(Some(3))),
        other => panic!("expected Syntax, got {other:?}"),
    }
    assert!(
        err.to_string()
            .starts_with("chat template syntax error at line 3"),
        "{err}"
    );
}

#[test]
fn render_error_names_the_line() {
    let t = ChatTemplate::new("a\n{{ messages | no_such_filter }}", "", "").unwrap();
    let err = t.render(&[user("x")], false).unwrap_err();
    assert!(
        matches!(
            err,
            TemplateError::Render {
                line: Line(Some(2)),
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn namespace_and_loop_controls_and_tojson() {
    let source = "{% set ns = namespace(n=0) %}{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }} {{ messages[0].content | tojson }}";
    let t = ChatTemplate::new(source, "", "").unwrap();
    let messages = [ChatMessage::new("system", "s\"q"), user("a"), user("b")];
    assert_eq!(t.render(&messages, false).unwrap(), "2 \"s\\\"q\"");
}

/// Defined either way, and printed as Python prints booleans (as jinja2 does).
#[test]
fn generation_prompt_is_false_not_undefined_when_off() {
    let t = ChatTemplate::new(
        "{{ add_generation_prompt }} {{ add_generation_prompt is defined }}",
        "",
        "",
    )
    .unwrap();
    assert_eq!(t.render(&[], false).unwrap(), "False True");
    assert_eq!(t.render(&[], true).unwrap(), "True True");
}

/// Messages are maps in Python's key order; keys they lack are undefined, not errors.
#[test]
fn messages_behave_like_python_dicts() {
    let source = "{% for m in messages %}{% for k, v in m.items() %}{{ k }}={{ v }};{% endfor %}\
{{ m.tool_calls is defined }} {{ 'content' in m }} {{ m.get('name', 'anon') }} {{ m | length }}{% endfor %}";
    let t = ChatTemplate::new(source, "", "").unwrap();
    assert_eq!(
        t.render(&[user("hi")], false).unwrap(),
        "role=user;content=hi;False True anon 2"
    );
}

/// A loop nest that would run for days stops at the fuel budget, as an error of its own.
#[test]
fn a_runaway_loop_is_stopped_by_the_budget() {
    let source = "{% for a in range(100000) %}{% for b in range(100000) %}\
{% for c in range(100000) %}x{% endfor %}{% endfor %}{% endfor %}";
    let t = ChatTemplate::new(source, "", "").unwrap();
    let started = std::time::Instant::now();
    let err = t.render(&[user("hi")], true).unwrap_err();
    assert!(matches!(err, TemplateError::Budget(_)), "{err}");
    // Not a timing assertion: a stop at the budget rather than days later.
    assert!(started.elapsed() < std::time::Duration::from_secs(60));
}

#[test]
fn unbounded_output_is_stopped_by_the_budget() {
    let source = "{% for a in range(1000) %}{{ 'x' * 100000 }}{% endfor %}";
    let t = ChatTemplate::new(source, "", "").unwrap();
    let err = t.render(&[user("hi")], true).unwrap_err();
    assert!(matches!(err, TemplateError::Budget(_)), "{err}");
}

/// The budget leaves room for long real conversations.
/// Found by the `chat_template` fuzz target: MiniJinja's code generator panicked on an
/// import target that is a filter expression.
#[test]
fn a_template_the_compiler_panics_on_is_a_syntax_error() {
    let err = ChatTemplate::new("{% import 'x' as y|upper %}", "", "").unwrap_err();
    assert!(matches!(err, TemplateError::Syntax { .. }), "{err:?}");
}

#[test]
fn a_thousand_message_conversation_fits_the_budget() {
    let t = ChatTemplate::new(CHATML, "", "<|im_end|>").unwrap();
    let messages: Vec<ChatMessage> = (0..1000)
        .map(|i| ChatMessage::new(if i % 2 == 0 { "user" } else { "assistant" }, "turn"))
        .collect();
    let text = t.render(&messages, true).unwrap();
    assert_eq!(text.matches("<|im_start|>").count(), 1002);
}

#[test]
fn tools_and_tool_calls_reach_the_template() {
    let source = "{% for t in tools %}{{ t | tojson }};{% endfor %}{% for m in messages %}{% for c in m.tool_calls %}{{ c.function.name }}({{ c.function.arguments | tojson }}){% endfor %}{{ m.tool_call_id }}|{% endfor %}{{ tools is defined }}";
    let t = ChatTemplate::new(source, "", "").unwrap();
    let mut call = serde_json::Map::new();
    call.insert(
        "tool_calls".into(),
        serde_json::json!([{"type": "function", "function": {"name": "f", "arguments": {"b": 1, "a": [true]}}}]),
    );
    let mut reply = serde_json::Map::new();
    reply.insert("tool_call_id".into(), "c1".into());
    let messages = [
        ChatMessage::with_extra("assistant", "", call),
        ChatMessage::with_extra("tool", "2", reply),
    ];
    let tools = r#"[{"type": "function", "function": {"name": "f"}}]"#;
    assert_eq!(
        t.render_with_tools(&messages, Some(tools), false).unwrap(),
        r#"{"type": "function", "function": {"name": "f"}};f({"b": 1, "a": [true]})|c1|True"#
    );
    assert_eq!(t.render(&[user("x")], false).unwrap(), "|False");
}

/// gpt-oss's template (harmony) writes the current date with `strftime_now`, as llama.cpp's
/// server provides it.
#[test]
fn gpt_oss_renders_with_the_current_date() {
    let source = include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../scripts/synthetic/gpt-oss.jinja"
    ));
    let t = ChatTemplate::new(source, "<|startoftext|>", "<|return|>").unwrap();
    let text = t.render(&[user("Hi")], true).unwrap();
    let date = text
        .split("Current date: ")
        .nth(1)
        .and_then(|rest| rest.get(..10))
        .unwrap();
    let digits = |range: std::ops::Range<usize>| date[range].bytes().all(|b| b.is_ascii_digit());
    assert!(
        digits(0..4) && digits(5..7) && digits(8..10) && &date[4..5] == "-",
        "{date}"
    );
    assert!(text.ends_with("<|start|>assistant"), "{text}");
}

#[test]
fn strftime_now_refuses_an_unsupported_conversion() {
    let t = ChatTemplate::new("a\n{{ strftime_now('%Y %Z') }}", "", "").unwrap();
    let err = t.render(&[user("hi")], false).unwrap_err();
    let TemplateError::Render { line, detail } = &err else {
        panic!("{err:?}");
    };
    assert_eq!(*line, Line(Some(2)));
    assert!(detail.contains("unsupported conversion %Z"), "{detail}");
}
