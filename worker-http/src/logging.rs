//! Log set-up: JSON lines (default) or text on stdout, filtered by `RUST_LOG` (default `info`).

use tracing_subscriber::EnvFilter;

use crate::LogFormat;

/// Installs the global subscriber; a second call (tests) is a no-op.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false);
    let _ = match format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .try_init(),
        LogFormat::Text => builder.try_init(),
    };
}
