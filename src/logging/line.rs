//! The line layer: one flat JSON object per event, written whole in one `write_all`.
//!
//! Shape, in this order (the module docs of [`crate::logging`] show a sample):
//! 1. `timestamp` (RFC 3339, UTC, microseconds), `level` (`INFO`…), then the event's own fields
//!    (`message` among them, in the order the event names them);
//! 2. `target`, the module the event comes from;
//! 3. the fields of every span the event is in, the innermost first, each key once: a key the
//!    event or an inner span already wrote is skipped (the innermost value wins);
//! 4. `span`, the innermost span's name, when the event is in a span.
//!
//! A field named like a key the line writes itself (`timestamp`, `level`, `target`, `span`) is
//! written as `fields.<name>`. An event raised while a line is being formatted on the same
//! thread (by a value's `Debug`) is left out rather than interleaved.
//!
//! Why not tracing-subscriber's JSON format: it nests the spans (`"spans":[{…},{…}]`), so a run's
//! id is at a different index on different lines and repeated in each span that carries it, and
//! it keeps each span's fields as a JSON string that it parses again for every event. Here a
//! span's fields are rendered to JSON once, when they are recorded, and copied into each line;
//! a line is about a third shorter (median 581 bytes against about 850 for a three-step shell
//! run's lines, measured with `strace` on the fleet bench).

use std::cell::RefCell;
use std::fmt::{self, Write as _};
use std::io::Write as _;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_log::NormalizeEvent;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

use super::{engine, redacted_json};

/// A layer writing each event as one flat JSON line to `W`'s writer (see the module docs),
/// every line passed through [`redacted_json`] first (still one JSON object, with nothing the
/// process holds secret in it).
pub struct JsonLines<W> {
    writer: W,
}

impl<W> JsonLines<W> {
    /// Lines to `writer` (stdout on Lambda).
    pub fn new(writer: W) -> Self {
        Self { writer }
    }
}

/// A span's fields, each value already JSON: kept in the span's extensions.
#[derive(Default)]
struct SpanFields(Vec<(&'static str, String)>);

impl SpanFields {
    /// Set `key` (a field's name, [`unreserved`]) to `json`, replacing an earlier value.
    fn set(&mut self, key: &'static str, json: String) {
        let key = unreserved(key);
        match self.0.iter_mut().find(|(k, _)| *k == key) {
            Some((_, value)) => *value = json,
            None => self.0.push((key, json)),
        }
    }
}

/// A span's values into its [`SpanFields`]; an ironflow span's withheld fields
/// ([`engine::withheld`]) are kept as that says.
struct SpanValues<'a> {
    fields: &'a mut SpanFields,
    /// The span comes from ironflow's crates ([`engine::from_ironflow`]).
    ironflow: bool,
}

impl SpanValues<'_> {
    /// `field` as the JSON string of `value`, or of what is shown instead.
    fn text(&mut self, field: &Field, value: &str) {
        let shown = self.ironflow.then(|| engine::withheld(field.name(), value));
        let json = json_str(shown.flatten().as_deref().unwrap_or(value));
        self.fields.set(field.name(), json);
    }
}

impl Visit for SpanValues<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.text(field, value);
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.fields.set(field.name(), value.to_string());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.fields.set(field.name(), value.to_string());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.fields.set(field.name(), value.to_string());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.fields.set(field.name(), json_f64(value));
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.text(field, &displayed(value));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.text(field, &debugged(value));
    }
}

/// The line being written: the JSON text and the keys it holds.
#[derive(Default)]
struct Line {
    text: Vec<u8>,
    keys: Vec<&'static str>,
}

impl Line {
    /// Start a line for an event; the buffers are kept from the thread's last line.
    fn clear(&mut self) {
        self.text.clear();
        self.keys.clear();
    }

    /// Whether the line has `key` already.
    fn has(&self, key: &str) -> bool {
        self.keys.contains(&key)
    }

    /// Append `"key":` (a comma first unless the object was just opened) and note the key.
    fn key(&mut self, key: &'static str) {
        if self.text.last() != Some(&b'{') {
            self.text.push(b',');
        }
        self.string(key);
        self.text.push(b':');
        self.keys.push(key);
    }

    /// Append `s` as a JSON string (serde_json's escaping: the form [`super::redact`] registers).
    fn string(&mut self, s: &str) {
        // Writing a `&str` into a `Vec` cannot fail.
        let _ = serde_json::to_writer(&mut self.text, s);
    }

    /// Append `"key":json` unless the line has `key`.
    fn field(&mut self, key: &'static str, json: &str) {
        if !self.has(key) {
            self.key(key);
            self.text.extend_from_slice(json.as_bytes());
        }
    }
}

/// The event's fields into a [`Line`]; `log.*` fields (a `log` record's metadata, already
/// normalized into the line's `target`) are left out, and an ironflow event's withheld fields
/// ([`engine::withheld`]) are written as that says.
struct EventFields<'a> {
    line: &'a mut Line,
    /// The event comes from ironflow's crates ([`engine::from_ironflow`]).
    ironflow: bool,
}

impl EventFields<'_> {
    /// The key `field` is written under, unless it is left out.
    fn key(&self, field: &Field) -> Option<&'static str> {
        let key = unreserved(field.name());
        (!field.name().starts_with("log.") && !self.line.has(key)).then_some(key)
    }

    /// `field` as `json`, written as it prints: a number or a boolean.
    fn bare(&mut self, field: &Field, json: impl fmt::Display) {
        if let Some(key) = self.key(field) {
            self.line.key(key);
            let _ = write!(self.line.text, "{json}");
        }
    }

    /// `field` as the JSON string of `value`.
    fn string(&mut self, field: &Field, value: &str) {
        if let Some(key) = self.key(field) {
            self.line.key(key);
            match self
                .ironflow
                .then(|| engine::withheld(key, value))
                .flatten()
            {
                Some(shown) => self.line.string(&shown),
                None => self.line.string(value),
            }
        }
    }
}

impl Visit for EventFields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.string(field, value);
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.bare(field, value);
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.bare(field, value);
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.bare(field, value);
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.bare(field, json_f64(value));
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.string(field, &displayed(value));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.string(field, &debugged(value));
    }
}

thread_local! {
    /// Each thread's line buffer, reused from one event to the next.
    static LINE: RefCell<Line> = RefCell::new(Line::default());
}

impl<S, W> tracing_subscriber::Layer<S> for JsonLines<W>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: for<'a> MakeWriter<'a> + 'static,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut fields = SpanFields::default();
        attrs.record(&mut SpanValues {
            fields: &mut fields,
            ironflow: engine::from_ironflow(span.metadata().target()),
        });
        // `replace`, not `insert`: another `JsonLines` on the same registry may have put its own.
        span.extensions_mut().replace(fields);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        // The values are formatted before the span's extensions are locked: a `Debug` that logs
        // (whose line reads them) or panics (which would poison them) runs outside the lock.
        let mut recorded = SpanFields::default();
        values.record(&mut SpanValues {
            fields: &mut recorded,
            ironflow: engine::from_ironflow(span.metadata().target()),
        });
        let mut extensions = span.extensions_mut();
        match extensions.get_mut::<SpanFields>() {
            Some(fields) => {
                for (key, json) in recorded.0 {
                    fields.set(key, json);
                }
            }
            None => extensions.insert(recorded),
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        // A line being written on this thread (an event raised while formatting one) is left
        // out rather than interleaved.
        let _ = LINE.try_with(|line| {
            let Ok(mut line) = line.try_borrow_mut() else {
                return;
            };
            line.clear();
            let normalized = event.normalized_metadata();
            let metadata = normalized.as_ref().unwrap_or_else(|| event.metadata());
            line.text.push(b'{');
            line.key("timestamp");
            line.string(&chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true));
            line.key("level");
            line.string(metadata.level().as_str());
            event.record(&mut EventFields {
                line: &mut line,
                ironflow: engine::from_ironflow(metadata.target()),
            });
            line.field("target", &json_str(metadata.target()));
            let mut innermost = None;
            if let Some(scope) = ctx.event_scope(event) {
                for span in scope {
                    innermost.get_or_insert(span.name());
                    if let Some(fields) = span.extensions().get::<SpanFields>() {
                        for (key, json) in &fields.0 {
                            line.field(key, json);
                        }
                    }
                }
            }
            if let Some(name) = innermost {
                line.field("span", &json_str(name));
            }
            line.text.extend_from_slice(b"}\n");
            // Valid UTF-8: every part is a `&str` or serde_json's output.
            let text = String::from_utf8_lossy(&line.text);
            let out = redacted_json(&text);
            let _ = self
                .writer
                .make_writer_for(metadata)
                .write_all(out.as_bytes());
        });
    }
}

/// `s` as a JSON string, quotes included (serde_json's escaping, as [`Line::string`]).
fn json_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

/// The keys a line writes itself, and what an event's or a span's field of that name is
/// written as instead.
fn unreserved(key: &'static str) -> &'static str {
    match key {
        "timestamp" => "fields.timestamp",
        "level" => "fields.level",
        "target" => "fields.target",
        "span" => "fields.span",
        key => key,
    }
}

/// `value`'s `Debug` text; what it wrote before an error, if its `fmt` fails (`format!` would
/// panic).
fn debugged(value: &dyn fmt::Debug) -> String {
    let mut out = String::new();
    let _ = write!(out, "{value:?}");
    out
}

/// `value`'s `Display` text, as [`debugged`].
fn displayed(value: &dyn fmt::Display) -> String {
    let mut out = String::new();
    let _ = write!(out, "{value}");
    out
}

/// `value` as JSON: a number, or a string for what JSON has no number for (`"NaN"`, `"inf"`).
fn json_f64(value: f64) -> String {
    if value.is_finite() {
        value.to_string()
    } else {
        json_str(&value.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logging::CaptureWriter;
    use tracing::{info, info_span};
    use tracing_subscriber::prelude::*;

    fn lines(f: impl FnOnce()) -> Vec<serde_json::Value> {
        let capture = CaptureWriter::default();
        let subscriber = tracing_subscriber::registry().with(JsonLines::new(capture.clone()));
        tracing::subscriber::with_default(subscriber, f);
        capture
            .contents()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }

    #[test]
    fn a_line_is_flat_with_each_span_key_once_and_the_innermost_value() {
        let lines = lines(|| {
            let outer = info_span!("invocation", request_id = "req-1", worker_id = "w");
            let _outer = outer.enter();
            let run = info_span!("run", run_id = "r-1", workflow = tracing::field::Empty);
            run.record("workflow", "deploy");
            let _run = run.enter();
            let step = info_span!("step", run_id = "r-1", worker_id = "inner", n = 2_u64);
            let _step = step.enter();
            info!(
                run_id = "from-the-event",
                ok = true,
                ratio = 0.5,
                "step \"done\"\n"
            );
        });
        assert_eq!(lines.len(), 1);
        let line = &lines[0];
        assert_eq!(line["level"], "INFO");
        assert_eq!(line["message"], "step \"done\"\n");
        assert_eq!(
            line["run_id"], "from-the-event",
            "the event's own value wins"
        );
        assert_eq!(
            line["worker_id"], "inner",
            "the innermost span's value wins"
        );
        assert_eq!(line["request_id"], "req-1");
        assert_eq!(
            line["workflow"], "deploy",
            "a field recorded after the span began"
        );
        assert_eq!(line["n"], 2);
        assert_eq!(line["ok"], true);
        assert_eq!(line["ratio"], 0.5);
        assert_eq!(line["span"], "step");
        assert!(
            line["target"]
                .as_str()
                .is_some_and(|t| t.contains("logging"))
        );
        assert!(line["timestamp"].as_str().is_some_and(|t| t.ends_with('Z')));
        // Each key once: the raw text has no repeated key.
        let text = serde_json::to_string(line).unwrap_or_default();
        assert_eq!(text.matches("\"run_id\"").count(), 1, "{text}");
    }

    #[test]
    fn control_characters_and_non_finite_numbers_stay_valid_json() {
        let lines = lines(|| {
            info!(nan = f64::NAN, text = "a\u{1}b\tc", "plain");
        });
        assert_eq!(lines[0]["text"], "a\u{1}b\tc");
        assert_eq!(lines[0]["nan"], "NaN");
        assert!(lines[0].get("span").is_none(), "no span: no `span` key");
    }

    #[test]
    fn a_secret_with_control_characters_is_redacted_in_a_line() {
        let secret = "line-test\u{8}secret\u{c}\u{1}value";
        crate::logging::redact(secret);
        let lines = lines(|| {
            info!(value = secret, "as a field");
            info!("in the message: {secret}");
        });
        for line in &lines {
            let text = line.to_string();
            assert!(!text.contains("secret"), "{text}");
            assert!(text.contains(crate::logging::REDACTED), "{text}");
        }
    }

    #[test]
    fn a_digit_only_secret_in_an_integer_field_is_a_redacted_string_of_a_json_line() {
        crate::logging::redact("5647382910");
        // `lines` fails on a line that is not JSON.
        let lines = lines(|| {
            let span = info_span!("run", pin = 5_647_382_910_u64);
            let _s = span.enter();
            info!(code = 5_647_382_910_i64, "the code");
        });
        assert_eq!(lines[0]["code"], crate::logging::REDACTED);
        assert_eq!(lines[0]["pin"], crate::logging::REDACTED);
        assert!(!lines[0].to_string().contains("5647382910"));
    }

    #[test]
    fn fields_named_like_the_line_s_own_keys_are_kept_apart() {
        let lines = lines(|| {
            let span = info_span!("s", span = "a span field");
            let _s = span.enter();
            info!(target = "db", level = "x", timestamp = 1_u64, "m");
        });
        let line = &lines[0];
        assert!(
            line["target"]
                .as_str()
                .is_some_and(|t| t.contains("logging"))
        );
        assert_eq!(line["level"], "INFO");
        assert_eq!(line["fields.target"], "db");
        assert_eq!(line["fields.level"], "x");
        assert_eq!(line["fields.timestamp"], 1);
        assert_eq!(line["span"], "s");
        assert_eq!(line["fields.span"], "a span field");
    }

    /// A value whose `Debug` logs a line, or fails.
    struct Loud(bool);

    impl fmt::Debug for Loud {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            info!("logged while formatting");
            if self.0 {
                return Err(fmt::Error);
            }
            f.write_str("loud")
        }
    }

    #[test]
    fn a_value_that_logs_or_fails_while_formatted_neither_blocks_nor_panics() {
        let lines = lines(|| {
            let span = info_span!("s", v = tracing::field::Empty);
            let _s = span.enter();
            // Recorded on the entered span: its `Debug` logs a line that reads the span.
            span.record("v", tracing::field::debug(Loud(false)));
            info!(failing = ?Loud(true), "after");
        });
        assert!(
            lines
                .iter()
                .any(|l| l["message"] == "logged while formatting")
        );
        let after = lines.iter().find(|l| l["message"] == "after");
        assert!(
            after.is_some_and(|l| l["v"] == "loud" && l["failing"] == ""),
            "{lines:?}"
        );
    }

    #[test]
    fn two_line_layers_on_one_registry_each_write_the_span_s_fields() {
        let (a, b) = (CaptureWriter::default(), CaptureWriter::default());
        let subscriber = tracing_subscriber::registry()
            .with(JsonLines::new(a.clone()))
            .with(JsonLines::new(b.clone()));
        tracing::subscriber::with_default(subscriber, || {
            let span = info_span!("run", run_id = "r-2");
            let _s = span.enter();
            info!("both");
        });
        for capture in [a, b] {
            assert!(
                capture.contents().contains("\"run_id\":\"r-2\""),
                "{}",
                capture.contents()
            );
        }
    }
}
