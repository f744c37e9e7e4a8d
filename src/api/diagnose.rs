//! Why the API refused a claim, in terms an operator can act on.
//!
//! `ApiRunStore` reports a claim the API answers with a non-2xx status as
//! `worker API error: <body>`, without the status. Some refusals carry an explicit body (a
//! refused worker token: `{"error":{"code":"INVALID_WORKER_TOKEN",...}}`), others none at all
//! (a wrong path in `IRONFLOW_API_URL` gets the router's empty 404). On such an error the
//! invocation asks the same API a read-only question with the same URL and token,
//! `GET /api/v1/internal/runs/pending-count` ([`super::pending`]), whose status this client
//! keeps, and names the setting to fix. The probe never claims anything, and it is sent only
//! after a refused claim, once per invocation, when the claim loop has stopped.

use ironflow_store::entities::WorkerCapabilities;
use reqwest::StatusCode;

use super::ApiClient;
use super::pending::PendingCountError;

impl ApiClient {
    /// After a claim the API refused: what `GET /api/v1/internal/runs/pending-count` answers
    /// with the same base URL and token, and which setting that points to, e.g.
    /// `"GET /api/v1/internal/runs/pending-count answers 404 Not Found: IRONFLOW_API_URL must be
    /// ..."`. `None` when the probe succeeds or gets no answer (the refusal's own message is
    /// all there is then). Takes up to 10 s (the pending-count timeout, 5 s, and one retry on
    /// a dropped connection): the caller bounds it further.
    pub async fn claim_refusal_hint(&self, capabilities: &WorkerCapabilities) -> Option<String> {
        match self.pending_runs(capabilities).await {
            Err(PendingCountError::Status { status, .. }) => Some(hint(status)),
            Ok(_) | Err(_) => None,
        }
    }
}

/// The probe's status and the setting it points to.
fn hint(status: StatusCode) -> String {
    let probe = format!("GET /api/v1/internal/runs/pending-count answers {status}");
    match status {
        StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED => format!(
            "{probe}: IRONFLOW_API_URL must be the ironflow API's base URL, the one its \
             /api/v1 routes hang from (e.g. https://ironflow.example.com, without /api/v1)"
        ),
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => format!(
            "{probe}: the API refuses the worker token; IRONFLOW_WORKER_TOKEN, or the secret \
             IRONFLOW_WORKER_TOKEN_SECRET_ARN names, must hold the API's WORKER_TOKEN"
        ),
        _ => probe,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_status_points_to_its_setting() {
        assert!(hint(StatusCode::NOT_FOUND).contains("IRONFLOW_API_URL"));
        assert!(hint(StatusCode::UNAUTHORIZED).contains("IRONFLOW_WORKER_TOKEN"));
        assert!(hint(StatusCode::FORBIDDEN).contains("IRONFLOW_WORKER_TOKEN"));
        assert_eq!(
            hint(StatusCode::BAD_GATEWAY),
            "GET /api/v1/internal/runs/pending-count answers 502 Bad Gateway"
        );
    }
}
