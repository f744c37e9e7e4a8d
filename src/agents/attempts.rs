//! The usage of a step's attempts that ended in a schema mismatch, carried to its next attempt.
//!
//! ironflow asks a structured step again after an answer that does not match its schema (twice
//! by default, `Agent::run_attempts`), and records only the last attempt's usage: the paid calls
//! of the earlier ones would be missing from the step's tokens and cost, and from the run's cost
//! cap. So the provider keeps each mismatched attempt's usage under the step's session id
//! (`AgentConfig::session_id`, which the engine sets fresh for each execution of an agent step)
//! and adds it to the next attempt's: the step's answer, or its last mismatch, then carries the
//! usage of every attempt.
//!
//! Invariants: an entry is taken by the next attempt of its step, whatever it ends in; one left
//! behind (the last mismatch of a step that failed) is dropped after [`KEPT_FOR`]; a step
//! without a session id (a provider called outside the engine) carries nothing.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use ironflow_core::provider::AgentConfig;

use super::pricing::Usage;

/// How long a mismatch's usage waits for its step's next attempt: an hour, far more than
/// ironflow's backoff between two attempts.
const KEPT_FOR: Duration = Duration::from_secs(3600);

/// Usage of mismatched attempts, by step session id.
#[derive(Debug, Default)]
pub(crate) struct Unrecorded(Mutex<HashMap<String, (Usage, Instant)>>);

impl Unrecorded {
    /// The usage the earlier attempts of `config`'s step left (zero if none), taken.
    pub fn take(&self, config: &AgentConfig) -> Usage {
        let Some(session) = &config.session_id else {
            return Usage::default();
        };
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        map.remove(session)
            .map_or_else(Usage::default, |(usage, _)| usage)
    }

    /// Keep `usage` (every attempt's so far) for the next attempt of `config`'s step.
    pub fn keep(&self, config: &AgentConfig, usage: Usage) {
        let Some(session) = &config.session_id else {
            return;
        };
        let now = Instant::now();
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        map.retain(|_, (_, at)| now.duration_since(*at) < KEPT_FOR);
        map.insert(session.clone(), (usage, now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_s_usage_is_carried_once_and_only_for_its_session() {
        let unrecorded = Unrecorded::default();
        let one = Usage {
            input: 10,
            output: 2,
            ..Usage::default()
        };
        let mut step = AgentConfig::new("p");
        step.session_id = Some("s-1".into());
        let mut other = AgentConfig::new("p");
        other.session_id = Some("s-2".into());
        unrecorded.keep(&step, one);
        assert_eq!(unrecorded.take(&other), Usage::default());
        assert_eq!(unrecorded.take(&step), one);
        assert_eq!(unrecorded.take(&step), Usage::default(), "taken once");
        // Without a session id nothing is kept.
        let bare = AgentConfig::new("p");
        unrecorded.keep(&bare, one);
        assert_eq!(unrecorded.take(&bare), Usage::default());
    }
}
