//! Splits input text around special tokens before the model's algorithm sees it, so that a
//! special token is always one id and never broken into pieces (the bug that sank the original
//! project's tokenizer).

use super::Vocab;

/// A piece of the input: text for the algorithm, or a special token matched as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fragment<'t> {
    /// Text without special tokens.
    Text(&'t str),
    /// A special token found in the text.
    Token(u32),
}

/// Splits `text` around special tokens, longest texts first, as llama.cpp's
/// `tokenizer_st_partition` does. User-defined tokens are always matched; control and unknown
/// tokens only when `parse_special` is set.
pub(crate) fn partition<'t>(
    vocab: &Vocab,
    text: &'t str,
    parse_special: bool,
) -> Vec<Fragment<'t>> {
    if text.is_empty() {
        return Vec::new();
    }
    let mut fragments = vec![Fragment::Text(text)];
    for &id in vocab.specials_by_length() {
        let Some(token_type) = vocab.token_type(id) else {
            continue;
        };
        if !parse_special && token_type != super::TokenType::UserDefined {
            continue;
        }
        let Some(needle) = vocab.text(id).filter(|t| !t.is_empty()) else {
            continue;
        };
        if !fragments
            .iter()
            .any(|f| matches!(f, Fragment::Text(t) if t.contains(needle)))
        {
            continue;
        }
        fragments = fragments
            .into_iter()
            .flat_map(|fragment| match fragment {
                Fragment::Text(t) => split_on(t, needle, id, vocab.strips_right(id)),
                token => vec![token],
            })
            .collect();
    }
    fragments
}

/// Splits one text fragment at every occurrence of `needle`.
fn split_on<'t>(text: &'t str, needle: &str, id: u32, strip_right: bool) -> Vec<Fragment<'t>> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(needle) {
        if at > 0 {
            out.push(Fragment::Text(&rest[..at]));
        }
        out.push(Fragment::Token(id));
        rest = &rest[at + needle.len()..];
        if strip_right {
            rest = rest.trim_start_matches(|c: char| c.is_ascii_whitespace() || c == '\x0b');
        }
    }
    if !rest.is_empty() {
        out.push(Fragment::Text(rest));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_on_keeps_text_around_every_match() {
        let parts = split_on("a<s>b<s><s>", "<s>", 7, false);
        assert_eq!(
            parts,
            vec![
                Fragment::Text("a"),
                Fragment::Token(7),
                Fragment::Text("b"),
                Fragment::Token(7),
                Fragment::Token(7)
            ]
        );
        let stripped = split_on("<s>  x", "<s>", 7, true);
        assert_eq!(stripped, vec![Fragment::Token(7), Fragment::Text("x")]);
    }
}
