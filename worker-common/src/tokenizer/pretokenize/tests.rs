//! Unit tests of the splitters on hand-checked inputs.

use super::*;

/// The words of `text` under `pre`.
fn words(pre: &str, text: &str) -> Vec<String> {
    let pre = PreTokenizer::new(pre).unwrap();
    let mut ranges = Vec::new();
    pre.split(text, &mut ranges);
    ranges.into_iter().map(|r| text[r].to_owned()).collect()
}

#[test]
fn categories_are_llama_cpps_unicode_15_1_groups() {
    let cases = [
        ('A', Category::Letter),
        ('7', Category::Number),
        ('$', Category::Symbol),
        ('_', Category::Punctuation),
        (' ', Category::Separator),
        ('\n', Category::Control),
        ('\u{301}', Category::Mark),
        ('中', Category::Letter),
        ('٣', Category::Number),
        ('😀', Category::Symbol),
        ('\u{E000}', Category::Control),
        ('\u{378}', Category::Undefined),
        // CJK Extension I arrived in Unicode 15.1; U+1C89 only in 16.0.
        ('\u{2EBF0}', Category::Letter),
        ('\u{1C89}', Category::Undefined),
        ('\u{10FFFF}', Category::Undefined),
    ];
    for (c, expected) in cases {
        assert_eq!(category(u32::from(c)), expected, "{c:?}");
    }
}

#[test]
fn gpt2_splits_words_numbers_symbols_and_spaces() {
    assert_eq!(
        words("gpt-2", "Hello world's  x\n\n12ab!! ?"),
        // llama.cpp's matcher leaves the last newline of a run alone (GPT-2 has no `\s+`).
        [
            "Hello", " world", "'s", " ", " x", "\n", "\n", "12", "ab", "!!", " ?"
        ]
    );
    assert_eq!(words("gpt-2", "a   "), ["a", "   "]);
    assert_eq!(words("gpt-2", "I'M"), ["I", "'", "M"]);
}

#[test]
fn llama3_groups_digits_by_three_and_keeps_newlines_together() {
    assert_eq!(
        words("llama-bpe", "12345 I'M  fine\n\n  ok"),
        ["123", "45", " I", "'M", " ", " fine", "\n\n", " ", " ok"]
    );
    assert_eq!(
        words("llama-bpe", "(hello) ...\n"),
        ["(hello", ")", " ...\n"]
    );
}

#[test]
fn qwen_splits_single_digits_and_qwen35_keeps_marks_in_words() {
    assert_eq!(words("qwen2", "x123"), ["x", "1", "2", "3"]);
    // A mark is not a letter to Qwen2, so it leads the next word like punctuation would.
    assert_eq!(
        words("qwen2", "e\u{301}t\u{301}"),
        ["e", "\u{301}t", "\u{301}"]
    );
    assert_eq!(words("qwen35", "e\u{301}t\u{301}"), ["e\u{301}t\u{301}"]);
}

#[test]
fn starcoder_isolates_every_digit_before_gpt2() {
    assert_eq!(words("starcoder", "ab 123"), ["ab", " ", "1", "2", "3"]);
}

#[test]
fn default_and_falcon_split_punctuation_runs_and_digit_triples() {
    assert_eq!(words("default", "a+=1234"), ["a", "+=", "123", "4"]);
    assert_eq!(words("falcon", "`x`"), ["`", "x", "`"]);
    assert_eq!(words("default", "`x`"), ["`", "x", "`"]);
}

#[test]
fn deepseek_ranges_skip_non_ascii_whitespace() {
    // U+3000 lies inside both the CJK and the punctuation ranges but is whitespace to llama.cpp.
    assert_eq!(
        words("deepseek-coder", "中文\u{3000}字"),
        ["中文", "\u{3000}", "字"]
    );
    assert_eq!(
        words("deepseek-llm", "Hi there  \n"),
        ["Hi", " there", "  ", "\n"]
    );
}

#[test]
fn unknown_pre_tokenizer_is_named_with_the_supported_ones() {
    let err = PreTokenizer::new("no-such-pre").unwrap_err();
    let message = err.to_string();
    assert!(message.contains("\"no-such-pre\""), "{message}");
    assert!(
        message.contains("llama-bpe") && message.contains("qwen2"),
        "{message}"
    );
    assert!(PreTokenizer::new("").is_ok(), "empty means default");
}

#[test]
fn every_pre_tokenizer_covers_every_code_point_without_panicking() {
    let all: String = (0..=0x10FFFFu32)
        .step_by(7)
        .filter_map(char::from_u32)
        .collect();
    for (name, ..) in PRE_TOKENIZERS {
        let pre = PreTokenizer::new(name).unwrap();
        let mut ranges = Vec::new();
        pre.split(&all, &mut ranges);
        let mut end = 0;
        for range in &ranges {
            assert_eq!(range.start, end, "{name}: words must be contiguous");
            assert!(range.end > range.start, "{name}: empty word");
            end = range.end;
        }
        assert_eq!(end, all.len(), "{name}");
    }
}

#[test]
fn long_runs_split_in_linear_time() {
    let spaces = " ".repeat(100_000);
    assert_eq!(words("gpt-2", &spaces), [spaces.as_str()]);
    assert_eq!(words("llama-bpe", &format!("{spaces}x")).len(), 2);
    let word = "a".repeat(100_000);
    assert_eq!(words("qwen2", &word), [word.as_str()]);
    let newlines = "\n ".repeat(50_000);
    assert_eq!(words("deepseek-llm", &newlines).len(), 100_000);
}

/// GPT-4o's case-aware words (a non-ASCII letter counts as both cases), contractions kept with
/// their word, three-digit groups, symbols taking trailing newlines and slashes.
#[test]
fn gpt4o_splits_case_runs_digits_and_symbols() {
    assert_eq!(
        words("gpt-4o", "ÉCOLE HELLOworld helloWorld they'LL 12345 !!\n/x"),
        [
            "É",
            "COLE",
            " HELLOworld",
            " hello",
            "World",
            " they'LL",
            " ",
            "123",
            "45",
            " !!\n/",
            "x"
        ]
    );
}
