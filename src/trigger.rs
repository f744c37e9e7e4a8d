//! Trigger events in: which kind of invocation this is, and what it asks for.
//!
//! | event | recognised by | becomes |
//! |---|---|---|
//! | EventBridge / CloudWatch scheduled event ([`CloudWatchEvent`]) | `"detail-type": "Scheduled Event"` | [`Trigger::Schedule`]: one batch with the configured N |
//! | a schedule whose target sends a custom constant input, or a direct invocation | any other JSON object (`{}`, `{"max_runs": 3}`, `{"source": "my-schedule"}`) | [`Trigger::Direct`]: one batch, overrides validated |
//! | SQS ([`SqsEvent`](aws_lambda_events::event::sqs::SqsEvent)) | `"Records"` | [`Trigger::Sqs`]: each record a wake-up; one batch serves them all |
//! | Lambda Function URL ([`LambdaFunctionUrlRequest`], payload format 2.0) | `"requestContext"` with `"http"` | [`Trigger::Webhook`]: the ironflow API's webhook, answered by [`crate::webhook`]; no batch |
//!
//! Overrides (a direct object, or an SQS wake-up's JSON body): `max_runs`, a whole number from 1
//! to the configured N (`IRONFLOW_MAX_RUNS_PER_INVOCATION`); `reason`, a string shown in the
//! logs; and, in the timer wake-ups of sleeping runs, `sleeping` (an array of at most
//! [`MAX_WATCHED`] run ids) with `watch_until` (an RFC 3339 time), both or neither
//! ([`SleepWatch`]). Every other field is ignored: a custom schedule input may carry whatever
//! its author wants.
//!
//! Refused with a [`TriggerError`] before anything is claimed: a non-object event, an invalid
//! override, an EventBridge event other than a scheduled one, another service's `Records`
//! (S3, SNS, DynamoDB...), an HTTP event other than a Function URL's (API Gateway REST, ALB), a
//! malformed SQS envelope, and an SQS record without a message id (it could not be reported in a partial
//! batch response, so the whole invocation fails on purpose and SQS retries the batch).
//!
//! An SQS record whose body is malformed fails only itself: it is listed in
//! [`SqsWakeUps::rejected`], and the handler reports it in `batchItemFailures`.
//!
//! The module map: [docs/structure.md](https://github.com/ironflow-lambda/ironflow-lambda/blob/main/docs/structure.md).

use aws_lambda_events::event::cloudwatch_events::CloudWatchEvent;
use aws_lambda_events::event::lambda_function_urls::LambdaFunctionUrlRequest;
use aws_lambda_events::event::sqs::SqsMessage;
use chrono::{DateTime, Utc};
use serde::Deserialize as _;
use serde_json::{Map, Value};

use crate::report::{BatchRequest, SleepWatch};
use crate::wake::timers::MAX_WATCHED;

/// Longest SQS wake-up body accepted, in bytes. A wake-up is a small JSON object; anything
/// larger is not one of ours and fails its record.
pub const MAX_WAKE_UP_BODY_BYTES: usize = 16 * 1024;

/// Longest `reason` kept for the logs, in characters; a longer one is truncated, not refused.
pub const MAX_REASON_CHARS: usize = 200;

/// What an invocation event asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trigger {
    /// An EventBridge / CloudWatch schedule tick: one batch with the configured settings.
    Schedule(ScheduleTick),
    /// A direct invocation, or a schedule whose target sends a custom constant input: one batch
    /// with the event's overrides.
    Direct(DirectRequest),
    /// An SQS event: each record a wake-up, one batch for all of them.
    Sqs(SqsWakeUps),
    /// A Lambda Function URL request (payload format 2.0): the ironflow API's webhook, for the
    /// receiver ([`crate::webhook`]); no batch runs.
    Webhook(Box<LambdaFunctionUrlRequest>),
}

/// A scheduled event's facts, for the logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleTick {
    /// The event's `time` (when the schedule fired).
    pub time: DateTime<Utc>,
    /// The rule's ARN (the event's first `resources` entry), if any.
    pub rule: Option<String>,
}

/// A direct invocation's (or custom schedule input's) validated overrides.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DirectRequest {
    /// The batch it asks for.
    pub request: BatchRequest,
    /// Its `reason`, truncated to [`MAX_REASON_CHARS`].
    pub reason: Option<String>,
}

/// The records of an SQS event, sorted into wake-ups and rejected records.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SqsWakeUps {
    /// Records whose body is a valid wake-up, in event order.
    pub accepted: Vec<WakeUp>,
    /// Records whose body (or record) is malformed, in event order: reported as batch item
    /// failures.
    pub rejected: Vec<RejectedRecord>,
}

impl SqsWakeUps {
    /// The one batch serving every accepted wake-up: the configured N unless every wake-up asks
    /// for fewer runs, then the largest of their `max_runs`. `None` when no record is a valid
    /// wake-up (no batch runs).
    /// The batch also watches the sleeping runs of every accepted wake-up.
    pub fn batch_request(&self) -> Option<BatchRequest> {
        if self.accepted.is_empty() {
            return None;
        }
        // None: some wake-up asks for the configured N.
        let max_runs = self
            .accepted
            .iter()
            .map(|w| w.max_runs)
            .try_fold(0, |most, n| n.map(|n| most.max(n)));
        Some(BatchRequest {
            max_runs,
            watch: self
                .accepted
                .iter()
                .filter_map(|w| w.watch.clone())
                .collect(),
        })
    }

    /// Message ids of every record, accepted or rejected, in event order of each list.
    pub fn all_message_ids(&self) -> Vec<String> {
        self.accepted
            .iter()
            .map(|w| w.message_id.clone())
            .chain(self.rejected.iter().map(|r| r.message_id.clone()))
            .collect()
    }
}

/// One SQS record that is a valid wake-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WakeUp {
    /// The record's `messageId`.
    pub message_id: String,
    /// The body's `max_runs`, validated against N.
    pub max_runs: Option<usize>,
    /// The body's `reason` (or a plain-text body), truncated to [`MAX_REASON_CHARS`].
    pub reason: Option<String>,
    /// The body's `sleeping` and `watch_until`: the sleeping runs of a timer wake-up.
    pub watch: Option<SleepWatch>,
}

/// One SQS record that is not a valid wake-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RejectedRecord {
    /// The record's `messageId`.
    pub message_id: String,
    /// Why it was refused.
    pub error: String,
}

/// The event cannot start a batch; nothing is claimed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TriggerError {
    /// The event is not a JSON object.
    #[error(
        "unsupported event: expected a JSON object (a direct invocation such as {{}} or {{\"max_runs\": 3}}, a scheduled event or an SQS event), got {found}"
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
    /// Another service's event, or an EventBridge event that is not a schedule tick.
    #[error("unsupported event: {what}")]
    Unsupported {
        /// What the event looks like, and what is accepted instead.
        what: String,
    },
    /// A scheduled event that does not have the scheduled-event shape.
    #[error("invalid scheduled event: {0}")]
    InvalidSchedule(String),
    /// An SQS envelope that is not one (`Records` not a non-empty array of objects).
    #[error("invalid SQS event: {0}")]
    InvalidSqsEvent(String),
    /// An SQS record without a message id cannot be reported in a partial batch response:
    /// the whole invocation fails so that SQS retries the batch.
    #[error(
        "SQS record {index} has no messageId that is a non-empty string: it cannot be reported in batchItemFailures, so the whole invocation fails and SQS retries the batch"
    )]
    SqsRecordWithoutMessageId {
        /// The record's position in `Records`, from 0.
        index: usize,
    },
}

/// Parse an invocation event, validating overrides against `max_runs_per_invocation` (the
/// configured N).
///
/// # Errors
///
/// [`TriggerError`] for anything that cannot start a batch (see the module docs).
pub fn parse_event(event: &Value, max_runs_per_invocation: usize) -> Result<Trigger, TriggerError> {
    let Some(object) = event.as_object() else {
        return Err(TriggerError::NotAnObject {
            found: json_type(event),
        });
    };
    if let Some(records) = object.get("Records") {
        return parse_sqs(records, max_runs_per_invocation).map(Trigger::Sqs);
    }
    if let Some(detail_type) = object.get("detail-type") {
        return parse_schedule(event, detail_type).map(Trigger::Schedule);
    }
    if is_function_url_request(event) {
        // Deserialized from the borrowed event: the body is not copied twice.
        return LambdaFunctionUrlRequest::deserialize(event)
            .map(|request| Trigger::Webhook(Box::new(request)))
            .map_err(|e| TriggerError::InvalidField {
                field: "requestContext",
                expected: "a Lambda Function URL request (payload format 2.0)".into(),
                found: truncate(&e.to_string()),
            });
    }
    if object.contains_key("requestContext") || object.contains_key("httpMethod") {
        return Err(TriggerError::Unsupported {
            what: "an HTTP event of API Gateway's REST format or an ALB: only a Function URL \
                   request (payload format 2.0) reaches the webhook receiver"
                .into(),
        });
    }
    if let Some(source) = ["eventSource", "EventSource", "awslogs", "responsePayload"]
        .iter()
        .find(|key| object.contains_key(**key))
    {
        // Kafka, MQ, DocumentDB (`eventSource`), SNS-style envelopes, CloudWatch Logs
        // subscriptions (`awslogs`) and Lambda destinations (`responsePayload`) are not wake-ups.
        return Err(TriggerError::Unsupported {
            what: format!(
                "an event of another AWS service (it has a {source:?} field): invoke the function \
                 directly, on a schedule or through SQS"
            ),
        });
    }
    let overrides = parse_overrides(object, max_runs_per_invocation)?;
    Ok(Trigger::Direct(DirectRequest {
        request: BatchRequest {
            max_runs: overrides.max_runs,
            watch: overrides.watch.into_iter().collect(),
        },
        reason: overrides.reason,
    }))
}

fn parse_schedule(event: &Value, detail_type: &Value) -> Result<ScheduleTick, TriggerError> {
    if detail_type.as_str() != Some("Scheduled Event") {
        let source = event.get("source").and_then(Value::as_str).unwrap_or("?");
        return Err(TriggerError::Unsupported {
            what: format!(
                "EventBridge event with detail-type {} from {}: only \"Scheduled Event\" starts a batch",
                truncate(&detail_type.to_string()),
                truncate(source)
            ),
        });
    }
    let parsed: CloudWatchEvent = serde_path_to_error::deserialize(event.clone())
        .map_err(|e| TriggerError::InvalidSchedule(truncate_to(&field_error(event, &e), 300)))?;
    Ok(ScheduleTick {
        time: parsed.time,
        rule: parsed.resources.into_iter().next(),
    })
}

fn parse_sqs(records: &Value, max_runs_per_invocation: usize) -> Result<SqsWakeUps, TriggerError> {
    let Some(records) = records.as_array() else {
        return Err(TriggerError::InvalidSqsEvent(format!(
            "Records must be an array, got {}",
            json_type(records)
        )));
    };
    if records.is_empty() {
        return Err(TriggerError::InvalidSqsEvent(
            "Records is empty: there is nothing to wake up for".into(),
        ));
    }
    // Check the whole envelope before sorting any record: another service's records, or a
    // record that could not be reported, refuse the event as a whole.
    for (index, record) in records.iter().enumerate() {
        let Some(record) = record.as_object() else {
            return Err(TriggerError::InvalidSqsEvent(format!(
                "record {index} is {}, not an object",
                json_type(record)
            )));
        };
        let source = record
            .get("eventSource")
            .or_else(|| record.get("EventSource"));
        if let Some(source) = source
            && source.as_str() != Some("aws:sqs")
        {
            return Err(TriggerError::Unsupported {
                what: format!(
                    "Records from {}: only SQS records (eventSource aws:sqs) are wake-ups",
                    truncate(&source.to_string())
                ),
            });
        }
        if message_id(record).is_none() {
            return Err(TriggerError::SqsRecordWithoutMessageId { index });
        }
    }
    // The envelope has the SqsEvent shape; each record is read with the SqsMessage type, and
    // a record that does not fit fails alone.
    let mut wake_ups = SqsWakeUps::default();
    for record in records {
        let Some(id) = record.as_object().and_then(message_id) else {
            continue; // checked above
        };
        let parsed = serde_json::from_value::<SqsMessage>(record.clone())
            .map_err(|e| format!("record does not have the SQS message shape: {e}"))
            .and_then(|message| {
                parse_wake_up_body(message.body.as_deref(), max_runs_per_invocation)
            });
        match parsed {
            Ok(overrides) => wake_ups.accepted.push(WakeUp {
                message_id: id,
                max_runs: overrides.max_runs,
                reason: overrides.reason,
                watch: overrides.watch,
            }),
            Err(error) => wake_ups.rejected.push(RejectedRecord {
                message_id: id,
                error: truncate_to(&error, 300),
            }),
        }
    }
    Ok(wake_ups)
}

/// A field of `event` that did not parse (`error`): its path, what was wrong, and for the
/// schedule's `time` what is expected and what was found.
fn field_error(event: &Value, error: &serde_path_to_error::Error<serde_json::Error>) -> String {
    let path = error.path().to_string();
    let mut text = format!("field `{path}`: {}", error.inner());
    if path == "time" {
        let found = event.get("time").map_or("nothing".into(), Value::to_string);
        text.push_str(&format!(
            " (expected an RFC 3339 time such as 2026-12-05T03:00:00Z, found {})",
            truncate(&found)
        ));
    }
    text
}

/// The record's `messageId`, if it is a non-empty string.
fn message_id(record: &Map<String, Value>) -> Option<String> {
    record
        .get("messageId")
        .and_then(Value::as_str)
        .filter(|id| !id.trim().is_empty())
        .map(str::to_string)
}

/// What a direct object or a wake-up body asks for.
#[derive(Debug, Default)]
struct Overrides {
    max_runs: Option<usize>,
    reason: Option<String>,
    watch: Option<SleepWatch>,
}

/// A wake-up body: empty, plain text (its text is the reason), or a JSON object of overrides.
fn parse_wake_up_body(
    body: Option<&str>,
    max_runs_per_invocation: usize,
) -> Result<Overrides, String> {
    let body = body.unwrap_or("").trim();
    if body.len() > MAX_WAKE_UP_BODY_BYTES {
        return Err(format!(
            "body of {} bytes: a wake-up body is at most {MAX_WAKE_UP_BODY_BYTES} bytes",
            body.len()
        ));
    }
    if body.is_empty() {
        return Ok(Overrides::default());
    }
    if !(body.starts_with('{') || body.starts_with('[')) {
        return Ok(Overrides {
            reason: Some(truncate_to(body, MAX_REASON_CHARS)),
            ..Overrides::default()
        });
    }
    let value: Value =
        serde_json::from_str(body).map_err(|e| format!("body is not valid JSON: {e}"))?;
    let Some(object) = value.as_object() else {
        return Err(format!(
            "a JSON body must be an object such as {{\"max_runs\": 2}}, got {}",
            json_type(&value)
        ));
    };
    parse_overrides(object, max_runs_per_invocation).map_err(|e| e.to_string())
}

/// `max_runs`, `reason`, `sleeping` and `watch_until` of an object; other fields are ignored.
fn parse_overrides(
    object: &Map<String, Value>,
    max_runs_per_invocation: usize,
) -> Result<Overrides, TriggerError> {
    let max_runs = match object.get("max_runs") {
        None | Some(Value::Null) => None,
        Some(v) => {
            let n = v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .filter(|n| (1..=max_runs_per_invocation).contains(n));
            Some(n.ok_or_else(|| TriggerError::InvalidField {
                field: "max_runs",
                expected: format!(
                    "a whole number from 1 to {max_runs_per_invocation} (IRONFLOW_MAX_RUNS_PER_INVOCATION)"
                ),
                found: truncate(&v.to_string()),
            })?)
        }
    };
    let reason = match object.get("reason") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(truncate_to(s, MAX_REASON_CHARS)),
        Some(v) => {
            return Err(TriggerError::InvalidField {
                field: "reason",
                expected: "a string".into(),
                found: truncate(&v.to_string()),
            });
        }
    };
    Ok(Overrides {
        max_runs,
        reason,
        watch: parse_watch(object)?,
    })
}

/// `sleeping` (run ids) and `watch_until` (RFC 3339), both or neither.
fn parse_watch(object: &Map<String, Value>) -> Result<Option<SleepWatch>, TriggerError> {
    let present = |key| object.get(key).is_some_and(|v| !v.is_null());
    let (runs, until) = match (present("sleeping"), present("watch_until")) {
        (false, false) => return Ok(None),
        (true, true) => (&object["sleeping"], &object["watch_until"]),
        (sleeping, _) => {
            let (field, expected) = if sleeping {
                (
                    "watch_until",
                    "an RFC 3339 time, given whenever sleeping is",
                )
            } else {
                (
                    "sleeping",
                    "an array of run ids, given whenever watch_until is",
                )
            };
            return Err(TriggerError::InvalidField {
                field,
                expected: expected.into(),
                found: "nothing".into(),
            });
        }
    };
    let invalid_runs = || TriggerError::InvalidField {
        field: "sleeping",
        expected: format!("an array of at most {MAX_WATCHED} run ids (UUIDs)"),
        found: truncate(&runs.to_string()),
    };
    let runs = runs
        .as_array()
        .filter(|ids| ids.len() <= MAX_WATCHED)
        .ok_or_else(invalid_runs)?
        .iter()
        .map(|id| id.as_str().and_then(|id| uuid::Uuid::parse_str(id).ok()))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(invalid_runs)?;
    let until = until
        .as_str()
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
        .ok_or_else(|| TriggerError::InvalidField {
            field: "watch_until",
            expected: "an RFC 3339 time such as \"2026-12-01T18:00:00Z\"".into(),
            found: truncate(&until.to_string()),
        })?
        .with_timezone(&Utc);
    Ok(Some(SleepWatch { runs, until }))
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

/// Whether `event` is a Lambda Function URL request (payload format 2.0): an object whose
/// `requestContext` has `http`.
pub fn is_function_url_request(event: &Value) -> bool {
    event
        .get("requestContext")
        .is_some_and(|c| c.get("http").is_some())
}

fn truncate(s: &str) -> String {
    truncate_to(s, 64)
}

fn truncate_to(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

impl From<TriggerError> for lambda_runtime::Diagnostic {
    fn from(e: TriggerError) -> Self {
        let error_type = match e {
            TriggerError::SqsRecordWithoutMessageId { .. } => "UnreportableSqsRecord",
            _ => "InvalidEvent",
        };
        Self {
            error_type: error_type.to_string(),
            error_message: e.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn other_services_events_are_refused_before_any_claim() {
        for event in [
            serde_json::json!({"eventSource": "aws:kafka", "records": {}}),
            serde_json::json!({"eventSource": "aws:mq", "messages": []}),
            serde_json::json!({"awslogs": {"data": "H4sI"}}),
            serde_json::json!({"version": "1.0", "requestPayload": {}, "responsePayload": {}}),
        ] {
            let Err(err) = parse_event(&event, 8) else {
                panic!("{event} must be refused");
            };
            assert!(err.to_string().contains("another AWS service"), "{err}");
        }
    }

    fn direct(event: Value) -> DirectRequest {
        match parse_event(&event, 8).unwrap() {
            Trigger::Direct(d) => d,
            other => panic!("not direct: {other:?}"),
        }
    }

    fn sqs(bodies: &[Option<&str>]) -> Value {
        let records: Vec<Value> = bodies
            .iter()
            .enumerate()
            .map(|(i, body)| {
                json!({"messageId": format!("m{i}"), "receiptHandle": "r", "body": body,
                       "attributes": {}, "messageAttributes": {}, "eventSource": "aws:sqs",
                       "eventSourceARN": "arn:aws:sqs:eu-west-1:1:q", "awsRegion": "eu-west-1"})
            })
            .collect();
        json!({ "Records": records })
    }

    fn wake_ups(event: Value) -> SqsWakeUps {
        match parse_event(&event, 8).unwrap() {
            Trigger::Sqs(s) => s,
            other => panic!("not sqs: {other:?}"),
        }
    }

    #[test]
    fn empty_object_is_a_default_batch() {
        assert_eq!(direct(json!({})), DirectRequest::default());
    }

    #[test]
    fn custom_schedule_input_is_one_batch_and_unused_fields_are_ignored() {
        let d = direct(json!({"source": "my-schedule", "max_runs": 2, "anything": [1, {"x": 2}]}));
        assert_eq!(d.request.max_runs, Some(2));
        let d = direct(json!({"source": "my-schedule"}));
        assert_eq!(d.request, BatchRequest::default());
    }

    #[test]
    fn scheduled_event_is_a_default_batch() {
        let e = json!({"version":"0","id":"x","detail-type":"Scheduled Event","source":"aws.events",
            "account":"1","time":"2026-11-30T00:00:00Z","region":"eu-west-1",
            "resources":["arn:aws:events:eu-west-1:1:rule/r"],"detail":{}});
        let Trigger::Schedule(tick) = parse_event(&e, 8).unwrap() else {
            panic!("not a schedule")
        };
        assert_eq!(
            tick.rule.as_deref(),
            Some("arn:aws:events:eu-west-1:1:rule/r")
        );
    }

    #[test]
    fn other_eventbridge_events_and_broken_schedules_are_refused() {
        let e = json!({"detail-type":"EC2 Instance State-change Notification","source":"aws.ec2",
            "time":"2026-11-30T00:00:00Z","resources":[],"detail":{}});
        let err = parse_event(&e, 8).unwrap_err();
        assert!(matches!(err, TriggerError::Unsupported { .. }), "{err}");
        assert!(err.to_string().contains("aws.ec2"), "{err}");
        let err = parse_event(&json!({"detail-type": "Scheduled Event"}), 8).unwrap_err();
        assert!(matches!(err, TriggerError::InvalidSchedule(_)), "{err}");
        // The field that did not parse is named, and for the time what is expected.
        let schedule = |field: &str, value: Value| {
            let mut e = json!({"detail-type": "Scheduled Event", "source": "aws.events",
                "time": "2026-11-30T00:00:00Z", "resources": []});
            e[field] = value;
            parse_event(&e, 8).unwrap_err().to_string()
        };
        let time = schedule("time", json!("yesterday"));
        assert!(
            time.contains("field `time`")
                && time.contains("RFC 3339")
                && time.contains("yesterday"),
            "{time}"
        );
        let resources = schedule("resources", json!([5]));
        assert!(resources.contains("field `resources[0]`"), "{resources}");
    }

    #[test]
    fn overrides_are_validated() {
        assert_eq!(direct(json!({"max_runs": 8})).request.max_runs, Some(8));
        for bad in [
            json!({"max_runs": 0}),
            json!({"max_runs": 9}),
            json!({"max_runs": "3"}),
            json!({"max_runs": -1}),
            json!({"max_runs": 2.5}),
            json!({"max_runs": 1e300}),
            json!({"max_runs": true}),
        ] {
            let err = parse_event(&bad, 8).unwrap_err();
            assert!(err.to_string().contains("max_runs"), "{err}");
            assert!(err.to_string().contains("1 to 8"), "{err}");
        }
        let err = parse_event(&json!({"reason": 3}), 8).unwrap_err();
        assert!(err.to_string().contains("reason"), "{err}");
    }

    #[test]
    fn long_reason_is_truncated_not_refused() {
        let d = direct(json!({"reason": "x".repeat(100_000)}));
        assert_eq!(d.reason.unwrap().chars().count(), MAX_REASON_CHARS + 1);
    }

    #[test]
    fn non_objects_and_http_events_are_refused() {
        for bad in [json!(null), json!([1]), json!("x"), json!(3)] {
            assert!(matches!(
                parse_event(&bad, 8),
                Err(TriggerError::NotAnObject { .. })
            ));
        }
        let err = parse_event(&json!({"requestContext": {}, "body": "{}"}), 8).unwrap_err();
        assert!(err.to_string().contains("HTTP event"), "{err}");
        let err = parse_event(&json!({"httpMethod": "POST", "body": "{}"}), 8).unwrap_err();
        assert!(err.to_string().contains("HTTP event"), "{err}");
    }

    #[test]
    fn a_function_url_request_is_a_webhook_request() {
        let request = json!({
            "version": "2.0",
            "rawPath": "/",
            "rawQueryString": "token=x",
            "headers": {"content-type": "application/json", "x-signature-256": "sha256=00"},
            "queryStringParameters": {"token": "x"},
            "requestContext": {"http": {"method": "POST", "path": "/"}, "timeEpoch": 1},
            "body": "{\"type\":\"run_created\"}",
            "isBase64Encoded": false
        });
        let Ok(Trigger::Webhook(request)) = parse_event(&request, 8) else {
            panic!("not a webhook request");
        };
        assert_eq!(request.body.as_deref(), Some(r#"{"type":"run_created"}"#));
        assert_eq!(request.query_string_parameters["token"], "x");
        let broken = json!({"requestContext": {"http": 3}});
        let err = parse_event(&broken, 8).unwrap_err();
        assert!(err.to_string().contains("Function URL"), "{err}");
    }

    #[test]
    fn sqs_bodies_empty_plain_and_json_are_wake_ups() {
        let w = wake_ups(sqs(&[
            None,
            Some(""),
            Some("  wake up  "),
            Some(r#"{"max_runs": 2, "reason": "backlog", "pending_runs": 30}"#),
        ]));
        assert!(w.rejected.is_empty(), "{:?}", w.rejected);
        assert_eq!(w.accepted.len(), 4);
        assert_eq!(w.accepted[2].reason.as_deref(), Some("wake up"));
        assert_eq!(w.accepted[3].max_runs, Some(2));
        // One wake-up without max_runs: the batch takes the configured N.
        assert_eq!(w.batch_request(), Some(BatchRequest::default()));
    }

    #[test]
    fn sqs_batch_takes_the_largest_max_runs_when_all_ask() {
        let w = wake_ups(sqs(&[
            Some(r#"{"max_runs": 2}"#),
            Some(r#"{"max_runs": 5}"#),
        ]));
        assert_eq!(
            w.batch_request(),
            Some(BatchRequest {
                max_runs: Some(5),
                watch: Vec::new()
            })
        );
    }

    #[test]
    fn a_timer_wake_up_s_sleeping_runs_are_watched_and_a_bad_watch_fails_its_record() {
        let (a, b) = (uuid::Uuid::now_v7(), uuid::Uuid::now_v7());
        let until = "2026-12-01T18:00:00Z";
        let good =
            format!(r#"{{"reason": "due", "sleeping": ["{a}", "{b}"], "watch_until": "{until}"}}"#);
        let w = wake_ups(sqs(&[Some(&good), Some(r#"{"reason": "due"}"#)]));
        assert!(w.rejected.is_empty(), "{:?}", w.rejected);
        let request = w.batch_request().unwrap();
        let until: DateTime<Utc> = until.parse().unwrap();
        assert_eq!(
            request.watch,
            [SleepWatch {
                runs: vec![a, b],
                until
            }]
        );
        assert_eq!(request.max_runs, None);

        let too_many: Vec<String> = (0..=MAX_WATCHED)
            .map(|_| uuid::Uuid::now_v7().to_string())
            .collect();
        let too_many = serde_json::json!({"sleeping": too_many, "watch_until": until}).to_string();
        let bad = [
            (format!(r#"{{"sleeping": ["{a}"]}}"#), "watch_until"),
            (format!(r#"{{"watch_until": "{until}"}}"#), "sleeping"),
            (
                format!(r#"{{"sleeping": ["nope"], "watch_until": "{until}"}}"#),
                "UUIDs",
            ),
            (
                format!(r#"{{"sleeping": "{a}", "watch_until": "{until}"}}"#),
                "an array",
            ),
            (
                format!(r#"{{"sleeping": ["{a}"], "watch_until": "tomorrow"}}"#),
                "RFC 3339",
            ),
            (too_many, "at most 100"),
        ];
        for (body, says) in bad {
            let w = wake_ups(sqs(&[Some(&body)]));
            assert!(w.accepted.is_empty(), "{body}");
            assert!(
                w.rejected[0].error.contains(says),
                "{body}: {}",
                w.rejected[0].error
            );
        }
    }

    #[test]
    fn malformed_bodies_fail_only_their_record() {
        let big = format!("{{\"reason\": \"{}\"}}", "x".repeat(MAX_WAKE_UP_BODY_BYTES));
        let w = wake_ups(sqs(&[
            Some(r#"{"max_runs": 1}"#),
            Some(r#"{"max_runs": "#),
            Some(r#"{"max_runs": 99}"#),
            Some("[1, 2]"),
            Some(&big),
        ]));
        assert_eq!(w.accepted.len(), 1);
        let ids: Vec<&str> = w.rejected.iter().map(|r| r.message_id.as_str()).collect();
        assert_eq!(ids, ["m1", "m2", "m3", "m4"]);
        assert!(w.rejected[0].error.contains("not valid JSON"));
        assert!(w.rejected[1].error.contains("max_runs"));
        assert!(w.rejected[3].error.contains("at most"));
        assert_eq!(w.batch_request().unwrap().max_runs, Some(1));
        let mut all = w.all_message_ids();
        all.sort();
        assert_eq!(all, ["m0", "m1", "m2", "m3", "m4"]);
    }

    #[test]
    fn a_record_of_the_wrong_shape_fails_alone() {
        let mut event = sqs(&[Some("{}"), Some("{}")]);
        event["Records"][1]["attributes"] = json!(5);
        let w = wake_ups(event);
        assert_eq!(w.accepted.len(), 1);
        assert_eq!(w.rejected[0].message_id, "m1");
        assert!(w.rejected[0].error.contains("SQS message shape"));
    }

    #[test]
    fn all_malformed_runs_no_batch() {
        let w = wake_ups(sqs(&[Some("{oops")]));
        assert_eq!(w.batch_request(), None);
    }

    #[test]
    fn record_without_message_id_fails_the_invocation() {
        let mut event = sqs(&[Some("{}"), Some("{}")]);
        event["Records"][1]
            .as_object_mut()
            .unwrap()
            .remove("messageId");
        assert_eq!(
            parse_event(&event, 8).unwrap_err(),
            TriggerError::SqsRecordWithoutMessageId { index: 1 }
        );
        event["Records"][1]["messageId"] = json!("");
        assert!(matches!(
            parse_event(&event, 8),
            Err(TriggerError::SqsRecordWithoutMessageId { index: 1 })
        ));
    }

    /// Every sample in `events/` parses as its name says (N = 2, as in the end-to-end test).
    #[test]
    fn every_sample_event_parses_as_its_kind() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("events");
        let mut seen = Vec::new();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            let name = path.file_name().unwrap().to_str().unwrap().to_string();
            let event: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let parsed = parse_event(&event, 2);
            match name.as_str() {
                "schedule.json" => assert!(matches!(parsed, Ok(Trigger::Schedule(_))), "{name}"),
                "schedule-custom-input.json" | "direct-empty.json" | "direct-overrides.json" => {
                    assert!(
                        matches!(parsed, Ok(Trigger::Direct(_))),
                        "{name}: {parsed:?}"
                    );
                }
                "sqs-wake-ups.json" => {
                    let Ok(Trigger::Sqs(w)) = parsed else {
                        panic!("{name}: {parsed:?}")
                    };
                    assert_eq!((w.accepted.len(), w.rejected.len()), (3, 0), "{name}");
                }
                "sqs-one-malformed.json" => {
                    let Ok(Trigger::Sqs(w)) = parsed else {
                        panic!("{name}: {parsed:?}")
                    };
                    assert_eq!((w.accepted.len(), w.rejected.len()), (1, 1), "{name}");
                    assert_eq!(
                        w.rejected[0].message_id,
                        "5c0ffee0-1111-4a2b-8c3d-000000000002"
                    );
                }
                "invalid-max-runs.json" => assert!(
                    matches!(
                        parsed,
                        Err(TriggerError::InvalidField {
                            field: "max_runs",
                            ..
                        })
                    ),
                    "{name}: {parsed:?}"
                ),
                "invalid-not-an-object.json" => assert!(
                    matches!(parsed, Err(TriggerError::NotAnObject { .. })),
                    "{name}: {parsed:?}"
                ),
                "invalid-s3-notification.json" => assert!(
                    matches!(parsed, Err(TriggerError::Unsupported { .. })),
                    "{name}: {parsed:?}"
                ),
                "invalid-sqs-without-message-id.json" => assert!(
                    matches!(
                        parsed,
                        Err(TriggerError::SqsRecordWithoutMessageId { index: 0 })
                    ),
                    "{name}: {parsed:?}"
                ),
                other => panic!("events/{other} has no expectation here: add one"),
            }
            seen.push(name);
        }
        assert_eq!(seen.len(), 10, "samples found: {seen:?}");
    }

    #[test]
    fn broken_envelopes_and_other_services_records_are_refused() {
        for (event, expected) in [
            (json!({"Records": {}}), "must be an array"),
            (json!({"Records": []}), "empty"),
            (json!({"Records": [3]}), "not an object"),
            (
                json!({"Records": [{"eventSource": "aws:s3", "s3": {}}]}),
                "aws:s3",
            ),
            (
                json!({"Records": [{"EventSource": "aws:sns", "Sns": {}}]}),
                "aws:sns",
            ),
        ] {
            let err = parse_event(&event, 8).unwrap_err();
            assert!(err.to_string().contains(expected), "{err}");
        }
    }
}
