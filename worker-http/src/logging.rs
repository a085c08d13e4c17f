//! Log set-up: JSON lines (default) or text on stdout, filtered by `RUST_LOG` (default `info`).
//!
//! Text lines are coloured only when stdout is a terminal (and `NO_COLOR` is unset), never in a
//! pipe or a file. Their messages and field values have control characters escaped ([`Escape`]):
//! a client-chosen string such as a `job_id` holding a newline cannot forge a log line, nor an ESC
//! drive the operator's terminal. JSON lines are escaped by serde.

use std::fmt::{self, Write as _};
use std::io::IsTerminal;

use tracing::field::{Field, Visit};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::fmt::format::Writer;

use crate::LogFormat;

/// Installs the global subscriber; a second call (tests) is a no-op.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false);
    let _ = match format {
        LogFormat::Json => builder
            .with_ansi(false)
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .try_init(),
        LogFormat::Text => builder
            .with_ansi(colour_stdout())
            .fmt_fields(EscapedFields)
            .try_init(),
    };
}

/// Colour only for a terminal, and never against `NO_COLOR` (<https://no-color.org/>).
fn colour_stdout() -> bool {
    std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// The text format's fields: the message bare, then `name=value` pairs, separated by spaces,
/// each written through [`Escape`].
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct EscapedFields;

impl<'w> FormatFields<'w> for EscapedFields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'w>, fields: R) -> fmt::Result {
        let mut visitor = EscapedVisitor {
            writer,
            first: true,
            result: Ok(()),
        };
        fields.record(&mut visitor);
        visitor.result
    }
}

struct EscapedVisitor<'w> {
    writer: Writer<'w>,
    first: bool,
    result: fmt::Result,
}

impl Visit for EscapedVisitor<'_> {
    // `record_str` keeps its default (Debug: quoted, already escaped); a `%value` field or the
    // message arrives here as written, so it is escaped here.
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let name = field.name();
        // `log` crate records forwarded by tracing-log: metadata already shown.
        if self.result.is_err() || name.starts_with("log.") {
            return;
        }
        let sep = if std::mem::take(&mut self.first) {
            ""
        } else {
            " "
        };
        self.result = if name == "message" {
            write!(self.writer, "{sep}")
        } else {
            let name = name.strip_prefix("r#").unwrap_or(name);
            write!(self.writer, "{sep}{name}=")
        }
        .and_then(|()| write!(Escape(&mut self.writer), "{value:?}"));
    }
}

/// A writer that escapes what would break a log line or reach the terminal: `\n`, `\r`, `\t`,
/// ESC as `\x1b`, every other C0 control and DEL as `\xNN`, C1 controls as `\u{NN}`.
pub(crate) struct Escape<W>(pub(crate) W);

impl<W: fmt::Write> fmt::Write for Escape<W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let mut rest = s;
        while let Some(at) = rest.find(char::is_control) {
            self.0.write_str(&rest[..at])?;
            let c = rest[at..].chars().next().unwrap_or_default();
            match c {
                '\n' => self.0.write_str("\\n")?,
                '\r' => self.0.write_str("\\r")?,
                '\t' => self.0.write_str("\\t")?,
                c if u32::from(c) < 0x80 => write!(self.0, "\\x{:02x}", u32::from(c))?,
                c => write!(self.0, "\\u{{{:x}}}", u32::from(c))?,
            }
            rest = &rest[at + c.len_utf8()..];
        }
        self.0.write_str(rest)
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::sync::{Arc, Mutex};

    use super::*;

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Buf {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Buf {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    const HOSTILE: &str = "a\nINFO event=\"forged\"\r\t\x1b[31mred\x07\x7f\u{9b}z";

    fn escape(s: &str) -> String {
        let mut out = String::new();
        write!(Escape(&mut out), "{s}").unwrap();
        out
    }

    #[test]
    fn escape_rewrites_every_control_character() {
        assert_eq!(
            escape(HOSTILE),
            "a\\nINFO event=\"forged\"\\r\\t\\x1b[31mred\\x07\\x7f\\u{9b}z"
        );
        assert_eq!(escape("plain ünïcode ✓"), "plain ünïcode ✓");
        assert_eq!(escape("\0\u{1f}"), "\\x00\\x1f");
    }

    fn log_hostile() {
        let id = HOSTILE.to_owned();
        tracing::info!(event = "job_start", job_id = %id, debug_id = ?id, str_id = id.as_str(), "msg {id}");
    }

    #[test]
    fn text_lines_cannot_be_forged() {
        let buf = Buf::default();
        let sink = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || sink.clone())
            .with_ansi(false)
            .with_target(false)
            .fmt_fields(EscapedFields)
            .finish();
        tracing::subscriber::with_default(subscriber, log_hostile);
        let out = buf.text();
        assert_eq!(out.matches('\n').count(), 1, "one line: {out:?}");
        assert!(out.ends_with('\n'));
        assert!(!out.chars().any(|c| c.is_control() && c != '\n'), "{out:?}");
        let line = out.trim_end();
        assert!(
            line.contains(" INFO msg a\\nINFO event=\"forged\"\\r\\t\\x1b[31mred"),
            "{line}"
        );
        assert!(
            line.contains(" event=\"job_start\" job_id=a\\nINFO"),
            "{line}"
        );
        assert!(line.contains(" debug_id=\"a\\nINFO"), "{line}");
        assert!(line.contains(" str_id=\"a\\nINFO"), "{line}");
    }

    #[test]
    fn json_lines_are_escaped_by_serde() {
        let buf = Buf::default();
        let sink = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || sink.clone())
            .with_ansi(false)
            .json()
            .flatten_event(true)
            .finish();
        tracing::subscriber::with_default(subscriber, log_hostile);
        let out = buf.text();
        assert_eq!(out.matches('\n').count(), 1, "one line: {out:?}");
        // serde escapes C0 controls (ESC included); C1 and DEL stay as valid JSON text.
        assert!(!out.chars().any(|c| c < ' ' && c != '\n'), "{out:?}");
        let line: serde_json::Value = serde_json::from_str(out.trim_end()).unwrap();
        assert_eq!(line["job_id"], HOSTILE);
        assert_eq!(line["message"], format!("msg {HOSTILE}"));
    }
}
