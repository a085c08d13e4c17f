use serde_json::{Value, json};
use worker_common::grammar::GrammarSpec;
use worker_common::tokenizer::template::ChatMessage;

use super::*;

const LIMITS: Limits = Limits {
    max_tokens_out: 2048,
};

/// A previous response `resp_1` that asked "hi" and was answered "hello".
fn previous(id: &str) -> Option<Arc<[Value]>> {
    (id == "resp_1").then(|| {
        let items = vec![
            json!({"role": "user", "content": "hi"}),
            json!({"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
                "content": [{"type": "output_text", "text": "hello", "annotations": []}]}),
        ];
        items.into()
    })
}

fn parse(extra: Value) -> Result<ResponsesRequest, Vec<FieldError>> {
    let mut body = json!({"model": "any", "input": "Weather in Paris?"});
    for (key, value) in extra.as_object().cloned().unwrap_or_default() {
        body[key] = value;
    }
    let body = body.to_string();
    ResponsesRequest::parse(Some("application/json"), body.as_bytes(), LIMITS, &previous)
}

/// The (field, constraint) pairs a body is refused with.
fn refusals(result: Result<ResponsesRequest, Vec<FieldError>>) -> Vec<(String, String)> {
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

fn messages(request: &ResponsesRequest) -> &[ChatMessage] {
    match &request.job.prompt {
        Prompt::Chat { messages, .. } => messages,
        Prompt::Text { .. } => panic!("a chat prompt"),
    }
}

fn weather_tool() -> Value {
    json!({"type": "function", "name": "get_weather", "description": "Weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
            "required": ["city"]}, "strict": true})
}

#[test]
fn a_plain_request_becomes_a_chat_job_with_openai_defaults() {
    let request = parse(json!({})).unwrap();
    assert_eq!(
        request.job.prompt,
        Prompt::Chat {
            messages: vec![ChatMessage::new("user", "Weather in Paris?")],
            tools: None,
            continue_final: false,
        }
    );
    assert_eq!(request.job.max_tokens, None);
    assert_eq!(request.job.grammar, None);
    assert!(!request.stream && request.store && request.tools.is_none());
    assert_eq!(
        request.items,
        [json!({"role": "user", "content": "Weather in Paris?"})]
    );
    let echo = Value::Object(request.echo);
    assert_eq!(echo["tool_choice"], "auto");
    assert_eq!(echo["tools"], json!([]));
    assert_eq!(echo["text"], json!({"format": {"type": "text"}}));
    assert_eq!(
        (&echo["temperature"], &echo["top_p"]),
        (&json!(1.0), &json!(1.0))
    );
    assert_eq!(echo["parallel_tool_calls"], true);
    for key in [
        "instructions",
        "max_output_tokens",
        "previous_response_id",
        "metadata",
    ] {
        assert!(echo[key].is_null(), "{key}: {echo}");
    }
}

#[test]
fn sampling_budget_and_instructions_reach_the_job() {
    let request = parse(
        json!({"instructions": "Be brief.", "max_output_tokens": 5000,
        "temperature": 0.5, "top_p": 0.9, "seed": 7, "stream": true, "store": false,
        "metadata": {"k": "v"}, "user": "u1", "reasoning": {"effort": "low"},
        "parallel_tool_calls": false, "top_k": 4}),
    )
    .unwrap();
    assert_eq!(
        messages(&request),
        [
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "Weather in Paris?")
        ]
    );
    assert_eq!(
        request.job.max_tokens,
        Some(2048),
        "capped by --max-tokens-out"
    );
    let sampling = &request.job.sampling;
    assert_eq!(
        (sampling.temperature, sampling.top_p, sampling.top_k),
        (0.5, 0.9, 4)
    );
    assert_eq!(request.job.seed, Some(7));
    assert!(request.stream && !request.store);
    let echo = Value::Object(request.echo);
    assert_eq!(
        (
            &echo["instructions"],
            &echo["max_output_tokens"],
            &echo["temperature"]
        ),
        (&json!("Be brief."), &json!(2048), &json!(0.5))
    );
    assert_eq!(
        (&echo["metadata"], &echo["user"], &echo["reasoning"]),
        (&json!({"k": "v"}), &json!("u1"), &json!({"effort": "low"}))
    );
    assert_eq!(
        (&echo["store"], &echo["parallel_tool_calls"]),
        (&json!(false), &json!(false))
    );
}

#[test]
fn text_format_becomes_the_grammar() {
    let schema = json!({"type": "object", "properties": {"city": {"type": "string"}}});
    let format = json!({"type": "json_schema", "name": "answer", "schema": schema, "strict": true});
    let request = parse(json!({"text": {"format": format}})).unwrap();
    assert_eq!(
        request.job.grammar,
        Some(Grammar {
            spec: GrammarSpec::JsonSchema(schema),
            field: "text.format",
        })
    );
    assert_eq!(request.echo["text"]["format"], format);
    let object = parse(json!({"text": {"format": {"type": "json_object"}}})).unwrap();
    assert_eq!(
        object.job.grammar.map(|g| g.spec),
        Some(GrammarSpec::JsonObject)
    );
    let text = parse(json!({"text": {"format": {"type": "text"}, "verbosity": "low"}})).unwrap();
    assert_eq!(text.job.grammar, None);
    assert_eq!(
        refusals(parse(
            json!({"text": {"format": {"type": "json_schema", "schema": 3}}})
        )),
        [
            pair("text.format.name", "required"),
            pair("text.format.schema", "type(object)")
        ]
    );
    assert_eq!(
        refusals(parse(json!({"text": {"format": {"type": "grammar"}}}))),
        [pair(
            "text.format.type",
            "one_of(text, json_object, json_schema)"
        )]
    );
}

#[test]
fn function_tools_are_offered_in_the_chat_shape() {
    let request = parse(json!({"tools": [weather_tool()]})).unwrap();
    let tools = request.tools.as_ref().unwrap();
    assert_eq!(tools.choice, ToolChoice::Auto);
    assert_eq!(tools.functions[0].0, "get_weather");
    let rendered: Value = serde_json::from_str(&tools.json).unwrap();
    assert_eq!(
        rendered[0],
        json!({"type": "function", "function": {"name": "get_weather",
            "description": "Weather in a city.", "parameters": weather_tool()["parameters"]}})
    );
    assert_eq!(request.echo["tools"][0]["name"], "get_weather");
    assert_eq!(request.echo["tools"][0]["strict"], true);
    let named = json!({"tools": [weather_tool()],
        "tool_choice": {"type": "function", "name": "get_weather"}});
    let forced = parse(named).unwrap();
    assert_eq!(
        forced.tools.unwrap().choice,
        ToolChoice::Named("get_weather".into())
    );
    let required = parse(json!({"tools": [weather_tool()], "tool_choice": "required"}));
    assert_eq!(
        required.unwrap().tools.unwrap().choice,
        ToolChoice::Required
    );
    let off = parse(json!({"tools": [weather_tool()], "tool_choice": "none"})).unwrap();
    assert!(off.tools.is_none());
    assert_eq!(off.echo["tool_choice"], "none");
}

#[test]
fn hosted_tools_and_choices_are_refused() {
    let hosted = json!({"tools": [{"type": "web_search"}, {"type": "file_search",
        "vector_store_ids": []}, weather_tool(), {"type": "code_interpreter"},
        {"type": "computer_use_preview"}]});
    assert_eq!(
        refusals(parse(hosted)),
        [
            pair("tools[0].type", "function_tool"),
            pair("tools[1].type", "function_tool"),
            pair("tools[3].type", "function_tool"),
            pair("tools[4].type", "function_tool"),
        ]
    );
    let choice = json!({"tools": [weather_tool()], "tool_choice": {"type": "file_search"}});
    assert_eq!(
        refusals(parse(choice)),
        [pair("tool_choice", "tool_choice")]
    );
    let unknown = json!({"tools": [weather_tool()],
        "tool_choice": {"type": "function", "name": "nope"}});
    assert_eq!(
        refusals(parse(unknown)),
        [pair("tool_choice", "tool_choice")]
    );
    assert_eq!(
        refusals(parse(json!({"tool_choice": "required"}))),
        [pair("tool_choice", "requires(tools)")]
    );
    let both = json!({"tools": [weather_tool()], "tool_choice": "required",
        "text": {"format": {"type": "json_object"}}});
    assert_eq!(
        refusals(parse(both)),
        [pair("tool_choice", "conflicts(text.format)")]
    );
}

#[test]
fn what_is_not_served_is_refused_naming_the_field() {
    let refused = json!({"background": true, "include": ["reasoning.encrypted_content"],
        "prompt": {"id": "pmpt_1"}, "conversation": "conv_1", "truncation": "auto",
        "top_logprobs": 3});
    assert_eq!(
        refusals(parse(refused)),
        [
            pair("background", "unsupported"),
            pair("prompt", "unsupported"),
            pair("conversation", "unsupported"),
            pair("include", "unsupported"),
            pair("truncation", "equals(disabled)"),
            pair("top_logprobs", "unsupported"),
        ]
    );
    let defaults = json!({"background": false, "include": [], "truncation": "disabled",
        "top_logprobs": 0, "service_tier": "auto", "prompt_cache_key": "k",
        "safety_identifier": "s", "max_tool_calls": 3, "some_new_field": {}});
    assert!(
        parse(defaults).is_ok(),
        "defaults and unknown fields are taken"
    );
    let metadata = json!({"metadata": {"k": 1, "long": "x".repeat(513)}});
    assert_eq!(
        refusals(parse(metadata)),
        [
            pair("metadata.k", "metadata"),
            pair("metadata.long", "metadata")
        ]
    );
    assert_eq!(
        refusals(parse(json!({"model": 3}))),
        [pair("model", "type(string)")]
    );
    assert_eq!(
        refusals(parse(json!({"max_output_tokens": 0}))),
        [pair("max_output_tokens", "range(1..=4294967295)")]
    );
    let mut body = json!({"model": "m"});
    body["instructions"] = json!(5);
    let body = body.to_string();
    let missing =
        ResponsesRequest::parse(Some("application/json"), body.as_bytes(), LIMITS, &previous);
    assert_eq!(
        refusals(missing),
        [
            pair("instructions", "type(string)"),
            pair("input", "required")
        ]
    );
}

#[test]
fn a_previous_response_continues_its_conversation() {
    let request = parse(
        json!({"previous_response_id": "resp_1", "input": "and you?",
        "instructions": "Be kind."}),
    )
    .unwrap();
    assert_eq!(
        messages(&request),
        [
            ChatMessage::new("system", "Be kind."),
            ChatMessage::new("user", "hi"),
            ChatMessage::new("assistant", "hello"),
            ChatMessage::new("user", "and you?"),
        ]
    );
    assert_eq!(
        request.items.len(),
        3,
        "the previous conversation, then the input"
    );
    assert_eq!(
        request.items[2],
        json!({"role": "user", "content": "and you?"})
    );
    assert_eq!(request.echo["previous_response_id"], "resp_1");
    let unknown = parse(json!({"previous_response_id": "resp_2"}));
    assert_eq!(
        refusals(unknown),
        [pair("previous_response_id", PREVIOUS_RESPONSE_NOT_FOUND)]
    );
}
