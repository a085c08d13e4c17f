use serde_json::{Value, json};
use worker_common::grammar::GrammarSpec;
use worker_common::tokenizer::template::ChatMessage;

use super::*;

const LIMITS: Limits = Limits {
    max_tokens_out: 4096,
};

fn parse(extra: Value) -> Result<MessagesRequest, Vec<FieldError>> {
    let mut body = json!({"model": "claude-any", "max_tokens": 64,
        "messages": [{"role": "user", "content": "hi"}]});
    for (key, value) in extra.as_object().cloned().unwrap_or_default() {
        body[key] = value;
    }
    let body = body.to_string();
    MessagesRequest::parse(
        Some("application/json"),
        body.as_bytes(),
        LIMITS,
        Purpose::Create,
    )
}

/// The (field, constraint) pairs a body is refused with.
fn refusals(result: Result<MessagesRequest, Vec<FieldError>>) -> Vec<(String, String)> {
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

fn accepted(extra: Value) -> MessagesRequest {
    parse(extra).unwrap_or_else(|errors| panic!("{errors:?}"))
}

#[test]
fn a_request_becomes_a_chat_job() {
    let request = accepted(json!({
        "system": "be brief", "temperature": 0.5, "top_p": 0.9, "top_k": 5,
        "stop_sequences": ["\n\n"], "stream": true, "metadata": {"user_id": "u"},
        "thinking": {"type": "enabled", "budget_tokens": 1024}, "service_tier": "auto",
    }));
    let job = &request.job;
    assert_eq!(
        job.prompt,
        Prompt::Chat {
            messages: vec![
                ChatMessage::new("system", "be brief"),
                ChatMessage::new("user", "hi")
            ],
            tools: None,
            continue_final: false,
        }
    );
    assert_eq!(job.max_tokens, Some(64));
    assert_eq!(
        (
            job.sampling.temperature,
            job.sampling.top_p,
            job.sampling.top_k
        ),
        (0.5, 0.9, 5)
    );
    assert_eq!(job.stop, ["\n\n"]);
    assert!(request.stream && request.tools.is_none() && job.grammar.is_none());
}

#[test]
fn model_and_max_tokens_are_required_and_max_tokens_is_capped_not_refused() {
    let body = json!({"messages": [{"role": "user", "content": "hi"}]}).to_string();
    let read = |purpose| {
        MessagesRequest::parse(Some("application/json"), body.as_bytes(), LIMITS, purpose)
    };
    let missing = read(Purpose::Create);
    assert_eq!(
        refusals(missing),
        [pair("model", "required"), pair("max_tokens", "required")]
    );
    let large = accepted(json!({"max_tokens": 64_000}));
    assert_eq!(
        large.job.max_tokens,
        Some(4096),
        "capped by --max-tokens-out"
    );
    assert_eq!(
        refusals(parse(json!({"max_tokens": 0}))),
        [pair("max_tokens", "range(1..=4294967295)")]
    );
    let counted = read(Purpose::CountTokens);
    assert_eq!(
        refusals(counted),
        [pair("model", "required")],
        "a token count reads no max_tokens"
    );
    assert_eq!(
        refusals(parse(json!({"model": 3}))),
        [pair("model", "type(string)")]
    );
}

#[test]
fn tools_take_anthropics_shape_and_render_as_openais() {
    let weather = json!({"name": "get_weather", "description": "d",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}});
    let request = accepted(json!({"tools": [weather]}));
    let tools = request.tools.as_ref().unwrap();
    assert_eq!(tools.choice, ToolChoice::Auto);
    assert_eq!(tools.functions[0].0, "get_weather");
    assert!(
        tools
            .json
            .starts_with(r#"[{"type":"function","function":{"name":"get_weather","description":"d","parameters":{"#),
        "{}",
        tools.json
    );
    let choice = |choice: Value| parse(json!({"tools": [weather], "tool_choice": choice}));
    let any = choice(json!({"type": "any"})).unwrap();
    assert_eq!(any.tools.unwrap().choice, ToolChoice::Required);
    let named =
        choice(json!({"type": "tool", "name": "get_weather", "disable_parallel_tool_use": true}));
    assert_eq!(
        named.unwrap().tools.unwrap().choice,
        ToolChoice::Named("get_weather".into())
    );
    let none = choice(json!({"type": "none"})).unwrap();
    assert!(none.tools.is_none());
    assert_eq!(
        refusals(choice(json!({"type": "tool", "name": "other"}))),
        [pair("tool_choice", "tool_choice")]
    );
    assert_eq!(
        refusals(parse(json!({"tool_choice": {"type": "any"}}))),
        [pair("tool_choice", "requires(tools)")]
    );
    let server = json!({"type": "web_search_20250305", "name": "web_search"});
    assert_eq!(
        refusals(parse(json!({"tools": [server, weather, weather]}))),
        [
            pair("tools[0].type", "custom_tool"),
            pair("tools[2].name", "function_name")
        ]
    );
}

#[test]
fn output_config_format_is_a_json_schema_grammar() {
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
    let request = accepted(json!({"output_config": {"effort": "low",
        "format": {"type": "json_schema", "schema": schema}}}));
    let grammar = request.job.grammar.unwrap();
    assert_eq!(
        (grammar.spec, grammar.field),
        (GrammarSpec::JsonSchema(schema), "output_config.format")
    );
    assert_eq!(
        refusals(parse(
            json!({"output_config": {"format": {"type": "yaml"}}})
        )),
        [pair("output_config.format", "json_schema")]
    );
}

#[test]
fn what_the_worker_cannot_do_is_refused() {
    let refused = parse(json!({
        "mcp_servers": [{"type": "url", "url": "https://example.invalid", "name": "m"}],
        "container": "c", "stop_sequences": "one",
    }));
    assert_eq!(
        refusals(refused),
        [
            pair("stop_sequences", "type(array)"),
            pair("mcp_servers", "unsupported"),
            pair("container", "unsupported"),
        ]
    );
    assert!(
        parse(json!({"mcp_servers": []})).is_ok(),
        "an empty list asks for nothing"
    );
}
