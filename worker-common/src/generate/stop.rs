//! Stop strings matched on the decoded text, with hold-back: text that could still turn into a
//! stop string is not released, so a stop string is never emitted, not even in part (OpenAI's
//! convention, CONTRACT.md).

/// Text released by [`StopMatcher::push`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Released {
    /// Text safe to emit now (possibly empty).
    pub text: String,
    /// The stop string found, if any; generation ends and nothing after it is emitted.
    pub matched: Option<String>,
}

/// Scans the generated text for stop strings.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Generated text not yet released: the longest suffix that is a prefix of a stop string.
    held: String,
}

impl StopMatcher {
    /// A matcher for `stops` (empty strings are ignored; validation refuses them upstream).
    pub fn new(stops: &[String]) -> Self {
        Self {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            held: String::new(),
        }
    }

    /// Adds decoded `text` and returns what may be emitted.
    ///
    /// Every stop occurrence starts inside the held text or the new text, because anything
    /// released earlier was not the start of a possible match.
    pub fn push(&mut self, text: &str) -> Released {
        self.held.push_str(text);
        let earliest = self
            .stops
            .iter()
            .filter_map(|stop| self.held.find(stop.as_str()).map(|at| (at, stop)))
            .min_by_key(|&(at, stop)| (at, std::cmp::Reverse(stop.len())));
        if let Some((at, stop)) = earliest {
            let matched = stop.clone();
            let text = self.held[..at].to_owned();
            self.held.clear();
            return Released {
                text,
                matched: Some(matched),
            };
        }
        let keep = self.partial_match_len();
        let text = self.held[..self.held.len() - keep].to_owned();
        self.held.drain(..self.held.len() - keep);
        Released {
            text,
            matched: None,
        }
    }

    /// Releases the held text when generation ends for another reason.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Length of the longest suffix of the held text that is a proper prefix of a stop string.
    fn partial_match_len(&self) -> usize {
        let held = self.held.as_bytes();
        self.stops
            .iter()
            .filter_map(|stop| {
                let longest = (stop.len() - 1).min(held.len());
                (1..=longest).rev().find(|&k| {
                    held[held.len() - k..] == stop.as_bytes()[..k]
                        && self.held.is_char_boundary(self.held.len() - k)
                })
            })
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matcher(stops: &[&str]) -> StopMatcher {
        StopMatcher::new(&stops.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn no_stops_releases_everything() {
        let mut m = matcher(&[]);
        assert_eq!(m.push("abc").text, "abc");
        assert_eq!(m.finish(), "");
    }

    #[test]
    fn stop_split_across_pushes_is_never_emitted() {
        let mut m = matcher(&["\n\nUser:"]);
        let mut out = String::new();
        for piece in ["Hello", " world", "\n", "\nUs", "er", ":", " more"] {
            let released = m.push(piece);
            out.push_str(&released.text);
            if let Some(stop) = released.matched {
                assert_eq!(stop, "\n\nUser:");
                assert_eq!(out, "Hello world");
                return;
            }
        }
        panic!("stop not matched; emitted {out:?}");
    }

    #[test]
    fn false_start_is_released_once_it_cannot_match() {
        let mut m = matcher(&["STOP"]);
        assert_eq!(m.push("ST").text, "");
        assert_eq!(m.push("AR").text, "STAR");
        assert_eq!(m.push("S").text, "");
        assert_eq!(m.finish(), "S");
    }

    #[test]
    fn earliest_stop_wins_and_text_after_it_is_dropped() {
        let mut m = matcher(&["b", "a"]);
        let released = m.push("xxab yy");
        assert_eq!(released.text, "xx");
        assert_eq!(released.matched.as_deref(), Some("a"));
    }

    #[test]
    fn multibyte_text_is_held_on_char_boundaries() {
        let mut m = matcher(&["日本語"]);
        assert_eq!(m.push("こんにちは日本").text, "こんにちは");
        let released = m.push("語です");
        assert_eq!(released.text, "");
        assert_eq!(released.matched.as_deref(), Some("日本語"));
    }
}
