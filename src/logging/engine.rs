//! Rule 3 and the routine lines of the module docs of [`crate::logging`]: what of the lines of
//! ironflow's own crates (`ironflow_engine`, `ironflow_core`) is written.
//!
//! - **Routine lines** ([`ROUTINE`]): the engine says, at INFO, that each step completed (twice
//!   for a shell or HTTP step: the executor's line and the lifecycle's) and that each run
//!   completed. That is seven of the nine and a half lines of a three-step shell run, and it
//!   repeats what the API's step records hold and what this worker's own line at the run's end
//!   says ("run execution ended", with its outcome). They are written only when the filter
//!   asks for DEBUG somewhere ([`RoutineLines::new`]); every other line of the engine (a run
//!   sleeping, waiting for a human or a signal, a retry, an agent step's cost) is written as the
//!   filter says.
//! - **Withheld fields** ([`withheld`]): a shell step's `command` is written as its length only,
//!   and an HTTP step's `url` without its query, fragment and user info, at every level, on
//!   ironflow's events and spans: a command or a URL is where a workflow puts a credential
//!   inline (`curl -H "Authorization: …"`, `?api_key=`), which rule 2 cannot know to redact.
//! - **Withheld text**, in every value of every line, whoever logs it (the engine, or this
//!   crate's line at the run's end): the command a shell step's timeout names in its error text
//!   ([`timed_out_command`]), and the query, fragment and user info of any URL ([`bare_urls`]:
//!   an HTTP step's error names its URL).
//!
//! The module map: [docs/structure.md](https://github.com/ironflow-lambda/ironflow-lambda/blob/main/docs/structure.md).

use std::fmt::{self, Write as _};

use tracing::field::{Field, Visit};
use tracing::subscriber::Interest;
use tracing::{Event, Metadata};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::{Context, Filter};

/// The routine lines: (target, message) of each. ironflow-engine 4.1.1 names them so.
pub const ROUTINE: &[(&str, &str)] = &[
    ("ironflow_engine::executor::shell", "shell step completed"),
    ("ironflow_engine::executor::http", "http step completed"),
    ("ironflow_engine::context::lifecycle", "step completed"),
    ("ironflow_engine::engine", "run completed"),
];

/// Whether an event of `target` comes from ironflow's own crates (the engine and the
/// operations it runs), whose fields [`withheld`] applies to.
pub fn from_ironflow(target: &str) -> bool {
    target.starts_with("ironflow_engine") || target.starts_with("ironflow_core")
}

/// What a field of an ironflow event is written as instead of `value` (its text), if it is
/// withheld: `command` → `"[withheld: N chars]"`; `url` → the URL cut before its query or
/// fragment, without user info (`https://user:pw@host/p?k=v` → `https://host/p`). `None`: the
/// field is written as it is.
pub fn withheld(field: &str, value: &str) -> Option<String> {
    match field {
        "command" => Some(format!("[withheld: {} chars]", value.chars().count())),
        "url" => Some(bare_url(value)),
        _ => None,
    }
}

/// What ironflow-core's shell timeout (`OperationError::Timeout`) says after the step's
/// command, which it names: `step '<command>' timed out after 30s`.
pub const TIMED_OUT: &str = "' timed out after ";

/// `text` with the command of a shell timeout ([`TIMED_OUT`]) written as its length, as
/// [`withheld`] writes a `command` field: from the first `step '` to the last [`TIMED_OUT`]
/// after it (a command holding either is withheld whole, never cut). `None`: no such command,
/// or one already withheld.
pub fn timed_out_command(text: &str) -> Option<String> {
    const STEP: &str = "step '";
    let start = text.find(STEP)? + STEP.len();
    let end = start + text[start..].rfind(TIMED_OUT)?;
    let command = &text[start..end];
    if is_withheld(command) {
        return None;
    }
    let shown = withheld("command", command)?;
    Some(format!("{}{shown}{}", &text[..start], &text[end..]))
}

/// `text` with every URL in it (`scheme://…` or `//…`, up to whitespace, a double quote, `<` or
/// `>`, which a URL's text always encodes) cut as [`bare_url`] cuts it: an error text names the
/// URL it failed on, query included (reqwest's "error sending request for url (…)",
/// ironflow-core's "invalid URL …"). A path, a query or a password may hold `(`, `)`, `'` and
/// a backtick unencoded, so they do not end a URL; what closes the text around it is left out
/// of it ([`without_closers`]). `None` where no URL has a query, a fragment or user info.
pub fn bare_urls(text: &str) -> Option<String> {
    let ends = |c: char| c.is_whitespace() || matches!(c, '"' | '<' | '>');
    let mut out = String::with_capacity(text.len());
    let mut changed = false;
    let mut rest = text;
    while let Some(at) = rest.find("//") {
        // The URL starts at its scheme, if `//` follows one.
        let before = &rest[..at];
        let scheme_len = before
            .strip_suffix(':')
            .map(|b| {
                let kept = b.trim_end_matches(|c: char| {
                    c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')
                });
                b.len() - kept.len() + 1
            })
            .unwrap_or(0);
        let start = at - scheme_len;
        let end = rest[at..].find(ends).map_or(rest.len(), |n| at + n);
        let opener = rest[..start]
            .chars()
            .next_back()
            .filter(|c| matches!(c, '\'' | '`'));
        let url = without_closers(&rest[start..end], opener);
        let bare = bare_url(url);
        out.push_str(&rest[..start]);
        if bare == url {
            out.push_str(url);
        } else {
            out.push_str(&bare);
            changed = true;
        }
        rest = &rest[start + url.len()..];
    }
    out.push_str(rest);
    changed.then_some(out)
}

/// `run` (a URL up to where [`bare_urls`] ends it) without what closes the text around it, at
/// its end, for as long as one is found: `.`, `,`, `;`, `:`, `!`; a `)` while the run holds
/// more `)` than `(`; and `opener` (the `'` or backtick just before the URL, if any).
fn without_closers(run: &str, opener: Option<char>) -> &str {
    let mut unmatched = run
        .matches(')')
        .count()
        .saturating_sub(run.matches('(').count());
    let mut run = run;
    loop {
        let before = run.len();
        run = run.trim_end_matches(['.', ',', ';', ':', '!']);
        if unmatched > 0
            && let Some(t) = run.strip_suffix(')')
        {
            run = t;
            unmatched -= 1;
        }
        if let Some(t) = opener.and_then(|c| run.strip_suffix(c)) {
            run = t;
        }
        if run.len() == before {
            return run;
        }
    }
}

/// Whether `text` is exactly what [`withheld`] writes for a command: `[withheld: <digits> chars]`.
fn is_withheld(text: &str) -> bool {
    text.strip_prefix("[withheld: ")
        .and_then(|rest| rest.strip_suffix(" chars]"))
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// `url` without the user info of its authorities (after each `//`, with or without a scheme
/// before it, so that a second URL joined to the first without a space loses its user info
/// too), then cut before its first `?` or `#` outside user info: a password may hold `?`, `#`
/// or `/` (`https://admin:pa#ss@db/app` → `https://db/app`). What [`after_user_info`] cannot
/// tell apart from a query is withheld with it.
pub fn bare_url(url: &str) -> String {
    let last_at = url.rfind('@');
    let mut out = String::with_capacity(url.len());
    let mut pos = 0;
    while let Some(found) = url[pos..].find("//") {
        let at = pos + found;
        if let Some(cut) = url[pos..at].find(['?', '#']) {
            out.push_str(&url[pos..pos + cut]);
            return out;
        }
        out.push_str(&url[pos..at + 2]);
        pos = after_user_info(url, at + 2, last_at);
    }
    let rest = &url[pos..];
    out.push_str(&rest[..rest.find(['?', '#']).unwrap_or(rest.len())]);
    out
}

/// Where, in `url`, the authority that starts at `start` (after a `//`) goes on after its user
/// info, `last_at` being the last `@` of `url`. User info ends at the last `@` before the
/// authority's first `/`, `?` or `#`, again and again (`//u@x:p@h` → `h`). Where the authority,
/// from `start` up to there, holds a `:` while an `@` comes later, it is a password holding `@`,
/// `/`, `?` or `#`, or a port followed by a path holding `@`, or user info followed by a path
/// holding `@`: everything through the last `@` is taken for user info (`http://h:80/u/@me` →
/// `http://me`, `https://u:p@h/@me` → `https://me`: more is lost than user info, never a
/// password), and where a `?` or `#` comes before that `@`, which could be a query's as well as
/// a password's, the rest of `url` is withheld whole (`url.len()`). A user name alone (no `:`)
/// holding `/`, `?` or `#` before its `@` is taken for the host and path, as the URL standard
/// reads it.
fn after_user_info(url: &str, start: usize, last_at: Option<usize>) -> usize {
    let first = start;
    let mut start = start;
    loop {
        let rest = &url[start..];
        let authority_end = start + rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let authority = &url[start..authority_end];
        start = match (authority.rfind('@'), last_at) {
            (Some(at), _) => start + at + 1,
            (None, Some(at)) if at >= start && url[first..authority_end].contains(':') => {
                if url[start..at].contains(['?', '#']) {
                    return url.len();
                }
                at + 1
            }
            _ => return start,
        };
    }
}

/// The per-layer filter of the routine lines: every event passes, but a routine line only
/// when `verbose`.
pub struct RoutineLines {
    verbose: bool,
}

impl RoutineLines {
    /// Routine lines pass when `max` (the filter's most verbose level, `None` when it cannot
    /// tell) is DEBUG or TRACE.
    pub fn new(max: Option<LevelFilter>) -> Self {
        Self {
            verbose: max.is_none_or(|max| max >= LevelFilter::DEBUG),
        }
    }
}

impl<S> Filter<S> for RoutineLines {
    fn enabled(&self, _: &Metadata<'_>, _: &Context<'_, S>) -> bool {
        true
    }

    /// Every callsite but a routine line's is always enabled here, so that the combined
    /// filter's answer is cached for it and not asked again at each event.
    fn callsite_enabled(&self, metadata: &'static Metadata<'static>) -> Interest {
        if self.verbose || !ROUTINE.iter().any(|(t, _)| *t == metadata.target()) {
            Interest::always()
        } else {
            Interest::sometimes()
        }
    }

    fn event_enabled(&self, event: &Event<'_>, _: &Context<'_, S>) -> bool {
        self.verbose || !is_routine(event)
    }
}

/// Whether `event` is one of the [`ROUTINE`] lines.
fn is_routine(event: &Event<'_>) -> bool {
    let target = event.metadata().target();
    if !ROUTINE.iter().any(|(t, _)| *t == target) {
        return false;
    }
    let mut message = Message(String::new());
    event.record(&mut message);
    ROUTINE.iter().any(|(t, m)| *t == target && *m == message.0)
}

/// An event's `message`, as it prints.
struct Message(String);

impl Visit for Message {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.0.push_str(value);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.0, "{value:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_is_written_as_its_length_only() {
        assert_eq!(
            withheld("command", "curl -H 'Authorization: Bearer sk-live-1'").as_deref(),
            Some("[withheld: 41 chars]")
        );
        assert_eq!(withheld("exit_code", "0"), None);
    }

    #[test]
    fn a_timed_out_shell_step_s_command_is_written_as_its_length() {
        let text = "step failed: step 'curl -H \"X-Key: k\" -o a' timed out after 30s";
        let out = timed_out_command(text).unwrap();
        assert_eq!(
            out,
            "step failed: step '[withheld: 23 chars]' timed out after 30s"
        );
        assert_eq!(timed_out_command(&out), None, "idempotent");
        assert_eq!(timed_out_command("agent timed out after 30s"), None);
        // Only exactly what `withheld` writes counts as withheld.
        let text =
            "step '[withheld: 1 chars]; curl k-0123456789; echo ' chars]' timed out after 1s";
        assert!(!timed_out_command(text).unwrap().contains("k-0123456789"));
        // A command holding the phrase is withheld whole.
        let text = "step 'echo step 'x' timed out after ' timed out after 1s";
        assert_eq!(
            timed_out_command(text).unwrap(),
            "step '[withheld: 30 chars]' timed out after 1s"
        );
    }

    #[test]
    fn a_url_in_any_text_loses_its_query_and_user_info_once() {
        let text = "request failed: error sending request for url \
                    (https://api.example.com/v1/x?api_key=s3cret-value); invalid URL \
                    http://u:pw@h/p#frag: bad, see //cdn.example/a?sig=1 and a // comment";
        let out = bare_urls(text).unwrap();
        assert_eq!(
            out,
            "request failed: error sending request for url (https://api.example.com/v1/x); \
             invalid URL http://h/p: bad, see //cdn.example/a and a // comment"
        );
        assert_eq!(bare_urls(&out), None);
        assert_eq!(bare_urls("see https://h/p and //"), None);
        assert_eq!(bare_urls("é://ü?x"), Some("é://ü".into()));
        // Parentheses and quotes inside a URL, and around it.
        for (text, shown) in [
            (
                "for url (https://h.example/api?filter=(a)&api_key=K3Y0123456789)",
                "for url (https://h.example/api)",
            ),
            (
                "see https://h.example/wiki/Foo_(bar)?api_key=K3Y0123456789.",
                "see https://h.example/wiki/Foo_(bar).",
            ),
            (
                "'https://admin:pa'ss@db.example/' and https://admin:pa(ss@db.example/",
                "'https://db.example/' and https://db.example/",
            ),
            (
                "for url (https://h.example/s?q=a`b&api_key=K3Y0123456789) in `//u:p@h/`",
                "for url (https://h.example/s) in `//h/`",
            ),
        ] {
            assert_eq!(bare_urls(text).as_deref(), Some(shown), "{text}");
        }
    }

    #[test]
    fn a_url_loses_its_query_fragment_and_user_info() {
        for (url, bare) in [
            (
                "https://user:pw@api.example.com/v1/x?api_key=s3cret#f",
                "https://api.example.com/v1/x",
            ),
            (
                "https://api.example.com/v1/x",
                "https://api.example.com/v1/x",
            ),
            ("http://h:8080?token=abc", "http://h:8080"),
            ("https://a@b.example/p@q", "https://b.example/p@q"),
            ("not a url?secret", "not a url"),
            ("//u:p@cdn.example/a?k=v", "//cdn.example/a"),
            // A password holding `/`; one holding `#` or `?`, which a query with an `@` after
            // a port could be as well: withheld whole.
            (
                "https://admin:s3/cr3t@db.example/app",
                "https://db.example/app",
            ),
            ("https://admin:s3cr3t#x@db.example/app", "https://"),
            ("https://admin:s3?cr3t@db.example/app?k", "https://"),
            ("https://admin:12#34@db.example", "https://"),
            (
                "https://api.example.com:8443/v1/search?q=bob@example.com&api_key=K3Y0123456789",
                "https://",
            ),
            ("//h:80/p#frag@x&api_key=K3Y0123456789", "//"),
            // A port and a path holding `@`: more is lost, no password is kept.
            ("http://h:80/u/@me", "http://me"),
            // User info with `@` in it, again and again.
            ("https://alice@example.com:pa/ss@host/", "https://host/"),
            (
                "https://admin:p@ss/w0rd@db.example/app",
                "https://db.example/app",
            ),
            ("https://admin:p@ss?w0rd@db.example/app", "https://"),
            // User info, then a path holding `@`: more is lost, again.
            ("https://u:p@h.example/@scope/pkg", "https://scope/pkg"),
            ("//u@x:p/y@h", "//h"),
            // A second URL joined without a space, and one in a query.
            ("https://a/x,https://u:p@h/y", "https://a/x,https://h/y"),
            ("https://a/x,//u:p@h/y", "https://a/x,//h/y"),
            ("https://h/p?next=https://u:p@x/", "https://h/p"),
        ] {
            assert_eq!(withheld("url", url).as_deref(), Some(bare), "{url}");
        }
    }

    #[test]
    fn routine_lines_pass_only_when_debug_is_asked_for() {
        assert!(!RoutineLines::new(Some(LevelFilter::INFO)).verbose);
        assert!(!RoutineLines::new(Some(LevelFilter::WARN)).verbose);
        assert!(RoutineLines::new(Some(LevelFilter::DEBUG)).verbose);
        assert!(RoutineLines::new(Some(LevelFilter::TRACE)).verbose);
        assert!(RoutineLines::new(None).verbose);
    }
}
