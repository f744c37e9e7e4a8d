//! What went wrong with a call to the ironflow API, and whether the infrastructure is to blame.
//!
//! `ironflow-worker`'s `ApiRunStore` reports every failure as a [`StoreError`], most of them as
//! `StoreError::Database(message)`: `worker HTTP error: ...` when no complete answer came back
//! (the connection could not be made, was reset or cut, its 30 s timeout ran out, or a `PUT`
//! still failed after its own retries), and `worker API error: <body>` when the API answered a
//! status it does not handle (the status itself is dropped, the body is the API's error envelope
//! `{"error":{"code":"...","message":"..."}}`, or a proxy's page). [`classify`] reads that back
//! into an [`ApiFault`], or `None` when the API refused the call for a reason of its own (a bad
//! request, a step output over the size limit, a run that left Running): such an error is the
//! workflow's, and goes back to the engine as it came.
//!
//! Every [`ApiFault`] is an infrastructure error: it is retried within the time left, ends in a
//! handback when it persists, and never counts toward the poison pill or a workflow's retries
//! (see [`super`]).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use ironflow_store::error::StoreError;

pub use crate::report::{ApiErrorCount, FaultKind, Route};

/// The claim's route (`GET /api/v1/internal/runs/next`), as faults count it.
pub const CLAIM_ROUTE: Route = "GET /runs/next";

/// One infrastructure fault: which route, what kind, and what the API or the transport said.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{route}: {} ({detail})", kind_sentence(*.kind))]
pub struct ApiFault {
    /// The route the call went to.
    pub route: Route,
    /// What kind of fault.
    pub kind: FaultKind,
    /// The error as reported (never the worker token: `ApiRunStore` does not put it in errors).
    pub detail: String,
}

fn kind_sentence(kind: FaultKind) -> &'static str {
    match kind {
        FaultKind::Connect => "the API could not be reached",
        FaultKind::Transport => "the connection failed before the API's answer arrived",
        FaultKind::Timeout => "the API did not answer in time",
        FaultKind::Server => "the API answered with a server error",
        FaultKind::Unauthorized => "the API refused the worker token",
        FaultKind::Throttled => "the API asked the worker to slow down",
    }
}

impl ApiFault {
    /// A call to `route` that got no answer within `waited` (our own bound).
    pub fn timeout(route: Route, waited: Duration) -> Self {
        Self {
            route,
            kind: FaultKind::Timeout,
            detail: format!("no answer within {} ms", waited.as_millis()),
        }
    }

    /// Whether the request surely never reached the API, so that sending it again cannot
    /// apply it twice.
    pub fn never_sent(&self) -> bool {
        self.kind == FaultKind::Connect
    }
}

/// The infrastructure fault `error` (from a call to `route`) is, or `None` when the API refused
/// the call for a reason of its own (the error then belongs to the caller).
pub fn classify(route: Route, error: &StoreError) -> Option<ApiFault> {
    let StoreError::Database(message) = error else {
        return None;
    };
    let fault = |kind| {
        Some(ApiFault {
            route,
            kind,
            detail: message.clone(),
        })
    };
    if let Some(transport) = message.strip_prefix("worker HTTP error: ") {
        // `PUT ... failed after N attempts: HTTP 503 ...` is ApiRunStore's retried update.
        if let Some((_, last)) = transport.split_once(" attempts: ") {
            if last.starts_with("HTTP ") {
                return fault(server_kind(last));
            }
            return fault(transport_kind(last));
        }
        return fault(transport_kind(transport));
    }
    let body = message.strip_prefix("worker API error: ")?;
    match error_code(body).as_deref() {
        // A body over a size limit, as the API's framework (axum: `length limit exceeded`) or
        // a proxy (`413 Request Entity Too Large`) words it: refused for what it is, and
        // refused again, so no fault (a handback would only loop on it).
        None if too_large(body) => None,
        // A proxy's page, an empty body: not the API speaking.
        None => fault(FaultKind::Server),
        Some("INVALID_WORKER_TOKEN" | "UNAUTHORIZED" | "INVALID_CREDENTIALS" | "FORBIDDEN") => {
            fault(FaultKind::Unauthorized)
        }
        Some("RATE_LIMIT_EXCEEDED") => fault(FaultKind::Throttled),
        Some(
            "DATABASE_ERROR"
            | "INTERNAL_ERROR"
            | "BAD_GATEWAY"
            | "SECRET_STORE_UNAVAILABLE"
            | "REGISTRY_UNREACHABLE",
        ) => fault(FaultKind::Server),
        // BAD_REQUEST, INVALID_INPUT, *_NOT_FOUND, CONFLICT, PAYLOAD_TOO_LARGE...: the API
        // refused this call for what it is, and would refuse it again.
        Some(_) => None,
    }
}

/// Whether `error` is the API's own refusal of a call to `route` (it answered: a bad request,
/// a body over its limit), not a fault, a lost lease, a conflict the engine reads, or a call
/// this worker withheld.
pub fn is_refusal(route: Route, error: &StoreError) -> bool {
    let StoreError::Database(message) = error else {
        return false;
    };
    (message.starts_with("payload too large") || message.starts_with("worker API error: "))
        && classify(route, error).is_none()
}

/// `connect` when the error chain shows no connection was made, `timeout` for the HTTP
/// client's own timeout, else `transport`.
fn transport_kind(chain: &str) -> FaultKind {
    if chain.contains("(Connect)") || chain.contains("error trying to connect") {
        FaultKind::Connect
    } else if chain.contains("operation timed out") || chain.contains("timed out") {
        FaultKind::Timeout
    } else {
        FaultKind::Transport
    }
}

/// `HTTP 429 ...` is throttling, anything else a server error.
fn server_kind(status_line: &str) -> FaultKind {
    if status_line.starts_with("HTTP 429") {
        FaultKind::Throttled
    } else {
        FaultKind::Server
    }
}

/// Whether `body`, an answer without the API's error envelope, says the request was over a
/// size limit.
fn too_large(body: &str) -> bool {
    let body = body.to_ascii_lowercase();
    [
        "length limit exceeded",
        "entity too large",
        "payload too large",
    ]
    .iter()
    .any(|said| body.contains(said))
}

/// The `error.code` of the API's error envelope, if `body` is one.
fn error_code(body: &str) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(body).ok()?;
    value
        .get("error")?
        .get("code")?
        .as_str()
        .map(str::to_string)
}

/// Faults counted per route and kind over one invocation: the summary's `api_errors` and the
/// `ApiErrors` metric. Shared by every call the invocation makes, the engine's included.
#[derive(Debug, Default)]
pub struct FaultLog {
    counts: Mutex<BTreeMap<(Route, FaultKind), u32>>,
}

impl FaultLog {
    /// Count `fault`.
    pub fn record(&self, fault: &ApiFault) {
        let mut counts = self
            .counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let count = counts.entry((fault.route, fault.kind)).or_default();
        *count = count.saturating_add(1);
    }

    /// Every count so far, by route then kind.
    pub fn snapshot(&self) -> Vec<ApiErrorCount> {
        self.counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|(&(route, kind), &count)| ApiErrorCount { route, kind, count })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db(message: &str) -> StoreError {
        StoreError::Database(message.to_string())
    }

    fn kind(message: &str) -> Option<FaultKind> {
        classify("GET /runs/{id}", &db(message)).map(|f| f.kind)
    }

    #[test]
    fn a_body_over_a_size_limit_is_a_refusal_not_a_fault() {
        for body in [
            "length limit exceeded",
            "<html><head><title>413 Request Entity Too Large</title></head></html>",
            "Payload Too Large",
        ] {
            let error = db(&format!("worker API error: {body}"));
            assert_eq!(classify("POST /steps", &error), None, "{body}");
            assert!(is_refusal("POST /steps", &error), "{body}");
        }
        // Any other page is a proxy's fault.
        assert_eq!(
            kind("worker API error: <html>502 Bad Gateway</html>"),
            Some(FaultKind::Server)
        );
    }

    #[test]
    fn transport_errors_are_told_apart() {
        assert_eq!(
            kind(
                "worker HTTP error: error sending request for url (http://127.0.0.1:9/x): \
                 client error (Connect): tcp connect error: Connection refused (os error 111)"
            ),
            Some(FaultKind::Connect)
        );
        assert_eq!(
            kind(
                "worker HTTP error: error sending request: connection closed before message completed"
            ),
            Some(FaultKind::Transport)
        );
        assert_eq!(
            kind("worker HTTP error: error sending request: operation timed out"),
            Some(FaultKind::Timeout)
        );
        assert_eq!(
            kind("worker HTTP error: error decoding response body: EOF while parsing"),
            Some(FaultKind::Transport)
        );
    }

    #[test]
    fn a_retried_put_reports_its_last_failure() {
        assert_eq!(
            kind(
                "worker HTTP error: PUT /runs/1 failed after 4 attempts: HTTP 500 Internal \
                 Server Error: {\"error\":{\"code\":\"DATABASE_ERROR\"}}"
            ),
            Some(FaultKind::Server)
        );
        assert_eq!(
            kind("worker HTTP error: PUT /runs/1 failed after 4 attempts: HTTP 429 Too Many"),
            Some(FaultKind::Throttled)
        );
        assert_eq!(
            kind("worker HTTP error: PUT /runs/1 failed after 4 attempts: connection reset"),
            Some(FaultKind::Transport)
        );
    }

    #[test]
    fn the_api_s_own_refusals_belong_to_the_caller() {
        for code in [
            "BAD_REQUEST",
            "RUN_NOT_FOUND",
            "CONFLICT",
            "PAYLOAD_TOO_LARGE",
        ] {
            let body = format!("worker API error: {{\"error\":{{\"code\":\"{code}\"}}}}");
            assert_eq!(kind(&body), None, "{code}");
        }
        assert_eq!(
            classify(
                "PUT /runs/{id}",
                &db("payload too large: PUT /runs/1 is 9 bytes")
            ),
            None
        );
        let lost = StoreError::LeaseLost {
            run_id: uuid::Uuid::nil(),
            held_by: None,
        };
        assert_eq!(classify("POST /runs/{id}/lease", &lost), None);
    }

    #[test]
    fn server_errors_tokens_and_throttling_are_infrastructure() {
        let envelope = |code: &str| {
            format!("worker API error: {{\"error\":{{\"code\":\"{code}\",\"message\":\"x\"}}}}")
        };
        assert_eq!(kind(&envelope("DATABASE_ERROR")), Some(FaultKind::Server));
        assert_eq!(kind(&envelope("INTERNAL_ERROR")), Some(FaultKind::Server));
        assert_eq!(
            kind(&envelope("INVALID_WORKER_TOKEN")),
            Some(FaultKind::Unauthorized)
        );
        assert_eq!(
            kind(&envelope("RATE_LIMIT_EXCEEDED")),
            Some(FaultKind::Throttled)
        );
        // A load balancer's page or an empty 503: not the API's envelope.
        assert_eq!(kind("worker API error: "), Some(FaultKind::Server));
        assert_eq!(
            kind("worker API error: <html>502 Bad Gateway</html>"),
            Some(FaultKind::Server)
        );
    }

    #[test]
    fn only_a_connect_fault_proves_the_request_was_not_sent() {
        let fault = |kind| ApiFault {
            route: "POST /steps",
            kind,
            detail: String::new(),
        };
        assert!(fault(FaultKind::Connect).never_sent());
        for kind in [FaultKind::Transport, FaultKind::Timeout, FaultKind::Server] {
            assert!(!fault(kind).never_sent());
        }
    }

    #[test]
    fn the_log_counts_per_route_and_kind() {
        let log = FaultLog::default();
        let a = ApiFault::timeout("GET /runs/next", Duration::from_millis(5));
        log.record(&a);
        log.record(&a);
        log.record(&ApiFault {
            route: "PUT /runs/{id}",
            kind: FaultKind::Server,
            detail: String::new(),
        });
        let counts = log.snapshot();
        assert_eq!(counts.len(), 2);
        assert_eq!(counts[0].route, "GET /runs/next");
        assert_eq!(counts[0].count, 2);
        assert_eq!(counts[1].to_string(), "PUT /runs/{id} server × 1");
        assert!(a.to_string().contains("did not answer in time"), "{a}");
    }
}
