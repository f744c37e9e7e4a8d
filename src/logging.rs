//! Structured logs for CloudWatch: one JSON object per line, carrying the fields of every
//! enclosing span, so each line about a run has the Lambda `request_id` (invocation span) and
//! the `run_id` and `workflow` (run span).
//!
//! Level: `RUST_LOG` (e.g. `info,ironflow_lambda=debug`), else Lambda's advanced logging
//! control `AWS_LAMBDA_LOG_LEVEL` (`TRACE`…`FATAL`), else `info`.
//!
//! A sample line:
//! ```text
//! {"timestamp":"2026-11-30T04:31:04.364Z","level":"INFO","message":"run handed back: Pending for the next invocation",
//!  "target":"ironflow_lambda::handback","spans":[{"name":"invocation","request_id":"8f5c…","worker_id":"lambda-8f5c…-1a2b3c4d"},
//!  {"name":"run","run_id":"01a22ab8-…","workflow":"multi-step"}]}
//! ```

use std::io::Write;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

/// The filter from `RUST_LOG`, else `AWS_LAMBDA_LOG_LEVEL`, else `info`.
pub fn filter() -> EnvFilter {
    if let Ok(filter) = EnvFilter::try_from_default_env() {
        return filter;
    }
    let level = match std::env::var("AWS_LAMBDA_LOG_LEVEL")
        .unwrap_or_default()
        .to_ascii_uppercase()
        .as_str()
    {
        "TRACE" => "trace",
        "DEBUG" => "debug",
        "WARN" => "warn",
        "ERROR" | "FATAL" => "error",
        _ => "info",
    };
    EnvFilter::new(level)
}

/// Install the JSON subscriber writing to `writer` (stdout on Lambda). Returns `false` when a
/// global subscriber was already set.
pub fn init<W>(filter: EnvFilter, writer: W) -> bool
where
    W: for<'a> MakeWriter<'a> + Send + Sync + 'static,
{
    tracing_subscriber::fmt()
        .json()
        .with_env_filter(filter)
        .with_current_span(false)
        .with_span_list(true)
        .flatten_event(true)
        .with_writer(writer)
        .try_init()
        .is_ok()
}

/// A `MakeWriter` that appends to a shared buffer, for tests that read the logs back.
#[derive(Clone, Default)]
pub struct CaptureWriter(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl CaptureWriter {
    /// Everything written so far.
    pub fn contents(&self) -> String {
        String::from_utf8_lossy(
            &self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
        .into_owned()
    }
}

impl Write for CaptureWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for CaptureWriter {
    type Writer = CaptureWriter;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}
