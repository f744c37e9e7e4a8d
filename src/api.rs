//! The internal API routes that `ironflow_worker::ApiRunStore` does not expose.
//!
//! `GET /api/v1/internal/runs/pending-count?workflows=a,b&tags=x,y` (worker token): the number
//! of `Pending` runs a worker with these capabilities can take. `ironflow-worker` reads it in a
//! private module for its queue-depth gauge; this is the same call, with the same query (the
//! `workflows` parameter is left out when the worker accepts any workflow, `tags` is always
//! sent, empty for none).

use std::time::Duration;

use ironflow_store::entities::WorkerCapabilities;
use serde::Deserialize;

use crate::config::WorkerToken;

/// Timeout of one pending-count request: 5 s, as `ironflow-worker`'s gauge. Callers bound it
/// further by the invocation deadline.
pub const PENDING_COUNT_TIMEOUT: Duration = Duration::from_secs(5);

/// A pending-count request failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The HTTP client could not be built (TLS backend unavailable).
    #[error("could not build the HTTP client for the ironflow API: {0}")]
    Client(#[source] reqwest::Error),
    /// The request did not get an answer (connection refused, timeout...).
    #[error("GET {route} failed: {source}")]
    Transport {
        /// The route called.
        route: &'static str,
        /// The transport error.
        #[source]
        source: reqwest::Error,
    },
    /// The API answered with a non-2xx status.
    #[error("GET {route} answered {status}: {body}")]
    Status {
        /// The route called.
        route: &'static str,
        /// The HTTP status.
        status: reqwest::StatusCode,
        /// The start of the response body (the API's error envelope).
        body: String,
    },
    /// The body is not the expected `{"data": {"pending_runs": n}}` envelope.
    #[error("GET {route} answered an unexpected body: {source}")]
    Body {
        /// The route called.
        route: &'static str,
        /// The decoding error.
        #[source]
        source: reqwest::Error,
    },
}

const PENDING_COUNT_ROUTE: &str = "/api/v1/internal/runs/pending-count";

/// Client for the internal routes `ApiRunStore` does not cover. Cheap to clone; build it once
/// per cold start.
#[derive(Clone)]
pub struct InternalApi {
    client: reqwest::Client,
    base_url: String,
    token: WorkerToken,
}

impl std::fmt::Debug for InternalApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InternalApi")
            .field("base_url", &self.base_url)
            .field("token", &self.token)
            .finish()
    }
}

impl InternalApi {
    /// A client for the API at `base_url` (`IRONFLOW_API_URL`) with the worker token
    /// (`IRONFLOW_WORKER_TOKEN`).
    ///
    /// # Errors
    ///
    /// [`ApiError::Client`] when the HTTP client cannot be built.
    pub fn new(base_url: &str, token: WorkerToken) -> Result<Self, ApiError> {
        let client = reqwest::Client::builder()
            .timeout(PENDING_COUNT_TIMEOUT)
            .build()
            .map_err(ApiError::Client)?;
        Ok(Self {
            client,
            base_url: base_url.trim_end_matches('/').to_string(),
            token,
        })
    }

    /// Pending runs a worker with `capabilities` can take
    /// (`GET /api/v1/internal/runs/pending-count`, `data.pending_runs`).
    ///
    /// A transport error is retried once at once: after a freeze, the pooled connection this
    /// client kept may have been dropped by the API or a NAT gateway, and the first request on it
    /// fails (see [`crate::pool`]); the request is a read, safe to repeat.
    ///
    /// # Errors
    ///
    /// [`ApiError`] on a transport error (twice), a non-2xx status or an unexpected body.
    pub async fn pending_runs(&self, capabilities: &WorkerCapabilities) -> Result<u64, ApiError> {
        match self.pending_runs_once(capabilities).await {
            Err(ApiError::Transport { source, .. }) => {
                tracing::debug!(error = %source, "pending count failed on the connection, retrying");
                self.pending_runs_once(capabilities).await
            }
            other => other,
        }
    }

    async fn pending_runs_once(&self, capabilities: &WorkerCapabilities) -> Result<u64, ApiError> {
        #[derive(Deserialize)]
        struct Envelope {
            data: PendingCount,
        }
        #[derive(Deserialize)]
        struct PendingCount {
            pending_runs: u64,
        }

        let route = PENDING_COUNT_ROUTE;
        let response = self
            .client
            .get(format!("{}{route}", self.base_url))
            .bearer_auth(self.token.expose())
            .query(&capability_query(capabilities))
            .send()
            .await
            .map_err(|source| ApiError::Transport { route, source })?;
        let status = response.status();
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            return Err(ApiError::Status {
                route,
                status,
                body: body.chars().take(300).collect(),
            });
        }
        let envelope: Envelope = response
            .json()
            .await
            .map_err(|source| ApiError::Body { route, source })?;
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

    #[test]
    fn debug_hides_the_token() {
        let api = InternalApi::new("http://127.0.0.1:1/", WorkerToken::new("s3cr3t")).unwrap();
        assert!(!format!("{api:?}").contains("s3cr3t"));
        assert_eq!(api.base_url, "http://127.0.0.1:1");
    }
}
