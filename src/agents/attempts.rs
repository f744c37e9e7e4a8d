//! The usage of a step's attempts that ended in a schema mismatch, carried to its next attempt.
//!
//! ironflow asks a structured step again after an answer that does not match its schema (twice
//! by default, `Agent::run_attempts`), and records only the last attempt's usage: the paid calls
//! of the earlier ones would be missing from the step's tokens and cost, and from the run's cost
//! cap. So the provider keeps each mismatched attempt's usage for the step's next attempt and
//! adds it to that attempt's: the step's answer, or its last mismatch, then carries the usage of
//! every attempt.
//!
//! An entry's key is the step's session id (`AgentConfig::session_id`, which the engine sets
//! fresh for each execution of an agent step) with its request (prompt, system prompts, schema,
//! model) and its run (the execution's scope, when the step runs in it): a session id the
//! workflow's author set, shared by several steps or runs, does not carry one step's usage to
//! another.
//!
//! Invariants: an entry is taken by the next attempt of its step, and kept again when that
//! attempt ends in a mismatch (with its own usage added) or any other error (a next attempt may
//! still come); one left behind (the step failed for good) is dropped after [`KEPT_FOR`]; a step
//! without a session id (a provider called outside the engine) carries nothing.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use ironflow_core::provider::AgentConfig;
use uuid::Uuid;

use super::pricing::Usage;
use crate::store::scope::CallScope;

/// How long a mismatch's usage waits for its step's next attempt: an hour, far more than
/// ironflow's backoff between two attempts.
const KEPT_FOR: Duration = Duration::from_secs(3600);

/// Which step an entry is for: its run (if in an execution's scope) and a hash of its session
/// id and request.
pub(crate) type Key = (Option<Uuid>, u64);

/// The key of `config`'s step, `None` without a session id.
pub(crate) fn key(config: &AgentConfig) -> Option<Key> {
    let session = config.session_id.as_ref()?;
    let mut hasher = DefaultHasher::new();
    (
        session,
        &config.prompt,
        &config.system_prompt,
        &config.append_system_prompt,
        &config.json_schema,
        &config.model,
    )
        .hash(&mut hasher);
    let run = CallScope::current().run_key().map(|k| k.run_id);
    Some((run, hasher.finish()))
}

/// Usage of mismatched attempts, by step ([`key`]).
#[derive(Debug, Default)]
pub(crate) struct Unrecorded(Mutex<HashMap<Key, (Usage, Instant)>>);

impl Unrecorded {
    /// The usage the earlier attempts of the step `key` left (zero if none), taken.
    pub fn take(&self, key: Option<Key>) -> Usage {
        let Some(key) = key else {
            return Usage::default();
        };
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        map.remove(&key)
            .map_or_else(Usage::default, |(usage, _)| usage)
    }

    /// Keep `usage` (every attempt's so far) for the next attempt of the step `key`.
    pub fn keep(&self, key: Option<Key>, usage: Usage) {
        let Some(key) = key else {
            return;
        };
        if usage == Usage::default() {
            return;
        }
        let now = Instant::now();
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        map.retain(|_, (_, at)| now.duration_since(*at) < KEPT_FOR);
        map.insert(key, (usage, now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(prompt: &str, session: Option<&str>) -> AgentConfig {
        let mut config = AgentConfig::new(prompt);
        config.session_id = session.map(str::to_string);
        config
    }

    #[test]
    fn a_step_s_usage_is_carried_once_and_only_to_the_same_step() {
        let unrecorded = Unrecorded::default();
        let one = Usage {
            input: 10,
            output: 2,
            ..Usage::default()
        };
        let own = step("p", Some("s-1"));
        unrecorded.keep(key(&own), one);
        // Another session; the author's session id on another step (another request).
        assert_eq!(
            unrecorded.take(key(&step("p", Some("s-2")))),
            Usage::default()
        );
        assert_eq!(
            unrecorded.take(key(&step("q", Some("s-1")))),
            Usage::default()
        );
        assert_eq!(unrecorded.take(key(&own)), one);
        assert_eq!(unrecorded.take(key(&own)), Usage::default(), "taken once");
        // Without a session id nothing is kept.
        let bare = step("p", None);
        assert_eq!(key(&bare), None);
        unrecorded.keep(key(&bare), one);
        assert_eq!(unrecorded.take(key(&bare)), Usage::default());
    }
}
