use serde_json::{Value, json};
use worker_common::sampling::SamplingParams;

use crate::api::openai::ToolChoice;

use super::*;

const LIMITS: Limits = Limits {
    max_tokens_out: 2048,
};

fn parse(endpoint: Endpoint, body: &Value) -> Result<OpenAiRequest, Vec<FieldError>> {
    OpenAiRequest::parse(
        endpoint,
        Some("application/json"),
        body.to_string().as_bytes(),
        LIMITS,
    )
}

fn chat(extra: Value) -> Result<OpenAiRequest, Vec<FieldError>> {
    let mut body = json!({"model": "any", "messages": [{"role": "user", "content": "hi"}]});
    for (key, value) in extra.as_object().unwrap() {
        body[key] = value.clone();
    }
    parse(Endpoint::Chat, &body)
}

/// The (field, constraint) pairs a body is refused with.
fn refusals<T: std::fmt::Debug>(result: Result<T, Vec<FieldError>>) -> Vec<(String, String)> {
    match result {
        Ok(request) => panic!("accepted: {request:?}"),
        Err(errors) => errors
            .into_iter()
            .map(|error| (error.field, error.constraint))
            .collect(),
    }
}

fn pair(field: &str, constraint: &str) -> (String, String) {
    (field.into(), constraint.into())
}

#[test]
fn a_chat_request_becomes_a_job_with_openai_defaults() {
    let request = chat(json!({})).unwrap();
    let job = &request.job;
    assert_eq!(
        job.prompt,
        Prompt::Chat {
            messages: vec![ChatMessage::new("user", "hi")],
            tools: None,
            continue_final: false,
        }
    );
    assert_eq!(job.max_tokens, None, "absent: what the context leaves");
    assert_eq!(job.sampling, SamplingParams::default());
    assert_eq!((job.seed, job.ignore_eos), (None, false));
    assert!(job.stop.is_empty() && !request.stream && !request.include_usage);
}

#[test]
fn messages_keep_their_roles_and_join_text_parts() {
    let request = chat(json!({"messages": [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": null},
        {"role": "tool", "content": "42", "tool_call_id": "x"},
    ]}))
    .unwrap();
    let expected = vec![
        ChatMessage::new("system", "be brief"),
        ChatMessage::new("user", "ab"),
        ChatMessage::new("assistant", ""),
        ChatMessage {
            extra: Some(r#"{"tool_call_id":"x"}"#.into()),
            ..ChatMessage::new("tool", "42")
        },
    ];
    let Prompt::Chat {
        messages, tools, ..
    } = request.job.prompt
    else {
        panic!("not a chat");
    };
    assert_eq!((messages, tools), (expected, None));
}

#[test]
fn bad_messages_are_refused_with_their_path() {
    assert_eq!(
        refusals(chat(json!({"messages": []}))),
        [pair("messages", "non_empty")]
    );
    assert_eq!(
        refusals(chat(json!({"messages": "hi"}))),
        [pair("messages", "type(array)")]
    );
    let bad = json!({"messages": [
        {"role": "user", "content": "fine"},
        {"role": "robot", "content": "x"},
        {"role": "user"},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "1"}]},
        7,
    ]});
    assert_eq!(
        refusals(chat(bad)),
        [
            pair("messages[1].role", "one_of(roles)"),
            pair("messages[2].content", "required"),
            pair("messages[3].content[0]", "text_part"),
            pair("messages[4].tool_calls", "tool_fields"),
            pair("messages[5]", "type(object)"),
        ]
    );
    let missing = parse(Endpoint::Chat, &json!({"model": "m"}));
    assert_eq!(refusals(missing), [pair("messages", "required")]);
}

#[test]
fn max_completion_tokens_wins_and_both_are_capped() {
    let both = chat(json!({"max_tokens": 5, "max_completion_tokens": 9})).unwrap();
    assert_eq!(both.job.max_tokens, Some(9));
    assert_eq!(
        chat(json!({"max_tokens": 5})).unwrap().job.max_tokens,
        Some(5)
    );
    let capped = OpenAiRequest::parse(
        Endpoint::Chat,
        Some("application/json"),
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 900})
            .to_string()
            .as_bytes(),
        Limits {
            max_tokens_out: 100,
        },
    )
    .unwrap();
    assert_eq!(capped.job.max_tokens, Some(100));
    assert_eq!(
        chat(json!({"max_tokens": 100_000})).unwrap().job.max_tokens,
        Some(2048),
        "above 2048: capped by --max-tokens-out, not refused"
    );
    let long = OpenAiRequest::parse(
        Endpoint::Chat,
        Some("application/json"),
        json!({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 6000})
            .to_string()
            .as_bytes(),
        Limits {
            max_tokens_out: 8192,
        },
    )
    .unwrap();
    assert_eq!(long.job.max_tokens, Some(6000));
    assert_eq!(
        refusals(chat(json!({"max_tokens": 0}))),
        [pair("max_tokens", "range(1..=4294967295)")]
    );
}

#[test]
fn legacy_functions_are_refused_not_ignored() {
    let legacy = chat(json!({
        "functions": [{"name": "f", "parameters": {"type": "object"}}],
        "function_call": "auto",
    }));
    assert_eq!(
        refusals(legacy),
        [
            pair("functions", "unsupported"),
            pair("function_call", "unsupported")
        ]
    );
}

#[test]
fn sampling_stop_seed_and_streaming_fields() {
    let request = chat(json!({
        "temperature": 0.5, "top_p": 0.9, "seed": 7, "stop": "\n", "stream": true,
        "stream_options": {"include_usage": true}, "user": "ignored", "n": 1,
    }))
    .unwrap();
    assert_eq!(request.job.sampling.temperature, 0.5);
    assert_eq!(request.job.sampling.top_p, 0.9);
    assert_eq!(request.job.seed, Some(7));
    assert_eq!(request.job.stop, ["\n"]);
    assert!(request.stream && request.include_usage);
    let unstreamed = chat(json!({"stream_options": {"include_usage": true}})).unwrap();
    assert!(
        !unstreamed.include_usage,
        "usage chunks only exist in a stream"
    );
    assert_eq!(
        chat(json!({"stop": ["a", "b"]})).unwrap().job.stop,
        ["a", "b"]
    );
    assert_eq!(
        refusals(chat(json!({"stop": ""}))),
        [pair("stop", "non_empty")]
    );
    assert_eq!(
        refusals(chat(json!({"temperature": 3}))),
        [pair("temperature", "range(0.0..=2.0)")]
    );
    for n in [json!(0), json!(17), json!("2"), json!(1.5)] {
        assert_eq!(refusals(chat(json!({"n": n}))), [pair("n", "range(1, 16)")]);
    }
    assert_eq!(
        refusals(chat(json!({"model": 5}))),
        [pair("model", "type(string)")]
    );
}

#[test]
fn tools_are_read_and_checked() {
    let weather = json!({"type": "function", "function": {"name": "get_weather",
        "description": "d", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}});
    let time = json!({"type": "function", "function": {"name": "get_time"}});
    let request = chat(json!({"tools": [weather, time]})).unwrap();
    let tools = request.job_tools();
    assert_eq!(tools.choice, ToolChoice::Auto);
    assert_eq!(
        tools.functions[1],
        (
            "get_time".into(),
            json!({"type": "object", "properties": {}})
        )
    );
    let Prompt::Chat {
        tools: Some(rendered),
        ..
    } = &request.job.prompt
    else {
        panic!("no tools for the template");
    };
    assert!(
        rendered.starts_with(
            r#"[{"type":"function","function":{"name":"get_weather","description":"d""#
        ),
        "{rendered}"
    );
    let named = json!({"tools": [weather], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}});
    assert_eq!(
        chat(named).unwrap().job_tools().choice,
        ToolChoice::Named("get_weather".into())
    );
    assert!(
        chat(json!({"tools": [weather], "tool_choice": "none"}))
            .unwrap()
            .tools
            .is_none()
    );
    assert_eq!(
        refusals(chat(
            json!({"tools": [weather], "tool_choice": {"function": {"name": "nope"}}})
        )),
        [pair("tool_choice", "tool_choice")]
    );
    assert_eq!(
        refusals(chat(
            json!({"tools": [{"type": "function"}, weather, weather]})
        )),
        [
            pair("tools[0]", "function"),
            pair("tools[2].function.name", "function_name")
        ]
    );
    assert_eq!(
        refusals(chat(json!({"tool_choice": "required"}))),
        [pair("tool_choice", "requires(tools)")]
    );
    let completion = parse(
        Endpoint::Completions,
        &json!({"prompt": "a", "tools": [weather]}),
    );
    assert_eq!(refusals(completion), [pair("tools", "unsupported")]);
    let echo = parse(Endpoint::Completions, &json!({"prompt": "a", "echo": true}));
    assert_eq!(refusals(echo), [pair("echo", "unsupported")]);
}

impl OpenAiRequest {
    fn job_tools(&self) -> &crate::api::openai::Tools {
        self.tools.as_ref().unwrap()
    }
}

#[test]
fn penalties_bias_min_tokens_and_logprobs_are_read() {
    let request = chat(json!({
        "frequency_penalty": 0.5, "presence_penalty": -1, "repeat_last_n": 64,
        "logit_bias": {"7": 3.5, "5": -100}, "min_tokens": 3, "logprobs": true, "top_logprobs": 4,
    }))
    .unwrap();
    let sampling = &request.job.sampling;
    assert_eq!(
        (sampling.frequency_penalty, sampling.presence_penalty),
        (0.5, -1.0)
    );
    assert_eq!(sampling.penalty_last_n, Some(64));
    assert_eq!(sampling.logit_bias, [(5, -100.0), (7, 3.5)], "in id order");
    assert_eq!((sampling.min_tokens, sampling.logprobs), (3, Some(4)));
    let window = |n: i64| chat(json!({"repeat_last_n": n})).map(|r| r.job.sampling.penalty_last_n);
    assert_eq!(window(-1).unwrap(), None, "-1: the whole history");
    assert_eq!(window(0).unwrap(), Some(0), "0: off");
    assert_eq!(
        refusals(window(-2).map(|_| unreachable!())),
        [pair("repeat_last_n", "range(-1..=1048576)")]
    );
    assert_eq!(
        chat(json!({"logprobs": true}))
            .unwrap()
            .job
            .sampling
            .logprobs,
        Some(0)
    );
    assert_eq!(
        chat(json!({"logprobs": false}))
            .unwrap()
            .job
            .sampling
            .logprobs,
        None
    );
    let completion = parse(
        Endpoint::Completions,
        &json!({"prompt": "a", "logprobs": 2}),
    )
    .unwrap();
    assert_eq!(completion.job.sampling.logprobs, Some(2));
    let bad = json!({
        "frequency_penalty": 2.5, "logit_bias": {"x": 1, "3": 101}, "top_logprobs": 2,
    });
    let mut refused = refusals(chat(bad));
    refused.sort();
    assert_eq!(
        refused,
        [
            pair("frequency_penalty", "range(-2.0..=2.0)"),
            pair("logit_bias.3", "range(-100.0..=100.0)"),
            pair("logit_bias.x", "token_id"),
            pair("top_logprobs", "requires(logprobs)"),
        ]
    );
    assert_eq!(
        refusals(chat(json!({"logprobs": true, "top_logprobs": 21}))),
        [pair("top_logprobs", "range(0..=20)")]
    );
}

#[test]
fn response_formats_become_grammars() {
    use worker_common::grammar::GrammarSpec;
    let grammar = |format: Value| chat(json!({"response_format": format})).map(|r| r.job.grammar);
    assert_eq!(grammar(json!({"type": "text"})).unwrap(), None);
    let object = grammar(json!({"type": "json_object"})).unwrap().unwrap();
    assert_eq!(
        (object.spec, object.field),
        (GrammarSpec::JsonObject, "response_format")
    );
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
    let named = json!({"type": "json_schema", "json_schema": {"name": "n", "schema": schema}});
    assert_eq!(
        grammar(named).unwrap().unwrap().spec,
        GrammarSpec::JsonSchema(schema)
    );
    assert_eq!(
        refusals(grammar(
            json!({"type": "json_schema", "json_schema": {"name": "n"}})
        )),
        [pair("response_format.json_schema.schema", "required")]
    );
    assert_eq!(
        refusals(grammar(json!({"type": "yaml"}))),
        [pair(
            "response_format.type",
            "one_of(text, json_object, json_schema)"
        )]
    );
    let both = chat(json!({"response_format": {"type": "json_object"}, "ignore_eos": true}));
    assert_eq!(refusals(both), [pair("ignore_eos", "conflicts(grammar)")]);
}

#[test]
fn completion_prompts_are_raw_text() {
    let text = |prompt: Value| parse(Endpoint::Completions, &json!({"prompt": prompt}));
    let expected = Prompt::Text {
        text: "once".into(),
        raw: true,
    };
    assert_eq!(text(json!("once")).unwrap().job.prompt, expected);
    assert_eq!(text(json!(["once"])).unwrap().job.prompt, expected);
    assert_eq!(
        refusals(text(json!([1, 2]))),
        [pair("prompt", "one_string")]
    );
    assert_eq!(refusals(text(json!(""))), [pair("prompt", "non_empty")]);
    let missing = parse(Endpoint::Completions, &json!({"model": "m"}));
    assert_eq!(refusals(missing), [pair("prompt", "required")]);
}
