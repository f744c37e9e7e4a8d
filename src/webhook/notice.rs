//! What a webhook event says about work: whether a run of a workflow this deployment registers
//! is, or will be, Pending.
//!
//! The ironflow API's events are JSON objects tagged by `type` (ironflow-engine's
//! `notify::Event`). The ones that mean work: `run_created` (also for a run scheduled for
//! later), `run_status_changed` to `pending` (the reaper's requeues, an operator's resume),
//! `approval_granted`, `approval_rejected` (a rejected human input sends its run back to
//! Pending for the handler to see the rejection; a rejected approval fails its run, and the
//! pending count then finds nothing), `signal_received` and `workflow_resumed` (a run or a held
//! workflow goes back to Pending). Every other type is answered and ignored. Which resumptions
//! publish no event at all: `docs/push.md#what-wakes`. Only the fields read here are parsed, so
//! that an event with fields this crate does not know still reads.

use serde::Deserialize;

/// The event types that mean a run is or will be Pending.
pub const WAKING_TYPES: [&str; 6] = [
    "run_created",
    "run_status_changed",
    "approval_granted",
    "approval_rejected",
    "signal_received",
    "workflow_resumed",
];

/// The fields of an event the receiver reads.
#[derive(Debug, Deserialize)]
pub struct Notice {
    /// The event's type (`run_created`, ...).
    #[serde(rename = "type")]
    pub kind: String,
    /// The run's workflow, where the event names it.
    #[serde(default)]
    pub workflow_name: Option<String>,
    /// A status change's new status (`pending`, ...).
    #[serde(default)]
    pub to: Option<String>,
    /// When the API built the event (every ironflow event has it; [`super::replay`]).
    #[serde(default)]
    pub at: Option<chrono::DateTime<chrono::Utc>>,
}

/// What the receiver does with a notice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// A run of a registered workflow is or will be Pending: wake the fleet.
    Wake,
    /// Nothing to do, and why (answered 2xx: the sender must not retry).
    Ignore(&'static str),
}

impl Notice {
    /// Parse an event body.
    ///
    /// # Errors
    ///
    /// The JSON error when the body is not a JSON object with a string `type` (and an RFC 3339
    /// `at` where present).
    pub fn parse(body: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(body)
    }

    /// The verdict for a deployment that registers `registered` workflows (`None`: any).
    pub fn verdict(&self, registered: Option<&[String]>) -> Verdict {
        if !WAKING_TYPES.contains(&self.kind.as_str()) {
            return Verdict::Ignore("an event type that does not make a run Pending");
        }
        if self.kind == "run_status_changed" && self.to.as_deref() != Some("pending") {
            return Verdict::Ignore("a status change to another status than pending");
        }
        match (&self.workflow_name, registered) {
            (Some(workflow), Some(registered)) if !registered.contains(workflow) => {
                Verdict::Ignore("a workflow this deployment does not register")
            }
            _ => Verdict::Wake,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(body: &str) -> Verdict {
        let registered = vec!["deploy".to_string(), "build".to_string()];
        Notice::parse(body.as_bytes())
            .unwrap()
            .verdict(Some(&registered))
    }

    #[test]
    fn runs_that_are_or_will_be_pending_for_registered_workflows_wake() {
        let created = r#"{"type":"run_created","run_id":"01a2","workflow_name":"deploy","at":"2026-12-01T10:00:00.123456Z"}"#;
        assert_eq!(verdict(created), Verdict::Wake);
        let requeued = r#"{"type":"run_status_changed","workflow_name":"build","from":"running","to":"pending","extra":1}"#;
        assert_eq!(verdict(requeued), Verdict::Wake);
        assert_eq!(verdict(r#"{"type":"workflow_resumed"}"#), Verdict::Wake);
        assert_eq!(
            verdict(r#"{"type":"approval_granted","workflow_name":"deploy"}"#),
            Verdict::Wake
        );
        // A rejected human input sends its run back to Pending.
        let rejected = r#"{"type":"approval_rejected","run_id":"01a2","step_id":"01a3","rejected_by":"ops","reason":"no","at":"2026-12-01T10:00:00Z"}"#;
        assert_eq!(verdict(rejected), Verdict::Wake);
    }

    #[test]
    fn other_types_statuses_and_workflows_are_ignored() {
        assert!(matches!(
            verdict(r#"{"type":"run_created","workflow_name":"other"}"#),
            Verdict::Ignore(_)
        ));
        assert!(matches!(
            verdict(r#"{"type":"run_status_changed","workflow_name":"deploy","to":"completed"}"#),
            Verdict::Ignore(_)
        ));
        assert!(matches!(
            verdict(r#"{"type":"step_completed","workflow_name":"deploy"}"#),
            Verdict::Ignore(_)
        ));
        assert!(matches!(
            verdict(r#"{"type":"user_signed_in"}"#),
            Verdict::Ignore(_)
        ));
        // Any workflow when claims do not filter by workflow.
        let other = Notice::parse(br#"{"type":"run_created","workflow_name":"other"}"#).unwrap();
        assert_eq!(other.verdict(None), Verdict::Wake);
    }

    #[test]
    fn a_body_without_a_string_type_is_malformed() {
        for body in [
            "",
            "[]",
            "{}",
            r#"{"type":3}"#,
            "not json",
            r#"{"type":"run_created","at":"yesterday"}"#,
        ] {
            assert!(Notice::parse(body.as_bytes()).is_err(), "{body:?}");
        }
    }
}
