//! The webhook secret's versions a request may prove itself with, and their re-read after a
//! rotation (docs/push.md, "Rotating the secret").
//!
//! A secret from Secrets Manager (`IRONFLOW_WEBHOOK_SECRET_ARN`) is read at cold start with its
//! previous version (`AWSCURRENT` and `AWSPREVIOUS`): a request proved by either is taken, so an
//! API still sending the previous version keeps working while the rotation spreads. A request
//! that proves itself with neither may be the first one after a rotation: the secret is read
//! again, at most once per [`REREAD_INTERVAL`] per process whoever asks (an attacker makes
//! mismatches at will), within the request's time, and the request is checked once more.
//! A secret given as a value (`IRONFLOW_WEBHOOK_SECRET`) is the only version and never re-read.
//!
//! Invariants: no secret's value is logged; a failed re-read leaves the versions held as they
//! were.

use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::{Instant, timeout_at};
use tracing::{info, warn};

use super::auth::{self, Proof, Refusal};
use crate::secrets::{WebhookSecretSource, WebhookVersions};
use crate::settings::WebhookSecret;

/// Shortest time between two re-reads of the secret in one process: 60 s.
pub const REREAD_INTERVAL: Duration = Duration::from_secs(60);

/// What a request's proof is checked against.
#[derive(Debug)]
pub(crate) struct Keys {
    versions: RwLock<WebhookVersions>,
    /// Bumped each time the versions change.
    generation: AtomicU64,
    source: Option<WebhookSecretSource>,
    /// When the secret was last re-read; one re-read at a time.
    last_reread: tokio::sync::Mutex<Option<Instant>>,
}

/// What a request carries to prove itself.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Presented<'a> {
    /// The `X-Signature-256` header.
    pub signature: Option<&'a str>,
    /// The `token` query parameter.
    pub token: Option<&'a str>,
    /// The raw body the signature covers.
    pub body: &'a [u8],
}

impl Keys {
    /// `current` (and `previous`), re-read from `source` when they came from one.
    pub(crate) fn new(
        current: WebhookSecret,
        previous: Option<WebhookSecret>,
        source: Option<WebhookSecretSource>,
    ) -> Self {
        Self {
            versions: RwLock::new(WebhookVersions { current, previous }),
            generation: AtomicU64::new(0),
            source,
            last_reread: tokio::sync::Mutex::new(None),
        }
    }

    /// Check `presented` against the versions held, and, when it matches none, once more after
    /// a re-read of the secret if one is due (bounded by `until`).
    ///
    /// # Errors
    ///
    /// The [`Refusal`] of the current version when no version proves the sender.
    pub(crate) async fn check(
        &self,
        presented: Presented<'_>,
        until: Instant,
    ) -> Result<Proof, Refusal> {
        let seen = self.generation.load(Ordering::Acquire);
        let first = self.check_held(presented);
        match first {
            Err(Refusal::WrongSignature | Refusal::WrongToken) => {}
            other => return other,
        }
        if self.reread(seen, until).await {
            self.check_held(presented)
        } else {
            first
        }
    }

    /// Check against the current version, then the previous one.
    fn check_held(&self, p: Presented<'_>) -> Result<Proof, Refusal> {
        let versions = self
            .versions
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let current = auth::check(&versions.current, p.signature, p.token, p.body);
        match (&current, &versions.previous) {
            (Err(Refusal::WrongSignature | Refusal::WrongToken), Some(previous)) => {
                auth::check(previous, p.signature, p.token, p.body).or(current)
            }
            _ => current,
        }
    }

    /// Whether the versions changed since generation `seen`: read again from the secret unless
    /// the last re-read is under [`REREAD_INTERVAL`] old. Never fails (a failed read is logged).
    async fn reread(&self, seen: u64, until: Instant) -> bool {
        let Some(source) = &self.source else {
            return false;
        };
        let Ok(mut last) = timeout_at(until, self.last_reread.lock()).await else {
            return false;
        };
        if self.generation.load(Ordering::Acquire) != seen {
            return true;
        }
        if last.is_some_and(|at| at.elapsed() < REREAD_INTERVAL) {
            return false;
        }
        *last = Some(Instant::now());
        let read = match timeout_at(until, source.read()).await {
            Ok(Ok(read)) => read,
            Ok(Err(e)) => {
                warn!(error = %e, "a webhook request matched no version of the secret, and the secret could not be read again");
                return false;
            }
            Err(_) => {
                warn!(secret_arn = %source.arn(), "re-reading the webhook secret ran out of the request's time");
                return false;
            }
        };
        let mut versions = self
            .versions
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if *versions == read {
            return false;
        }
        *versions = read;
        self.generation.fetch_add(1, Ordering::AcqRel);
        info!(secret_arn = %source.arn(), "the webhook secret was rotated: its new current and previous versions were read from Secrets Manager");
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(c: char) -> WebhookSecret {
        WebhookSecret::new(c.to_string().repeat(40))
    }

    #[tokio::test]
    async fn the_current_and_the_previous_version_prove_the_sender_and_no_other() {
        let keys = Keys::new(secret('b'), Some(secret('a')), None);
        let until = Instant::now() + Duration::from_secs(1);
        let body = br#"{"type":"run_created"}"#;
        for (c, proved) in [('a', true), ('b', true), ('c', false)] {
            let signature = auth::sign(&secret(c), body);
            let signed = Presented {
                signature: Some(&signature),
                token: None,
                body,
            };
            assert_eq!(keys.check(signed, until).await.is_ok(), proved, "{c}");
            let token = secret(c);
            let by_token = Presented {
                signature: None,
                token: Some(token.expose()),
                body,
            };
            assert_eq!(keys.check(by_token, until).await.is_ok(), proved, "{c}");
        }
        let wrong = Presented {
            signature: None,
            token: Some("nope"),
            body,
        };
        assert_eq!(keys.check(wrong, until).await, Err(Refusal::WrongToken));
    }
}
