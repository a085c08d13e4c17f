//! JSON inside chat templates: the `tools` variable and a message's extra keys (`tool_calls`,
//! `tool_call_id`, `name`) become template values with their key order kept, and `tojson`
//! writes what Hugging Face's filter writes (Python's `json.dumps`: `", "` and `": "`
//! separators, non-ASCII kept, `indent` honoured), so a tool list renders as the model saw it
//! in training.

use std::fmt::Write as _;
use std::sync::Arc;

use minijinja::value::{Enumerator, Kwargs, Object, ObjectRepr, ValueKind};
use minijinja::{Error, ErrorKind, Value};
use serde_json::{Map, Value as Json};

/// A JSON object as a template map, keys in document order.
#[derive(Debug)]
struct JsonObject(Map<String, Json>);

impl Object for JsonObject {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Map
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        self.0.get(key.as_str()?).map(to_value)
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Values(self.0.keys().map(|key| Value::from(key.as_str())).collect())
    }
}

/// A JSON value as a template value.
pub(super) fn to_value(json: &Json) -> Value {
    match json {
        Json::Null => Value::from(()),
        Json::Bool(b) => Value::from(*b),
        Json::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => Value::from(i),
            (_, Some(u), _) => Value::from(u),
            (_, _, f) => Value::from(f.unwrap_or(0.0)),
        },
        Json::String(s) => Value::from(s.as_str()),
        Json::Array(items) => Value::from(items.iter().map(to_value).collect::<Vec<_>>()),
        Json::Object(map) => Value::from_object(JsonObject(map.clone())),
    }
}

/// A template value as JSON (undefined and none as `null`).
fn to_json(value: &Value) -> Result<Json, Error> {
    Ok(match value.kind() {
        ValueKind::Undefined | ValueKind::None => Json::Null,
        ValueKind::Bool => Json::Bool(value.is_true()),
        ValueKind::Number => match (i64::try_from(value.clone()), f64::try_from(value.clone())) {
            (Ok(i), _) => Json::from(i),
            (_, Ok(f)) => Json::from(f),
            _ => Json::Null,
        },
        ValueKind::String => Json::String(value.as_str().unwrap_or_default().to_owned()),
        ValueKind::Seq | ValueKind::Iterable => {
            let items = value.try_iter()?.map(|item| to_json(&item));
            Json::Array(items.collect::<Result<_, _>>()?)
        }
        ValueKind::Map => {
            let mut map = Map::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                map.insert(key.to_string(), to_json(&item)?);
            }
            Json::Object(map)
        }
        _ => {
            let message = format!("tojson cannot write a {}", value.kind());
            return Err(Error::new(ErrorKind::InvalidOperation, message));
        }
    })
}

/// The `tojson` filter, as Hugging Face's `apply_chat_template` defines it.
pub(super) fn tojson(value: Value, kwargs: Kwargs) -> Result<String, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let mut out = String::new();
    write(&mut out, &to_json(&value)?, indent, 0);
    Ok(out)
}

/// Python's `json.dumps(value, ensure_ascii=False, indent=indent)`.
fn write(out: &mut String, value: &Json, indent: Option<usize>, level: usize) {
    let newline = |out: &mut String, level: usize| {
        if let Some(width) = indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', width * level));
        }
    };
    let separator = if indent.is_some() { "," } else { ", " };
    match value {
        Json::Array(items) if !items.is_empty() => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(separator);
                }
                newline(out, level + 1);
                write(out, item, indent, level + 1);
            }
            newline(out, level);
            out.push(']');
        }
        Json::Object(map) if !map.is_empty() => {
            out.push('{');
            for (i, (key, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(separator);
                }
                newline(out, level + 1);
                let _ = write!(out, "{}: ", Json::String(key.clone()));
                write(out, item, indent, level + 1);
            }
            newline(out, level);
            out.push('}');
        }
        leaf => {
            let _ = write!(out, "{leaf}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dumps(json: &str, indent: Option<usize>) -> String {
        let value: Json = serde_json::from_str(json).unwrap();
        let mut out = String::new();
        write(&mut out, &to_json(&to_value(&value)).unwrap(), indent, 0);
        out
    }

    #[test]
    fn tojson_writes_what_python_json_dumps_writes() {
        // Python: json.dumps(x, ensure_ascii=False) and with indent=2.
        let x =
            r#"{"name": "get_weather", "b": [1, 2.5, true, null], "c": {}, "d": [], "é": "a\"<"}"#;
        assert_eq!(
            dumps(x, None),
            r#"{"name": "get_weather", "b": [1, 2.5, true, null], "c": {}, "d": [], "é": "a\"<"}"#
        );
        assert_eq!(
            dumps(r#"{"a": [1, {"b": 2}]}"#, Some(2)),
            "{\n  \"a\": [\n    1,\n    {\n      \"b\": 2\n    }\n  ]\n}"
        );
    }
}
