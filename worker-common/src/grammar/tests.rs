//! The grammar compiler and running grammars on the test vocabularies.

use super::*;
use crate::testing::{TINY_EOS, ascii_tokenizer, tiny_tokenizer};

/// The ids of the first `n` that `guide` allows next.
pub(crate) fn allowed_ids(guide: &Guide, n: u32) -> Vec<u32> {
    let mask = guide.allowed().unwrap();
    (0..n)
        .filter(|&id| mask[id as usize / 32] & (1 << (id % 32)) != 0)
        .collect()
}

#[test]
fn a_regex_allows_only_the_tokens_that_continue_it() {
    let tokenizer = tiny_tokenizer();
    let grammars = Grammars::new(&tokenizer).unwrap();
    let constraint = grammars.compile(&GrammarSpec::Regex("ab+".into())).unwrap();
    let mut guide = constraint.start();
    assert_eq!(allowed_ids(&guide, 10), [1], "only `a` starts it");
    guide.accept(1).unwrap();
    assert_eq!(allowed_ids(&guide, 10), [2], "then `b`, not the end yet");
    guide.accept(2).unwrap();
    assert_eq!(
        allowed_ids(&guide, 10),
        [TINY_EOS, 2],
        "more `b` or the end"
    );
    guide.accept(2).unwrap();
    guide.accept(2).unwrap();
    let waited = allowed_ids(&guide, 10);
    assert_eq!(
        waited,
        [TINY_EOS, 2],
        "two accepts in a row wait for the mask"
    );
}

#[test]
fn grammars_that_do_not_compile_say_why() {
    let grammars = Grammars::new(&tiny_tokenizer()).unwrap();
    let bad_schema = GrammarSpec::JsonSchema(json!({"type": "no-such-type"}));
    let error = grammars.compile(&bad_schema).unwrap_err();
    assert!(matches!(error, GrammarError::Compile(_)), "{error}");
    let bad_lark = grammars.compile(&GrammarSpec::Lark("start: (".into()));
    assert!(matches!(bad_lark, Err(GrammarError::Compile(_))));
}

#[test]
fn grammars_that_cannot_produce_any_output_are_refused() {
    let grammars = Grammars::new(&ascii_tokenizer()).unwrap();
    let cycle = json!({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
        "$ref": "#/$defs/a"});
    let needs_itself = json!({"type": "object", "properties": {"x": {"$ref": "#"}},
        "required": ["x"]});
    // Loops are found in the compiled rules; impossible patterns by the first mask.
    let unsatisfiable = [
        (GrammarSpec::JsonSchema(json!({"$ref": "#"})), NO_STRING),
        (GrammarSpec::JsonSchema(cycle), NO_STRING),
        (GrammarSpec::JsonSchema(needs_itself), NO_STRING),
        (GrammarSpec::Lark("start: a\na: \"x\" a".into()), NO_STRING),
        (
            GrammarSpec::Lark("start: \"a\" b\nb: \"b\" b".into()),
            NO_STRING,
        ),
        (GrammarSpec::Lark("start: a\na: a".into()), NO_STRING),
        (GrammarSpec::Lark(r"start: /[^\s\S]/".into()), NO_START),
        (GrammarSpec::Regex(r"[^\s\S]".into()), NO_START),
        (GrammarSpec::Regex("[a&&b]".into()), NO_START),
    ];
    for (spec, why) in unsatisfiable {
        let error = grammars.compile(&spec).unwrap_err();
        assert!(
            matches!(error, GrammarError::Unsatisfiable(reason) if reason == why),
            "{spec:?}: {error}"
        );
        assert!(!error.to_string().contains('\n'), "{error}");
    }
}

#[test]
fn recursive_grammars_with_a_way_out_compile() {
    let grammars = Grammars::new(&ascii_tokenizer()).unwrap();
    let list = json!({"type": "object", "properties": {"next": {"$ref": "#"}}});
    let tree = json!({"$defs": {"node": {"type": "object", "properties": {
        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
        "$ref": "#/$defs/node"});
    let satisfiable = [
        GrammarSpec::JsonObject,
        GrammarSpec::JsonSchema(list),
        GrammarSpec::JsonSchema(tree),
        GrammarSpec::Lark("start: a\na: \"x\" a | \"y\"".into()),
        GrammarSpec::Lark("start: \"<\" %json{\"type\": \"integer\"} \">\"".into()),
        GrammarSpec::Regex("".into()),
    ];
    for spec in satisfiable {
        if let Err(error) = grammars.compile(&spec) {
            panic!("{spec:?}: {error}");
        }
    }
    let lark = GrammarSpec::Lark("start: a\na: \"x\" a | \"y\"".into());
    let guide = grammars.compile(&lark).unwrap().start();
    assert_eq!(
        allowed_ids(&guide, 10),
        [7, 8],
        "`x` or `y`, from the first mask"
    );
}

#[test]
fn a_grammar_the_vocabulary_cannot_start_is_refused() {
    let grammars = Grammars::new(&tiny_tokenizer()).unwrap();
    let error = grammars.compile(&GrammarSpec::JsonObject).unwrap_err();
    assert!(
        matches!(error, GrammarError::Unsatisfiable(NO_START)),
        "{error}"
    );
}

#[test]
fn a_parser_failure_shows_no_parser_state() {
    let grammars = Grammars::new(&tiny_tokenizer()).unwrap();
    let constraint = grammars.compile(&GrammarSpec::Regex("ab+".into())).unwrap();
    let mut guide = constraint.start();
    let error = guide.accept(9).unwrap_err();
    assert!(matches!(error, GrammarError::Step(_)), "{error}");
    let message = error.to_string();
    assert!(
        !message.contains('\n') && !message.contains('<'),
        "{message}"
    );
    let long = format!("{}\n<state>Tokens: ⟦a⟧</state>", "é".repeat(400));
    let cut = headline(&long);
    assert_eq!(cut.chars().count(), MAX_MESSAGE_CHARS + 1, "{cut}");
    assert!(cut.ends_with('…'));
}
