//! Trigger events in, batch requests out.
//!
//! Accepted shapes:
//! - a direct invocation with a JSON object: `{}`, or overrides `{"max_runs": 3}`
//!   (`cargo lambda invoke --data-ascii '{}'`); fields nobody uses are ignored;
//! - an EventBridge / CloudWatch scheduled event (`"detail-type": "Scheduled Event"`): one
//!   batch per tick, with the configured settings.
//!
//! Anything else is refused with a [`TriggerError`] that names what was wrong, before anything
//! is claimed.

use serde_json::Value;

use crate::invocation::BatchRequest;

/// The event cannot start a batch.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TriggerError {
    /// The event is not a JSON object.
    #[error(
        "unsupported event: expected a JSON object (a direct invocation such as {{}} or {{\"max_runs\": 3}}, or a scheduled event), got {found}"
    )]
    NotAnObject {
        /// The JSON type found.
        found: &'static str,
    },
    /// A known field has the wrong type or value.
    #[error("invalid field {field}: expected {expected}, got {found}")]
    InvalidField {
        /// The field's name.
        field: &'static str,
        /// What is accepted.
        expected: String,
        /// What was found, truncated.
        found: String,
    },
}

/// Parse an invocation event into a batch request, validating overrides against
/// `max_runs_per_invocation` (the configured N).
///
/// # Errors
///
/// [`TriggerError`] for a non-object event or an invalid override.
///
/// # Examples
///
/// ```
/// use ironflow_lambda::trigger::parse_event;
/// let request = parse_event(&serde_json::json!({"max_runs": 3}), 8).unwrap();
/// assert_eq!(request.max_runs, Some(3));
/// assert!(parse_event(&serde_json::json!({"max_runs": 9}), 8).is_err());
/// ```
pub fn parse_event(
    event: &Value,
    max_runs_per_invocation: usize,
) -> Result<BatchRequest, TriggerError> {
    let Some(object) = event.as_object() else {
        return Err(TriggerError::NotAnObject {
            found: json_type(event),
        });
    };
    if object.get("detail-type").and_then(Value::as_str) == Some("Scheduled Event") {
        return Ok(BatchRequest::default());
    }
    let max_runs = match object.get("max_runs") {
        None | Some(Value::Null) => None,
        Some(v) => {
            let expected = format!(
                "a whole number from 1 to {max_runs_per_invocation} (IRONFLOW_MAX_RUNS_PER_INVOCATION)"
            );
            let n = v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .filter(|n| (1..=max_runs_per_invocation).contains(n));
            Some(n.ok_or_else(|| TriggerError::InvalidField {
                field: "max_runs",
                expected,
                found: truncate(&v.to_string()),
            })?)
        }
    };
    Ok(BatchRequest { max_runs })
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn truncate(s: &str) -> String {
    const MAX: usize = 64;
    match s.char_indices().nth(MAX) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

impl From<TriggerError> for lambda_runtime::Diagnostic {
    fn from(e: TriggerError) -> Self {
        Self {
            error_type: "InvalidEvent".to_string(),
            error_message: e.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn empty_object_is_a_default_batch() {
        assert_eq!(parse_event(&json!({}), 8).unwrap(), BatchRequest::default());
    }

    #[test]
    fn scheduled_event_is_a_default_batch() {
        let e = json!({"version":"0","id":"x","detail-type":"Scheduled Event","source":"aws.events",
            "account":"1","time":"2026-11-30T00:00:00Z","region":"eu-west-1","resources":[],"detail":{}});
        assert_eq!(parse_event(&e, 8).unwrap(), BatchRequest::default());
    }

    #[test]
    fn overrides_are_validated() {
        assert_eq!(
            parse_event(&json!({"max_runs": 2, "reason": "x", "other": 1}), 8)
                .unwrap()
                .max_runs,
            Some(2)
        );
        for bad in [
            json!({"max_runs": 0}),
            json!({"max_runs": 9}),
            json!({"max_runs": "3"}),
            json!({"max_runs": -1}),
        ] {
            let err = parse_event(&bad, 8).unwrap_err();
            assert!(err.to_string().contains("max_runs"), "{err}");
        }
    }

    #[test]
    fn non_objects_are_refused() {
        for bad in [json!(null), json!([1]), json!("x"), json!(3)] {
            assert!(matches!(
                parse_event(&bad, 8),
                Err(TriggerError::NotAnObject { .. })
            ));
        }
    }
}
