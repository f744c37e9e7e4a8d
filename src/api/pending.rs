//! The backlog: `GET /api/v1/internal/runs/pending-count?workflows=a,b&tags=x,y` (worker
//! token), the number of `Pending` runs a worker with these capabilities can take
//! (`data.pending_runs`). `ironflow-worker` reads it in a private module for its queue-depth
//! gauge; this is the same call with the same query (`workflows` left out when the worker
//! accepts any workflow, `tags` always sent, empty for none). Wake-ups are sized by it
//! ([`crate::wake`]).

use std::time::Duration;

use ironflow_store::entities::WorkerCapabilities;
use serde::Deserialize;

use super::ApiClient;

/// Timeout of one pending-count request: 5 s, as `ironflow-worker`'s gauge. The caller bounds
/// it further by the invocation deadline.
pub const PENDING_COUNT_TIMEOUT: Duration = Duration::from_secs(5);

const ROUTE: &str = "/runs/pending-count";

/// The pending count could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PendingCountError {
    /// The request got no answer (connection refused, reset, timeout).
    #[error("GET /api/v1/internal/runs/pending-count failed: {0}")]
    Transport(#[source] reqwest::Error),
    /// The API answered with a non-2xx status.
    #[error("GET /api/v1/internal/runs/pending-count answered {status}: {body}")]
    Status {
        /// The HTTP status.
        status: reqwest::StatusCode,
        /// The start of the response body (the API's error envelope).
        body: String,
    },
    /// The body is not the `{"data": {"pending_runs": n}}` envelope.
    #[error("GET /api/v1/internal/runs/pending-count answered an unexpected body: {0}")]
    Body(#[source] reqwest::Error),
}

impl ApiClient {
    /// Pending runs a worker with `capabilities` can take.
    ///
    /// A transport error is retried once at once: after a freeze, the pooled connection may have
    /// been dropped by the API or a NAT gateway, and the first request on it fails (see
    /// [`crate::pool`]); the request is a read, safe to repeat.
    ///
    /// # Errors
    ///
    /// [`PendingCountError`] on a transport error (twice), a non-2xx status or an unexpected
    /// body.
    pub async fn pending_runs(
        &self,
        capabilities: &WorkerCapabilities,
    ) -> Result<u64, PendingCountError> {
        match self.pending_runs_once(capabilities).await {
            Err(PendingCountError::Transport(e)) => {
                tracing::debug!(error = %e, "pending count failed on the connection, retrying");
                self.pending_runs_once(capabilities).await
            }
            other => other,
        }
    }

    async fn pending_runs_once(
        &self,
        capabilities: &WorkerCapabilities,
    ) -> Result<u64, PendingCountError> {
        #[derive(Deserialize)]
        struct Envelope {
            data: PendingCount,
        }
        #[derive(Deserialize)]
        struct PendingCount {
            pending_runs: u64,
        }

        let response = self
            .request(reqwest::Method::GET, &self.internal(ROUTE))
            .query(&capability_query(capabilities))
            .timeout(PENDING_COUNT_TIMEOUT)
            .send()
            .await
            .map_err(PendingCountError::Transport)?;
        let status = response.status();
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            return Err(PendingCountError::Status {
                status,
                body: body.chars().take(300).collect(),
            });
        }
        let envelope: Envelope = response.json().await.map_err(PendingCountError::Body)?;
        Ok(envelope.data.pending_runs)
    }
}

/// The query a worker sends with its capabilities, as `ironflow-worker` sends it to the pick
/// and pending-count routes.
fn capability_query(capabilities: &WorkerCapabilities) -> Vec<(&'static str, String)> {
    let mut query = Vec::with_capacity(2);
    if let Some(workflows) = &capabilities.workflows {
        query.push(("workflows", workflows.join(",")));
    }
    query.push(("tags", capabilities.tags.join(",")));
    query
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_matches_the_reference_worker() {
        let caps = WorkerCapabilities::new(
            Some(vec!["build".into(), "deploy".into()]),
            vec!["gpu".into()],
        );
        assert_eq!(
            capability_query(&caps),
            vec![
                ("workflows", "build,deploy".to_string()),
                ("tags", "gpu".to_string())
            ]
        );
        let any = WorkerCapabilities::new(None, Vec::new());
        assert_eq!(capability_query(&any), vec![("tags", String::new())]);
    }
}
