//! Dead man's switch (reference-worker parity): an optional URL pinged with `HEAD` once per
//! invocation that completed its batch (`IRONFLOW_HEARTBEAT_URL`; compatible with
//! Healthchecks.io, Cronitor, Better Stack). A failed ping is a warning, never a failed batch.
//! The URL itself is never logged: such URLs usually embed a secret; logs name its host only.
//!
//! The module map: [docs/structure.md](https://github.com/ironflow-lambda/ironflow-lambda/blob/main/docs/structure.md).

use std::time::Duration;

use tokio::time::{Instant, timeout_at};
use tracing::{info, warn};

/// Timeout of one ping: 2 s.
pub const PING_TIMEOUT: Duration = Duration::from_secs(2);

/// Ping `url` with `HEAD`, bounded by [`PING_TIMEOUT`] and `until`. Returns whether the
/// endpoint answered with a success status.
pub async fn ping(client: &reqwest::Client, url: &str, until: Instant) -> bool {
    let host = reqwest::Url::parse(url)
        .ok()
        .and_then(|u| u.host_str().map(str::to_string))
        .unwrap_or_else(|| "?".to_string());
    let sent = client.head(url).timeout(PING_TIMEOUT).send();
    match timeout_at(until, sent).await {
        Ok(Ok(resp)) if resp.status().is_success() => {
            info!(host, "heartbeat sent");
            true
        }
        Ok(Ok(resp)) => {
            warn!(host, status = %resp.status(), "heartbeat ping answered with a failure status");
            false
        }
        Ok(Err(e)) => {
            warn!(host, error = %e.without_url(), "heartbeat ping failed");
            false
        }
        Err(_) => {
            warn!(host, "heartbeat ping ran into the invocation deadline");
            false
        }
    }
}
