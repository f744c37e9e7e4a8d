//! Texts of a write cut to what the API takes. A failure's message can be as long as what it
//! quotes (a schema validator quoting a model's whole answer, a provider's error body), and a
//! verbose step's trace as long as its conversation: a write carrying one over the API's body
//! limit (`MAX_API_BODY_BYTES`, 2 MiB) is refused, and a refused failure write leaves the run
//! Running, with its lease, until the API's reaper takes it back and the step runs (and is
//! billed) again.
//!
//! Invariant: a run's or step's `error` is at most [`MAX_ERROR_BYTES`] and a step's
//! `debug_messages` at most [`MAX_TRACE_BYTES`] as JSON; what is cut says how much was. A
//! step's `output` is never changed: the engine replays it. A completion the API refuses for
//! its size is written as the step's failure instead ([`output_refused`]: its usage kept, the
//! error naming the size and the limit), and the run fails with that error.

use ironflow_store::entities::{RunUpdate, StepStatus, StepUpdate};
use serde_json::Value;

/// The longest `error` text written, in bytes (64 KiB): far more than a diagnosis needs, far
/// less than the API's limit.
pub const MAX_ERROR_BYTES: usize = 64 * 1024;

/// The largest `debug_messages` (a verbose step's trace) written, in bytes of JSON (512 KiB).
pub const MAX_TRACE_BYTES: usize = 512 * 1024;

/// `update` with its `error` cut to [`MAX_ERROR_BYTES`].
pub(crate) fn run_update(mut update: RunUpdate) -> RunUpdate {
    cut_error(&mut update.error);
    update
}

/// `update` with its `error` cut to [`MAX_ERROR_BYTES`] and a `debug_messages` over
/// [`MAX_TRACE_BYTES`] replaced by a note of its size.
pub(crate) fn step_update(mut update: StepUpdate) -> StepUpdate {
    cut_error(&mut update.error);
    if let Some(trace) = &update.debug_messages {
        let len = serde_json::to_vec(trace).map_or(usize::MAX, |bytes| bytes.len());
        if len > MAX_TRACE_BYTES {
            update.debug_messages = Some(Value::String(format!(
                "[the step's trace was {len} bytes of JSON, over the {MAX_TRACE_BYTES} bytes \
                 written: not recorded]"
            )));
        }
    }
    update
}

/// Whether `why`, a write's error, is the API's body limit (`store/put.rs` words it so, as
/// `ApiRunStore` does).
pub(crate) fn too_large(why: &str) -> bool {
    why.starts_with("payload too large")
}

/// `update` with its trace replaced by a note of its removal, when it has one: a completion the
/// API refused for its size is sent again so before its output is given up.
pub(crate) fn without_trace(update: &StepUpdate) -> Option<StepUpdate> {
    update.debug_messages.as_ref()?;
    Some(StepUpdate {
        debug_messages: Some(Value::String(
            "[the step's trace was not recorded: with it, the step's record was over the API's \
             body limit]"
                .to_string(),
        )),
        ..update.clone()
    })
}

/// The failure of a step whose completion `update` the API refused for its size (`why`): its
/// usage, duration and end kept, its output and trace dropped, and an error that says so.
pub(crate) fn output_refused(update: StepUpdate, why: &str) -> StepUpdate {
    StepUpdate {
        status: Some(StepStatus::Failed),
        output: None,
        debug_messages: None,
        error: Some(format!(
            "payload too large: the step's output cannot be stored ({why}); make the step return \
             less (write large results elsewhere and return a reference)"
        )),
        ..update
    }
}

/// Cut `error` to at most [`MAX_ERROR_BYTES`], at a character boundary, ending with how many
/// bytes were cut.
fn cut_error(error: &mut Option<String>) {
    let Some(text) = error else { return };
    if text.len() <= MAX_ERROR_BYTES {
        return;
    }
    let total = text.len();
    // Room for the note (under 100 bytes).
    let end = text.floor_char_boundary(MAX_ERROR_BYTES - 100);
    text.truncate(end);
    text.push_str(&format!(" [... {} more bytes cut]", total - end));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_error_is_cut_at_a_character_boundary_and_says_so() {
        let long = "é".repeat(MAX_ERROR_BYTES);
        let update = run_update(RunUpdate {
            error: Some(long.clone()),
            ..RunUpdate::default()
        });
        let error = update.error.unwrap();
        assert!(error.len() <= MAX_ERROR_BYTES, "{}", error.len());
        assert!(
            error.ends_with("more bytes cut]"),
            "{}",
            &error[error.len() - 40..]
        );
        let kept = error.split(" [...").next().unwrap();
        assert!(long.starts_with(kept));
        let cut: usize = error
            .rsplit(" [... ")
            .next()
            .and_then(|t| t.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap();
        assert_eq!(kept.len() + cut, long.len());
    }

    #[test]
    fn a_short_error_and_an_output_are_left_as_they_are() {
        let output = Value::String("x".repeat(3 * MAX_TRACE_BYTES));
        let update = step_update(StepUpdate {
            error: Some("short".into()),
            output: Some(output.clone()),
            debug_messages: Some(Value::String("small".into())),
            ..StepUpdate::default()
        });
        assert_eq!(update.error.as_deref(), Some("short"));
        assert_eq!(update.output, Some(output));
        assert_eq!(update.debug_messages, Some(Value::String("small".into())));
    }

    #[test]
    fn a_refused_completion_is_sent_again_without_its_trace_then_failed_with_its_usage() {
        let completion = StepUpdate {
            status: Some(StepStatus::Completed),
            output: Some(Value::String("big".into())),
            debug_messages: Some(Value::String("trace".into())),
            input_tokens: Some(7),
            ..StepUpdate::default()
        };
        let lean = without_trace(&completion).expect("it has a trace");
        assert_eq!(lean.output, completion.output);
        assert!(
            matches!(&lean.debug_messages, Some(Value::String(n)) if n.contains("not recorded"))
        );
        assert!(without_trace(&StepUpdate::default()).is_none());
        let why = "payload too large: PUT /steps/1 is 3 bytes";
        assert!(too_large(why));
        let failed = output_refused(completion, why);
        assert_eq!(failed.status, Some(StepStatus::Failed));
        assert_eq!((failed.output, failed.debug_messages), (None, None));
        assert_eq!(failed.input_tokens, Some(7), "its usage is kept");
        assert!(failed.error.unwrap().contains(why));
    }

    #[test]
    fn a_trace_over_its_limit_is_replaced_by_a_note_of_its_size() {
        let trace = Value::Array(vec![Value::String("y".repeat(MAX_TRACE_BYTES)); 2]);
        let update = step_update(StepUpdate {
            debug_messages: Some(trace),
            ..StepUpdate::default()
        });
        let Some(Value::String(note)) = update.debug_messages else {
            panic!("expected a note");
        };
        assert!(note.contains("not recorded"), "{note}");
    }
}
