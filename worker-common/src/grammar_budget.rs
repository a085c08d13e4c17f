//! What one grammar may cost: llguidance's parser limits, set by the worker instead of left at
//! llguidance's defaults, so that a grammar too costly to compile or to mask is refused when it
//! is compiled (before its job is admitted) with [`GrammarError::OverBudget`], not run.
//!
//! Every limit counts work (lexer fuel, Earley items, automaton states, grammar symbols), not
//! time: the same grammar is refused or taken on every machine and under any load. The values
//! come from `examples/grammar_cost.rs` on Qwen2.5's 152k vocabulary (specs/OPENAI.md lists the
//! measurements): ordinary grammars (`json_object`, an OpenAI structured-output schema, a
//! forced weather-tool call, an enum of 1,000 values, arrays nested 120 deep) stay well under
//! each; what exceeds them is the shape that is really costly, one object of many optional
//! properties, whose compile time grows with the square of their number (500: 24-36 ms,
//! 2,000: 0.3 s, 4,000: 1.2 s, 10,000: 6.6-11 s under llguidance's defaults) and whose masks
//! need a row of four Earley items a property. Under this budget 400 compile (16 ms), 500 to
//! ~2,000 are refused by their first mask's items after their compile (at most ~0.3 s), more
//! are refused while they are built (4,000 or 10,000: 30-50 ms).
//!
//! [`GrammarError::OverBudget`]: crate::grammar::GrammarError::OverBudget

use llguidance::api::ParserLimits;

/// Lexer fuel for building a grammar's lexer (llguidance: 1,000,000, "FHIR's schema takes
/// 500k"): it grows with the grammar's literals (property names, enum values) and is checked
/// as the grammar is built, so it stops a huge grammar early. An enum of 1,000 values is
/// within it; an object of 4,000 optional properties is refused in ~30 ms, not compiled for
/// 1.2 s (with 100,000 it was; with 25,000 one of 1,000 properties was refused, a size some
/// real tool sets reach).
pub const INITIAL_LEXER_FUEL: u64 = 50_000;

/// Symbols of the compiled grammar, checked as it is built (llguidance: 500,000, "a few
/// megabytes of JSON"; its largest test schema, FHIR's, has 200,000). Bounds the grammar's
/// memory; a grammar that size is refused by [`INITIAL_LEXER_FUEL`] first in practice.
pub const MAX_GRAMMAR_SIZE: usize = 200_000;

/// Earley items for one mask (llguidance: 50,000). An ordinary grammar's masks take at most a
/// few hundred (`json_object` 92, an ambiguous Lark grammar 972, 100 optional properties 797);
/// a mask of 2,000 took about 1-2 ms, 16,000 about 57-73 ms. Equal to [`MAX_ITEMS_IN_ROW`]: a
/// grammar whose first mask needs more items than a row may hold would fail at its first
/// token, so it is refused at compile time instead (an object of ~500 optional properties).
pub const STEP_MAX_ITEMS: usize = 2_000;

/// Earley items in one parser row, llguidance's default: a row is the parser's state after a
/// token, so this bounds what each token costs to take.
pub const MAX_ITEMS_IN_ROW: usize = 2_000;

/// Lexer fuel for one mask (llguidance: 200,000, about 14k a millisecond): ordinary grammars
/// spend at most ~2,300 on a mask, so this is ~20 times that and a mask's lexer at most
/// about 3.5 ms.
pub const STEP_LEXER_FUEL: u64 = 50_000;

/// States of a parser's lexer automaton, built lazily as masks need them (llguidance: 250,000,
/// 1-2 kB each, so up to ~500 MB a job). Ordinary grammars build a few dozen (15-35 once
/// compiled); this keeps one job's lexer under about 40 MB.
pub const MAX_LEXER_STATES: usize = 20_000;

/// llguidance's limits with the worker's budget; verbose errors off (they carry the parser's
/// state, the job's tokens so far, and the whole grammar: not for clients).
pub(crate) fn limits() -> ParserLimits {
    ParserLimits {
        max_items_in_row: MAX_ITEMS_IN_ROW,
        initial_lexer_fuel: INITIAL_LEXER_FUEL,
        step_lexer_fuel: STEP_LEXER_FUEL,
        step_max_items: STEP_MAX_ITEMS,
        max_lexer_states: MAX_LEXER_STATES,
        max_grammar_size: MAX_GRAMMAR_SIZE,
        verbose_errors: false,
        ..ParserLimits::default()
    }
}

/// The starts of llguidance's messages for a limit of [`limits`] reached (llguidance is pinned
/// in the workspace; the tests below fail if a new version words them otherwise).
const OVER_BUDGET: &[&str] = &[
    // INITIAL_LEXER_FUEL and MAX_GRAMMAR_SIZE, while the grammar is built.
    "initial lexer configuration (grammar) too big",
    "grammar size (number of symbols) too big",
    "fuel exhausted when checking relevance of lexemes",
    "lexer precomputation failed",
    // STEP_MAX_ITEMS, MAX_ITEMS_IN_ROW, STEP_LEXER_FUEL and MAX_LEXER_STATES, in a mask or a
    // token (as `parser error: …` and `lexer error: …`, or in a `Parser Error: …`).
    "Too many items",
    "Current row has",
    "too many expressions constructed",
    "too many states",
];

/// Whether llguidance's `message` says a limit of the budget was reached.
pub(crate) fn is_over_budget(message: &str) -> bool {
    OVER_BUDGET.iter().any(|start| message.contains(start))
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::grammar::{GrammarError, GrammarSpec, Grammars};
    use crate::testing::ascii_tokenizer;
    use crate::testing::schemas::optional_properties;

    /// The forced call grammar worker-http builds for one Hermes-format tool.
    fn forced_call(name: &str, parameters: &Value) -> GrammarSpec {
        let schema = json!({
            "anyOf": [{"type": "object",
                "properties": {"name": {"const": name}, "arguments": parameters},
                "required": ["name", "arguments"], "additionalProperties": false}],
            "x-guidance": {"whitespace_flexible": false, "item_separator": ", ",
                "key_separator": ": "},
        });
        GrammarSpec::Lark(format!(
            "start: \"<tool_call>\\n\" call \"\\n</tool_call>\"\ncall: %json {schema}\n"
        ))
    }

    fn over_budget(error: &GrammarError) -> bool {
        matches!(error, GrammarError::OverBudget(_))
    }

    #[test]
    fn a_grammar_over_the_budget_is_refused_as_such() {
        let grammars = Grammars::new(&ascii_tokenizer()).unwrap();
        // 600 properties: built within the fuel, its first mask needs ~2,400 items; 5,000:
        // its lexer is over the fuel while it is built.
        for n in [600, 5_000] {
            let tool = forced_call("t", &optional_properties(n));
            for spec in [GrammarSpec::JsonSchema(optional_properties(n)), tool] {
                let error = grammars.compile(&spec).unwrap_err();
                assert!(over_budget(&error), "{n}: {error}");
                let message = error.to_string();
                assert!(message.contains("budget"), "{message}");
                assert!(!message.contains('\n'), "{message}");
            }
        }
    }

    #[test]
    fn ordinary_and_deeply_nested_grammars_compile_under_the_budget() {
        let grammars = Grammars::new(&ascii_tokenizer()).unwrap();
        let weather = json!({"type": "object", "properties": {
            "location": {"type": "string", "description": "City and country"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 14},
            "hourly": {"type": "boolean"}},
            "required": ["location"]});
        let answer = json!({"type": "object", "properties": {
            "title": {"type": "string"},
            "steps": {"type": "array", "items": {"type": "object", "properties": {
                "explanation": {"type": "string"}, "output": {"type": "string"}},
                "required": ["explanation", "output"], "additionalProperties": false}},
            "final_answer": {"type": "string"},
            "confidence": {"type": "number", "minimum": 0, "maximum": 1}},
            "required": ["title", "steps", "final_answer"], "additionalProperties": false});
        // The hostile shape, arrays nested 50 deep: costly with older parsers, cheap
        // with this one (at most 33 items and 0.15 ms a mask on Qwen's vocabulary).
        let mut nested = json!({"type": "integer"});
        for _ in 0..50 {
            nested = json!({"type": "array", "items": nested});
        }
        let nested = json!({"type": "object", "properties": {"v": nested}, "required": ["v"]});
        let specs = [
            GrammarSpec::JsonObject,
            GrammarSpec::JsonSchema(answer),
            GrammarSpec::JsonSchema(optional_properties(100)),
            forced_call("get_weather", &weather),
            forced_call("t", &nested),
            GrammarSpec::Regex("(a|b)*a(a|b){24}".into()),
        ];
        for spec in specs {
            if let Err(error) = grammars.compile(&spec) {
                panic!("{spec:?}: {error}");
            }
        }
    }

    #[test]
    fn llguidances_limit_messages_are_recognised() {
        for message in [
            "initial lexer configuration (grammar) too big (limit for this grammar: 100000)",
            "grammar size (number of symbols) too big (limit for this grammar: 200000)",
            "parser error: Too many items (limit 2000; mask); try avoiding single-byte/short lexemes",
            "Parser Error: Current row has 2407 items; max is 2000; consider making your grammar left-recursive if it's right-recursive",
            "lexer error: too many expressions constructed",
            "lexer error: too many states: 20000 >= 20000",
        ] {
            assert!(is_over_budget(message), "{message}");
        }
        assert!(!is_over_budget(
            "failed to parse \"%json\": recursion limit exceeded"
        ));
    }
}
