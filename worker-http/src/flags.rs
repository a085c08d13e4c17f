//! Flags both workers share; each is also read from `LLORCH_<FLAG>` in the environment.

use std::net::IpAddr;
use std::path::PathBuf;

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One JSON object per line (the default, for log shippers).
    Json,
    /// Human-readable lines.
    Text,
}

/// The command line of `specs/CONTRACT.md`, minus the backend-specific flags.
#[derive(Debug, Clone, clap::Args)]
pub struct CommonFlags {
    /// The GGUF model file to serve for the life of the process.
    #[arg(long, env = "LLORCH_MODEL")]
    pub model: PathBuf,

    /// Worker identity reported to the pool manager (default: a fresh UUIDv4).
    #[arg(long, env = "LLORCH_WORKER_ID", default_value_t = uuid::Uuid::new_v4().to_string())]
    pub worker_id: String,

    /// Port to listen on; 0 picks a free one, which is logged and used in the callback.
    #[arg(long, env = "LLORCH_PORT", default_value_t = 0)]
    pub port: u16,

    /// Address to listen on.
    #[arg(long, env = "LLORCH_HOST", default_value = "127.0.0.1")]
    pub host: IpAddr,

    /// URL to POST the ready callback to once the model is loaded.
    #[arg(long, env = "LLORCH_CALLBACK_URL")]
    pub callback_url: Option<String>,

    /// Host name put in the callback's `uri` (default: the listen address).
    #[arg(long, env = "LLORCH_ADVERTISE_HOST")]
    pub advertise_host: Option<String>,

    /// Context length in tokens (default: min(model context, 8192)).
    #[arg(long, env = "LLORCH_CTX_SIZE", value_parser = clap::value_parser!(u32).range(1..))]
    pub ctx_size: Option<u32>,

    /// Upper bound on `max_tokens` of any request.
    #[arg(long, env = "LLORCH_MAX_TOKENS_OUT", default_value_t = 2048, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_tokens_out: u32,

    /// Most prompt tokens one job may have, after templating (default: the context, as
    /// llama-server). On the CPU a long prompt is paced beside the running jobs (a step with
    /// decodes waiting takes at most 1.25x a decode-only step, specs/BATCHING.md), so it
    /// slows its own answer, not theirs; this bounds what one request can ask.
    #[arg(long, env = "LLORCH_MAX_PROMPT_TOKENS", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_prompt_tokens: Option<u32>,

    /// Jobs that may wait behind the running ones.
    #[arg(long, env = "LLORCH_QUEUE_DEPTH", default_value_t = 16)]
    pub queue_depth: u32,

    /// Most jobs decoded together (default: as many full contexts as the KV pool holds, 1 to 64).
    #[arg(long, env = "LLORCH_PARALLEL", value_parser = clap::value_parser!(u32).range(1..=256))]
    pub parallel: Option<u32>,

    /// Most tokens in one engine step: every running decode's token, then prefill chunks (raised
    /// to one prefill chunk plus one decode per slot when smaller); at most 65,535, the rows a
    /// CUDA pass can hold.
    #[arg(long, env = "LLORCH_BATCH_TOKENS", default_value_t = 512, value_parser = clap::value_parser!(u32).range(256..=65535))]
    pub batch_tokens: u32,

    /// MiB for the KV page pool (default: the backend's, see specs/BATCHING.md).
    #[arg(long, env = "LLORCH_KV_CACHE_MB", value_parser = clap::value_parser!(u64).range(1..))]
    pub kv_cache_mb: Option<u64>,

    /// Never share KV pages between prompts with the same beginning.
    #[arg(long, env = "LLORCH_NO_PREFIX_CACHE")]
    pub no_prefix_cache: bool,

    /// Speculative decoding by prompt lookup: a greedy job drafts the tokens that followed the
    /// latest earlier occurrence of its last few tokens, and one step verifies them (the same
    /// tokens as without, faster where the output repeats the input; specs/SPECULATIVE.md).
    #[arg(long, env = "LLORCH_SPEC_NGRAM", conflicts_with = "draft_model")]
    pub spec_ngram: bool,

    /// Speculative decoding with a draft model: a smaller GGUF model with the same vocabulary
    /// drafts each job's next tokens on the same backend (its own KV pages), and one step of
    /// the model verifies them (the same tokens as without; specs/SPECULATIVE.md).
    #[arg(long, env = "LLORCH_DRAFT_MODEL", value_name = "PATH")]
    pub draft_model: Option<std::path::PathBuf>,

    /// Most tokens a job drafts for one step when speculating (fewer while the model disagrees
    /// with its drafts or the step has no room for them).
    #[arg(long, env = "LLORCH_DRAFT_MAX", default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub draft_max: u32,

    /// Seconds a job may run before it ends with INFERENCE_TIMEOUT.
    #[arg(long, env = "LLORCH_INFERENCE_TIMEOUT_SEC", default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    pub inference_timeout_sec: u64,

    /// Seconds a running job may continue after a shutdown request before it is cancelled; also
    /// how long a worker whose device failed reports `failed` before it exits 1.
    #[arg(long, env = "LLORCH_SHUTDOWN_GRACE_SEC", default_value_t = 30)]
    pub shutdown_grace_sec: u64,

    /// Most HTTP connections open at once; a few are kept for /health and /metrics (default: from
    /// the descriptor limit, at most 4096).
    #[arg(long, env = "LLORCH_MAX_CONNECTIONS", value_parser = clap::value_parser!(u32).range(8..))]
    pub max_connections: Option<u32>,

    /// Seconds a connection may take to send a request head, counted from its opening or its
    /// previous response (closes idle keep-alive connections too).
    #[arg(long, env = "LLORCH_HTTP_IDLE_TIMEOUT_SEC", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub http_idle_timeout_sec: u64,

    /// Seconds a client may leave its stream unread before it counts as gone and its job is
    /// cancelled (`client_stalled`).
    #[arg(long, env = "LLORCH_STREAM_STALL_SEC", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub stream_stall_sec: u64,

    /// Require `Authorization: Bearer <key>` on every route but /health and /metrics. A key on
    /// the command line is visible to every user of the host (`ps`): prefer --api-key-file or
    /// the LLORCH_API_KEY environment variable.
    #[arg(
        long,
        env = "LLORCH_API_KEY",
        hide_env_values = true,
        conflicts_with = "api_key_file"
    )]
    pub api_key: Option<ApiKey>,

    /// Read the API key from this file (its first line).
    #[arg(long, env = "LLORCH_API_KEY_FILE")]
    pub api_key_file: Option<PathBuf>,

    /// Log line format.
    #[arg(long, env = "LLORCH_LOG_FORMAT", value_enum, default_value_t = LogFormat::Json)]
    pub log_format: LogFormat,
}

/// A secret bearer key; never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// The key's bytes, to compare in constant time.
    pub fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }

    /// Reads the key from the first line of `path`.
    pub fn from_file(path: &std::path::Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|err| format!("reading the API key file {}: {err}", path.display()))?;
        text.lines()
            .next()
            .unwrap_or("")
            .parse()
            .map_err(|err| format!("the API key file {}: {err}", path.display()))
    }
}

impl std::str::FromStr for ApiKey {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let key = text.trim();
        if key.is_empty() {
            return Err("the API key is empty".into());
        }
        if !key.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("the API key must be printable ASCII without spaces".into());
        }
        Ok(Self(key.to_owned()))
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        common: CommonFlags,
    }

    #[test]
    fn defaults_follow_the_contract() {
        let cli = Cli::try_parse_from(["worker", "--model", "m.gguf"]).unwrap();
        let flags = cli.common;
        assert_eq!(flags.port, 0);
        assert_eq!(flags.host.to_string(), "127.0.0.1");
        assert_eq!((flags.max_tokens_out, flags.queue_depth), (2048, 16));
        assert_eq!(
            (flags.inference_timeout_sec, flags.shutdown_grace_sec),
            (300, 30)
        );
        assert_eq!(flags.log_format, LogFormat::Json);
        assert_eq!((flags.parallel, flags.batch_tokens), (None, 512));
        assert!(flags.kv_cache_mb.is_none() && !flags.no_prefix_cache);
        assert!(uuid::Uuid::parse_str(&flags.worker_id).is_ok());
        assert_eq!(flags.max_connections, None);
        assert_eq!(flags.max_prompt_tokens, None);
        assert_eq!(
            (flags.http_idle_timeout_sec, flags.stream_stall_sec),
            (10, 30)
        );
        assert!(flags.api_key.is_none() && flags.api_key_file.is_none());
    }

    #[test]
    fn api_keys_are_checked_and_never_printed() {
        let cli = Cli::try_parse_from(["worker", "--model", "m", "--api-key", "s3cret"]).unwrap();
        let key = cli.common.api_key.unwrap();
        assert_eq!(key.as_bytes(), b"s3cret");
        assert!(!format!("{key:?}").contains("s3cret"));
        assert!(Cli::try_parse_from(["worker", "--model", "m", "--api-key", " "]).is_err());
        assert!(Cli::try_parse_from(["worker", "--model", "m", "--api-key", "a b"]).is_err());
    }

    #[test]
    fn missing_model_and_bad_values_are_usage_errors() {
        assert!(Cli::try_parse_from(["worker"]).is_err());
        assert!(Cli::try_parse_from(["worker", "--model", "m", "--port", "70000"]).is_err());
        assert!(Cli::try_parse_from(["worker", "--model", "m", "--log-format", "xml"]).is_err());
    }
}
