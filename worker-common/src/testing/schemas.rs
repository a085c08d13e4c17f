//! JSON schemas of the shapes whose grammars cost the most, for the grammar budget's tests.

use serde_json::{Value, json};

/// An object of `n` optional integer properties: compile time quadratic in `n`, over the
/// compile budget from about 500.
pub fn optional_properties(n: usize) -> Value {
    let properties: serde_json::Map<String, Value> = (0..n)
        .map(|i| (format!("p{i}"), json!({"type": "integer"})))
        .collect();
    json!({"type": "object", "properties": properties})
}
