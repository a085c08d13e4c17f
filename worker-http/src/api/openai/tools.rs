//! Tool calling on `/v1/chat/completions`: the request's `tools` and `tool_choice`, the tool
//! fields of messages (`tool_calls`, `tool_call_id`, `name`), and the grammar that forces a
//! call when `tool_choice` asks for one.

use serde_json::{Map, Value, json};

use crate::api::fields::Fields;

/// Most functions a request may list.
const MAX_TOOLS: usize = 64;

/// How a model writes its tool calls, recognized from its chat template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    /// Hermes and Qwen 2.5: `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>`.
    Hermes,
    /// Llama 3.1/3.2: the whole reply is `{"name": …, "parameters": {…}}`.
    Llama3,
}

impl ToolFormat {
    /// The format a chat template renders tools for, if any.
    pub fn of_template(source: &str) -> Option<Self> {
        if source.contains("<tool_call>") {
            Some(ToolFormat::Hermes)
        } else if source.contains("<|python_tag|>") || source.contains("\"parameters\"") {
            Some(ToolFormat::Llama3)
        } else {
            None
        }
    }

    /// The key a call's arguments are written under.
    fn arguments_key(self) -> &'static str {
        match self {
            ToolFormat::Hermes => "arguments",
            ToolFormat::Llama3 => "parameters",
        }
    }
}

/// Whether and which tool the model must call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides (its calls are parsed from its output).
    Auto,
    /// The model must call one of the tools.
    Required,
    /// The model must call this one.
    Named(String),
}

/// A request's tools.
#[derive(Debug, Clone, PartialEq)]
pub struct Tools {
    /// The `tools` array as JSON text, for the chat template's `tools` variable.
    pub json: String,
    /// Each function's name and parameter schema, in order.
    pub functions: Vec<(String, Value)>,
    /// `tool_choice`.
    pub choice: ToolChoice,
}

impl Tools {
    /// The Lark grammar of one call in `format` to the functions `choice` allows, for
    /// `required` and named choices (`None` for `auto`).
    pub fn forced_call(&self, format: ToolFormat) -> Option<String> {
        let allowed: Vec<&(String, Value)> = match &self.choice {
            ToolChoice::Auto => return None,
            ToolChoice::Required => self.functions.iter().collect(),
            ToolChoice::Named(name) => self.functions.iter().filter(|(n, _)| n == name).collect(),
        };
        let key = format.arguments_key();
        let mut defs = serde_json::Map::new();
        let calls: Vec<Value> = allowed
            .iter()
            .enumerate()
            .map(|(i, (name, parameters))| {
                let parameters = hoisted(i, parameters, &mut defs);
                json!({
                    "type": "object",
                    "properties": {"name": {"const": name}, key: parameters},
                    "required": ["name", key],
                    "additionalProperties": false,
                })
            })
            .collect();
        let mut schema = json!({
            "anyOf": calls,
            "x-guidance": {"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "},
        });
        if !defs.is_empty() {
            schema["$defs"] = Value::Object(defs);
        }
        Some(match format {
            ToolFormat::Hermes => {
                format!(
                    "start: \"<tool_call>\\n\" call \"\\n</tool_call>\"\ncall: %json {schema}\n"
                )
            }
            ToolFormat::Llama3 => format!("start: %json {schema}\n"),
        })
    }
}

/// Function `i`'s parameter schema as it sits inside the call grammar's schema: a schema with
/// references (a pydantic model with a nested one has `$defs` and `"$ref": "#/$defs/City"`) is
/// moved to the root's `defs` as `tool{i}`, its `$defs` and `definitions` beside it as
/// `tool{i}_<name>`, every `$ref` of it rewritten to where its target now lives, and a `$ref` to it
/// is returned; a schema without references is returned as it is.
fn hoisted(i: usize, parameters: &Value, defs: &mut serde_json::Map<String, Value>) -> Value {
    if !has_ref(parameters) {
        return parameters.clone();
    }
    let own = format!("tool{i}");
    let mut root = parameters.clone();
    for section in ["$defs", "definitions"] {
        let taken = root.as_object_mut().and_then(|o| o.remove(section));
        if let Some(Value::Object(entries)) = taken {
            for (name, mut schema) in entries {
                rewrite_refs(&mut schema, &own);
                defs.insert(format!("{own}_{name}"), schema);
            }
        }
    }
    rewrite_refs(&mut root, &own);
    defs.insert(own.clone(), root);
    json!({"$ref": format!("#/$defs/{own}")})
}

/// Whether `schema` holds a `$ref` anywhere.
fn has_ref(schema: &Value) -> bool {
    match schema {
        Value::Object(o) => o.contains_key("$ref") || o.values().any(has_ref),
        Value::Array(items) => items.iter().any(has_ref),
        _ => false,
    }
}

/// Rewrites the local references of a schema that moved to `#/$defs/{own}` (its definitions to
/// `#/$defs/{own}_<name>`): `#` and `#/…` into it, `#/$defs/<name>…` and `#/definitions/<name>…`
/// to its hoisted definitions. Other references (URLs) are left as they are.
fn rewrite_refs(schema: &mut Value, own: &str) {
    match schema {
        Value::Object(o) => {
            if let Some(Value::String(reference)) = o.get_mut("$ref") {
                let pointer = reference.strip_prefix('#').map(str::to_owned);
                if let Some(pointer) = pointer {
                    let section = ["/$defs/", "/definitions/"]
                        .iter()
                        .find_map(|s| pointer.strip_prefix(s));
                    *reference = match section {
                        Some(rest) => format!("#/$defs/{own}_{rest}"),
                        None => format!("#/$defs/{own}{pointer}"),
                    };
                }
            }
            for (key, value) in o.iter_mut() {
                if key != "$ref" {
                    rewrite_refs(value, own);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| rewrite_refs(v, own)),
        _ => {}
    }
}

/// A function name as OpenAI allows it: 1 to 64 of `a-z A-Z 0-9 _ -`.
fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// One function a request offers, checked.
#[derive(Debug, Clone, PartialEq)]
pub(in crate::api) struct Function {
    /// Its name: 1 to 64 of `a-z A-Z 0-9 _ -`, unique in the request.
    pub name: String,
    /// What it does, for the model.
    pub description: Option<String>,
    /// The JSON schema of its arguments.
    pub parameters: Value,
}

impl<'a> Fields<'a> {
    /// `tools` and `tool_choice`; `None` when there are no tools or the choice is `none`.
    pub(in crate::api) fn tools(&mut self) -> Option<Tools> {
        let functions = self.functions();
        let choice = self.tool_choice(&functions)?;
        self.offered(functions, choice)
    }

    /// The tools of a request that offers `functions` with `choice` (either API's): `None`
    /// when there are none (a choice that forces a call is then refused).
    pub(in crate::api) fn offered(
        &mut self,
        functions: Vec<Function>,
        choice: ToolChoice,
    ) -> Option<Tools> {
        if functions.is_empty() {
            if matches!(choice, ToolChoice::Required | ToolChoice::Named(_)) {
                let message = "tool_choice asks for a call but tools is empty".into();
                self.fail("tool_choice", "requires(tools)", message, None);
            }
            return None;
        }
        // The template gets OpenAI's shape, as Hugging Face's templates expect.
        let tools: Vec<Value> = functions
            .iter()
            .map(|function| {
                let mut object = Map::new();
                object.insert("name".into(), json!(function.name));
                if let Some(description) = &function.description {
                    object.insert("description".into(), json!(description));
                }
                object.insert("parameters".into(), function.parameters.clone());
                json!({"type": "function", "function": object})
            })
            .collect();
        Some(Tools {
            json: Value::Array(tools).to_string(),
            functions: functions
                .into_iter()
                .map(|function| (function.name, function.parameters))
                .collect(),
            choice,
        })
    }

    /// `tools`: `[{"type": "function", "function": {name, description?, parameters?}}]`.
    fn functions(&mut self) -> Vec<Function> {
        let Some(items) = self.tool_items("tools") else {
            return Vec::new();
        };
        let mut functions: Vec<Function> = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let at = format!("tools[{i}]");
            let function = item
                .get("function")
                .filter(|_| item.get("type") == Some(&json!("function")));
            let Some(Value::Object(function)) = function else {
                let message = "a tool is {\"type\": \"function\", \"function\": {…}}".into();
                self.fail(&at, "function", message, None);
                continue;
            };
            let at = format!("{at}.function");
            let keys = ("name", "parameters");
            functions.extend(self.function(&at, function, keys, &functions));
        }
        functions
    }

    /// The array of tools in `field`, at most [`MAX_TOOLS`]; `None` when absent or refused.
    pub(in crate::api) fn tool_items(&mut self, field: &str) -> Option<&'a Vec<Value>> {
        let value = self.get(field)?;
        let Value::Array(items) = value else {
            self.wrong_type(field, "array", value);
            return None;
        };
        self.within_count(field, items.len(), MAX_TOOLS, "tools")
            .then_some(items)
    }

    /// One function of the object at `at`, its name and parameter schema under `keys`
    /// (OpenAI's `name`/`parameters`, Anthropic's `name`/`input_schema`), checked against
    /// those listed before it; `None` after recording why it is refused.
    pub(in crate::api) fn function(
        &mut self,
        at: &str,
        object: &Map<String, Value>,
        keys: (&str, &str),
        before: &[Function],
    ) -> Option<Function> {
        let (name_key, parameters_key) = keys;
        let name = object
            .get(name_key)
            .and_then(Value::as_str)
            .unwrap_or_default();
        if !valid_name(name) || before.iter().any(|function| function.name == name) {
            let message = format!(
                "function names are 1-64 of a-z, A-Z, 0-9, _ and -, each once; got {name:?}"
            );
            self.fail(&format!("{at}.{name_key}"), "function_name", message, None);
            return None;
        }
        let parameters = match object.get(parameters_key) {
            None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
            Some(schema @ Value::Object(_)) => schema.clone(),
            Some(other) => {
                self.wrong_type(&format!("{at}.{parameters_key}"), "object", other);
                return None;
            }
        };
        let description = object
            .get("description")
            .and_then(Value::as_str)
            .map(str::to_owned);
        Some(Function {
            name: name.to_owned(),
            description,
            parameters,
        })
    }

    /// `tool_choice`: `none` (`None`: tools off), `auto` (the default), `required`, or
    /// `{"type": "function", "function": {"name": …}}` naming a listed function.
    fn tool_choice(&mut self, functions: &[Function]) -> Option<ToolChoice> {
        let Some(value) = self.get("tool_choice") else {
            return Some(ToolChoice::Auto);
        };
        match value.as_str() {
            Some("none") => return None,
            Some("auto") => return Some(ToolChoice::Auto),
            Some("required") => return Some(ToolChoice::Required),
            _ => {}
        }
        let name = value
            .get("function")
            .and_then(|function| function.get("name"))
            .and_then(Value::as_str);
        match name {
            Some(name) if functions.iter().any(|function| function.name == name) => {
                Some(ToolChoice::Named(name.to_owned()))
            }
            _ => {
                let message = "tool_choice is none, auto, required or {\"type\": \"function\", \"function\": {\"name\": <a listed tool>}}".into();
                self.fail("tool_choice", "tool_choice", message, Some(value));
                Some(ToolChoice::Auto)
            }
        }
    }
}

/// A message's tool keys for the chat template: an assistant's `tool_calls` (each call's
/// `arguments` string parsed into an object, as templates expect after Hugging Face),
/// a tool message's `tool_call_id` and `name`. `Err` names the invalid field.
pub(in crate::api) fn message_extra(
    role: &str,
    object: &Map<String, Value>,
) -> Result<Map<String, Value>, (&'static str, String)> {
    let mut extra = Map::new();
    if let Some(calls) = object.get("tool_calls").filter(|calls| !calls.is_null()) {
        if role != "assistant" {
            return Err((
                "tool_calls",
                "only assistant messages have tool_calls".into(),
            ));
        }
        let Value::Array(calls) = calls else {
            return Err(("tool_calls", "tool_calls must be an array".into()));
        };
        let mut rendered = Vec::with_capacity(calls.len());
        for call in calls {
            let function = call.get("function").and_then(Value::as_object);
            let name = function.and_then(|f| f.get("name")).and_then(Value::as_str);
            let Some(name) = name else {
                let message = "each tool call needs function.name".into();
                return Err(("tool_calls", message));
            };
            let arguments = match function.and_then(|f| f.get("arguments")) {
                Some(Value::String(text)) => serde_json::from_str(text).unwrap_or(json!(text)),
                Some(other) => other.clone(),
                None => json!({}),
            };
            let mut entry = Map::new();
            if let Some(id) = call.get("id") {
                entry.insert("id".into(), id.clone());
            }
            entry.insert("type".into(), json!("function"));
            entry.insert(
                "function".into(),
                json!({"name": name, "arguments": arguments}),
            );
            rendered.push(Value::Object(entry));
        }
        extra.insert("tool_calls".into(), Value::Array(rendered));
    }
    for key in ["tool_call_id", "name"] {
        if let Some(Value::String(text)) = object.get(key) {
            extra.insert(key.into(), json!(text));
        }
    }
    Ok(extra)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_come_from_the_template() {
        assert_eq!(
            ToolFormat::of_template("… <tool_call> …"),
            Some(ToolFormat::Hermes)
        );
        assert_eq!(
            ToolFormat::of_template("<|python_tag|>"),
            Some(ToolFormat::Llama3)
        );
        assert_eq!(ToolFormat::of_template("{{ messages }}"), None);
    }

    #[test]
    fn a_forced_call_is_a_lark_grammar_around_the_functions_schemas() {
        let tools = Tools {
            json: String::new(),
            functions: vec![
                ("a".into(), json!({"type": "object"})),
                ("b".into(), json!({"type": "object"})),
            ],
            choice: ToolChoice::Named("b".into()),
        };
        let lark = tools.forced_call(ToolFormat::Hermes).unwrap();
        assert!(
            lark.starts_with("start: \"<tool_call>\\n\" call \"\\n</tool_call>\""),
            "{lark}"
        );
        assert!(
            lark.contains(r#""const":"b""#) && !lark.contains(r#""const":"a""#),
            "{lark}"
        );
        let auto = Tools {
            choice: ToolChoice::Auto,
            ..tools
        };
        assert_eq!(auto.forced_call(ToolFormat::Hermes), None);
    }

    #[test]
    fn a_forced_call_keeps_its_schemas_definitions() {
        use worker_common::grammar::{GrammarSpec, Grammars};
        // pydantic's schema of a model with a nested one, and a recursive one.
        let city = json!({
            "$defs": {"City": {"type": "object", "properties": {"name": {"type": "string"}},
                "required": ["name"]}},
            "type": "object",
            "properties": {"city": {"$ref": "#/$defs/City"},
                "others": {"type": "array", "items": {"$ref": "#/$defs/City"}}},
            "required": ["city"],
        });
        let tree = json!({
            "definitions": {"Node": {"type": "object", "properties": {
                "children": {"type": "array", "items": {"$ref": "#/definitions/Node"}}}}},
            "type": "object",
            "properties": {"root": {"$ref": "#/definitions/Node"}, "again": {"$ref": "#"}},
        });
        let tools = Tools {
            json: String::new(),
            functions: vec![
                ("where".into(), city),
                ("grow".into(), tree),
                ("plain".into(), json!({"type": "object"})),
            ],
            choice: ToolChoice::Required,
        };
        let grammars = Grammars::new(&worker_common::testing::ascii_tokenizer()).unwrap();
        for format in [ToolFormat::Hermes, ToolFormat::Llama3] {
            let lark = tools.forced_call(format).unwrap();
            assert!(lark.contains(r##""$ref":"#/$defs/tool0_City""##), "{lark}");
            assert!(lark.contains(r##""$ref":"#/$defs/tool1_Node""##), "{lark}");
            assert!(lark.contains(r##""$ref":"#/$defs/tool1""##), "{lark}");
            if let Err(error) = grammars.compile(&GrammarSpec::Lark(lark.clone())) {
                panic!("{error}: {lark}");
            }
        }
    }

    #[test]
    fn assistant_tool_calls_get_their_arguments_as_objects() {
        let message = json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}
        ]});
        let extra = message_extra("assistant", message.as_object().unwrap()).unwrap();
        assert_eq!(
            extra["tool_calls"][0]["function"]["arguments"],
            json!({"x": 1})
        );
        let tool = json!({"role": "tool", "content": "2", "tool_call_id": "call_1"});
        let extra = message_extra("tool", tool.as_object().unwrap()).unwrap();
        assert_eq!(extra["tool_call_id"], "call_1");
        let wrong = json!({"role": "user", "tool_calls": []});
        assert!(message_extra("user", wrong.as_object().unwrap()).is_err());
    }
}
