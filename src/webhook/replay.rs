//! Replays: an event is taken only while its `at` is within the replay window of now, and a
//! body taken once is not taken again while it could still be (docs/push.md, "Replays").
//!
//! ironflow-engine's events (`notify::Event`) all carry `at`, the time the API built the event
//! (chrono's `DateTime<Utc>`, RFC 3339 in the JSON: `"2026-12-01T10:00:00.123456Z"`). An event
//! is fresh while `|now − at| ≤ window` (`IRONFLOW_WEBHOOK_REPLAY_WINDOW_SECS`; the allowance
//! ahead of now is for the API's clock running ahead of Lambda's). Run events have no id, so a
//! body is known by its SHA-256: it is recorded once its wake-ups reached the queue (or none was
//! needed), through `at + window` (its last fresh millisecond), after which the window refuses
//! it anyway. A body whose wake-ups did
//! not reach the queue (answered 503) is not recorded, so the API's own re-send is served.
//!
//! The record is this process's ([`Seen`]): at most [`MAX_REMEMBERED`] bodies, each forgotten
//! at its expiry; a full record forgets the one that expires first.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sha2::{Digest as _, Sha256};

/// Most bodies one process remembers at once: 10 000 (under 1 MB).
pub const MAX_REMEMBERED: usize = 10_000;

/// A body's SHA-256.
pub type BodyDigest = [u8; 32];

/// The SHA-256 of a raw body.
pub fn digest(body: &[u8]) -> BodyDigest {
    Sha256::digest(body).into()
}

/// Why an event is not fresh.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Stale {
    /// The event has no `at`.
    #[error("the event has no \"at\": replays of it could not be told apart")]
    NoTime,
    /// `at` is further from now than the window.
    #[error(
        "the event's \"at\" is {offset_secs} s from now (negative: in the past), outside the \
         replay window of {window_secs} s (IRONFLOW_WEBHOOK_REPLAY_WINDOW_SECS): a replay, or \
         clocks apart"
    )]
    OutsideWindow {
        /// `at − now`, in whole seconds.
        offset_secs: i64,
        /// The window, in seconds.
        window_secs: u64,
    },
}

/// When an event stamped `at` stops being fresh (`at + window + 1 ms`, epoch ms: at
/// `at + window` it is still fresh, and must still be remembered), if it is fresh now.
///
/// # Errors
///
/// [`Stale`] when it has no `at` or `at` is more than `window` from `now`.
pub fn fresh_until(
    at: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
    window: Duration,
) -> Result<i64, Stale> {
    let at = at.ok_or(Stale::NoTime)?;
    let window_ms = i64::try_from(window.as_millis()).unwrap_or(i64::MAX);
    let offset_ms = at.timestamp_millis().saturating_sub(now.timestamp_millis());
    if offset_ms.saturating_abs() > window_ms {
        return Err(Stale::OutsideWindow {
            offset_secs: offset_ms / 1000,
            window_secs: window.as_secs(),
        });
    }
    Ok(at
        .timestamp_millis()
        .saturating_add(window_ms)
        .saturating_add(1))
}

/// The bodies this process took, each until its expiry (epoch ms).
#[derive(Debug, Default)]
pub struct Seen {
    state: Mutex<SeenState>,
}

#[derive(Debug, Default)]
struct SeenState {
    expiry: HashMap<BodyDigest, i64>,
    by_expiry: BTreeSet<(i64, BodyDigest)>,
}

impl SeenState {
    /// Forget what expired by `now_ms`.
    fn purge(&mut self, now_ms: i64) {
        while let Some(&(at, digest)) = self.by_expiry.first() {
            if at > now_ms {
                break;
            }
            self.by_expiry.pop_first();
            self.expiry.remove(&digest);
        }
    }
}

impl Seen {
    fn state(&self) -> std::sync::MutexGuard<'_, SeenState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `digest` was taken and has not expired by `now_ms`.
    pub fn contains(&self, digest: &BodyDigest, now_ms: i64) -> bool {
        let mut state = self.state();
        state.purge(now_ms);
        state.expiry.contains_key(digest)
    }

    /// Remember `digest` until `expires_ms`; a full record forgets the body that expires first.
    pub fn record(&self, digest: BodyDigest, expires_ms: i64, now_ms: i64) {
        let mut state = self.state();
        state.purge(now_ms);
        if let Some(old) = state.expiry.insert(digest, expires_ms) {
            state.by_expiry.remove(&(old, digest));
        }
        state.by_expiry.insert((expires_ms, digest));
        while state.expiry.len() > MAX_REMEMBERED {
            if let Some((_, first)) = state.by_expiry.pop_first() {
                state.expiry.remove(&first);
            }
        }
    }

    /// Bodies remembered now.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.state().expiry.len()
    }

    /// Whether none is remembered.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(secs, 0).unwrap()
    }

    #[test]
    fn an_event_is_fresh_within_the_window_either_way() {
        let window = Duration::from_secs(300);
        let now = at(1_000_000);
        // Fresh at its window's last millisecond, and remembered through it.
        let until = fresh_until(Some(at(1_000_000 - 300)), now, window);
        assert_eq!(until, Ok(1_000_000_001));
        let seen = Seen::default();
        let d = digest(b"edge");
        seen.record(d, until.unwrap(), 1_000_000_000);
        assert!(seen.contains(&d, 1_000_000_000));
        assert!(fresh_until(Some(at(1_000_000 + 300)), now, window).is_ok());
        assert!(matches!(
            fresh_until(Some(at(1_000_000 - 301)), now, window),
            Err(Stale::OutsideWindow {
                offset_secs: -301,
                ..
            })
        ));
        assert!(fresh_until(Some(at(1_000_000 + 301)), now, window).is_err());
        assert_eq!(fresh_until(None, now, window), Err(Stale::NoTime));
    }

    #[test]
    fn bodies_are_forgotten_at_their_expiry_and_the_record_is_bounded() {
        let seen = Seen::default();
        let (a, b) = (digest(b"a"), digest(b"b"));
        seen.record(a, 2_000, 1_000);
        assert!(seen.contains(&a, 1_999));
        assert!(!seen.contains(&b, 1_999));
        assert!(!seen.contains(&a, 2_000), "expired");
        assert!(seen.is_empty());
        for i in 0..MAX_REMEMBERED + 10 {
            let expiry = 10_000 + i64::try_from(i).unwrap();
            seen.record(digest(&i.to_le_bytes()), expiry, 1_000);
        }
        assert_eq!(seen.len(), MAX_REMEMBERED);
        assert!(
            !seen.contains(&digest(&0usize.to_le_bytes()), 1_000),
            "the first to expire was forgotten"
        );
        assert!(seen.contains(&digest(&(MAX_REMEMBERED + 9).to_le_bytes()), 1_000));
    }
}
