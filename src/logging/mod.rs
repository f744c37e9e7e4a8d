//! Structured logs for CloudWatch: one flat JSON object per line ([`JsonLines`]), carrying the
//! fields of every enclosing span at the top level, so each line about a run has the Lambda
//! `requestId` and `request_id` (the runtime's and the invocation's spans) and the `run_id` and
//! `workflow` (the run's span), each once, at the same place on every line.
//!
//! Level: `RUST_LOG` (e.g. `info,ironflow_lambda=debug`), else Lambda's advanced logging
//! control `AWS_LAMBDA_LOG_LEVEL` (`TRACE`…`FATAL`), else `info`. A `RUST_LOG` that would leave
//! every line of this crate out (a mistyped level such as `infoo`) is set aside with a warning
//! (`filter_problem`). A panic is one of these lines too ([`log_panics`]), not Rust's default
//! text on stderr.
//!
//! A sample line (docs/operations.md, "Logs", shows how to query them):
//! ```text
//! {"timestamp":"2026-11-30T04:31:04.364210Z","level":"INFO","message":"run handed back: Pending for the next invocation",
//!  "executed_ms":14021,"target":"ironflow_lambda::handback","run_id":"01a22ab8-…","workflow":"multi-step",
//!  "request_id":"8f5c…","worker_id":"lambda-8f5c…-1a2b3c4d","requestId":"8f5c…","xrayTraceId":"Root=1-…","span":"run"}
//! ```
//!
//! **No secret in any line, at any level** (docs/push.md, "Secrets and logs"). Three rules, applied
//! to every line whatever `RUST_LOG` says:
//! 1. TRACE events and spans of other crates are never written: at that level libraries print
//!    wire data. lambda_runtime prints each raw event (`lambda_runtime::layers::api_response`,
//!    "raw JSON event received from Lambda": a Function URL request with its `?token=` and
//!    `X-Signature-256`), the AWS SDK each request and response
//!    (`aws_smithy_runtime::client::orchestrator`: the GetSecretValue answer, SigV4 headers).
//!    This crate's own TRACE lines (`ironflow_lambda*`) pass.
//! 2. Each line is redacted before it is written, whoever logged it: every secret value the process holds
//!    ([`redact`]: each [`WorkerToken`](crate::settings::WorkerToken) and
//!    [`WebhookSecret`](crate::settings::WebhookSecret) registers itself when it is made, and a worker's
//!    `IRONFLOW_HEARTBEAT_URL` when it is built), as it is, as JSON
//!    and `Debug` escape it and percent-encoded; the digest of any `sha256=<hex>` (a webhook
//!    signature); what follows `Bearer ` (an `Authorization` header); the value of a
//!    `token=` parameter; and an AWS access key id (`AKIA…`, `ASIA…`); each of these only
//!    when it is at least [`MIN_REDACTED_LEN`] characters long (a shorter run is a word of
//!    prose, not a credential). A line stays JSON
//!    ([`redacted_json`]): a secret found outside a string (a digit-only one logged as an
//!    integer field) turns that whole value into the string `"[redacted]"`, a string is
//!    redacted in its decoded text, and a line in which a secret spans the JSON structure is
//!    replaced whole ([`SPANNED_LINE`]).
//! 3. Where a workflow puts credentials inline, a shell step's command and a URL's query, is
//!    withheld: the `command` and `url` fields of ironflow's events and spans, and in any text
//!    of any line the command a shell step's timeout names and a URL's query, fragment and
//!    user info (`src/logging/engine.rs`).
//!
//! **Routine lines.** The engine's lines that each step or run completed (seven of the nine and
//! a half lines of a three-step shell run) are written only when the filter asks for DEBUG for
//! some target (`src/logging/engine.rs`).
//!
//! What it cannot cover: a secret shorter than [`MIN_REDACTED_LEN`] (not registered: it would
//! mangle every line that contains it by chance), a secret in an encoding other than those
//! above, a credential a failed command printed on its stderr (written as it is: the failure's
//! first clue), and anything written to stdout or stderr without `tracing`.
//!
//! The module map: [docs/structure.md](https://github.com/ironflow-lambda/ironflow-lambda/blob/main/docs/structure.md).

mod engine;
mod line;

use std::borrow::Cow;
use std::sync::{PoisonError, RwLock};

use tracing::{Level, Metadata};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::{FilterExt, filter_fn};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::prelude::*;

pub use line::JsonLines;

/// The shortest secret [`redact`] registers: 8 characters.
pub const MIN_REDACTED_LEN: usize = 8;

/// What a redacted value becomes in a line.
pub const REDACTED: &str = "[redacted]";

/// The forms of the secrets this process holds, as they may appear in a line.
static SECRETS: RwLock<Vec<String>> = RwLock::new(Vec::new());

/// Redact `secret` from every log line written from now on (rule 2 of the module docs); a
/// secret shorter than [`MIN_REDACTED_LEN`] is not registered. Idempotent.
pub fn redact(secret: &str) {
    if secret.chars().count() < MIN_REDACTED_LEN {
        return;
    }
    let json = |s: &str| {
        let quoted = serde_json::to_string(s).unwrap_or_default();
        quoted[1..quoted.len().saturating_sub(1).max(1)].to_string()
    };
    let debug = format!("{secret:?}");
    let forms = [
        secret.to_string(),
        json(secret),
        json(&debug[1..debug.len() - 1]),
        percent_encoded(secret),
    ];
    let mut secrets = SECRETS.write().unwrap_or_else(PoisonError::into_inner);
    for form in forms {
        if !form.is_empty() && !secrets.contains(&form) {
            secrets.push(form);
        }
    }
    // The longest first, so that a form containing another is redacted whole.
    secrets.sort_by_key(|form| std::cmp::Reverse(form.len()));
}

/// Every byte but the unreserved ones of RFC 3986 as `%XX`.
fn percent_encoded(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `line` with every registered secret and every signature, bearer token and `token=` value
/// replaced by [`REDACTED`] (rule 2 of the module docs).
pub fn redacted(line: &str) -> Cow<'_, str> {
    let mut out = Cow::Borrowed(line);
    for secret in SECRETS
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
    {
        if out.contains(secret.as_str()) {
            out = Cow::Owned(out.replace(secret.as_str(), REDACTED));
        }
    }
    for (prefix, is_value) in VALUE_PATTERNS {
        if out.contains(prefix) {
            // Prose ("sent as a bearer token") keeps the line as it was, uncopied.
            if let Some(hidden) = redact_after(&out, prefix, *is_value) {
                out = Cow::Owned(hidden);
            }
        }
    }
    out
}

/// `text` as a line shows it: [`redacted`] (rule 2), then what rule 3 withholds in any text
/// (`src/logging/engine.rs`): a shell timeout's command, and a URL's query, fragment and user
/// info. `text` itself where nothing is hidden or withheld.
///
/// Withholding deletes text, which can join two pieces into a secret rule 2 finds (a token
/// registered as a URL's user info and a prefix before it): where it changed anything, the
/// result is redacted again.
fn shown(text: &str) -> Cow<'_, str> {
    let mut out = redacted(text);
    let mut withheld = false;
    if out.contains(engine::TIMED_OUT)
        && let Some(shorter) = engine::timed_out_command(&out)
    {
        out = Cow::Owned(shorter);
        withheld = true;
    }
    if out.contains("//")
        && let Some(bare) = engine::bare_urls(&out)
    {
        out = Cow::Owned(bare);
        withheld = true;
    }
    if withheld && let Cow::Owned(hidden) = redacted(&out) {
        out = Cow::Owned(hidden);
    }
    out
}

/// Whether `line` may hold text [`shown`] withholds: a shell timeout, or a URL with a query, a
/// fragment or user info (`//` with a `?`, `#` or `@`). Such a line is read value by value,
/// decoded: its JSON text would end a URL at an escape (`\"`, `\u0001`). Where this is false,
/// `shown` of any text of the line is [`redacted`] of it.
fn may_withhold(line: &str) -> bool {
    line.contains(engine::TIMED_OUT) || (line.contains("//") && line.contains(['?', '#', '@']))
}

/// `line`, one JSON value, redacted as [`redacted`] does it, with what rule 3 withholds in any
/// text withheld (`shown`), and still JSON. Where the line can hold nothing to withhold
/// (`may_withhold`) and nothing to redact (nearly every line), `line` itself. Otherwise each
/// value is redacted on its own: a string's decoded text (so that a replacement never cuts an
/// escape sequence in two, and the string is encoded again), and a token outside any string
/// (a number, `true`, `false`, `null`: a digit-only secret logged as an integer field) whole,
/// as the string `"[redacted]"`. A secret still found in the result spans the line's structure
/// (it holds a quote, a comma or a brace: no credential we register does in practice): the
/// line is then [`SPANNED_LINE`], whose one field says so. So no registered secret is ever in
/// the line, and the line stays one JSON object.
pub fn redacted_json(line: &str) -> Cow<'_, str> {
    if !may_withhold(line) && matches!(redacted(line), Cow::Borrowed(_)) {
        return Cow::Borrowed(line);
    }
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(at) = rest.find(|c: char| c == '"' || is_bare(c)) {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        let len = if rest.starts_with('"') {
            string_len(rest)
        } else {
            rest.find(|c: char| !is_bare(c)).unwrap_or(rest.len())
        };
        let (value, tail) = rest.split_at(len);
        push_value(&mut out, value);
        rest = tail;
    }
    out.push_str(rest);
    if matches!(redacted(&out), Cow::Borrowed(_)) {
        Cow::Owned(out)
    } else {
        let newline = if line.ends_with('\n') { "\n" } else { "" };
        Cow::Owned(format!("{SPANNED_LINE}{newline}"))
    }
}

/// The line written instead of one in which a secret spans the JSON structure
/// ([`redacted_json`]).
pub const SPANNED_LINE: &str =
    r#"{"level":"WARN","message":"[redacted]: a line held a secret across its JSON structure"}"#;

/// [`REDACTED`] as a JSON string, quotes included: what a hidden value becomes in a line.
const REDACTED_STRING: &str = "\"[redacted]\"";

/// Whether `c` belongs to a token outside any string (not whitespace, a quote or a structural
/// character).
fn is_bare(c: char) -> bool {
    !(c == '"' || c.is_whitespace() || matches!(c, '{' | '}' | '[' | ']' | ',' | ':'))
}

/// The length in bytes of the JSON string literal `s` starts with, quotes included (to the end
/// of `s` if it is not closed).
fn string_len(s: &str) -> usize {
    let mut escaped = false;
    for (at, c) in s.char_indices().skip(1) {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '"' => return at + 1,
            _ => {}
        }
    }
    s.len()
}

/// `value` (a string literal, quotes included, or a token outside any string), redacted on
/// its own: a string's decoded text, encoded again if anything in it was hidden; a token, whole,
/// as the string [`REDACTED`].
fn push_value(out: &mut String, value: &str) {
    if !value.starts_with('"') {
        let hidden = !matches!(redacted(value), Cow::Borrowed(_));
        out.push_str(if hidden { REDACTED_STRING } else { value });
        return;
    }
    let decoded = serde_json::from_str::<String>(value);
    match decoded.as_deref().map(shown) {
        // Nothing hidden in the text: the literal as it was.
        Ok(Cow::Borrowed(_)) => out.push_str(value),
        Ok(Cow::Owned(hidden)) => match serde_json::to_string(&hidden) {
            Ok(encoded) => out.push_str(&encoded),
            Err(_) => out.push_str(REDACTED_STRING),
        },
        // Not a string serde_json reads (cannot come from this module's lines): hidden whole.
        Err(_) => out.push_str(REDACTED_STRING),
    }
}

/// A prefix whose value is redacted, and what the value's characters are.
type ValuePattern = (&'static str, fn(char) -> bool);

/// The values redacted whoever logs them (rule 2): a signature's digest, a bearer token, a
/// `token` parameter, and an AWS access key id (`AKIA…` long-term, `ASIA…` temporary, as a
/// Lambda role's: the AWS SDK's DEBUG lines print the credentials' `Debug`, whose secret key
/// and session token it hides, not the key id). A value is a run of at least
/// [`MIN_REDACTED_LEN`] of its characters, so that prose ("sent as a bearer token)") keeps
/// its words.
const VALUE_PATTERNS: &[ValuePattern] = &[
    ("sha256=", |c| c.is_ascii_hexdigit()),
    ("Bearer ", is_b64token_char),
    ("bearer ", is_b64token_char),
    ("token=", is_token_char),
    ("AKIA", is_key_id_char),
    ("ASIA", is_key_id_char),
];

/// A character of an AWS access key id after its four-letter prefix (`A-Z 2-7` in practice;
/// any upper-case letter or digit here).
fn is_key_id_char(c: char) -> bool {
    c.is_ascii_uppercase() || c.is_ascii_digit()
}

/// A character of an RFC 6750 `b64token` (`A-Z a-z 0-9 - . _ ~ + / =`), what a bearer
/// credential is made of.
fn is_b64token_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | '~' | '+' | '/' | '=')
}

/// A character of a token as it appears in a header or a URL (up to a quote, a separator, a
/// space or an escape).
fn is_token_char(c: char) -> bool {
    !(c.is_whitespace() || c.is_control() || matches!(c, '"' | '\'' | '&' | '#' | '\\' | ',' | ';'))
}

/// `line` with the run of `is_value` characters after each `prefix` replaced by [`REDACTED`];
/// `None` where no run is long enough to be one.
fn redact_after(line: &str, prefix: &str, is_value: fn(char) -> bool) -> Option<String> {
    let mut hidden = false;
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(at) = rest.find(prefix) {
        let value_start = at + prefix.len();
        out.push_str(&rest[..value_start]);
        let tail = &rest[value_start..];
        let value_len = tail.find(|c: char| !is_value(c)).unwrap_or(tail.len());
        // A value already redacted (`token=[redacted]`) stays as it is: redacting it again
        // would make a redacted line look like one still holding a secret.
        let value = &tail[..value_len];
        if value != REDACTED && value.chars().count() >= MIN_REDACTED_LEN {
            out.push_str(REDACTED);
            hidden = true;
            rest = &tail[value_len..];
        } else {
            rest = tail;
        }
    }
    out.push_str(rest);
    hidden.then_some(out)
}

/// Rule 1 of the module docs: TRACE only from this crate.
fn below_trace_or_own(metadata: &Metadata<'_>) -> bool {
    *metadata.level() < Level::TRACE || metadata.target().starts_with("ironflow_lambda")
}

/// The filter from `RUST_LOG`, else `AWS_LAMBDA_LOG_LEVEL`, else `info`. A `RUST_LOG` that
/// parses but leaves this crate's lines out (a mistyped level such as
/// `infoo` is a target directive, which turns every other target off) is set aside, as one that
/// does not parse, and a warning says why once logging is up.
pub fn filter() -> EnvFilter {
    if filter_problem().is_none()
        && let Ok(filter) = EnvFilter::try_from_default_env()
    {
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

/// Write a panic as one line of this module (JSON, redacted: rule 2) instead of Rust's default
/// text on stderr, which Lambda also sends to the log group, unredacted: the panic's message
/// (a step's, a `configure` closure's, ours), where it was raised and the thread. Without a
/// backtrace (a panic in a run is also in its failure's error and the run's report).
pub fn log_panics() {
    std::panic::set_hook(Box::new(|info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("a panic with no message");
        let location = info
            .location()
            .map(|l| format!("{}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let thread = std::thread::current();
        tracing::error!(
            panic = message,
            location,
            thread = thread.name().unwrap_or("unnamed"),
            "a thread panicked"
        );
    }));
}

/// Why [`filter`] set `RUST_LOG` aside, if it did because the value would leave this crate's
/// lines out (cold-start errors and invocation summaries included).
pub(crate) fn filter_problem() -> Option<String> {
    let rust_log = std::env::var("RUST_LOG").ok()?;
    silences_this_crate(&rust_log).then(|| {
        format!(
            "RUST_LOG={rust_log:?} leaves every line of this worker out, its cold-start errors \
             included (a word that is no level, such as infoo, is read as a target; a [span] \
             filter enables nothing outside its span): using AWS_LAMBDA_LOG_LEVEL or info instead"
        )
    })
}

/// Whether the `RUST_LOG` directives `directives` leave this crate's cold-start error out: an
/// ERROR line of `ironflow_lambda::entry` outside any span, as the filter itself judges it (a
/// mistyped level is a target directive; a span filter such as `[run]=debug` enables nothing
/// outside its span). Directives that do not parse are not this check's: [`filter`] sets them
/// aside anyway.
fn silences_this_crate(directives: &str) -> bool {
    // `off` says so: no line is what it asks for.
    if directives.trim().eq_ignore_ascii_case("off") {
        return false;
    }
    let Ok(filter) = EnvFilter::try_new(directives) else {
        return false;
    };
    let probe = tracing_subscriber::registry().with(filter);
    !tracing::subscriber::with_default(
        probe,
        || tracing::enabled!(target: "ironflow_lambda::entry", Level::ERROR),
    )
}

/// Install the line layer ([`JsonLines`]) writing to `writer` (stdout on Lambda), under `filter`,
/// the three rules and the routine lines of the module docs. Returns `false` when a global
/// subscriber was already set.
pub fn init<W>(filter: EnvFilter, writer: W) -> bool
where
    W: for<'a> MakeWriter<'a> + Send + Sync + 'static,
{
    subscriber(filter, writer).try_init().is_ok()
}

/// The subscriber [`init`] installs.
fn subscriber<W>(filter: EnvFilter, writer: W) -> impl tracing::Subscriber + Send + Sync
where
    W: for<'a> MakeWriter<'a> + Send + Sync + 'static,
{
    let routine = engine::RoutineLines::new(filter.max_level_hint());
    let lines = JsonLines::new(writer).with_filter(filter_fn(below_trace_or_own).and(routine));
    tracing_subscriber::registry().with(filter).with(lines)
}

/// A `MakeWriter` that appends to a shared buffer, for tests that read the logs back.
#[cfg(any(test, feature = "test-support"))]
#[derive(Clone, Default)]
pub struct CaptureWriter(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

#[cfg(any(test, feature = "test-support"))]
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

#[cfg(any(test, feature = "test-support"))]
impl std::io::Write for CaptureWriter {
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

#[cfg(any(test, feature = "test-support"))]
impl<'a> MakeWriter<'a> for CaptureWriter {
    type Writer = CaptureWriter;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_rust_log_that_leaves_this_crate_out_is_told_apart() {
        for silencing in [
            "infoo",
            "warnn,aws_config=debug",
            "hyper=debug",
            "Info=warn",
            "[run]=debug",
            "ironflow_lambda[run]=debug",
            " info ",
        ] {
            assert!(silences_this_crate(silencing), "{silencing}");
        }
        for kept in [
            "info",
            "INFO",
            "2",
            "warn,aws_config=debug",
            "hyper=debug,ironflow_lambda=info",
            "ironflow_lambda::entry=info",
            "ironflow=debug",
            "info,[run]=debug",
            "not a directive[",
            "off",
        ] {
            assert!(!silences_this_crate(kept), "{kept}");
        }
    }

    use super::*;

    /// What `f` logs under [`subscriber`] with `filter`, a line each.
    fn written(filter: &str, f: impl FnOnce()) -> Vec<String> {
        let capture = CaptureWriter::default();
        let subscriber = subscriber(EnvFilter::new(filter), capture.clone());
        tracing::subscriber::with_default(subscriber, f);
        capture.contents().lines().map(str::to_string).collect()
    }

    fn engine_lines() {
        tracing::info!(
            target: "ironflow_engine::executor::shell",
            command = %"curl -H 'X-Api-Key: k-0123456789'",
            exit_code = 0,
            "shell step completed"
        );
        tracing::info!(target: "ironflow_engine::context::lifecycle", step = "build", "step completed");
        tracing::info!(target: "ironflow_engine::engine", "run completed");
        tracing::info!(target: "ironflow_engine::engine", "run awaiting approval");
        tracing::warn!(
            target: "ironflow_core::operations::http",
            url = "https://u:p@api.example/v1?api_key=k-0123456789",
            "http request failed"
        );
        tracing::info!(target: "ironflow_lambda::execution", command = "mine", "run execution ended");
        tracing::warn!(
            target: "ironflow_lambda::execution",
            error = %"step failed: step 'curl \"k-0123456789\"' timed out after 30s",
            "run failed"
        );
        let span = tracing::info_span!(
            target: "ironflow_core::operations::http",
            "http",
            url = %"https://api.example/v1?api_key=k-0123456789",
            command = "echo k-0123456789"
        );
        span.in_scope(|| {
            tracing::warn!(target: "ironflow_core::operations::http", "retrying");
        });
        tracing::error!(
            target: "ironflow_lambda::execution",
            note = "step 'build' failed first",
            error = "error sending request for url (https://api.example/v1?api_key=k-0123456789)",
            "run failed"
        );
    }

    #[test]
    fn routine_engine_lines_are_left_out_at_info_and_commands_and_url_queries_never_written() {
        let lines = written("info", engine_lines);
        assert_eq!(lines.len(), 6, "{lines:#?}");
        assert!(
            lines[0].contains("\"run awaiting approval\""),
            "{}",
            lines[0]
        );
        assert!(
            lines[1].contains("\"url\":\"https://api.example/v1\""),
            "{}",
            lines[1]
        );
        // This crate's own fields are its own to keep.
        assert!(lines[2].contains("\"command\":\"mine\""), "{}", lines[2]);
        // A timeout's error text names the command, whoever logs it.
        let error: serde_json::Value = serde_json::from_str(&lines[3]).unwrap();
        assert_eq!(
            error["error"],
            "step failed: step '[withheld: 19 chars]' timed out after 30s"
        );
        // An ironflow span's fields are withheld as its events' are.
        let retry: serde_json::Value = serde_json::from_str(&lines[4]).unwrap();
        assert_eq!(retry["url"], "https://api.example/v1", "{retry}");
        assert_eq!(retry["command"], "[withheld: 17 chars]", "{retry}");
        // A URL's query in any text, and each value on its own: one value's `step '` and
        // another's timeout never make a line look like a secret across its structure.
        let failed: serde_json::Value = serde_json::from_str(&lines[5]).unwrap();
        assert_eq!(
            failed["error"],
            "error sending request for url (https://api.example/v1)"
        );
        assert_eq!(failed["note"], "step 'build' failed first");
        assert!(
            lines.iter().all(|l| !l.contains("k-0123456789")),
            "{lines:#?}"
        );

        let lines = written("info,ironflow_lambda=debug", engine_lines);
        assert_eq!(lines.len(), 9, "{lines:#?}");
        assert!(
            lines[0].contains("\"command\":\"[withheld: 33 chars]\""),
            "{}",
            lines[0]
        );
        assert!(
            lines.iter().all(|l| !l.contains("k-0123456789")),
            "{lines:#?}"
        );
    }

    #[test]
    fn secrets_in_every_form_signatures_bearer_tokens_and_token_parameters_are_redacted() {
        let secret = "unit/secret \"quoted\" 0123456789";
        redact(secret);
        let line = serde_json::json!({
            "message": format!("as it is: {secret}"),
            "debug": format!("{secret:?}"),
            "url": format!("https://h/?t={}", percent_encoded(secret)),
        })
        .to_string();
        let out = redacted(&line);
        assert!(
            !out.contains("quoted") && !out.contains("0123456789"),
            "{out}"
        );
        assert_eq!(out.matches(REDACTED).count(), 3, "{out}");

        let digest = "ab".repeat(32);
        for (line, hidden) in [
            (
                format!("{{\"x-signature-256\":\"sha256={digest}\"}}"),
                digest.as_str(),
            ),
            ("authorization: Bearer abc.def-ghi".into(), "abc.def-ghi"),
            (
                "{\"rawQueryString\":\"token=s3cr3t-v4lue&x=1\"}".into(),
                "s3cr3t-v4lue",
            ),
        ] {
            let out = redacted(&line);
            assert!(!out.contains(hidden) && out.contains(REDACTED), "{out}");
        }
        // The AWS SDK's endpoint-resolution DEBUG line prints the credentials' Debug.
        for key_id in ["AKIAH2PROBEKEYID0001", "ASIAY34FZKBOKMUTVV7A"] {
            let line = format!(
                "resolving endpoint endpoint_params=Credentials {{ provider_name: \"Environment\", \
                 access_key_id: \"{key_id}\", secret_access_key: \"** redacted **\" }}"
            );
            let out = redacted(&line);
            assert!(!out.contains(key_id) && out.contains(REDACTED), "{out}");
        }
        let prose = "the ASIAN market, AKIAB";
        assert_eq!(redacted(prose), prose);
        assert_eq!(redacted("token=&sha256= plain"), "token=&sha256= plain");
        // A line with a token parameter stays that line, the token redacted.
        let out = redacted_json("{\"rawQueryString\":\"token=s3cr3t-v4lue&x=1\"}");
        assert_eq!(out, "{\"rawQueryString\":\"token=[redacted]&x=1\"}");
        // Prose keeps its words: a run shorter than MIN_REDACTED_LEN is not a credential.
        let prose = "expected visible ASCII (it is sent as a bearer token), found a space";
        assert_eq!(redacted(prose), prose);
    }

    #[test]
    fn a_secret_outside_a_string_becomes_a_string_and_the_line_stays_json() {
        let digits = "9081726354";
        redact(digits);
        let line = format!(
            "{{\"message\":\"pin {digits}\",\"n\":{digits},\"m\":1{digits}7,\"ok\":true,\"x\":[0.5,{digits}]}}\n"
        );
        let out = redacted_json(&line);
        assert!(!out.contains(digits), "{out}");
        let value: serde_json::Value =
            serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
        assert_eq!(value["message"], format!("pin {REDACTED}"));
        assert_eq!(value["n"], REDACTED);
        assert_eq!(value["m"], REDACTED);
        assert_eq!(value["ok"], true);
        assert_eq!(value["x"], serde_json::json!([0.5, REDACTED]));
        // The plain redaction leaves a bare `[redacted]`: not JSON.
        assert!(serde_json::from_str::<serde_json::Value>(&redacted(&line)).is_err());
        // A line without a secret is the same line, not a copy.
        let clean = "{\"n\":42,\"s\":\"a \\\"quoted\\\" word\"}";
        assert!(matches!(redacted_json(clean), Cow::Borrowed(l) if l == clean));
    }

    #[test]
    fn a_secret_across_a_string_boundary_or_an_escape_never_breaks_the_line_nor_shows() {
        // (secret, a JSON line in which its text appears across the structure or an escape).
        let cases = [
            ("70707071}", r#"{"n":70707071}"#),
            ("60606061,", r#"{"n":60606061,"m":1}"#),
            (r#"4343,"qz"#, r#"{"n":4343,"qz":1}"#),
            ("9,8,7,6,5,4", r#"{"x":[9,8,7,6,5,4]}"#),
            (r#"qrstuvwx""#, r#"{"m":"qrstuvwx"}"#),
            (r"yzabcdef\", r#"{"m":"yzabcdef\"x"}"#),
            ("nQWERTYUI", r#"{"m":"a\nQWERTYUI"}"#),
            ("12349876", r#"{"m":"\u0012349876"}"#),
        ];
        for (secret, line) in cases {
            redact(secret);
            assert!(
                serde_json::from_str::<serde_json::Value>(line).is_ok(),
                "{line}"
            );
            let out = redacted_json(line);
            assert!(
                serde_json::from_str::<serde_json::Value>(&out).is_ok(),
                "{secret}: {out}"
            );
            assert!(!out.contains(secret), "{secret}: {out}");
        }
        // Inside a string, only the secret goes, and the escapes around it stay whole.
        redact("kx7-secret-q9");
        let out = redacted_json(r#"{"m":"a\"kx7-secret-q9\"\n","n":3}"#);
        let value: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(value["m"], format!("a\"{REDACTED}\"\n"));
        assert_eq!(value["n"], 3);
        // Prose around a prefix: no copy.
        let prose = r#"{"m":"sent as a Bearer token"}"#;
        assert!(matches!(redacted(prose), Cow::Borrowed(_)));
        assert!(matches!(redacted_json(prose), Cow::Borrowed(_)));
    }

    #[test]
    fn a_url_in_a_json_string_is_withheld_past_its_escapes() {
        // The line's text ends the URL at the escape; the decoded value does not.
        let line = r#"{"m":"GET https://h.example/a\u0001?key=q5w4e3r2t1","n":1}"#;
        let out = redacted_json(line);
        assert!(!out.contains("q5w4e3r2t1"), "{out}");
        let value: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(value["m"], "GET https://h.example/a\u{1}");
        assert_eq!(value["n"], 1);
    }

    #[test]
    fn a_secret_that_withholding_uncovers_is_redacted() {
        // Registered as a whole URL; the line holds it with user info inside.
        redact("https://hc.example/ping/k9x8w7");
        assert_eq!(
            shown("ping https://u:p@hc.example/ping/k9x8w7?n=1 failed"),
            format!("ping {REDACTED} failed")
        );
        let out = redacted_json(r#"{"m":"ping https://u:p@hc.example/ping/k9x8w7"}"#);
        assert_eq!(out, format!(r#"{{"m":"ping {REDACTED}"}}"#));
    }

    #[test]
    fn short_values_are_not_registered() {
        redact("short");
        assert_eq!(redacted("a short line"), "a short line");
    }

    #[test]
    fn only_this_crate_logs_at_trace() {
        use tracing::callsite::Identifier;
        use tracing::field::FieldSet;
        use tracing::metadata::Kind;
        struct Site;
        impl tracing::Callsite for Site {
            fn set_interest(&self, _: tracing::subscriber::Interest) {}
            fn metadata(&self) -> &Metadata<'_> {
                unreachable!()
            }
        }
        static SITE: Site = Site;
        let meta = |target: &'static str, level| {
            let fields = FieldSet::new(&[], Identifier(&SITE));
            Metadata::new("e", target, level, None, None, None, fields, Kind::EVENT)
        };
        assert!(!below_trace_or_own(&meta(
            "lambda_runtime::layers::api_response",
            Level::TRACE
        )));
        assert!(!below_trace_or_own(&meta(
            "aws_smithy_runtime::client::orchestrator",
            Level::TRACE
        )));
        assert!(below_trace_or_own(&meta(
            "aws_smithy_runtime",
            Level::DEBUG
        )));
        assert!(below_trace_or_own(&meta(
            "ironflow_lambda::webhook",
            Level::TRACE
        )));
    }
}
