//! The worker token every API call carries, and its renewal when the API refuses it.
//!
//! A warm Lambda instance keeps the token it read at cold start. When the token is rotated in
//! Secrets Manager (and on the API), every call of that instance would be refused until it is
//! recycled. So a call the API answers 401 asks [`Credentials::renew_after_refusal`]: the secret
//! is read again (at most once per [`RENEWAL_INTERVAL`], whoever asks), and when it holds
//! another token, every later call carries the new one and the refused call is sent again at
//! once. With the token in `IRONFLOW_WORKER_TOKEN` there is nothing to re-read: a refusal stays
//! a refusal.
//!
//! The module map: [docs/structure.md](https://github.com/ironflow-lambda/ironflow-lambda/blob/main/docs/structure.md).

use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::{Instant, timeout_at};
use tracing::{info, warn};

use crate::secrets::TokenSecret;
use crate::settings::WorkerToken;

/// Shortest time between two re-reads of the secret: 60 s. A token the API refuses for
/// another reason (the secret is stale too) costs one `GetSecretValue` a minute, not one per
/// call.
pub const RENEWAL_INTERVAL: Duration = Duration::from_secs(60);

/// The current worker token (see the module docs).
#[derive(Debug)]
pub struct Credentials {
    token: RwLock<WorkerToken>,
    /// Bumped each time the token changes.
    generation: AtomicU64,
    secret: Option<TokenSecret>,
    /// When the secret was last read for a renewal; one renewal at a time.
    last_renewal: tokio::sync::Mutex<Option<Instant>>,
}

impl Credentials {
    /// `token`, renewable from `secret` when it came from one.
    pub fn new(token: WorkerToken, secret: Option<TokenSecret>) -> Self {
        Self {
            token: RwLock::new(token),
            generation: AtomicU64::new(0),
            secret,
            last_renewal: tokio::sync::Mutex::new(None),
        }
    }

    /// The token to send now.
    pub fn token(&self) -> WorkerToken {
        self.token
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// How many times the token changed since the cold start; a call records it before it is
    /// sent, and passes it to [`Credentials::renew_after_refusal`].
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The API refused the token of generation `seen`: whether a newer one is there now, read
    /// from the secret unless the last read is under [`RENEWAL_INTERVAL`] old. Bounded by
    /// `until`; never fails (a failed read is logged).
    pub async fn renew_after_refusal(&self, seen: u64, until: Instant) -> bool {
        if self.generation() != seen {
            return true;
        }
        let Some(secret) = &self.secret else {
            return false;
        };
        let Ok(mut last) = timeout_at(until, self.last_renewal.lock()).await else {
            return false;
        };
        if self.generation() != seen {
            return true;
        }
        if last.is_some_and(|at| at.elapsed() < RENEWAL_INTERVAL) {
            return false;
        }
        *last = Some(Instant::now());
        match timeout_at(until, secret.read()).await {
            Ok(Ok(token)) if token != self.token() => {
                *self
                    .token
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = token;
                self.generation.fetch_add(1, Ordering::AcqRel);
                info!(secret_arn = %secret.arn(), "the API refused the worker token: a new one was read from Secrets Manager");
                true
            }
            Ok(Ok(_)) => {
                warn!(secret_arn = %secret.arn(), "the API refuses the worker token, and the secret still holds it: set the API's WORKER_TOKEN and the secret to the same token");
                false
            }
            Ok(Err(e)) => {
                warn!(error = %e, "the API refused the worker token and the secret could not be read again");
                false
            }
            Err(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_fixed_token_is_never_renewed_but_a_newer_generation_is_used() {
        let credentials = Credentials::new(WorkerToken::new("t"), None);
        let until = Instant::now() + Duration::from_secs(1);
        assert!(!credentials.renew_after_refusal(0, until).await);
        assert!(
            credentials.renew_after_refusal(7, until).await,
            "another call renewed it since"
        );
        assert_eq!(credentials.token().expose(), "t");
    }
}
