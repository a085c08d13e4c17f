//! Pre-tokenization of byte-level BPE: the split of text into words that llama.cpp b11434
//! applies before merging, chosen by `tokenizer.ggml.pre`.
//!
//! llama.cpp runs a list of regexes one after the other; each one splits every piece that the
//! previous ones left into its matches and the gaps between them (both kept). Its four main
//! regexes (GPT-2's, llama3's, Qwen2's, Qwen3.5's) are not run as regexes at all but by
//! hand-written matchers with their own corner cases; the others go through `std::regex` after a
//! rewrite: every non-ASCII code point is collapsed to one byte per Unicode category group
//! (whitespace to `\v`) so that `\p{L}` and friends become byte classes. Matching that with a
//! general regex engine would inherit neither the matchers' corner cases nor the collapse, so
//! each piece of each regex is written here as a small linear-time matcher with exactly the
//! semantics llama.cpp ends up with:
//!
//! - `\p{X}` is "the code point's category group is X" (the collapse keeps ASCII as is, and the
//!   ASCII characters of each collapsed class are exactly that group's);
//! - `\s` is the White_Space set llama.cpp lists (the collapse maps non-ASCII whitespace to `\v`);
//! - a literal range such as `[一-龥]` never matches non-ASCII whitespace, which llama.cpp
//!   replaced by `\v` before matching.

mod categories;

use std::ops::Range;

use categories::{Category, category};

use super::TokenizerError;

/// One code point of the input and what the matchers ask about it.
#[derive(Debug, Clone, Copy)]
struct Cp {
    cp: u32,
    category: Category,
    space: bool,
    utf8_len: u8,
}

impl Cp {
    fn new(c: char) -> Self {
        let cp = u32::from(c);
        Self {
            cp,
            category: category(cp),
            space: is_whitespace(cp),
            utf8_len: c.len_utf8() as u8,
        }
    }

    fn is(self, c: char) -> bool {
        self.cp == u32::from(c)
    }

    fn letter(self) -> bool {
        self.category == Category::Letter
    }

    fn number(self) -> bool {
        self.category == Category::Number
    }

    fn mark(self) -> bool {
        self.category == Category::Mark
    }

    fn newline(self) -> bool {
        self.is('\r') || self.is('\n')
    }
}

/// `\s` as llama.cpp sees it: the Unicode White_Space code points (its `unicode_set_whitespace`).
fn is_whitespace(cp: u32) -> bool {
    matches!(
        cp,
        0x09..=0x0D
            | 0x20
            | 0x85
            | 0xA0
            | 0x1680
            | 0x2000..=0x200A
            | 0x2028
            | 0x2029
            | 0x202F
            | 0x205F
            | 0x3000
    )
}

/// The regex lists of llama.cpp's pre-tokenizer types that we implement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Regexes {
    Default,
    Gpt2,
    Llama3,
    Qwen2,
    Qwen35,
    Starcoder,
    DeepseekLlm,
    DeepseekCoder,
    Falcon,
    Gpt4o,
}

/// `tokenizer.ggml.pre` values, their regexes, and whether llama.cpp emits a word that is
/// itself a token without merging (`ignore_merges`). Values whose llama.cpp branch also changes
/// special tokens in a way the tokenizer does not model (chatglm-bpe, glm4 and glm5 drop BOS;
/// jina-v1-en, jina-v2-code and roberta-bpe add SEP) are left out rather than half supported.
const PRE_TOKENIZERS: &[(&str, Regexes, bool)] = &[
    ("default", Regexes::Default, false),
    ("gpt-2", Regexes::Gpt2, false),
    ("phi-2", Regexes::Gpt2, false),
    ("jina-es", Regexes::Gpt2, false),
    ("jina-de", Regexes::Gpt2, false),
    ("gigachat", Regexes::Gpt2, false),
    ("jina-v2-es", Regexes::Gpt2, false),
    ("jina-v2-de", Regexes::Gpt2, false),
    ("a.x-4.0", Regexes::Gpt2, false),
    ("mellum", Regexes::Gpt2, false),
    ("modern-bert", Regexes::Gpt2, false),
    ("exaone4", Regexes::Gpt2, false),
    ("mpt", Regexes::Gpt2, false),
    ("olmo", Regexes::Gpt2, false),
    ("jais", Regexes::Gpt2, false),
    ("trillion", Regexes::Gpt2, false),
    ("granite-docling", Regexes::Gpt2, false),
    ("llama3", Regexes::Llama3, true),
    ("llama-v3", Regexes::Llama3, true),
    ("llama-bpe", Regexes::Llama3, true),
    ("falcon3", Regexes::Llama3, true),
    ("falcon-h1", Regexes::Llama3, true),
    ("pixtral", Regexes::Llama3, true),
    ("midm-2.0", Regexes::Llama3, true),
    ("lfm2", Regexes::Llama3, true),
    ("jina-v5-nano", Regexes::Llama3, true),
    ("dbrx", Regexes::Llama3, false),
    ("smaug-bpe", Regexes::Llama3, false),
    ("qwen2", Regexes::Qwen2, false),
    ("deepseek-r1-qwen", Regexes::Qwen2, false),
    ("kormo", Regexes::Qwen2, false),
    ("f2llmv2", Regexes::Qwen2, false),
    ("megrez", Regexes::Qwen2, false),
    ("stablelm2", Regexes::Qwen2, false),
    ("hunyuan", Regexes::Qwen2, false),
    ("solar-open", Regexes::Qwen2, false),
    ("grok-2", Regexes::Qwen2, false),
    ("qwen35", Regexes::Qwen35, false),
    ("starcoder", Regexes::Starcoder, false),
    ("refact", Regexes::Starcoder, false),
    ("command-r", Regexes::Starcoder, false),
    ("smollm", Regexes::Starcoder, false),
    ("codeshell", Regexes::Starcoder, false),
    ("exaone", Regexes::Starcoder, false),
    ("minerva-7b", Regexes::Starcoder, false),
    ("mellum2", Regexes::Starcoder, false),
    ("deepseek-llm", Regexes::DeepseekLlm, false),
    ("deepseek-coder", Regexes::DeepseekCoder, false),
    ("falcon", Regexes::Falcon, false),
    ("gpt-4o", Regexes::Gpt4o, false),
    ("llama4", Regexes::Gpt4o, false),
    ("kanana2", Regexes::Gpt4o, false),
    ("talkie", Regexes::Gpt4o, false),
];

/// DeepSeek LLM's letters (`\s?[A-Za-zµÀ-ÖØ-ö…]+`), as written in its tokenizer. Six characters
/// are escaped because they are canonical singletons (U+2126 OHM SIGN, U+212A KELVIN SIGN, …)
/// that editors silently normalize to other code points.
const DEEPSEEK_LETTERS: &str = "A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\u{1F7D}ᾀ-ᾴᾶ-ᾼ\u{1FBE}ῂ-ῄῆ-ῌῐ-\u{1FD3}ῖ-\u{1FDB}ῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\u{2126}ℨ\u{212A}-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃";
/// DeepSeek LLM's punctuation (`\s?[!-/:-~！-／：-～‘-‟　-。]+`).
const DEEPSEEK_PUNCTUATION: &str = "!-/:-~！-／：-～‘-‟　-。";
/// DeepSeek's CJK runs (`[一-龥ࠀ-一가-퟿]+`).
const DEEPSEEK_CJK: &str = "一-龥ࠀ-一가-퟿";

/// A character class of one of the regexes.
#[derive(Debug, Clone)]
enum Class {
    /// `\p{X}`: one category group.
    Category(Category),
    /// `[\p{P}…]`: punctuation and the listed ASCII characters.
    PunctuationAnd(&'static str),
    /// Literal code point ranges, sorted and disjoint.
    Ranges(Vec<(u32, u32)>),
}

impl Class {
    /// Parses a bracket expression's body of single characters and `a-b` ranges.
    fn ranges(spec: &str) -> Self {
        let chars: Vec<u32> = spec.chars().map(u32::from).collect();
        let mut ranges = Vec::new();
        let mut i = 0;
        while i < chars.len() {
            if i + 2 < chars.len() && chars[i + 1] == u32::from('-') {
                ranges.push((chars[i], chars[i + 2]));
                i += 3;
            } else {
                ranges.push((chars[i], chars[i]));
                i += 1;
            }
        }
        ranges.sort_unstable();
        let mut merged: Vec<(u32, u32)> = Vec::with_capacity(ranges.len());
        for (lo, hi) in ranges {
            match merged.last_mut() {
                Some(last) if lo <= last.1.saturating_add(1) => last.1 = last.1.max(hi),
                _ => merged.push((lo, hi)),
            }
        }
        Class::Ranges(merged)
    }

    fn contains(&self, c: Cp) -> bool {
        match self {
            Class::Category(group) => c.category == *group,
            Class::PunctuationAnd(extra) => {
                c.category == Category::Punctuation
                    || u8::try_from(c.cp).is_ok_and(|b| extra.as_bytes().contains(&b))
            }
            Class::Ranges(ranges) => {
                // llama.cpp replaced non-ASCII whitespace by `\v` before matching.
                if c.space && c.cp >= 0x80 {
                    return false;
                }
                let after = ranges.partition_point(|&(lo, _)| lo <= c.cp);
                after > 0 && c.cp <= ranges[after - 1].1
            }
        }
    }

    /// How many code points from the start of `cps` are in the class.
    fn run(&self, cps: &[Cp]) -> usize {
        cps.iter().take_while(|&&c| self.contains(c)).count()
    }
}

/// One regex of a pre-tokenizer's list.
#[derive(Debug, Clone)]
enum Pass {
    /// GPT-2's regex, as llama.cpp's `unicode_regex_split_custom_gpt2` matches it.
    Gpt2,
    /// llama3's regex family, as `unicode_regex_split_custom_llama3/qwen2/qwen35` match it:
    /// `\p{N}{1,max_digits}`, and Qwen3.5 counts marks as letters.
    Llama3 { max_digits: usize, marks: bool },
    /// `\s?C+` when `space_prefix`, else `C+`.
    Run { class: Class, space_prefix: bool },
    /// `C{count}`.
    Repeat { class: Class, count: usize },
    /// GPT-4o's (o200k) regex, which llama.cpp runs through `std::regex`.
    Gpt4o,
    /// `\s+$`.
    TrailingSpace,
}

/// The word splitter of one `tokenizer.ggml.pre`.
#[derive(Debug)]
pub(crate) struct PreTokenizer {
    passes: Vec<Pass>,
    ignore_merges: bool,
}

impl PreTokenizer {
    /// The pre-tokenizer named `pre` (`tokenizer.ggml.pre`; empty means `default`, as in
    /// llama.cpp).
    pub(crate) fn new(pre: &str) -> Result<Self, TokenizerError> {
        let name = if pre.is_empty() { "default" } else { pre };
        let Some(&(_, regexes, ignore_merges)) =
            PRE_TOKENIZERS.iter().find(|(known, ..)| *known == name)
        else {
            let supported: Vec<&str> = PRE_TOKENIZERS.iter().map(|(known, ..)| *known).collect();
            return Err(TokenizerError::UnknownPreTokenizer {
                pre: pre.to_owned(),
                supported: supported.join(", "),
            });
        };
        Ok(Self {
            passes: passes(regexes),
            ignore_merges,
        })
    }

    /// Whether a word that is itself a token is emitted as that token without merging.
    pub(crate) fn ignore_merges(&self) -> bool {
        self.ignore_merges
    }

    /// Appends the byte ranges of the words of `text`, in order; together they cover `text`.
    pub(crate) fn split(&self, text: &str, words: &mut Vec<Range<usize>>) {
        let cps: Vec<Cp> = text.chars().map(Cp::new).collect();
        if cps.is_empty() {
            return;
        }
        let mut lengths = vec![cps.len()];
        for pass in &self.passes {
            let mut next = Vec::with_capacity(lengths.len() * 2);
            let mut start = 0;
            for &len in &lengths {
                pass.split(&cps[start..start + len], &mut next);
                start += len;
            }
            lengths = next;
        }
        let mut byte = 0;
        let mut cp = 0;
        for len in lengths {
            let bytes: usize = cps[cp..cp + len]
                .iter()
                .map(|c| usize::from(c.utf8_len))
                .sum();
            words.push(byte..byte + bytes);
            byte += bytes;
            cp += len;
        }
    }
}

/// llama.cpp's regex list for each pre-tokenizer type (`llm_tokenizer_bpe`'s constructor); the
/// comments give the regexes as llama.cpp writes them.
fn passes(regexes: Regexes) -> Vec<Pass> {
    use Category::{Letter, Number, Punctuation};
    let run = |class, space_prefix| Pass::Run {
        class,
        space_prefix,
    };
    let repeat = |class, count| Pass::Repeat { class, count };
    let llama3 = |max_digits, marks| Pass::Llama3 { max_digits, marks };
    match regexes {
        Regexes::Default => vec![
            run(Class::PunctuationAnd("$+<=>^~|"), false), // [\p{P}\$\+<=>\^~\|]+
            Pass::Gpt2,
            run(Class::Category(Number), false), // \p{N}+
            repeat(Class::ranges("0-9"), 3),     // [0-9][0-9][0-9]
        ],
        Regexes::Gpt2 => vec![Pass::Gpt2],
        Regexes::Llama3 => vec![llama3(3, false)],
        Regexes::Qwen2 => vec![llama3(1, false)],
        Regexes::Qwen35 => vec![llama3(1, true)],
        Regexes::Starcoder => vec![repeat(Class::Category(Number), 1), Pass::Gpt2],
        Regexes::DeepseekLlm => vec![
            repeat(Class::ranges("\r\n"), 1),               // [\r\n]
            run(Class::ranges(DEEPSEEK_LETTERS), true),     // \s?[A-Za-zµÀ-ÖØ-ö…]+
            run(Class::ranges(DEEPSEEK_PUNCTUATION), true), // \s?[!-/:-~！-／：-～‘-‟　-。]+
            Pass::TrailingSpace,                            // \s+$
            run(Class::ranges(DEEPSEEK_CJK), false),        // [一-龥ࠀ-一가-퟿]+
            run(Class::Category(Number), false),            // \p{N}+
        ],
        Regexes::DeepseekCoder => vec![
            repeat(Class::ranges("\r\n"), 1),        // [\r\n]
            run(Class::Category(Letter), true),      // \s?\p{L}+
            run(Class::Category(Punctuation), true), // \s?\p{P}+
            run(Class::ranges(DEEPSEEK_CJK), false), // [一-龥ࠀ-一가-퟿]+
            repeat(Class::Category(Number), 1),      // \p{N}
        ],
        Regexes::Falcon => vec![
            run(Class::PunctuationAnd("$+<=>^~|`"), false), // [\p{P}\$\+<=>\^~\|`]+
            Pass::Gpt2,
            repeat(Class::ranges("0-9"), 3), // [0-9][0-9][0-9]
        ],
        Regexes::Gpt4o => vec![Pass::Gpt4o],
    }
}

impl Pass {
    /// Appends the lengths (in code points, all non-zero) of the pieces `cps` splits into.
    fn split(&self, cps: &[Cp], out: &mut Vec<usize>) {
        match self {
            Pass::Gpt2 => tokens(cps, out, gpt2_token),
            Pass::Gpt4o => tokens(cps, out, gpt4o_token),
            Pass::Llama3 { max_digits, marks } => {
                tokens(cps, out, |cps, pos| {
                    llama3_token(cps, pos, *max_digits, *marks)
                });
            }
            Pass::Run {
                class,
                space_prefix,
            } => split_matches(cps, out, |from| find_run(cps, from, class, *space_prefix)),
            Pass::Repeat { class, count } => {
                split_matches(cps, out, |from| find_repeat(cps, from, class, *count));
            }
            Pass::TrailingSpace => split_matches(cps, out, |from| {
                let start = cps.len() - cps.iter().rev().take_while(|c| c.space).count();
                (start >= from && start < cps.len()).then_some((start, cps.len()))
            }),
        }
    }
}

/// Runs a hand-written matcher, which always matches at least one code point, over `cps`.
fn tokens(cps: &[Cp], out: &mut Vec<usize>, token: impl Fn(&[Cp], usize) -> usize) {
    let mut pos = 0;
    while pos < cps.len() {
        // Never zero, so the loop always advances; the clamp keeps a bug from slicing past.
        let len = token(cps, pos).clamp(1, cps.len() - pos);
        out.push(len);
        pos += len;
    }
}

/// Splits `cps` into the matches of a regex and the gaps between them, as llama.cpp does with
/// `std::regex_iterator`; `find(from)` is the leftmost match starting at or after `from`.
fn split_matches(
    cps: &[Cp],
    out: &mut Vec<usize>,
    mut find: impl FnMut(usize) -> Option<(usize, usize)>,
) {
    let mut done = 0;
    while let Some((start, end)) = find(done) {
        // Matches are never empty; the guard keeps a bug from looping forever.
        if end <= start || start < done {
            break;
        }
        if start > done {
            out.push(start - done);
        }
        out.push(end - start);
        done = end;
    }
    if done < cps.len() {
        out.push(cps.len() - done);
    }
}

/// The leftmost match of `\s?C+` (or `C+`) at or after `from`.
fn find_run(cps: &[Cp], from: usize, class: &Class, space_prefix: bool) -> Option<(usize, usize)> {
    (from..cps.len()).find_map(|i| {
        // `\s?` is greedy: with a whitespace here, first try it followed by the run.
        if space_prefix && cps[i].space {
            let run = class.run(&cps[i + 1..]);
            if run > 0 {
                return Some((i, i + 1 + run));
            }
        }
        let run = class.run(&cps[i..]);
        (run > 0).then_some((i, i + run))
    })
}

/// The leftmost match of `C{count}` at or after `from`.
fn find_repeat(cps: &[Cp], from: usize, class: &Class, count: usize) -> Option<(usize, usize)> {
    let last = cps.len().checked_sub(count)?;
    (from..=last)
        .find(|&i| cps[i..i + count].iter().all(|&c| class.contains(c)))
        .map(|i| (i, i + count))
}

/// Counts the code points from `from` on that satisfy `pred`.
fn count_while(cps: &[Cp], from: usize, pred: impl Fn(Cp) -> bool) -> usize {
    cps.get(from..)
        .map_or(0, |rest| rest.iter().take_while(|&&c| pred(c)).count())
}

/// The length of `'s|'t|'re|'ve|'m|'ll|'d` at `pos` (case-insensitive for the llama3 family).
fn contraction(cps: &[Cp], pos: usize, any_case: bool) -> Option<usize> {
    if !cps[pos].is('\'') {
        return None;
    }
    let lower = |i: usize| {
        cps.get(i).map(|c| match u8::try_from(c.cp) {
            Ok(b) if any_case => b.to_ascii_lowercase(),
            Ok(b) => b,
            Err(_) => 0,
        })
    };
    let first = lower(pos + 1)?;
    if matches!(first, b's' | b't' | b'm' | b'd') {
        return Some(2);
    }
    let second = lower(pos + 2)?;
    matches!((first, second), (b'r', b'e') | (b'v', b'e') | (b'l', b'l')).then_some(3)
}

/// `\s+(?!\S)|\s+` at `pos`: a whitespace run, less its last code point when something follows
/// it (that one then leads the next word).
fn whitespace_run(cps: &[Cp], pos: usize) -> usize {
    let run = count_while(cps, pos, |c| c.space);
    if run > 1 && pos + run < cps.len() {
        run - 1
    } else {
        run.max(1)
    }
}

/// The length of the word at `pos` under GPT-2's regex:
/// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
fn gpt2_token(cps: &[Cp], pos: usize) -> usize {
    if let Some(len) = contraction(cps, pos, false) {
        return len;
    }
    let lead = usize::from(cps[pos].is(' '));
    let Some(&probe) = cps.get(pos + lead) else {
        return whitespace_run(cps, pos);
    };
    let other = |c: Cp| !(c.space || c.letter() || c.number());
    let run = if probe.letter() {
        count_while(cps, pos + lead, Cp::letter)
    } else if probe.number() {
        count_while(cps, pos + lead, Cp::number)
    } else if other(probe) {
        count_while(cps, pos + lead, other)
    } else {
        return whitespace_run(cps, pos);
    };
    lead + run
}

/// The length of the word at `pos` under llama3's regex
/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
/// or its Qwen variants (`\p{N}` alone; Qwen3.5 `[\p{L}\p{M}]` for letters).
fn llama3_token(cps: &[Cp], pos: usize, max_digits: usize, marks: bool) -> usize {
    if let Some(len) = contraction(cps, pos, true) {
        return len;
    }
    let c = cps[pos];
    let wordish = |c: Cp| c.letter() || (marks && c.mark());
    if !c.newline() && !c.number() && (wordish(c) || cps.get(pos + 1).is_some_and(|&n| wordish(n)))
    {
        return 1 + count_while(cps, pos + 1, wordish);
    }
    if c.number() {
        // Bounded count: counting the whole run each time would be quadratic in its length.
        return cps[pos..]
            .iter()
            .take(max_digits)
            .take_while(|c| c.number())
            .count();
    }
    let other = |c: Cp| !(c.space || wordish(c) || c.number());
    let lead = usize::from(c.is(' '));
    // llama.cpp also takes this branch for a lone space at the end of the piece.
    if cps.get(pos + lead).is_none_or(|&p| other(p)) {
        let symbols = count_while(cps, pos + lead, other);
        let newlines = count_while(cps, pos + lead + symbols, Cp::newline);
        return lead + symbols + newlines;
    }
    let run = count_while(cps, pos, |c| c.space);
    // `\s*[\r\n]+`: the run up to and including its last newline.
    if let Some(last_newline) = cps[pos..pos + run].iter().rposition(|c| c.newline()) {
        return last_newline + 1;
    }
    whitespace_run(cps, pos)
}

/// The length of the word at `pos` under GPT-4o's regex as llama.cpp writes it for
/// `std::regex` (every alternative ends in `(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?`,
/// written `C?` here):
/// `[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+C?`
/// `|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*C?`
/// `|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`.
/// A non-ASCII letter, collapsed to one byte that is neither `a-z` nor `A-Z`, is both an
/// upper-case letter (`U`) and a lower-case one (`L`); the backtracking engine takes the first
/// alternative that matches: `U*L+` with the longest `U*` that leaves an `L` after it, else
/// `U+L*`.
fn gpt4o_token(cps: &[Cp], pos: usize) -> usize {
    let c = cps[pos];
    let prefix = usize::from(!c.newline() && !c.letter() && !c.number());
    let start = pos + prefix;
    if cps.get(start).is_some_and(|c| c.letter()) {
        let upper = |c: Cp| c.letter() && !(u32::from('a')..=u32::from('z')).contains(&c.cp);
        let lower = |c: Cp| c.letter() && !(u32::from('A')..=u32::from('Z')).contains(&c.cp);
        let uppers = count_while(cps, start, upper);
        let lower_at = (0..=uppers)
            .rev()
            .find(|&k| cps.get(start + k).is_some_and(|&c| lower(c)));
        // `U*L+`: the longest `U*` followed by an `L`; else `U+L*`, which takes every `U`.
        let end = match lower_at {
            Some(k) => start + k + count_while(cps, start + k, lower),
            None => start + uppers,
        };
        let contraction = if end < cps.len() {
            contraction(cps, end, true).unwrap_or(0)
        } else {
            0
        };
        return end + contraction - pos;
    }
    if c.number() {
        return cps[pos..].iter().take(3).take_while(|c| c.number()).count();
    }
    let other = |c: Cp| !(c.space || c.letter() || c.number());
    let lead = usize::from(c.is(' '));
    if cps.get(pos + lead).is_some_and(|&p| other(p)) {
        let symbols = count_while(cps, pos + lead, other);
        let tail = count_while(cps, pos + lead + symbols, |c| c.newline() || c.is('/'));
        return lead + symbols + tail;
    }
    let run = count_while(cps, pos, |c| c.space);
    // `\s*[\r\n]+`: the run up to and including its last newline.
    if let Some(last_newline) = cps[pos..pos + run].iter().rposition(|c| c.newline()) {
        return last_newline + 1;
    }
    whitespace_run(cps, pos)
}

#[cfg(test)]
mod tests;
